//! The book's metrics reference (`docs/src/metrics.md`), made from the
//! kinds' metric declarations so that it cannot go stale: per kind, every
//! metric its cases in a suites folder declare, how a golden compares it,
//! what the kind calls it and its unit, the intervals a gate's `on`
//! selects, and whether the terminal table and
//! a sequential gate use it. `tests/cli/package.rs` checks the book's copy.
//!
//! Contract: reads only declarations (`Kind::declared`, `headline`,
//! `sequential_metrics`); names no metric.

use crate::core::case::{Metric, MetricType, Tolerance};
use crate::core::error::Result;
use crate::kinds::{names, Kind};
use crate::plan::discover::all_cases;
use crate::plan::parse::parse_case;
use std::fmt::Write;
use std::path::Path;

/// The command that rewrites the book's copy (said in the file and in the
/// test that checks it).
pub const BLESS: &str = "QUANTGATE_BLESS_DOCS=1 cargo test --release --test cli package::";

/// The metrics reference for the cases under `suites` (as `docs/src/metrics.md`
/// holds it for this repository's `suites/`): a section per kind, in the
/// registry's order, each metric once (the first case that declares it
/// says how). Any case that does not parse is an error.
pub fn metrics_reference(suites: &Path) -> Result<String> {
    let mut by_kind: Vec<(&str, Vec<String>, Vec<Row>)> =
        names().into_iter().map(|k| (k, vec![], vec![])).collect();
    for found in all_cases(suites)? {
        let shown = Path::new("suites").join(&found.rel);
        let stem = found.rel.trim_end_matches(".toml");
        let parsed = parse_case(&found.path, &shown, stem)?;
        let Some((_, cases, rows)) = by_kind.iter_mut().find(|(k, _, _)| *k == parsed.case.kind)
        else {
            continue;
        };
        cases.push(format!("`{}`", shown.display()));
        let kind: &dyn Kind = parsed.kind.as_ref();
        let headline = kind.headline();
        let sequential = kind.sequential_metrics();
        for m in kind.declared() {
            if rows.iter().any(|r| r.metric.name == m.name) {
                continue;
            }
            rows.push(Row {
                headline: headline.is_empty() || headline.contains(&m.name.as_str()),
                sequential: sequential.contains(&m.name.as_str()),
                metric: m,
            });
        }
    }
    let mut out = String::new();
    let _ = write!(
        out,
        "# Metrics\n\n\
         <!-- Generated from the kinds' metric declarations \
         (quantgate::report::metrics_doc); tests/cli/package.rs checks it. \
         Rewrite it with `{BLESS}`. -->\n\n\
         Every metric a kind declares, as this repository's `suites/` declares them \
         (a case's parameters, such as kld's `bins`, a multiple-choice case's \
         `margin_bins` or a sequential gate, decide which appear). *What* is what the \
         kind calls it (the words a model card's gates use) and *unit* its unit \
         (none: a count, a ratio or a fraction). *Golden* says how a \
         golden compares the metric: a count exactly, a float within the kind's \
         tolerance (|a − b| ≤ atol + rtol·|b|; a case's `[tolerance]` overrides it), \
         or the case's default (atol {}, rtol {}). *Interval* names what a gate's \
         `on = \"NAME_lo\"` / `\"NAME_hi\"` selects. *Table*: shown in the terminal \
         table (the rest are in `--json`, the goldens and the report). *Sequential*: \
         decided by a sequential gate.\n",
        num(Tolerance::DEFAULT.atol),
        num(Tolerance::DEFAULT.rtol)
    );
    for (kind, cases, rows) in &by_kind {
        let _ = write!(out, "\n## `{kind}`\n\n");
        if rows.is_empty() {
            out.push_str("No case of this kind in `suites/`.\n");
            continue;
        }
        let _ = writeln!(out, "Declared by {}.\n", cases.join(", "));
        out.push_str("| metric | what | unit | golden | interval | table | sequential |\n");
        out.push_str("|---|---|---|---|---|---|---|\n");
        for r in rows {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} | {} | {} |",
                r.metric.name,
                r.metric.label.unwrap_or("").replace('|', "\\|"),
                r.metric.unit.unwrap_or(""),
                compared(&r.metric),
                intervals(&r.metric),
                if r.headline { "yes" } else { "" },
                if r.sequential { "yes" } else { "" },
            );
        }
    }
    Ok(out)
}

/// One metric of a kind's table.
struct Row {
    metric: Metric,
    headline: bool,
    sequential: bool,
}

fn compared(m: &Metric) -> String {
    match (&m.ty, &m.tolerance) {
        (MetricType::Count, _) => "exactly".into(),
        (_, Some((t, why))) => format!(
            "atol {:e}, rtol {:e} ({})",
            t.atol,
            t.rtol,
            why.replace('|', "\\|")
        ),
        (MetricType::Measurement, None) => format!(
            "a measurement: atol {}, rtol {}",
            num(Tolerance::MEASUREMENT.atol),
            num(Tolerance::MEASUREMENT.rtol)
        ),
        (MetricType::Float, None) => "the case's tolerance".into(),
    }
}

fn intervals(m: &Metric) -> String {
    m.intervals
        .iter()
        .map(|i| {
            let over = i
                .windows
                .as_deref()
                .map_or(String::new(), |w| format!(" over `{w}`"));
            format!("`{}`: `{}`, `{}`{over}", i.name, i.lo, i.hi)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A tolerance as a person writes it: `0`, `9`, `0.05`, `1e-6`.
fn num(x: f64) -> String {
    if x == 0.0 || (1e-3..1e4).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}
