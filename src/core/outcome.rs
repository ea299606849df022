//! What one trial produced: the [`Outcome`] of a case on a model, with its
//! gate verdicts, the decision of a preregistered rule, and the rows a kind
//! rendered for the report. Shared by every stage after execute.

use crate::core::settings::{EngineBuild, Settings};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// pass, fail (a gate was violated) or error (the case could not run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// All gates held.
    Pass,
    /// A gate was violated.
    Fail,
    /// The case could not be run.
    Error,
}

impl Status {
    /// The word, as goldens and `--json` write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Error => "error",
        }
    }
}

/// Time per stage, for `--timings`.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct StageTimings {
    /// Fetch/derive and sha256 check.
    pub prepare: Duration,
    /// Model load (or wait for another thread's load).
    pub load: Duration,
    /// Tokenization.
    pub tokenize: Duration,
    /// llama_decode.
    pub decode: Duration,
    /// Row reduction and metrics.
    pub measure: Duration,
    /// Everything.
    pub total: Duration,
    /// How many other readers (trials, reference work) shared this trial's
    /// decode; its decode time is its share.
    #[serde(default)]
    pub shared_with: u32,
}

/// One gate's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct GateResult {
    /// Metric name, with the selected bound (`delta_nll_mean.ci95_hi`) when
    /// the gate has `on`.
    pub metric: String,
    /// `max` or `min`.
    pub bound: String,
    /// The threshold.
    pub threshold: f64,
    /// The measured value (None when missing).
    pub observed: Option<f64>,
    /// Whether it held.
    pub passed: bool,
    /// The metric's 95% interval and the number of windows behind it, when
    /// the case measures one (`X_ci95_lo`/`_hi`, or `X` less `_mean`).
    pub interval: Option<(f64, f64, usize)>,
    /// What the interval's count counts ("windows", "tasks") when the gate
    /// reads an anytime-valid confidence sequence (a `[decide]` case's
    /// gate), not a fixed-N interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<String>,
    /// What its violation does: fail (the default, left out of JSON) or
    /// warn.
    #[serde(default, skip_serializing_if = "crate::core::case::Level::is_fail")]
    pub level: crate::core::case::Level,
    /// The gate as a reader says it, in the kind's plain words
    /// ([`crate::core::case::Gate::title`]): `KLD mean ≤ 0.1 nats`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub title: String,
}

impl GateResult {
    /// The gate in a reader's words: its [`GateResult::title`], or, for a
    /// result read back from before titles, `metric ≤ threshold`.
    pub fn rule(&self) -> String {
        if !self.title.is_empty() {
            return self.title.clone();
        }
        let op = if self.bound == "max" { "≤" } else { "≥" };
        format!("{} {op} {}", self.metric, self.threshold)
    }

    /// One line for a failure message.
    pub fn describe(&self) -> String {
        let op = if self.bound == "max" { "≤" } else { "≥" };
        match self.observed {
            None => format!(
                "{}: missing, gate needs {} {op} {}",
                self.metric, self.metric, self.threshold
            ),
            Some(v) => {
                let ci = self
                    .interval
                    .map(|(lo, hi, n)| match &self.sequence {
                        Some(unit) => {
                            format!(" (anytime-valid sequence {lo:.6} … {hi:.6} after {n} {unit})")
                        }
                        None => format!(" (95% CI {lo:.6} … {hi:.6} over {n} windows)"),
                    })
                    .unwrap_or_default();
                format!(
                    "{} = {v}{ci} violates {} {op} {} ({} {})",
                    self.metric, self.metric, self.threshold, self.bound, self.threshold
                )
            }
        }
    }
}

/// win, loss or tie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The win condition held.
    Win,
    /// The loss condition held.
    Loss,
    /// Neither.
    Tie,
}

impl Verdict {
    /// +1, −1, 0.
    pub(crate) fn as_metric(self) -> f64 {
        match self {
            Verdict::Win => 1.0,
            Verdict::Loss => -1.0,
            Verdict::Tie => 0.0,
        }
    }

    /// The word.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Win => "win",
            Verdict::Loss => "loss",
            Verdict::Tie => "tie",
        }
    }
}

/// Metrics a case with a prereg adds: the decision (+1 win, 0 tie, −1 loss)
/// and whether the measured value fell inside the predicted interval (1/0).
pub(crate) const PREREG_METRICS: &[&str] = &["prereg_outcome", "prereg_prediction_hit"];

/// The recorded decision of a preregistered comparison.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Decision {
    /// The prereg file, as in the ledger.
    pub prereg: String,
    /// Its sha256.
    pub prereg_sha256: String,
    /// When it was sealed (UTC).
    pub sealed_at: String,
    /// win / loss / tie.
    pub outcome: Verdict,
    /// The measured value inside [low, high] of the prediction.
    pub prediction_hit: bool,
    /// The deciding metric and its measured value.
    pub metric: String,
    /// Measured value.
    pub value: f64,
    /// The bounds the rule read, by name.
    pub bounds: BTreeMap<String, f64>,
    /// Predicted value, low, high.
    pub prediction: [f64; 3],
    /// The rule, as written.
    pub rule: String,
}

impl Decision {
    /// `win; prediction hit` — the decision as the golden and the report show it.
    pub(crate) fn line(&self) -> String {
        format!(
            "{}; prediction {}",
            self.outcome.as_str(),
            if self.prediction_hit { "hit" } else { "missed" }
        )
    }
}

/// One column of a [`Table`].
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// UTF-8 text.
    Str(Vec<String>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// Doubles.
    F64(Vec<f64>),
    /// Booleans.
    Bool(Vec<bool>),
}

impl Column {
    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        match self {
            Column::Str(v) => v.len(),
            Column::I32(v) => v.len(),
            Column::F64(v) => v.len(),
            Column::Bool(v) => v.len(),
        }
    }
}

/// Per-position (or per-unit) rows a kind renders for the Parquet output:
/// named columns of equal length. The report adds `case`, `model` and
/// `model_sha256` in front.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The Parquet message name (`kld_position`, `digit_position`).
    pub name: &'static str,
    /// Columns in order.
    pub columns: Vec<(String, Column)>,
}

impl Table {
    /// Rows, when every column has the same length.
    pub fn rows(&self) -> Option<usize> {
        let n = self.columns.first().map_or(0, |(_, c)| c.len());
        self.columns.iter().all(|(_, c)| c.len() == n).then_some(n)
    }
}

/// A rendered file a kind produces beside its rows (e.g. an SVG plot).
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    /// File extension (`svg`).
    pub extension: &'static str,
    /// Its content.
    pub body: String,
}

/// The result of one trial; also one JSON object of `--json`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Outcome {
    /// Case name.
    pub case: String,
    /// Model alias.
    pub model: String,
    /// The case's kind (`kind = "…"`): which declarations the report reads.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Verdict.
    pub status: Status,
    /// Flat metric name → value (a NaN is written `null` and read back a
    /// NaN: a gate on it fails, wherever the outcome was judged).
    #[serde(deserialize_with = "null_as_nan")]
    pub metrics: BTreeMap<String, f64>,
    /// Gate verdicts.
    pub gates: Vec<GateResult>,
    /// Why the case could not run.
    pub error: Option<String>,
    /// Whether `error` was the input's fault (exit 2).
    #[serde(skip)]
    pub input_error: bool,
    /// Model file sha256.
    pub model_sha256: Option<String>,
    /// Case file sha256.
    pub case_sha256: Option<String>,
    /// Scored token stream sha256.
    pub token_stream_sha256: Option<String>,
    /// The case's reference model alias, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The reference's pinned sha256: a cached result is matched to its
    /// reference by content, never by alias alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_sha256: Option<String>,
    /// Series the report plots, not compared with goldens (per-window
    /// ΔNLL: `delta_nll_per_window`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub series: BTreeMap<String, Vec<f64>>,
    /// The pinned files the case reads (its text, token ids or tasks):
    /// (file name, sha256), so a report says what was measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<(String, String)>,
    /// The runtimes a drift case compared (`A: linked (…)`, `B: NAME
    /// sha256 … (version)`); empty for every other case (its numbers are
    /// the linked build's, `build`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtimes: Vec<String>,
    /// Engine settings.
    pub settings: Option<Settings>,
    /// The machine a measurement of speed was taken on (CPU, CPUs, memory,
    /// host, the engine's devices); None for every other kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Engine build.
    pub build: EngineBuild,
    /// Time per stage.
    pub timings: StageTimings,
    /// The decision of a preregistered comparison (never read back from the
    /// result cache: preregistered cases always run).
    #[serde(skip_deserializing)]
    pub prereg: Option<Decision>,
    /// Discrete text outcomes (recitation output, stop reason, least
    /// certain positions), compared exactly with the golden.
    #[serde(default)]
    pub texts: BTreeMap<String, String>,
    /// Per-position rows the kind rendered, for the Parquet output.
    #[serde(skip)]
    pub rows: Option<Arc<Table>>,
    /// Files the kind rendered beside the rows (plots).
    #[serde(skip)]
    pub artifacts: Vec<Artifact>,
    /// The metrics the terminal table shows (the kind's headline and every
    /// gated metric); empty: all of them.
    #[serde(skip)]
    pub headline: Vec<String>,
    /// Notes the terminal table prints under the outcome, as its kind
    /// words them (not in goldens).
    #[serde(skip)]
    pub notes: Vec<String>,
    /// Why an outcome read back (`merge`, `report --json`) is not
    /// authenticated: it came without a MAC because no signing key is set,
    /// so anyone who could write its file could have edited it. None for
    /// an outcome made in this run or verified with the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unauthenticated: Option<String>,
}

/// Metrics from JSON, where serde_json writes a NaN as `null`.
fn null_as_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    let m: BTreeMap<String, Option<f64>> = serde::Deserialize::deserialize(d)?;
    Ok(m.into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

impl Outcome {
    /// A new outcome of `case` on `model`, an error until a run says otherwise.
    pub fn new(case: &str, model: &str, build: EngineBuild) -> Self {
        Outcome {
            case: case.to_string(),
            model: model.to_string(),
            kind: String::new(),
            status: Status::Error,
            metrics: BTreeMap::new(),
            gates: Vec::new(),
            error: None,
            input_error: false,
            model_sha256: None,
            case_sha256: None,
            token_stream_sha256: None,
            reference: None,
            reference_sha256: None,
            series: BTreeMap::new(),
            data: Vec::new(),
            runtimes: Vec::new(),
            settings: None,
            machine: None,
            build,
            timings: StageTimings::default(),
            prereg: None,
            texts: BTreeMap::new(),
            rows: None,
            artifacts: Vec::new(),
            headline: Vec::new(),
            notes: Vec::new(),
            unauthenticated: None,
        }
    }

    /// The failure message for a test, or None on pass.
    pub fn failure_message(&self) -> Option<String> {
        self.end().into_result().err().map(|e| e.to_string())
    }

    /// How the trial ended: passed, a gate violated (the violations), or
    /// it could not run (its error, the input's fault or the engine's).
    pub fn end(&self) -> TrialEnd {
        match self.status {
            Status::Pass => TrialEnd::Pass,
            Status::Error if self.input_error => {
                TrialEnd::InputError(self.error.clone().unwrap_or_default())
            }
            Status::Error => TrialEnd::EngineError(self.error.clone().unwrap_or_default()),
            Status::Fail => {
                let mut m = format!("{}::{}: gate violated\n", self.case, self.model);
                for g in self.gates.iter().filter(|g| !g.passed && g.level.is_fail()) {
                    m.push_str(&format!("  {}\n", g.describe()));
                }
                TrialEnd::Fail(m)
            }
        }
    }
}

/// How a trial ended, with the whole failure message when it did not pass
/// (one enum over an outcome's status, error and input fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrialEnd {
    /// Its gates held, its files were written and its golden matches.
    #[error("passed")]
    Pass,
    /// It ran, and a gate was violated, a file could not be written or
    /// its golden differs.
    #[error("{0}")]
    Fail(String),
    /// It could not run: its input is wrong (a case, a model file, a
    /// pinned file); exit 2 in `quantgate run`.
    #[error("{0}")]
    InputError(String),
    /// It could not run: the engine failed, or its worker died.
    #[error("{0}")]
    EngineError(String),
}

impl TrialEnd {
    /// Ok when it passed; else itself, whose `Display` is the whole
    /// failure message.
    pub fn into_result(self) -> Result<(), TrialEnd> {
        match self {
            TrialEnd::Pass => Ok(()),
            end => Err(end),
        }
    }

    /// Whether it could not run at all (as opposed to a violated gate or a
    /// changed golden).
    pub fn is_error(&self) -> bool {
        matches!(self, TrialEnd::InputError(_) | TrialEnd::EngineError(_))
    }
}

/// `suite/case::model` → (`suite/case`, `model`); a name without `::` is all case.
pub(crate) fn split_test_name(name: &str) -> (&str, &str) {
    name.split_once("::").unwrap_or((name, ""))
}
