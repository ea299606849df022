//! The parsed case, as every stage after parse sees it: the keys every case
//! shares (models, reference, gates, tolerances, prereg) and what its kind
//! declared at parse time (its metrics with their types, its pinned input
//! files, its windows). The kind's own table stays with the kind.

use crate::core::error::{Error, Result};
use crate::core::fsutil::sha256_bytes;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A parsed case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Test name stem: path under the suites root, `/`-separated, no `.toml`.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// sha256 of the file's bytes.
    pub content_sha256: String,
    /// `kind = "…"`.
    pub kind: &'static str,
    /// Free text.
    pub description: String,
    /// Model aliases to run on, with their position in the file.
    pub models: Vec<(String, Location)>,
    /// Reference model alias, with its position.
    pub reference: Option<(String, Location)>,
    /// Gates.
    pub gates: Vec<Gate>,
    /// Golden comparison tolerances by metric (`default` for the rest).
    pub tolerances: BTreeMap<String, Tolerance>,
    /// A preregistered decision rule (`prereg = "…"`, relative to the case file).
    pub prereg: Option<(PathBuf, Location)>,
    /// The metrics the case produces, as its kind declared them.
    pub metrics: Vec<Metric>,
    /// Files the case pins by sha256, checked before every run and before a
    /// cached result is used.
    pub pins: Vec<Pin>,
    /// The windows a window-scoring kind declares (their count, if it fixes
    /// one, and where the windowing is written); None for other kinds.
    pub windows: Option<(Option<usize>, Location)>,
    /// The sequential design (`[decide]` with `sequential = true`), if the
    /// case decides its gates window by window.
    pub decide: Option<Decide>,
}

/// A case's sequential design (`[decide]`): its windows (or tasks) visited
/// in a seeded random order without replacement, each gate decided once an
/// anytime-valid confidence sequence for its mean
/// ([`crate::measure::sequential`]) leaves the threshold outside, the run
/// stopped once every gate is decided (else at N: the fixed-N verdict).
#[derive(Debug, Clone, PartialEq)]
pub struct Decide {
    /// Error level of each verdict (of each one-sided bound).
    pub alpha: f64,
    /// Seed of the visiting order.
    pub seed: u64,
    /// Per gated metric, the range every window's value is declared to lie
    /// in; a value outside it stops the sequential rule (the case then runs
    /// to N and says so), it is never clipped.
    pub bounds: BTreeMap<String, (f64, f64)>,
    /// Where `[decide]` is written.
    pub at: Location,
    /// Thresholds a preregistered rule tests on a metric's sequence
    /// (its `seq_hi < 0`, `seq_lo > 0`): the run also stops only once each
    /// lies outside the sequence. Filled from the sealed rule when the
    /// trial starts.
    pub stops: Vec<(String, f64)>,
}

impl Decide {
    /// What is wrong with `alpha` as a design's error level, if anything
    /// (it must lie in (0, 0.5]); `key` names it in the message.
    pub(crate) fn alpha_problem(key: &str, alpha: f64) -> Option<String> {
        (!(alpha > 0.0 && alpha <= 0.5)).then(|| format!("{key}: {alpha} is not in (0, 0.5]"))
    }

    /// What is wrong with `bounds` as a per-window value's declared range,
    /// if anything (finite, lo < hi); `key` names it in the message.
    pub(crate) fn bounds_problem(key: &str, bounds: &[f64]) -> Option<String> {
        match bounds {
            [lo, hi] if lo.is_finite() && hi.is_finite() && lo < hi => None,
            _ => Some(format!("{key}: give [lo, hi], finite, lo < hi")),
        }
    }

    /// The metrics a sequential case adds for each gated metric `m`: the
    /// bounds of its confidence sequence at the stop.
    pub(crate) fn bound_metrics(m: &str) -> [String; 2] {
        [format!("{m}_seq_lo"), format!("{m}_seq_hi")]
    }

    /// The design as one line (goldens, the report's notes, prereg).
    pub(crate) fn describe(&self) -> String {
        let bounds: Vec<String> = self
            .bounds
            .iter()
            .map(|(m, (lo, hi))| format!("{m} in [{lo}, {hi}]"))
            .collect();
        format!(
            "sequential, alpha {}, seed {}, {}",
            self.alpha,
            self.seed,
            bounds.join(", ")
        )
    }
}

impl Case {
    /// The tolerance for `metric`: the case's for it; else the case's
    /// default, or [`Tolerance::MEASUREMENT`] for a measurement and
    /// [`Tolerance::DEFAULT`] for the rest — each bound widened to the
    /// kind's own tolerance for the metric where it declares a wider one
    /// ([`Metric::with_tolerance`]).
    pub(crate) fn tolerance(&self, metric: &str) -> Tolerance {
        if let Some(t) = self.tolerances.get(metric) {
            return *t;
        }
        let measured = self.metric_type(metric) == Some(MetricType::Measurement);
        let base = self
            .tolerances
            .get("default")
            .filter(|_| !measured)
            .copied()
            .unwrap_or(if measured {
                Tolerance::MEASUREMENT
            } else {
                Tolerance::DEFAULT
            });
        let declared = self
            .metrics
            .iter()
            .find(|m| m.name == metric)
            .and_then(|m| m.tolerance.as_ref());
        match declared {
            Some((k, _)) => Tolerance {
                atol: base.atol.max(k.atol),
                rtol: base.rtol.max(k.rtol),
            },
            None => base,
        }
    }

    /// The names of the metrics this case produces.
    pub fn metric_names(&self) -> Vec<String> {
        self.metrics.iter().map(|m| m.name.clone()).collect()
    }

    /// The declared type of `metric` (None: not a metric of this case).
    pub fn metric_type(&self, metric: &str) -> Option<MetricType> {
        self.metrics.iter().find(|m| m.name == metric).map(|m| m.ty)
    }
}

/// How a metric compares with its golden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// A count (positions, windows, flips, a first position): compared exactly.
    Count,
    /// A float: compared within the case's tolerance.
    Float,
    /// A measurement of the machine (speed): compared within a wide
    /// tolerance ([`Tolerance::MEASUREMENT`] unless the case sets one);
    /// gates carry the decision.
    Measurement,
}

/// A metric a kind produces.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Flat name (`kld_mean`, `flip_bin2_n`).
    pub name: String,
    /// How it compares.
    pub ty: MetricType,
    /// The intervals it carries (a gate's `on` selects a bound of one).
    pub intervals: Vec<Interval>,
    /// The kind's tolerance against a golden, and why (a case's own
    /// `[tolerance]` for the metric overrides it); None: the case's
    /// default.
    pub tolerance: Option<(Tolerance, &'static str)>,
    /// What a reader calls it (`KLD mean`): the model card's gates and the
    /// book say this; None: its name.
    pub label: Option<&'static str>,
    /// Its unit (`nats/token`, `t/s`); None: a count, a ratio or a
    /// fraction.
    pub unit: Option<&'static str>,
}

/// What a reader calls a kind's metrics, as the kind declares it ([`Metric::label`],
/// [`Metric::unit`]): (metric, label, unit or "").
pub(crate) type About = &'static [(&'static str, &'static str, &'static str)];

/// `metrics` with the labels and units `about` declares.
pub(crate) fn with_about(mut metrics: Vec<Metric>, about: About) -> Vec<Metric> {
    for m in &mut metrics {
        if let Some((_, label, unit)) = about.iter().find(|(n, _, _)| *n == m.name) {
            m.label = Some(label);
            m.unit = (!unit.is_empty()).then_some(*unit);
        }
    }
    metrics
}

/// An interval a metric carries, declared by its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// Its name, as a gate's `on` says it (`ci95` in `on = "ci95_hi"`).
    pub name: String,
    /// The metric holding its lower bound.
    pub lo: String,
    /// The metric holding its upper bound.
    pub hi: String,
    /// The metric counting the windows behind it, if it has one.
    pub windows: Option<String>,
}

impl Metric {
    /// A metric of type `ty`.
    pub(crate) fn new(name: impl Into<String>, ty: MetricType) -> Self {
        Metric {
            name: name.into(),
            ty,
            intervals: Vec::new(),
            tolerance: None,
            label: None,
            unit: None,
        }
    }

    /// A count.
    pub(crate) fn count(name: impl Into<String>) -> Self {
        Metric::new(name, MetricType::Count)
    }

    /// A float.
    pub(crate) fn float(name: impl Into<String>) -> Self {
        Metric::new(name, MetricType::Float)
    }

    /// Compared with its golden within `tolerance` (unless the case sets
    /// one for it), for the reason `why`.
    pub(crate) fn with_tolerance(mut self, tolerance: Tolerance, why: &'static str) -> Self {
        self.tolerance = Some((tolerance, why));
        self
    }

    /// With an interval `name` whose bounds are the metrics `lo` and `hi`,
    /// over the windows that the metric `windows` counts.
    pub(crate) fn with_interval(
        mut self,
        name: &str,
        lo: &str,
        hi: &str,
        windows: Option<&str>,
    ) -> Self {
        self.intervals.push(Interval {
            name: name.into(),
            lo: lo.into(),
            hi: hi.into(),
            windows: windows.map(str::to_string),
        });
        self
    }
}

/// Declare metrics from names: those in `counts` are counts, the rest floats.
pub(crate) fn metrics_of(names: &[&str], counts: &[&str]) -> Vec<Metric> {
    names
        .iter()
        .map(|n| {
            if counts.contains(n) {
                Metric::count(*n)
            } else {
                Metric::float(*n)
            }
        })
        .collect()
}

/// A file pinned by sha256 in a case (`[text]`, `[tokens]`,
/// `[reference_record]`, `[reference_kld]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Pin {
    /// The table that names it.
    pub table: &'static str,
    /// The file.
    pub path: PathBuf,
    /// Its pinned sha256.
    pub sha256: String,
    /// Where the pin is written.
    pub at: Location,
}

impl Pin {
    /// The file's bytes, checked against the pin; a mismatch names the pin's place.
    pub(crate) fn read_bytes(&self) -> Result<Vec<u8>> {
        let (at, table, path) = (&self.at, self.table, &self.path);
        let bytes = std::fs::read(path)
            .map_err(|e| Error::input(format!("{at}: {table}.path: {}: {e}", path.display())))?;
        let sha = sha256_bytes(&bytes);
        if sha != self.sha256 {
            return Err(Error::input(format!(
                "{at}: {table}.sha256: {} does not match its pin\n  expected {}\n  actual   {sha} ({} bytes)",
                path.display(),
                self.sha256,
                bytes.len()
            )));
        }
        Ok(bytes)
    }

    /// The file as UTF-8 text, checked against the pin.
    pub fn read_text(&self) -> Result<String> {
        String::from_utf8(self.read_bytes()?)
            .map_err(|e| Error::input(format!("{}: not UTF-8: {e}", self.path.display())))
    }
}

/// Why `sha` is not a sha256 pin (64 lower-case hex digits), if it is not.
pub(crate) fn bad_sha(key: &str, sha: &str) -> Option<String> {
    (!crate::core::fsutil::is_hex(sha, 64))
        .then(|| format!("{key}: `{sha}` is not 64 lower-case hex digits"))
}

/// A path relative to the case file.
pub(crate) fn beside(case_file: &Path, rel: &str) -> PathBuf {
    case_file.parent().unwrap_or(Path::new(".")).join(rel)
}

/// A float matches its golden when `|a − b| ≤ atol + rtol·|b|`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Absolute part.
    #[serde(default = "default_atol")]
    pub atol: f64,
    /// Relative part.
    #[serde(default = "default_rtol")]
    pub rtol: f64,
}

fn default_atol() -> f64 {
    Tolerance::DEFAULT.atol
}

fn default_rtol() -> f64 {
    Tolerance::DEFAULT.rtol
}

impl Tolerance {
    /// Defaults: logits are bitwise reproducible for one build, so only
    /// summation noise is tolerated.
    pub(crate) const DEFAULT: Tolerance = Tolerance {
        atol: 1e-9,
        rtol: 1e-6,
    };

    /// Measurements of a machine (tokens per second, their ratios), which
    /// another machine or a busy one changes: anything from 0 to 10× the
    /// golden counts as the same; gates carry the decision.
    pub(crate) const MEASUREMENT: Tolerance = Tolerance {
        atol: 0.0,
        rtol: 9.0,
    };
}

/// `path:line:col` of a value, for messages after parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location(pub String);

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A gate: the metric must be ≤ max and ≥ min.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// Metric name.
    pub metric: String,
    /// Upper bound.
    pub max: Option<f64>,
    /// Lower bound.
    pub min: Option<f64>,
    /// Gate a bound of the metric's interval instead of its value
    /// (`ci95_hi`, `ci95_lo`, `boot95_hi`, `boot95_lo`).
    pub on: Option<String>,
    /// The metric read: `metric`, or the bound `on` selects.
    pub read: String,
    /// The metric's declared `ci95` interval, for the failure message.
    pub interval: Option<Interval>,
    /// What a violation does: fail the test (the default), or warn.
    pub level: Level,
    /// The models it applies to (globs on the alias, `[[gate]] models`; a
    /// glob led by `!` leaves out what it matches); empty: every model of
    /// the case.
    pub models: Vec<String>,
    /// What a reader calls its metric and the metric's unit, as the kind
    /// declares them ([`Metric::label`]); None: the metric's name.
    pub about: Option<(&'static str, Option<&'static str>)>,
}

/// What a gate's violation does (`[[gate]] level`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// The test fails.
    #[default]
    Fail,
    /// Reported (the card's ⚠, a note), and the test still passes: a
    /// quant expected to be worse.
    Warn,
}

impl Level {
    /// Whether this is the default level (JSON leaves it out).
    pub(crate) fn is_fail(&self) -> bool {
        *self == Level::Fail
    }
}

impl Gate {
    /// Whether it applies to model `alias`: one of its `models` globs
    /// matches (or it names none but `!` ones), and no `!` glob does. The
    /// globs were checked when the case was parsed; one that cannot be
    /// built here matches nothing.
    pub(crate) fn applies_to(&self, alias: &str) -> bool {
        let matches =
            |g: &str| globset::Glob::new(g).is_ok_and(|g| g.compile_matcher().is_match(alias));
        let (out, any): (Vec<&str>, Vec<&str>) = self
            .models
            .iter()
            .map(String::as_str)
            .partition(|g| g.starts_with('!'));
        (any.is_empty() || any.iter().any(|g| matches(g))) && !out.iter().any(|g| matches(&g[1..]))
    }

    /// The metric whose value is gated: `metric`, or with `on = "ci95_hi"`
    /// the bound of the interval its kind declared (`read`).
    pub(crate) fn gated_metric(&self) -> String {
        self.read.clone()
    }

    /// The gate as a reader says it, with the kind's plain name for its
    /// metric, for the bound `bound` (`max`, `min`) at `threshold`:
    /// `KLD mean ≤ 0.1 nats`, `ΔNLL ≤ 0.05 nats/token (decided sequentially)`,
    /// `same top, Wilson 95% lower bound ≥ 0.9`.
    pub(crate) fn title(&self, bound: &str, threshold: f64) -> String {
        let (label, unit) = match self.about {
            Some((label, unit)) => (label.to_string(), unit),
            None => (self.metric.clone(), None),
        };
        let op = if bound == "max" { "≤" } else { "≥" };
        let unit = unit.map_or(String::new(), |u| format!(" {u}"));
        let side = |s: &str| match s {
            "lo" => "lower bound",
            _ => "upper bound",
        };
        match self.on.as_deref().and_then(|on| on.rsplit_once('_')) {
            None => format!("{label} {op} {threshold}{unit}"),
            Some(("seq", _)) => format!("{label} {op} {threshold}{unit} (decided sequentially)"),
            Some((interval, s)) => {
                let name = match interval {
                    "ci95" => "95% CI",
                    "boot95" => "bootstrap 95%",
                    "wilson95" => "Wilson 95%",
                    other => other,
                };
                format!("{label}, {name} {} {op} {threshold}{unit}", side(s))
            }
        }
    }
}
