//! Local model files named by path (`--model ./out/*.gguf`, `models =
//! ["path:…"]` in a case), pinned in a lock file beside the registry
//! (`<suites>/models.lock`), as Cargo.lock pins dependencies.
//!
//! A file inside the project (under the lock's folder's parent: the
//! crate `quantgate init` writes) is written with its path relative to the
//! lock's folder (`../out/mine-f16.gguf`), so the committed lock holds in
//! any checkout, a CI runner's included; a file elsewhere keeps its
//! absolute path. In memory every path is absolute.
//!
//! Contract: a file is pinned (alias, canonical path, bytes, sha256, and
//! every part of a split `-00001-of-0000N.gguf` file with its own bytes and
//! sha256) the first time it is named and the lock holds no entry for it;
//! afterwards the lock is only read, and every use verifies the file against
//! it ([`crate::models::ensure`]): a changed file is an error naming both
//! hashes, never a silent re-pin. Only `quantgate models pin` rewrites an
//! entry. The lock is written atomically under a `flock`, so concurrent
//! processes planning the same new files pin them once.

use crate::core::error::{Error, Result};
use crate::core::fsutil;
use crate::core::parse::parse_toml;
use crate::models::gguf::gguf_parts;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The lock file's name, beside `models.toml`.
pub(crate) const LOCK_FILE: &str = "models.lock";

/// A pinned local model: the file (the first part of a split file), the
/// bytes and sha256 of the whole (every part, concatenated in order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pinned {
    /// Canonical path of the file (of the first part of a split file).
    pub path: PathBuf,
    /// Bytes, every part added up.
    pub bytes: u64,
    /// sha256 of the bytes (of the parts concatenated in order).
    pub sha256: String,
    /// Every part of a split file, in order (empty for a single file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Where the file is published on the Hugging Face Hub, at a commit
    /// (`quantgate models download` puts it in place from there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<crate::models::hub::HubFile>,
}

/// One part of a split GGUF.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// Canonical path.
    pub path: PathBuf,
    /// Bytes.
    pub bytes: u64,
    /// sha256.
    pub sha256: String,
}

impl Pinned {
    /// The files of this model, in order, each with its pinned bytes and sha256.
    pub(crate) fn files(&self) -> Vec<Part> {
        if self.parts.is_empty() {
            vec![Part {
                path: self.path.clone(),
                bytes: self.bytes,
                sha256: self.sha256.clone(),
            }]
        } else {
            self.parts.clone()
        }
    }
}

/// The lock file: pinned local models by alias.
#[derive(Debug, Clone, Default)]
pub struct Lock {
    /// Where it lives (it may not exist yet).
    pub path: PathBuf,
    /// Entries by alias.
    pub entries: BTreeMap<String, Pinned>,
}

const HEADER: &str = "\
# quantgate: local model files, pinned by path (alias, file, bytes, sha256; every
# part of a split file). Written when a file is first named (`--model PATH`,
# `models = [\"path:…\"]`), verified on every use, rewritten only by
# `quantgate models pin`. A file that changes afterwards is an error.
";

impl Lock {
    /// The lock beside the registry at `registry`; empty when absent.
    pub fn beside(registry: &Path) -> Result<Lock> {
        let path = registry.parent().unwrap_or(Path::new(".")).join(LOCK_FILE);
        Lock::load(&path)
    }

    /// Read and validate the lock at `path`; empty when the file is absent.
    pub fn load(path: &Path) -> Result<Lock> {
        let src = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Lock {
                    path: path.to_path_buf(),
                    entries: BTreeMap::new(),
                })
            }
            Err(e) => {
                return Err(Error::input(format!(
                    "{}: cannot read the lock of pinned model files: {e}",
                    path.display()
                )))
            }
        };
        let mut entries: BTreeMap<String, Pinned> = parse_toml(path, &src)?;
        // Relative paths are the lock folder's (canonical, as pinned paths are).
        let dir = lock_dir(path);
        for p in entries.values_mut() {
            for f in std::iter::once(&mut p.path).chain(p.parts.iter_mut().map(|q| &mut q.path)) {
                if let (false, Some(dir)) = (f.is_absolute(), &dir) {
                    *f = lexical(&dir.join(&*f));
                }
            }
        }
        let mut errors = Vec::new();
        for (alias, p) in &entries {
            let at = format!("{}: [{alias}]", path.display());
            if let Some(why) = crate::models::bad_alias(alias) {
                errors.push(Error::input(format!("{at}: {why}")));
            }
            for f in std::iter::once((&p.path, &p.sha256, "")).chain(
                p.parts
                    .iter()
                    .map(|q| (&q.path, &q.sha256, " (a part)"))
                    .collect::<Vec<_>>(),
            ) {
                if !fsutil::is_hex(f.1, 64) {
                    errors.push(Error::input(format!(
                        "{at}.sha256{}: `{}` is not 64 lower-case hex digits",
                        f.2, f.1
                    )));
                }
                if !f.0.is_absolute() {
                    errors.push(Error::input(format!(
                        "{at}.path{}: `{}` is neither absolute nor relative to the lock's folder",
                        f.2,
                        f.0.display()
                    )));
                }
            }
            if let Some(h) = &p.hub {
                for why in h.problems() {
                    errors.push(Error::input(format!("{at}.hub: {why}")));
                }
            }
            if !p.parts.is_empty() {
                let sum: u64 = p.parts.iter().map(|q| q.bytes).sum();
                if sum != p.bytes || p.parts[0].path != p.path || p.parts.len() < 2 {
                    errors.push(Error::input(format!(
                        "{at}.parts: {} parts of {sum} bytes, the first {}: the entry says {} bytes \
                         from {}; run `quantgate models pin {}` to pin the file again",
                        p.parts.len(),
                        p.parts[0].path.display(),
                        p.bytes,
                        p.path.display(),
                        p.path.display()
                    )));
                }
            }
        }
        // One alias per file: two would make one model two candidates (or a
        // candidate its own reference) under different names.
        let mut by_file: BTreeMap<&Path, &str> = BTreeMap::new();
        for (alias, p) in &entries {
            if let Some(first) = by_file.insert(&p.path, alias) {
                errors.push(Error::input(format!(
                    "{}: [{first}] and [{alias}] both pin {}: one alias per file (the lock is \
                     written by quantgate; remove the entry written by hand)",
                    path.display(),
                    p.path.display()
                )));
            }
        }
        if !errors.is_empty() {
            return Err(crate::core::error::join(errors));
        }
        Ok(Lock {
            path: path.to_path_buf(),
            entries,
        })
    }

    fn write(&self) -> Result<()> {
        // Files inside the project, relative to the lock's folder.
        let mut entries = self.entries.clone();
        if let Some(dir) = lock_dir(&self.path) {
            if let Some(project) = dir.parent().filter(|p| p.parent().is_some()) {
                for p in entries.values_mut() {
                    let files =
                        std::iter::once(&mut p.path).chain(p.parts.iter_mut().map(|q| &mut q.path));
                    for f in files {
                        if let Ok(inside) = f.strip_prefix(&dir) {
                            *f = inside.to_path_buf();
                        } else if let Ok(rest) = f.strip_prefix(project) {
                            *f = Path::new("..").join(rest);
                        }
                    }
                }
            }
        }
        let body = toml::to_string(&entries)
            .map_err(|e| Error::input(format!("{}: {e}", self.path.display())))?;
        fsutil::write_atomic(&self.path, format!("{HEADER}\n{body}").as_bytes())
    }

    /// The alias pinned to the model file `path` (canonical), if any.
    pub(crate) fn alias_of(&self, path: &Path) -> Option<&str> {
        self.entries
            .iter()
            .find(|(_, p)| p.path == path)
            .map(|(a, _)| a.as_str())
    }
}

/// Whether a `--model` value names files rather than a registry alias: it
/// holds a `/`, ends with `.gguf`, or starts with `path:`.
pub fn is_path_spec(s: &str) -> bool {
    s.starts_with("path:") || s.contains('/') || s.ends_with(".gguf")
}

/// The model files `spec` names (`path:` stripped; relative to `base`; a
/// glob in any component), each as the canonical path of its first part
/// (every part of a split file names the model once), sorted.
pub fn expand(spec: &str, base: &Path) -> Result<Vec<PathBuf>> {
    let pattern = spec.strip_prefix("path:").unwrap_or(spec);
    if pattern.is_empty() {
        return Err(Error::input(format!("`{spec}`: names no file")));
    }
    let full = if Path::new(pattern).is_absolute() {
        PathBuf::from(pattern)
    } else {
        base.join(pattern)
    };
    // `./lm/*.gguf` under `.` is `././lm/*.gguf`: a glob of that text never
    // matches the `./lm/x.gguf` the walk yields. Components drop inner `.`.
    let full: PathBuf = full.components().collect();
    let is_glob = |s: &str| s.contains(['*', '?', '[', '{']);
    let mut found = Vec::new();
    if !is_glob(pattern) {
        if !full.is_file() {
            return Err(Error::input(format!(
                "`{spec}`: {} is not a file",
                full.display()
            )));
        }
        found.push(full);
    } else {
        // The literal directories before the first glob component are walked.
        let mut root = PathBuf::new();
        let mut rest = Vec::new();
        for c in full.components() {
            let s = c.as_os_str().to_string_lossy();
            if rest.is_empty() && !is_glob(&s) {
                root.push(c);
            } else {
                rest.push(s.into_owned());
            }
        }
        let depth = if rest.iter().any(|r| r.contains("**")) {
            usize::MAX
        } else {
            rest.len()
        };
        let glob = globset::GlobBuilder::new(&full.to_string_lossy())
            .literal_separator(true)
            .build()
            .map_err(|e| Error::input(format!("`{spec}`: {e}")))?
            .compile_matcher();
        for e in walkdir::WalkDir::new(&root)
            .min_depth(1)
            .max_depth(depth)
            .follow_links(true)
            .into_iter()
            .filter_map(|e| e.ok())
        {
            if e.file_type().is_file() && glob.is_match(e.path()) {
                found.push(e.path().to_path_buf());
            }
        }
        if found.is_empty() {
            return Err(Error::input(format!(
                "`{spec}`: matches no file under {}",
                root.display()
            )));
        }
    }
    let mut out: Vec<(PathBuf, PathBuf)> = Vec::new();
    for f in found {
        let first = gguf_parts(&f).swap_remove(0);
        let bad = |e: std::io::Error| {
            Error::input(format!(
                "`{spec}`: {}: {e}{}",
                first.display(),
                if first != f {
                    format!(" (the first part of the split file {})", f.display())
                } else {
                    String::new()
                }
            ))
        };
        let canon = first.canonicalize().map_err(bad)?;
        // The name the user gave, absolute: its folder resolved, not the
        // file itself, so a link keeps its own name (and alias).
        let named = match (first.parent(), first.file_name()) {
            (Some(dir), Some(name)) => {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                dir.canonicalize().map_err(bad)?.join(name)
            }
            _ => canon.clone(),
        };
        out.push((named, canon));
    }
    // One file named twice (a link beside its target) is one model, by
    // the file's own name when that is among them.
    out.sort_by(|a, b| (a.0 != a.1, &a.0).cmp(&(b.0 != b.1, &b.0)));
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|(_, canon)| seen.insert(canon.clone()));
    let mut named: Vec<PathBuf> = out.into_iter().map(|(named, _)| named).collect();
    named.sort();
    Ok(named)
}

/// The alias a model file gets: its name without `.gguf` and without a
/// split suffix (`-00001-of-00003`), every character outside
/// `[A-Za-z0-9._-]` replaced by `-`.
pub(crate) fn alias_for(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut stem = name.strip_suffix(".gguf").unwrap_or(&name).to_string();
    if gguf_parts(path).len() > 1 {
        if let Some((head, _)) = stem.rsplit_once("-of-") {
            if let Some((s, _)) = head.rsplit_once('-') {
                stem = s.to_string();
            }
        }
    }
    let mut alias: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    while alias.starts_with('.') {
        alias.remove(0);
    }
    if alias.is_empty() {
        alias.push_str("model");
    }
    alias
}

/// Each part's modification time and length: what says a file is unchanged
/// since it was hashed in this process.
type Stamp = Vec<(Option<std::time::SystemTime>, u64)>;

/// Files hashed in this process, by path and stamp: pinning a new file and
/// verifying it for the same run hash it once.
static MEASURED: std::sync::Mutex<Vec<(PathBuf, Stamp, Pinned)>> =
    std::sync::Mutex::new(Vec::new());

/// Hash the model at `path` (every part of a split file): what the lock
/// pins. Once per process while no part's time or length changes.
pub(crate) fn measure(path: &Path) -> Result<Pinned> {
    measured(path, false)
}

/// [`measure`]; with `fresh`, hashed again whatever the memo holds (an
/// explicit re-pin reads the bytes, not a time stamp).
fn measured(path: &Path, fresh: bool) -> Result<Pinned> {
    let stamp: Stamp = gguf_parts(path)
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok();
            (
                m.as_ref().and_then(|m| m.modified().ok()),
                m.map_or(0, |m| m.len()),
            )
        })
        .collect();
    let mut memo = MEASURED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, p)) = memo
        .iter()
        .find(|(p, s, _)| !fresh && p == path && *s == stamp)
    {
        return Ok(p.clone());
    }
    let pinned = hash_parts(path)?;
    memo.retain(|(p, _, _)| p != path);
    memo.push((path.to_path_buf(), stamp, pinned.clone()));
    Ok(pinned)
}

fn hash_parts(path: &Path) -> Result<Pinned> {
    let parts = gguf_parts(path);
    let mut total = Sha256::new();
    let mut bytes = 0u64;
    let mut pinned_parts = Vec::new();
    let len: u64 = parts
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let bar = crate::core::progress::bar(len, &format!("sha256 {}", alias_for(path)), "bytes");
    for p in &parts {
        let mut f = std::fs::File::open(p).map_err(|e| {
            Error::input(format!(
                "{}: {e}{}",
                p.display(),
                crate::models::gguf::part_of(&parts, path)
            ))
        })?;
        let mut part = Sha256::new();
        let mut n_part = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(|e| Error::io(p, e))?;
            if n == 0 {
                break;
            }
            part.update(&buf[..n]);
            total.update(&buf[..n]);
            n_part += n as u64;
            bar.inc(n as u64);
        }
        bytes += n_part;
        pinned_parts.push(Part {
            path: p.clone(),
            bytes: n_part,
            sha256: fsutil::hex(&part.finalize()),
        });
    }
    bar.finish_and_clear();
    Ok(Pinned {
        hub: None,
        path: path.to_path_buf(),
        bytes,
        sha256: fsutil::hex(&total.finalize()),
        parts: if pinned_parts.len() > 1 {
            pinned_parts
        } else {
            Vec::new()
        },
    })
}

/// Record in the lock beside `registry` that the files of `aliases` are
/// published at `spec` (`ORG/NAME@REVISION`), each as its file name there.
pub fn publish(registry: &Path, aliases: &[String], spec: &str) -> Result<()> {
    let lock_path = registry.parent().unwrap_or(Path::new(".")).join(LOCK_FILE);
    let _guard = lock_guard(&lock_path)?;
    let mut lock = Lock::load(&lock_path)?;
    for a in aliases {
        let p = lock
            .entries
            .get_mut(a)
            .ok_or_else(|| Error::input(format!("`{a}`: not pinned in {}", lock_path.display())))?;
        let name = p
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        p.hub = Some(crate::models::hub::HubFile::of_spec(spec, &name)?);
    }
    lock.write()
}

/// Pin `files` (canonical model paths, from [`expand`]) in the lock beside
/// `registry`, and return their aliases in order. A file the lock already
/// holds keeps its entry (it is verified when used) unless `repin`; a new
/// file is hashed and added. An alias that a registry entry, another pinned
/// file, or another of `files` already takes is an error naming both files
/// (with `repin`, a pinned alias moves to the new file, said on stderr).
pub fn pin(
    registry: &Path,
    registry_aliases: &[String],
    files: &[PathBuf],
    repin: bool,
) -> Result<Vec<String>> {
    let lock_path = registry.parent().unwrap_or(Path::new(".")).join(LOCK_FILE);
    // One writer at a time: processes planning the same new files pin once.
    let _guard = lock_guard(&lock_path)?;
    let mut lock = Lock::load(&lock_path)?;
    let mut changed = false;
    let mut aliases: Vec<(String, &PathBuf)> = Vec::new();
    for f in files {
        let known = lock.alias_of(f).map(str::to_string);
        let alias = known.clone().unwrap_or_else(|| alias_for(f));
        if let Some((_, other)) = aliases.iter().find(|(a, p)| *a == alias && *p != f) {
            return Err(Error::input(format!(
                "{} and {} both take the alias `{alias}`: rename one of them",
                other.display(),
                f.display()
            )));
        }
        if registry_aliases.contains(&alias) {
            return Err(Error::input(format!(
                "{}: its alias `{alias}` is already a model in {}: rename the file",
                f.display(),
                registry.display()
            )));
        }
        // One alias per file: a second name for a pinned file (a link, a
        // path through another folder) would test the same bytes twice.
        if known.is_none() {
            let canon = f.canonicalize().ok();
            if let Some((other, p)) = lock.entries.iter().find(|(a, p)| {
                **a != alias && canon.is_some() && p.path.canonicalize().ok() == canon
            }) {
                return Err(Error::input(format!(
                    "{}: the same file as `{other}` ({}) pinned in {}: name it once (one alias \
                     per file)",
                    f.display(),
                    p.path.display(),
                    lock.path.display()
                )));
            }
        }
        match lock.entries.get(&alias) {
            Some(p) if p.path == *f && !repin => {}
            Some(p) if p.path != *f && !repin => {
                return Err(Error::input(format!(
                    "{}: its alias `{alias}` is pinned in {} to {}: rename the file, or run \
                     `quantgate models pin {}` to pin the alias to it",
                    f.display(),
                    lock.path.display(),
                    p.path.display(),
                    f.display()
                )))
            }
            old => {
                // Only a GGUF is pinned: random bytes, a text, a git-lfs
                // pointer are refused here, naming the file, and never
                // enter the lock. (Hyperparameters are checked when the
                // model loads, so that one bad model fails only its tests.)
                for part in crate::models::gguf::gguf_parts(f) {
                    crate::models::gguf::header_structure(&part)?;
                }
                let mut new = measured(f, repin)?;
                // Where it is published stays with the alias.
                new.hub = old.and_then(|o| o.hub.clone());
                if let Some(o) = old {
                    if *o != new {
                        crate::core::progress::say!(
                            "quantgate: repinned `{alias}`: {} sha256 {} ({} bytes) → {} sha256 {} ({} bytes)",
                            o.path.display(),
                            o.sha256,
                            o.bytes,
                            new.path.display(),
                            new.sha256,
                            new.bytes
                        );
                    }
                } else {
                    crate::core::progress::say!(
                        "quantgate: pinned `{alias}` = {} (sha256 {}, {} bytes) in {}",
                        f.display(),
                        new.sha256,
                        new.bytes,
                        lock.path.display()
                    );
                }
                changed |= old != Some(&new);
                lock.entries.insert(alias.clone(), new);
            }
        }
        aliases.push((alias, f));
    }
    if changed {
        lock.write()?;
    }
    Ok(aliases.into_iter().map(|(a, _)| a).collect())
}

/// The lock's folder, canonical (what relative paths in it are read
/// against); None when it cannot be resolved.
fn lock_dir(lock: &Path) -> Option<PathBuf> {
    let dir = match lock.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    dir.canonicalize().ok()
}

/// `p` with `.` and `..` components resolved by name (no file system).
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// An exclusive `flock` for writers of the lock at `lock_path`, taken on
/// the folder that holds it (no file is made beside the user's suites, and
/// every process writing that lock agrees on it whatever its cache
/// folder), released when dropped.
fn lock_guard(lock_path: &Path) -> Result<std::fs::File> {
    let dir = match lock_path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fsutil::lock_dir(dir)
}

#[cfg(test)]
mod tests;
