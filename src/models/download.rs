//! Pinned model files put in place from the Hugging Face Hub
//! (`quantgate models download`): each file of a lock entry with a Hub
//! source ([`super::hub::HubFile`]) downloaded at its commit and verified
//! against the lock's bytes and sha256 before it is used.
//!
//! Contract: a downloaded file reaches its place in the lock only through a
//! temp file beside it, hashed as it is written, and only when every byte
//! and the sha256 equal the lock's: otherwise nothing is written and the
//! error names the file, the source and both hashes. A file already in
//! place is verified, never overwritten. The download itself is the Hub's
//! own client (`huggingface_hub.hf_hub_download`, into its cache), so
//! tokens, mirrors (`HF_ENDPOINT`) and offline mode work as users expect.

use crate::core::error::{Error, Result};
use crate::core::fsutil;
use crate::models::hub::HubFile;
use crate::models::local::Pinned;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// What [`download`] did with one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Downloaded {
    /// Every file was in place and equal to the lock.
    Present,
    /// These files were downloaded, verified and put in place.
    Written(Vec<PathBuf>),
}

/// Put the files of lock entry `alias` in place from the Hub, with
/// `python` running `huggingface_hub`: each missing file downloaded at
/// the pinned revision, copied to a temp beside its place while hashed,
/// and moved there only when its bytes and sha256 are the lock's; a file
/// in place verified. Err when the entry names no Hub source, the client
/// fails, or any file differs (naming it, its source and both hashes).
pub fn download(python: &str, alias: &str, pinned: &Pinned) -> Result<Downloaded> {
    let hub = pinned.hub.as_ref().ok_or_else(|| {
        Error::input(format!(
            "`{alias}`: the lock names no Hub source for {} (pin it with `quantgate models pin \
             --hub ORG/NAME@REVISION`)",
            pinned.path.display()
        ))
    })?;
    let files = pinned.files();
    // (place, repository path, bytes, sha256) of each file.
    let wanted: Vec<(PathBuf, String, u64, String)> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let name = f
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let in_repo = if i == 0 {
                hub.file.clone()
            } else {
                hub.beside(&name)
            };
            (f.path.clone(), in_repo, f.bytes, f.sha256.clone())
        })
        .collect();
    let mut missing = Vec::new();
    for (place, in_repo, bytes, sha) in &wanted {
        if place.exists() {
            let (got, n) = fsutil::sha256_file(place, |_| {})?;
            if (&got, n) != (sha, *bytes) {
                return Err(Error::input(format!(
                    "{}: sha256 {got} ({n} bytes), the lock pins {sha} ({bytes} bytes) for `{alias}`: \
                     a file in place is never overwritten; move it away to download {} from {}",
                    place.display(),
                    in_repo,
                    hub.at()
                )));
            }
        } else {
            missing.push((place, in_repo, *bytes, sha));
        }
    }
    if missing.is_empty() {
        return Ok(Downloaded::Present);
    }
    let names: Vec<&str> = missing.iter().map(|m| m.1.as_str()).collect();
    let cached = client(python, alias, hub, &names)?;
    let mut written = Vec::new();
    for ((place, in_repo, bytes, sha), from) in missing.into_iter().zip(cached) {
        let source = format!("{in_repo} of {}", hub.at());
        place_verified(&from, place, bytes, sha, &source, alias)?;
        written.push(place.clone());
    }
    Ok(Downloaded::Written(written))
}

/// Copy `from` to `place` through a temp beside it, hashing as it goes;
/// the temp is moved into place only when its bytes and sha256 are
/// `bytes` and `sha`, else dropped (it is ours) and the error names both.
fn place_verified(
    from: &Path,
    place: &Path,
    bytes: u64,
    sha: &str,
    source: &str,
    alias: &str,
) -> Result<()> {
    let mut src = std::fs::File::open(from).map_err(|e| Error::io(from, e))?;
    let mut tmp = fsutil::temp_beside(place)?;
    let mut h = Sha256::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let k = src.read(&mut buf).map_err(|e| Error::io(from, e))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        tmp.write_all(&buf[..k])
            .map_err(|e| Error::io(tmp.path(), e))?;
        n += k as u64;
    }
    let got = fsutil::hex(&h.finalize());
    if (got.as_str(), n) != (sha, bytes) {
        return Err(Error::input(format!(
            "{}: downloaded {source} for `{alias}`: sha256 {got} ({n} bytes), the lock pins \
             {sha} ({bytes} bytes); nothing written (is the revision the one the lock was \
             pinned at?)",
            place.display()
        )));
    }
    fsutil::commit(tmp, place)
}

/// The Hub client's script: each file downloaded into its cache at the
/// revision, one path per line.
const CLIENT: &str = "\
import sys
try:
    from huggingface_hub import hf_hub_download
except ImportError as e:
    sys.exit(f'huggingface_hub is not installed ({e}): pip install huggingface_hub')
repo, rev = sys.argv[1], sys.argv[2]
for f in sys.argv[3:]:
    print(hf_hub_download(repo_id=repo, filename=f, revision=rev))
";

/// `files` of `hub` downloaded by the Hub's client into its cache; the
/// paths it gives, in order.
fn client(python: &str, alias: &str, hub: &HubFile, files: &[&str]) -> Result<Vec<PathBuf>> {
    crate::core::progress::say!(
        "quantgate: downloading `{alias}` from {}: {}",
        hub.at(),
        files.join(", ")
    );
    let out = std::process::Command::new(python)
        .args(["-c", CLIENT])
        .arg(&hub.repo)
        .arg(&hub.revision)
        .args(files)
        .output()
        .map_err(|e| Error::harness(format!("`{alias}`: cannot run `{python}`: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.trim().lines().last().unwrap_or("").to_string();
        return Err(Error::harness(format!(
            "`{alias}`: the Hub client could not download {} from {} ({}): {last}",
            files.join(", "),
            hub.at(),
            out.status
        )));
    }
    let paths: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(PathBuf::from)
        .collect();
    if paths.len() != files.len() {
        return Err(Error::harness(format!(
            "`{alias}`: the Hub client gave {} paths for {} files",
            paths.len(),
            files.len()
        )));
    }
    Ok(paths)
}
