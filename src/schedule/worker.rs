//! Where a group of trials runs: in this process, or in a worker process
//! (this executable run again with `QUANTGATE_WORKER=<alias>`), so that a
//! llama.cpp abort (GGML_ASSERT) fails only the trials of its job. Both
//! `quantgate run` and the `cargo test` harness run groups through an
//! [`Executor`](super::executor::Executor); a worker answers with whole outcomes, the same a group run
//! in this process gives.
//!
//! Protocol: the parent starts the worker with the selection to plan
//! (`QUANTGATE_WORKER_PLAN`, JSON: suites, goldens, patterns, models,
//! overrides) and the engine options in its environment; each job (the
//! trials to run, the trials whose reference work to do, whether the
//! result cache is used, where to write rows) is one JSON line on its
//! stdin; the answer is a result line per trial, a work line, then a done
//! line on its stdout. Its stderr passes through, its last lines kept: a
//! worker that dies fails the trials of its job with the signal, the model,
//! its file, the case and llama.cpp's last words.

use super::GroupRun;
use crate::core::outcome::split_test_name;
use crate::core::{Decision, EngineBuild, Outcome, Status};
use crate::engine::Engine;
use crate::execute::{threads_per_trial, RunContext};
use crate::plan::parse::Overrides;
use crate::plan::Planned;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};

/// Why a worker answered no more of a job, with `{name}` where the name of
/// the trial it did not answer goes.
#[derive(Debug, Clone, thiserror::Error)]
enum WorkerError {
    /// It could not be started.
    #[error("{0}")]
    Start(String),
    /// It died (how, and its last words), now or before this job.
    #[error("{0}")]
    Died(String),
    /// It wrote a line that is not the protocol.
    #[error("{0}")]
    Protocol(String),
}

/// The environment variable that makes an executable a worker.
pub const WORKER_ENV: &str = "QUANTGATE_WORKER";
/// The selection a worker plans (JSON [`Selection`]).
const PLAN_ENV: &str = "QUANTGATE_WORKER_PLAN";
/// Prefix of a worker's result lines (anything else on stdout is ignored).
const RESULT: &str = "QUANTGATE-RESULT ";
/// Prefix of the line with a job's reference work.
const WORK: &str = "QUANTGATE-WORK ";
/// The line that ends a job's answer.
const DONE: &str = "QUANTGATE-DONE";
/// How many of a worker's last stderr lines a death report quotes.
const LAST_WORDS: usize = 6;
/// How many of a worker's last stderr bytes are kept for that.
const LAST_BYTES: usize = 4096;

/// What a process plans: the same tests in the parent and its workers.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Selection {
    /// The suites directory.
    pub suites: PathBuf,
    /// The goldens directory.
    pub goldens: PathBuf,
    /// Case patterns (empty: every case).
    pub patterns: Vec<String>,
    /// Model filter.
    pub models: Vec<String>,
    /// The command line's models and reference, resolved to aliases.
    pub overrides: Overrides,
}

impl Selection {
    /// The plan of this selection.
    pub(crate) fn plan(&self) -> crate::core::Result<(crate::models::Registry, Vec<Planned>)> {
        crate::plan::plan_with(&self.suites, &self.patterns, &self.models, &self.overrides)
    }
}

/// One job: trials run together, trials whose reference work is done in
/// the same decode, and what is done with their outcomes.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Job {
    /// Test names to run (one result line each).
    pub run: Vec<String>,
    /// Test names whose reference products to build.
    pub provide: Vec<String>,
    /// Read and write the result cache.
    pub cache: bool,
    /// Write each outcome's Parquet rows (and plots) under this folder.
    pub rows: Option<PathBuf>,
    /// Write each outcome's JSON under this folder (a shard's outcomes).
    pub outcomes: Option<PathBuf>,
}

/// A trial's outcome as a worker sends it: the outcome's JSON leaves out
/// what only this process needs, so those fields travel beside it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Reply {
    name: String,
    outcome: Outcome,
    input_error: bool,
    headline: Vec<String>,
    notes: Vec<String>,
    prereg: Option<Decision>,
    unwritten: Vec<String>,
}

/// Run a group in this process: the trials, then their files.
pub(crate) fn run_here(
    cx: &RunContext,
    group: &[&Planned],
    provides: &[&Planned],
    goldens: &Path,
    job: &Job,
) -> GroupRun {
    let (outcomes, work) = super::trials(cx, group, provides, goldens, job.cache);
    let outcomes = outcomes
        .into_iter()
        .map(|o| {
            let mut unwritten = Vec::new();
            if let Some(dir) = &job.rows {
                if let Err(e) = crate::report::write_parquet(dir, &o) {
                    unwritten.push(e.message);
                }
            }
            if let Some(dir) = &job.outcomes {
                if let Err(e) =
                    crate::report::write_outcome_json(dir, &o, cx.config().signing_key())
                {
                    unwritten.push(e.message);
                }
            }
            (o, unwritten)
        })
        .collect();
    GroupRun { outcomes, work }
}

/// The variable that tells a worker its parent's process id.
const PARENT_ENV: &str = "QUANTGATE_WORKER_PARENT";

/// A worker dies with its parent: a thread checks every 100 ms that the
/// process that started it (its pid in [`PARENT_ENV`]) is still its
/// parent, and ends the process at once when it is not (the parent was
/// killed: nobody reads what the worker would write, and a decode left
/// running would hold the cores and write to the cache for seconds). What
/// it was writing stays a temp file (never under a final name), which the
/// next run sweeps.
fn watch_parent() {
    #[cfg(unix)]
    {
        let Some(parent) = std::env::var(PARENT_ENV)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            return;
        };
        std::thread::spawn(move || loop {
            // Nothing is said: the parent read this worker's stderr, and a
            // write to a pipe nobody reads fails (eprintln! would panic).
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(3);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        });
    }
}

/// Worker mode: plan what the parent planned (its selection, else
/// `fallback`'s suites), then run the jobs that arrive on stdin, answering
/// each trial with a result line and each job with a work and a done line.
pub fn serve(fallback: &Selection, engine: Arc<dyn Engine>, alias: &str) -> ExitCode {
    let said = |why: String| {
        eprintln!("quantgate worker `{alias}`: {why}");
        ExitCode::from(2)
    };
    let selection = match std::env::var(PLAN_ENV) {
        Ok(json) => match serde_json::from_str::<Selection>(&json) {
            Ok(s) => s,
            Err(e) => return said(format!("{PLAN_ENV}: {e}")),
        },
        Err(_) => fallback.clone(),
    };
    watch_parent();
    // The parent's config (its environment, engine flags included).
    let config = match crate::core::config::Config::from_env([None, None, None]) {
        Ok(c) => c,
        Err(e) => return said(e.message),
    };
    crate::core::progress::set_parent_terminal(config.parent_terminal);
    crate::core::progress::set_forward(config.progress_board);

    // The whole plan: a job may do reference work for other models' trials.
    let (registry, planned) = match selection.plan() {
        Ok(p) => p,
        Err(e) => return said(e.message),
    };
    let threads = std::env::var("QUANTGATE_WORKER_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| threads_per_trial(1));
    let runner = RunContext::new(&config, registry, engine, threads);
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let job: Job = match serde_json::from_str(&line) {
            Ok(j) => j,
            Err(e) => return said(format!("unreadable job `{line}`: {e}")),
        };
        let find = |n: &String| planned.iter().find(|p| p.name == *n);
        let provide: Vec<_> = job.provide.iter().filter_map(find).collect();
        let group: Vec<_> = job.run.iter().filter_map(find).collect();
        if group.len() != job.run.len() {
            let unknown: Vec<&String> = job.run.iter().filter(|n| find(n).is_none()).collect();
            return said(format!("no planned test {unknown:?}"));
        }
        let ran = run_here(&runner, &group, &provide, &selection.goldens, &job);
        for (name, (o, unwritten)) in job.run.iter().zip(ran.outcomes) {
            let reply = Reply {
                name: name.clone(),
                input_error: o.input_error,
                headline: o.headline.clone(),
                notes: o.notes.clone(),
                prereg: o.prereg.clone(),
                outcome: o,
                unwritten,
            };
            let line = serde_json::to_string(&reply).expect("an outcome serialises");
            if writeln!(out, "{RESULT}{line}").is_err() {
                return ExitCode::SUCCESS;
            }
        }
        let work = serde_json::to_string(&ran.work).expect("work serialises");
        if writeln!(out, "{WORK}{work}\n{DONE}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    ExitCode::SUCCESS
}

/// A running worker: its pipes and the reader that keeps its last words.
struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: Option<std::thread::JoinHandle<()>>,
}

/// One worker process, started on first use.
pub(crate) struct Worker {
    alias: String,
    model_path: String,
    selection: Arc<Selection>,
    build: EngineBuild,
    /// The variables it is started with: the parent's config
    /// ([`crate::core::config::Config::to_env`]) and engine options.
    env: Vec<(&'static str, String)>,
    /// The key the outcomes it could not answer are signed with.
    signing_key: Option<crate::core::auth::Key>,
    proc: Option<Process>,
    /// The worker's last stderr bytes.
    last_words: Arc<Mutex<VecDeque<u8>>>,
    /// Why the worker is gone, once it died.
    dead: Option<String>,
}

impl Worker {
    /// A worker for model `alias` (its file `model_path`, for messages)
    /// that plans `selection`, started on first use; `build` is the engine
    /// build its error outcomes name.
    pub(crate) fn new(
        alias: &str,
        model_path: String,
        selection: Arc<Selection>,
        build: EngineBuild,
        env: Vec<(&'static str, String)>,
        signing_key: Option<crate::core::auth::Key>,
    ) -> Self {
        Worker {
            alias: alias.to_string(),
            model_path,
            selection,
            build,
            env,
            signing_key,
            proc: None,
            last_words: Arc::default(),
            dead: None,
        }
    }

    /// Whether the process died (it is not started again).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Run `job`: an outcome per trial of `job.run`, in order (a dead
    /// worker's are errors that say why).
    pub(crate) fn run(&mut self, job: &Job, threads: u32) -> GroupRun {
        let mut ran = GroupRun::default();
        if let Err(why) = self.run_inner(job, threads, &mut ran) {
            let why = why.to_string();
            let answered = ran.outcomes.len();
            // Reference work alone has no trial to carry the death: it is
            // said as failed work (the trials that need it then build it
            // themselves, or fail saying why).
            if answered >= job.run.len() && !job.provide.is_empty() {
                ran.work.failed.push(why.replace(
                    "{name}",
                    &format!("the reference work of {}", job.provide.join(", ")),
                ));
            }
            // The tests it did not answer are errors that say why, written
            // where the worker would have written them (a shard's outcomes:
            // `merge` then names the death, not a missing test).
            for (o, mut unwritten) in unanswered(job, answered, &self.build, &why) {
                if let Some(dir) = &job.outcomes {
                    if let Err(e) =
                        crate::report::write_outcome_json(dir, &o, self.signing_key.as_ref())
                    {
                        unwritten.push(e.message);
                    }
                }
                ran.outcomes.push((o, unwritten));
            }
        }
        ran
    }

    fn start(&mut self, threads: u32) -> Result<(), WorkerError> {
        // The running build itself, even if its file was rebuilt or
        // removed since it started (named as it was started, for `ps`).
        let exe = crate::core::fsutil::running_exe()
            .map_err(|e| WorkerError::Start(format!("current_exe: {e}")))?;
        let plan = serde_json::to_string(&*self.selection).expect("a selection serialises");
        let mut cmd = Command::new(exe);
        #[cfg(unix)]
        if let Ok(named) = std::env::current_exe() {
            std::os::unix::process::CommandExt::arg0(&mut cmd, named);
        }
        cmd.env(WORKER_ENV, &self.alias)
            .env(PLAN_ENV, plan)
            .env("QUANTGATE_WORKER_THREADS", threads.to_string())
            .env(PARENT_ENV, std::process::id().to_string())
            .envs(self.env.iter().cloned())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A parent with a board draws the worker's bars itself (sent on
        // the worker's stdout); else a worker on a terminal draws its own.
        if crate::core::progress::board_is_open() {
            cmd.env(crate::core::progress::TERMINAL_ENV, "board");
        } else if crate::core::progress::stderr_is_terminal() {
            cmd.env(crate::core::progress::TERMINAL_ENV, "1");
        }
        let mut child = cmd.spawn().map_err(|e| {
            WorkerError::Start(format!("starting the worker for `{}`: {e}", self.alias))
        })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let stderr = child.stderr.take().expect("piped stderr");
        let last = self.last_words.clone();
        // Its stderr passes through as it comes (progress bars redraw in
        // place); its last bytes are kept for a death report.
        let reader = std::thread::spawn(move || {
            let mut stderr = stderr;
            let mut buf = [0u8; 8192];
            loop {
                let n = match std::io::Read::read(&mut stderr, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut out = std::io::stderr().lock();
                let _ = out.write_all(&buf[..n]).and_then(|()| out.flush());
                let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
                l.extend(&buf[..n]);
                let extra = l.len().saturating_sub(LAST_BYTES);
                l.drain(..extra);
            }
        });
        self.proc = Some(Process {
            child,
            stdin,
            stdout,
            stderr: Some(reader),
        });
        Ok(())
    }

    /// Answers go into `ran`; an Err is why the rest were not answered,
    /// with `{name}` where the unanswered trial's name goes.
    fn run_inner(
        &mut self,
        job: &Job,
        threads: u32,
        ran: &mut GroupRun,
    ) -> Result<(), WorkerError> {
        if let Some(why) = &self.dead {
            return Err(WorkerError::Died(format!("not run: {why}")));
        }
        if self.proc.is_none() {
            self.start(threads)?;
        }
        let p = self.proc.as_mut().expect("started above");
        let line = serde_json::to_string(job).expect("a job serialises");
        let sent = writeln!(p.stdin, "{line}").and_then(|()| p.stdin.flush());
        let mut line = String::new();
        loop {
            line.clear();
            let n = if sent.is_ok() {
                p.stdout.read_line(&mut line).unwrap_or(0)
            } else {
                0
            };
            if n == 0 {
                return Err(WorkerError::Died(self.died(job, ran)));
            }
            let line = line.trim_end();
            if line == DONE {
                return Ok(());
            }
            if let Some(rest) = line.strip_prefix(crate::core::progress::PROGRESS) {
                crate::core::progress::board_remote(p.child.id(), rest);
            } else if let Some(json) = line.strip_prefix(WORK) {
                ran.work = serde_json::from_str(json).map_err(|e| {
                    WorkerError::Protocol(format!("unreadable worker work line `{json}`: {e}"))
                })?;
            } else if let Some(json) = line.strip_prefix(RESULT) {
                let r: Reply = serde_json::from_str(json)
                    .map_err(|e| WorkerError::Protocol(format!("unreadable worker result: {e}")))?;
                if job.run.get(ran.outcomes.len()) != Some(&r.name) {
                    return Err(WorkerError::Protocol(format!(
                        "worker answered for `{}` instead of {{name}}",
                        r.name
                    )));
                }
                let mut o = r.outcome;
                o.input_error = r.input_error;
                o.headline = r.headline;
                o.notes = r.notes;
                o.prereg = r.prereg;
                ran.outcomes.push((o, r.unwritten));
            }
        }
    }

    /// The worker is gone: how, and its last words; it runs nothing more.
    fn died(&mut self, job: &Job, ran: &GroupRun) -> String {
        let mut p = self.proc.take().expect("a process that died");
        let status = p.child.wait().map(|s| describe_exit(&s));
        if let Some(reader) = p.stderr.take() {
            let _ = reader.join();
        }
        let why = format!(
            "the worker process for model `{}` ({}) {}",
            self.alias,
            self.model_path,
            status.unwrap_or_else(|e| format!("could not be waited for ({e})"))
        );
        let first = job
            .run
            .get(ran.outcomes.len())
            .map(|n| format!("`{n}`"))
            .unwrap_or_else(|| format!("the reference work of {}", job.provide.join(", ")));
        let tail: Vec<u8> = self
            .last_words
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        // Its last lines, each as a terminal would leave it (a progress
        // bar's redraws collapsed to the last one), blank ones left out.
        let text = without_escapes(&String::from_utf8_lossy(&tail));
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.rsplit('\r').next().unwrap_or(l).trim_end())
            .filter(|l| !l.is_empty())
            .collect();
        let words = &lines[lines.len().saturating_sub(LAST_WORDS)..];
        let last = if words.is_empty() {
            String::new()
        } else {
            format!("; its last words:\n    {}", words.join("\n    "))
        };
        self.dead = Some(format!("{why} while running {first}"));
        format!(
            "{why} while running {{name}}; the tests left on this worker are not run, the other \
             tests still run{last}"
        )
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            drop(p.stdin); // EOF: the worker finishes and exits
            let _ = p.child.wait();
            if let Some(reader) = p.stderr.take() {
                let _ = reader.join();
            }
        }
    }
}

/// Error outcomes for the trials of `job` from the `from`-th on, none of
/// which ran to an outcome: `why`, with `{name}` where the trial's name
/// goes (and the trials it shared its decode with).
pub(super) fn unanswered(
    job: &Job,
    from: usize,
    build: &EngineBuild,
    why: &str,
) -> Vec<(Outcome, Vec<String>)> {
    job.run
        .iter()
        .skip(from)
        .map(|name| {
            let with = if job.run.len() > 1 {
                format!(
                    " (one decode with {})",
                    job.run
                        .iter()
                        .filter(|m| *m != name)
                        .map(|m| format!("`{m}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                String::new()
            };
            let (case, model) = split_test_name(name);
            let mut o = Outcome::new(case, model, build.clone());
            o.status = Status::Error;
            o.error = Some(why.replace("{name}", &format!("`{name}`{with}")));
            (o, Vec::new())
        })
        .collect()
}

/// `s` without ANSI control sequences (a passed-on progress bar's cursor
/// moves): `ESC [` parameters and one final letter.
fn without_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::without_escapes;

    #[test]
    fn a_bars_control_sequences_leave_the_last_words() {
        let s = "\r\x1b[2K  scoring [==>   ] 3/9\x1b[1A\nGGML_ASSERT(x) failed\n";
        assert_eq!(
            without_escapes(s),
            "\r  scoring [==>   ] 3/9\nGGML_ASSERT(x) failed\n"
        );
    }
}
