//! Judge stage: what a kind measured, judged: its gates, a preregistered
//! rule (verified before any model runs, decided after), and the check
//! that each trial produced only the metrics its kind declared. Completed
//! trials are kept in the result cache ([`cache`]); shards are merged and
//! judged again ([`merge`]). The scheduler runs the trials
//! (`schedule::group`) and calls on this stage.
//!
//! Contract: every gate is evaluated and every violation listed; a missing
//! or NaN metric is a violation, never a pass; an engine or input error is
//! an `error` outcome, never numbers; a cached result is used only after
//! every pinned input is re-verified, and is judged again like a fresh one.

pub mod cache;
pub(crate) mod gates;
pub mod merge;
pub mod prereg;

use crate::core::error::{Error, Result};
use crate::core::{Case, Outcome, Status};
use crate::execute::RunContext;
use gates::judge;
use prereg::{LedgerLine, Prereg};
use std::path::Path;

/// Judge measured metrics by the case: every gate evaluated, the verdict,
/// and the metrics the table shows (the kind's headline and every gated
/// metric). For fresh results, cached ones and merged shards alike.
pub(crate) fn rejudge(parsed: &crate::kinds::Parsed, out: &mut Outcome) {
    out.kind = parsed.case.kind.to_string();
    out.data = parsed
        .case
        .pins
        .iter()
        .map(|p| {
            let name = p.path.file_name().unwrap_or(p.path.as_os_str());
            (name.to_string_lossy().into_owned(), p.sha256.clone())
        })
        .collect();
    out.gates = judge(&parsed.case.gates, &out.model, &out.metrics);
    out.notes = parsed.kind.notes(out);
    // The reference among the candidates: its gates compare it with itself.
    if out.reference_sha256.is_some() && out.reference_sha256 == out.model_sha256 {
        out.notes.push(
            "baseline: this is the reference itself (the same file); its gates compare it with \
             itself, and say nothing of a candidate"
                .into(),
        );
    }
    // A sequential case: what decided each gate, and when.
    if parsed.case.decide.is_some() {
        if let Some(d) = out.texts.get("decided") {
            out.notes.extend(d.lines().map(|l| format!("decided: {l}")));
        }
    }
    let headline = parsed.kind.headline();
    if !headline.is_empty() {
        out.headline = headline.iter().map(|m| m.to_string()).collect();
        if parsed.case.decide.is_some() {
            out.headline
                .push(format!("{}s_total", parsed.kind.sequential_unit()));
        }
        for g in parsed
            .case
            .gates
            .iter()
            .filter(|g| g.applies_to(&out.model))
        {
            let m = g.gated_metric();
            if !out.headline.contains(&m) {
                out.headline.push(m);
            }
        }
    }
    // A warn gate's violation is said, and does not fail the test.
    for g in out.gates.iter().filter(|g| !g.passed && !g.level.is_fail()) {
        out.notes.push(format!("warning: {}", g.describe()));
    }
    out.status = if out.gates.iter().all(|g| g.passed || !g.level.is_fail()) {
        Status::Pass
    } else {
        Status::Fail
    };
}

/// A metric the kind did not declare has no type to compare it by.
pub(crate) fn undeclared_metrics(case: &Case, out: &Outcome) -> Result<()> {
    let stray: Vec<&str> = out
        .metrics
        .keys()
        .filter(|m| case.metric_type(m).is_none())
        .map(String::as_str)
        .collect();
    if stray.is_empty() {
        Ok(())
    } else {
        Err(Error::harness(format!(
            "{}: a kind = \"{}\" case produced metrics it does not declare: {}",
            case.path.display(),
            case.kind,
            stray.join(", ")
        )))
    }
}

/// Parse the case's prereg, check it is sealed, unchanged, consistent with
/// the case and (in git) committed before the case's golden.
pub(crate) fn verify_prereg(
    case: &Case,
    alias: &str,
    path: &Path,
    goldens: &Path,
) -> Result<(Prereg, LedgerLine)> {
    // Every error of the prereg file names that file.
    let p = prereg::parse(path)?;
    let line = prereg::sealed_line(&p)?;
    prereg::check_case(&p, case)?;
    let golden = crate::golden::Goldens::new(goldens.to_path_buf()).path(&case.name, alias);
    prereg::check_history(&p, &line, &golden)?;
    Ok((p, line))
}

/// Evaluate a prereg's rule on the measured metrics (after its size rule
/// on the candidate's and the baseline's files).
pub(crate) fn decide_prereg(
    cx: &RunContext,
    case: &Case,
    alias: &str,
    p: &Prereg,
    line: &LedgerLine,
    out: &mut Outcome,
) -> Result<()> {
    if let Some((baseline, _)) = &case.reference {
        let bytes = |a: &str| {
            cx.prepare(a)
                .and_then(|v| crate::models::gguf::gguf_total_bytes(&v.file.path))
        };
        prereg::check_size(p, bytes(alias)?, bytes(baseline)?)?;
    }
    // The windows behind the decided metric, as its kind declares them.
    let counted = case
        .metrics
        .iter()
        .find(|m| m.name == p.metric.0)
        .and_then(|m| m.intervals.iter().find_map(|i| i.windows.as_ref()));
    // A sequential design counts the windows it may visit (it stops once
    // the rule is decided).
    let counted: Option<String> = match &case.decide {
        Some(_) => ["windows_total", "tasks_total"]
            .into_iter()
            .find(|n| case.metrics.iter().any(|m| m.name == *n))
            .map(String::from),
        None => counted.cloned(),
    };
    let windows = counted
        .and_then(|w| out.metrics.get(&w))
        .copied()
        .unwrap_or(f64::NAN);
    if windows != p.windows as f64 {
        return Err(Error::input(format!(
            "{}: windows: {} preregistered, {windows} evaluated",
            p.path.display(),
            p.windows
        )));
    }
    let d = p
        .decide(&out.metrics, &line.time)
        .map_err(|e| Error::harness(format!("{}: {e}", p.path.display())))?;
    out.metrics
        .insert("prereg_outcome".into(), d.outcome.as_metric());
    out.metrics.insert(
        "prereg_prediction_hit".into(),
        if d.prediction_hit { 1.0 } else { 0.0 },
    );
    out.prereg = Some(d);
    Ok(())
}

#[cfg(test)]
mod tests;
