//! Judge stage, second half: goldens, the reviewed outcome of every case ×
//! model, in insta's `.snap` layout so `cargo insta review` works on them.
//!
//! Contract: discrete outcomes (status, counts, gate verdicts) compare
//! exactly, floats within the case's tolerance, NaN never equal; a gate on
//! a measurement of the machine (speed) compares without its verdict, which
//! each run measures and its gate decides. A changed or
//! missing golden is written beside the old one as `.snap.new` (never over
//! it) unless the update mode says otherwise; under `CI` nothing is written
//! and an explicit update request is an error. A golden that does not parse
//! is a failure naming the file, never "missing". Golden files are written
//! atomically.

use crate::core::Case;
pub(crate) mod diff;
pub mod review;
pub mod snap;

use crate::core::{MetricType, Outcome, Status};
use snap::fmt_value;
pub use snap::{parse, render, Inputs, Parsed};
use std::path::{Path, PathBuf};

pub use crate::core::config::{update_mode_from, UpdateMode};

/// Where goldens live, and how their paths are shown in messages.
#[derive(Debug, Clone)]
pub struct Goldens {
    /// Directory on disk.
    pub dir: PathBuf,
    /// How the directory is shown (`goldens`).
    pub shown: PathBuf,
    /// Checked under CI (messages say why nothing was written).
    pub ci: bool,
}

impl Goldens {
    /// Goldens under `dir`, shown as `goldens/...`.
    pub fn new(dir: PathBuf) -> Self {
        Goldens {
            dir,
            shown: PathBuf::from("goldens"),
            ci: false,
        }
    }

    /// These goldens, checked under CI when `ci` (as [`crate::core::config::Config::ci`] says).
    pub(crate) fn under_ci(self, ci: bool) -> Self {
        Goldens { ci, ..self }
    }

    /// The golden of `case` on `model`: `goldens/<case>/<model>.snap`.
    pub fn path(&self, case: &str, model: &str) -> PathBuf {
        self.dir.join(case).join(format!("{model}.snap"))
    }

    fn show(&self, p: &Path) -> String {
        self.shown
            .join(p.strip_prefix(&self.dir).unwrap_or(p))
            .display()
            .to_string()
    }
}

/// Differences between a golden and the current outcome (its rendering,
/// parsed), one line each; empty when they match within tolerance.
///
/// A gate on a measurement of the machine (speed) is compared without its
/// verdict, and a status that differs only by such verdicts is not a
/// difference: the verdict is measured again on every run and that run's
/// gate decides (a gate that fails now fails the trial by itself), as the
/// measurement's wide tolerance says; the golden still pins which gates
/// there are and their thresholds.
pub fn compare(golden: &Parsed, now: &Parsed, case: &Case) -> Vec<String> {
    let mut diffs = Vec::new();
    // A gate's metric is its rule's first word (`metric` or `metric.on`).
    let measured = |gate: &str| {
        let metric = gate.split(' ').next().unwrap_or("");
        [metric, metric.split('.').next().unwrap_or("")]
            .iter()
            .any(|m| case.metric_type(m) == Some(MetricType::Measurement))
    };
    // Each gate line as compared: a measured gate by its rule alone.
    let decisive = |gates: &[String]| -> Vec<String> {
        gates
            .iter()
            .map(|g| match snap::gate_rule(g) {
                (rule, Some(_)) if measured(g) => rule.to_string(),
                _ => g.clone(),
            })
            .collect()
    };
    let same_gates = decisive(&golden.gates) == decisive(&now.gates);
    let verdict = |s: &String| [Status::Pass, Status::Fail].iter().any(|v| v.as_str() == s);
    let by_measured_verdicts = same_gates
        && golden.gates.iter().any(|g| measured(g))
        && verdict(&golden.status)
        && verdict(&now.status);
    if golden.status != now.status && !by_measured_verdicts {
        diffs.push(format!("status: {} → {}", golden.status, now.status));
    }
    if golden.prereg != now.prereg {
        diffs.push(format!(
            "prereg: {} → {}",
            golden.prereg.as_deref().unwrap_or("(none)"),
            now.prereg.as_deref().unwrap_or("(none)")
        ));
    }
    let names: std::collections::BTreeSet<&String> =
        golden.metrics.keys().chain(now.metrics.keys()).collect();
    for k in names {
        match (golden.metrics.get(k), now.metrics.get(k)) {
            // A name the kind does not declare: a hand edit gone wrong, or a
            // golden of another kind, said as such.
            (Some(_), None) if case.metric_type(k).is_none() => {
                let hint =
                    crate::core::parse::nearest(k, case.metrics.iter().map(|m| m.name.as_str()))
                        .map(|n| format!(" (did you mean `{n}`?)"))
                        .unwrap_or_default();
                diffs.push(format!(
                    "{k}: not a metric of a {} case{hint}: the golden names a metric its kind does not declare",
                    case.kind
                ))
            }
            (Some(_), None) => diffs.push(format!("{k}: missing now")),
            (None, Some(v)) => diffs.push(format!("{k}: new metric = {}", fmt_value(*v))),
            (Some(b), Some(a)) => {
                if case.metric_type(k) == Some(MetricType::Count) {
                    if a != b {
                        diffs.push(format!(
                            "{k}: {} → {} (counts compare exactly)",
                            fmt_value(*b),
                            fmt_value(*a)
                        ));
                    }
                } else {
                    let t = case.tolerance(k);
                    let allowed = t.atol + t.rtol * b.abs();
                    // NaN is never within tolerance, either way round; an
                    // infinite value matches only itself (an infinite golden
                    // would otherwise make the tolerance infinite).
                    let within = if a.is_finite() && b.is_finite() {
                        (a - b).abs() <= allowed
                    } else {
                        a == b
                    };
                    if !within {
                        diffs.push(format!(
                            "{k}: {} → {} (|Δ| = {:.3e} > atol {:e} + rtol {:e}·|golden| = {:.3e})",
                            fmt_value(*b),
                            fmt_value(*a),
                            (a - b).abs(),
                            t.atol,
                            t.rtol,
                            allowed
                        ));
                    }
                }
            }
            (None, None) => {}
        }
    }
    let keys: std::collections::BTreeSet<&String> =
        golden.texts.keys().chain(now.texts.keys()).collect();
    for k in keys {
        match (golden.texts.get(k), now.texts.get(k)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => diffs.push(format!(
                "{k}: {} → {} (texts compare exactly)",
                a.map_or("(none)".into(), |v| format!("{v:?}")),
                b.map_or("(none)".into(), |v| format!("{v:?}"))
            )),
        }
    }
    if !same_gates {
        diffs.push(format!(
            "gates: [{}] → [{}]",
            golden.gates.join("; "),
            now.gates.join("; ")
        ));
    }
    diffs
}

fn accept_hint(pending: &str, golden: &str) -> String {
    format!(
        "To review: `cargo insta review` (or accept all: `cargo insta accept`; by hand: `mv {pending} {golden}`)"
    )
}

/// Why a trial's golden does not match: each with its whole message (the
/// diff, the file written as pending, the command that accepts it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoldenError {
    /// The golden or its pending file could not be read or written.
    #[error("{0}")]
    Io(String),
    /// There is none yet: the outcome was written as pending (`.snap.new`).
    #[error("{0}")]
    New(String),
    /// There is none, and nothing may be written (update mode `no`).
    #[error("{0}")]
    Missing(String),
    /// It does not parse (and is not taken as missing).
    #[error("{0}")]
    Unparsable(String),
    /// It differs from the outcome, or was recorded with other inputs.
    #[error("{0}")]
    Changed(String),
}

/// Check `outcome` against its golden; write per `mode`. Ok(()) when the
/// golden matches (or was written in `Always` mode); Err(message) otherwise.
pub fn check(
    outcome: &Outcome,
    case: &Case,
    case_file: &str,
    goldens: &Goldens,
    mode: UpdateMode,
) -> std::result::Result<(), GoldenError> {
    if outcome.status == Status::Error {
        // An error is reported by itself; there is nothing to record.
        return Ok(());
    }
    let path = goldens.path(&outcome.case, &outcome.model);
    let pending = PathBuf::from(format!("{}.new", path.display()));
    let (shown, shown_new) = (goldens.show(&path), goldens.show(&pending));
    let rendered = render(outcome, case_file);
    let write = |dest: &Path| {
        crate::core::fsutil::write_atomic(dest, rendered.as_bytes())
            .map_err(|e| GoldenError::Io(format!("writing {}: {e}", goldens.show(dest))))
    };
    let old = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(GoldenError::Io(format!(
                "{shown}: cannot read the golden: {e}"
            )))
        }
    };
    let Some(old) = old else {
        return match mode {
            UpdateMode::Always => write(&path),
            UpdateMode::New => {
                write(&pending)?;
                Err(GoldenError::New(format!(
                    "no golden yet for {}::{}; wrote {shown_new}:\n{}\n{}",
                    outcome.case,
                    outcome.model,
                    indent(&rendered),
                    accept_hint(&shown_new, &shown)
                )))
            }
            UpdateMode::No => Err(GoldenError::Missing(format!(
                "missing golden {shown} for {}::{} (nothing written: update mode `no`{}); \
                 run `cargo test --release` locally to write it, review and commit it",
                outcome.case,
                outcome.model,
                if goldens.ci { ", CI is set" } else { "" }
            ))),
        };
    };
    let golden = parse(&old).map_err(|e| {
        GoldenError::Unparsable(format!(
            "{shown}:{e}\nthe golden does not parse; it is not treated as missing. Fix it, or delete it and rerun to record a new one"
        ))
    })?;
    let current = Inputs::of(outcome);
    let changed_inputs: Vec<String> = Inputs::IDENTITY
        .iter()
        .filter(|k| golden.inputs.0.get(**k) != current.0.get(**k))
        .map(|k| {
            format!(
                "  {k}: {} → {}",
                golden.inputs.0.get(*k).map_or("(none)", String::as_str),
                current.0.get(*k).map_or("(none)", String::as_str)
            )
        })
        .collect();
    let now = parse(&rendered).map_err(|e| {
        GoldenError::Unparsable(format!("internal: a rendered golden does not parse: {e}"))
    })?;
    let diffs = compare(&golden, &now, case);
    if changed_inputs.is_empty() && diffs.is_empty() {
        if mode != UpdateMode::No && pending.exists() {
            let _ = std::fs::remove_file(&pending);
        }
        return Ok(());
    }
    let what = if changed_inputs.is_empty() {
        format!(
            "golden {shown} changed:\n{}",
            diffs.iter().map(|d| format!("  {d}\n")).collect::<String>()
        )
    } else {
        format!(
            "golden {shown} was recorded with other inputs (another case version, model file or engine settings), not compared value by value:\n{}\n",
            changed_inputs.join("\n")
        )
    };
    let diff = crate::golden::diff::line_diff(&old, &rendered);
    match mode {
        UpdateMode::Always => write(&path),
        UpdateMode::New => {
            write(&pending)?;
            Err(GoldenError::Changed(format!(
                "{what}-old golden / +new outcome:\n{diff}wrote {shown_new}\n{}",
                accept_hint(&shown_new, &shown)
            )))
        }
        UpdateMode::No => Err(GoldenError::Changed(format!(
            "{what}-old golden / +new outcome:\n{diff}nothing written (update mode `no`)"
        ))),
    }
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Goldens under `goldens` whose case × model is not in `expected`
/// (`(case, model)` pairs), sorted.
pub fn orphans(
    goldens: &Goldens,
    expected: &[(String, String)],
    known_cases: &[String],
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(&goldens.dir)
        .into_iter()
        .filter_map(|e| e.ok())
    {
        let Some(model) = e.file_name().to_str().and_then(|n| n.strip_suffix(".snap")) else {
            continue;
        };
        if e.file_type().is_dir() {
            continue;
        }
        let case = e
            .path()
            .parent()
            .map(|d| crate::core::fsutil::rel_slash(&goldens.dir, d))
            .unwrap_or_default();
        let pair = (case.clone(), model.to_string());
        // A case that failed to parse keeps its goldens: we cannot tell.
        let parsed_case_known = expected.iter().any(|(c, _)| *c == case);
        if !expected.contains(&pair) && (parsed_case_known || !known_cases.contains(&case)) {
            out.push(e.path().to_path_buf());
        }
    }
    out.sort();
    out
}

/// The failure message for orphaned goldens.
pub fn orphans_message(goldens: &Goldens, orphans: &[PathBuf]) -> String {
    let list: Vec<String> = orphans.iter().map(|p| goldens.show(p)).collect();
    format!(
        "{} golden(s) belong to no case × model any more:\n{}\nremove them with:\n  git rm {}",
        list.len(),
        list.iter().map(|p| format!("  {p}\n")).collect::<String>(),
        list.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::case::Metric;

    /// A speed-like case: a measured ratio beside a float.
    fn case() -> Case {
        Case {
            name: "speed/x".into(),
            path: PathBuf::from("suites/speed/x.toml"),
            content_sha256: String::new(),
            kind: "speed",
            description: String::new(),
            models: vec![],
            reference: None,
            gates: vec![],
            tolerances: Default::default(),
            prereg: None,
            metrics: vec![
                Metric::new("tg_ratio_vs_ref", MetricType::Measurement),
                Metric::float("model_bpw"),
            ],
            pins: vec![],
            windows: None,
            decide: None,
        }
    }

    fn golden(status: &str, gates: &[&str]) -> Parsed {
        let text = format!(
            "---\nsource: suites/speed/x.toml\nexpression: \"speed/x::m\"\ninfo:\n  case_sha256: a\n---\n\
             status: {status}\nmetrics:\n  model_bpw: 8.5\n  tg_ratio_vs_ref: 0.98\ngates:\n{}",
            gates.iter().map(|g| format!("  {g}\n")).collect::<String>()
        );
        parse(&text).unwrap()
    }

    /// A measured gate's verdict is the run's, not the golden's: a flip of it
    /// (and the status it made) is no difference; its threshold, a gate added
    /// or removed, and any other gate's verdict still are.
    #[test]
    fn a_measured_verdict_is_not_pinned_by_the_golden() {
        let c = case();
        let was = golden("fail", &["tg_ratio_vs_ref ≥ 1.0: fail"]);
        let now = golden("pass", &["tg_ratio_vs_ref ≥ 1.0: pass"]);
        assert_eq!(compare(&was, &now, &c), Vec::<String>::new());
        assert_eq!(compare(&now, &was, &c), Vec::<String>::new());
        let other_threshold = golden("pass", &["tg_ratio_vs_ref ≥ 0.9: pass"]);
        assert_eq!(compare(&now, &other_threshold, &c).len(), 1);
        let added = golden(
            "pass",
            &["tg_ratio_vs_ref ≥ 1.0: pass", "model_bpw ≤ 9.0: pass"],
        );
        assert_eq!(compare(&now, &added, &c).len(), 1);
        // A float's gate keeps its verdict pinned, and the status with it.
        let floats = golden(
            "pass",
            &["tg_ratio_vs_ref ≥ 1.0: pass", "model_bpw ≤ 9.0: pass"],
        );
        let flipped = golden(
            "fail",
            &["tg_ratio_vs_ref ≥ 1.0: pass", "model_bpw ≤ 9.0: fail"],
        );
        assert_eq!(compare(&floats, &flipped, &c).len(), 2);
        // No gate on a measurement: the status compares as ever.
        let plain = golden("pass", &["model_bpw ≤ 9.0: pass"]);
        let failed = golden("fail", &["model_bpw ≤ 9.0: pass"]);
        assert_eq!(compare(&plain, &failed, &c).len(), 1);
    }
}
