//! `cargo bench --bench ladder`: the SmolLM2 ladder KLD job — F16 reference
//! and Q8_0, Q6_K, Q4_K_M, Q2_K candidates on WikiText-2 test, n_ctx 512,
//! 16 chunks, 2 threads, flash attention off — through `llama-perplexity`
//! (built by `scripts/build-llama-perplexity.sh` from the same llama.cpp
//! sources) and through `quantgate run`, alternately in one run, so that
//! the machine's noise falls on both sides alike.
//!
//! Per round (`QG_BENCH_ROUNDS`, default 1):
//! - the tool: `--kl-divergence-base` on F16 (writing its base file), then
//!   `--kl-divergence` per candidate against it;
//! - quantgate cold: one kld case with the four candidates, reference and
//!   result caches empty (the F16 rows built in the run);
//! - quantgate warm: the same with the reference cache from the cold run
//!   (result cache emptied), against the tool's four candidate runs.
//!
//! Prints both times and the ratio of each comparison, and exits non-zero
//! when quantgate is slower than the targets (#15: cold ≤ 1.0×, warm ≤
//! 0.95×). `QG_BENCH_QUANTGATE=path` times another quantgate binary (an
//! older build, for a before/after).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, ExitCode};

use common::{LADDER as CANDIDATES, WIKI_SHA};

/// Run `cmd`; its seconds (it must exit 0).
fn run(cmd: &mut Command, what: &str) -> f64 {
    common::timed(cmd, what, &[0])
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    let repo = quantgate::harness::project_root();
    let rounds = common::bench_rounds(1);
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
    } = common::bench_ladder("ladder", CANDIDATES, "kld");
    let text = repo.join("suites/data/wikitext-2-test.txt");
    std::fs::write(
        suites.join("kld/ladder.toml"),
        format!(
            "kind = \"kld\"\nmodels = {CANDIDATES:?}\nreference = \"smollm2-f16\"\n\
             [text]\npath = \"{}\"\nsha256 = \"{WIKI_SHA}\"\n\
             [window]\nmode = \"llama-perplexity\"\nn_ctx = 512\nchunks = 16\n",
            text.display()
        ),
    )
    .unwrap();
    let base = dir.join("f16.kld");
    let common = [
        "-c", "512", "--chunks", "16", "-b", "512", "-fa", "off", "-t", "2",
    ];
    let tool_run = |model: &Path, extra: &[&str], what: &str| {
        let mut c = Command::new(&tool);
        c.arg("-m").arg(model).arg("-f").arg(&text).args(common);
        c.args(extra);
        run(&mut c, what)
    };
    let qg_run = |what: &str| {
        let mut c = Command::new(&qg);
        c.env("QUANTGATE_CACHE", &cache)
            .arg("--suites")
            .arg(&suites)
            .args(["run", "kld/ladder", "--threads", "2"]);
        run(&mut c, what)
    };
    let b = base.display().to_string();
    let mut ok = true;
    println!(
        "{:<6} {:>10} {:>10} {:>8}   {:>10} {:>10} {:>8}",
        "round", "tool_s", "qg_cold_s", "ratio", "tool_cand_s", "qg_warm_s", "ratio"
    );
    for round in 1..=rounds {
        let _ = std::fs::remove_file(&base);
        let t_base = tool_run(&f16, &["--kl-divergence-base", &b], "llama-perplexity base");
        let mut t_cand = 0.0;
        for (alias, p) in CANDIDATES.iter().zip(&cands) {
            t_cand += tool_run(
                p,
                &["--kl-divergence-base", &b, "--kl-divergence"],
                &format!("llama-perplexity --kl-divergence {alias}"),
            );
        }
        for sub in ["reference", "results"] {
            let _ = std::fs::remove_dir_all(cache.join(sub));
        }
        let cold = qg_run("quantgate run (cold)");
        let _ = std::fs::remove_dir_all(cache.join("results"));
        let warm = qg_run("quantgate run (warm reference)");
        let tool_total = t_base + t_cand;
        let (rc, rw) = (cold / tool_total, warm / t_cand);
        println!(
            "{round:<6} {tool_total:>10.1} {cold:>10.1} {rc:>7.3}x   {t_cand:>10.1} {warm:>10.1} {rw:>7.3}x"
        );
        println!("       (tool base run {t_base:.1} s)");
        ok &= rc <= 1.0 && rw <= 0.95;
    }
    let _ = std::fs::remove_dir_all(&dir);
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("a target was missed (cold ≤ 1.0×, warm ≤ 0.95× the tool)");
        ExitCode::FAILURE
    }
}
