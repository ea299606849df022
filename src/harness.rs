//! The `cargo test` glue: every planned trial becomes a libtest-mimic test
//! named `suite/case::model`. The only module that uses `libtest_mimic`.
//!
//! Contract: `--list`, filters and `--exact` are answered from the plan
//! before any model loads (nextest's custom-harness rules); the whole
//! failure explanation goes into the test's failure message.

use crate::engine::Engine;
use crate::runner::{plan, threads_per_trial, Runner};
use libtest_mimic::{Arguments, Failed, Trial};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Run the suites under `suites` as tests, with the process's arguments.
pub fn run_suites(suites: &Path, engine: Arc<dyn Engine>) -> ExitCode {
    let args = Arguments::from_args();
    run_with_args(suites, engine, &args)
}

/// Run the suites under `suites` as tests with explicit arguments.
pub fn run_with_args(suites: &Path, engine: Arc<dyn Engine>, args: &Arguments) -> ExitCode {
    let (registry, planned) = match plan(suites, &[], &[]) {
        Ok(p) => p,
        Err(e) => {
            // The harness could not plan at all: one failing test says why.
            let msg = e.message.clone();
            let trial = Trial::test("quantgate::plan", move || Err(Failed::from(msg.clone())));
            return libtest_mimic::run(args, vec![trial]).exit_code();
        }
    };
    // nextest runs one process per test, as many at once as there are cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let concurrent = if std::env::var_os("NEXTEST").is_some() {
        cores
    } else {
        args.test_threads.unwrap_or(cores)
    };
    let runner = Arc::new(Runner::new(registry, engine, threads_per_trial(concurrent)));
    let trials = planned
        .into_iter()
        .map(|p| {
            let runner = runner.clone();
            Trial::test(p.name.clone(), move || {
                let outcome = runner.run(&p);
                match outcome.failure_message() {
                    None => Ok(()),
                    Some(m) => Err(Failed::from(m)),
                }
            })
        })
        .collect();
    libtest_mimic::run(args, trials).exit_code()
}
