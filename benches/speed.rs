//! `cargo bench --bench speed`: the `speed` kind against llama.cpp's own
//! `llama-bench` (built by `scripts/build-llama-perplexity.sh bench` from the
//! same llama.cpp sources), on the same model and settings — pp512 and
//! tg128, 5 repetitions, 2 threads, flash attention off, n_batch 512 —
//! alternately in one run, so that the machine's noise falls on both alike.
//!
//! Per round (`QG_BENCH_ROUNDS`, default 3) and model (`QG_BENCH_MODELS`,
//! default `smollm2-q8_0,smollm2-q4_k_m`): llama-bench, then quantgate, in
//! rotated order. Prints each side's t/s mean ± sd and, over all rounds, the
//! means with their spread; exits 1 when a quantgate mean is farther from
//! llama-bench's than the two runs' own spread (the sum of their standard
//! deviations over rounds).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Command, ExitCode};

fn output(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    quantgate::kinds::speed::mean_sd(xs)
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    let repo = quantgate::harness::project_root();
    let rounds = common::bench_rounds(3);
    let models: Vec<String> = std::env::var("QG_BENCH_MODELS")
        .unwrap_or_else(|_| "smollm2-q8_0,smollm2-q4_k_m".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let bench = common::llama_tool("bench");
    let qg = env!("CARGO_BIN_EXE_quantgate");
    let dir = std::env::temp_dir().join(format!("qg-bench-speed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let suites = dir.join("suites");
    std::fs::create_dir_all(suites.join("speed")).unwrap();
    std::fs::copy(repo.join("suites/models.toml"), suites.join("models.toml")).unwrap();
    let mut failed = false;
    for alias in &models {
        let path = common::registry_model(alias).file.path;
        std::fs::write(
            suites.join("speed/one.toml"),
            format!(
                "kind = \"speed\"\nmodels = [\"{alias}\"]\npp = 512\ntg = 128\nrepetitions = 5\nrounds = 1\nn_batch = 512\n"
            ),
        )
        .unwrap();
        // (test, side) → per-round means.
        let mut means: std::collections::BTreeMap<(&str, &str), Vec<f64>> = Default::default();
        for round in 0..rounds {
            let tool = || {
                let json = output(
                    Command::new(&bench)
                        .arg("-m")
                        .arg(&path)
                        .args(["-p", "512", "-n", "128", "-r", "5", "-t", "2", "-fa", "0"])
                        .args(["-b", "512", "-ub", "512", "-o", "json"]),
                    "llama-bench",
                );
                let v: serde_json::Value = serde_json::from_str(&json).expect("llama-bench JSON");
                let mut got = Vec::new();
                for t in v.as_array().expect("an array") {
                    let name = if t["n_prompt"].as_u64() > Some(0) {
                        "pp"
                    } else {
                        "tg"
                    };
                    got.push((
                        name,
                        t["avg_ts"].as_f64().unwrap(),
                        t["stddev_ts"].as_f64().unwrap(),
                    ));
                }
                got
            };
            let ours = || {
                let json = dir.join("out.json");
                output(
                    Command::new(qg)
                        .arg("--suites")
                        .arg(&suites)
                        .args([
                            "run",
                            "speed/one",
                            "--threads",
                            "2",
                            "--flash-attn",
                            "off",
                            "--json",
                        ])
                        .arg(&json),
                    "quantgate run",
                );
                let v: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
                let m = &v[0]["metrics"];
                ["pp", "tg"]
                    .iter()
                    .map(|t| {
                        (
                            *t,
                            m[format!("{t}_tps_mean")].as_f64().unwrap(),
                            m[format!("{t}_tps_sd")].as_f64().unwrap(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            let (first, second) = if round % 2 == 0 {
                (("llama-bench", tool()), ("quantgate", ours()))
            } else {
                let o = ours();
                (("llama-bench", tool()), ("quantgate", o))
            };
            for (side, got) in [first, second] {
                for (t, mean, sd) in got {
                    println!("{alias} round {round} {t}: {side:<11} {mean:9.2} ± {sd:6.2} t/s");
                    means.entry((t, side)).or_default().push(mean);
                }
            }
        }
        for t in ["pp", "tg"] {
            let (tm, ts) = mean_sd(&means[&(t, "llama-bench")]);
            let (qm, qs) = mean_sd(&means[&(t, "quantgate")]);
            let ok = (qm - tm).abs() <= ts + qs;
            failed |= !ok;
            println!(
                "{alias} {t}: llama-bench {tm:.2} ± {ts:.2} t/s, quantgate {qm:.2} ± {qs:.2} t/s over {rounds} rounds: ratio {:.3}, {}",
                qm / tm,
                if ok { "within the runs' spread" } else { "OUTSIDE the runs' spread" }
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
