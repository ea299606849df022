//! One trial as a test: its outcome (from the result cache or run), its
//! Parquet rows when asked for, and its golden, all reported together.

use crate::core::Status;
use crate::execute::RunContext;
use crate::golden::{self, Goldens, UpdateMode};
use crate::harness::result_cache::outcome_of;
use crate::plan::Planned;
use std::path::Path;

/// Run one trial: gates, errors and the golden, all reported together.
pub fn run_trial(
    runner: &RunContext,
    p: &Planned,
    goldens: &Goldens,
    mode: UpdateMode,
) -> Result<(), String> {
    trial_result(runner, p, goldens, mode).0
}

/// [`run_trial`], and whether the case could not run at all (an error, as
/// opposed to a violated gate or a changed golden).
pub fn trial_result(
    runner: &RunContext,
    p: &Planned,
    goldens: &Goldens,
    mode: UpdateMode,
) -> (Result<(), String>, bool) {
    let outcome = outcome_of(runner, p, goldens);
    let errored = outcome.status == Status::Error;
    let mut messages: Vec<String> = outcome.failure_message().into_iter().collect();
    // Per-position rows, when asked for (`QUANTGATE_OUT=DIR`).
    if let Some(dir) = std::env::var_os("QUANTGATE_OUT").filter(|d| !d.is_empty()) {
        if let Err(e) = crate::report::write_parquet(Path::new(&dir), &outcome) {
            messages.push(e.message);
        }
    }
    if let Ok(parsed) = &p.case {
        let source = format!("suites/{}.toml", parsed.case.name);
        if let Err(m) = golden::check(&outcome, &parsed.case, &source, goldens, mode) {
            messages.push(m);
        }
    }
    let result = if messages.is_empty() {
        Ok(())
    } else {
        Err(messages.join("\n"))
    };
    (result, errored)
}
