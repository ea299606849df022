//! `cargo bench --bench kld`: the compact reference cache against exact
//! full-vocabulary KL, on the SmolLM2 ladder vs F16 over WikiText-2
//! (llama-perplexity windows, n_ctx 512; `QG_BENCH_CHUNKS`, default 16).
//!
//! Reports, for each storage setting (tail mass τ, entry cap K): bytes per
//! position (against llama-perplexity's 2·n_vocab + 8) and the distribution
//! of |KL_compact − KL_exact| per position per model, where KL_exact is the
//! f64 sum over all 49,152 entries with libm `exp`. Then, for the default
//! setting, decode time vs the time of KL and every per-position statistic
//! (target ≤ 5%), both measured in this one run. Then the frontier of a
//! smaller row ([`FRONTIER`]): bytes against error for fewer kept entries and
//! coarser, entropy-coded tail groups. Exits non-zero when the default
//! setting misses an error or time target (mean |error| ≤ 1e-6, measure ≤ 5%
//! of decode); the size goal (≤ 1/10 of llama-perplexity's bytes) is
//! reported, with the frontier showing what it would cost in error.
#[path = "../tests/common/mod.rs"]
mod common;

use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::BosPolicy;
use quantgate::execute::qgref::{encode, CacheHeader};
use quantgate::execute::windows::Windowing;
use quantgate::execute::windows::{plan_windows, score_plan_with, ScoringPlan};
use quantgate::execute::RunContext;
use quantgate::kinds::kld::kld_metrics;
use quantgate::measure::kld::{compare, compress_row, DEFAULT_BINS};
use quantgate::models::Registry;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SETTINGS: &[(f64, usize)] = &[(1e-6, 512), (1e-6, 1024), (1e-6, 2048), (1e-6, 4096)];

/// The frontier of a smaller row (measured, not a stored format): the top
/// `K` entries kept exactly, the rest grouped by a companded probability,
/// `g = ⌊L·(p/p_hi)^γ⌋` (γ = 1/3 is today's spacing, γ = 1 a linear grid;
/// p_hi the largest tail probability), each group's exact mass stored, and
/// the tail's Σ p·lp and rounding term exact. Bytes are those an ideal
/// order-0 entropy coder would store for the group codes, plus the kept
/// entries at 4 + 2 bytes (f32 logit, id delta), the group masses and
/// counts (8 bytes per used group) and 40 bytes of row fields.
const FRONTIER: &[(usize, f64, usize)] = &[
    (2048, 1.0 / 3.0, 255),
    (1024, 1.0 / 3.0, 255),
    (256, 1.0 / 3.0, 255),
    (256, 1.0 / 3.0, 64),
    (256, 1.0 / 3.0, 16),
    (256, 0.5, 64),
    (256, 0.25, 64),
    (256, 0.25, 16),
    (256, 1.0, 4096),
    (64, 0.25, 64),
];

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    let repo = quantgate::harness::project_root();
    let chunks: usize = std::env::var("QG_BENCH_CHUNKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let registry = Registry::load(&repo.join("suites/models.toml")).unwrap();
    let threads = quantgate::execute::threads_per_trial(1);
    let runner = RunContext::new(registry, Arc::new(LlamaEngine::new()), threads);
    let load = |alias: &str| runner.load(alias).unwrap().1;
    let text = std::fs::read_to_string(repo.join("suites/data/wikitext-2-test.txt")).unwrap();
    let reference = load("smollm2-f16");
    let info = reference.info().clone();
    let ids: Vec<i32> = common::token_ids(&*reference, &text, BosPolicy::Model);
    let w = Windowing::LlamaPerplexity {
        n_ctx: 512,
        chunks: Some(chunks),
        skip: 0,
    };
    let plan = plan_windows(&ids, &w, info.add_bos.then_some(info.bos)).unwrap();
    let candidates = [
        "smollm2-q8_0",
        "smollm2-q6_k",
        "smollm2-q4_k_m",
        "smollm2-q2_k",
    ];
    let llama_bytes = 2 * (2 * info.n_vocab.div_ceil(2) + 4);
    let mut llama_err: Vec<Vec<f64>> = vec![Vec::new(); candidates.len()];
    // errors[setting][candidate] = |compact − exact| per position
    let mut errors = vec![vec![Vec::new(); candidates.len()]; SETTINGS.len()];
    let mut bytes = vec![0usize; SETTINGS.len()];
    let mut positions = 0usize;
    let mut decode = Duration::ZERO;
    let mut measure = Duration::ZERO;
    let (tail0, k0) = (
        quantgate::measure::kld::DEFAULT_TAIL,
        quantgate::measure::kld::DEFAULT_MAX_KEPT,
    );
    let mut default_pos = vec![Vec::new(); candidates.len()];
    // frontier[setting]: (bytes summed, |error| per candidate)
    let mut frontier: Vec<(f64, Vec<Vec<f64>>)> =
        vec![(0.0, vec![Vec::new(); candidates.len()]); FRONTIER.len()];
    for win in 0..plan.windows.len() {
        let sub = ScoringPlan {
            windows: vec![plan.windows[win].clone()],
            n_ctx: plan.n_ctx,
            token_stream_sha256: String::new(),
        };
        let mut ref_rows: Vec<Vec<f32>> = Vec::new();
        let mut refs: Vec<Vec<quantgate::measure::kld::RefPosition>> =
            vec![Vec::new(); SETTINGS.len()];
        let mut ref_default = Vec::new();
        score_plan_with(reference.clone(), &sub, 512, threads, false, &mut |r| {
            ref_rows.push(r.row.to_vec());
            for (s, &(tail, k)) in SETTINGS.iter().enumerate() {
                refs[s].push(compress_row(r.row, r.stats, r.target, tail, k));
            }
            ref_default.push(compress_row(r.row, r.stats, r.target, tail0, k0));
            Ok(())
        })
        .unwrap();
        positions += ref_rows.len();
        let sorted: Vec<(Vec<usize>, Vec<f64>)> =
            ref_rows.iter().map(|r| Grouped::sorted(r)).collect();
        let grouped: Vec<Vec<Grouped>> = FRONTIER
            .iter()
            .map(|&(k, gamma, levels)| {
                sorted
                    .iter()
                    .map(|(order, lp)| Grouped::of(order, lp, k, gamma, levels))
                    .collect()
            })
            .collect();
        for (f, g) in grouped.iter().enumerate() {
            frontier[f].0 += g.iter().map(|g| g.bytes).sum::<f64>();
        }
        for (s, rows) in refs.iter().enumerate() {
            let h = CacheHeader {
                reference_sha256: String::new(),
                token_stream_sha256: String::new(),
                windowing: String::new(),
                settings: String::new(),
                build: String::new(),
                tail: SETTINGS[s].0,
                max_kept: SETTINGS[s].1,
                positions: rows.len(),
                n_vocab: info.n_vocab,
                tokenizer_fingerprint: String::new(),
            };
            bytes[s] += encode(&h, rows).len();
        }
        for (c, alias) in candidates.iter().enumerate() {
            let model = load(alias);
            let copy = quantgate::measure::kld::copy_flags(
                &sub.windows[0].window.tokens,
                sub.windows[0].first_scored,
                &sub.windows[0].targets,
            );
            let mut exact = Vec::new();
            let mut compact: Vec<Vec<f64>> = vec![Vec::new(); SETTINGS.len()];
            let mut buf = Vec::new();
            let scored = score_plan_with(model.clone(), &sub, 512, threads, true, &mut |r| {
                // Timed part: exactly what a kld case does per position.
                // (row_stats runs once per row for NLL anyway; timed here too.)
                let t = Instant::now();
                let st = std::hint::black_box(quantgate::measure::row_stats_exps(r.row, &mut buf));
                let p = compare(
                    &ref_default[r.index],
                    r.row,
                    &st,
                    &buf,
                    r.target,
                    copy[r.index],
                );
                measure += t.elapsed();
                default_pos[c].push(p);
                let ex = common::exact_kl(&ref_rows[r.index], r.row);
                exact.push(ex);
                llama_err[c].push((llama_kl(&ref_rows[r.index], r.row) - ex).abs());
                for (s, rs) in refs.iter().enumerate() {
                    compact[s]
                        .push(compare(&rs[r.index], r.row, r.stats, r.exps, r.target, false).kl);
                }
                for (f, g) in grouped.iter().enumerate() {
                    frontier[f].1[c].push((g[r.index].kl(r.row) - ex).abs());
                }
                Ok(())
            })
            .unwrap();
            decode += scored.decode;
            for s in 0..SETTINGS.len() {
                for (a, b) in compact[s].iter().zip(&exact) {
                    errors[s][c].push((a - b).abs());
                }
            }
        }
        eprintln!("window {}/{} done", win + 1, plan.windows.len());
    }
    let t = Instant::now();
    for p in &default_pos {
        std::hint::black_box(kld_metrics(p, DEFAULT_BINS));
    }
    measure += t.elapsed();
    println!(
        "{positions} positions per model, vocabulary {}; llama-perplexity stores {llama_bytes} bytes/position",
        info.n_vocab
    );
    println!(
        "{:>8} {:>6} {:>12} {:>8}  |KL error| per position: mean / p99 / max, by model",
        "tail", "K", "bytes/pos", "ratio"
    );
    let mut ok = true;
    let mut size_note = false;
    for (s, &(tail, k)) in SETTINGS.iter().enumerate() {
        let bpp = bytes[s] as f64 / positions as f64;
        let mut line = format!(
            "{tail:>8.0e} {k:>6} {bpp:>12.0} {:>8.1}",
            llama_bytes as f64 / bpp
        );
        for (c, alias) in candidates.iter().enumerate() {
            let mut e = errors[s][c].clone();
            e.sort_by(f64::total_cmp);
            let mean = e.iter().sum::<f64>() / e.len() as f64;
            let p99 = quantgate::measure::quantile(&e, 0.99);
            line.push_str(&format!(
                "  {}: {mean:.1e}/{p99:.1e}/{:.1e}",
                alias.trim_start_matches("smollm2-"),
                e.last().unwrap()
            ));
            if (tail, k) == (tail0, k0) && mean > 1e-6 {
                ok = false;
            }
        }
        if (tail, k) == (tail0, k0) {
            line.push_str("  (default)");
            if llama_bytes as f64 / bpp < 10.0 {
                size_note = true;
            }
        }
        println!("{line}");
    }
    let mut line = format!("{:>8} {:>6} {llama_bytes:>12} {:>8.1}", "llama", "u16", 1.0);
    for (c, alias) in candidates.iter().enumerate() {
        let mut e = llama_err[c].clone();
        e.sort_by(f64::total_cmp);
        let mean = e.iter().sum::<f64>() / e.len() as f64;
        line.push_str(&format!(
            "  {}: {mean:.1e}/{:.1e}/{:.1e}",
            alias.trim_start_matches("smollm2-"),
            quantgate::measure::quantile(&e, 0.99),
            e.last().unwrap()
        ));
    }
    println!("{line}  (llama-perplexity's 16-bit rows and its −16 floor)");
    println!(
        "frontier of a smaller row (top K exact, the rest in L groups of companded probability \
         (p/p_hi)^γ, exact group masses; bytes as an ideal order-0 entropy coder would store them):"
    );
    println!(
        "{:>6} {:>5} {:>5} {:>10} {:>6}  |KL error| per position: mean / p99 / max, by model",
        "K", "γ", "L", "bytes/pos", "ratio"
    );
    for (f, &(k, gamma, levels)) in FRONTIER.iter().enumerate() {
        let bpp = frontier[f].0 / positions as f64;
        let mut line = format!(
            "{k:>6} {gamma:>5.2} {levels:>5} {bpp:>10.0} {:>6.1}",
            llama_bytes as f64 / bpp
        );
        let mut worst: f64 = 0.0;
        for (c, alias) in candidates.iter().enumerate() {
            let mut e = frontier[f].1[c].clone();
            e.sort_by(f64::total_cmp);
            let mean = e.iter().sum::<f64>() / e.len() as f64;
            worst = worst.max(mean);
            line.push_str(&format!(
                "  {}: {mean:.1e}/{:.1e}/{:.1e}",
                alias.trim_start_matches("smollm2-"),
                quantgate::measure::quantile(&e, 0.99),
                e.last().unwrap()
            ));
        }
        let goal = bpp <= llama_bytes as f64 / 10.0 && worst <= 1e-6;
        println!("{line}{}", if goal { "  (meets the goal)" } else { "" });
    }
    let share = measure.as_secs_f64() / decode.as_secs_f64();
    println!(
        "decode {:.2} s, KL + per-position statistics {:.3} s: {:.2}% of decode (target ≤ 5%)",
        decode.as_secs_f64(),
        measure.as_secs_f64(),
        100.0 * share
    );
    if share > 0.05 {
        ok = false;
    }
    if size_note {
        println!(
            "size: the default misses the 1/10 goal. SmolLM2's tail is flat (4% of the mass lies \
             beyond its top 512 entries): on the frontier above, ≤ 1e-6 on every model needs \
             ~56 kB/position even entropy-coded, and at the goal's ~10 kB the error is 1e-5 to 1e-3; \
             the one-byte-per-entry tail keeps the error ≤ 1e-6 and misses the size instead."
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        println!("a target was missed");
        ExitCode::FAILURE
    }
}

/// llama-perplexity's KLD for one position: the reference row stored as
/// its 16-bit log-probs (min clamped at max − 16), summed over entries with
/// log-prob > −16; the candidate side in f64.
fn llama_kl(ref_row: &[f32], cand_row: &[f32]) -> f64 {
    let max = ref_row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let min = ref_row
        .iter()
        .copied()
        .fold(f32::INFINITY, f32::min)
        .max(max - 16.0);
    let sum: f64 = ref_row.iter().map(|&l| f64::from((l - max).exp())).sum();
    let lse = sum.ln() as f32;
    let min_lp = min - max - lse;
    let scale = (max - min) / 65535.0;
    let inv = 1.0 / scale;
    let m = cand_row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let cl = m + cand_row
        .iter()
        .map(|&v| (f64::from(v) - m).exp())
        .sum::<f64>()
        .ln();
    let mut kl = 0.0;
    for (j, &l) in ref_row.iter().enumerate() {
        let u = if l > min {
            (inv * (l - min)).round()
        } else {
            0.0
        };
        let lp = scale * u + min_lp;
        if lp > -16.0 {
            let lp = f64::from(lp);
            kl += lp.exp() * (lp - (f64::from(cand_row[j]) - cl));
        }
    }
    kl
}

/// A reference row in the frontier's grouped form (see [`FRONTIER`]).
struct Grouped {
    /// Kept ids and their exact log-probs.
    kept: Vec<(usize, f64)>,
    /// Group per vocabulary id (u32::MAX: kept).
    group: Vec<u32>,
    /// Per group: exact mass and count.
    mass: Vec<f64>,
    count: Vec<u32>,
    /// Σ_tail p·lp (exact) and Σ_tail (p̃ − p)·lp (exact rounding term).
    neg_entropy: f64,
    rounding: f64,
    /// Bytes this row would take.
    bytes: f64,
}

impl Grouped {
    /// The row's ids, most probable first, and its exact log-probs.
    fn sorted(row: &[f32]) -> (Vec<usize>, Vec<f64>) {
        let lse = log_sum_exp(row);
        let lp: Vec<f64> = row.iter().map(|&l| f64::from(l) - lse).collect();
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        (order, lp)
    }

    fn of(order: &[usize], lp: &[f64], k: usize, gamma: f64, levels: usize) -> Grouped {
        let row = lp;
        let p_hi = lp[order[k]].exp();
        let kept: Vec<(usize, f64)> = order[..k].iter().map(|&j| (j, lp[j])).collect();
        let mut group = vec![u32::MAX; row.len()];
        let mut mass: Vec<f64> = Vec::new();
        let mut count: Vec<u32> = Vec::new();
        for &j in &order[k..] {
            let u = (lp[j].exp() / p_hi).powf(gamma);
            let g = ((u * levels as f64).floor() as usize).min(levels - 1);
            if g >= mass.len() {
                mass.resize(g + 1, 0.0);
                count.resize(g + 1, 0);
            }
            group[j] = g as u32;
            mass[g] += lp[j].exp();
            count[g] += 1;
        }
        let (mut neg_entropy, mut rounding) = (0.0, 0.0);
        for &j in &order[k..] {
            let g = group[j] as usize;
            let p = lp[j].exp();
            neg_entropy += p * lp[j];
            rounding += (mass[g] / f64::from(count[g]) - p) * lp[j];
        }
        let n = (row.len() - k) as f64;
        let entropy_bits: f64 = count
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| -f64::from(c) * (f64::from(c) / n).log2())
            .sum();
        let used = count.iter().filter(|&&c| c > 0).count() as f64;
        let bytes = 40.0 + k as f64 * 6.0 + entropy_bits / 8.0 + used * (4.0 + 4.0);
        Grouped {
            kept,
            group,
            mass,
            count,
            neg_entropy,
            rounding,
            bytes,
        }
    }

    /// KL(ref‖cand) from this form and the candidate's full row.
    fn kl(&self, cand: &[f32]) -> f64 {
        let lse = log_sum_exp(cand);
        let mut kl = 0.0;
        for &(j, lr) in &self.kept {
            kl += lr.exp() * (lr - (f64::from(cand[j]) - lse));
        }
        let mut sum_lc = vec![0.0f64; self.mass.len()];
        for (j, &g) in self.group.iter().enumerate() {
            if g != u32::MAX {
                sum_lc[g as usize] += f64::from(cand[j]) - lse;
            }
        }
        let cross: f64 = sum_lc
            .iter()
            .zip(&self.mass)
            .zip(&self.count)
            .filter(|(_, &c)| c > 0)
            .map(|((&s, &m), &c)| m / f64::from(c) * s)
            .sum();
        // Σ p·lc = Σ p̃·lc − Σ (p̃ − p)·lc ≈ Σ p̃·lc − Σ (p̃ − p)·lr
        kl + self.neg_entropy - (cross - self.rounding)
    }
}

/// `ln Σ exp(l)` of a row in f64 (libm `exp`), the exact normaliser.
fn log_sum_exp(row: &[f32]) -> f64 {
    let m = f64::from(row.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    row.iter()
        .map(|&l| (f64::from(l) - m).exp())
        .sum::<f64>()
        .ln()
        + m
}
