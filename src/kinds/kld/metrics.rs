//! The kld kind's metrics: llama-perplexity's KLD block (mean, percentiles,
//! Δp, same top) and the flip bins by the reference's confidence, over all
//! scored positions and over the copy subset (`copy_*`), named here.

use crate::measure::kld::PosKld;
use crate::measure::stats::{mean_se, quantile, wilson95};
use std::collections::BTreeMap;

/// Percentile names and fractions of llama-perplexity's block.
const KLD_PCTS: &[(&str, f64)] = &[
    ("p999", 0.999),
    ("p99", 0.99),
    ("p95", 0.95),
    ("p90", 0.90),
    ("median", 0.5),
    ("p10", 0.10),
    ("p05", 0.05),
    ("p01", 0.01),
    ("p001", 0.001),
];

const DP_PCTS: &[(&str, f64)] = &[
    ("p999", 0.999),
    ("p99", 0.99),
    ("p95", 0.95),
    ("p90", 0.90),
    ("p75", 0.75),
    ("median", 0.5),
    ("p25", 0.25),
    ("p10", 0.10),
    ("p05", 0.05),
    ("p01", 0.01),
    ("p001", 0.001),
];

/// The metric names [`kld_metrics`] produces for `n_bins` edges.
pub fn metric_names(n_edges: usize) -> Vec<String> {
    let mut base: Vec<String> = vec![
        "positions".into(),
        "kld_mean".into(),
        "kld_mean_se".into(),
        "kld_max".into(),
        "kld_min".into(),
        "kld_rev_mean".into(),
        "approx_positions".into(),
        "dp_mean".into(),
        "dp_mean_se".into(),
        "dp_rms".into(),
        "dp_max".into(),
        "dp_min".into(),
        "same_top".into(),
        "same_top_wilson95_lo".into(),
        "same_top_wilson95_hi".into(),
    ];
    base.extend(KLD_PCTS.iter().map(|(n, _)| format!("kld_{n}")));
    base.extend(DP_PCTS.iter().map(|(n, _)| format!("dp_{n}")));
    for b in 0..=n_edges {
        for s in [
            "n",
            "flips",
            "rate",
            "rate_wilson95_lo",
            "rate_wilson95_hi",
            "min_swing",
        ] {
            base.push(format!("flip_bin{b}_{s}"));
        }
    }
    let mut all = base.clone();
    all.extend(base.iter().map(|m| format!("copy_{m}")));
    all
}

/// The statistics of a set of positions (all of them, and the copy subset
/// as `copy_*`), bins by reference top-1 probability at `edges`.
pub fn kld_metrics(positions: &[PosKld], edges: &[f64]) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    block(&mut m, "", positions.iter(), edges);
    block(&mut m, "copy_", positions.iter().filter(|p| p.copy), edges);
    m
}

fn block<'a>(
    m: &mut BTreeMap<String, f64>,
    prefix: &str,
    ps: impl Iterator<Item = &'a PosKld> + Clone,
    edges: &[f64],
) {
    let mut put = |k: &str, v: f64| {
        m.insert(format!("{prefix}{k}"), v);
    };
    let n = ps.clone().count();
    put("positions", n as f64);
    // No positions: no statistics (a gate on one then fails as missing,
    // and goldens never hold a NaN, which never matches).
    if n == 0 {
        return;
    }
    let mut kl: Vec<f64> = ps.clone().map(|p| p.kl).collect();
    let mut dp: Vec<f64> = ps.clone().map(PosKld::dp).collect();
    // NaN sorts last and poisons nothing silently: it propagates to max.
    kl.sort_by(f64::total_cmp);
    dp.sort_by(f64::total_cmp);
    let (kmean, kse) = mean_se(ps.clone().map(|p| p.kl));
    put("kld_mean", kmean);
    put("kld_mean_se", kse);
    put("kld_max", kl.last().copied().unwrap_or(f64::NAN));
    put("kld_min", kl.first().copied().unwrap_or(f64::NAN));
    for (name, f) in KLD_PCTS {
        put(&format!("kld_{name}"), quantile(&kl, *f));
    }
    put("kld_rev_mean", mean_se(ps.clone().map(|p| p.kl_rev)).0);
    put(
        "approx_positions",
        ps.clone().filter(|p| p.approximate).count() as f64,
    );
    let (dmean, dse) = mean_se(ps.clone().map(PosKld::dp));
    put("dp_mean", dmean);
    put("dp_mean_se", dse);
    put(
        "dp_rms",
        mean_se(ps.clone().map(|p| p.dp() * p.dp())).0.sqrt(),
    );
    put("dp_max", dp.last().copied().unwrap_or(f64::NAN));
    put("dp_min", dp.first().copied().unwrap_or(f64::NAN));
    for (name, f) in DP_PCTS {
        put(&format!("dp_{name}"), quantile(&dp, *f));
    }
    let same = ps.clone().filter(|p| !p.flip()).count();
    put(
        "same_top",
        if n == 0 {
            f64::NAN
        } else {
            same as f64 / n as f64
        },
    );
    let (lo, hi) = wilson95(same, n);
    put("same_top_wilson95_lo", lo);
    put("same_top_wilson95_hi", hi);
    for b in 0..=edges.len() {
        let lo_edge = if b == 0 { 0.0 } else { edges[b - 1] };
        let hi_edge = edges.get(b).copied().unwrap_or(f64::INFINITY);
        let inb = ps.clone().filter(|p| p.p1 >= lo_edge && p.p1 < hi_edge);
        let nb = inb.clone().count();
        let k = inb.filter(|p| p.flip()).count();
        let (wl, wh) = wilson95(k, nb);
        put(&format!("flip_bin{b}_n"), nb as f64);
        put(&format!("flip_bin{b}_flips"), k as f64);
        if nb > 0 {
            put(&format!("flip_bin{b}_rate"), k as f64 / nb as f64);
            put(&format!("flip_bin{b}_rate_wilson95_lo"), wl);
            put(&format!("flip_bin{b}_rate_wilson95_hi"), wh);
        }
        // A rival has probability ≤ 1 − p1, so a flip needs a log-odds swing
        // of at least ln(p1/(1−p1)), smallest at the bin's lower edge.
        let swing = if lo_edge <= 0.5 {
            0.0
        } else {
            (lo_edge / (1.0 - lo_edge)).ln()
        };
        put(&format!("flip_bin{b}_min_swing"), swing);
    }
}

/// What a reader calls a kld case's own metrics and their units (its
/// scored-text metrics are [`crate::kinds::perplexity::WINDOW_ABOUT`]'s).
pub(crate) const KLD_ABOUT: crate::core::case::About = &[
    ("positions", "positions compared", "positions"),
    ("kld_mean", "KLD mean", "nats"),
    ("kld_mean_se", "KLD mean standard error", "nats"),
    ("kld_max", "KLD max", "nats"),
    ("kld_min", "KLD min", "nats"),
    ("kld_median", "KLD median", "nats"),
    ("kld_p90", "KLD p90", "nats"),
    ("kld_p95", "KLD p95", "nats"),
    ("kld_p99", "KLD p99", "nats"),
    ("kld_p999", "KLD p99.9", "nats"),
    ("kld_rev_mean", "reverse KLD mean", "nats"),
    ("dp_mean", "Δp mean", ""),
    ("dp_rms", "Δp RMS", ""),
    ("same_top", "same top token", ""),
    (
        "same_top_wilson95_lo",
        "same top token, Wilson 95% lower bound",
        "",
    ),
    (
        "same_top_wilson95_hi",
        "same top token, Wilson 95% upper bound",
        "",
    ),
];

/// The flip bins [`kld_about`] names (a case has at most this many edges
/// plus one).
const FLIP_BINS_ABOUT: usize = 16;

/// [`KLD_ABOUT`], the flip bins' and the scored-text metrics'.
pub(crate) fn kld_about() -> crate::core::case::About {
    static ALL: std::sync::OnceLock<Vec<(&str, &str, &str)>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let mut all: Vec<(&str, &str, &str)> = crate::kinds::perplexity::WINDOW_ABOUT
            .iter()
            .chain(KLD_ABOUT)
            .copied()
            .collect();
        // The flip bins (a case's `bins` set their edges): made once, kept
        // for the process, as the declarations are.
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        for b in 0..=FLIP_BINS_ABOUT {
            for (s, what, unit) in [
                ("n", "positions", "positions"),
                ("flips", "flips", "positions"),
                ("rate", "flip rate", ""),
                ("rate_wilson95_lo", "flip rate, Wilson 95% lower bound", ""),
                ("rate_wilson95_hi", "flip rate, Wilson 95% upper bound", ""),
                ("min_swing", "smallest swing of a flip", "nats"),
            ] {
                all.push((
                    leak(format!("flip_bin{b}_{s}")),
                    leak(format!("{what} at reference p1 bin {b}")),
                    unit,
                ));
            }
        }
        all
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::kld::DEFAULT_BINS;

    #[test]
    fn stats_match_an_independent_computation() {
        let mut ps = Vec::new();
        for i in 0..200u32 {
            let x = f64::from(i);
            ps.push(PosKld {
                kl: (x * 0.37).sin().abs() * 0.1,
                kl_rev: 0.0,
                p_ref: (x * 0.11).cos().abs(),
                p_cand: (x * 0.13).cos().abs(),
                p1: f64::from(i % 100) / 100.0 + 0.004,
                ref_top: i % 7,
                cand_top: if i % 9 == 0 { 99 } else { i % 7 },
                copy: i % 3 == 0,
                approximate: false,
            });
        }
        let m = kld_metrics(&ps, DEFAULT_BINS);
        let mut kl: Vec<f64> = ps.iter().map(|p| p.kl).collect();
        kl.sort_by(f64::total_cmp);
        let mean = kl.iter().sum::<f64>() / 200.0;
        assert!((m["kld_mean"] - mean).abs() < 1e-15);
        // p99 by hand: h = 199·0.99 = 197.01.
        let p99 = kl[197] + 0.01 * (kl[198] - kl[197]);
        assert!((m["kld_p99"] - p99).abs() < 1e-15);
        assert_eq!(m["kld_median"], (kl[99] + kl[100]) / 2.0);
        let flips = ps.iter().filter(|p| p.cand_top != p.ref_top).count();
        assert!((m["same_top"] - (200 - flips) as f64 / 200.0).abs() < 1e-15);
        // Bins: p1 in [0.999, ∞) never happens here; [0.99, 0.999) holds i%100 == 99.
        assert_eq!(m["flip_bin4_n"], 0.0);
        // An empty bin has no rate: a gate on it fails as missing.
        assert!(!m.contains_key("flip_bin4_rate"));
        assert_eq!(m["flip_bin3_n"], 2.0);
        let bin1 = ps.iter().filter(|p| p.p1 >= 0.5 && p.p1 < 0.9);
        assert_eq!(m["flip_bin1_n"], bin1.clone().count() as f64);
        assert_eq!(
            m["flip_bin1_flips"],
            bin1.filter(|p| p.cand_top != p.ref_top).count() as f64
        );
        assert!((m["flip_bin3_min_swing"] - (0.99f64 / 0.01).ln()).abs() < 1e-12);
        assert_eq!(m["copy_positions"], 67.0);
        let dp_rms = (ps.iter().map(|p| p.dp() * p.dp()).sum::<f64>() / 200.0).sqrt();
        assert!((m["dp_rms"] - dp_rms).abs() < 1e-15);
        let names = metric_names(DEFAULT_BINS.len());
        assert!(m.keys().all(|k| names.contains(k)), "undeclared metric");
        assert!(m.values().all(|v| !v.is_nan()));
    }
}
