//! The keys of this process's config: the signing key, the result-cache
//! key (the signing key, else this user's own, made on first use outside
//! the cache folder), and the seals they give the files quantgate keeps
//! ([`Seal::local`]) and ships ([`Seal::shipped`]). [`crate::core::auth`]
//! holds the keyed arithmetic; this module says which key a file gets.

use crate::core::auth::{private_key_file, sign, Key, Seal, KEY_ENV};
use crate::core::config::Config;
use crate::core::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The key result-cache entries and local reference products are MACed
/// with: `config`'s signing key, else this user's own ([`user_key`], under
/// its `config_home`). None when neither can be had (the result cache is
/// then not used: a cached result that cannot be authenticated is not a
/// result).
pub(crate) fn result_cache_key(config: &Config) -> Option<&Key> {
    config
        .signing_key()
        .or_else(|| user_key(config.config_home.as_deref()))
}

/// This user's own key, kept in `config_home` (`$XDG_CONFIG_HOME/quantgate`,
/// else `~/.config/quantgate`, as [`crate::core::config::Config::config_home`]
/// says): made on first use, mode 0600, outside the cache folder. What the
/// result cache uses without a signing key, and what tags quantgate's temp
/// files as its own. None (said once per folder) when it can be neither
/// read nor made, or there is no such folder.
pub(crate) fn user_key(config_home: Option<&Path>) -> Option<&'static Key> {
    type Keys = std::sync::Mutex<std::collections::HashMap<PathBuf, &'static Option<Key>>>;
    static LOCAL: OnceLock<Keys> = OnceLock::new();
    let path = config_home?.join("result-cache.key");
    let mut keys = LOCAL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let key: &'static Option<Key> = keys.entry(path.clone()).or_insert_with(|| {
        // Leaked once per folder a process uses (one, in practice).
        Box::leak(Box::new(match local_key(&path) {
            Ok(k) => Some(k),
            Err(why) => {
                crate::core::progress::say!(
                    "quantgate: the result cache is off: no key to authenticate its entries \
                     ({}: {why}); set {KEY_ENV} to use it",
                    path.display()
                );
                None
            }
        }))
    });
    key.as_ref()
}

/// This user's own key as the environment places it
/// ([`crate::core::config::user_config_home`]): the temp-file tag's key,
/// which every process of the user must agree on.
pub(crate) fn process_user_key() -> Option<&'static Key> {
    user_key(crate::core::config::user_config_home().as_deref())
}

/// The key at `path`, made there first when there is none: 32 bytes from
/// the system's random source, written whole under another name and linked
/// into place (two processes making it at once agree on one).
fn local_key(path: &Path) -> Result<Key> {
    use std::io::{Read, Write};
    let io = |e: std::io::Error| Error::harness(e.to_string());
    let read = |p: &Path| -> Result<Key> {
        private_key_file(p)?;
        let bytes = std::fs::read(p).map_err(io)?;
        Key::new(bytes, &p.display().to_string())
    };
    if path.exists() {
        return read(path);
    }
    let dir = path.parent().expect("a file in a folder");
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::harness(format!("/dev/urandom: {e}")))?;
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
        Err(e) => return Err(io(e)),
    }
    read(path)
}

/// `key` for the life of the process: one copy per distinct key (a
/// process uses one or two), so that seals stay `Copy`.
fn interned(key: &Key) -> &'static Key {
    static KEYS: OnceLock<std::sync::Mutex<Vec<&'static Key>>> = OnceLock::new();
    let mut keys = KEYS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(k) = keys
        .iter()
        .find(|k| k.bytes == key.bytes && k.source == key.source)
    {
        return k;
    }
    let k: &'static Key = Box::leak(Box::new(key.clone()));
    keys.push(k);
    k
}

impl Seal {
    /// The seal of reference products kept in the local cache: keyed with
    /// the result-cache key (the signing key, else this user's own), as
    /// result-cache entries are; plain only when no key can be had.
    pub(crate) fn local(config: &Config) -> Seal {
        result_cache_key(config).map_or(Seal::Plain, |k| Seal::Keyed(interned(k)))
    }

    /// The seal of products that cross to other machines (a shipped
    /// reference folder): keyed with the signing key when one is set, else
    /// plain (another machine has no key of this user's to check it by).
    pub fn shipped(config: &Config) -> Seal {
        config
            .signing_key()
            .map_or(Seal::Plain, |k| Seal::Keyed(interned(k)))
    }
}

/// An outcome as the JSON that `--json` and shards write: signed with
/// `key` (the config's signing key) when one is given.
pub(crate) fn outcome_json(
    o: &crate::core::Outcome,
    key: Option<&Key>,
) -> Result<serde_json::Value> {
    let mut v =
        serde_json::to_value(o).map_err(|e| Error::harness(format!("serialising results: {e}")))?;
    if let Some(key) = key {
        sign(&mut v, key);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(local_key(&path).unwrap_err().message.contains("too short"));
        // Readable by its group, or a symlink: refused, naming the mode.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(&path, [7u8; 32]).unwrap();
            assert!(local_key(&path).is_ok());
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
            let e = local_key(&path).unwrap_err().message;
            assert!(e.contains("mode 0640") && e.contains("chmod 600"), "{e}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).unwrap();
            assert!(local_key(&path).unwrap_err().message.contains("mode 0604"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let link = d.path().join("q/link.key");
            std::os::unix::fs::symlink(&path, &link).unwrap();
            assert!(private_key_file(&link)
                .unwrap_err()
                .to_string()
                .contains("symlink"));
            assert!(private_key_file(&path).is_ok());
        }
    }
}
