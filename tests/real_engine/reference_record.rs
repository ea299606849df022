//! The F16 reference record (suites/data/wikitext2-smollm2-ids.f16.jsonl)
//! stands in for the F16 model exactly: every paired metric against the
//! record equals, bitwise, the metric against the live model, and the record
//! reproduces F16's own mean NLL, PPL and top-1 count.

use quantgate::core::Status;
use quantgate::engine::llama::LlamaEngine;
use quantgate::execute::RunContext;
use quantgate::plan::plan;
use std::sync::Arc;

#[test]
fn record_reproduces_the_live_reference_exactly() {
    let suites = quantgate::harness::project_root().join("suites");
    let patterns = vec![
        "ppl/resets.toml".to_string(),
        "ppl/resets_record.toml".to_string(),
    ];
    let models = vec!["smollm2-q4_k_m".to_string()];
    let (registry, planned) = plan(&suites, &patterns, &models).unwrap();
    let runner = RunContext::new(
        &quantgate::Config::load().unwrap(),
        registry,
        Arc::new(LlamaEngine::new()),
        2,
    );
    let out: Vec<_> = planned
        .iter()
        .map(|p| quantgate::schedule::trial(&runner, p, std::path::Path::new("goldens")))
        .collect();
    let live = out.iter().find(|o| o.case == "ppl/resets").unwrap();
    let rec = out.iter().find(|o| o.case == "ppl/resets_record").unwrap();
    assert_eq!(live.status, Status::Pass, "{:?}", live.error);
    assert_eq!(rec.status, Status::Pass, "{:?}", rec.error);
    assert_eq!(live.metrics.len(), rec.metrics.len());
    for (k, v) in &live.metrics {
        let r = rec.metrics[k];
        assert!(
            v.to_bits() == r.to_bits() || (v.is_nan() && r.is_nan()),
            "{k}: live {v} vs record {r}"
        );
    }
    // The record's own figures are F16's, scored directly.
    let (registry, f16) = plan(&suites, &["ppl/resets.toml".to_string()], &[]).unwrap();
    let mut p = f16[0].clone();
    p.model = "smollm2-f16".into();
    p.name = "ppl/resets::smollm2-f16".into();
    let runner = RunContext::new(
        &quantgate::Config::load().unwrap(),
        registry,
        Arc::new(LlamaEngine::new()),
        2,
    );
    let f = quantgate::schedule::trial(&runner, &p, std::path::Path::new("goldens"));
    assert!(f.error.is_none(), "{:?}", f.error);
    assert_eq!(
        f.metrics["nll_mean"].to_bits(),
        rec.metrics["nll_mean_ref"].to_bits()
    );
    assert_eq!(f.metrics["ppl"].to_bits(), rec.metrics["ppl_ref"].to_bits());
    assert_eq!(f.metrics["top1_matches"], rec.metrics["top1_matches_ref"]);
    assert_eq!(f.metrics["tokens_scored"], 1024.0);
    // F16 against itself: exactly zero.
    assert_eq!(f.metrics["delta_nll_mean"], 0.0);
}
