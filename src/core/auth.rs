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

use crate::core::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The JSON field that carries an outcome's MAC.
pub const MAC_FIELD: &str = "mac";
/// What a MAC's text starts with.
pub const MAC_PREFIX: &str = "hmac-sha256:";
/// The environment variable holding the signing key itself.
pub const KEY_ENV: &str = "QUANTGATE_SIGNING_KEY";
/// The environment variable naming a file that holds the signing key.
pub const KEY_FILE_ENV: &str = "QUANTGATE_SIGNING_KEY_FILE";
/// The shortest key accepted, in bytes.
const MIN_KEY: usize = 16;

/// A MAC key (its Debug form shows where it came from, never the key).
#[derive(Clone)]
pub struct Key {
    bytes: Vec<u8>,
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
    pub fn new(bytes: Vec<u8>, source: &str) -> Result<Key> {
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
    pub fn mac(&self, bytes: &[u8]) -> String {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC takes any key");
        m.update(bytes);
        let tag = m.finalize().into_bytes();
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        format!("{MAC_PREFIX}{hex}")
    }

    /// Whether `mac` is this key's MAC of `bytes` (compared in constant time).
    pub fn verifies(&self, bytes: &[u8], mac: &str) -> bool {
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

/// The signing key of this process's config (`QUANTGATE_SIGNING_KEY`, or
/// `QUANTGATE_SIGNING_KEY_FILE`): None when neither is set. A bad value is
/// an error of the config, checked at the edge before anything runs.
pub fn signing_key() -> Option<&'static Key> {
    crate::core::config::Config::current().signing_key.as_ref()
}

/// The key result-cache entries are MACed with: the signing key, else this
/// user's own key (made on first use, mode 0600, outside the cache folder).
/// None when neither can be had: the result cache is then not used (a
/// cached result that cannot be authenticated is not a result).
pub fn result_cache_key() -> Option<&'static Key> {
    signing_key().or_else(user_key)
}

/// This user's own key (made on first use, mode 0600, outside the cache
/// folder): what the result cache uses without a signing key, and what
/// tags quantgate's temp files as its own. None (said once) when it can be
/// neither read nor made.
pub fn user_key() -> Option<&'static Key> {
    static LOCAL: OnceLock<Option<Key>> = OnceLock::new();
    LOCAL
        .get_or_init(|| {
            let path = local_key_path()?;
            match local_key(&path) {
                Ok(k) => Some(k),
                Err(why) => {
                    eprintln!(
                        "quantgate: the result cache is off: no key to authenticate its entries \
                         ({}: {why}); set {KEY_ENV} to use it",
                        path.display()
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// Ok when the key file at `path` is private, as ssh asks of a private
/// key: a regular file (not a symlink, which another user could point
/// elsewhere) that neither its group nor others can read or write; else
/// why not, naming the mode and the fix.
pub fn private_key_file(path: &Path) -> std::result::Result<(), String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if meta.file_type().is_symlink() {
        return Err(
            "is a symlink; a key file must be a regular file (copy the key there, mode 0600)"
                .into(),
        );
    }
    if !meta.is_file() {
        return Err("is not a regular file".into());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "mode {mode:04o} lets its group or others read or write the key; a key file \
                 must be private: `chmod 600 {}`",
                path.display()
            ));
        }
    }
    Ok(())
}

/// `$XDG_CONFIG_HOME/quantgate/result-cache.key`, else under `~/.config`.
fn local_key_path() -> Option<PathBuf> {
    crate::core::config::Config::current()
        .config_home
        .as_ref()
        .map(|d| d.join("result-cache.key"))
}

/// The key at `path`, made there first when there is none: 32 bytes from
/// the system's random source, written whole under another name and linked
/// into place (two processes making it at once agree on one).
fn local_key(path: &Path) -> std::result::Result<Key, String> {
    use std::io::{Read, Write};
    let read = |p: &Path| -> std::result::Result<Key, String> {
        private_key_file(p)?;
        let bytes = std::fs::read(p).map_err(|e| e.to_string())?;
        Key::new(bytes, &p.display().to_string()).map_err(|e| e.message)
    };
    if path.exists() {
        return read(path);
    }
    let dir = path.parent().expect("a file in a folder");
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    let tmp = dir.join(format!(".result-cache.key.{}", std::process::id()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let written = opts
        .open(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()));
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.to_string()),
    }
    read(path)
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
    /// The seal of reference products kept in the local cache: keyed with
    /// the result-cache key (the signing key, else this user's own), as
    /// result-cache entries are; plain only when no key can be had.
    pub fn local() -> Seal {
        result_cache_key().map_or(Seal::Plain, Seal::Keyed)
    }

    /// The seal of products that cross to other machines (a shipped
    /// reference folder): keyed with the signing key when one is set, else
    /// plain (another machine has no key of this user's to check it by).
    pub fn shipped() -> Seal {
        signing_key().map_or(Seal::Plain, Seal::Keyed)
    }

    /// Whether this seal authenticates (a key).
    pub fn keyed(&self) -> bool {
        matches!(self, Seal::Keyed(_))
    }

    /// A hasher of contents for this seal, fed as they are written or read.
    pub fn hasher(&self) -> SealHasher {
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
    pub fn tag(&self, body: &[u8]) -> [u8; 32] {
        let mut h = self.hasher();
        h.update(body);
        h.finish()
    }

    /// `body` when `tag` is its seal; else why not, in words that tell an
    /// accident from an edit sealed again where they can.
    pub fn check<'b>(&self, body: &'b [u8], tag: &[u8]) -> std::result::Result<&'b [u8], String> {
        let mut h = self.hasher();
        h.update(body);
        h.verify(tag).map_err(|why| match self {
            Seal::Keyed(k) if Seal::Plain.tag(body).as_slice() == tag => format!(
                "{why} ({}); it carries a plain sha256 seal instead: it was edited and sealed \
                 again, or written without the key",
                k.source
            ),
            Seal::Keyed(k) => format!("{why} ({})", k.source),
            Seal::Plain => why,
        })?;
        Ok(body)
    }
}

/// A running seal ([`Seal::hasher`]).
pub enum SealHasher {
    /// sha256.
    Plain(Sha256),
    /// HMAC-SHA256.
    Keyed(Box<Hmac<Sha256>>),
}

impl SealHasher {
    /// Feed contents.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            SealHasher::Plain(h) => sha2::Digest::update(h, bytes),
            SealHasher::Keyed(m) => m.update(bytes),
        }
    }

    /// The seal of everything fed.
    pub fn finish(self) -> [u8; 32] {
        match self {
            SealHasher::Plain(h) => sha2::Digest::finalize(h).into(),
            SealHasher::Keyed(m) => m.finalize().into_bytes().into(),
        }
    }

    /// Ok when `tag` is the seal of everything fed (a MAC compared in
    /// constant time); else why not.
    pub fn verify(self, tag: &[u8]) -> std::result::Result<(), String> {
        match self {
            SealHasher::Plain(h) => {
                if sha2::Digest::finalize(h).as_slice() == tag {
                    Ok(())
                } else {
                    Err(
                        "its trailing sha256 does not match its contents: truncated or \
                         corrupted on disk"
                            .into(),
                    )
                }
            }
            SealHasher::Keyed(m) => m.verify_slice(tag).map_err(|_| {
                "its keyed seal (HMAC-SHA256) does not verify with the key: the file was \
                 edited, truncated, or written under another key"
                    .to_string()
            }),
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
pub fn sign(value: &mut serde_json::Value, key: &Key) {
    let mac = key.mac(&canonical(value));
    if let serde_json::Value::Object(m) = value {
        m.insert(MAC_FIELD.into(), mac.into());
    }
}

/// Check `value`'s MAC with `key`: Ok when it verifies; Err(why) when it is
/// missing, malformed or wrong. The `mac` field is taken out either way.
pub fn verify(value: &mut serde_json::Value, key: &Key) -> std::result::Result<(), String> {
    let bytes = canonical(value);
    let mac = match value {
        serde_json::Value::Object(m) => m.remove(MAC_FIELD),
        _ => None,
    };
    match mac {
        None => Err(format!(
            "carries no MAC, and a signing key is set ({}): it was not written under that key",
            key.source
        )),
        Some(serde_json::Value::String(mac)) if key.verifies(&bytes, &mac) => Ok(()),
        Some(_) => Err(format!(
            "its MAC does not verify with the signing key ({}): the file was edited, or \
             written under another key",
            key.source
        )),
    }
}

/// An outcome as the JSON that `--json` and shards write: signed with the
/// signing key when one is set.
pub fn outcome_json(o: &crate::core::Outcome) -> Result<serde_json::Value> {
    let mut v =
        serde_json::to_value(o).map_err(|e| Error::harness(format!("serialising results: {e}")))?;
    if let Some(key) = signing_key() {
        sign(&mut v, key);
    }
    Ok(v)
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
        assert!(verify(&mut back, &key).unwrap_err().contains("no MAC"));
        assert!(Key::new(b"short".to_vec(), "X").is_err());
    }

    /// The local key is made once, 0600, and read back the same.
    #[test]
    fn the_local_key_is_made_once_and_kept_private() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("q/result-cache.key");
        let a = local_key(&path).unwrap();
        let b = local_key(&path).unwrap();
        assert_eq!(a.bytes, b.bytes);
        assert_eq!(a.bytes.len(), 32);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "mode {mode:o}");
        }
        std::fs::write(&path, b"short").unwrap();
        assert!(local_key(&path).unwrap_err().contains("too short"));
        // Readable by its group, or a symlink: refused, naming the mode.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(&path, [7u8; 32]).unwrap();
            assert!(local_key(&path).is_ok());
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
            let e = local_key(&path).unwrap_err();
            assert!(e.contains("mode 0640") && e.contains("chmod 600"), "{e}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).unwrap();
            assert!(local_key(&path).unwrap_err().contains("mode 0604"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let link = d.path().join("q/link.key");
            std::os::unix::fs::symlink(&path, &link).unwrap();
            assert!(private_key_file(&link).unwrap_err().contains("symlink"));
            assert!(private_key_file(&path).is_ok());
        }
    }
}
