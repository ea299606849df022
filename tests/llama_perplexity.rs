//! quantgate's perplexity equals what llama.cpp's own `llama-perplexity` prints
//! for the same model, text, `-c 512 --chunks 16 -b 512 -fa off`: every running
//! per-chunk PPL, the final PPL and its ±, to the digits the tool prints.
//! The tool is built from the pinned llama.cpp sources by
//! `scripts/build-llama-perplexity.sh` (cached after the first build).

use quantgate::case::Windowing;
use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::{BosPolicy, Engine, ModelPool};
use quantgate::execute::{plan_windows, score_plan};
use quantgate::measure::perplexity_metrics;
use quantgate::models::{ensure, Registry};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The tests here each run two multi-threaded llama.cpp processes' worth of
/// work; one at a time keeps threads ≤ cores (OpenMP collapses otherwise).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tool() -> String {
    let out = Command::new("bash")
        .arg(repo().join("scripts/build-llama-perplexity.sh"))
        .output()
        .expect("run scripts/build-llama-perplexity.sh");
    assert!(
        out.status.success(),
        "building llama-perplexity failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// (running PPL after each chunk, final PPL, final ±) as printed.
/// The tool's log for `args`.
fn run_tool(tool: &str, model: &Path, text: &Path, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args([
            "-m",
            &model.display().to_string(),
            "-f",
            &text.display().to_string(),
        ])
        .args(args)
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    log
}

/// The running PPL values the tool prints as `[1]x,[2]y,...`.
fn running(log: &str) -> Vec<f64> {
    let line = log
        .lines()
        .find(|l| l.starts_with("[1]"))
        .unwrap_or_else(|| panic!("{log}"));
    line.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(']').nth(1).unwrap().trim().parse().unwrap())
        .collect()
}

fn reference(tool: &str, model: &Path, text: &Path, threads: u32) -> (Vec<f64>, f64, f64) {
    let t = threads.to_string();
    let log = run_tool(
        tool,
        model,
        text,
        &[
            "-c", "512", "--chunks", "16", "-b", "512", "-fa", "off", "-t", &t,
        ],
    );
    let running = running(&log);
    let fin = log
        .lines()
        .find(|l| l.contains("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("{log}"));
    let nums: Vec<f64> = fin
        .split("PPL = ")
        .nth(1)
        .unwrap()
        .split(" +/- ")
        .map(|s| s.trim().parse().unwrap())
        .collect();
    (running, nums[0], nums[1])
}

/// Every running PPL (after 1, 2, ... windows) equals the tool's printed one.
fn assert_running_matches(windows: &[quantgate::measure::WindowNll], printed: &[f64], label: &str) {
    let (mut sum, mut n) = (0.0, 0);
    for (i, w) in windows.iter().enumerate() {
        sum += w.nll_sum;
        n += w.count;
        let ours = (sum / n as f64).exp();
        assert!(
            same_printed(ours, printed[i], 4),
            "{label} chunk {}: ours {ours} vs llama-perplexity {}",
            i + 1,
            printed[i]
        );
    }
}

/// Equal to the printed digits: |a − printed| ≤ half a unit in the last place.
fn same_printed(ours: f64, printed: f64, decimals: i32) -> bool {
    (ours - printed).abs() <= 0.5 * 10f64.powi(-decimals) + 1e-12
}

#[test]
fn perplexity_equals_llama_perplexity() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let tool = tool();
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let engine = Arc::new(LlamaEngine::new());
    let label = engine.build().label();
    let q = |s: &Path, d: &Path, t: &str| engine.quantize(s, d, t, 2);
    let pool = ModelPool::new(engine.clone());
    let text_path = repo().join("suites/data/wikitext-2-test.txt");
    let text = std::fs::read_to_string(&text_path).unwrap();
    for alias in ["smollm2-f16", "smollm2-q2_k"] {
        let v = ensure(&reg, alias, &label, &q).unwrap();
        let (running, ppl, pm) = reference(&tool, &v.file.path, &text_path, 2);
        assert_eq!(running.len(), 16);
        let model = pool.get(&v.file).unwrap();
        let ids: Vec<i32> = model
            .tokenize(&text, BosPolicy::Model)
            .unwrap()
            .iter()
            .map(|t| t.id)
            .collect();
        let bos = model.info().add_bos.then_some(model.info().bos);
        let plan = plan_windows(
            &ids,
            &Windowing::LlamaPerplexity {
                n_ctx: 512,
                chunks: Some(16),
                skip: 0,
            },
            bos,
        )
        .unwrap();
        let obs = score_plan(&*model, &plan, 512, 2).unwrap();
        assert_running_matches(&obs.windows, &running, alias);
        let m = perplexity_metrics(&obs.windows);
        assert!(
            same_printed(m["ppl"], ppl, 4),
            "{alias}: ppl {} vs {ppl}",
            m["ppl"]
        );
        assert!(
            same_printed(m["ppl_se"], pm, 5),
            "{alias}: ± {} vs {pm}",
            m["ppl_se"]
        );
        assert_eq!(m["tokens_scored"], 16.0 * 255.0);
        eprintln!(
            "{alias}: quantgate ppl {:.6} ± {:.6}; llama-perplexity {ppl} ± {pm}",
            m["ppl"], m["ppl_se"]
        );
    }
}

#[test]
fn strided_mode_equals_ppl_stride() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let tool = tool();
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let engine = Arc::new(LlamaEngine::new());
    let q = |s: &Path, d: &Path, t: &str| engine.quantize(s, d, t, 2);
    let v = ensure(&reg, "smollm2-f16", &engine.build().label(), &q).unwrap();
    let text_path = repo().join("suites/data/wikitext-2-test.txt");
    let log = run_tool(
        &tool,
        &v.file.path,
        &text_path,
        &[
            "-c",
            "256",
            "--ppl-stride",
            "128",
            "--chunks",
            "12",
            "-b",
            "256",
            "-fa",
            "off",
            "-t",
            "2",
        ],
    );
    assert!(
        log.contains("adjusting context size from 256 to 320"),
        "{log}"
    );
    let printed = running(&log);
    assert_eq!(printed.len(), 12);
    let pool = ModelPool::new(engine.clone());
    let model = pool.get(&v.file).unwrap();
    let text = std::fs::read_to_string(&text_path).unwrap();
    let ids: Vec<i32> = model
        .tokenize(&text, BosPolicy::Model)
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    let plan = plan_windows(
        &ids,
        &Windowing::Strided {
            n_ctx: 256,
            stride: 128,
            chunks: Some(12),
        },
        None,
    )
    .unwrap();
    // Context 256 + 64 = 320, padded by llama.cpp to 512, the tool's chunk;
    // n_batch = min(-b, -c) = 256, as the tool sets it before enlarging the context.
    assert_eq!(plan.n_ctx, 512);
    assert!(log.contains("Calculation chunk = 512"), "{log}");
    let obs = score_plan(&*model, &plan, 256, 2).unwrap();
    assert!(obs.windows.iter().all(|w| w.count == 128));
    assert_running_matches(&obs.windows, &printed, "strided");
    let (sum, n) = obs
        .windows
        .iter()
        .fold((0.0, 0), |(s, n), w| (s + w.nll_sum, n + w.count));
    eprintln!(
        "strided: quantgate {:.6}, llama-perplexity {}",
        (sum / n as f64).exp(),
        printed[11]
    );
}
