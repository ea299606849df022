//! Crash isolation: a worker that aborts (as llama.cpp's GGML_ASSERT does)
//! fails its own tests with the signal, the model, its file and the case,
//! while the other model's tests still run and pass — with tests that share
//! one decode in one worker (the default), a worker per test, or a worker
//! per model.
//!
//! One executable, three roles: run by `cargo test` it is a libtest-mimic
//! harness with one test, which builds a fixture and runs this executable
//! again as a quantgate harness (`QG_CRASH_ROLE=harness`); that harness then
//! re-runs it once more per model as a worker (`QUANTGATE_WORKER`).

mod common;

use libtest_mimic::{Arguments, Failed, Trial};
use quantgate::engine::fake::{FakeEngine, FakeSpec};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;

fn engine() -> FakeEngine {
    FakeEngine::new().with(
        "crashy",
        FakeSpec {
            abort_in: Some(1),
            ..FakeSpec::default()
        },
    )
}

/// Cases `a` and `b` on both models; with `same`, they score the same
/// windows (one decode per model), else `b` scores fewer.
fn fixture(tag: &str, same: bool) -> PathBuf {
    let root = common::fake_root(&format!("crash-{tag}"), &[("crashy", 100), ("stable", 101)]);
    let text: String = (0..300)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    std::fs::write(root.join("suites/t.txt"), &text).unwrap();
    for (case, chunks) in [("a", 3), ("b", if same { 3 } else { 2 })] {
        std::fs::write(
            root.join(format!("suites/{case}.toml")),
            format!(
                "kind = \"perplexity\"\nmodels = [\"crashy\", \"stable\"]\n[text]\npath = \"t.txt\"\n\
                 sha256 = \"{}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = {chunks}\n",
                quantgate::core::fsutil::sha256_bytes(text.as_bytes())
            ),
        )
        .unwrap();
    }
    root
}

/// `isolation`: the `QUANTGATE_ISOLATION` value (None: the default).
fn scenario(isolation: Option<&str>) -> Result<(), Failed> {
    // In one worker per model, `b` must be a job of its own to be "not run".
    let root = fixture(isolation.unwrap_or("default"), isolation != Some("model"));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if let Some(i) = isolation {
        cmd.env("QUANTGATE_ISOLATION", i);
    } else {
        cmd.env_remove("QUANTGATE_ISOLATION");
    }
    let out = cmd
        .env("QG_CRASH_ROLE", "harness")
        .env("QG_CRASH_ROOT", &root)
        .env("QUANTGATE_CACHE", common::fixture_cache(&root))
        .env("QUANTGATE_UPDATE", "always")
        .env_remove("CI")
        .env_remove("NEXTEST")
        .args(["--test-threads", "2", "--color", "never"])
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let check = |ok: bool, what: &str| -> Result<(), Failed> {
        if ok {
            Ok(())
        } else {
            Err(Failed::from(format!(
                "{what}\n--- harness output ---\n{log}"
            )))
        }
    };
    check(!out.status.success(), "the run must fail")?;
    // libtest pads names: `test a::stable       ... ok`.
    let verdict = |t: &str| {
        log.lines()
            .find(|l| l.split_whitespace().take(2).eq(["test", t]))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("")
            .to_string()
    };
    for t in ["a::stable", "b::stable"] {
        check(verdict(t) == "ok", &format!("{t} must pass"))?;
    }
    for t in ["a::crashy", "b::crashy"] {
        check(verdict(t) == "FAILED", &format!("{t} must fail"))?;
    }
    let model = root.join("suites/crashy.gguf");
    let aborted = |case: &str| {
        format!(
            "the worker process for model `crashy` ({}) was killed by signal 6 (SIGABRT) while running `{case}::crashy`",
            model.display()
        )
    };
    check(log.contains(&aborted("a")), "the abort is described")?;
    match isolation {
        // One worker per model: its next job is not run, and says why.
        Some("model") => check(
            log.contains(&format!("not run: {}", aborted("a"))),
            "the crashed model's next test says why it did not run",
        )?,
        // One worker per test: the second test crashes on its own.
        Some("test") => check(
            log.contains(&aborted("b")),
            "each test's abort is described",
        )?,
        // One worker per shared decode: both tests were in the decode that
        // crashed, and each says so, naming the other.
        _ => {
            check(
                log.contains(&aborted("b")),
                "each test's abort is described",
            )?;
            check(
                log.contains("(one decode with `a::crashy`)")
                    && log.contains("(one decode with `b::crashy`)"),
                "each test names the test it shared the decode with",
            )?;
        }
    }
    // The summary counts the dead worker's tests as errors, apart from failures.
    check(
        log.contains("quantgate: 0 failed (a gate or a golden), 2 errors"),
        "errors counted apart from failures",
    )?;
    // The stable model's goldens were written; the crashed one has none.
    check(
        root.join("goldens/a/stable.snap").exists() && root.join("goldens/b/stable.snap").exists(),
        "stable goldens written",
    )?;
    check(
        !root.join("goldens/a/crashy.snap").exists(),
        "no golden from a crashed worker",
    )?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

fn main() -> ExitCode {
    if std::env::var_os("QG_CRASH_ROLE").is_some() {
        let root = PathBuf::from(std::env::var_os("QG_CRASH_ROOT").unwrap());
        return quantgate::harness::run_suites(
            &root.join("suites"),
            &root.join("goldens"),
            Arc::new(engine()),
        );
    }
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test("shared_decode_abort_fails_only_its_tests", || {
            scenario(None)
        }),
        Trial::test("worker_abort_fails_only_its_test", || {
            scenario(Some("test"))
        }),
        Trial::test("model_worker_abort_fails_only_its_model", || {
            scenario(Some("model"))
        }),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
