//! File helpers shared by every stage that writes: atomic writes (temp file in
//! the same directory, fsync, rename, directory fsync) and streaming sha256.

use crate::core::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::Path;
use tempfile::NamedTempFile;
use walkdir::WalkDir;

/// Lower-case hex of a byte slice.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `s` is exactly `n` lower-case hex digits (a sha256 is 64, a git
/// commit 40).
pub fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// sha256 of a byte slice, hex.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
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

/// A new temp file beside `dest` (its directory created), named
/// `.<name>.tmp-<pid>-<random>` so that [`clean_stale_temps`] can tell a
/// dead process's leftovers; removed when dropped unless [`commit`]ted.
pub fn temp_beside(dest: &Path) -> Result<NamedTempFile> {
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let name = dest
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{name}.tmp-{}-", std::process::id());
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix);
    // The mode `File::create` gives (0666 less the umask), not tempfile's 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        b.permissions(fs::Permissions::from_mode(0o666));
    }
    b.tempfile_in(dir).map_err(|e| Error::io(dir, e))
}

/// Move a finished temp file into place: fsync it, rename, fsync the directory.
pub fn commit(tmp: NamedTempFile, dest: &Path) -> Result<()> {
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

/// Remove temp files ([`temp_beside`] names) under `dir` whose writing
/// process is gone: what an interrupted run left behind. A live process's
/// temp files (another test worker's) are kept. Returns how many went.
pub fn clean_stale_temps(dir: &Path) -> usize {
    let mut removed = 0;
    for e in WalkDir::new(dir).into_iter().filter_map(|e| e.ok()) {
        if e.file_type().is_dir() {
            continue;
        }
        let name = e.file_name().to_string_lossy();
        if !(name.starts_with('.') && name.contains(".tmp-")) {
            continue;
        }
        let pid: Option<u32> = name
            .rsplit(".tmp-")
            .next()
            .and_then(|s| s.split('-').next())
            .and_then(|s| s.parse().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive && fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
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

/// Write `bytes` to `dest` atomically.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = temp_beside(dest)?;
    tmp.write_all(bytes).map_err(|e| Error::io(tmp.path(), e))?;
    commit(tmp, dest)
}

/// 1-based line and column of a byte offset.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
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
        let dir = std::env::temp_dir().join(format!("qg-fsutil-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
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
}
