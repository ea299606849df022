//! Worker processes: a group of trials that share a decode (or, with
//! `QUANTGATE_ISOLATION=model`, each of a model's groups in turn) run in a
//! child process — this executable re-run with `QUANTGATE_WORKER=<alias>` —
//! the job (the trials to run, the trials whose reference work to do) as one
//! JSON line on its stdin, a result line per trial on its stdout, then a
//! done line. A worker that dies (llama.cpp aborts on some inputs) fails the
//! tests of its job with the signal, the model, its file and the case.

use crate::engine::Engine;
use crate::execute::{threads_per_trial, RunContext};
use crate::golden::{self, Goldens};
use crate::harness::trial::{group_verdicts, Verdict};
use crate::plan::plan;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::Arc;

/// The environment variable that makes this executable a worker.
pub const WORKER_ENV: &str = "QUANTGATE_WORKER";
/// Prefix of a worker's result lines (anything else on stdout is ignored).
const RESULT: &str = "QUANTGATE-RESULT ";
/// The line that ends a job's answer.
const DONE: &str = "QUANTGATE-DONE";

/// One job: trials run together, and trials whose reference work is done
/// in the same decode.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Job {
    /// Test names to run (one result line each).
    pub run: Vec<String>,
    /// Test names whose reference products to build.
    pub provide: Vec<String>,
}

/// Worker mode: run the jobs that arrive on stdin; answer each trial with a
/// result line, each job with a done line.
pub fn worker(suites: &Path, goldens: &Path, engine: Arc<dyn Engine>, alias: &str) -> ExitCode {
    // The whole plan: a job may do reference work for other models' trials.
    let (registry, planned) = match plan(suites, &[], &[]) {
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
        let Ok(line) = line else { break };
        let job: Job = match serde_json::from_str(&line) {
            Ok(j) => j,
            Err(e) => {
                eprintln!("quantgate worker `{alias}`: unreadable job `{line}`: {e}");
                return ExitCode::from(2);
            }
        };
        let find = |n: &String| planned.iter().find(|p| p.name == *n);
        let provide: Vec<_> = job.provide.iter().filter_map(find).collect();
        let (known, unknown): (Vec<&String>, Vec<&String>) =
            job.run.iter().partition(|n| find(n).is_some());
        let group: Vec<_> = known.iter().filter_map(|n| find(n)).collect();
        let mut replies: Vec<(String, Verdict)> = known
            .iter()
            .map(|n| n.to_string())
            .zip(group_verdicts(&runner, &group, &provide, &goldens, mode))
            .collect();
        for n in unknown {
            replies.push((
                n.clone(),
                (
                    Err(format!("worker `{alias}`: no planned test `{n}`")),
                    true,
                ),
            ));
        }
        for (name, (result, errored)) in replies {
            let reply =
                serde_json::json!({ "name": name, "error": result.err(), "errored": errored });
            if writeln!(out, "{RESULT}{reply}").is_err() {
                return ExitCode::SUCCESS;
            }
        }
        if writeln!(out, "{DONE}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    ExitCode::SUCCESS
}

/// One worker process, started on first use.
pub struct Worker {
    alias: String,
    model_path: String,
    proc: Option<(Child, ChildStdin, BufReader<ChildStdout>)>,
    /// Why the worker is gone, once it died.
    dead: Option<String>,
}

impl Worker {
    /// A worker for model `alias` (its file `model_path`, for messages),
    /// started on first use.
    pub fn new(alias: &str, model_path: String) -> Self {
        Worker {
            alias: alias.to_string(),
            model_path,
            proc: None,
            dead: None,
        }
    }

    /// Whether the process died (it is not started again).
    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Run `job`: a verdict per trial of `job.run`, by name (a dead worker's
    /// are errors).
    pub fn run(&mut self, job: &Job, threads: u32) -> Vec<(String, Verdict)> {
        let mut answered: Vec<(String, Verdict)> = Vec::new();
        if let Err(why) = self.run_inner(job, threads, &mut answered) {
            let left: Vec<&String> = job
                .run
                .iter()
                .filter(|n| !answered.iter().any(|(a, _)| a == *n))
                .collect();
            for name in left {
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
                answered.push((
                    name.clone(),
                    (Err(why.replace("{name}", &format!("`{name}`{with}"))), true),
                ));
            }
        }
        answered
    }

    /// Answers go into `answered`; an Err is why the rest were not
    /// answered, with `{name}` where the unanswered trial's name goes.
    fn run_inner(
        &mut self,
        job: &Job,
        threads: u32,
        answered: &mut Vec<(String, Verdict)>,
    ) -> Result<(), String> {
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
        let line = serde_json::to_string(job).expect("a job serialises");
        let sent = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
        let mut line = String::new();
        loop {
            line.clear();
            let n = if sent.is_ok() {
                stdout.read_line(&mut line).unwrap_or(0)
            } else {
                0
            };
            if n == 0 {
                // The worker is gone: say how, and fail the rest of its work.
                let status = child.wait().map(|s| describe_exit(&s));
                let why = format!(
                    "the worker process for model `{}` ({}) {}",
                    self.alias,
                    self.model_path,
                    status.unwrap_or_else(|e| format!("could not be waited for ({e})"))
                );
                let first = job
                    .run
                    .iter()
                    .find(|n| !answered.iter().any(|(a, _)| a == *n))
                    .map(|n| format!("`{n}`"))
                    .unwrap_or_else(|| format!("the reference work of {}", job.provide.join(", ")));
                self.proc = None;
                self.dead = Some(format!("{why} while running {first}"));
                return Err(format!(
                    "{why} while running {{name}}; the tests left on this worker are not run, the other tests still run"
                ));
            }
            let line = line.trim_end();
            if line == DONE {
                return Ok(());
            }
            if let Some(json) = line.strip_prefix(RESULT) {
                let v: serde_json::Value = serde_json::from_str(json)
                    .map_err(|e| format!("unreadable worker result `{json}`: {e}"))?;
                let Some(name) = v["name"]
                    .as_str()
                    .filter(|n| job.run.iter().any(|r| r == n))
                else {
                    return Err(format!(
                        "worker answered for {} instead of {{name}}",
                        v["name"]
                    ));
                };
                let errored = v["errored"].as_bool() != Some(false);
                let verdict = match v["error"].as_str() {
                    None if v["error"].is_null() => (Ok(()), errored),
                    None => return Err(format!("unreadable worker result `{json}`")),
                    Some(m) => (Err(m.to_string()), errored),
                };
                answered.push((name.to_string(), verdict));
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
