//! Worker processes: each trial (or each model's trials) in a child process
//! — this executable re-run with `QUANTGATE_WORKER=<alias>` — the test name
//! on its stdin, the result as one line on its stdout. A worker that dies
//! (llama.cpp aborts on some inputs) fails its test with the signal, the
//! model, its file and the case.

use crate::engine::Engine;
use crate::execute::{threads_per_trial, RunContext};
use crate::golden::{self, Goldens};
use crate::harness::trial::trial_result;
use crate::plan::plan;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::Arc;

/// The environment variable that makes this executable a worker.
pub const WORKER_ENV: &str = "QUANTGATE_WORKER";
/// Prefix of a worker's result lines (anything else on stdout is ignored).
const RESULT: &str = "QUANTGATE-RESULT ";

/// Worker mode: run the named trials of model `alias` as they arrive on
/// stdin; answer each with a result line.
pub fn worker(suites: &Path, goldens: &Path, engine: Arc<dyn Engine>, alias: &str) -> ExitCode {
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
pub struct Worker {
    alias: String,
    model_path: String,
    proc: Option<(Child, ChildStdin, BufReader<ChildStdout>)>,
    /// Why the worker is gone, once it died.
    dead: Option<String>,
}

impl Worker {
    /// The worker of model `alias` (its file `model_path`, for messages),
    /// started on first use.
    pub fn new(alias: &str, model_path: String) -> Self {
        Worker {
            alias: alias.to_string(),
            model_path,
            proc: None,
            dead: None,
        }
    }
}

impl Worker {
    /// The trial's result, and whether it errored (a dead worker does).
    pub fn run(&mut self, name: &str, threads: u32) -> (Result<(), String>, bool) {
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
