//! Shards merged: the outcomes that separate runs of one suite wrote (under
//! nextest partitions, `QUANTGATE_OUT=DIR` holds `<case>/<model>.json` per
//! test) read back, checked against the plan of the same selection, and
//! judged again as one run.
//!
//! Contract: the merge is the unsharded run's verdict or an error. Every
//! planned test has exactly one outcome; an outcome of a test the selection
//! does not plan, of another version of its case or of another model file,
//! two builds, or one case run under two settings, is an error naming the
//! tests and files — all problems listed at once. With a signing key
//! (`core::auth`) every outcome must carry a MAC that verifies; with or
//! without one, each outcome's metrics must agree with what it carries to
//! compute them again from (`Kind::recheck`). Each outcome's gates are
//! evaluated anew from the case (a preregistered decision is not read back:
//! it needs the ledger, checked by the shard that ran it).

use crate::core::error::{Error, Result};
use crate::core::{Outcome, Status};
use crate::plan::Planned;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Every outcome under `sources`: each `*.json` file in a folder (walked;
/// hidden files — temp files of a writer — left out) or a file given
/// itself, holding one outcome object or an array of them (`run --json`).
/// A file that is not outcome JSON is an error naming it. With `key` (the
/// config's signing key), only outcomes whose MAC verifies under it.
pub fn read_outcomes(
    sources: &[PathBuf],
    key: Option<&crate::core::auth::Key>,
) -> Result<Vec<(PathBuf, Outcome)>> {
    let mut files = Vec::new();
    for s in sources {
        if s.is_file() {
            files.push(s.clone());
            continue;
        }
        if !s.is_dir() {
            return Err(Error::input(format!(
                "{}: no such folder or file",
                s.display()
            )));
        }
        for e in walkdir::WalkDir::new(s).sort_by_file_name() {
            let e = e.map_err(|e| Error::input(format!("{}: {e}", s.display())))?;
            let hidden = e.file_name().to_string_lossy().starts_with('.');
            if e.file_type().is_file()
                && !hidden
                && e.path().extension().is_some_and(|x| x == "json")
            {
                files.push(e.path().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::input(format!("{}: not JSON: {e}", f.display())))?;
        let items = match value {
            serde_json::Value::Array(v) => v,
            v => vec![v],
        };
        for (i, mut v) in items.into_iter().enumerate() {
            // With a signing key, only outcomes written under it are taken.
            let mut unauthenticated = None;
            if let Some(key) = key {
                crate::core::auth::verify(&mut v, key)
                    .map_err(|why| Error::input(format!("{}: item {i}: {why}", f.display())))?;
            } else if let serde_json::Value::Object(m) = &mut v {
                let had_mac = m.remove(crate::core::auth::MAC_FIELD).is_some();
                unauthenticated = Some(format!(
                    "{} item {i} {}, and no signing key is set ({}): anyone who could write \
                     the file could have edited its numbers",
                    f.display(),
                    if had_mac {
                        "carries a MAC that cannot be checked here"
                    } else {
                        "carries no MAC"
                    },
                    crate::core::auth::KEY_ENV
                ));
            }
            let mut o: Outcome = serde_json::from_value(v).map_err(|e| {
                Error::input(format!(
                    "{}: item {i}: not a quantgate outcome: {e}",
                    f.display()
                ))
            })?;
            o.unauthenticated = unauthenticated;
            out.push((f.clone(), o));
        }
    }
    Ok(out)
}

/// The test name of an outcome.
fn test_name(o: &Outcome) -> String {
    format!("{}::{}", o.case, o.model)
}

/// Merge `found` into the outcomes of `planned` (plan order), judged again;
/// `pinned` gives a model's pinned sha256 where the registry pins one.
pub fn merge(
    planned: &[Planned],
    found: Vec<(PathBuf, Outcome)>,
    pinned: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<Outcome>> {
    let mut by_name: BTreeMap<String, Vec<(PathBuf, Outcome)>> = BTreeMap::new();
    for (f, o) in found {
        by_name.entry(test_name(&o)).or_default().push((f, o));
    }
    let mut problems: Vec<String> = Vec::new();
    let files = |v: &[(PathBuf, Outcome)]| {
        v.iter()
            .map(|(f, _)| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let planned_names: std::collections::BTreeSet<&str> =
        planned.iter().map(|p| p.name.as_str()).collect();
    let missing: Vec<&str> = planned
        .iter()
        .map(|p| p.name.as_str())
        .filter(|n| !by_name.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{} of {} planned tests have no outcome (a shard missing or not finished): {}",
            missing.len(),
            planned.len(),
            missing.join(", ")
        ));
    }
    for (name, v) in &by_name {
        if v.len() > 1 {
            problems.push(format!(
                "{name} ran {} times (two shards ran it): {}",
                v.len(),
                files(v)
            ));
        }
        if !planned_names.contains(name.as_str()) {
            problems.push(format!(
                "{name} ({}) is not a test of this selection (another suite, or another filter?)",
                files(v)
            ));
        }
    }
    // One build for the whole run, one settings line per case.
    let mut builds: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut settings: BTreeMap<&str, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (name, v) in &by_name {
        for (_, o) in v {
            builds
                .entry(o.build.label())
                .or_default()
                .push(name.clone());
            if let Some(s) = &o.settings {
                settings
                    .entry(o.case.as_str())
                    .or_default()
                    .entry(s.describe())
                    .or_default()
                    .push(name.clone());
            }
        }
    }
    if builds.len() > 1 {
        problems.push(format!(
            "the shards ran {} builds: {}",
            builds.len(),
            builds
                .iter()
                .map(|(b, t)| format!("{b} ({})", t.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    for (case, by) in &settings {
        if by.len() > 1 {
            problems.push(format!(
                "{case} ran under {} settings: {}",
                by.len(),
                by.iter()
                    .map(|(s, t)| format!("{s} ({})", t.join(", ")))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
    }
    let mut merged = Vec::new();
    for p in planned {
        let Some([(file, o)]) = by_name.get(&p.name).map(Vec::as_slice) else {
            continue;
        };
        let mut o = o.clone();
        let Ok(parsed) = &p.case else {
            merged.push(o);
            continue;
        };
        if o.status != Status::Error {
            if o.case_sha256.as_deref() != Some(parsed.case.content_sha256.as_str()) {
                problems.push(format!(
                    "{} ({}) ran another version of {} (case sha256 {}, the suite's is {})",
                    p.name,
                    file.display(),
                    parsed.case.path.display(),
                    o.case_sha256.as_deref().unwrap_or("none"),
                    parsed.case.content_sha256
                ));
            }
            if let Some((r, _)) = &parsed.case.reference {
                let want = pinned(r);
                if want.is_some() && o.reference_sha256 != want {
                    problems.push(format!(
                        "{} ({}) ran against another file of its reference `{r}` (sha256 {}, \
                         pinned {})",
                        p.name,
                        file.display(),
                        o.reference_sha256.as_deref().unwrap_or("not recorded"),
                        want.as_deref().unwrap_or("none")
                    ));
                }
            }
            if let Err(why) = parsed.kind.recheck(&o) {
                problems.push(format!("{} ({}): {why}", p.name, file.display()));
            }
            if let Some(want) = pinned(&p.model) {
                if o.model_sha256.as_deref() != Some(want.as_str()) {
                    problems.push(format!(
                        "{} ({}) ran another file of `{}` (sha256 {}, pinned {want})",
                        p.name,
                        file.display(),
                        p.model,
                        o.model_sha256.as_deref().unwrap_or("not recorded")
                    ));
                }
            }
            crate::judge::rejudge(parsed, &mut o);
        }
        if let Some(why) = &o.unauthenticated {
            o.notes.push(format!("unauthenticated: {why}"));
        }
        merged.push(o);
    }
    if problems.is_empty() {
        Ok(merged)
    } else {
        Err(Error::input(format!(
            "the shards do not make one run:\n  {}",
            problems.join("\n  ")
        )))
    }
}
