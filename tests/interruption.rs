//! Interruptions and write failures never leave a half-written file under a
//! final name, and never lose a previous one:
//! - SIGINT and SIGKILL to a whole `cargo test`-style run (harness and its
//!   workers) in the middle of rewriting goldens: every golden is whole
//!   afterwards, the old one or the new one; temp files of dead processes
//!   are removed by the next run;
//! - a reference-cache or Parquet write that hits the file-size limit
//!   (`ulimit -f`: EFBIG, as a full disk gives ENOSPC): an error naming the
//!   file, no file, no temp file.
//!
//! - a run killed mid-way resumes from the result cache: completed trials
//!   are taken from it, the rest run; a changed input never is.
//!
//! One executable, several roles (`QG_ROLE`): the libtest-mimic tests, the
//! quantgate harness under test, its workers, and the Parquet writer.

mod common;

use libtest_mimic::{Arguments, Failed, Trial};
use quantgate::engine::fake::{FakeEngine, FakeSpec};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

fn engine() -> FakeEngine {
    let confidence: f32 = std::env::var("QG_CONFIDENCE")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(4.0);
    let sleep_ms = std::env::var("QG_SLEEP_MS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(60);
    let spec = FakeSpec {
        confidence,
        sleep_ms,
        ..FakeSpec::default()
    };
    FakeEngine::new()
        .with("m1", spec.clone())
        .with("m2", spec.clone())
        .with("ref", FakeSpec::default())
}

const N_CASES: usize = 6;

fn fixture(tag: &str) -> PathBuf {
    let root = common::fake_root(
        &format!("interrupt-{tag}"),
        &[("m1", 100), ("m2", 101), ("ref", 102)],
    );
    let text: String = (0..400)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    std::fs::write(root.join("suites/t.txt"), &text).unwrap();
    let sha = quantgate::core::fsutil::sha256_bytes(text.as_bytes());
    for c in 0..N_CASES {
        std::fs::write(
            root.join(format!("suites/c{c}.toml")),
            format!(
                "kind = \"perplexity\"\nmodels = [\"m1\", \"m2\"]\n[text]\npath = \"t.txt\"\nsha256 = \"{sha}\"\n\
                 [window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = {}\n",
                2 + c % 3
            ),
        )
        .unwrap();
    }
    root
}

/// The harness role on `root`, in its own process group.
fn harness(root: &Path, confidence: &str, update: &str) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.env("QG_ROLE", "harness")
        .env("QG_ROOT", root)
        .env("QG_CONFIDENCE", confidence)
        .env("QUANTGATE_UPDATE", update)
        .env("QUANTGATE_CACHE", common::fixture_cache(root))
        .env_remove("CI")
        .env_remove("NEXTEST")
        .env_remove("QUANTGATE_ISOLATION")
        // This harness tests the result cache: on, whatever the caller's setting.
        .env_remove("QUANTGATE_RESULT_CACHE")
        .args(["--test-threads", "2", "--color", "never"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    c
}

fn fail(msg: String) -> Failed {
    Failed::from(msg)
}

fn interrupted_runs_leave_every_golden_whole() -> Result<(), Failed> {
    let root = fixture("signals");
    let goldens = root.join("goldens");
    // A complete first run records the goldens.
    let st = harness(&root, "4.0", "always").status().unwrap();
    if !st.success() {
        return Err(fail(format!("first run failed: {st}")));
    }
    let old = common::tree(&goldens);
    if old.len() != 2 * N_CASES {
        return Err(fail(format!("{} goldens, want {}", old.len(), 2 * N_CASES)));
    }
    // Runs that would rewrite every golden (another model behaviour), cut
    // by SIGINT then by SIGKILL to the whole process group mid-way.
    for (signal, after_ms) in [("-INT", 500), ("-KILL", 900), ("-INT", 1300)] {
        let mut child = harness(&root, "2.5", "always").spawn().unwrap();
        std::thread::sleep(Duration::from_millis(after_ms));
        let pgid = child.id();
        Command::new("kill")
            .args([signal, "--", &format!("-{pgid}")])
            .status()
            .unwrap();
        let _ = child.wait();
        // Workers of a killed harness see their stdin close and exit.
        std::thread::sleep(Duration::from_millis(300));
        for (path, bytes) in common::tree(&goldens) {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.contains(".quantgate-tmp-") {
                continue; // a temp file of a killed writer: never a golden
            }
            let text = String::from_utf8(bytes.clone())
                .map_err(|_| fail(format!("{}: not UTF-8 after {signal}", path.display())))?;
            quantgate::golden::parse(&text).map_err(|e| {
                fail(format!(
                    "{}: half-written after {signal}: {e}",
                    path.display()
                ))
            })?;
            if !name.ends_with(".snap") {
                return Err(fail(format!("unexpected file {}", path.display())));
            }
        }
    }
    // A stale temp file of a process that is gone, as SIGKILL mid-write
    // leaves; the next run removes it (and any real one).
    let stale = goldens.join(format!(
        "c0/{}AbCdEf",
        quantgate::core::fsutil::temp_prefix("m1.snap", 999_999_999)
    ));
    std::fs::write(&stale, "half").unwrap();
    // Its writer is long gone (and holds no lock), as is a killed writer's
    // own temp file (when a kill landed mid-write). A temp file is swept
    // only once it is over a minute old (a younger one may be a writer
    // between creating and locking it): let that minute pass for all.
    for (p, _) in common::tree(&goldens) {
        if p.to_string_lossy().contains(".quantgate-tmp-") {
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
                .unwrap();
        }
    }
    let st = harness(&root, "4.0", "always").status().unwrap();
    if !st.success() {
        return Err(fail(format!(
            "the run after the interruptions failed: {st}"
        )));
    }
    let after = common::tree(&goldens);
    if let Some((p, _)) = after
        .iter()
        .find(|(p, _)| p.to_string_lossy().contains(".quantgate-tmp-"))
    {
        return Err(fail(format!("stale temp file left: {}", p.display())));
    }
    // Back on the first behaviour, the goldens are byte for byte the first run's.
    if after != old {
        return Err(fail("goldens differ from the first complete run".into()));
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

fn writes_hitting_the_size_limit_leave_nothing() -> Result<(), Failed> {
    let root = fixture("fsize");
    // `ulimit -f 4`: files may not grow past 4 KiB; SIGXFSZ ignored, so a
    // write fails with EFBIG instead of killing the process.
    let run = |limited: bool, skip_parquet: bool| {
        let mut c = Command::new("bash");
        let script = if limited {
            "ulimit -f 4; trap '' XFSZ; exec \"$0\""
        } else {
            "exec \"$0\""
        };
        c.args([
            "-c",
            script,
            &std::env::current_exe().unwrap().display().to_string(),
        ])
        .env("QG_ROLE", "parquet")
        .env("QG_ROOT", &root);
        if skip_parquet {
            c.env("QG_SKIP_WRITE", "1");
        }
        let out = c.output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    // No file but the (empty) lock files that coordinate writers.
    let no_files = |dir: &str, log: &str| -> Result<(), Failed> {
        let mut left = common::tree(&root.join(dir));
        left.retain(|(p, body)| {
            !(p.parent().is_some_and(|d| d.ends_with("locks")) && body.is_empty())
        });
        if left.is_empty() {
            Ok(())
        } else {
            Err(fail(format!(
                "files left in {dir} after a failed write: {:?}\n{log}",
                left.iter().map(|(p, _)| p).collect::<Vec<_>>()
            )))
        }
    };
    // 1. The reference cache cannot be written: the case errors, naming it.
    let log = run(true, false);
    if !log.contains("case failed") || !log.contains(".qgref") || !log.contains("File too large") {
        return Err(fail(format!(
            "the cache write must fail naming the file:\n{log}"
        )));
    }
    no_files("cache", &log)?;
    no_files("out", &log)?;
    // 2. With the cache built, the Parquet file cannot be written.
    let log = run(false, true);
    if !log.contains("skipped the write") {
        return Err(fail(format!("warming the cache failed:\n{log}")));
    }
    let log = run(true, false);
    if !log.contains("write failed:") || !log.contains("m1.parquet") {
        return Err(fail(format!(
            "the Parquet write must fail naming the file:\n{log}"
        )));
    }
    no_files("out", &log)?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// How many results the result cache under `root` holds.
fn results_recorded(root: &Path) -> usize {
    common::tree(&common::fixture_cache(root).join("results"))
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "qgresult"))
        .count()
}

fn a_killed_run_resumes_from_the_result_cache() -> Result<(), Failed> {
    let root = fixture("resume");
    let count = || results_recorded(&root);
    let mut child = harness(&root, "4.0", "always").spawn().unwrap();
    // Kill it once two results are recorded (polling: machines differ).
    let start = std::time::Instant::now();
    while count() < 2 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status()
        .unwrap();
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(300));
    let done = count();
    if done == 0 || done >= 2 * N_CASES {
        return Err(fail(format!(
            "{done} results recorded before the kill: not mid-run"
        )));
    }
    let resume = |what: &str| -> Result<usize, Failed> {
        let out = harness(&root, "4.0", "always")
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(fail(format!("{what} failed:\n{log}")));
        }
        Ok(log.matches("result from the result cache").count())
    };
    // The rerun takes every recorded result and runs only the rest.
    let reused = resume("the resumed run")?;
    if reused != done {
        return Err(fail(format!(
            "resumed {reused} results, {done} were recorded"
        )));
    }
    if count() != 2 * N_CASES || resume("a third run")? != 2 * N_CASES {
        return Err(fail("a complete run is recorded whole".into()));
    }
    // A changed input is never answered from the cache: the text no longer
    // matches its pin, so every case errors.
    let text = root.join("suites/t.txt");
    let mut t = std::fs::read_to_string(&text).unwrap();
    t.push('!');
    std::fs::write(&text, t).unwrap();
    let out = harness(&root, "4.0", "always")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || log.contains("result from the result cache") {
        return Err(fail(format!(
            "a changed text must not pass from the cache:\n{log}"
        )));
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// Processes of process group `pgid` still alive (zombies left out).
fn group_members(pgid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`: comm may hold spaces.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 3 && f[0] != "Z" && f[2] == pgid.to_string() {
            out.push(pid);
        }
    }
    out
}

/// Workers die with their parent: the harness alone killed (SIGKILL, its
/// workers not signalled) leaves no worker decoding or writing results
/// after a second; the next run sweeps what they left half-written and
/// completes.
fn workers_die_with_their_parent() -> Result<(), Failed> {
    let root = fixture("orphans");
    let count = || results_recorded(&root);
    // Slow windows: a group decodes for seconds, as a real model's does.
    let mut child = harness(&root, "4.0", "always")
        .env("QG_SLEEP_MS", "1500")
        .spawn()
        .unwrap();
    let pgid = child.id();
    let start = std::time::Instant::now();
    while group_members(pgid).len() < 2 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Mid-decode: the workers have loaded and started their first windows.
    std::thread::sleep(Duration::from_millis(800));
    let workers = group_members(pgid).len() - 1;
    if workers == 0 {
        let _ = child.kill();
        let _ = child.wait();
        return Err(fail("no worker process was started".into()));
    }
    Command::new("kill")
        .args(["-KILL", &pgid.to_string()])
        .status()
        .unwrap();
    let _ = child.wait();
    let killed = std::time::Instant::now();
    while !group_members(pgid).is_empty() && killed.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone_after = killed.elapsed();
    let left = group_members(pgid);
    if !left.is_empty() {
        return Err(fail(format!(
            "{} of {workers} workers still running 5 s after their parent was killed: {left:?}",
            left.len()
        )));
    }
    if gone_after > Duration::from_secs(1) {
        return Err(fail(format!(
            "the workers took {gone_after:?} to stop after their parent was killed"
        )));
    }
    let done = count();
    std::thread::sleep(Duration::from_millis(500));
    if count() != done {
        return Err(fail(
            "results were written after every worker was gone".into(),
        ));
    }
    let out = harness(&root, "4.0", "always").status().unwrap();
    if !out.success() {
        return Err(fail(format!("the next run failed: {out}")));
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// A worker killed from outside (SIGKILL, as the OOM killer sends it) while
/// it decodes: the run goes on, and the tests it was running fail naming
/// the model, the signal and the test, in the harness's output and in
/// each test's outcome JSON (`QUANTGATE_OUT`, what a shard hands `merge`).
fn a_worker_killed_from_outside_is_named_in_the_output() -> Result<(), Failed> {
    let root = fixture("sigkill");
    let out = root.join("out");
    let mut child = harness(&root, "4.0", "always")
        .env("QG_SLEEP_MS", "400")
        .env("QUANTGATE_OUT", &out)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pgid = child.id();
    let start = std::time::Instant::now();
    let worker = loop {
        let w: Vec<u32> = group_members(pgid)
            .into_iter()
            .filter(|p| *p != pgid)
            .collect();
        if let Some(&w) = w.first() {
            break w;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(fail("no worker process was started".into()));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::thread::sleep(Duration::from_millis(600));
    Command::new("kill")
        .args(["-KILL", &worker.to_string()])
        .status()
        .unwrap();
    let done = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&done.stdout).into_owned();
    if done.status.success() {
        return Err(fail(format!("a killed worker's tests passed:\n{stdout}")));
    }
    let named = stdout
        .lines()
        .find(|l| l.contains("was killed by signal 9 (SIGKILL)"))
        .ok_or_else(|| fail(format!("no test names the signal:\n{stdout}")))?;
    if !(named.contains("the worker process for model `m") && named.contains("while running `c")) {
        return Err(fail(format!("the model or the test is not named: {named}")));
    }
    let mut in_json = 0;
    for (path, bytes) in common::tree(&out) {
        if path.extension().is_some_and(|x| x == "json") {
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| fail(format!("{}: {e}", path.display())))?;
            let e = v["error"].as_str().unwrap_or_default();
            if e.contains("killed by signal 9 (SIGKILL)") {
                if v["status"] != "error" {
                    return Err(fail(format!("{}: {}", path.display(), v["status"])));
                }
                in_json += 1;
            }
        }
    }
    if in_json == 0 {
        return Err(fail("no outcome JSON names the signal".into()));
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// libtest's `0 passed` for a filter that matches no test reads like a green
/// gate: the harness's summary says nothing ran.
fn a_filter_selecting_nothing_says_so() -> Result<(), Failed> {
    let root = fixture("empty-filter");
    let out = harness(&root, "4.0", "no")
        .arg("no-such-case")
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.contains("quantgate: nothing ran: the filter `no-such-case` selects none of the") {
        return Err(fail(format!("no `nothing ran` line:\n{stdout}")));
    }
    // A filter that selects tests says nothing of the kind.
    let out = harness(&root, "4.0", "always")
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.contains("nothing ran") {
        return Err(fail(format!("a full run said nothing ran:\n{stdout}")));
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// Role `parquet`: run a kld case on the fake engine and write its rows.
fn parquet_role(root: &Path) -> ExitCode {
    let text = std::fs::read_to_string(root.join("suites/t.txt")).unwrap();
    std::fs::write(
        root.join("suites/k.toml"),
        format!(
            "kind = \"kld\"\nmodels = [\"m1\"]\nreference = \"ref\"\n[text]\npath = \"t.txt\"\nsha256 = \"{}\"\n\
             [window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = 6\n",
            quantgate::core::fsutil::sha256_bytes(text.as_bytes())
        ),
    )
    .unwrap();
    let (registry, planned) =
        quantgate::plan::plan(&root.join("suites"), &["k.toml".into()], &[]).unwrap();
    let mut runner = quantgate::execute::RunContext::new(
        &common::fixture_config(root),
        registry,
        Arc::new(engine()),
        1,
    );
    runner.references.dir = root.join("cache");
    let o = quantgate::schedule::trial(&runner, &planned[0], std::path::Path::new("goldens"));
    if o.status != quantgate::core::Status::Pass {
        println!("case failed: {:?}", o.error);
        return ExitCode::from(3);
    }
    if std::env::var_os("QG_SKIP_WRITE").is_some() {
        println!("skipped the write");
        return ExitCode::SUCCESS;
    }
    match quantgate::report::write_parquet(&root.join("out"), &o) {
        Ok(()) => {
            println!("write succeeded");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("write failed: {}", e.message);
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    match std::env::var("QG_ROLE").as_deref() {
        Ok("harness") => {
            let root = PathBuf::from(std::env::var_os("QG_ROOT").unwrap());
            return quantgate::harness::run_suites(
                &root.join("suites"),
                &root.join("goldens"),
                Arc::new(engine()),
            );
        }
        Ok("parquet") => {
            return parquet_role(&PathBuf::from(std::env::var_os("QG_ROOT").unwrap()));
        }
        _ => {}
    }
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test(
            "interrupted_runs_leave_every_golden_whole",
            interrupted_runs_leave_every_golden_whole,
        ),
        Trial::test(
            "a_killed_run_resumes_from_the_result_cache",
            a_killed_run_resumes_from_the_result_cache,
        ),
        Trial::test(
            "writes_hitting_the_size_limit_leave_nothing",
            writes_hitting_the_size_limit_leave_nothing,
        ),
        Trial::test(
            "a_filter_selecting_nothing_says_so",
            a_filter_selecting_nothing_says_so,
        ),
        Trial::test(
            "workers_die_with_their_parent",
            workers_die_with_their_parent,
        ),
        Trial::test(
            "a_worker_killed_from_outside_is_named_in_the_output",
            a_worker_killed_from_outside_is_named_in_the_output,
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
