//! The `cargo test` glue: every planned trial becomes a libtest-mimic test
//! named `suite/case::model`. The only module that uses `libtest_mimic`.
//!
//! Contract: `--list`, filters and `--exact` are answered from the plan
//! before any model loads (nextest's custom-harness rules); the whole
//! failure explanation (gate violations, golden diffs, errors) goes into the
//! test's failure message; gate violations fail whatever the update mode.
//!
//! Crash isolation: by default each trial runs in a worker process (this
//! executable re-run with `QUANTGATE_WORKER=<alias>`), the test name on its
//! stdin, the result as one line on its stdout. llama.cpp aborts the process
//! on some inputs; a worker that dies fails its test with the signal, the
//! model, its file and the case, and every other test still runs.
//! `QUANTGATE_ISOLATION=model` shares one worker per model (a crash then
//! fails that model's remaining tests), `off` runs everything in one
//! process; under nextest (a process per test already) workers are not used.

mod result_cache;
mod trial;
mod worker;

pub use trial::run_trial;
pub use worker::WORKER_ENV;

use crate::core::outcome::split_test_name;
use crate::engine::Engine;
use crate::execute::{threads_per_trial, RunContext};
use crate::golden::{self, Goldens};
use crate::plan::{plan, Planned};
use libtest_mimic::{Arguments, Failed, Trial};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use trial::trial_result;
use worker::Worker;

/// The package root at run time: `CARGO_MANIFEST_DIR` as cargo and nextest
/// set it in the environment of the test binaries they run, else the working
/// directory (where they start them). Never a path compiled into the binary:
/// two checkouts sharing one target directory each test their own files.
pub fn project_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_default())
}

/// Run the suites under `suites` as tests, goldens under `goldens`, with the
/// process's arguments and environment.
pub fn run_suites(suites: &Path, goldens: &Path, engine: Arc<dyn Engine>) -> ExitCode {
    if let Some(alias) = std::env::var_os(WORKER_ENV) {
        return worker::worker(suites, goldens, engine, &alias.to_string_lossy());
    }
    let args = Arguments::from_args();
    // What an interrupted run left: temp files of processes that are gone.
    crate::models::clean_stale_temps();
    crate::core::fsutil::clean_stale_temps(goldens);
    if let Some(dir) = std::env::var_os("QUANTGATE_OUT").filter(|d| !d.is_empty()) {
        crate::core::fsutil::clean_stale_temps(Path::new(&dir));
    }
    run_with_args(suites, goldens, engine, &args)
}

/// How trials are spread over worker processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// Everything in this process.
    Off,
    /// One worker per model, running that model's trials in turn.
    Model,
    /// One worker per trial.
    Test,
}

/// `QUANTGATE_ISOLATION` = off | model | test (default test; off under
/// nextest, which runs a process per test itself).
fn isolation() -> Isolation {
    if std::env::var_os("NEXTEST").is_some() {
        return Isolation::Off;
    }
    match std::env::var("QUANTGATE_ISOLATION").as_deref() {
        Ok("off") => Isolation::Off,
        Ok("model") => Isolation::Model,
        _ => Isolation::Test,
    }
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
    let cores = crate::execute::cores();
    let concurrent = if std::env::var_os("NEXTEST").is_some() {
        cores
    } else {
        args.test_threads.unwrap_or(cores)
    };
    let goldens = Arc::new(Goldens::new(goldens.to_path_buf()));
    let n_planned = planned.len();
    let mut trials = vec![orphan_trial(suites, &goldens, &planned)];
    let threads = threads_per_trial(concurrent);
    let counts = Arc::new(Counts::default());
    let isolation = isolation();
    if isolation != Isolation::Off {
        let label = engine.build().label();
        let mut workers: HashMap<String, Arc<Mutex<Worker>>> = HashMap::new();
        // Round-robin over models, so concurrent test threads keep different
        // workers busy instead of queueing on one model's worker.
        let mut by_model: Vec<Vec<Planned>> = Vec::new();
        for p in planned {
            match by_model.iter_mut().find(|g| g[0].model == p.model) {
                Some(g) => g.push(p),
                None => by_model.push(vec![p]),
            }
        }
        let mut order = Vec::new();
        let longest = by_model.iter().map(Vec::len).max().unwrap_or(0);
        let mut iters: Vec<_> = by_model.into_iter().map(Vec::into_iter).collect();
        for _ in 0..longest {
            order.extend(iters.iter_mut().filter_map(Iterator::next));
        }
        for p in order {
            if let Err(e) = &p.case {
                // A case that does not parse fails without a worker.
                trials.push(failing(&p.name, e.message.clone()));
                continue;
            }
            let key = match isolation {
                Isolation::Model => p.model.clone(),
                _ => p.name.clone(),
            };
            let w = workers
                .entry(key)
                .or_insert_with(|| {
                    let model_path = registry
                        .location(&p.model, &label)
                        .map(|l| l.display().to_string())
                        .unwrap_or_else(|_| "?".into());
                    Arc::new(Mutex::new(Worker::new(&p.model, model_path)))
                })
                .clone();
            let name = p.name.clone();
            let counts = counts.clone();
            trials.push(Trial::test(p.name.clone(), move || {
                let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                let (result, errored) = w.run(&name, threads);
                counts.record(&result, errored);
                result.map_err(Failed::from)
            }));
        }
        let conclusion = libtest_mimic::run(args, trials);
        counts.print(args, &conclusion, n_planned);
        return conclusion.exit_code();
    }
    let runner = Arc::new(RunContext::new(registry, engine, threads));
    for p in planned {
        let (runner, goldens, counts) = (runner.clone(), goldens.clone(), counts.clone());
        trials.push(Trial::test(p.name.clone(), move || {
            let (result, errored) = trial_result(&runner, &p, &goldens, mode);
            counts.record(&result, errored);
            result.map_err(Failed::from)
        }));
    }
    let conclusion = libtest_mimic::run(args, trials);
    counts.print(args, &conclusion, n_planned);
    conclusion.exit_code()
}

/// Failures and errors, counted apart for the summary line.
#[derive(Default)]
struct Counts {
    failed: std::sync::atomic::AtomicUsize,
    errors: std::sync::atomic::AtomicUsize,
}

impl Counts {
    fn record(&self, result: &Result<(), String>, errored: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        match (result, errored) {
            (_, true) => self.errors.fetch_add(1, Relaxed),
            (Err(_), false) => self.failed.fetch_add(1, Relaxed),
            (Ok(()), false) => 0,
        };
    }

    /// After libtest's own summary: failures and errors apart, and a run
    /// whose filter selected nothing said to be one (libtest's `0 passed`
    /// reads like a green gate).
    fn print(&self, args: &Arguments, c: &libtest_mimic::Conclusion, planned: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let (f, e) = (self.failed.load(Relaxed), self.errors.load(Relaxed));
        if f + e > 0 {
            println!(
                "quantgate: {f} failed (a gate or a golden), {e} errors (a case that could not run, or a worker that died)"
            );
        }
        if !args.list && c.num_passed + c.num_failed == 0 {
            println!(
                "quantgate: nothing ran: the filter {} selects none of the {planned} planned tests",
                args.filter
                    .as_deref()
                    .map_or("(none)".to_string(), |f| format!("`{f}`"))
            );
        }
    }
}

fn orphan_trial(suites: &Path, goldens: &Arc<Goldens>, planned: &[Planned]) -> Trial {
    let expected: Vec<(String, String)> = planned
        .iter()
        .filter(|p| p.case.is_ok())
        .map(|p| (split_test_name(&p.name).0.to_string(), p.model.clone()))
        .collect();
    let known: Vec<String> = crate::plan::discover::all_cases(suites)
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
