//! `cargo bench --bench sequential`: the SmolLM2 ladder (F16 reference;
//! Q8_0, Q6_K, Q4_K_M, Q2_K) on a larger slice of WikiText-2 test (n_ctx
//! 512, 2 threads, flash attention off), three ways in one run:
//! - llama-perplexity full: `--kl-divergence-base` on F16, then
//!   `--kl-divergence` per candidate, every window;
//! - quantgate full: the same job as one kld case, every window (reference
//!   and result caches empty);
//! - quantgate sequential: the ΔNLL ≤ +0.05 release gate as a perplexity
//!   case with `[decide] sequential = true` (alpha 0.05, bounds [-0.5, 0.5]),
//!   caches empty: each candidate stops once its verdict is certain, the
//!   reference decoded only for windows some candidate needs.
//!
//! Prints the times and their ratios to the tool's, the windows each
//! candidate used, and the sequential verdicts beside the fixed-N verdicts
//! of the full run (its ΔNLL against +0.05). `QG_BENCH_CHUNKS` (default
//! `80`) lists slices: the full runs at the first, the sequential run at
//! each (so `80,160` shows the fraction of windows used as N grows).
//! Exits non-zero when a verdict differs or the sequential run at the first
//! slice takes more than 0.55× the tool's time.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, ExitCode};

use common::{LADDER as CANDIDATES, WIKI_SHA};

/// Run `cmd`; its seconds. Exit 0 or 1 (a failed gate) is a run.
fn run(cmd: &mut Command, what: &str) -> f64 {
    common::timed(cmd, what, &[0, 1])
}

/// The outcomes of a `--json` file.
fn outcomes(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn metric(outs: &[serde_json::Value], model: &str, m: &str) -> f64 {
    let o = outs
        .iter()
        .find(|o| o["model"] == model)
        .unwrap_or_else(|| panic!("no outcome of {model}"));
    o["metrics"][m]
        .as_f64()
        .unwrap_or_else(|| panic!("{model}: no {m}: {o}"))
}

fn status(outs: &[serde_json::Value], model: &str) -> String {
    let o = outs.iter().find(|o| o["model"] == model).unwrap();
    o["status"].as_str().unwrap_or_default().to_string()
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    let repo = quantgate::harness::project_root();
    let slices: Vec<usize> = std::env::var("QG_BENCH_CHUNKS")
        .unwrap_or_else(|_| "80".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("QG_BENCH_CHUNKS: numbers, comma-separated")
        })
        .collect();
    let qg = std::env::var("QG_BENCH_QUANTGATE")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_quantgate").to_string());
    let tool = common::llama_perplexity_tool();
    // A suites tree for the bench's cases, and a cache whose model files
    // are the real cache's (linked) but whose reference and result caches
    // are its own.
    let common::BenchLadder {
        f16,
        cands,
        dir,
        suites,
        cache,
    } = common::bench_ladder("sequential", CANDIDATES, "b");
    let text = repo.join("suites/data/wikitext-2-test.txt");
    let case = |name: &str, kind: &str, chunks: usize, extra: &str| {
        std::fs::write(
            suites.join(format!("b/{name}.toml")),
            format!(
                "kind = \"{kind}\"\nmodels = {CANDIDATES:?}\nreference = \"smollm2-f16\"\n\
                 [text]\npath = \"{}\"\nsha256 = \"{WIKI_SHA}\"\n\
                 [window]\nmode = \"llama-perplexity\"\nn_ctx = 512\nchunks = {chunks}\n{extra}",
                text.display()
            ),
        )
        .unwrap();
    };
    let qg_run = |name: &str, what: &str| {
        for sub in ["reference", "results"] {
            let _ = std::fs::remove_dir_all(cache.join(sub));
        }
        let json = dir.join(format!("{name}.json"));
        let mut c = Command::new(&qg);
        c.env("QUANTGATE_CACHE", &cache)
            .arg("--suites")
            .arg(&suites)
            .args(["run", &format!("b/{name}"), "--threads", "2", "--json"])
            .arg(&json);
        (run(&mut c, what), outcomes(&json))
    };
    let sequential = "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = 0.05\n\
        [decide]\nsequential = true\nalpha = 0.05\nseed = 20261203\n\
        [decide.bounds]\ndelta_nll_mean = [-0.5, 0.5]\n";
    let mut ok = true;

    // The full runs, at the first slice.
    let n = slices[0];
    let base = dir.join("f16.kld");
    let b = base.display().to_string();
    let chunks = n.to_string();
    let tool_run = |model: &Path, extra: &[&str], what: &str| {
        let mut c = Command::new(&tool);
        c.arg("-m").arg(model).arg("-f").arg(&text);
        c.args([
            "-c", "512", "--chunks", &chunks, "-b", "512", "-fa", "off", "-t", "2",
        ]);
        c.args(extra);
        run(&mut c, what)
    };
    let mut t_tool = tool_run(&f16, &["--kl-divergence-base", &b], "llama-perplexity base");
    for (alias, p) in CANDIDATES.iter().zip(&cands) {
        t_tool += tool_run(
            p,
            &["--kl-divergence-base", &b, "--kl-divergence"],
            &format!("llama-perplexity --kl-divergence {alias}"),
        );
    }
    let _ = std::fs::remove_file(&base);
    case("full", "kld", n, "");
    let (t_full, full) = qg_run("full", "quantgate run (full)");
    println!("{n} windows of WikiText-2 test (n_ctx 512), 2 threads");
    println!("  llama-perplexity full      {t_tool:>8.1} s");
    println!(
        "  quantgate full             {t_full:>8.1} s  {:.3}x the tool",
        t_full / t_tool
    );

    for (k, &n) in slices.iter().enumerate() {
        case("seq", "perplexity", n, sequential);
        let (t_seq, seq) = qg_run("seq", "quantgate run (sequential)");
        let mut used_all = 0.0;
        println!(
            "  quantgate sequential, N={n:<4} {t_seq:>8.1} s{}",
            if k == 0 {
                format!("  {:.3}x the tool", t_seq / t_tool)
            } else {
                String::new()
            }
        );
        for alias in CANDIDATES {
            let used = metric(&seq, alias, "windows");
            used_all += used;
            let verdict = status(&seq, alias);
            let mut line = format!(
                "    {alias:<16} {used:>4} of {n} windows ({:>5.1}%)  {verdict}  ΔNLL sequence [{:+.4}, {:+.4}]",
                100.0 * used / n as f64,
                metric(&seq, alias, "delta_nll_mean_seq_lo"),
                metric(&seq, alias, "delta_nll_mean_seq_hi"),
            );
            if k == 0 {
                let d = metric(&full, alias, "delta_nll_mean");
                let fixed = if d <= 0.05 { "pass" } else { "fail" };
                line.push_str(&format!("  fixed-N ΔNLL {d:+.4}: {fixed}"));
                if fixed != verdict {
                    line.push_str("  VERDICTS DIFFER");
                    ok = false;
                }
            }
            println!("{line}");
        }
        println!(
            "    windows used: {used_all} of {} ({:.1}%)",
            n * CANDIDATES.len(),
            100.0 * used_all / (n * CANDIDATES.len()) as f64
        );
        if k == 0 && t_seq > 0.55 * t_tool {
            eprintln!("the sequential ladder took more than 0.55× the tool's full run");
            ok = false;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
