//! File helpers shared by every stage that writes: atomic writes (temp file in
//! the same directory, fsync, rename, directory fsync) and streaming sha256.

use crate::core::auth::Seal;
use crate::core::error::{Error, Result, SealError};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::Path;
use tempfile::NamedTempFile;
use walkdir::WalkDir;

/// Lower-case hex of a byte slice.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `s` is exactly `n` lower-case hex digits (a sha256 is 64, a git
/// commit 40).
pub(crate) fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// sha256 of a byte slice, hex.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The executable this process runs, as the kernel holds it: on Linux
/// `/proc/self/exe`, which stays this very build when the file it was
/// started from is rebuilt or removed mid-run (`cargo build` during a long
/// `cargo test`), so a worker started from it is its parent's build;
/// elsewhere [`std::env::current_exe`].
pub(crate) fn running_exe() -> std::io::Result<std::path::PathBuf> {
    let held = Path::new("/proc/self/exe");
    if cfg!(target_os = "linux") && held.exists() {
        return Ok(held.to_path_buf());
    }
    std::env::current_exe()
}

/// sha256 and size of a file, read in 1 MiB blocks; `progress` gets bytes read.
pub fn sha256_file(path: &Path, mut progress: impl FnMut(u64)) -> Result<(String, u64)> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        progress(n as u64);
    }
    Ok((hex(&hasher.finalize()), total))
}

/// The file `path` opened to be locked (created, never truncated; its
/// directory created), not locked yet.
pub(crate) fn lock_target(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))
}

/// An exclusive `flock` on `path` ([`lock_target`]), waited for again when a
/// signal interrupts the wait, held until the file is dropped or the
/// process dies, so never stale.
pub(crate) fn lock_file(path: &Path) -> Result<File> {
    let f = lock_target(path)?;
    loop {
        match f.lock() {
            Ok(()) => return Ok(f),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path, e)),
        }
    }
}

/// An exclusive `flock` on the folder `dir` (opened read-only; nothing is
/// written), held until the handle is dropped or the process dies.
pub(crate) fn lock_dir(dir: &Path) -> Result<File> {
    let f = File::open(dir).map_err(|e| Error::io(dir, e))?;
    f.lock().map_err(|e| Error::io(dir, e))?;
    Ok(f)
}

/// The mark in the name of every temp file quantgate writes, and only those.
pub(crate) const TEMP_MARK: &str = ".quantgate-tmp-";

/// The owner tag of a temp file for `name` made by process `pid`: 16 hex
/// digits of a MAC with this user's key ([`crate::core::keys::process_user_key`]),
/// so that a sweep removes only files it can prove quantgate wrote; `none`
/// without a key (such a file is never swept).
fn temp_tag(name: &str, pid: u32) -> String {
    match crate::core::keys::process_user_key() {
        Some(k) => k.mac(format!("quantgate-temp|{name}|{pid}").as_bytes())
            [crate::core::auth::MAC_PREFIX.len()..][..16]
            .to_string(),
        None => "none".into(),
    }
}

/// The name of a temp file for `name` made by process `pid`, up to its
/// random part: `.<name>.quantgate-tmp-<pid>-<tag>-`.
pub fn temp_prefix(name: &str, pid: u32) -> String {
    format!(".{name}{TEMP_MARK}{pid}-{}-", temp_tag(name, pid))
}

/// Whether `file_name` is a temp file this user's quantgate made: its
/// tag verifies for the name and pid it carries.
fn is_our_temp(file_name: &str) -> bool {
    let Some((name, rest)) = file_name
        .strip_prefix('.')
        .and_then(|f| f.split_once(TEMP_MARK))
    else {
        return false;
    };
    let mut it = rest.splitn(3, '-');
    let (Some(pid), Some(tag), Some(_)) = (it.next(), it.next(), it.next()) else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    tag != "none" && tag == temp_tag(name, pid)
}

/// A new temp file beside `dest` (its directory created), named by
/// [`temp_prefix`] and a random part, and locked (flock, exclusive) while
/// it is written, so that [`clean_stale_temps`] can tell a dead writer's
/// leftovers from a live one's in any PID namespace; removed when dropped
/// unless [`commit`]ted (the lock goes with the file handle).
pub(crate) fn temp_beside(dest: &Path) -> Result<NamedTempFile> {
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let name = dest
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = temp_prefix(&name, std::process::id());
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix);
    // The mode `File::create` gives (0666 less the umask), not tempfile's 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        b.permissions(fs::Permissions::from_mode(0o666));
    }
    let tmp = b.tempfile_in(dir).map_err(|e| Error::io(dir, e))?;
    tmp.as_file().lock().map_err(|e| Error::io(tmp.path(), e))?;
    Ok(tmp)
}

/// Move a finished temp file into place: fsync it, rename, fsync the directory.
pub(crate) fn commit(tmp: NamedTempFile, dest: &Path) -> Result<()> {
    tmp.as_file()
        .sync_all()
        .map_err(|e| Error::io(tmp.path(), e))?;
    tmp.persist(dest).map_err(|e| Error::io(dest, e.error))?;
    if let Some(dir) = dest.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        // Directory fsync makes the rename durable; not every filesystem allows it.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Remove temp files under `dir` (to `depth` folders down: 1 is `dir`
/// itself) that this user's quantgate wrote (their [`temp_prefix`] tag
/// verifies: a look-alike name is never enough) and whose writer is gone:
/// no lock is held on them (a live writer, in this PID namespace or
/// another, holds one) and they are over a minute old. Nothing else is
/// ever removed. Returns how many went.
pub(crate) fn clean_stale_temps_to(dir: &Path, depth: usize) -> usize {
    let mut removed = 0;
    for e in WalkDir::new(dir)
        .max_depth(depth)
        .into_iter()
        .filter_map(|e| e.ok())
    {
        let name = e.file_name().to_string_lossy();
        if e.file_type().is_dir() || !is_our_temp(&name) {
            continue;
        }
        // The instant between a writer creating its file and locking it.
        let young = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < std::time::Duration::from_secs(60));
        if young {
            continue;
        }
        let Ok(f) = File::open(e.path()) else {
            continue;
        };
        if f.try_lock().is_ok() && fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// [`clean_stale_temps_to`] over the whole tree under `dir` (a folder that
/// is quantgate's own: the cache, the goldens).
pub(crate) fn clean_stale_temps(dir: &Path) -> usize {
    clean_stale_temps_to(dir, usize::MAX)
}

/// Seal `bytes` for reading back: append the sha256 of everything before it
/// (32 raw bytes). Every file quantgate writes and later reads back (caches,
/// result entries, `.qgref` rows) is sealed, and unsealed before use;
/// reference products are sealed with a key ([`seal_with`]).
pub fn seal(bytes: Vec<u8>) -> Vec<u8> {
    seal_with(bytes, Seal::Plain)
}

/// Seal `bytes` with `seal`: its 32-byte tag of everything before it appended.
pub(crate) fn seal_with(mut bytes: Vec<u8>, seal: Seal) -> Vec<u8> {
    let tag = seal.tag(&bytes);
    bytes.extend_from_slice(&tag);
    bytes
}

/// The contents of `bytes` sealed with `seal`, or why they are not intact
/// (or, with a key, not authentic).
pub(crate) fn unseal_with(bytes: &[u8], seal: Seal) -> std::result::Result<&[u8], SealError> {
    if bytes.len() < 32 {
        return Err(SealError::Short);
    }
    let (body, tag) = bytes.split_at(bytes.len() - 32);
    seal.check(body, tag)
}

/// Write `bytes` sealed ([`seal`]) to `dest` atomically.
pub fn write_sealed(dest: &Path, bytes: Vec<u8>) -> Result<()> {
    write_atomic(dest, &seal(bytes))
}

/// Write `bytes` sealed with `seal` to `dest` atomically.
pub(crate) fn write_sealed_with(dest: &Path, bytes: Vec<u8>, seal: Seal) -> Result<()> {
    write_atomic(dest, &seal_with(bytes, seal))
}

/// The contents of a sealed file: `Ok(None)` when there is none, `Err(why)`
/// when it cannot be read or is not intact — never contents that were not
/// written whole by quantgate.
pub fn read_sealed(path: &Path) -> std::result::Result<Option<Vec<u8>>, SealError> {
    read_sealed_with(path, Seal::Plain)
}

/// [`read_sealed`] for a file sealed with `seal`.
pub(crate) fn read_sealed_with(
    path: &Path,
    seal: Seal,
) -> std::result::Result<Option<Vec<u8>>, SealError> {
    match fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SealError::Read(e.to_string())),
        Ok(bytes) => unseal_with(&bytes, seal).map(|b| Some(b.to_vec())),
    }
}

/// `path` relative to `root`, `/`-separated (a test name, a golden's case).
pub fn rel_slash(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// Prove that folder `dir` (given as `flag` on the command line) can be
/// written, or made where it does not exist yet: a temp file of our own is
/// made and removed in it, or in its nearest existing ancestor (nothing is
/// left behind, no folder made). An output path that cannot be used is
/// found before any work.
pub fn writable_dir(flag: &str, dir: &Path) -> Result<()> {
    let bad = |e: std::io::Error| {
        Error::input(format!("{flag} {}: cannot write there: {e}", dir.display()))
    };
    if dir.exists() && !dir.is_dir() {
        return Err(Error::input(format!(
            "{flag} {}: exists and is not a directory",
            dir.display()
        )));
    }
    let mut probe = dir;
    while !probe.exists() {
        probe = match probe.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
    }
    if !probe.is_dir() {
        return Err(Error::input(format!(
            "{flag} {}: {} is not a directory",
            dir.display(),
            probe.display()
        )));
    }
    tempfile::Builder::new()
        .prefix(".quantgate-probe-")
        .tempfile_in(probe)
        .map(drop)
        .map_err(bad)
}

/// Whether file `path` (given as `flag`) can be written: not a folder,
/// and its folder can be written or made ([`writable_dir`]).
pub fn writable_file(flag: &str, path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::input(format!(
            "{flag} {}: is a directory; give a file path",
            path.display()
        )));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    writable_dir(flag, parent)
}

/// Write `bytes` to `dest` atomically.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = temp_beside(dest)?;
    tmp.write_all(bytes).map_err(|e| Error::io(tmp.path(), e))?;
    commit(tmp, dest)
}

/// 1-based line and column of a byte offset.
pub(crate) fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    let before = &src[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(offset, |i| offset - i - 1) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_strings() {
        // FIPS 180-2 test vector.
        assert_eq!(
            sha256_bytes(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn line_col_counts_from_one() {
        let s = "a = 1\nbb = 2\n";
        assert_eq!(line_col(s, 0), (1, 1));
        assert_eq!(line_col(s, 6), (2, 1));
        assert_eq!(line_col(s, 9), (2, 4));
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = crate::core::scratch::scratch("fsutil");
        let dest = dir.join("x.txt");
        write_atomic(&dest, b"one").unwrap();
        write_atomic(&dest, b"two").unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The sweep removes only quantgate's own temp files (their owner tag
    /// verifies) whose writer is gone: a user's look-alike stays, and so
    /// does a file whose writer holds its lock (as one in another PID
    /// namespace would, whatever its pid), and a live writer's own file.
    #[test]
    fn the_sweep_removes_only_dead_writers_temp_files() {
        let dir = crate::core::scratch::scratch("sweep");
        fs::create_dir_all(dir.join("notes")).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let make = |p: &Path| {
            let f = File::create(p).unwrap();
            f.set_modified(old).unwrap();
            f
        };
        let user = dir.join("notes/.thesis.tex.tmp-999999");
        // A look-alike of quantgate's name without its owner tag, and one
        // whose tag is for another name: neither is ours.
        let alike = dir.join(format!(".w.snap{TEMP_MARK}999999999-AbCdEf"));
        let copied = dir.join(format!(
            "{}AbCdEf",
            temp_prefix("v.snap", 999999999).replacen("v.snap", "u.snap", 1)
        ));
        let dead = dir.join(format!("{}AbCdEf", temp_prefix("x.snap", 999999999)));
        let live = dir.join(format!("{}GhIjKl", temp_prefix("y.snap", 999999999)));
        let deep = dir.join(format!("notes/{}AbCdEf", temp_prefix("x.snap", 999999998)));
        for p in [&user, &alike, &copied, &dead, &deep] {
            drop(make(p));
        }
        let writer = make(&live);
        writer.lock().unwrap();
        // A live writer's own file, even old, is locked from the start.
        let busy = temp_beside(&dir.join("b.snap")).unwrap();
        busy.as_file().set_modified(old).unwrap();
        let young = temp_beside(&dir.join("z.snap")).unwrap();
        drop(young.as_file().unlock());
        assert_eq!(clean_stale_temps_to(&dir, 1), 1, "only `dir` itself");
        assert!(deep.exists());
        assert_eq!(clean_stale_temps(&dir), 1);
        assert!(!deep.exists());
        assert!(user.exists() && alike.exists() && copied.exists());
        assert!(live.exists() && young.path().exists() && busy.path().exists());
        assert!(!dead.exists());
        drop(writer);
        assert_eq!(clean_stale_temps(&dir), 1);
        assert!(!live.exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
