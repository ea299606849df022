//! Trials as tests: a group of trials (one shared decode) run and judged,
//! each trial's Parquet rows written when asked for, and each trial's golden
//! checked, all reported together per test.

use crate::core::Status;
use crate::execute::RunContext;
use crate::golden::{self, Goldens, UpdateMode};
use crate::plan::Planned;
use std::path::Path;

/// A test's verdict: Ok or the whole failure message, and whether the case
/// could not run at all (an error, as opposed to a violated gate or a
/// changed golden).
pub type Verdict = (Result<(), String>, bool);

/// Run one trial: gates, errors and the golden, all reported together.
pub fn run_trial(
    runner: &RunContext,
    p: &Planned,
    goldens: &Goldens,
    mode: UpdateMode,
) -> Result<(), String> {
    group_verdicts(runner, &[p], &[], goldens, mode)
        .pop()
        .expect("one verdict per trial")
        .0
}

/// Run a group of trials that share a decode, with the reference work of
/// `provides` folded in, from the result cache where it holds them; one
/// verdict per trial of `group`, in order.
pub fn group_verdicts(
    runner: &RunContext,
    group: &[&Planned],
    provides: &[&Planned],
    goldens: &Goldens,
    mode: UpdateMode,
) -> Vec<Verdict> {
    let (outcomes, work) = crate::judge::trials(
        runner,
        group,
        provides,
        &goldens.dir,
        crate::judge::cache::enabled(),
    );
    // Reference work that failed is not a test's failure: the trials that
    // need it build it themselves, or say why they cannot.
    for f in &work.failed {
        eprintln!("quantgate: reference work failed: {f}");
    }
    outcomes
        .iter()
        .zip(group)
        .map(|(outcome, p)| {
            let errored = outcome.status == Status::Error;
            let mut messages: Vec<String> = outcome.failure_message().into_iter().collect();
            // Per-position rows and the outcome as JSON (what `quantgate
            // merge` reads from shards), when asked for (`QUANTGATE_OUT=DIR`).
            if let Some(dir) = std::env::var_os("QUANTGATE_OUT").filter(|d| !d.is_empty()) {
                let dir = Path::new(&dir);
                for written in [
                    crate::report::write_parquet(dir, outcome),
                    crate::report::write_outcome_json(dir, outcome),
                ] {
                    if let Err(e) = written {
                        messages.push(e.message);
                    }
                }
            }
            if let Ok(parsed) = &p.case {
                let source = format!("suites/{}.toml", parsed.case.name);
                if let Err(m) = golden::check(outcome, &parsed.case, &source, goldens, mode) {
                    messages.push(m);
                }
            }
            let result = if messages.is_empty() {
                Ok(())
            } else {
                Err(messages.join("\n"))
            };
            (result, errored)
        })
        .collect()
}
