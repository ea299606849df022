//! `quantgate diff [BASE] [HEAD]`: two sets of goldens compared for a
//! reviewer (`quantgate::golden::review`), each change classed by its
//! metric's declared noise. The sides are two git revisions (HEAD
//! defaults to the working tree, BASE to the merge-base with
//! `origin/main`), two goldens folders, or two `--json` files of
//! `quantgate run`. Each case's declarations come from the new side's
//! suites (else the old side's). Between revisions, a changed golden that
//! no commit message of the range names is said.
//!
//! Exit 0: nothing moved beyond noise; 1: a gate flipped or (with the
//! default `--fail-on moved`) a metric moved; 2: a side cannot be read.

use super::args::DiffArgs;
use super::{Conclusion, Ctx};
use quantgate::core::case::Case;
use quantgate::core::Error;
use quantgate::golden::review::render::{self, Context, Unexplained};
use quantgate::golden::review::{review, FailOn, Side};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

/// One side as the command line names it.
enum Source {
    /// A folder of goldens.
    Dir(PathBuf),
    /// A `--json` file (or a shard's folder of them) of `quantgate run`.
    Json(PathBuf),
    /// A git revision.
    Rev(String),
    /// The working tree (the new side, when only BASE is a revision).
    WorkTree,
}

impl Source {
    fn of(arg: &str) -> Source {
        let p = Path::new(arg);
        if p.is_dir() {
            Source::Dir(p.to_path_buf())
        } else if p.is_file() {
            Source::Json(p.to_path_buf())
        } else {
            Source::Rev(arg.to_string())
        }
    }

    fn is_git(&self) -> bool {
        matches!(self, Source::Rev(_) | Source::WorkTree)
    }
}

/// A side read: its goldens, the suites folder its cases are declared in
/// (None: none of its own), and how it is named.
struct Read {
    side: Side,
    suites: Option<PathBuf>,
    name: String,
}

/// Run `quantgate diff`.
pub fn run(ctx: &Ctx, a: DiffArgs) -> Result<Conclusion, Error> {
    let fail_on = match a.fail_on.as_str() {
        "flipped" => FailOn::Flipped,
        _ => FailOn::Moved,
    };
    let (base, head) = match (a.base.as_deref(), a.head.as_deref()) {
        (None, None) => (None, Source::WorkTree),
        (Some(b), None) => match Source::of(b) {
            Source::Rev(r) => (Some(Source::Rev(r)), Source::WorkTree),
            _ => {
                return Err(Error::input(format!(
                    "quantgate diff {b}: a folder or a file is compared with another: give HEAD too"
                )))
            }
        },
        (Some(b), Some(h)) => (Some(Source::of(b)), Source::of(h)),
        (None, Some(_)) => unreachable!("clap fills BASE before HEAD"),
    };
    if base.as_ref().is_some_and(|b| b.is_git() != head.is_git()) {
        return Err(Error::input(format!(
            "quantgate diff {} {}: one side is a git revision, the other a folder or a file; \
             give two revisions, two folders of goldens, or two --json files",
            a.base.as_deref().unwrap_or(""),
            a.head.as_deref().unwrap_or("")
        )));
    }
    let goldens = a.goldens.clone().unwrap_or_else(|| ctx.default_goldens());
    // Revisions are read into folders of their own, gone with this.
    let scratch = tempfile::Builder::new()
        .prefix("quantgate-diff-")
        .tempdir()
        .map_err(|e| Error::harness(format!("a temporary folder: {e}")))?;
    let mut unexplained = Vec::new();
    let (old, new) = if head.is_git() {
        let git = Git::here()?;
        let base_rev = match base {
            Some(Source::Rev(r)) => git.commit(&r)?,
            _ => git.merge_base()?,
        };
        let head_rev = match &head {
            Source::Rev(r) => Some(git.commit(r)?),
            _ => None,
        };
        let suites_rel = git.inside(&ctx.suites, "--suites")?;
        let goldens_rel = git.inside(&goldens, "--goldens")?;
        let old = git.read(
            &base_rev,
            &suites_rel,
            &goldens_rel,
            &scratch.path().join("base"),
        )?;
        let new = match &head_rev {
            Some(rev) => git.read(rev, &suites_rel, &goldens_rel, &scratch.path().join("head"))?,
            None => Read {
                side: Side::from_dir(&goldens, &goldens_rel)?,
                suites: Some(ctx.suites.clone()),
                name: "the working tree".into(),
            },
        };
        unexplained = git.unexplained(&base_rev, head_rev.as_ref(), &goldens_rel)?;
        (old, new)
    } else {
        let read = |s: &Source| -> Result<Read, Error> {
            match s {
                Source::Dir(d) => Ok(Read {
                    side: Side::from_dir(d, &d.display().to_string())?,
                    suites: None,
                    name: d.display().to_string(),
                }),
                Source::Json(f) => {
                    let found = quantgate::judge::merge::read_outcomes(
                        std::slice::from_ref(f),
                        ctx.config.signing_key(),
                    )
                    .map_err(|e| Error::input(e.message))?;
                    let outcomes: Vec<_> = found.into_iter().map(|(_, o)| o).collect();
                    Ok(Read {
                        side: Side::from_outcomes(&outcomes)?,
                        suites: None,
                        name: f.display().to_string(),
                    })
                }
                _ => unreachable!("checked above"),
            }
        };
        let old = read(base.as_ref().expect("two sides"))?;
        (old, read(&head)?)
    };
    // Declarations: the new side's case, else the old side's, else this
    // checkout's suites (folders and files carry no cases of their own).
    let folders: Vec<PathBuf> = [new.suites.clone(), old.suites.clone()]
        .into_iter()
        .flatten()
        .chain((new.suites.is_none() && old.suites.is_none()).then(|| ctx.suites.clone()))
        .collect();
    let declared = |case: &str| -> Option<Arc<Case>> {
        folders.iter().find_map(|dir| declarations(dir, case))
    };
    let r = review(&old.side, &new.side, &declared);
    let cx = Context {
        base: &old.name,
        head: &new.name,
        unexplained: &unexplained,
    };
    match a.format.as_str() {
        "markdown" => print!("{}", render::markdown(&r, &cx)),
        "json" => println!(
            "{}",
            serde_json::to_string_pretty(&render::json(&r, &cx)).unwrap_or_default()
        ),
        _ => print!("{}", render::text(&r, &cx)),
    }
    Ok(if r.fails(fail_on) {
        Conclusion::Fail
    } else {
        Conclusion::Pass
    })
}

/// Case `case`'s declarations in the suites folder `dir` (its metrics,
/// their types, tolerances and intervals), read without its models: None
/// when it is not there or does not parse.
fn declarations(dir: &Path, case: &str) -> Option<Arc<Case>> {
    // A variant's test (`pi/e1_recall/plain`) is its case file's
    // (`pi/e1_recall.toml`), a name above.
    let mut name = case;
    let file = loop {
        let file = dir.join(format!("{name}.toml"));
        if file.is_file() {
            break file;
        }
        name = name.rsplit_once('/')?.0;
    };
    let only = quantgate::plan::parse::Overrides {
        models: Some(vec!["-".into()]),
        reference: Some("-".into()),
    };
    let shown = Path::new("suites").join(format!("{name}.toml"));
    quantgate::plan::parse::parse_case_with(&file, &shown, name, &only)
        .ok()
        .map(|p| p.case)
}

/// The git repository of the working directory.
struct Git {
    top: PathBuf,
}

impl Git {
    /// The repository the working directory is in.
    fn here() -> Result<Git, Error> {
        let out = git_in(Path::new("."), &["rev-parse", "--show-toplevel"]).map_err(|why| {
            Error::input(format!(
                "quantgate diff: the working directory is not in a git repository ({why}); \
                 compare two folders of goldens or two --json files instead"
            ))
        })?;
        Ok(Git {
            top: PathBuf::from(out.trim()),
        })
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        git_in(&self.top, args)
    }

    /// The commit `rev` names; an input error naming it otherwise.
    fn commit(&self, rev: &str) -> Result<String, Error> {
        self.run(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ])
        .map(|s| s.trim().to_string())
        .map_err(|_| {
            Error::input(format!(
                "quantgate diff: `{rev}` is not a revision of {} (nor a folder or file)",
                self.top.display()
            ))
        })
    }

    /// The merge-base of HEAD with `origin/main`.
    fn merge_base(&self) -> Result<String, Error> {
        self.run(&["merge-base", "HEAD", "origin/main"])
            .map(|s| s.trim().to_string())
            .map_err(|why| {
                Error::input(format!(
                    "quantgate diff: no BASE given, and HEAD has no merge-base with origin/main \
                     ({why}); name the base: quantgate diff BASE [HEAD]"
                ))
            })
    }

    /// `path` relative to the repository, `/`-separated; an input error
    /// naming `flag` when it is outside.
    fn inside(&self, path: &Path, flag: &str) -> Result<String, Error> {
        let abs = std::path::absolute(path)
            .map_err(|e| Error::input(format!("{flag} {}: {e}", path.display())))?;
        let top = self.top.canonicalize().unwrap_or(self.top.clone());
        let canon = abs.canonicalize().unwrap_or(abs.clone());
        canon
            .strip_prefix(&top)
            .map(|rel| quantgate::core::fsutil::rel_slash(Path::new(""), rel))
            .map_err(|_| {
                Error::input(format!(
                    "{flag} {}: not inside the repository {}",
                    path.display(),
                    self.top.display()
                ))
            })
    }

    /// The goldens and the suites of commit `rev`, read into `dir`.
    fn read(&self, rev: &str, suites: &str, goldens: &str, dir: &Path) -> Result<Read, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let present: Vec<&str> = [suites, goldens]
            .into_iter()
            .filter(|p| {
                self.run(&["ls-tree", "--name-only", rev, "--", p])
                    .is_ok_and(|s| !s.trim().is_empty())
            })
            .collect();
        if !present.is_empty() {
            let mut archive = Command::new("git")
                .current_dir(&self.top)
                .args(["archive", "--format=tar", rev, "--"])
                .args(&present)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| Error::harness(format!("git archive: {e}")))?;
            let tar = Command::new("tar")
                .arg("-x")
                .arg("-C")
                .arg(dir)
                .stdin(archive.stdout.take().expect("piped"))
                .output()
                .map_err(|e| Error::harness(format!("tar: {e}")))?;
            let done = archive
                .wait_with_output()
                .map_err(|e| Error::harness(format!("git archive: {e}")))?;
            if !done.status.success() || !tar.status.success() {
                return Err(Error::harness(format!(
                    "reading {rev}: git archive: {} tar: {}",
                    String::from_utf8_lossy(&done.stderr).trim(),
                    String::from_utf8_lossy(&tar.stderr).trim()
                )));
            }
        }
        let short: String = rev.chars().take(12).collect();
        Ok(Read {
            side: Side::from_dir(&dir.join(goldens), &format!("{short}:{goldens}"))?,
            suites: Some(dir.join(suites)),
            name: short,
        })
    }

    /// The goldens changed from `base` to `head` (None: the working tree)
    /// that no commit message of the range names, each with why.
    fn unexplained(
        &self,
        base: &str,
        head: Option<&String>,
        goldens: &str,
    ) -> Result<Vec<Unexplained>, Error> {
        let fail = |why: String| Error::harness(format!("git: {why}"));
        let mut diff = vec!["diff", "--name-only", base];
        if let Some(h) = head {
            diff.push(h);
        }
        diff.extend(["--", goldens]);
        let mut changed: Vec<String> = self
            .run(&diff)
            .map_err(fail)?
            .lines()
            .map(String::from)
            .collect();
        // Not committed yet: changed since HEAD, or new and untracked.
        let mut uncommitted: Vec<String> = Vec::new();
        if head.is_none() {
            uncommitted.extend(
                self.run(&["diff", "--name-only", "HEAD", "--", goldens])
                    .map_err(fail)?
                    .lines()
                    .map(String::from),
            );
            let untracked = self
                .run(&["ls-files", "--others", "--exclude-standard", "--", goldens])
                .map_err(fail)?;
            for l in untracked.lines() {
                uncommitted.push(l.to_string());
                changed.push(l.to_string());
            }
        }
        let short = |r: &str| r.chars().take(12).collect::<String>();
        let range = format!("{base}..{}", head.map_or("HEAD", |h| h.as_str()));
        let shown = format!(
            "{}..{}",
            short(base),
            head.map_or("HEAD".to_string(), |h| short(h))
        );
        let messages = self.run(&["log", "--format=%B", &range]).map_err(fail)?;
        let said = mentions(&messages);
        let mut out = Vec::new();
        changed.sort();
        changed.dedup();
        for path in changed.iter().filter(|p| p.ends_with(".snap")) {
            if uncommitted.contains(path) {
                out.push(Unexplained {
                    path: path.clone(),
                    why: "not committed: no commit message says why it changed".into(),
                });
            } else if !explains(&said, path, goldens) {
                out.push(Unexplained {
                    path: path.clone(),
                    why: format!(
                        "no commit message of {shown} names it (its path, its folder or its test)"
                    ),
                });
            }
        }
        Ok(out)
    }
}

/// `git ARGS` in `dir`: its stdout, or why it failed.
fn git_in(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(if err.is_empty() {
            format!("git {} failed", args.join(" "))
        } else {
            err
        })
    }
}

/// The words of commit messages that may name a golden: each token with
/// its surrounding punctuation taken off, a `{a,b}` group expanded
/// (`goldens/pi/tf_{pi,random}` names both folders).
fn mentions(messages: &str) -> Vec<String> {
    let mut out = Vec::new();
    for token in messages.split_whitespace() {
        let t = token.trim_matches(|c: char| "()[]<>,;:.`'\"".contains(c));
        match (t.find('{'), t.find('}')) {
            (Some(i), Some(j)) if i < j => {
                for alt in t[i + 1..j].split(',') {
                    out.push(format!("{}{alt}{}", &t[..i], &t[j + 1..]));
                }
            }
            _ => out.push(t.to_string()),
        }
    }
    out
}

/// Whether one of `said` names golden `path` (under `goldens`): its path
/// or a folder above it (with or without the goldens folder), its test
/// name `case::model`, or its case. Without the goldens folder a folder or
/// case needs a `/` (a bare word, `pi`, names nothing), and the goldens
/// folder alone names none of them.
fn explains(said: &[String], path: &str, goldens: &str) -> bool {
    let rel = path
        .strip_prefix(goldens)
        .map_or(path, |r| r.trim_start_matches('/'));
    let stem = rel.strip_suffix(".snap").unwrap_or(rel);
    let (case, model) = stem.rsplit_once('/').unwrap_or(("", stem));
    let test = format!("{case}::{model}");
    said.iter().any(|m| {
        let m = m.trim_end_matches('/');
        if m == test {
            return true;
        }
        // What it names under the goldens folder, and whether a bare
        // folder name counts.
        let (under, folder) = match m.strip_prefix(goldens).and_then(|r| r.strip_prefix('/')) {
            Some(r) => (r, true),
            None => (m, m.contains('/')),
        };
        let under = under.strip_suffix(".snap").unwrap_or(under);
        !under.is_empty()
            && (under == stem
                || (folder && (under == case || stem.starts_with(&format!("{under}/")))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A golden is explained by its path, a folder above it (braces
    /// expanded), its test or its case; not by a neighbour's.
    #[test]
    fn a_message_explains_a_golden_by_its_path_folder_test_or_case() {
        let said = |m: &str| mentions(m);
        let p = "goldens/pi/tf_pi/smollm2-q8_0.snap";
        for m in [
            "re-recorded goldens/pi/tf_pi/smollm2-q8_0.snap.",
            "(18 files under goldens/pi/tf_{pi,random,copy_random})",
            "pi/tf_pi::smollm2-q8_0 moved",
            "`pi/tf_pi` goldens: the store's tolerance",
        ] {
            assert!(explains(&said(m), p, "goldens"), "{m}");
        }
        for m in [
            "goldens/pi/tf_random",
            "pi/tf_pi::smollm2-q6_k",
            "pi",
            "tf_pi",
            "KLD suite and goldens;",
            "goldens/",
        ] {
            assert!(!explains(&said(m), p, "goldens"), "{m}");
        }
    }
}
