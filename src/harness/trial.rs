//! Trials as tests: a group of trials (one shared decode) run and judged,
//! each trial's Parquet rows written when asked for, and each trial's golden
//! checked, all reported together per test.

use crate::core::config::Config;
use crate::core::{Outcome, TrialEnd};
use crate::execute::RunContext;
use crate::golden::{self, Goldens, UpdateMode};
use crate::plan::Planned;
use crate::schedule::worker::run_here;
use crate::schedule::{GroupRun, Job};

/// Run one trial: gates, errors and the golden, all reported together.
pub fn run_trial(
    runner: &RunContext,
    p: &Planned,
    goldens: &Goldens,
    mode: UpdateMode,
) -> Result<(), TrialEnd> {
    group_verdicts(runner, &[p], &[], goldens, mode)
        .pop()
        .expect("one verdict per trial")
        .into_result()
}

/// The job of a group under `cargo test`: the result cache as `config`
/// says, and per-position rows and outcomes written under `QUANTGATE_OUT`
/// when it names a folder (what `quantgate merge` reads from shards).
pub(crate) fn harness_job(config: &Config, group: &[&Planned], provides: &[&Planned]) -> Job {
    let out = config.out.clone();
    Job {
        run: group.iter().map(|p| p.name.clone()).collect(),
        provide: provides.iter().map(|p| p.name.clone()).collect(),
        cache: config.result_cache,
        rows: out.clone(),
        outcomes: out,
    }
}

/// Run a group of trials that share a decode in this process, with the
/// reference work of `provides` folded in, from the result cache where it
/// holds them; one verdict per trial of `group`, in order.
pub fn group_verdicts(
    runner: &RunContext,
    group: &[&Planned],
    provides: &[&Planned],
    goldens: &Goldens,
    mode: UpdateMode,
) -> Vec<TrialEnd> {
    let job = harness_job(runner.config(), group, provides);
    let ran = run_here(runner, group, provides, &goldens.dir, &job);
    verdicts(group, ran, goldens, mode)
}

/// The verdicts of a group's run, wherever it ran: each trial's gates,
/// error, files not written and golden, in `group`'s order.
pub(crate) fn verdicts(
    group: &[&Planned],
    ran: GroupRun,
    goldens: &Goldens,
    mode: UpdateMode,
) -> Vec<TrialEnd> {
    // Reference work that failed is not a test's failure: the trials that
    // need it build it themselves, or say why they cannot.
    for f in &ran.work.failed {
        crate::core::progress::say!("quantgate: reference work failed: {f}");
    }
    ran.outcomes
        .into_iter()
        .zip(group)
        .map(|((outcome, unwritten), p)| verdict(p, &outcome, unwritten, goldens, mode))
        .collect()
}

/// A trial's verdict from its outcome: its gates, its error, the files
/// not written of it (`unwritten`) and its golden, all reported together.
pub(crate) fn verdict(
    p: &Planned,
    outcome: &Outcome,
    unwritten: Vec<String>,
    goldens: &Goldens,
    mode: UpdateMode,
) -> TrialEnd {
    let end = outcome.end();
    let mut messages: Vec<String> = end
        .clone()
        .into_result()
        .err()
        .iter()
        .map(ToString::to_string)
        .collect();
    messages.extend(unwritten);
    if let Ok(parsed) = &p.case {
        let source = format!("suites/{}.toml", parsed.case.name);
        if let Err(m) = golden::check(outcome, &parsed.case, &source, goldens, mode) {
            messages.push(m.to_string());
        }
    }
    let message = messages.join("\n");
    match end {
        TrialEnd::InputError(_) => TrialEnd::InputError(message),
        TrialEnd::EngineError(_) => TrialEnd::EngineError(message),
        _ if messages.is_empty() => TrialEnd::Pass,
        _ => TrialEnd::Fail(message),
    }
}
