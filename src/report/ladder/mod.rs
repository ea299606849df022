//! The ladder report: from one run's outcomes, one view per reference model,
//! a row per model — bytes and bits per weight, then the columns every kind
//! declares (`core::present`: PPL ± se, ΔNLL, KLD, same top, flips, t/s, …)
//! and the gate verdicts — largest file first; as Markdown (model-card
//! ready), CSV, and one self-contained HTML page with the declared plots.
//! The report names no metric: it lays out the kinds' declarations.
//!
//! Contract: every number is one the run measured (a metric of its
//! outcome, or the model file's own header); a missing one is shown as
//! missing (`–`, an empty CSV field), never as zero. A model whose trial
//! failed to run is a row that says ERROR.

use crate::core::error::Result;
use crate::core::present::{HubMetric, Join, Metrics, Plot, Presentation, ReportColumn};
use crate::core::{Outcome, Status};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use crate::report::svg::PALETTE;
mod markdown;
pub use markdown::*;
mod csv;
pub use csv::*;
mod html;
pub(crate) use html::*;

/// What the model file says of itself.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelFacts {
    /// Bytes, every part of a split file added up.
    pub bytes: Option<u64>,
    /// Bits per weight (tensor bytes × 8 / parameters).
    pub bpw: Option<f64>,
}

/// One model in a view.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Alias.
    pub model: String,
    /// File facts.
    pub facts: ModelFacts,
    /// Worst status over the view's cases.
    pub status: Status,
    /// Metrics by name: the view's cases' in kind order (a name the first
    /// case has keeps its value), then those of the model's cases of a kind
    /// that joins by model (speed).
    pub metrics: Metrics,
    /// Series by name, the same way.
    pub series: BTreeMap<String, Vec<f64>>,
    /// The metrics of the model's cases of a kind that joins per case
    /// (recitation, teacher forcing), by case.
    pub by_case: BTreeMap<String, Metrics>,
    /// `case: rule` of every failed gate (the rule in the kind's words,
    /// [`crate::core::GateResult::rule`]), and errors.
    pub failures: Vec<String>,
    /// Its violated warn gates (`case: rule`): reported, not failed.
    pub warnings: Vec<String>,
    /// Every gate checked, in the views' case order: ✓ held, ⚠ violated at
    /// level warn, ✗ failed.
    pub marks: Vec<GateMark>,
    /// Gates checked.
    pub gates: usize,
    /// Every gate's metric (`delta_nll_mean`, or `delta_nll_mean.ci95_hi`),
    /// bound (`max`, `min`) and threshold: the lines the plots draw.
    pub thresholds: Vec<(String, String, f64)>,
    /// The view's reference itself, its figures from its candidates'
    /// outcomes (no gate of its own).
    pub reference: bool,
}

/// One gate of a row, as the card's gates table shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct GateMark {
    /// The case it belongs to.
    pub case: String,
    /// The gate in the kind's words (`KLD mean ≤ 0.1 nats`).
    pub rule: String,
    /// ✓ held, ⚠ violated at level warn, ✗ failed.
    pub mark: char,
    /// The value it read (a sequential gate: its sequence's bound at the
    /// stop); None: missing.
    pub observed: Option<f64>,
}

/// One reference's ladder.
#[derive(Debug, Clone)]
pub struct View {
    /// The reference alias.
    pub reference: String,
    /// The cases behind the columns, one per kind, in kind order.
    pub cases: Vec<String>,
    /// The columns, as the kinds declared them (each title once; a kind
    /// that joins per case, once per case).
    pub columns: Vec<ViewColumn>,
    /// The plots, the same way.
    pub plots: Vec<Plot>,
    /// What the columns mean: the kinds' legends, each once.
    pub legend: Vec<&'static str>,
    /// What was done to show its rows on the same data (a kind's
    /// [`Presentation::align`]), one sentence per case.
    pub notes: Vec<String>,
    /// The figures a model card's `model-index` lists, each with the case
    /// it comes from ([`Presentation::hub`]).
    pub hub: Vec<(String, HubMetric)>,
    /// Rows, largest file first.
    pub rows: Vec<Row>,
}

/// A column of a view: a kind's declared column, read from the row's
/// metrics, or from one case's (a kind that joins per case).
#[derive(Debug, Clone)]
pub struct ViewColumn {
    /// The declared column.
    pub column: ReportColumn,
    /// The case it reads, for a kind that joins per case.
    pub case: Option<String>,
}

/// No metrics: what a row without a case's outcome reads.
static NO_METRICS: Metrics = Metrics::new();

impl ViewColumn {
    /// The table's header (`first error pi/e1_recall`); None for a column
    /// only the CSV has.
    pub(crate) fn title(&self) -> Option<String> {
        let t = self.column.title;
        match &self.case {
            _ if t.is_empty() => None,
            None => Some(t.to_string()),
            Some(case) => Some(format!("{t} {case}")),
        }
    }

    /// The metrics the column reads in `r`.
    fn metrics<'a>(&self, r: &'a Row) -> &'a Metrics {
        match &self.case {
            None => &r.metrics,
            Some(case) => r.by_case.get(case).unwrap_or(&NO_METRICS),
        }
    }

    /// The table's cell for `r`.
    pub(crate) fn show(&self, r: &Row) -> String {
        self.column.cell.show(self.metrics(r))
    }

    /// The CSV's headers (`pi/e1_recall:first_error` for a case's).
    pub(crate) fn csv_headers(&self) -> Vec<String> {
        let field = |f: &str| match &self.case {
            None => f.to_string(),
            Some(case) => format!("{case}:{f}"),
        };
        self.column.csv.iter().map(|(f, _)| field(f)).collect()
    }

    /// The CSV's fields for `r`.
    pub(crate) fn csv_values(&self, r: &Row) -> Vec<String> {
        let m = self.metrics(r);
        self.column.csv.iter().map(|(_, f)| f.show(m)).collect()
    }
}

/// What the report's own columns (size, BPW) mean.
const FACTS_LEGEND: &str = "BPW: tensor bytes × 8 / parameters, from the GGUF header.";

/// The columns, plots and legend of every view: every kind's declaration
/// in `catalog` order (kinds that join by reference, then the report's own
/// legend, then kinds that join by model), a column or plot declared twice
/// shown once.
fn layout(
    catalog: &[Presentation],
    ran: &dyn Fn(&str) -> bool,
) -> (Vec<ViewColumn>, Vec<Plot>, Vec<&'static str>) {
    let mut columns: Vec<ViewColumn> = Vec::new();
    let mut plots: Vec<Plot> = Vec::new();
    let mut legend: Vec<&'static str> = Vec::new();
    let by_join = |j: Join| catalog.iter().filter(move |p| p.join == j && ran(p.kind));
    // (Kinds that join per case are laid out per case, in `views`.)
    for p in by_join(Join::Reference).chain(by_join(Join::Model)) {
        for c in &p.columns {
            let same = |d: &ViewColumn| {
                let d = &d.column;
                if c.title.is_empty() {
                    d.csv.iter().map(|f| f.0).eq(c.csv.iter().map(|f| f.0))
                } else {
                    d.title == c.title
                }
            };
            if !columns.iter().any(same) {
                columns.push(ViewColumn {
                    column: c.clone(),
                    case: None,
                });
            }
        }
        for plot in &p.plots {
            if !plots.contains(plot) {
                plots.push(plot.clone());
            }
        }
        if p.join == Join::Model && !legend.contains(&FACTS_LEGEND) {
            legend.push(FACTS_LEGEND);
        }
        for l in &p.legend {
            if !legend.contains(l) {
                legend.push(l);
            }
        }
    }
    if !legend.contains(&FACTS_LEGEND) {
        legend.push(FACTS_LEGEND);
    }
    (columns, plots, legend)
}

/// The views of `outcomes`, laid out as the kinds in `catalog` declare:
/// per reference, at most one case of each kind that joins by reference (a
/// second case of a kind opens another view), in `catalog` order; the
/// model's cases of a kind that joins by model beside each row. An
/// outcome of a kind the catalog does not show is left out.
pub fn views(
    outcomes: &[Outcome],
    catalog: &[Presentation],
    facts: &dyn Fn(&str) -> ModelFacts,
) -> Vec<View> {
    let (aligned, notes) = align(outcomes, catalog);
    let outcomes = &aligned[..];
    let join_of = |o: &Outcome| {
        catalog
            .iter()
            .position(|p| p.kind == o.kind)
            .map(|i| (i, catalog[i].join))
    };
    // Each case's kind (its index in the catalog).
    let mut case_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.reference.is_some()) {
        if let Some((k, Join::Reference)) = join_of(o) {
            case_kind.insert(&o.case, k);
        }
    }
    // (reference, {kind: case}) in order of first appearance.
    let mut slots: Vec<(String, BTreeMap<usize, String>)> = Vec::new();
    let mut cases: Vec<(&str, &str)> = outcomes
        .iter()
        .filter_map(|o| Some((o.case.as_str(), o.reference.as_deref()?)))
        .filter(|(c, _)| case_kind.contains_key(c))
        .collect();
    cases.sort();
    cases.dedup();
    for (case, reference) in cases {
        let kind = case_kind[case];
        let at = slots
            .iter()
            .position(|(r, k)| r == reference && !k.contains_key(&kind))
            .unwrap_or_else(|| {
                slots.push((reference.to_string(), BTreeMap::new()));
                slots.len() - 1
            });
        slots[at].1.insert(kind, case.to_string());
    }
    // The columns, plots and legends of the kinds that ran (a kind with
    // no outcome would be a column of dashes).
    let kinds_ran: std::collections::BTreeSet<&str> =
        outcomes.iter().map(|o| o.kind.as_str()).collect();
    let (mut columns, plots, mut legend) = layout(catalog, &|k| kinds_ran.contains(k));
    let beside: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| matches!(join_of(o), Some((_, Join::Model))))
        .collect();
    // Where the figures joined by model (speed) were measured: the
    // machine and threads, said under every view.
    let mut measured_on: Vec<String> = Vec::new();
    for o in &beside {
        let Some(machine) = &o.machine else { continue };
        let threads = o
            .settings
            .as_ref()
            .map_or(String::new(), |s| format!(", {} threads", s.threads));
        let line = format!(
            "{} measured on {}{threads}.",
            o.case,
            crate::core::machine::plain(machine)
        );
        if !measured_on.contains(&line) {
            measured_on.push(line);
        }
    }
    // Kinds that join per case: their columns once per case, in case
    // order, after every other kind's; their legends when a case ran.
    let per_case: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| matches!(join_of(o), Some((_, Join::Case))))
        .collect();
    let mut case_kinds: Vec<(&str, usize)> = per_case
        .iter()
        .filter_map(|o| Some((o.case.as_str(), join_of(o)?.0)))
        .collect();
    case_kinds.sort();
    case_kinds.dedup();
    for &(case, kind) in &case_kinds {
        for c in &catalog[kind].columns {
            columns.push(ViewColumn {
                column: c.clone(),
                case: Some(case.to_string()),
            });
        }
        for l in &catalog[kind].legend {
            if !legend.contains(l) {
                legend.push(l);
            }
        }
    }
    slots
        .iter()
        .map(|(reference, kinds)| {
            let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
            // In kind order: the first case's metric wins a shared name.
            for case in kinds.values() {
                for o in outcomes.iter().filter(|o| &o.case == case) {
                    let row = rows.entry(&o.model).or_insert_with(|| Row {
                        model: o.model.clone(),
                        facts: facts(&o.model),
                        status: Status::Pass,
                        metrics: Metrics::new(),
                        series: BTreeMap::new(),
                        by_case: BTreeMap::new(),
                        failures: Vec::new(),
                        warnings: Vec::new(),
                        marks: Vec::new(),
                        gates: 0,
                        thresholds: Vec::new(),
                        reference: false,
                    });
                    fold(row, o);
                }
            }
            let mut rows: Vec<Row> = rows.into_values().collect();
            for r in &mut rows {
                for o in beside.iter().filter(|o| o.model == r.model) {
                    for (k, v) in &o.metrics {
                        r.metrics.entry(k.clone()).or_insert(*v);
                    }
                }
                for o in per_case.iter().filter(|o| o.model == r.model) {
                    r.by_case.insert(o.case.clone(), o.metrics.clone());
                }
            }
            rows.sort_by(|a, b| {
                b.facts
                    .bytes
                    .cmp(&a.facts.bytes)
                    .then_with(|| a.model.cmp(&b.model))
            });
            // The reference as the first row (unless it ran as a candidate
            // too): its figures as its candidates' outcomes of each case
            // hold them (aligned, as the rows' are). A figure comes from
            // the case the rows take theirs from (the first, in kind
            // order, whose rows show it), or is left out: never from
            // another case, over other windows.
            if !rows.iter().any(|r| &r.model == reference) {
                let mut m = Metrics::new();
                let mut decided: Vec<&str> = Vec::new();
                for (k, case) in kinds {
                    let of_case: Vec<&Outcome> = outcomes
                        .iter()
                        .filter(|o| &o.case == case && o.reference.as_ref() == Some(reference))
                        .collect();
                    for (show, from) in &catalog[*k].reference {
                        if decided.contains(show)
                            || !of_case.iter().any(|o| o.metrics.contains_key(*show))
                        {
                            continue;
                        }
                        decided.push(show);
                        let values: Vec<f64> = of_case
                            .iter()
                            .filter_map(|o| o.metrics.get(*from).copied())
                            .collect();
                        // Every candidate of the case holds the same value
                        // (the same windows); one that differs says the
                        // figure is not the reference's alone.
                        if let Some(v) = values.first() {
                            if values.iter().all(|x| x.to_bits() == v.to_bits()) {
                                m.insert(show.to_string(), *v);
                            }
                        }
                    }
                }
                for o in beside.iter().filter(|o| &o.model == reference) {
                    for (k, v) in &o.metrics {
                        m.entry(k.clone()).or_insert(*v);
                    }
                }
                if !m.is_empty() {
                    rows.insert(
                        0,
                        Row {
                            model: reference.clone(),
                            facts: facts(reference),
                            status: Status::Pass,
                            metrics: m,
                            series: BTreeMap::new(),
                            by_case: BTreeMap::new(),
                            failures: Vec::new(),
                            warnings: Vec::new(),
                            marks: Vec::new(),
                            gates: 0,
                            thresholds: Vec::new(),
                            reference: true,
                        },
                    );
                }
            }
            // An optional column only where some row has its metrics.
            let has = |r: &Row, c: &ViewColumn| {
                let m = match &c.case {
                    Some(case) => r.by_case.get(case),
                    None => Some(&r.metrics),
                };
                m.is_some_and(|m| c.column.cell.metrics().iter().all(|k| m.contains_key(*k)))
            };
            View {
                reference: reference.clone(),
                cases: kinds.values().cloned().collect(),
                hub: kinds
                    .iter()
                    .flat_map(|(k, case)| catalog[*k].hub.iter().map(|h| (case.clone(), *h)))
                    .collect(),
                columns: columns
                    .iter()
                    .filter(|c| !c.column.optional || rows.iter().any(|r| has(r, c)))
                    .cloned()
                    .collect(),
                plots: plots.clone(),
                legend: legend.clone(),
                notes: kinds
                    .values()
                    .filter_map(|c| measured(outcomes, catalog, c))
                    .chain(kinds.values().filter_map(|c| notes.get(c).cloned()))
                    .chain(measured_on.iter().cloned())
                    .collect(),
                rows,
            }
        })
        .collect()
}

/// What case `case` measured, in a line: its data files with their
/// sha256, the context, how many of what its kind counts (its declared
/// [`Presentation::unit`]: the most any row measured, or, for a sequential
/// case, the most it could), and the llama.cpp build.
fn measured(outcomes: &[Outcome], catalog: &[Presentation], case: &str) -> Option<String> {
    let of_case = || outcomes.iter().filter(move |o| o.case == case);
    let o = of_case().find(|o| o.error.is_none())?;
    let mut parts: Vec<String> = o
        .data
        .iter()
        .map(|(name, sha)| format!("{name} (sha256 {sha})"))
        .collect();
    if let Some(s) = &o.settings {
        parts.push(format!("n_ctx {}", s.n_ctx));
    }
    let unit = catalog
        .iter()
        .find(|p| p.kind == o.kind)
        .and_then(|p| p.unit);
    if let Some(unit) = unit {
        let most = |k: &str| {
            of_case()
                .filter_map(|o| o.metrics.get(k).copied())
                .reduce(f64::max)
        };
        if let Some(total) = most(&format!("{unit}_total")) {
            parts.push(format!(
                "up to {total} {unit} (decided sequentially: each model stops once its gates are)"
            ));
        } else if let Some(n) = most(unit) {
            parts.push(format!("{n} {unit}"));
        }
    }
    let b = &o.build;
    parts.push(format!(
        "{} of llama-cpp-sys-2 {} (ggml {}, {})",
        b.engine,
        b.llama_cpp_sys_2,
        b.ggml.trim_end_matches(" (unknown)"),
        b.backend
    ));
    Some(format!("{case} measured: {}.", parts.join(", ")))
}

/// The outcomes with each case's rows (the models of one case and
/// reference) made to show figures on the same data, as the case's kind
/// declares ([`Presentation::align`]); what was done, by case.
fn align(
    outcomes: &[Outcome],
    catalog: &[Presentation],
) -> (Vec<Outcome>, BTreeMap<String, String>) {
    let mut out = outcomes.to_vec();
    let mut notes = BTreeMap::new();
    let mut cases: Vec<(String, Option<String>, String)> = outcomes
        .iter()
        .map(|o| (o.case.clone(), o.reference.clone(), o.kind.clone()))
        .collect();
    cases.sort();
    cases.dedup();
    for (case, reference, kind) in cases {
        let Some(align) = catalog
            .iter()
            .find(|p| p.kind == kind)
            .and_then(|p| p.align)
        else {
            continue;
        };
        let at: Vec<usize> = (0..out.len())
            .filter(|&i| out[i].case == case && out[i].reference == reference)
            .collect();
        let mut group: Vec<Outcome> = at.iter().map(|&i| out[i].clone()).collect();
        if let Some(note) = align(&mut group) {
            for (o, &i) in group.into_iter().zip(&at) {
                out[i] = o;
            }
            notes.insert(case, note);
        }
    }
    (out, notes)
}

/// One outcome of a view's case into its model's row: metrics and series
/// it lacks, its gates, its failures and the worst status.
fn fold(row: &mut Row, o: &Outcome) {
    for (k, v) in &o.metrics {
        row.metrics.entry(k.clone()).or_insert(*v);
    }
    for (k, v) in &o.series {
        row.series.entry(k.clone()).or_insert_with(|| v.clone());
    }
    row.gates += o.gates.len();
    for g in &o.gates {
        let t = (g.metric.clone(), g.bound.clone(), g.threshold);
        if !row.thresholds.contains(&t) {
            row.thresholds.push(t);
        }
    }
    for g in &o.gates {
        let mark = match (g.passed, g.level.is_fail()) {
            (true, _) => '✓',
            (false, true) => '✗',
            (false, false) => '⚠',
        };
        // A warn gate says so: its column is apart from a fail gate's of
        // the same rule.
        let rule = match g.level.is_fail() {
            true => g.rule(),
            false => format!("{} (warn)", g.rule()),
        };
        let named = format!("{}: {rule}", o.case);
        row.marks.push(GateMark {
            case: o.case.clone(),
            rule,
            mark,
            observed: g.observed,
        });
        match mark {
            '✗' => row.failures.push(named),
            '⚠' => row.warnings.push(named),
            _ => {}
        }
    }
    match o.status {
        Status::Error => {
            row.status = Status::Error;
            let first = o.error.as_deref().unwrap_or("").lines().next();
            row.failures
                .push(format!("{}: error: {}", o.case, first.unwrap_or("")));
        }
        Status::Fail if row.status == Status::Pass => row.status = Status::Fail,
        _ => {}
    }
}

/// The files a report folder holds.
pub(crate) const FILES: [&str; 3] = ["report.md", "report.csv", "report.html"];

/// Whether a report may be written into `dir`, checked before any work:
/// the folder can be made and written, and holds no report already (one is
/// replaced only when `force`). Err names the flag, the folder and the fix.
pub fn ready(flag: &str, dir: &Path, force: bool) -> Result<()> {
    crate::core::fsutil::writable_dir(flag, dir)?;
    let held: Vec<&str> = FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).exists())
        .collect();
    if !held.is_empty() && !force {
        return Err(crate::core::Error::input(format!(
            "{flag} {}: holds a report already ({}); pass --force to replace it, or name \
             another folder",
            dir.display(),
            held.join(", ")
        )));
    }
    Ok(())
}

/// Write `report.md`, `report.csv` and `report.html` into `dir`; the paths.
/// `base_model`: the Hub id the model card names ([`model_card`]).
pub fn write(
    dir: &Path,
    views: &[View],
    outcomes: &[Outcome],
    base_model: Option<&str>,
) -> Result<Vec<PathBuf>> {
    let [md, csv_name, html_name] = FILES;
    let files = [
        (md, model_card(views, base_model)),
        (csv_name, csv(views)),
        (html_name, html(views, outcomes)),
    ];
    let mut out = Vec::new();
    for (name, body) in files {
        let p = dir.join(name);
        crate::core::fsutil::write_atomic(&p, body.as_bytes())?;
        out.push(p);
    }
    Ok(out)
}

/// Bytes and bits per weight of a registry model, from its file's header
/// (every part of a split file); nothing when the file is not there or is
/// not the size the registry pins.
pub fn facts_of(
    registry: &crate::models::Registry,
    build_label: &str,
    cache: &Path,
    alias: &str,
) -> ModelFacts {
    let Ok(path) = registry.location(alias, build_label, cache) else {
        return ModelFacts::default();
    };
    let pinned = registry.entry(alias).ok().and_then(|e| e.bytes);
    match crate::models::inspect::inspect(&path, false) {
        Ok(i) if pinned.is_none_or(|b| b == i.bytes) => ModelFacts {
            bytes: Some(i.bytes),
            bpw: i.bpw(),
        },
        _ => ModelFacts::default(),
    }
}

#[cfg(test)]
mod tests;
