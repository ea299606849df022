//! How a kld case is shown: the report's columns, plots and legend, the
//! flips where the reference is most confident.

use crate::core::present::{Cell, Field, Join, Metrics, Plot, Presentation, ReportColumn, Spread};
use crate::kinds::perplexity::{window_columns, window_plots, windows_used_column, WINDOW_LEGEND};

/// Flips where the reference is most confident: the bins whose lower edge
/// is at least [`TOP_EDGE`] (else the last bin), pooled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TopFlips {
    /// Lower p1 edge of the pooled bins.
    pub edge: f64,
    /// Flips.
    pub flips: u64,
    /// Positions.
    pub n: u64,
    /// Wilson 95% interval of flips / n.
    pub wilson: (f64, f64),
}

/// The reference top-1 probability from which bins count as "top".
pub(crate) const TOP_EDGE: f64 = 0.99;

/// Pooled flips of the bins whose lower edge (recovered from
/// `flip_bin{b}_min_swing` = ln(p/(1−p))) is ≥ [`TOP_EDGE`], else of the last bin.
pub(crate) fn top_flips(m: &Metrics) -> Option<TopFlips> {
    let mut bins = Vec::new();
    for b in 0.. {
        let (Some(n), Some(k)) = (
            m.get(&format!("flip_bin{b}_n")),
            m.get(&format!("flip_bin{b}_flips")),
        ) else {
            break;
        };
        let edge = m
            .get(&format!("flip_bin{b}_min_swing"))
            .map_or(0.0, |s| 1.0 / (1.0 + (-s).exp()));
        bins.push((edge, *k as u64, *n as u64));
    }
    let last = bins.last()?.0;
    let from = if bins.iter().any(|b| b.0 >= TOP_EDGE - 1e-9) {
        TOP_EDGE - 1e-9
    } else {
        last
    };
    let top: Vec<_> = bins.iter().filter(|b| b.0 >= from).collect();
    let (flips, n) = top.iter().fold((0, 0), |(k, n), b| (k + b.1, n + b.2));
    Some(TopFlips {
        edge: top.first()?.0,
        flips,
        n,
        wilson: crate::measure::stats::wilson95(flips as usize, n as usize),
    })
}

/// The flips cell: `flips/n = rate% [Wilson 95%]`.
fn flips_cell(m: &Metrics) -> Option<String> {
    let t = top_flips(m)?;
    Some(if t.n == 0 {
        "0/0".into()
    } else {
        format!(
            "{}/{} = {:.2}% [{:.2}, {:.2}]",
            t.flips,
            t.n,
            t.flips as f64 / t.n as f64 * 100.0,
            t.wilson.0 * 100.0,
            t.wilson.1 * 100.0
        )
    })
}

/// What the kld columns mean.
const KLD_LEGEND: &str = "KLD: KL(reference ‖ model) per scored position, nats. Δp: p(true token) \
     − the reference's. Same top: positions whose argmax equals the reference's. Flips: \
     positions where the reference's top-1 probability is ≥ 0.99 and the model's argmax differs.";

/// How kld cases show in the ladder report: the scored-text columns, then
/// KLD mean/p99/max, Δp RMS, same top with its Wilson interval and the
/// flips where the reference is most confident.
pub(crate) fn present() -> Option<Presentation> {
    let number = |title, metric, digits, scale| {
        ReportColumn::new(
            title,
            Cell::Number {
                metric,
                digits,
                scale,
            },
        )
    };
    let mut columns = window_columns();
    let mut mean = number("KLD mean", "kld_mean", 5, 1.0).headline();
    mean.csv.push(("kld_mean_se", Field::Metric("kld_mean_se")));
    columns.extend([
        mean,
        number("KLD p99", "kld_p99", 4, 1.0).headline(),
        number("KLD max", "kld_max", 3, 1.0),
        number("Δp RMS %", "dp_rms", 3, 100.0),
        ReportColumn::new(
            "same top % [Wilson 95%]",
            Cell::Interval {
                metric: "same_top",
                lo: "same_top_wilson95_lo",
                hi: "same_top_wilson95_hi",
                digits: 2,
                scale: 100.0,
                signed: false,
                suffix: "%",
            },
        )
        .headline(),
        ReportColumn {
            title: "flips where p1 ≥ 0.99 [Wilson 95%]",
            cell: Cell::Text(flips_cell),
            csv: vec![
                (
                    "top_flip_edge",
                    Field::Derived(|m| Some(format!("{}", top_flips(m)?.edge))),
                ),
                (
                    "top_flips",
                    Field::Derived(|m| Some(top_flips(m)?.flips.to_string())),
                ),
                (
                    "top_flip_n",
                    Field::Derived(|m| Some(top_flips(m)?.n.to_string())),
                ),
                (
                    "top_flip_wilson95_lo",
                    Field::Derived(|m| Some(format!("{}", top_flips(m)?.wilson.0))),
                ),
                (
                    "top_flip_wilson95_hi",
                    Field::Derived(|m| Some(format!("{}", top_flips(m)?.wilson.1))),
                ),
            ],
            optional: false,
            headline: false,
        },
    ]);
    // A sequential case's: windows used, and the sequences at the stop of
    // the means a kld case gates (shown only where a row has them; a
    // sequential ΔNLL gate is a perplexity case's).
    columns.push(windows_used_column());
    let seq = |title, metric, lo, hi, digits, scale, suffix| {
        ReportColumn::new(
            title,
            Cell::Interval {
                metric,
                lo,
                hi,
                digits,
                scale,
                signed: false,
                suffix,
            },
        )
        .optional()
    };
    columns.extend([
        seq(
            "KLD mean [sequence at stop]",
            "kld_mean",
            "kld_mean_seq_lo",
            "kld_mean_seq_hi",
            5,
            1.0,
            "",
        ),
        seq(
            "same top % [sequence at stop]",
            "same_top",
            "same_top_seq_lo",
            "same_top_seq_hi",
            2,
            100.0,
            "%",
        ),
    ]);
    let mut plots = vec![Plot::Frontier {
        metric: "kld_mean",
        spread: Spread::Se95("kld_mean_se"),
        label: "KLD mean (nats)",
    }];
    plots.extend(window_plots());
    plots.push(Plot::Quantiles {
        metrics: [
            "kld_p01",
            "kld_p05",
            "kld_p10",
            "kld_median",
            "kld_p90",
            "kld_p95",
            "kld_p99",
            "kld_p999",
            "kld_max",
        ],
        floor: 1e-6,
        title: "KL divergence per position (p01 … max; below 1e-6 drawn at 1e-6)",
        ylabel: "KL (nats), log scale",
    });
    Some(Presentation {
        kind: "kld",
        join: Join::Reference,
        columns,
        plots,
        legend: vec![WINDOW_LEGEND, KLD_LEGEND],
        align: Some(crate::kinds::scored_text::same_windows),
        hub: vec![
            crate::core::present::HubMetric {
                metric: "kld_mean",
                hub_type: "kl_divergence",
                name: "KLD mean",
            },
            crate::core::present::HubMetric {
                metric: "same_top",
                hub_type: "same_top",
                name: "same top token",
            },
        ],
        reference: vec![("ppl", "ppl_ref")],
        unit: Some("windows"),
    })
}
