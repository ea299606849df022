//! Where a pinned model file is published on the Hugging Face Hub: a
//! lock entry may say `hub = { repo, revision, file }`, the revision a
//! commit, so that a CI runner, which has the committed lock and not the
//! GGUF files, can download each at that commit ([`super::download`]).
//!
//! Contract: a revision is a 40-hex commit, never a branch (a branch
//! moves); a file is a path inside the repository.

use crate::core::error::{Error, Result};
use crate::core::fsutil;
use serde::{Deserialize, Serialize};
use std::path::Path;

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
    pub(crate) fn problems(&self) -> Vec<String> {
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
    pub(crate) fn beside(&self, name: &str) -> String {
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
