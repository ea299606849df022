use super::*;
use crate::core::GateResult;

/// Every row of `model` in the card's tables (main, gates, details), one
/// line each.
fn card_rows(md: &str, model: &str) -> String {
    md.lines()
        .filter(|l| l.starts_with(&format!("| {model} ")))
        .collect::<Vec<_>>()
        .join("\n")
}

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
        sequence: None,
        level: Default::default(),
        title: "ΔNLL ≤ 0.05 nats/token".into(),
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
    // The main table says FAIL; the gates table names the gate in the
    // kind's words, with the value it read.
    let q2 = card_rows(&md, "q2");
    assert!(q2.contains("| ✗ **FAIL** (1 of 1 gates) |"), "{q2}");
    assert!(md.contains("| model | ΔNLL ≤ 0.05 nats/token |"), "{md}");
    assert!(q2.contains("| q2 | ✗ 0.2000 |"), "{q2}");
    assert!(card_rows(&md, "q8").contains("| q8 | – |"), "{md}");
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

/// Every metric a kind's presentation reads (cells, CSV fields, plots) is
/// one its cases declare: a misspelt name would show as missing forever.
/// Checked on this repository's suites, which hold a case of every kind
/// the report shows.
#[test]
fn presentations_read_only_declared_metrics() {
    use crate::core::present::{Field, Spread};
    use std::collections::BTreeSet;
    let suites = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("suites");
    let (_, planned) = crate::plan::plan(&suites, &[], &[]).unwrap();
    let mut declared: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for p in &planned {
        if let Ok(parsed) = &p.case {
            declared
                .entry(parsed.case.kind)
                .or_default()
                .extend(parsed.case.metric_names());
        }
    }
    let catalog = crate::kinds::presentations();
    assert!(catalog.len() >= 6, "{}", catalog.len());
    for pres in catalog {
        let names = declared
            .get(pres.kind)
            .unwrap_or_else(|| panic!("no case of kind {} under suites/", pres.kind));
        let mut read: Vec<&str> = Vec::new();
        for c in &pres.columns {
            read.extend(c.cell.metrics());
            read.extend(c.csv.iter().filter_map(|(_, f)| match f {
                Field::Metric(m) => Some(*m),
                Field::Derived(_) => None,
            }));
        }
        for plot in &pres.plots {
            match plot {
                Plot::Frontier { metric, spread, .. } => {
                    read.push(metric);
                    match spread {
                        Spread::Bounds(lo, hi) => read.extend([*lo, *hi]),
                        Spread::Se95(se) => read.push(se),
                    }
                }
                Plot::Quantiles { metrics, .. } => read.extend(metrics),
                Plot::Series { .. } => {}
            }
        }
        assert!(!read.is_empty(), "{}", pres.kind);
        for m in read {
            assert!(
                names.contains(m),
                "{}: `{m}` is not a declared metric",
                pres.kind
            );
        }
    }
}

/// Recitation and teacher-forcing cases join per case: a column per case
/// beside the row of the same model, in Markdown and CSV; a model without
/// that case's outcome shows a dash; a model with only such outcomes opens
/// no row.
#[test]
fn pi_cases_are_columns_per_case_beside_their_model() {
    let ppl = |m: &str| outcome("ppl/x", m, &[("ppl", 10.0)]);
    let recite = |case: &str, m: &str, first: f64| {
        let mut o = outcome(
            case,
            m,
            &[("first_error", first), ("units_expected", 1000.0)],
        );
        o.kind = "recite".into();
        o.reference = None;
        o
    };
    let mut tf = outcome(
        "pi/tf",
        "q8",
        &[("first_flip", 5.0), ("units", 1000.0), ("flips", 850.0)],
    );
    tf.kind = "teacher_forcing".into();
    let outcomes = [
        ppl("q8"),
        ppl("q2"),
        recite("pi/b", "q8", 32.0),
        recite("pi/a", "q8", 5.0),
        recite("pi/a", "q2", 0.0),
        recite("pi/a", "gemma", 7.0),
        tf,
    ];
    let facts = |_: &str| ModelFacts::default();
    let vs = views(&outcomes, &crate::kinds::presentations(), &facts);
    assert_eq!(vs.len(), 1);
    assert_eq!(vs[0].cases, ["ppl/x"]);
    let models: Vec<&str> = vs[0].rows.iter().map(|r| r.model.as_str()).collect();
    assert_eq!(models, ["q2", "q8"]);
    let md = markdown(&vs);
    let head = md.lines().find(|l| l.starts_with("| model ")).unwrap();
    let cols: Vec<&str> = head.split(" | ").collect();
    let at = |t: &str| {
        cols.iter()
            .position(|c| *c == t)
            .unwrap_or_else(|| panic!("{t}: {head}"))
    };
    let row = |m: &str| -> Vec<String> {
        let l = md
            .lines()
            .find(|l| l.starts_with(&format!("| {m} ")))
            .unwrap();
        l.split(" | ").map(String::from).collect()
    };
    let (a, b, f) = (
        at("first error pi/a"),
        at("first error pi/b"),
        at("first flip pi/tf"),
    );
    assert!(a < b && b < f, "{head}");
    assert_eq!(
        [&row("q8")[a], &row("q8")[b], &row("q8")[f]],
        ["5/1000", "32/1000", "5/1000"]
    );
    assert_eq!(
        [&row("q2")[a], &row("q2")[b], &row("q2")[f]],
        ["0/1000", "–", "–"]
    );
    let csv = csv(&vs);
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let q8: Vec<&str> = csv
        .lines()
        .find(|l| l.contains(",q8,"))
        .unwrap()
        .split(',')
        .collect();
    let field = |n: &str| q8[head.iter().position(|h| *h == n).unwrap()];
    assert_eq!(field("pi/a:first_error"), "5");
    assert_eq!(field("pi/b:units_expected"), "1000");
    assert_eq!(field("pi/tf:flips"), "850");
    assert!(md.contains("first error CASE") && md.contains("first flip CASE"));
}

/// A sequential case's columns (windows used of N, the sequence's bounds
/// at the stop) show only in a view where a row has them: a fixed-N run's
/// report keeps its columns, a sequential run's gains them.
#[test]
fn sequential_columns_show_only_where_a_row_has_them() {
    let facts = |_: &str| ModelFacts {
        bytes: Some(100),
        bpw: Some(8.5),
    };
    let fixed = outcome(
        "ppl/x",
        "q8",
        &[("ppl", 10.0), ("delta_nll_mean", 0.003), ("windows", 16.0)],
    );
    let md = markdown(&views(&[fixed], &crate::kinds::presentations(), &facts));
    assert!(!md.contains("windows used"), "{md}");
    assert!(!md.contains("sequence at stop"), "{md}");
    let seq = outcome(
        "ppl/s",
        "q8",
        &[
            ("ppl", 10.0),
            ("delta_nll_mean", 0.003),
            ("delta_nll_mean_seq_lo", -0.043),
            ("delta_nll_mean_seq_hi", 0.049),
            ("windows", 31.0),
            ("windows_total", 80.0),
        ],
    );
    let vs = views(&[seq], &crate::kinds::presentations(), &facts);
    let md = markdown(&vs);
    let row = card_rows(&md, "q8");
    assert!(md.contains("| windows used |"), "{md}");
    assert!(row.contains("| 31/80 |"), "{row}");
    assert!(row.contains("+0.0030 [-0.0430, +0.0490]"), "{row}");
    let csv = csv(&vs);
    let head = csv.lines().next().unwrap();
    assert!(
        head.contains("windows_total") && head.contains("delta_nll_mean_seq_hi"),
        "{head}"
    );
    // Every header once (two columns read `windows` and `delta_nll_mean`),
    // and every line as many fields as the header.
    let names: Vec<&str> = head.split(',').collect();
    let unique: std::collections::BTreeSet<&&str> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "{head}");
    for l in csv.lines().skip(1) {
        assert_eq!(l.split(',').count(), names.len(), "{l}");
    }
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    let q8: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(q8[at("windows")], "31", "{csv}");
}

/// A card where two models stopped at different windows (a sequential
/// case) shows both rows' PPL on the same windows, the reference's too,
/// and says so under the table; the ΔNLL stays each row's own.
#[test]
fn a_card_shows_ppl_on_the_windows_every_row_decoded() {
    use crate::kinds::scored_text::window_series;
    use crate::measure::WindowNll;
    let w = |nll: &[f64]| -> Vec<WindowNll> {
        nll.iter()
            .map(|&x| WindowNll {
                nll_sum: x * 256.0,
                nll_sq_sum: x * x * 256.0 + 40.0,
                count: 256,
                top1: 0,
            })
            .collect()
    };
    // One visiting order; `q8` stopped after 2 windows, `q6` after 4.
    let order = [5.0, 1.0, 7.0, 0.0];
    // The values in visiting order; an outcome keeps its windows' series
    // in window order (`in_window_order`), `window_order` the visits.
    let row = |model: &str, nll: &[f64], nll_ref: &[f64], bytes: f64| {
        let n = nll.len();
        let sorted = |x: &[f64]| -> Vec<f64> {
            let mut by: Vec<(f64, f64)> = order.iter().copied().zip(x.iter().copied()).collect();
            by.sort_by(|a, b| a.0.total_cmp(&b.0));
            by.into_iter().map(|p| p.1).collect()
        };
        let (nll, nll_ref) = (&sorted(nll)[..], &sorted(nll_ref)[..]);
        let m = crate::measure::perplexity::perplexity_metrics(&w(nll));
        let mut o = outcome(
            "ppl/s",
            model,
            &[
                ("ppl", m["ppl"]),
                ("ppl_se", m["ppl_se"]),
                ("delta_nll_mean", bytes),
                ("windows", n as f64),
                ("windows_total", 8.0),
            ],
        );
        o.series.extend(window_series(&w(nll), ""));
        o.series.extend(window_series(&w(nll_ref), "_ref"));
        o.series.insert("window_order".into(), order[..n].to_vec());
        o
    };
    let outcomes = vec![
        row("q8", &[3.0, 3.2], &[2.9, 3.1], 0.003),
        row("q6", &[3.1, 3.3, 2.0, 2.0], &[2.9, 3.1, 1.9, 1.9], 0.011),
    ];
    // As measured, q6 (over easier windows too) looks better than q8.
    assert!(outcomes[1].metrics["ppl"] < outcomes[0].metrics["ppl"]);
    let views = views(&outcomes, &crate::kinds::presentations(), &|_| {
        ModelFacts::default()
    });
    let ppl = |model: &str| {
        let r = views[0].rows.iter().find(|r| r.model == model).unwrap();
        r.metrics["ppl"]
    };
    assert!((ppl("q8") - 3.1f64.exp()).abs() < 1e-9, "{}", ppl("q8"));
    assert!((ppl("q6") - 3.2f64.exp()).abs() < 1e-9, "{}", ppl("q6"));
    assert!(ppl("q6") > ppl("q8"), "on the same windows q6 is worse");
    let md = markdown(&views);
    assert!(
        md.contains("PPL ± se is over the 2 windows every row decoded (of 8)"),
        "{md}"
    );
    assert!(md.contains(&format!("{:.4}", 3.2f64.exp())), "{md}");
    // ΔNLL is each row's own.
    assert!(md.contains("| 0.0110 |"), "{md}");
    // The reference is the first row, its PPL over the same windows (from
    // its candidates' outcomes), marked as the reference, no gate.
    let first = md
        .lines()
        .find(|l| l.starts_with("| ") && !l.starts_with("| model"))
        .unwrap();
    assert!(first.starts_with("| f16 "), "{md}");
    assert!(first.contains(&format!("{:.4}", 3.0f64.exp())), "{first}");
    assert!(first.ends_with("| reference |"), "{first}");
    let csv = csv(&views);
    assert!(csv.lines().nth(1).unwrap().contains(",reference,"), "{csv}");
    // Only the kinds that ran have columns (no column of dashes for MC,
    // KLD or speed), and their legends only.
    for absent in ["KLD mean", "MC accuracy", "pp t/s", "McNemar"] {
        assert!(!md.contains(absent), "{absent}: {md}");
    }
}

/// The reference row's PPL comes from the case its candidates' rows take
/// theirs from, or is left out: when that case's reference figure cannot
/// be said (a sequential case whose reference series are missing), the
/// row shows none, never the PPL of another case over other windows (the
/// bug CI's model-card test caught in 4f29954).
#[test]
fn the_reference_row_never_takes_a_figure_from_another_case() {
    let ppl = outcome(
        "ppl/x",
        "q8",
        &[("ppl", 20.0), ("ppl_se", 0.1), ("delta_nll_mean", 0.01)],
    );
    let kld = outcome(
        "kld/x",
        "q8",
        &[("ppl", 19.0), ("ppl_ref", 18.5), ("kld_mean", 0.01)],
    );
    let views = views_of(&[ppl.clone(), kld.clone()]);
    let no_ppl = |views: &[View]| {
        views[0]
            .rows
            .iter()
            .find(|r| r.reference)
            .is_none_or(|r| !r.metrics.contains_key("ppl"))
    };
    assert!(no_ppl(&views), "{:?}", views[0].rows);
    // With the perplexity case's own reference figure, the row shows it.
    let mut with = ppl;
    with.metrics.insert("ppl_ref".into(), 17.25);
    let views = views_of(&[with, kld]);
    let reference = views[0].rows.iter().find(|r| r.reference).unwrap();
    assert_eq!(reference.metrics["ppl"], 17.25);
    // Candidates of one case that disagree on the reference's figure
    // (other windows): none shown.
    let mut a = outcome("ppl/x", "q8", &[("ppl", 20.0), ("ppl_ref", 17.0)]);
    let mut b = outcome("ppl/x", "q4", &[("ppl", 21.0), ("ppl_ref", 17.5)]);
    a.status = Status::Pass;
    b.status = Status::Pass;
    let views = views_of(&[a, b]);
    assert!(no_ppl(&views), "{:?}", views[0].rows);
}

fn views_of(outcomes: &[Outcome]) -> Vec<View> {
    views(outcomes, &crate::kinds::presentations(), &|_| {
        ModelFacts::default()
    })
}

/// The KL distribution draws the gate on a quantile (kld_p99 ≤ 0.5) as a
/// line, as the frontier draws the gate on the mean; both plots label
/// their axes.
#[test]
fn the_kl_distribution_draws_the_gate_on_its_p99() {
    let q = [
        "kld_p01",
        "kld_p05",
        "kld_p10",
        "kld_median",
        "kld_p90",
        "kld_p95",
        "kld_p99",
        "kld_p999",
        "kld_max",
    ];
    let mut m: Vec<(&str, f64)> = q
        .iter()
        .enumerate()
        .map(|(i, k)| (*k, 1e-4 * (i + 1) as f64))
        .collect();
    m.push(("kld_mean", 0.01));
    m.push(("kld_mean_se", 0.001));
    let mut o = outcome("kld/x", "q4", &m);
    for (metric, t) in [("kld_p99", 0.5), ("kld_mean", 0.1)] {
        o.gates.push(GateResult {
            metric: metric.into(),
            bound: "max".into(),
            threshold: t,
            observed: Some(0.01),
            passed: true,
            interval: None,
            sequence: None,
            level: Default::default(),
            title: format!("{metric} ≤ {t}"),
        });
    }
    let facts = |_: &str| ModelFacts {
        bytes: Some(100),
        bpw: Some(4.5),
    };
    let vs = views(&[o], &crate::kinds::presentations(), &facts);
    let html = html(&vs, &[]);
    assert_eq!(html.matches("gate kld_p99 ≤ 0.5<").count(), 1, "{html}");
    assert_eq!(html.matches("gate kld_mean ≤ 0.1<").count(), 1, "{html}");
    assert!(html.contains(">KL (nats), log scale<") && html.contains(">bits per weight<"));
}
