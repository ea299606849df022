//! The `cargo test` glue: every planned trial becomes a libtest-mimic test
//! named `suite/case::model`. The only module that uses `libtest_mimic`.
//!
//! Contract: `--list`, filters and `--exact` are answered from the plan
//! before any model loads (nextest's custom-harness rules); the whole
//! failure explanation (gate violations, golden diffs, errors) goes into the
//! test's failure message; gate violations fail whatever the update mode.
//!
//! Plan by observation: the selected tests are grouped by what the engine
//! must decode (`plan::groups`); the first test to run starts the one
//! scheduler (`schedule::run_groups`, as `quantgate run` uses), which runs
//! each group in one decode — after the groups whose references it reads,
//! one at a time on every core as `quantgate run` does (`--test-threads N`:
//! N at once) — and each test waits for its own outcome and judges it
//! against its golden.
//!
//! Crash isolation: by default each group runs in a worker process (this
//! executable re-run with `QUANTGATE_WORKER=<alias>`), the job on its stdin,
//! a result per test on its stdout. llama.cpp aborts the process on some
//! inputs; a worker that dies fails the tests of its job with the signal,
//! the model, its file and the case, and every other test still runs.
//! `QUANTGATE_ISOLATION=test` gives every test its own worker and its own
//! decode (nothing shared), `model` one worker per model (a crash then fails
//! that model's remaining tests), `off` runs everything in one process;
//! under nextest (a process per test already) workers are not used.

mod trial;

pub use crate::core::TrialEnd;
pub use trial::{group_verdicts, run_trial};

use crate::core::config::Config;
use crate::core::outcome::split_test_name;
use crate::core::Outcome;
use crate::engine::Engine;
use crate::execute::{threads_per_trial, RunContext};
use crate::golden::{self, Goldens, UpdateMode};
use crate::plan::{plan, Planned};
use crate::schedule::{worker, Isolation, Schedule, Selection, WORKER_ENV};
use libtest_mimic::{Arguments, Failed, Trial};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex, Once};
use trial::harness_job;

/// The package root at run time ([`Config::root`]): `CARGO_MANIFEST_DIR` as
/// cargo and nextest set it in the environment of the test binaries they
/// run, else the working directory (where they start them).
pub fn project_root() -> PathBuf {
    crate::core::config::project_root()
}

/// [`crate::gate!`]: the cases and goldens of the crate under test
/// ([`Config::suites`], [`Config::goldens`]: by default `suites/` and
/// `goldens/` of [`project_root`]) as tests on llama.cpp.
pub fn gate() -> ExitCode {
    run_configured(Config::from_env([None, None, None]))
}

/// [`crate::run_gate`]: the cases of `config` as tests on llama.cpp, with
/// its folders, engine options and keys (workers are given the same).
pub(crate) fn gate_with(config: &Config) -> ExitCode {
    run_configured(Ok(config.clone()))
}

/// The harness under `config`, or, when it is an error, every test failed
/// by name with it (planned from the default folders).
fn run_configured(config: crate::core::error::Result<Config>) -> ExitCode {
    let (suites, goldens, engine) = match &config {
        Ok(c) => (
            c.suites.clone(),
            c.goldens.clone(),
            crate::engine::llama::LlamaEngine::for_config(c),
        ),
        Err(_) => (
            project_root().join("suites"),
            project_root().join("goldens"),
            crate::engine::llama::LlamaEngine::new(),
        ),
    };
    let engine: Arc<dyn Engine> = Arc::new(engine);
    if let Some(alias) = std::env::var_os(WORKER_ENV) {
        return serve_worker(&suites, &goldens, engine, &alias);
    }
    run_with_config(config, &suites, &goldens, engine, &Arguments::from_args())
}

fn serve_worker(
    suites: &Path,
    goldens: &Path,
    engine: Arc<dyn Engine>,
    alias: &std::ffi::OsStr,
) -> ExitCode {
    let own = Selection {
        suites: suites.to_path_buf(),
        goldens: goldens.to_path_buf(),
        ..Selection::default()
    };
    worker::serve(&own, engine, &alias.to_string_lossy())
}

/// Run the suites under `suites` as tests, goldens under `goldens`, with the
/// process's arguments and environment.
pub fn run_suites(suites: &Path, goldens: &Path, engine: Arc<dyn Engine>) -> ExitCode {
    if let Some(alias) = std::env::var_os(WORKER_ENV) {
        return serve_worker(suites, goldens, engine, &alias);
    }
    let args = Arguments::from_args();
    run_with_args(suites, goldens, engine, &args)
}

/// What every test closure shares: the plan, its groups, where each runs,
/// and the outcomes as the scheduler gives them.
struct Shared {
    config: Config,
    planned: Vec<Planned>,
    /// The groups and where each runs.
    schedule: Schedule,
    goldens: Arc<Goldens>,
    mode: UpdateMode,
    /// Groups run at once.
    jobs: usize,
    counts: Counts,
    /// The scheduler, started by the first test that runs (none for
    /// `--list`).
    started: Once,
    board: Mutex<Board>,
    changed: Condvar,
}

/// The outcomes so far, by index in the plan, with what could not be written of
/// each; and, once the scheduler has stopped, how.
#[derive(Default)]
struct Board {
    outcomes: HashMap<usize, (Outcome, Vec<String>)>,
    stopped: Option<String>,
}

impl Shared {
    /// Run the plan's groups on the one scheduler (`schedule::run_groups`),
    /// `jobs` at a time, each on its executor; every outcome goes on the
    /// board as it is judged.
    fn schedule(&self) {
        let job = harness_job(&self.config, &[], &[]);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.schedule.run(
                &self.planned,
                self.jobs,
                &job,
                &self.goldens.dir,
                &mut |_, _| {},
                &mut |i, o, unwritten| {
                    let mut b = self.board.lock().unwrap_or_else(|p| p.into_inner());
                    b.outcomes.insert(i, (o.clone(), unwritten.to_vec()));
                    self.changed.notify_all();
                },
            )
        }));
        let mut b = self.board.lock().unwrap_or_else(|p| p.into_inner());
        b.stopped = Some(match ran {
            Ok(_) => "its group ran and gave it no outcome".into(),
            Err(_) => "the scheduler stopped on a panic (its message is above)".into(),
        });
        self.changed.notify_all();
    }

    /// Test `i`'s verdict: the scheduler started if it is not yet, then
    /// its outcome awaited and judged against its golden.
    fn verdict(self: &Arc<Self>, i: usize) -> TrialEnd {
        self.started.call_once(|| {
            let me = self.clone();
            std::thread::spawn(move || me.schedule());
        });
        let p = &self.planned[i];
        let mut b = self.board.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some((o, unwritten)) = b.outcomes.remove(&i) {
                drop(b);
                let v = trial::verdict(p, &o, unwritten, &self.goldens, self.mode);
                self.counts.record(&v);
                return v;
            }
            if let Some(why) = &b.stopped {
                let v = TrialEnd::EngineError(format!("{}: {why}", p.name));
                self.counts.record(&v);
                return v;
            }
            b = self.changed.wait(b).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Run the suites as tests with explicit arguments, under the
/// environment's config.
pub(crate) fn run_with_args(
    suites: &Path,
    goldens: &Path,
    engine: Arc<dyn Engine>,
    args: &Arguments,
) -> ExitCode {
    let config = Config::from_env([None, None, None]).map(|mut c| {
        c.suites = suites.to_path_buf();
        c.goldens = goldens.to_path_buf();
        c
    });
    run_with_config(config, suites, goldens, engine, args)
}

/// Run the suites as tests under `config` (an error fails every test by
/// name).
fn run_with_config(
    config: crate::core::error::Result<Config>,
    suites: &Path,
    goldens: &Path,
    engine: Arc<dyn Engine>,
    args: &Arguments,
) -> ExitCode {
    let failing =
        |name: &str, msg: String| Trial::test(name, move || Err(Failed::from(msg.clone())));
    // The config (engine options, the shipped reference folder, the signing
    // key, the cache folder, isolation, the update mode), checked before
    // anything runs: a bad value fails every test rather than run under
    // other settings (or risk writing goldens under CI). The tests are
    // still planned (to be named) under a config of nothing but `HOME`.
    let planning = match &config {
        Ok(c) => c.clone(),
        Err(_) => match Config::bare() {
            Ok(c) => c,
            Err(e) => {
                let trial = failing("quantgate::config", e.message);
                return libtest_mimic::run(args, vec![trial]).exit_code();
            }
        },
    };
    crate::core::progress::set_parent_terminal(planning.parent_terminal);
    let (registry, planned) = match plan(suites, &[], &[]) {
        Ok(p) => p,
        // The harness could not plan at all: one failing test says why.
        Err(e) => {
            return libtest_mimic::run(args, vec![failing("quantgate::plan", e.message)])
                .exit_code()
        }
    };
    let config = match config {
        Ok(c) => {
            // What an interrupted run left: temp files of processes that
            // are gone.
            crate::models::clean_stale_temps(&c.cache);
            crate::core::fsutil::clean_stale_temps(goldens);
            c
        }
        Err(e) => {
            let trials = planned
                .iter()
                .map(|p| failing(&p.name, e.message.clone()))
                .collect();
            return libtest_mimic::run(args, trials).exit_code();
        }
    };
    // Under nextest (a process per test already) workers are not used.
    let (isolation, mode) = match config.nextest {
        true => (Isolation::Off, config.update),
        false => (config.isolation, config.update),
    };
    if let Some(dir) = &config.out {
        crate::report::clean_product_temps(dir, &planned);
    }
    // Groups run at once, each on cores / that many llama.cpp threads.
    // nextest runs one process per test, as many at once as there are
    // cores. Otherwise one group at a time on every core, as `quantgate
    // run` does (`--jobs 1`): a group of several candidates decodes them
    // in lanes on those cores, a speed group (run alone) measures on all
    // of them, and no core waits idle behind the longest group (the book's
    // performance chapter measures a release repository's `cargo test`
    // both ways). `--test-threads N` runs N groups at once.
    let concurrent = groups_at_once(config.nextest, args.test_threads, crate::execute::cores());
    let goldens = Arc::new(Goldens::new(goldens.to_path_buf()).under_ci(config.ci));
    let n_planned = planned.len();
    let orphans = orphan_trial(suites, &goldens, &planned);
    let threads = threads_per_trial(concurrent);
    // Groups of the tests this run selects (a filtered-out test is neither
    // run nor given reference work).
    let selected: Vec<bool> = planned
        .iter()
        .map(|p| !args.is_filtered_out(&Trial::test(p.name.clone(), || Ok(()))))
        .collect();
    let runner = Arc::new(RunContext::new(&config, registry, engine, threads));
    let selection = Arc::new(Selection {
        suites: suites.to_path_buf(),
        goldens: goldens.dir.clone(),
        ..Selection::default()
    });
    let schedule = Schedule::new(&runner, &planned, &selected, isolation, selection);
    let group_of: HashMap<usize, usize> = schedule
        .groups
        .iter()
        .enumerate()
        .flat_map(|(g, grp)| grp.trials.iter().map(move |&i| (i, g)))
        .collect();
    // Tests in the order the scheduler runs their groups (libtest reports
    // them as they finish); filtered-out tests are listed too (libtest
    // drops them).
    let mut order: Vec<usize> = schedule
        .groups
        .iter()
        .flat_map(|g| g.trials.clone())
        .collect();
    order.extend((0..planned.len()).filter(|i| !group_of.contains_key(i)));
    let shared = Arc::new(Shared {
        config,
        planned,
        schedule,
        goldens,
        mode,
        jobs: concurrent.max(1),
        counts: Counts::default(),
        started: Once::new(),
        board: Mutex::new(Board::default()),
        changed: Condvar::new(),
    });
    let mut trials = vec![orphans];
    for i in order {
        let p = &shared.planned[i];
        if let Err(e) = &p.case {
            // A case that does not parse fails without a worker.
            let msg = e.message.clone();
            let shared = shared.clone();
            trials.push(Trial::test(p.name.clone(), move || {
                let end = TrialEnd::InputError(msg.clone());
                shared.counts.record(&end);
                end.into_result().map_err(Failed::from)
            }));
            continue;
        }
        if !group_of.contains_key(&i) {
            trials.push(Trial::test(p.name.clone(), || Ok(())));
            continue;
        }
        let shared = shared.clone();
        trials.push(Trial::test(p.name.clone(), move || {
            shared.verdict(i).into_result().map_err(Failed::from)
        }));
    }
    let conclusion = libtest_mimic::run(args, trials);
    shared.counts.print(args, &conclusion, n_planned);
    conclusion.exit_code()
}

/// How many groups run at once: as many as there are cores under nextest
/// (its processes), `--test-threads` where given, else one (on every
/// core).
fn groups_at_once(nextest: bool, test_threads: Option<usize>, cores: usize) -> usize {
    match (nextest, test_threads) {
        (true, _) => cores,
        (false, Some(n)) => n,
        (false, None) => 1,
    }
}

/// Failures and errors, counted apart for the summary line.
#[derive(Default)]
struct Counts {
    failed: std::sync::atomic::AtomicUsize,
    errors: std::sync::atomic::AtomicUsize,
}

impl Counts {
    fn record(&self, end: &TrialEnd) {
        use std::sync::atomic::Ordering::Relaxed;
        match end {
            TrialEnd::Pass => 0,
            TrialEnd::Fail(_) => self.failed.fetch_add(1, Relaxed),
            TrialEnd::InputError(_) | TrialEnd::EngineError(_) => self.errors.fetch_add(1, Relaxed),
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

#[cfg(test)]
mod tests {
    use super::groups_at_once;

    #[test]
    fn one_group_at_a_time_on_every_core_unless_told() {
        // Plain `cargo test`: one group, on every core (as `quantgate run`).
        assert_eq!(groups_at_once(false, None, 2), 1);
        assert_eq!(groups_at_once(false, None, 16), 1);
        // `--test-threads N`: N groups, each on cores / N threads.
        assert_eq!(groups_at_once(false, Some(2), 2), 2);
        assert_eq!(groups_at_once(false, Some(1), 8), 1);
        // nextest: a process per test, as many as there are cores.
        assert_eq!(groups_at_once(true, None, 4), 4);
        assert_eq!(groups_at_once(true, Some(1), 4), 4);
    }
}
