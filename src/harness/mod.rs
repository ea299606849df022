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

use crate::core::outcome::split_test_name;
use crate::core::{Outcome, Status};
use crate::engine::Engine;
use crate::execute::{threads_per_trial, RunContext};
use crate::golden::{self, Goldens, UpdateMode};
use crate::plan::{plan, Planned};
use libtest_mimic::{Arguments, Failed, Trial};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};

/// The environment variable that makes this executable a worker.
pub const WORKER_ENV: &str = "QUANTGATE_WORKER";
/// Prefix of a worker's result lines (anything else on stdout is ignored).
const RESULT: &str = "QUANTGATE-RESULT ";

/// Run the suites under `suites` as tests, goldens under `goldens`, with the
/// process's arguments and environment.
pub fn run_suites(suites: &Path, goldens: &Path, engine: Arc<dyn Engine>) -> ExitCode {
    if let Some(alias) = std::env::var_os(WORKER_ENV) {
        return worker(suites, goldens, engine, &alias.to_string_lossy());
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

/// Worker mode: run the named trials of model `alias` as they arrive on
/// stdin; answer each with a result line.
fn worker(suites: &Path, goldens: &Path, engine: Arc<dyn Engine>, alias: &str) -> ExitCode {
    let (registry, planned) = match plan(suites, &[], &[alias.to_string()]) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("quantgate worker `{alias}`: {}", e.message);
            return ExitCode::from(2);
        }
    };
    let threads = std::env::var("QUANTGATE_WORKER_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| threads_per_trial(1));
    let runner = RunContext::new(registry, engine, threads);
    let goldens = Goldens::new(goldens.to_path_buf());
    let mode = match golden::update_mode() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("quantgate worker `{alias}`: {}", e.message);
            return ExitCode::from(2);
        }
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(name) = line else { break };
        let result = match planned.iter().find(|p| p.name == name) {
            Some(p) => trial_result(&runner, p, &goldens, mode),
            None => (
                Err(format!("worker `{alias}`: no planned test `{name}`")),
                true,
            ),
        };
        let (result, errored) = result;
        let reply = serde_json::json!({ "name": name, "error": result.err(), "errored": errored });
        if writeln!(out, "{RESULT}{reply}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    ExitCode::SUCCESS
}

/// One model's worker process, started on first use.
struct Worker {
    alias: String,
    model_path: String,
    proc: Option<(Child, ChildStdin, BufReader<ChildStdout>)>,
    /// Why the worker is gone, once it died.
    dead: Option<String>,
}

impl Worker {
    /// The trial's result, and whether it errored (a dead worker does).
    fn run(&mut self, name: &str, threads: u32) -> (Result<(), String>, bool) {
        match self.run_inner(name, threads) {
            Ok((r, errored)) => (r, errored),
            Err(e) => (Err(e), true),
        }
    }

    fn run_inner(
        &mut self,
        name: &str,
        threads: u32,
    ) -> Result<(Result<(), String>, bool), String> {
        if let Some(why) = &self.dead {
            return Err(format!("not run: {why}"));
        }
        if self.proc.is_none() {
            let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            let mut child = Command::new(exe)
                .env(WORKER_ENV, &self.alias)
                .env("QUANTGATE_WORKER_THREADS", threads.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("starting the worker for `{}`: {e}", self.alias))?;
            let stdin = child.stdin.take().expect("piped stdin");
            let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
            self.proc = Some((child, stdin, stdout));
        }
        let (child, stdin, stdout) = self.proc.as_mut().expect("started above");
        let sent = writeln!(stdin, "{name}").and_then(|()| stdin.flush());
        let mut line = String::new();
        loop {
            line.clear();
            let n = if sent.is_ok() {
                stdout.read_line(&mut line).unwrap_or(0)
            } else {
                0
            };
            if n == 0 {
                // The worker is gone: say how, and fail the rest of its model.
                let status = child.wait().map(|s| describe_exit(&s));
                let why = format!(
                    "the worker process for model `{}` ({}) {} while running `{name}`",
                    self.alias,
                    self.model_path,
                    status.unwrap_or_else(|e| format!("could not be waited for ({e})"))
                );
                self.proc = None;
                self.dead = Some(why.clone());
                return Err(format!(
                    "{why}; this model's remaining tests are not run, the other models' tests still run"
                ));
            }
            if let Some(json) = line.trim_end().strip_prefix(RESULT) {
                let v: serde_json::Value = serde_json::from_str(json)
                    .map_err(|e| format!("unreadable worker result `{json}`: {e}"))?;
                if v["name"] != name {
                    return Err(format!(
                        "worker answered for {} instead of `{name}`",
                        v["name"]
                    ));
                }
                let errored = v["errored"].as_bool() != Some(false);
                return match v["error"].as_str() {
                    None if v["error"].is_null() => Ok((Ok(()), errored)),
                    None => Err(format!("unreadable worker result `{json}`")),
                    Some(m) => Ok((Err(m.to_string()), errored)),
                };
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some((mut child, stdin, _)) = self.proc.take() {
            drop(stdin); // EOF: the worker finishes and exits
            let _ = child.wait();
        }
    }
}

/// `exited with status 3` / `was killed by signal 6 (SIGABRT)`.
fn describe_exit(s: &std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = s.signal() {
            let name = match sig {
                6 => " (SIGABRT)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                7 => " (SIGBUS)",
                8 => " (SIGFPE)",
                4 => " (SIGILL)",
                15 => " (SIGTERM)",
                2 => " (SIGINT)",
                _ => "",
            };
            return format!("was killed by signal {sig}{name}");
        }
    }
    match s.code() {
        Some(c) => format!("exited with status {c}"),
        None => "ended".into(),
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
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let concurrent = if std::env::var_os("NEXTEST").is_some() {
        cores
    } else {
        args.test_threads.unwrap_or(cores)
    };
    let goldens = Arc::new(Goldens::new(goldens.to_path_buf()));
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
                    Arc::new(Mutex::new(Worker {
                        alias: p.model.clone(),
                        model_path,
                        proc: None,
                        dead: None,
                    }))
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
        let code = libtest_mimic::run(args, trials).exit_code();
        counts.print();
        return code;
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
    let code = libtest_mimic::run(args, trials).exit_code();
    counts.print();
    code
}

/// The result cache key of a trial: this executable, the case's bytes (its
/// pins cover texts, token files and reference files), the model's and the
/// reference's pinned sha256, the engine and the threads. None when the
/// trial must always run: a preregistered case (its verification reads git),
/// Parquet output requested, an unpinned model, or
/// `QUANTGATE_RESULT_CACHE=off`.
fn result_key(runner: &RunContext, p: &Planned) -> Option<String> {
    static EXE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let case = &p.case.as_ref().ok()?.case;
    if case.prereg.is_some()
        || std::env::var_os("QUANTGATE_OUT").is_some_and(|d| !d.is_empty())
        || std::env::var("QUANTGATE_RESULT_CACHE").is_ok_and(|v| v == "off")
    {
        return None;
    }
    let exe = EXE
        .get_or_init(|| {
            let exe = std::env::current_exe().ok()?;
            crate::core::fsutil::sha256_file(&exe, |_| {})
                .ok()
                .map(|(s, _)| s)
        })
        .clone()?;
    let pinned = |alias: &str| runner.registry().entry(alias).ok()?.sha256.clone();
    let model = pinned(&p.model)?;
    let reference = match &case.reference {
        Some((r, _)) => format!("{r}={}", pinned(r)?),
        None => String::new(),
    };
    Some(crate::core::fsutil::sha256_bytes(
        format!(
            "{exe}|{}|{}|{}={model}|{reference}|{}|{}",
            case.name,
            case.content_sha256,
            p.model,
            runner.engine().identity(),
            runner.threads
        )
        .as_bytes(),
    ))
}

/// The trial's outcome: from the result cache when a complete run of the
/// same inputs is recorded there (after checking the model files still
/// match their pins), else run and, unless it errored, recorded.
fn outcome_of(runner: &RunContext, p: &Planned, goldens: &Goldens) -> Outcome {
    let Some(key) = result_key(runner, p) else {
        return crate::judge::trial(runner, p, &goldens.dir);
    };
    let path = crate::models::cache_dir()
        .join("results")
        .join(format!("{key}.json"));
    let cached = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<Outcome>(&t).ok())
        .filter(|o| o.case == split_test_name(&p.name).0 && o.model == p.model);
    if let Some(o) = cached {
        // A changed input is never answered from the cache: it runs (and
        // reports the mismatch).
        let verified = p
            .case
            .as_ref()
            .is_ok_and(|c| runner.verify_inputs(&c.case, &p.model).is_ok());
        if verified {
            eprintln!(
                "quantgate: {}: result from the result cache ({})",
                p.name,
                path.display()
            );
            return o;
        }
    }
    let o = crate::judge::trial(runner, p, &goldens.dir);
    if o.status != Status::Error {
        if let Ok(json) = serde_json::to_string(&o) {
            // Best effort: a result that cannot be cached is still a result.
            let _ = crate::core::fsutil::write_atomic(&path, json.as_bytes());
        }
    }
    o
}

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
fn trial_result(
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

    /// After libtest's own summary: failures and errors apart.
    fn print(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let (f, e) = (self.failed.load(Relaxed), self.errors.load(Relaxed));
        if f + e > 0 {
            println!(
                "quantgate: {f} failed (a gate or a golden), {e} errors (a case that could not run, or a worker that died)"
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
