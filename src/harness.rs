//! The `cargo test` glue: every planned trial becomes a libtest-mimic test
//! named `suite/case::model`. The only module that uses `libtest_mimic`.
//!
//! Contract: `--list`, filters and `--exact` are answered from the plan
//! before any model loads (nextest's custom-harness rules); the whole
//! failure explanation (gate violations, golden diffs, errors) goes into the
//! test's failure message; gate violations fail whatever the update mode.

use crate::engine::Engine;
use crate::golden::{self, Goldens, UpdateMode};
use crate::runner::{plan, threads_per_trial, Planned, Runner};
use libtest_mimic::{Arguments, Failed, Trial};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Run the suites under `suites` as tests, goldens under `goldens`, with the
/// process's arguments and environment.
pub fn run_suites(suites: &Path, goldens: &Path, engine: Arc<dyn Engine>) -> ExitCode {
    let args = Arguments::from_args();
    run_with_args(suites, goldens, engine, &args)
}

/// Run the suites as tests with explicit arguments.
pub fn run_with_args(
    suites: &Path,
    goldens: &Path,
    engine: Arc<dyn Engine>,
    args: &Arguments,
) -> ExitCode {
    let failing =
        |name: &str, msg: String| Trial::test(name, move || Err(Failed::from(msg.clone())));
    let (registry, planned) = match plan(suites, &[], &[]) {
        Ok(p) => p,
        // The harness could not plan at all: one failing test says why.
        Err(e) => {
            return libtest_mimic::run(args, vec![failing("quantgate::plan", e.message)])
                .exit_code()
        }
    };
    let mode = match golden::update_mode() {
        Ok(m) => m,
        Err(e) => {
            // Every test fails rather than risk writing goldens under CI.
            let trials = planned
                .iter()
                .map(|p| failing(&p.name, e.message.clone()))
                .collect();
            return libtest_mimic::run(args, trials).exit_code();
        }
    };
    // nextest runs one process per test, as many at once as there are cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let concurrent = if std::env::var_os("NEXTEST").is_some() {
        cores
    } else {
        args.test_threads.unwrap_or(cores)
    };
    let goldens = Arc::new(Goldens::new(goldens.to_path_buf()));
    let mut trials = vec![orphan_trial(suites, &goldens, &planned)];
    let runner = Arc::new(Runner::new(registry, engine, threads_per_trial(concurrent)));
    for p in planned {
        let (runner, goldens) = (runner.clone(), goldens.clone());
        trials.push(Trial::test(p.name.clone(), move || {
            run_trial(&runner, &p, &goldens, mode).map_err(Failed::from)
        }));
    }
    libtest_mimic::run(args, trials).exit_code()
}

/// Run one trial: gates, errors and the golden, all reported together.
pub fn run_trial(
    runner: &Runner,
    p: &Planned,
    goldens: &Goldens,
    mode: UpdateMode,
) -> Result<(), String> {
    let outcome = runner.run(p);
    let mut messages: Vec<String> = outcome.failure_message().into_iter().collect();
    // Per-position rows, when asked for (`QUANTGATE_OUT=DIR`).
    if let Some(dir) = std::env::var_os("QUANTGATE_OUT").filter(|d| !d.is_empty()) {
        if let Err(e) = crate::report::write_parquet(Path::new(&dir), &outcome) {
            messages.push(e.message);
        }
    }
    if let Ok(case) = &p.case {
        let source = format!("suites/{}.toml", case.name);
        if let Err(m) = golden::check(&outcome, case, &source, goldens, mode) {
            messages.push(m);
        }
    }
    if messages.is_empty() {
        Ok(())
    } else {
        Err(messages.join("\n"))
    }
}

fn orphan_trial(suites: &Path, goldens: &Arc<Goldens>, planned: &[Planned]) -> Trial {
    let expected: Vec<(String, String)> = planned
        .iter()
        .filter(|p| p.case.is_ok())
        .map(|p| {
            (
                p.name.split("::").next().unwrap_or_default().to_string(),
                p.model.clone(),
            )
        })
        .collect();
    let known: Vec<String> = crate::discover::all_cases(suites)
        .map(|v| v.iter().map(|f| f.name().to_string()).collect())
        .unwrap_or_default();
    let goldens = goldens.clone();
    Trial::test("goldens/orphans", move || {
        let orphans = golden::orphans(&goldens, &expected, &known);
        if orphans.is_empty() {
            Ok(())
        } else {
            Err(Failed::from(golden::orphans_message(&goldens, &orphans)))
        }
    })
}
