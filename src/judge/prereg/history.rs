//! A sealed rule's place in git history: the ledger line must be committed
//! in HEAD's history, and the case's golden not committed before it.

use super::ledger::{git, ledger_of, root_of, LedgerLine};
use super::Prereg;
use crate::core::error::{Error, Result};
use std::path::{Path, PathBuf};

fn git_ok(root: &Path, args: &[&str]) -> bool {
    git(root, args).is_some()
}

/// What the git history says: `Ok(Some(commit))` for the commit that added
/// the ledger line, `Ok(None)` outside a git checkout.
pub fn check_history(p: &Prereg, line: &LedgerLine, golden: &Path) -> Result<Option<String>> {
    let root = root_of(&p.path);
    if git(&root, &["rev-parse", "--is-inside-work-tree"]).as_deref() != Some("true") {
        return Ok(None);
    }
    // A shallow clone lacks the history that would show the order.
    if git(&root, &["rev-parse", "--is-shallow-repository"]).as_deref() == Some("true") {
        return Ok(None);
    }
    let top = PathBuf::from(git(&root, &["rev-parse", "--show-toplevel"]).unwrap_or_default());
    let rel = |f: &Path| -> String {
        let abs = std::fs::canonicalize(f).unwrap_or_else(|_| {
            let parent = f.parent().unwrap_or(Path::new("."));
            std::fs::canonicalize(parent)
                .unwrap_or_else(|_| parent.to_path_buf())
                .join(f.file_name().unwrap_or_default())
        });
        let top = std::fs::canonicalize(&top).unwrap_or(top.clone());
        abs.strip_prefix(&top)
            .unwrap_or(&abs)
            .to_string_lossy()
            .replace('\\', "/")
    };
    let ledger = ledger_of(&p.path);
    let ledger_rel = rel(&ledger);
    let here = format!("{}:{}", ledger.display(), line.line_no);
    let pickaxe = format!("-S{}", line.raw);
    let found = git(
        &root,
        &[
            "log",
            "--all",
            "--format=%H",
            &pickaxe,
            "--",
            ledger_rel.as_str(),
        ],
    )
    .unwrap_or_default();
    let commits: Vec<&str> = found.lines().filter(|l| !l.is_empty()).collect();
    if commits.is_empty() {
        return Err(Error::input(format!(
            "{}: the seal ({here}) is not committed: commit {ledger_rel} before running, \
             so the history shows the rule came first",
            p.path.display()
        )));
    }
    // The oldest commit in HEAD's history whose ledger holds the line.
    let holds = |c: &str| {
        git(&root, &["show", &format!("{c}:{ledger_rel}")])
            .is_some_and(|t| t.lines().any(|l| l == line.raw))
    };
    let Some(commit) = commits
        .iter()
        .rev()
        .find(|c| holds(c) && git_ok(&root, &["merge-base", "--is-ancestor", c, "HEAD"]))
        .map(|c| c.to_string())
    else {
        return Err(Error::input(format!(
            "{}: the seal ({here}) was committed in {} which is not an ancestor of HEAD",
            p.path.display(),
            commits[0]
        )));
    };
    let golden_rel = rel(golden);
    let touching = git(
        &root,
        &["log", "HEAD", "--format=%H", "--", golden_rel.as_str()],
    )
    .unwrap_or_default();
    for c in touching.lines().filter(|l| !l.is_empty()) {
        if c == commit || git_ok(&root, &["merge-base", "--is-ancestor", c, &commit]) {
            return Err(Error::input(format!(
                "{}: the result predates the rule: golden {golden_rel} was committed in {c}, \
                 at or before the seal's commit {commit} ({here})",
                p.path.display()
            )));
        }
    }
    Ok(Some(commit))
}
