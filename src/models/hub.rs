//! Pinned model files from the Hugging Face Hub: a lock entry may say
//! where its file is published (`hub = { repo, revision, file }`, the
//! revision a commit), so that a CI runner, which has the committed lock
//! and not the GGUF files, downloads each at that commit and verifies it
//! against the lock's bytes and sha256 before it is used
//! (`quantgate models download`).
//!
//! Contract: a revision is a 40-hex commit, never a branch (a branch
//! moves); a downloaded file reaches its place in the lock only through a
//! temp file beside it, hashed as it is written, and only when every byte
//! and the sha256 equal the lock's: otherwise nothing is written and the
//! error names the file, the source and both hashes. A file already in
//! place is verified, never overwritten. The download itself is the Hub's
//! own client (`huggingface_hub.hf_hub_download`, into its cache), so
//! tokens, mirrors (`HF_ENDPOINT`) and offline mode work as users expect.

use crate::core::error::{Error, Result};
use crate::core::fsutil;
use crate::models::local::Pinned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Where a pinned file is published on the Hub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HubFile {
    /// The model repository, `ORG/NAME`.
    pub repo: String,
    /// The commit (40 hex digits) the file is taken at.
    pub revision: String,
    /// The file's path in the repository (of the first part of a split
    /// file; the other parts are beside it, by their own names).
    pub file: String,
}

impl HubFile {
    /// `ORG/NAME@REVISION` (`models pin --hub`, `init --hub`) as the
    /// source of `file`; Err says what is wrong with the spec.
    pub fn of_spec(spec: &str, file: &str) -> Result<HubFile> {
        let (repo, revision) = spec.split_once('@').ok_or_else(|| {
            Error::input(format!(
                "--hub {spec}: expected ORG/NAME@REVISION (the commit the files are published at)"
            ))
        })?;
        let h = HubFile {
            repo: repo.to_string(),
            revision: revision.to_string(),
            file: file.to_string(),
        };
        match h.problems().first() {
            Some(why) => Err(Error::input(format!("--hub {spec}: {why}"))),
            None => Ok(h),
        }
    }

    /// What is wrong with it, each as a phrase (empty: nothing).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && !s.starts_with('.')
        };
        match self.repo.split_once('/') {
            Some((org, name)) if ok(org) && ok(name) => {}
            _ => out.push(format!(
                "repo `{}` is not a Hub model id (ORG/NAME)",
                self.repo
            )),
        }
        if !fsutil::is_hex(&self.revision, 40) {
            out.push(format!(
                "revision `{}` is not a commit (40 lower-case hex digits): a branch or tag \
                 moves, so pin the commit the files are published at",
                self.revision
            ));
        }
        let file = Path::new(&self.file);
        if self.file.is_empty()
            || file.is_absolute()
            || file
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            out.push(format!(
                "file `{}` is not a path inside the repository",
                self.file
            ));
        }
        out
    }

    /// The repository path of the part named `name` (a split file's parts
    /// sit beside its first).
    fn beside(&self, name: &str) -> String {
        match self.file.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/{name}"),
            None => name.to_string(),
        }
    }

    /// `ORG/NAME@REV`, for messages.
    pub fn at(&self) -> String {
        format!("{}@{}", self.repo, self.revision)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec is a repository and a commit; a branch, a bad id or a path
    /// out of the repository is refused, saying why.
    #[test]
    fn a_hub_source_is_a_repository_at_a_commit() {
        let rev = "0123456789abcdef0123456789abcdef01234567";
        let h = HubFile::of_spec(&format!("acme/acme-135m-GGUF@{rev}"), "q8.gguf").unwrap();
        assert_eq!(h.at(), format!("acme/acme-135m-GGUF@{rev}"));
        assert_eq!(h.beside("q8-00002-of-00002.gguf"), "q8-00002-of-00002.gguf");
        let nested = HubFile {
            file: "gguf/q8-00001-of-00002.gguf".into(),
            ..h.clone()
        };
        assert_eq!(
            nested.beside("q8-00002-of-00002.gguf"),
            "gguf/q8-00002-of-00002.gguf"
        );
        for (spec, file, why) in [
            ("acme/m@main", "a.gguf", "is not a commit"),
            ("acme/m", "a.gguf", "expected ORG/NAME@REVISION"),
            (&format!("acme@{rev}"), "a.gguf", "is not a Hub model id"),
            (&format!("acme/m@{rev}"), "../a.gguf", "not a path inside"),
        ] {
            let e = HubFile::of_spec(spec, file).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
        }
    }
}
