//! Self-test of the +0.05 ΔNLL gate on real quants that must fail it
//! (Q3_K_M and Q2_K of SmolLM2 against F16): the harness reports a failure
//! whose message names the metric, the observed value, its 95% interval and
//! the threshold, and the interval lies above the threshold.

use quantgate::core::Status;
use quantgate::engine::llama::LlamaEngine;
use quantgate::execute::RunContext;
use quantgate::plan::plan;
use std::sync::Arc;

#[test]
fn q3_and_q2_fail_the_delta_nll_gate_with_a_readable_message() {
    let repo = quantgate::harness::project_root();
    let root = std::env::temp_dir().join(format!("qg-gate-selftest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("ppl")).unwrap();
    std::fs::copy(repo.join("suites/models.toml"), root.join("models.toml")).unwrap();
    std::os::unix::fs::symlink(repo.join("suites/data"), root.join("data")).unwrap();
    std::fs::copy(
        repo.join("tests/fixtures/gate_fails.toml"),
        root.join("ppl/gate_fails.toml"),
    )
    .unwrap();
    let (registry, planned) = plan(&root, &[], &[]).unwrap();
    let runner = RunContext::new(registry, Arc::new(LlamaEngine::new()), 2);
    assert_eq!(planned.len(), 2);
    for p in &planned {
        let o = quantgate::judge::trial(&runner, p, std::path::Path::new("goldens"));
        assert_eq!(o.status, Status::Fail, "{}: {:?}", p.name, o.error);
        let msg = o.failure_message().unwrap();
        let want_prefix = format!("{}: gate violated\n  delta_nll_mean = ", p.name);
        assert!(msg.starts_with(&want_prefix), "{msg}");
        assert!(
            msg.contains(" over 16 windows) violates delta_nll_mean ≤ 0.05 (max 0.05)"),
            "{msg}"
        );
        let (lo, mean) = (o.metrics["delta_nll_ci95_lo"], o.metrics["delta_nll_mean"]);
        assert!(
            msg.contains(&format!("delta_nll_mean = {mean} (95% CI {lo:.6} … ")),
            "{msg}"
        );
        // Not a near miss: the whole interval is above the gate.
        assert!(lo > 0.05, "{}: interval starts at {lo}", p.name);
        eprintln!("{msg}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Q2_K against F16 fails the KLD gates of suites/kld/wikitext2.toml: the
/// mean, the 99th percentile and the Wilson lower bound of top-1 agreement,
/// each named with its observed value.
#[test]
fn q2_fails_the_kld_gates() {
    let repo = quantgate::harness::project_root();
    let root = std::env::temp_dir().join(format!("qg-kld-selftest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("kld")).unwrap();
    std::fs::copy(repo.join("suites/models.toml"), root.join("models.toml")).unwrap();
    std::os::unix::fs::symlink(repo.join("suites/data"), root.join("data")).unwrap();
    std::fs::copy(
        repo.join("tests/fixtures/kld_fails.toml"),
        root.join("kld/kld_fails.toml"),
    )
    .unwrap();
    let (registry, planned) = plan(&root, &[], &[]).unwrap();
    let runner = RunContext::new(registry, Arc::new(LlamaEngine::new()), 2);
    assert_eq!(planned.len(), 1);
    let o = quantgate::judge::trial(&runner, &planned[0], std::path::Path::new("goldens"));
    assert_eq!(o.status, Status::Fail, "{:?}", o.error);
    let msg = o.failure_message().unwrap();
    for (metric, shown, bound) in [
        ("kld_mean", "kld_mean", "≤ 0.1"),
        ("kld_p99", "kld_p99", "≤ 0.5"),
        ("same_top_wilson95_lo", "same_top.wilson95_lo", "≥ 0.8"),
    ] {
        let v = o.metrics[metric];
        assert!(
            msg.contains(&format!("{shown} = {v} violates {shown} {bound}")),
            "{metric}: {msg}"
        );
    }
    // Not near misses.
    assert!(o.metrics["kld_mean"] > 0.2 && o.metrics["same_top"] < 0.75);
    eprintln!("{msg}");
    let _ = std::fs::remove_dir_all(&root);
}
