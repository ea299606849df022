//! How a kind's outcomes appear in the ladder report: its columns (the
//! table's cell and the CSV's fields), its plots and what they mean. A kind
//! declares its [`Presentation`] beside its metrics (`kinds::KINDS`); the
//! report lays out whatever the declarations say and never names a metric
//! of its own.
//!
//! Contract: a cell or field whose metric is missing shows as missing (`–`,
//! an empty CSV field), never as zero.

use std::collections::BTreeMap;

/// An outcome's metrics, by name.
pub(crate) type Metrics = BTreeMap<String, f64>;

/// A kind's part of the ladder report.
#[derive(Debug, Clone)]
pub struct Presentation {
    /// The kind (`Outcome::kind`).
    pub kind: &'static str,
    /// How its outcomes join the report's views.
    pub join: Join,
    /// Its columns, in order (a column another kind declared first under
    /// the same title is shown once, from the first case that has it).
    pub columns: Vec<ReportColumn>,
    /// Its plots, drawn once per view.
    pub plots: Vec<Plot>,
    /// What its columns mean, a sentence or a few each (said once).
    pub legend: Vec<&'static str>,
    /// Makes the outcomes of one case (every model of a view) show
    /// figures on the same data before they are laid out: the kind's own
    /// rule (a sequential case's rows stopped at different windows); a
    /// sentence saying what it did, for the view. None: shown as measured.
    pub align: Option<Align>,
    /// Its figures a model card's `model-index` lists (the Hub reads them).
    pub hub: Vec<HubMetric>,
    /// The reference's own figures, as its row shows them: (the metric
    /// the row shows, the metric of a candidate's outcome that holds the
    /// reference's value), e.g. `("ppl", "ppl_ref")`.
    pub reference: Vec<(&'static str, &'static str)>,
    /// What a case of the kind counts (`windows`, `tasks`): the metric
    /// holding how many it measured, and, for a sequential case, `<unit>_total`
    /// how many it could have; the report says it beside the case's data.
    /// None: it counts nothing the report names.
    pub unit: Option<&'static str>,
}

/// A metric as a Hugging Face model card's `model-index` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubMetric {
    /// The metric.
    pub metric: &'static str,
    /// The Hub's metric `type` (`perplexity`, `accuracy`, …).
    pub hub_type: &'static str,
    /// Its `name` on the card.
    pub name: &'static str,
}

/// A kind's [`Presentation::align`].
pub(crate) type Align = fn(&mut [crate::core::Outcome]) -> Option<String>;

/// How a kind's outcomes join the report's views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// A view per reference model: a case of the kind with a reference
    /// opens (or joins) that reference's view, one case per kind per view.
    Reference,
    /// Beside every view's row of the same model (a machine's speed).
    Model,
    /// Beside every view's row of the same model, a group of its columns
    /// per case of the kind (several recitation or teacher-forcing cases
    /// per model, each its own columns, named by the case).
    Case,
}

/// One column of the ladder: a cell in the table (unless `title` is
/// empty: CSV only) and its CSV fields.
#[derive(Debug, Clone)]
pub struct ReportColumn {
    /// The table header; empty for a column only the CSV has.
    pub title: &'static str,
    /// How the table shows it.
    pub cell: Cell,
    /// Its CSV fields: header and value, full precision.
    pub csv: Vec<(&'static str, Field)>,
    /// Shown only in a view where some row has every metric its cell
    /// reads (a sequential case's columns), not as a column of dashes.
    pub optional: bool,
    /// One of the few columns a model card's main table shows (PPL, ΔNLL,
    /// KLD mean and p99, same top, MC accuracy, t/s); the rest are in its
    /// details.
    pub headline: bool,
}

impl ReportColumn {
    /// A column whose CSV fields are the metrics `cell` reads, in order.
    pub(crate) fn new(title: &'static str, cell: Cell) -> Self {
        let csv = cell
            .metrics()
            .into_iter()
            .map(|m| (m, Field::Metric(m)))
            .collect();
        ReportColumn {
            title,
            cell,
            csv,
            optional: false,
            headline: false,
        }
    }

    /// The column, shown only where some row has its metrics.
    pub(crate) fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// The column, in a model card's main table.
    pub(crate) fn headline(mut self) -> Self {
        self.headline = true;
        self
    }

    /// A column only the CSV has: these metrics.
    pub(crate) fn csv_only(metrics: &[&'static str]) -> Self {
        ReportColumn {
            title: "",
            cell: Cell::Text(|_| None),
            csv: metrics.iter().map(|&m| (m, Field::Metric(m))).collect(),
            optional: false,
            headline: false,
        }
    }
}

/// How a table cell shows its metrics.
#[derive(Debug, Clone)]
pub enum Cell {
    /// `x` (times `scale`) with `digits` decimals.
    Number {
        /// The metric.
        metric: &'static str,
        /// Decimals.
        digits: usize,
        /// Shown as `x × scale` (100 for a percentage).
        scale: f64,
    },
    /// `x ± se`.
    PlusMinus {
        /// The metric.
        metric: &'static str,
        /// Its standard error (or deviation).
        se: &'static str,
        /// Decimals.
        digits: usize,
    },
    /// `x [lo, hi]`: the value and its interval.
    Interval {
        /// The metric.
        metric: &'static str,
        /// The interval's lower bound.
        lo: &'static str,
        /// Its upper bound.
        hi: &'static str,
        /// Decimals.
        digits: usize,
        /// Shown as `x × scale` (100 for a percentage).
        scale: f64,
        /// With a sign (a difference).
        signed: bool,
        /// After the value (`%`).
        suffix: &'static str,
    },
    /// `part/whole`, both counts.
    OutOf {
        /// The part.
        part: &'static str,
        /// The whole.
        whole: &'static str,
    },
    /// Computed from the metrics by the kind (None: missing).
    Text(fn(&Metrics) -> Option<String>),
}

impl Cell {
    /// The metrics the cell reads, in order.
    pub(crate) fn metrics(&self) -> Vec<&'static str> {
        match self {
            Cell::Number { metric, .. } => vec![metric],
            Cell::PlusMinus { metric, se, .. } => vec![metric, se],
            Cell::Interval { metric, lo, hi, .. } => vec![metric, lo, hi],
            Cell::OutOf { part, whole } => vec![part, whole],
            Cell::Text(_) => Vec::new(),
        }
    }

    /// The cell's text for `m` (`–` when its metric is missing).
    pub(crate) fn show(&self, m: &Metrics) -> String {
        let g = |k: &str| m.get(k).copied();
        match *self {
            Cell::Number {
                metric,
                digits,
                scale,
            } => num(g(metric).map(|x| x * scale), digits),
            Cell::PlusMinus { metric, se, digits } => match (g(metric), g(se)) {
                (Some(x), Some(s)) => format!("{x:.digits$} ± {s:.digits$}"),
                (x, _) => num(x, digits),
            },
            Cell::Interval {
                metric,
                lo,
                hi,
                digits: d,
                scale: k,
                signed,
                suffix,
            } => match (g(metric), g(lo), g(hi)) {
                (Some(x), Some(l), Some(h)) if signed => {
                    format!("{:+.d$}{suffix} [{:+.d$}, {:+.d$}]", x * k, l * k, h * k)
                }
                (Some(x), Some(l), Some(h)) => {
                    format!("{:.d$}{suffix} [{:.d$}, {:.d$}]", x * k, l * k, h * k)
                }
                (x, _, _) => num(x.map(|x| x * k), d),
            },
            Cell::OutOf { part, whole } => match (g(part), g(whole)) {
                (Some(p), Some(w)) => format!("{p:.0}/{w:.0}"),
                _ => "–".into(),
            },
            Cell::Text(f) => f(m).unwrap_or_else(|| "–".into()),
        }
    }
}

/// A CSV field's value.
#[derive(Debug, Clone)]
pub enum Field {
    /// A metric, full precision.
    Metric(&'static str),
    /// Computed from the metrics by the kind (None: empty).
    Derived(fn(&Metrics) -> Option<String>),
}

impl Field {
    /// The field's text for `m` (empty when missing).
    pub(crate) fn show(&self, m: &Metrics) -> String {
        match self {
            Field::Metric(k) => m.get(*k).map(|x| format!("{x}")).unwrap_or_default(),
            Field::Derived(f) => f(m).unwrap_or_default(),
        }
    }
}

/// A plot a kind draws in each view.
#[derive(Debug, Clone, PartialEq)]
pub enum Plot {
    /// A metric against bits per weight, a point per model with its
    /// interval as an error bar: the size/quality frontier.
    Frontier {
        /// The metric.
        metric: &'static str,
        /// Its error bar.
        spread: Spread,
        /// The axis label (`KLD mean (nats)`).
        label: &'static str,
    },
    /// A per-window series (`Outcome::series`) per model.
    Series {
        /// The series.
        series: &'static str,
        /// The plot's title.
        title: &'static str,
        /// The x axis label.
        xlabel: &'static str,
        /// The y axis label.
        ylabel: &'static str,
    },
    /// A box per model from nine quantile metrics (p01, p05, p10, median,
    /// p90, p95, p99, p99.9, max): box p10–p90 with the median, whiskers to
    /// p01 and p99, marks at p99.9 and the maximum; log scale.
    Quantiles {
        /// The nine metrics, in that order.
        metrics: [&'static str; 9],
        /// Values below are drawn at this floor.
        floor: f64,
        /// The plot's title.
        title: &'static str,
        /// The y axis label.
        ylabel: &'static str,
    },
}

/// An error bar, from the metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spread {
    /// Between two metrics.
    Bounds(&'static str, &'static str),
    /// The metric ± 1.96 × this standard error.
    Se95(&'static str),
}

impl Spread {
    /// The bar's ends around `metric` in `m`, if its metrics are there.
    pub(crate) fn of(self, metric: &str, m: &Metrics) -> Option<(f64, f64)> {
        match self {
            Spread::Bounds(lo, hi) => Some((*m.get(lo)?, *m.get(hi)?)),
            Spread::Se95(se) => {
                let (x, e) = (*m.get(metric)?, *m.get(se)?);
                Some((x - 1.96 * e, x + 1.96 * e))
            }
        }
    }
}

/// `x` with `digits` decimals; `–` when missing.
pub(crate) fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        Some(x) => format!("{x}"),
        None => "–".into(),
    }
}
