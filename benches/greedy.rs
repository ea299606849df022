//! `cargo bench --bench greedy`: the cost of batch-invariant greedy decoding
//! (every pass padded to 32 rows, trailing tokens re-decoded) against plain
//! token-at-a-time decoding, on SmolLM2 Q4_1, SmolLM2 F16 and Gemma-3-270M
//! Q4_K_M. The two modes alternate within one run (3 rounds of 64 tokens
//! after the π prompt, 2 threads), so the ratio is measured under the same
//! machine load; the median per-token time of each mode is reported.

use quantgate::core::{Decoding, Settings};
use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::{BosPolicy, Engine, ModelPool};
use quantgate::models::{ensure, Registry};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let reg = Registry::load(&quantgate::harness::project_root().join("suites/models.toml"))
        .expect("registry");
    let engine = Arc::new(LlamaEngine::new());
    let pool = ModelPool::new(engine.clone());
    let label = engine.build().label();
    let q = |s: &Path, d: &Path, t: &str| engine.quantize(s, d, t, 2);
    println!(
        "{:<20} {:>14} {:>14} {:>7}",
        "model", "invariant ms/t", "1-token ms/t", "ratio"
    );
    for alias in ["smollm2-q4_1", "smollm2-f16", "gemma3-270m-q4_k_m"] {
        let v = ensure(&reg, alias, &label, &q).expect("model");
        let m = pool.get(&v.file).expect("load");
        let prompt: Vec<i32> = m
            .tokenize("Pi to 1000 decimal places: 3.", BosPolicy::Model)
            .expect("tokenize")
            .iter()
            .map(|t| t.id)
            .collect();
        let mut settings = Settings::new(512, 2);
        settings.min_rows = 32;
        let n = 64;
        let (mut inv, mut inc) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            for (mode, out) in [
                (Decoding::Invariant, &mut inv),
                (Decoding::Incremental, &mut inc),
            ] {
                let t = Instant::now();
                // Never stop early: the same number of tokens in both modes.
                let steps = m
                    .generate(&settings, &prompt, n, mode, &mut |_| false)
                    .expect("generate");
                out.push(t.elapsed().as_secs_f64() * 1e3 / steps.len().max(1) as f64);
            }
        }
        let (a, b) = (median(inv), median(inc));
        println!("{alias:<20} {a:>14.2} {b:>14.2} {:>6.1}x", a / b);
    }
}
