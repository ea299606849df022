//! KL on real rows: SmolLM2 Q8_0 and Q2_K against F16 on one WikiText-2
//! window (255 positions, 49,152-entry vocabulary). The stored reference
//! row (exact top entries + the tail in companded groups) must give the
//! exact f64 KL over the whole vocabulary, computed independently with libm
//! `exp`, to a tenth of the error of llama-perplexity's own 16-bit rows on
//! the same positions.
use crate::common;

use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::BosPolicy;
use quantgate::execute::windows::Windowing;
use quantgate::execute::windows::{plan_windows, score_plan_with};
use quantgate::execute::RunContext;
use quantgate::measure::kld::{compare, compress_row, DEFAULT_MAX_KEPT, DEFAULT_TAIL};
use quantgate::models::Registry;
use std::sync::Arc;

#[test]
fn stored_reference_rows_give_the_exact_kl_on_real_models() {
    let repo = quantgate::harness::project_root();
    let reg = Registry::load(&repo.join("suites/models.toml")).unwrap();
    let runner = RunContext::new(
        &quantgate::Config::load().unwrap(),
        reg,
        Arc::new(LlamaEngine::new()),
        2,
    );
    let load = |alias: &str| runner.load(alias).unwrap().1;
    let f16 = load("smollm2-f16");
    let text = std::fs::read_to_string(repo.join("suites/data/wikitext-2-test.txt")).unwrap();
    let ids: Vec<i32> = common::token_ids(&*f16, &text, BosPolicy::Model);
    let info = f16.info().clone();
    let w = Windowing::LlamaPerplexity {
        n_ctx: 512,
        chunks: Some(1),
        skip: 3,
    };
    let plan = plan_windows(&ids, &w, info.add_bos.then_some(info.bos)).unwrap();
    let mut ref_rows = Vec::new();
    let mut stored = Vec::new();
    score_plan_with(
        f16.clone(),
        &plan,
        512,
        2,
        &Default::default(),
        false,
        &mut |r| {
            ref_rows.push(r.row.to_vec());
            stored.push(compress_row(
                r.row,
                r.stats,
                r.target,
                DEFAULT_TAIL,
                DEFAULT_MAX_KEPT,
            ));
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(stored.len(), 255);
    // SmolLM2's tail is real: most rows keep the cap and store a tail.
    assert!(stored.iter().filter(|r| r.tail.is_some()).count() > 200);
    for alias in ["smollm2-q8_0", "smollm2-q2_k"] {
        let cand = load(alias);
        let mut errs = Vec::new();
        let mut tool_errs = Vec::new();
        let mut rev_errs = Vec::new();
        score_plan_with(
            cand.clone(),
            &plan,
            512,
            2,
            &Default::default(),
            true,
            &mut |r| {
                let c = compare(&stored[r.index], r.row, r.stats, r.exps, r.target, false);
                let exact = common::exact_kl(&ref_rows[r.index], r.row);
                errs.push((c.kl - exact).abs());
                tool_errs.push((common::tool_kl(&ref_rows[r.index], r.row) - exact).abs());
                rev_errs.push((c.kl_rev - common::exact_kl(r.row, &ref_rows[r.index])).abs());
                // The true token's probabilities are exact, not stored approximations.
                let lp_true = common::exact_log_softmax(&ref_rows[r.index])[r.target];
                assert!((c.p_ref.ln() - lp_true).abs() < 1e-9);
                Ok(())
            },
        )
        .unwrap();
        let n = errs.len() as f64;
        let mean = errs.iter().sum::<f64>() / n;
        let max = errs.iter().copied().fold(0.0, f64::max);
        let rev_mean = rev_errs.iter().sum::<f64>() / n;
        let tool = tool_errs.iter().sum::<f64>() / n;
        eprintln!(
            "{alias}: |KL error| mean {mean:.2e}, max {max:.2e}; reverse mean {rev_mean:.2e}; \
             llama-perplexity's rows {tool:.2e}"
        );
        // Q8_0 2.3e-6 against 4.4e-5 here, Q2_K 3.7e-5 against 6.3e-4.
        assert!(
            mean <= tool / 10.0,
            "{alias}: mean |KL error| {mean} vs {tool}"
        );
        assert!(max <= 1e-3, "{alias}: max |KL error| {max}");
        assert!(
            rev_mean <= 1e-3,
            "{alias}: mean |reverse KL error| {rev_mean}"
        );
    }
}
