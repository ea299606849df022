//! `cargo bench --bench kld`: the compact reference store against exact
//! full-vocabulary KL, for two vocabularies: the SmolLM2 ladder vs F16
//! (49,152 entries) and Gemma-3-270M Q8_0 and Q4_K_S vs the F16 of its
//! fixture (262,144), on WikiText-2 (llama-perplexity windows, n_ctx 512;
//! `QG_BENCH_CHUNKS`, default 16; `QG_BENCH_VOCAB=SmolLM2` or `Gemma-3` for
//! one).
//!
//! Prints, per vocabulary: bytes per position of llama-perplexity's 16-bit
//! rows and of the store's file (the `.qgref` codec itself, read back and
//! checked), and the distribution (mean / p99 / max) of |KL − KL_exact| per
//! position per model, KL_exact the f64 sum over every entry with libm
//! `exp` — for the tool's rows, for the store (and its reverse KL); then a
//! few neighbouring settings of the store's tail (kept entries K,
//! companding γ, levels L; bytes as an order-0 entropy coder and as the
//! range coder would store them); then the time KL and the per-position
//! statistics take against the decode, and the store's write and read
//! times. Exits non-zero when a target is missed: the store at most 1/4 of
//! the tool's bytes with a mean |error| at most 1/10 of the tool's rows' on
//! every model, and (SmolLM2) KL within 5% of the decode time.
#[path = "../tests/common/mod.rs"]
mod common;

use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::BosPolicy;
use quantgate::execute::qgref::{decode as read_store, encode, CacheHeader};
use quantgate::execute::windows::Windowing;
use quantgate::execute::windows::{plan_windows, score_plan_with, ScoringPlan};
use quantgate::execute::RunContext;
use quantgate::kinds::kld::kld_metrics;
use quantgate::measure::kld::{compare, compress_row, DEFAULT_BINS};
use quantgate::models::Registry;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Neighbouring settings of the store's tail (measured, not stored): the
/// top `K` entries kept exactly, the rest grouped by a companded
/// probability, `g = ⌊L·(p/p_hi)^γ⌋` (p_hi the largest tail probability),
/// each group's exact mass, the tail's Σ p·lp and rounding term exact (the
/// store is K 256, γ 1/2, L 96). Bytes: the group codes as an ideal order-0
/// entropy coder would store them, plus the kept entries at 4 + 2 bytes
/// (f32 logit, id gap), the group masses and counts (8 bytes per used
/// group) and 40 bytes of row fields.
const FRONTIER: &[(usize, f64, usize)] = &[(256, 1.0 / 3.0, 64), (256, 0.5, 64), (256, 0.5, 128)];

/// The vocabularies measured: a reference and its candidates.
const VOCABULARIES: &[(&str, &str, &[&str])] = &[
    (
        "SmolLM2",
        "smollm2-f16",
        &[
            "smollm2-q8_0",
            "smollm2-q6_k",
            "smollm2-q4_k_m",
            "smollm2-q2_k",
        ],
    ),
    (
        "Gemma-3",
        "gemma3-270m-f16",
        &["gemma3-270m-q8_0", "gemma3-270m-q4_k_s"],
    ),
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
    let only = std::env::var("QG_BENCH_VOCAB").ok();
    let registry = Registry::load(&repo.join("suites/models.toml")).unwrap();
    let threads = quantgate::execute::threads_per_trial(1);
    let runner = RunContext::new(
        &quantgate::Config::load().unwrap(),
        registry,
        Arc::new(LlamaEngine::new()),
        threads,
    );
    let text = std::fs::read_to_string(repo.join("suites/data/wikitext-2-test.txt")).unwrap();
    let mut ok = true;
    for &(name, reference, candidates) in VOCABULARIES {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        ok &= vocabulary(
            &runner,
            name,
            (reference, candidates),
            &text,
            chunks,
            threads,
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        println!("a target was missed");
        ExitCode::FAILURE
    }
}

/// |error| per position: mean / p99 / max.
fn spread(e: &[f64]) -> (f64, f64, f64) {
    let mut e = e.to_vec();
    e.sort_by(f64::total_cmp);
    let mean = e.iter().sum::<f64>() / e.len() as f64;
    (
        mean,
        quantgate::measure::quantile(&e, 0.99),
        *e.last().unwrap(),
    )
}

/// Measure one vocabulary; whether the store met its targets.
fn vocabulary(
    runner: &RunContext,
    name: &str,
    (reference, candidates): (&str, &[&str]),
    text: &str,
    chunks: usize,
    threads: u32,
) -> bool {
    let load = |alias: &str| runner.load(alias).unwrap().1;
    let reference = load(reference);
    let info = reference.info().clone();
    let ids: Vec<i32> = common::token_ids(&*reference, text, BosPolicy::Model);
    let w = Windowing::LlamaPerplexity {
        n_ctx: 512,
        chunks: Some(chunks),
        skip: 0,
    };
    let plan = plan_windows(&ids, &w, info.add_bos.then_some(info.bos)).unwrap();
    let llama_bytes = 2 * (2 * info.n_vocab.div_ceil(2) + 4);
    let mut llama_err: Vec<Vec<f64>> = vec![Vec::new(); candidates.len()];
    let mut store_err: Vec<Vec<f64>> = vec![Vec::new(); candidates.len()];
    let mut store_rev_err: Vec<Vec<f64>> = vec![Vec::new(); candidates.len()];
    let mut store_bytes = 0usize;
    // Time to write and to read back the store's file.
    let mut coding = (Duration::ZERO, Duration::ZERO);
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
        let mut ref_default = Vec::new();
        score_plan_with(
            reference.clone(),
            &sub,
            512,
            threads,
            &Default::default(),
            false,
            &mut |r| {
                ref_rows.push(r.row.to_vec());
                ref_default.push(compress_row(r.row, r.stats, r.target, tail0, k0));
                Ok(())
            },
        )
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
        let h = CacheHeader {
            reference_sha256: String::new(),
            token_stream_sha256: String::new(),
            windowing: String::new(),
            settings: String::new(),
            build: String::new(),
            tail: tail0,
            max_kept: k0,
            positions: ref_default.len(),
            n_vocab: info.n_vocab,
            tokenizer_fingerprint: String::new(),
        };
        let t = Instant::now();
        let file = encode(&h, &ref_default, quantgate::core::auth::Seal::Plain);
        coding.0 += t.elapsed();
        let t = Instant::now();
        let (_, back) = read_store(&file, &h, quantgate::core::auth::Seal::Plain).unwrap();
        coding.1 += t.elapsed();
        assert!(back == ref_default, "the store reads back what it wrote");
        store_bytes += file.len();
        for (c, alias) in candidates.iter().enumerate() {
            let model = load(alias);
            let copy = quantgate::measure::kld::copy_flags(
                &sub.windows[0].window.tokens,
                sub.windows[0].first_scored,
                &sub.windows[0].targets,
            );
            let mut buf = Vec::new();
            let scored = score_plan_with(
                model.clone(),
                &sub,
                512,
                threads,
                &Default::default(),
                true,
                &mut |r| {
                    // Timed part: exactly what a kld case does per position.
                    // (row_stats runs once per row for NLL anyway; timed here too.)
                    let t = Instant::now();
                    let st =
                        std::hint::black_box(quantgate::measure::row_stats_exps(r.row, &mut buf));
                    let p = compare(
                        &ref_default[r.index],
                        r.row,
                        &st,
                        &buf,
                        r.target,
                        copy[r.index],
                    );
                    measure += t.elapsed();
                    let (ex, ex_rev) = exact_both(&ref_rows[r.index], r.row);
                    store_err[c].push((p.kl - ex).abs());
                    store_rev_err[c].push((p.kl_rev - ex_rev).abs());
                    default_pos[c].push(p);
                    llama_err[c].push((common::tool_kl(&ref_rows[r.index], r.row) - ex).abs());
                    for (f, g) in grouped.iter().enumerate() {
                        frontier[f].1[c].push((g[r.index].kl(r.row) - ex).abs());
                    }
                    Ok(())
                },
            )
            .unwrap();
            decode += scored.decode;
        }
        eprintln!("{name}: window {}/{} done", win + 1, plan.windows.len());
    }
    let t = Instant::now();
    for p in &default_pos {
        std::hint::black_box(kld_metrics(p, DEFAULT_BINS));
    }
    measure += t.elapsed();
    let short = |a: &str| a.rsplit('-').next().unwrap_or(a).to_string();
    println!(
        "\n{name}: {positions} positions per model, vocabulary {}; llama-perplexity stores \
         {llama_bytes} bytes/position",
        info.n_vocab
    );
    println!(
        "{:>24} {:>10} {:>7}  |KL error| per position: mean / p99 / max, by model",
        "format", "bytes/pos", "ratio"
    );
    let mut line = format!(
        "{:>24} {llama_bytes:>10} {:>7.2}",
        "llama-perplexity u16", 1.0
    );
    let tool: Vec<f64> = llama_err.iter().map(|e| spread(e).0).collect();
    for (c, alias) in candidates.iter().enumerate() {
        let (m, p, x) = spread(&llama_err[c]);
        line.push_str(&format!("  {}: {m:.1e}/{p:.1e}/{x:.1e}", short(alias)));
    }
    println!("{line}");
    let bpp = store_bytes as f64 / positions as f64;
    let mut line = format!(
        "{:>24} {bpp:>10.0} {:>7.2}",
        "quantgate store",
        bpp / llama_bytes as f64
    );
    let mut ok = bpp <= llama_bytes as f64 / 4.0;
    for (c, alias) in candidates.iter().enumerate() {
        let (m, p, x) = spread(&store_err[c]);
        line.push_str(&format!("  {}: {m:.1e}/{p:.1e}/{x:.1e}", short(alias)));
        ok &= m <= tool[c] / 10.0;
    }
    println!("{line}");
    let mut line = format!("{:>24} {:>10} {:>7}", "  its reverse KL", "", "");
    for (c, alias) in candidates.iter().enumerate() {
        let (m, p, x) = spread(&store_rev_err[c]);
        line.push_str(&format!("  {}: {m:.1e}/{p:.1e}/{x:.1e}", short(alias)));
    }
    println!("{line}");
    println!(
        "targets: store ≤ 1/4 of llama-perplexity's bytes ({:.0}) and mean |error| ≤ 1/10 of its \
         rows' on every model: {}",
        llama_bytes as f64 / 4.0,
        if ok { "met" } else { "MISSED" }
    );
    println!(
        "neighbouring settings (top K exact, the rest in L groups of companded probability \
         (p/p_hi)^γ, exact group masses; bytes as an order-0 entropy coder would store them; the \
         store is K 256, γ 0.5, L 96):"
    );
    for (f, &(k, gamma, levels)) in FRONTIER.iter().enumerate() {
        let b = frontier[f].0 / positions as f64;
        let mut line = format!("K {k:>4} γ {gamma:>4.2} L {levels:>4} {b:>10.0}");
        for (c, alias) in candidates.iter().enumerate() {
            let (m, p, x) = spread(&frontier[f].1[c]);
            line.push_str(&format!("  {}: {m:.1e}/{p:.1e}/{x:.1e}", short(alias)));
        }
        println!("{line}");
    }
    let share = measure.as_secs_f64() / decode.as_secs_f64();
    println!(
        "decode {:.2} s, KL + per-position statistics {:.3} s: {:.2}% of decode (target ≤ 5% on \
         SmolLM2); the store written in {:.3} s and read back (checked) in {:.3} s",
        decode.as_secs_f64(),
        measure.as_secs_f64(),
        100.0 * share,
        coding.0.as_secs_f64(),
        coding.1.as_secs_f64()
    );
    // The time target was set on SmolLM2, whose model decode is large
    // against its vocabulary; Gemma-3-270M's 262,144-entry rows against a
    // small model are reported, not gated.
    ok && (share <= 0.05 || name != "SmolLM2")
}

/// Exact f64 KL(ref‖cand) and KL(cand‖ref) over every entry.
fn exact_both(ref_row: &[f32], cand_row: &[f32]) -> (f64, f64) {
    let (a, b) = (
        common::exact_log_softmax(ref_row),
        common::exact_log_softmax(cand_row),
    );
    a.iter().zip(&b).fold((0.0, 0.0), |(f, r), (la, lb)| {
        (f + la.exp() * (la - lb), r + lb.exp() * (lb - la))
    })
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
        let bytes = 40.0 + k as f64 * 6.0 + used * 8.0 + entropy_bits / 8.0;
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
