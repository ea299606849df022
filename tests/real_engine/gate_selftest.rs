//! Self-test of the release gates on real quants that must fail them:
//! Q3_K_M and Q2_K of SmolLM2 against F16 fail the +0.05 ΔNLL gate, whose
//! failure message names the metric, the observed value, its 95% interval
//! and the threshold (the interval lies above it); Q2_K fails the KLD gates
//! of suites/kld/wikitext2.toml, each named with its observed value. One
//! test, planned by observation: Q2_K's two cases share one decode, and
//! the F16 reference is scored once for both. Q2_K also fails the ΔNLL gate
//! decided sequentially over up to 80 windows, long before the 80th, with
//! its sequence's lower bound above the threshold, and the KL gate decided
//! sequentially over up to 48 windows within a few of them.

use quantgate::core::{Outcome, Status};
use quantgate::engine::llama::LlamaEngine;
use quantgate::execute::RunContext;
use quantgate::plan::plan;
use std::sync::Arc;

#[test]
fn q3_and_q2_fail_the_delta_nll_and_kld_gates_with_readable_messages() {
    let repo = quantgate::harness::project_root();
    let root = crate::common::scratch("gate-selftest");
    std::fs::create_dir_all(root.join("ppl")).unwrap();
    std::fs::create_dir_all(root.join("kld")).unwrap();
    std::fs::copy(repo.join("suites/models.toml"), root.join("models.toml")).unwrap();
    std::os::unix::fs::symlink(repo.join("suites/data"), root.join("data")).unwrap();
    for (fixture, dest) in [
        ("gate_fails", "ppl"),
        ("kld_fails", "kld"),
        ("gate_fails_sequential", "ppl"),
        ("kld_fails_sequential", "kld"),
    ] {
        std::fs::copy(
            repo.join(format!("tests/fixtures/{fixture}.toml")),
            root.join(format!("{dest}/{fixture}.toml")),
        )
        .unwrap();
    }
    let (registry, planned) = plan(&root, &[], &[]).unwrap();
    let runner = RunContext::new(
        &quantgate::Config::load().unwrap(),
        registry,
        Arc::new(LlamaEngine::new()),
        2,
    );
    assert_eq!(planned.len(), 5);
    let outcomes = crate::common::run_planned(runner, &planned, 1);
    let by_name = |name: &str| -> &Outcome {
        outcomes
            .iter()
            .find(|o| format!("{}::{}", o.case, o.model) == name)
            .unwrap_or_else(|| panic!("no outcome for {name}"))
    };
    for name in [
        "ppl/gate_fails::smollm2-q3_k_m",
        "ppl/gate_fails::smollm2-q2_k",
    ] {
        let o = by_name(name);
        assert_eq!(o.status, Status::Fail, "{name}: {:?}", o.error);
        let msg = o.failure_message().unwrap();
        let want_prefix = format!("{name}: gate violated\n  delta_nll_mean = ");
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
        assert!(lo > 0.05, "{name}: interval starts at {lo}");
        eprintln!("{msg}");
    }
    let o = by_name("kld/kld_fails::smollm2-q2_k");
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
    // The kld case's paired ΔNLL (from the stored F16 rows) is bitwise the
    // perplexity case's (from the F16 scores) on the same shared decode.
    assert_eq!(
        o.metrics["delta_nll_mean"].to_bits(),
        by_name("ppl/gate_fails::smollm2-q2_k").metrics["delta_nll_mean"].to_bits()
    );
    // Q2_K was decoded at most once for its two cases: in one shared
    // decode, or (a reference store warm from an earlier run or test) the
    // perplexity case read the scores a decode kept: its decode stage is
    // that read, milliseconds, where decoding 16 windows of Q2_K takes tens
    // of seconds. The kld case then decoded them (seconds) or read the
    // comparisons a kld case on the same windows kept (README's publisher
    // test's, in a whole run: no decode at all).
    let ppl = by_name("ppl/gate_fails::smollm2-q2_k");
    assert!(
        o.timings.shared_with == 1
            || (o.timings.shared_with == 0
                && ppl.timings.decode < std::time::Duration::from_secs(1)),
        "kld {:?}, ppl {:?}",
        o.timings,
        ppl.timings
    );
    eprintln!("{msg}");
    let o = by_name("ppl/gate_fails_sequential::smollm2-q2_k");
    assert_eq!(o.status, Status::Fail, "{:?}", o.error);
    let used = o.metrics["windows"];
    assert!(used <= 16.0, "Q2_K decided after {used} of 80 windows");
    assert_eq!(o.metrics["windows_total"], 80.0);
    let lo = o.metrics["delta_nll_mean_seq_lo"];
    assert!(lo > 0.05, "the sequence's lower bound {lo}");
    let msg = o.failure_message().unwrap();
    assert!(
        msg.contains(&format!(
            "delta_nll_mean.seq_hi = {} (anytime-valid sequence {lo:.6} … ",
            o.metrics["delta_nll_mean_seq_hi"]
        )) && msg.contains(&format!(
            "after {used} windows) violates delta_nll_mean.seq_hi ≤ 0.05"
        )),
        "{msg}"
    );
    assert!(
        o.texts["decided"].contains(&format!(
            "gate[0] delta_nll_mean <= 0.05: fail at window {used} of 80"
        )),
        "{:?}",
        o.texts
    );
    eprintln!("{msg}\n{}", o.texts["decided"]);
    let o = by_name("kld/kld_fails_sequential::smollm2-q2_k");
    assert_eq!(o.status, Status::Fail, "{:?}", o.error);
    let used = o.metrics["windows"];
    assert!(used <= 8.0, "Q2_K's KL decided after {used} of 48 windows");
    assert_eq!(o.metrics["windows_total"], 48.0);
    let lo = o.metrics["kld_mean_seq_lo"];
    assert!(lo > 0.1, "the sequence's lower bound {lo}");
    let msg = o.failure_message().unwrap();
    assert!(
        msg.contains(&format!(
            "after {used} windows) violates kld_mean.seq_hi ≤ 0.1"
        )),
        "{msg}"
    );
    assert!(
        o.texts["decided"].contains(&format!(
            "gate[0] kld_mean <= 0.1: fail at window {used} of 48"
        )),
        "{:?}",
        o.texts
    );
    eprintln!("{msg}\n{}", o.texts["decided"]);
    let _ = std::fs::remove_dir_all(&root);
}
