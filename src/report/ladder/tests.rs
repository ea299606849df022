use super::*;
use crate::core::GateResult;

fn outcome(case: &str, model: &str, m: &[(&str, f64)]) -> Outcome {
    let build = crate::engine::Engine::build(&crate::engine::fake::FakeEngine::new());
    let mut o = Outcome::new(case, model, build);
    o.status = Status::Pass;
    o.reference = Some("f16".into());
    o.metrics = m.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    o.kind = match case.split('/').next() {
        Some("ppl") => "perplexity",
        Some(k) => k,
        None => "",
    }
    .to_string();
    o
}

/// A perplexity and a kld case on the same reference make one view; rows
/// are sorted by size, a missing metric is a dash (never 0), a failed
/// gate is named, and the top bins' flips are pooled with their Wilson
/// interval.
#[test]
fn one_view_per_reference_sorted_by_size() {
    let mut a = outcome(
        "ppl/x",
        "q8",
        &[("ppl", 10.0), ("ppl_se", 0.1), ("delta_nll_mean", 0.001)],
    );
    a.series
        .insert("delta_nll_per_window".into(), vec![0.001, 0.002]);
    let mut b = outcome("ppl/x", "q2", &[("ppl", 12.0), ("delta_nll_mean", 0.2)]);
    b.status = Status::Fail;
    b.gates.push(GateResult {
        metric: "delta_nll_mean".into(),
        bound: "max".into(),
        threshold: 0.05,
        observed: Some(0.2),
        passed: false,
        interval: None,
    });
    let swing = |p: f64| (p / (1.0 - p)).ln();
    let k = outcome(
        "kld/x",
        "q2",
        &[
            ("kld_mean", 0.3),
            ("flip_bin0_n", 100.0),
            ("flip_bin0_flips", 50.0),
            ("flip_bin0_min_swing", f64::NEG_INFINITY),
            ("flip_bin1_n", 30.0),
            ("flip_bin1_flips", 3.0),
            ("flip_bin1_min_swing", swing(0.99)),
            ("flip_bin2_n", 10.0),
            ("flip_bin2_flips", 1.0),
            ("flip_bin2_min_swing", swing(0.999)),
        ],
    );
    let facts = |m: &str| ModelFacts {
        bytes: Some(if m == "q8" { 200 } else { 100 }),
        bpw: Some(if m == "q8" { 8.5 } else { 2.6 }),
    };
    let mut sp = outcome(
        "speed/x",
        "q8",
        &[
            ("pp_tps_mean", 400.0),
            ("pp_tps_sd", 5.0),
            ("tg_tps_mean", 80.0),
            ("tg_tps_sd", 2.0),
        ],
    );
    sp.reference = None;
    let vs = views(&[k, b, a, sp], &crate::kinds::presentations(), &facts);
    assert_eq!(vs.len(), 1);
    let v = &vs[0];
    assert_eq!(v.cases, ["ppl/x", "kld/x"]);
    assert_eq!(v.rows[0].model, "q8");
    let t = crate::kinds::kld::top_flips(&v.rows[1].metrics).unwrap();
    assert_eq!((t.flips, t.n), (4, 40));
    assert!((t.edge - 0.99).abs() < 1e-9);
    assert_eq!(t.wilson, crate::measure::stats::wilson95(4, 40));
    let md = markdown(&vs);
    let q8 = md.lines().find(|l| l.starts_with("| q8 ")).unwrap();
    assert!(
        q8.contains("10.0000 ± 0.1000") && q8.contains("| – |"),
        "{q8}"
    );
    let q2 = md.lines().find(|l| l.starts_with("| q2 ")).unwrap();
    assert!(q2.contains("**FAIL** ppl/x: delta_nll_mean"), "{q2}");
    assert!(q2.contains("4/40 = 10.00%"), "{q2}");
    let csv = csv(&vs);
    assert_eq!(csv.lines().count(), 3, "{csv}");
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let q8c: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(head.len(), q8c.len());
    let col = |n: &str| head.iter().position(|h| *h == n).unwrap();
    assert_eq!(q8c[col("kld_mean")], "");
    assert_eq!(q8c[col("ppl")], "10");
    let html = html(&vs, &[]);
    assert!(html.contains("<svg"));
    for external in ["<script", "src=", "href=", "<link", "url("] {
        assert!(!html.contains(external), "not self-contained: {external}");
    }
    assert_eq!(html.matches("class=\"series\"").count(), 1);
    // The gate on ΔNLL is drawn on its plot, once, at its threshold.
    assert_eq!(
        html.matches("gate delta_nll_mean ≤ 0.05").count(),
        1,
        "{html}"
    );
}
