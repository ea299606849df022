//! Authenticity of files that cross a trust boundary: outcomes that shards
//! write and `merge` / `report --json` read back, and result-cache entries.
//! A trailing sha256 (a seal) detects accidents, not edits: anyone who can
//! write the file can recompute it. A keyed MAC (HMAC-SHA256) cannot be
//! recomputed without the key.
//!
//! Contract: with a signing key (`QUANTGATE_SIGNING_KEY`, or
//! `QUANTGATE_SIGNING_KEY_FILE`), every outcome quantgate writes carries
//! `"mac": "hmac-sha256:<hex>"` over its canonical JSON (sorted keys, the
//! `mac` left out), and every outcome it reads back must carry a valid one.
//! Result-cache entries are always MACed: with the signing key when one is
//! set, else with a key of this user's kept outside the cache
//! (`$XDG_CONFIG_HOME/quantgate/result-cache.key`), so a cache folder that
//! others can write (a shared CI cache) cannot hand this user a forged entry.

use crate::core::error::{Error, Result, SealError};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;

/// The JSON field that carries an outcome's MAC.
pub(crate) const MAC_FIELD: &str = "mac";
/// What a MAC's text starts with.
pub(crate) const MAC_PREFIX: &str = "hmac-sha256:";
/// The environment variable holding the signing key itself.
pub const KEY_ENV: &str = "QUANTGATE_SIGNING_KEY";
/// The environment variable naming a file that holds the signing key.
pub(crate) const KEY_FILE_ENV: &str = "QUANTGATE_SIGNING_KEY_FILE";
/// The shortest key accepted, in bytes.
const MIN_KEY: usize = 16;

/// A MAC key (its Debug form shows where it came from, never the key).
#[derive(Clone)]
pub struct Key {
    pub(crate) bytes: Vec<u8>,
    /// Where it came from, for messages (`QUANTGATE_SIGNING_KEY`, a file).
    pub source: String,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({}, {} bytes)", self.source, self.bytes.len())
    }
}

impl Key {
    /// A key of `bytes` from `source`; too short a key is an error naming it.
    pub(crate) fn new(bytes: Vec<u8>, source: &str) -> Result<Key> {
        if bytes.len() < MIN_KEY {
            return Err(Error::input(format!(
                "{source}: a signing key of {} bytes is too short; give at least {MIN_KEY} \
                 (for example `openssl rand -hex 32`)",
                bytes.len()
            )));
        }
        Ok(Key {
            bytes,
            source: source.to_string(),
        })
    }

    /// `hmac-sha256:<hex>` of `bytes`.
    pub(crate) fn mac(&self, bytes: &[u8]) -> String {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC takes any key");
        m.update(bytes);
        let tag = m.finalize().into_bytes();
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        format!("{MAC_PREFIX}{hex}")
    }

    /// Whether `mac` is this key's MAC of `bytes` (compared in constant time).
    pub(crate) fn verifies(&self, bytes: &[u8], mac: &str) -> bool {
        let Some(hex) = mac.strip_prefix(MAC_PREFIX) else {
            return false;
        };
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
        let tag: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex checked"))
            .collect();
        let mut m = Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC takes any key");
        m.update(bytes);
        m.verify_slice(&tag).is_ok()
    }
}

/// Why a key file is refused: it cannot be looked at, or it is not private
/// as ssh asks of a private key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// Its metadata could not be read (the I/O error).
    #[error("{0}")]
    Unreadable(String),
    /// A symlink, which another user could point elsewhere.
    #[error("is a symlink; a key file must be a regular file (copy the key there, mode 0600)")]
    Symlink,
    /// A folder, a device, a pipe.
    #[error("is not a regular file")]
    NotAFile,
    /// Its group or others may read or write it.
    #[error(
        "mode {mode:04o} lets its group or others read or write the key; a key file must be \
         private: `chmod 600 {path}`"
    )]
    Shared {
        /// Its permission bits.
        mode: u32,
        /// The file, as given.
        path: String,
    },
}

impl From<KeyFileError> for Error {
    fn from(e: KeyFileError) -> Self {
        Error::input(e.to_string())
    }
}

/// Ok when the key file at `path` is private, as ssh asks of a private
/// key: a regular file (not a symlink, which another user could point
/// elsewhere) that neither its group nor others can read or write; else
/// why not, naming the mode and the fix.
pub(crate) fn private_key_file(path: &Path) -> std::result::Result<(), KeyFileError> {
    let meta =
        std::fs::symlink_metadata(path).map_err(|e| KeyFileError::Unreadable(e.to_string()))?;
    if meta.file_type().is_symlink() {
        return Err(KeyFileError::Symlink);
    }
    if !meta.is_file() {
        return Err(KeyFileError::NotAFile);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Shared {
                mode,
                path: path.display().to_string(),
            });
        }
    }
    Ok(())
}

/// How the trailing 32 bytes of a sealed file ([`crate::core::fsutil::seal`])
/// are made and checked: a plain sha256 of the contents detects accidents
/// only; a keyed seal (HMAC-SHA256 with a [`Key`]) also detects an edit
/// sealed again, which anyone who can write the file can do to a plain one.
#[derive(Debug, Clone, Copy)]
pub enum Seal {
    /// sha256 of the contents: intact, not authenticated.
    Plain,
    /// HMAC-SHA256 of the contents under the key.
    Keyed(&'static Key),
}

/// What a keyed seal's MAC covers before the contents (so that it is never
/// the MAC of some other quantgate file's bytes).
const SEAL_DOMAIN: &[u8] = b"quantgate sealed file v1\n";

impl Seal {
    /// Whether this seal authenticates (a key).
    pub fn keyed(&self) -> bool {
        matches!(self, Seal::Keyed(_))
    }

    /// A hasher of contents for this seal, fed as they are written or read.
    pub(crate) fn hasher(&self) -> SealHasher {
        match self {
            Seal::Plain => SealHasher::Plain(<Sha256 as sha2::Digest>::new()),
            Seal::Keyed(k) => {
                let mut m = Hmac::<Sha256>::new_from_slice(&k.bytes).expect("HMAC takes any key");
                m.update(SEAL_DOMAIN);
                SealHasher::Keyed(Box::new(m))
            }
        }
    }

    /// The 32-byte seal of `body`.
    pub(crate) fn tag(&self, body: &[u8]) -> [u8; 32] {
        let mut h = self.hasher();
        h.update(body);
        h.finish()
    }

    /// `body` when `tag` is its seal; else why not, in words that tell an
    /// accident from an edit sealed again where they can.
    pub(crate) fn check<'b>(&self, body: &'b [u8], tag: &[u8]) -> Result<&'b [u8], SealError> {
        let mut h = self.hasher();
        h.update(body);
        if !h.verify(tag) {
            return Err(self.explain(&mut || Seal::Plain.tag(body).as_slice() == tag));
        }
        Ok(body)
    }

    /// Why a seal did not verify, in words that tell an accident from an
    /// edit sealed again: `plain_matches` says whether the tag is the
    /// contents' plain sha256 (asked only of a keyed seal).
    pub(crate) fn explain(&self, plain_matches: &mut dyn FnMut() -> bool) -> SealError {
        match self {
            Seal::Keyed(k) => SealError::Forged {
                key: k.source.clone(),
                resealed: plain_matches(),
            },
            Seal::Plain => SealError::Corrupt,
        }
    }
}

/// A running seal ([`Seal::hasher`]).
pub(crate) enum SealHasher {
    /// sha256.
    Plain(Sha256),
    /// HMAC-SHA256.
    Keyed(Box<Hmac<Sha256>>),
}

impl SealHasher {
    /// Feed contents.
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        match self {
            SealHasher::Plain(h) => sha2::Digest::update(h, bytes),
            SealHasher::Keyed(m) => m.update(bytes),
        }
    }

    /// The seal of everything fed.
    pub(crate) fn finish(self) -> [u8; 32] {
        match self {
            SealHasher::Plain(h) => sha2::Digest::finalize(h).into(),
            SealHasher::Keyed(m) => m.finalize().into_bytes().into(),
        }
    }

    /// Whether `tag` is the seal of everything fed (a MAC compared in
    /// constant time); [`Seal::explain`] says why not.
    pub(crate) fn verify(self, tag: &[u8]) -> bool {
        match self {
            SealHasher::Plain(h) => sha2::Digest::finalize(h).as_slice() == tag,
            SealHasher::Keyed(m) => m.verify_slice(tag).is_ok(),
        }
    }
}

/// The canonical bytes a MAC covers: the JSON value with its `mac` field
/// left out, keys sorted (serde_json's map is ordered), numbers printed
/// shortest-exact.
fn canonical(value: &serde_json::Value) -> Vec<u8> {
    match value {
        serde_json::Value::Object(m) if m.contains_key(MAC_FIELD) => {
            let mut m = m.clone();
            m.remove(MAC_FIELD);
            serde_json::to_vec(&m).expect("JSON of JSON")
        }
        v => serde_json::to_vec(v).expect("JSON of JSON"),
    }
}

/// Put `key`'s MAC of `value` into it (an object).
pub(crate) fn sign(value: &mut serde_json::Value, key: &Key) {
    let mac = key.mac(&canonical(value));
    if let serde_json::Value::Object(m) = value {
        m.insert(MAC_FIELD.into(), mac.into());
    }
}

/// Check `value`'s MAC with `key`: Ok when it verifies; Err(why) when it is
/// missing, malformed or wrong. The `mac` field is taken out either way.
pub(crate) fn verify(value: &mut serde_json::Value, key: &Key) -> Result<(), SealError> {
    let bytes = canonical(value);
    let mac = match value {
        serde_json::Value::Object(m) => m.remove(MAC_FIELD),
        _ => None,
    };
    match mac {
        None => Err(SealError::NoMac {
            key: key.source.clone(),
        }),
        Some(serde_json::Value::String(mac)) if key.verifies(&bytes, &mac) => Ok(()),
        Some(_) => Err(SealError::BadMac {
            key: key.source.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A MAC verifies on the same JSON however it is printed, and on
    /// nothing else: every edit of a value, a key, or the MAC itself, and
    /// another key, are refused.
    #[test]
    fn a_mac_verifies_only_the_json_it_was_made_for() {
        let key = Key::new(b"0123456789abcdef-test".to_vec(), "test").unwrap();
        let other = Key::new(b"0123456789abcdef-other".to_vec(), "other").unwrap();
        let mut v = serde_json::json!({
            "case": "ppl/x", "model": "m", "status": "fail",
            "metrics": {"delta_nll_mean": -0.0101, "windows": 16.0},
        });
        sign(&mut v, &key);
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        let mut back: serde_json::Value = serde_json::from_str(&pretty).unwrap();
        assert!(verify(&mut back.clone(), &key).is_ok());
        assert!(verify(&mut back.clone(), &other)
            .unwrap_err()
            .to_string()
            .contains("does not verify"));
        let mut edited = back.clone();
        edited["metrics"]["delta_nll_mean"] = (-0.9).into();
        assert!(verify(&mut edited, &key).is_err());
        let mut edited = back.clone();
        edited["status"] = "pass".into();
        assert!(verify(&mut edited, &key).is_err());
        let mut edited = back.clone();
        let mac = edited[MAC_FIELD].as_str().unwrap().to_string();
        let flipped = if mac.ends_with('0') { "1" } else { "0" };
        edited[MAC_FIELD] = format!("{}{flipped}", &mac[..mac.len() - 1]).into();
        assert!(verify(&mut edited, &key).is_err());
        back.as_object_mut().unwrap().remove(MAC_FIELD);
        assert!(verify(&mut back, &key)
            .unwrap_err()
            .to_string()
            .contains("no MAC"));
        assert!(Key::new(b"short".to_vec(), "X").is_err());
    }
}
