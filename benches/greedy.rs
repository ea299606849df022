//! `cargo bench --bench greedy`: the cost of batch-invariant greedy decoding
//! (every pass that picks a token has 32 rows) against plain token-at-a-time
//! decoding, on SmolLM2 Q4_1, SmolLM2 F16 and Gemma-3-270M Q4_K_M: invariant
//! with drafts (the default: one-row passes guess the next tokens and one
//! 32-row pass checks them all), invariant without drafts (a 32-row pass per
//! token, trailing tokens re-decoded), and one token per pass. The modes
//! alternate within one run (3 rounds of 64 tokens after the π prompt, 2
//! threads), so the ratios are measured under the same machine load; the
//! median per-token time of each mode is reported, and the drafted tokens are
//! checked to be bitwise the undrafted ones.

#[path = "../tests/common/mod.rs"]
mod common;

use quantgate::core::{Decoding, Settings};
use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::{BosPolicy, ModelPool};
use std::sync::Arc;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // Listed as nothing, as the other benches are: `--list` (nextest,
    // `cargo bench -- --list`) must not run the benchmark.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let engine = Arc::new(LlamaEngine::new());
    let pool = ModelPool::new(engine.clone());
    let plain = ModelPool::new(Arc::new(LlamaEngine::without_drafts()));
    println!(
        "{:<20} {:>14} {:>14} {:>14} {:>9} {:>9}",
        "model", "drafted ms/t", "undrafted ms/t", "1-token ms/t", "undr/dr", "dr/1-tok"
    );
    for alias in ["smollm2-q4_1", "smollm2-f16", "gemma3-270m-q4_k_m"] {
        let v = common::registry_model(alias);
        let m = pool.get(&v.file).expect("load");
        let u = plain.get(&v.file).expect("load");
        let prompt: Vec<i32> = m
            .tokenize("Pi to 1000 decimal places: 3.", BosPolicy::Model)
            .expect("tokenize")
            .iter()
            .map(|t| t.id)
            .collect();
        let mut settings = Settings::new(512, 2);
        settings.min_rows = 32;
        let n = 64;
        let (mut dr, mut und, mut inc) = (Vec::new(), Vec::new(), Vec::new());
        let mut tokens: Vec<Vec<(i32, u32)>> = Vec::new();
        for _ in 0..3 {
            for (model, mode, out) in [
                (&m, Decoding::Invariant, &mut dr),
                (&u, Decoding::Invariant, &mut und),
                (&m, Decoding::Incremental, &mut inc),
            ] {
                let t = Instant::now();
                // Never stop early: the same number of tokens in every mode.
                let steps = model
                    .generate(&settings, &prompt, n, mode, &mut |_| false)
                    .expect("generate");
                out.push(t.elapsed().as_secs_f64() * 1e3 / steps.len().max(1) as f64);
                if mode == Decoding::Invariant {
                    tokens.push(steps.iter().map(|s| (s.token, s.gap.to_bits())).collect());
                }
            }
        }
        assert!(
            tokens.windows(2).all(|w| w[0] == w[1]),
            "{alias}: drafted and undrafted invariant tokens differ"
        );
        let (a, b, c) = (median(dr), median(und), median(inc));
        println!(
            "{alias:<20} {a:>14.2} {b:>14.2} {c:>14.2} {:>8.1}x {:>8.1}x",
            b / a,
            a / c
        );
    }
}
