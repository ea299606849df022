//! Discover stage: which case files to run.
//!
//! Contract: a sorted list of `/`-separated paths relative to the suites
//! root; dot-files, the root's `models.toml` and `runtimes.toml` (not
//! cases: [`NOT_CASES`]) and `data/` are skipped; a
//! selection that matches nothing is an error naming the root and pattern.

use crate::core::error::{Error, Result};
use crate::core::fsutil::rel_slash;
use globset::{Glob, GlobSet, GlobSetBuilder};
use std::path::{Path, PathBuf};
use walkdir::WalkDir;

/// The files at the suites root that are not cases: the model registry
/// and the runtimes ([`crate::execute::runtime`]).
pub(crate) const NOT_CASES: [&str; 2] = ["models.toml", "runtimes.toml"];

/// A discovered case file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Path relative to the suites root, `/`-separated.
    pub rel: String,
    /// Path on disk.
    pub path: PathBuf,
}

impl Found {
    /// Test-name stem: `rel` without `.toml`.
    pub(crate) fn name(&self) -> &str {
        self.rel.strip_suffix(".toml").unwrap_or(&self.rel)
    }
}

fn walk(root: &Path) -> Result<Vec<Found>> {
    let mut out = Vec::new();
    // Dot-files and dot-directories are skipped, and so is the root's `data/`.
    let entries = WalkDir::new(root)
        .min_depth(1)
        .into_iter()
        .filter_entry(|e| {
            let name = e.file_name().to_string_lossy();
            let data = e.depth() == 1 && e.file_type().is_dir() && name == "data";
            !(name.starts_with('.') || data)
        });
    for entry in entries {
        let entry = entry.map_err(|e| {
            let at = e.path().unwrap_or(root).display().to_string();
            Error::input(format!(
                "{at}: {}",
                e.io_error().map_or(e.to_string(), |io| io.to_string())
            ))
        })?;
        let rel = rel_slash(root, entry.path());
        let name = entry.file_name().to_string_lossy();
        if !entry.file_type().is_dir()
            && name.ends_with(".toml")
            && !NOT_CASES.contains(&rel.as_str())
        {
            out.push(Found {
                rel,
                path: entry.path().to_path_buf(),
            });
        }
    }
    Ok(out)
}

/// All case files under `root`, sorted.
pub(crate) fn all_cases(root: &Path) -> Result<Vec<Found>> {
    if !root.is_dir() {
        return Err(Error::input(format!(
            "suites root {} is not a directory",
            root.display()
        )));
    }
    let mut out = walk(root)?;
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// Cases under `root` selected by `patterns`: each a path to a file or
/// directory (relative to the working directory or to `root`), or a glob
/// over paths relative to `root`. No patterns selects every case.
pub(crate) fn discover(root: &Path, patterns: &[String]) -> Result<Vec<Found>> {
    let all = all_cases(root)?;
    if patterns.is_empty() {
        if all.is_empty() {
            return Err(Error::input(format!(
                "no test cases found: scanned {} with pattern '**/*.toml'",
                root.display()
            )));
        }
        return Ok(all);
    }
    let root_abs = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut selected: Vec<Found> = Vec::new();
    for pat in patterns {
        // A path under the suites root first; then one from the working
        // directory (which must lie under the root to select anything).
        let as_path = [root.join(pat), PathBuf::from(pat)]
            .into_iter()
            .find(|p| p.exists())
            .and_then(|p| std::fs::canonicalize(p).ok());
        let found_outside = as_path
            .as_ref()
            .filter(|p| !p.starts_with(&root_abs))
            .cloned();
        let matched: Vec<Found> = if let Some(p) = as_path {
            all.iter()
                .filter(|f| {
                    std::fs::canonicalize(&f.path).is_ok_and(|fp| fp == p || fp.starts_with(&p))
                })
                .cloned()
                .collect()
        } else {
            let glob = Glob::new(pat)
                .map_err(|e| Error::input(format!("error parsing glob '{pat}': {e}")))?;
            let set: GlobSet = GlobSetBuilder::new()
                .add(glob)
                .build()
                .map_err(|e| Error::input(format!("error parsing glob '{pat}': {e}")))?;
            all.iter()
                .filter(|f| set.is_match(&f.rel) || set.is_match(f.name()))
                .cloned()
                .collect()
        };
        if matched.is_empty() {
            if let Some(p) = found_outside {
                return Err(Error::input(format!(
                    "no test cases found: '{pat}' is {}, which is not under the suites root {}",
                    p.display(),
                    root_abs.display()
                )));
            }
            return Err(Error::input(format!(
                "no test cases found: scanned {} with pattern '{pat}'",
                root_abs.display()
            )));
        }
        for m in matched {
            if !selected.contains(&m) {
                selected.push(m);
            }
        }
    }
    selected.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(selected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(tag: &str) -> PathBuf {
        let root = crate::core::scratch::scratch(&format!("discover-{tag}"));
        for p in [
            "b/two.toml",
            "a/one.toml",
            "models.toml",
            "runtimes.toml",
            "a/runtimes.toml",
            "data/x.toml",
            ".hidden.toml",
            "a/notes.txt",
        ] {
            let f = root.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, "").unwrap();
        }
        root
    }

    #[test]
    fn finds_sorted_cases_and_skips_the_rest() {
        let root = tree("find");
        let rels: Vec<_> = discover(&root, &[])
            .unwrap()
            .into_iter()
            .map(|f| f.rel)
            .collect();
        assert_eq!(rels, vec!["a/one.toml", "a/runtimes.toml", "b/two.toml"]);
        let rels: Vec<_> = discover(&root, &["b/*".into()])
            .unwrap()
            .into_iter()
            .map(|f| f.rel)
            .collect();
        assert_eq!(rels, vec!["b/two.toml"]);
        let rels: Vec<_> = discover(&root, &[root.join("a").display().to_string()])
            .unwrap()
            .into_iter()
            .map(|f| f.rel)
            .collect();
        assert_eq!(rels, vec!["a/one.toml", "a/runtimes.toml"]);
    }

    #[test]
    fn no_match_names_root_and_pattern() {
        let root = tree("none");
        let e = discover(&root, &["zzz/*.toml".into()]).unwrap_err().message;
        assert!(e.starts_with("no test cases found: scanned "), "{e}");
        assert!(e.ends_with("with pattern 'zzz/*.toml'"), "{e}");
        let empty = root.join("a/notes.txt").parent().unwrap().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = discover(&empty, &[]).unwrap_err().message;
        assert!(e.contains("with pattern '**/*.toml'"), "{e}");
    }

    /// A path that exists but lies outside the suites root says what it
    /// found, instead of "no match".
    #[test]
    fn a_path_outside_the_root_is_named() {
        let root = tree("inside");
        let other = tree("outside");
        let pat = other.join("a/one.toml").display().to_string();
        let e = discover(&root, std::slice::from_ref(&pat))
            .unwrap_err()
            .message;
        assert!(
            e.contains(&format!("'{pat}' is ")) && e.contains("which is not under the suites root"),
            "{e}"
        );
    }
}
