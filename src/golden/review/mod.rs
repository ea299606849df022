//! What `quantgate diff` judges: two sets of goldens (two revisions, two
//! folders, or two runs' `--json`), compared test by test (case × model),
//! item by item (status, gates, metrics, texts), each change classed by the
//! noise its metric declares, worst first.
//!
//! Contract: the classes are the golden test's own rules, said for a
//! reviewer. A count compares exactly; a float is *within noise* when its
//! change is inside the tolerance its golden test allows (the case's
//! `[tolerance]`, else the kind's declared one, else the default), or
//! inside the paired interval the old golden holds for it (ΔNLL's 95% CI),
//! or, for a bound of such an interval, when it moved by less than half
//! the old interval's width; NaN is never within noise. A gate whose
//! verdict changed, a status that changed or a preregistered decision that
//! changed is *flipped*; any other change beyond noise has *moved*. A test
//! or item on one side only is *added* or *removed*. Nothing here reads a
//! model or writes a file.

pub mod render;

use crate::core::case::{Case, MetricType, Tolerance};
use crate::core::error::{Error, Result};
use crate::core::Outcome;
use crate::golden::snap::{gate_rule, parse, render as render_golden, Parsed};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A test: (case, model).
pub(crate) type Test = (String, String);

/// One side of a diff: its goldens, by test.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// The parsed goldens.
    pub goldens: BTreeMap<Test, Parsed>,
}

impl Side {
    /// The goldens under `dir` (`<case>/<model>.snap`, any depth), each
    /// parsed; one that does not parse is an input error naming it as
    /// `shown/<case>/<model>.snap:LINE`. A missing folder is an empty side
    /// (a revision before its first golden).
    pub fn from_dir(dir: &Path, shown: &str) -> Result<Side> {
        let mut side = Side::default();
        if !dir.exists() {
            return Ok(side);
        }
        if !dir.is_dir() {
            return Err(Error::input(format!("{shown}: not a folder of goldens")));
        }
        for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
            let e = e.map_err(|e| Error::input(format!("{shown}: {e}")))?;
            let Some(model) = e.file_name().to_str().and_then(|n| n.strip_suffix(".snap")) else {
                continue;
            };
            if !e.file_type().is_file() {
                continue;
            }
            let case = e
                .path()
                .parent()
                .map(|d| crate::core::fsutil::rel_slash(dir, d))
                .unwrap_or_default();
            let at = format!("{shown}/{case}/{model}.snap");
            let text = std::fs::read_to_string(e.path())
                .map_err(|err| Error::input(format!("{at}: {err}")))?;
            let parsed = parse(&text).map_err(|why| Error::input(format!("{at}:{why}")))?;
            side.goldens.insert((case, model.to_string()), parsed);
        }
        Ok(side)
    }

    /// The goldens these outcomes would record (as `cargo test` writes
    /// them); an outcome that could not run is a test whose status is
    /// `error`, with nothing else.
    pub fn from_outcomes(outcomes: &[Outcome]) -> Result<Side> {
        let mut side = Side::default();
        for o in outcomes {
            let text = render_golden(o, "");
            let parsed = parse(&text).map_err(|why| {
                Error::harness(format!(
                    "{}::{}: its golden does not parse back: {why}",
                    o.case, o.model
                ))
            })?;
            let test = (o.case.clone(), o.model.clone());
            if side.goldens.insert(test, parsed).is_some() {
                return Err(Error::input(format!(
                    "{}::{}: two outcomes of one test",
                    o.case, o.model
                )));
            }
        }
        Ok(side)
    }
}

/// How a change is classed, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// A gate's verdict, a status or a preregistered decision changed.
    Flipped,
    /// Beyond noise; every gate still gives what it gave.
    Moved,
    /// On the old side only.
    Removed,
    /// On the new side only.
    Added,
    /// Changed, within the noise its metric declares.
    WithinNoise,
    /// The same.
    Unchanged,
}

impl Class {
    /// Every class, worst first.
    pub(crate) const ALL: [Class; 6] = [
        Class::Flipped,
        Class::Moved,
        Class::Removed,
        Class::Added,
        Class::WithinNoise,
        Class::Unchanged,
    ];

    /// As a reviewer reads it: `flipped`, `within noise`, ….
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Class::Flipped => "flipped",
            Class::Moved => "moved",
            Class::Removed => "removed",
            Class::Added => "added",
            Class::WithinNoise => "within noise",
            Class::Unchanged => "unchanged",
        }
    }
}

/// What in a test changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Item {
    /// The whole test (added or removed).
    Test,
    /// Its status (`pass`, `fail`, `error`).
    Status,
    /// A gate, as its golden writes it (`kld_mean ≤ 0.1`).
    Gate(String),
    /// A metric, by its declared name.
    Metric(String),
    /// A text outcome.
    Text(String),
    /// A preregistered rule's decision.
    Prereg,
}

impl Item {
    /// As a table shows it.
    pub(crate) fn show(&self) -> String {
        match self {
            Item::Test => "the test".into(),
            Item::Status => "status".into(),
            Item::Gate(g) => format!("gate `{g}`"),
            Item::Metric(m) => format!("`{m}`"),
            Item::Text(t) => format!("text `{t}`"),
            Item::Prereg => "preregistered decision".into(),
        }
    }
}

/// What a float's change was held against.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Noise {
    /// A count: any change is one.
    Exact,
    /// The golden test's tolerance: `allowed = atol + rtol·|old|`.
    Tolerance {
        /// Absolute part.
        atol: f64,
        /// Relative part.
        rtol: f64,
        /// What it allows for the old value.
        allowed: f64,
    },
    /// The paired interval the old golden holds for the metric.
    Interval {
        /// Its declared name (`ci95`).
        name: String,
        /// Old lower bound.
        lo: f64,
        /// Old upper bound.
        hi: f64,
    },
    /// Half the width of the old interval this metric bounds.
    HalfWidth {
        /// The metric the interval is of.
        of: String,
        /// The interval's declared name.
        name: String,
        /// Half its old width.
        half: f64,
    },
}

impl Noise {
    /// In a few words, for a table.
    pub(crate) fn show(&self) -> String {
        match self {
            Noise::Exact => "counts compare exactly".into(),
            Noise::Tolerance {
                atol,
                rtol,
                allowed,
            } => format!("≤ {allowed:.3e} (atol {atol:e} + rtol {rtol:e}·|old|)"),
            Noise::Interval { name, lo, hi } => {
                format!(
                    "inside the old {} [{}, {}]",
                    interval_name(name),
                    sig(*lo),
                    sig(*hi)
                )
            }
            Noise::HalfWidth { of, name, half } => format!(
                "≤ {} (half the old {} of `{of}`)",
                sig(*half),
                interval_name(name)
            ),
        }
    }
}

/// An interval's declared name as a reader says it.
fn interval_name(name: &str) -> &str {
    match name {
        "ci95" => "95% CI",
        "boot95" => "bootstrap 95% interval",
        "wilson95" => "Wilson 95% interval",
        other => other,
    }
}

/// `x` with 4 significant digits (a whole number as it is).
pub fn sig(x: f64) -> String {
    if !x.is_finite() || x == 0.0 {
        return format!("{x}");
    }
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{x:.0}");
    }
    let mag = x.abs().log10().floor() as i64;
    if !(-4..=6).contains(&mag) {
        return format!("{x:.3e}");
    }
    let digits = (3 - mag).clamp(0, 12) as usize;
    format!("{x:.digits$}")
}

/// A value on one side of a change.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Value {
    /// A metric.
    Number(f64),
    /// A status, a gate verdict, a text, a decision.
    Text(String),
}

impl Value {
    /// As a table shows it.
    pub(crate) fn show(&self) -> String {
        match self {
            Value::Number(x) => sig(*x),
            Value::Text(t) if t.chars().count() > 40 => {
                format!("{}…", t.chars().take(40).collect::<String>())
            }
            Value::Text(t) => t.clone(),
        }
    }
}

/// One change: a test's item, its class, its values, and what it was held
/// against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The case, by its name.
    pub case: String,
    /// The model, by its alias.
    pub model: String,
    /// What changed.
    pub item: Item,
    /// What the case's kind calls the metric (`KLD mean`), where it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Its class.
    pub class: Class,
    /// The old value (None: on the new side only).
    pub old: Option<Value>,
    /// The new value (None: on the old side only).
    pub new: Option<Value>,
    /// new − old, for a metric on both sides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    /// What the change was held against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noise: Option<Noise>,
    /// How far beyond its noise a moved metric went (|Δ| / allowed); the
    /// moved rows are listed largest first.
    #[serde(skip)]
    pub excess: f64,
}

impl Change {
    /// `case::model`.
    pub(crate) fn test(&self) -> String {
        format!("{}::{}", self.case, self.model)
    }
}

/// The declarations a case had: its parsed head (None: the case could not
/// be read on either side; the default tolerance then holds, and the
/// review says so).
pub type Declared<'a> = &'a dyn Fn(&str) -> Option<std::sync::Arc<Case>>;

/// Every change between `old` and `new`, worst first, with the cases
/// whose declarations could not be read.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Review {
    /// Every item of every test, unchanged ones too.
    pub changes: Vec<Change>,
    /// The cases on either side.
    pub cases: BTreeSet<String>,
    /// The models on either side.
    pub models: BTreeSet<String>,
    /// Cases compared without their declarations (the default tolerance,
    /// every metric a float).
    pub undeclared: Vec<String>,
    /// What a golden on both sides was recorded with that changed (its
    /// header: the case file's or model's sha256, the settings, the
    /// build): said beside the changes, never classed as one.
    pub inputs: Vec<InputChange>,
}

/// An input a golden was recorded with that differs between the sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InputChange {
    /// `case::model`.
    pub test: String,
    /// The input (`model_sha256`, `build`, …).
    pub input: String,
    /// Old value (empty: none).
    pub old: String,
    /// New value (empty: none).
    pub new: String,
}

/// When `quantgate diff` exits 1 (`--fail-on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOn {
    /// A gate flipped or a metric moved beyond noise (the default).
    Moved,
    /// A gate flipped.
    Flipped,
}

impl Review {
    /// How many changes are of `class`.
    pub(crate) fn count(&self, class: Class) -> usize {
        self.changes.iter().filter(|c| c.class == class).count()
    }

    /// Whether the diff fails under `on`.
    pub fn fails(&self, on: FailOn) -> bool {
        self.count(Class::Flipped) > 0 || (on == FailOn::Moved && self.count(Class::Moved) > 0)
    }

    /// One line: `3 models × 12 cases: 0 flipped, 2 moved, 41 within
    /// noise, 0 added, 0 removed (1,203 unchanged)`.
    pub(crate) fn summary(&self) -> String {
        let n = |c| self.count(c);
        format!(
            "{} model{} × {} case{}: {} flipped, {} moved, {} within noise, {} added, {} removed ({} unchanged)",
            self.models.len(),
            if self.models.len() == 1 { "" } else { "s" },
            self.cases.len(),
            if self.cases.len() == 1 { "" } else { "s" },
            n(Class::Flipped),
            n(Class::Moved),
            n(Class::WithinNoise),
            n(Class::Added),
            n(Class::Removed),
            n(Class::Unchanged)
        )
    }
}

/// Compare `old` with `new`, each case's metrics judged by the
/// declarations `declared` gives.
pub fn review(old: &Side, new: &Side, declared: Declared) -> Review {
    let mut out = Review::default();
    let tests: BTreeSet<&Test> = old.goldens.keys().chain(new.goldens.keys()).collect();
    let mut cases: BTreeMap<&str, Option<std::sync::Arc<Case>>> = BTreeMap::new();
    for (case, model) in &tests {
        out.cases.insert(case.clone());
        out.models.insert(model.clone());
        cases.entry(case.as_str()).or_insert_with(|| declared(case));
    }
    out.undeclared = cases
        .iter()
        .filter(|(_, c)| c.is_none())
        .map(|(n, _)| n.to_string())
        .collect();
    for t in tests {
        let case = cases.get(t.0.as_str()).and_then(|c| c.as_deref());
        let change = |item, class, old: Option<Value>, new: Option<Value>| Change {
            case: t.0.clone(),
            model: t.1.clone(),
            item,
            label: None,
            class,
            old,
            new,
            delta: None,
            noise: None,
            excess: 0.0,
        };
        match (old.goldens.get(t), new.goldens.get(t)) {
            (None, Some(n)) => out.changes.push(change(
                Item::Test,
                Class::Added,
                None,
                Some(Value::Text(n.status.clone())),
            )),
            (Some(o), None) => out.changes.push(change(
                Item::Test,
                Class::Removed,
                Some(Value::Text(o.status.clone())),
                None,
            )),
            (Some(o), Some(n)) => {
                compare_test(t, o, n, case, &mut out.changes);
                let (a, b) = (&o.inputs.0, &n.inputs.0);
                for k in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
                    if a.get(k) != b.get(k) {
                        out.inputs.push(InputChange {
                            test: format!("{}::{}", t.0, t.1),
                            input: k.clone(),
                            old: a.get(k).cloned().unwrap_or_default(),
                            new: b.get(k).cloned().unwrap_or_default(),
                        });
                    }
                }
            }
            (None, None) => {}
        }
    }
    out.changes.sort_by(|a, b| {
        a.class
            .cmp(&b.class)
            .then(b.excess.total_cmp(&a.excess))
            .then_with(|| (&a.case, &a.model).cmp(&(&b.case, &b.model)))
    });
    out
}

/// The changes of one test on both sides.
fn compare_test(t: &Test, o: &Parsed, n: &Parsed, case: Option<&Case>, out: &mut Vec<Change>) {
    let base = |item, class, old: Option<Value>, new: Option<Value>| Change {
        case: t.0.clone(),
        model: t.1.clone(),
        item,
        label: None,
        class,
        old,
        new,
        delta: None,
        noise: None,
        excess: 0.0,
    };
    let same_or = |a: &Option<String>, b: &Option<String>, worse: Class| {
        if a == b {
            Class::Unchanged
        } else {
            match (a, b) {
                (None, Some(_)) => Class::Added,
                (Some(_), None) => Class::Removed,
                _ => worse,
            }
        }
    };
    out.push(base(
        Item::Status,
        same_or(
            &Some(o.status.clone()),
            &Some(n.status.clone()),
            Class::Flipped,
        ),
        Some(Value::Text(o.status.clone())),
        Some(Value::Text(n.status.clone())),
    ));
    if o.prereg.is_some() || n.prereg.is_some() {
        out.push(base(
            Item::Prereg,
            same_or(&o.prereg, &n.prereg, Class::Flipped),
            o.prereg.clone().map(Value::Text),
            n.prereg.clone().map(Value::Text),
        ));
    }
    // A test that could not run on one side has no figures to compare.
    if o.status == "error" || n.status == "error" {
        return;
    }
    let gates = |p: &Parsed| -> BTreeMap<String, String> {
        p.gates
            .iter()
            .map(|g| {
                let (rule, verdict) = gate_rule(g);
                (rule.to_string(), verdict.unwrap_or_default().to_string())
            })
            .collect()
    };
    // Texts keyed by name on either side: one row per name, `class` when
    // they differ.
    let mut texts = |o: &BTreeMap<String, String>,
                     n: &BTreeMap<String, String>,
                     item: fn(String) -> Item,
                     class: Class| {
        for name in o.keys().chain(n.keys()).collect::<BTreeSet<_>>() {
            let (a, b) = (o.get(name).cloned(), n.get(name).cloned());
            out.push(base(
                item(name.clone()),
                same_or(&a, &b, class),
                a.map(Value::Text),
                b.map(Value::Text),
            ));
        }
    };
    texts(&gates(o), &gates(n), Item::Gate, Class::Flipped);
    texts(&o.texts, &n.texts, Item::Text, Class::Moved);
    for name in o
        .metrics
        .keys()
        .chain(n.metrics.keys())
        .collect::<BTreeSet<_>>()
    {
        let (a, b) = (o.metrics.get(name).copied(), n.metrics.get(name).copied());
        let mut c = base(
            Item::Metric(name.clone()),
            Class::Unchanged,
            a.map(Value::Number),
            b.map(Value::Number),
        );
        c.label = case
            .and_then(|k| k.metrics.iter().find(|m| &m.name == name))
            .and_then(|m| m.label.map(String::from));
        match (a, b) {
            (None, Some(_)) => c.class = Class::Added,
            (Some(_), None) => c.class = Class::Removed,
            (Some(old), Some(new)) => {
                let (class, noise, excess) = classify(name, old, new, &o.metrics, case);
                c.class = class;
                c.noise = noise;
                c.excess = excess;
                c.delta = Some(new - old);
            }
            (None, None) => {}
        }
        out.push(c);
    }
}

/// The class of metric `name` moving from `old` to `new`, what it was held
/// against, and how far beyond it (|Δ| / allowed) it went.
fn classify(
    name: &str,
    old: f64,
    new: f64,
    old_metrics: &BTreeMap<String, f64>,
    case: Option<&Case>,
) -> (Class, Option<Noise>, f64) {
    if old.to_bits() == new.to_bits() {
        return (Class::Unchanged, None, 0.0);
    }
    let moved = |noise: Noise, allowed: f64| {
        let excess = if allowed > 0.0 && (new - old).is_finite() {
            (new - old).abs() / allowed
        } else {
            f64::INFINITY
        };
        (Class::Moved, Some(noise), excess)
    };
    if case.and_then(|c| c.metric_type(name)) == Some(MetricType::Count) {
        return moved(Noise::Exact, 0.0);
    }
    let t = case.map_or(Tolerance::DEFAULT, |c| c.tolerance(name));
    let allowed = t.atol + t.rtol * old.abs();
    let tolerance = Noise::Tolerance {
        atol: t.atol,
        rtol: t.rtol,
        allowed,
    };
    // NaN or an infinity is within noise of nothing.
    if !(old.is_finite() && new.is_finite()) {
        return moved(tolerance, allowed);
    }
    if (new - old).abs() <= allowed {
        return (Class::WithinNoise, Some(tolerance), 0.0);
    }
    let declared = case.map_or(&[][..], |c| &c.metrics[..]);
    // The old golden's paired interval of this metric.
    for m in declared.iter().filter(|m| m.name == name) {
        for iv in &m.intervals {
            if let (Some(&lo), Some(&hi)) = (old_metrics.get(&iv.lo), old_metrics.get(&iv.hi)) {
                if lo.is_finite() && hi.is_finite() && lo <= new && new <= hi {
                    let noise = Noise::Interval {
                        name: iv.name.clone(),
                        lo,
                        hi,
                    };
                    return (Class::WithinNoise, Some(noise), 0.0);
                }
            }
        }
    }
    // A bound of such an interval: it moves with its estimate.
    for m in declared {
        for iv in m
            .intervals
            .iter()
            .filter(|iv| iv.lo == name || iv.hi == name)
        {
            if let (Some(&lo), Some(&hi)) = (old_metrics.get(&iv.lo), old_metrics.get(&iv.hi)) {
                let half = (hi - lo) / 2.0;
                if half.is_finite() && (new - old).abs() <= half {
                    let noise = Noise::HalfWidth {
                        of: m.name.clone(),
                        name: iv.name.clone(),
                        half,
                    };
                    return (Class::WithinNoise, Some(noise), 0.0);
                }
            }
        }
    }
    moved(tolerance, allowed)
}

#[cfg(test)]
mod tests;
