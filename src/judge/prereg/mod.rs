//! Preregistered, hashed decision rules (seed 001, step 5).
//!
//! A prereg file (`prereg/*.toml`) names a comparison, the case whose metric
//! decides it, the rule and a prediction. `quantgate prereg seal` appends
//! the sha256 of its exact bytes to `prereg/LEDGER`, each line chained to the
//! previous one by hash. At run time the file, the chain and (in a git
//! checkout) the history are verified before any model runs: the ledger
//! line must be committed in HEAD's history and the case's golden must not
//! have been committed before it.
//!
//! Contract: every mismatch is an input error naming the file (and the
//! ledger line); a loss is an outcome, never an error.

mod history;
mod ledger;

pub use history::check_history;
pub use ledger::{
    format_utc, ledger_of, now_unix, read_ledger, root_of, seal, sealed_line, LedgerLine, LEDGER,
};

use crate::core::case::{Case, Decide, Location};
use crate::core::error::{Error, Result};
use crate::core::fsutil::{line_col, sha256_bytes};
use crate::core::outcome::{Decision, Verdict, PREREG_METRICS};
use crate::core::parse::parse_toml;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Interval bounds a rule may test, besides the metric's `value`.
const BOUNDS: &[&str] = &["value", "ci95_lo", "ci95_hi", "boot95_lo", "boot95_hi"];

/// The bounds a sequential rule tests: its confidence sequence's at the
/// stop (fixed-N intervals are not valid after a data-dependent stop).
const SEQ_BOUNDS: &[&str] = &["seq_lo", "seq_hi"];

/// Which sizes a comparison allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SizeRule {
    /// No size constraint.
    None,
    /// The candidate's bytes (split parts added up) ≤ the baseline's.
    CandidateNotLarger,
}

/// One side of the rule: `<bound> <op> <number>`, e.g. `ci95_hi < 0`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// `value` or an interval bound.
    pub bound: String,
    /// `<`, `<=`, `>`, `>=`.
    pub op: String,
    /// The number.
    pub threshold: f64,
}

/// Why a preregistered rule gives no decision: never a tie.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NoDecision {
    /// A metric the rule reads was not measured.
    #[error("metric `{metric}` was not measured: no decision")]
    NotMeasured {
        /// Its name.
        metric: String,
    },
    /// A metric the rule reads is NaN or infinite.
    #[error("metric `{metric}` is {value}: no decision")]
    NotFinite {
        /// Its name.
        metric: String,
        /// What was measured.
        value: f64,
    },
    /// Both the win and the loss conditions hold.
    #[error("{rule_at}: rule: both `{win}` and `{loss}` hold ({w}, {l}): the rule is ambiguous")]
    Ambiguous {
        /// Where the rule is written.
        rule_at: String,
        /// The win condition.
        win: String,
        /// The loss condition.
        loss: String,
        /// The win condition's bound as measured.
        w: f64,
        /// The loss condition's bound as measured.
        l: f64,
    },
}

impl Condition {
    fn parse(text: &str) -> std::result::Result<Self, crate::core::error::Malformed> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        let [bound, op, num] = parts[..] else {
            return Err(
                format!("`{text}`: write `<bound> <op> <number>`, e.g. `ci95_hi < 0`").into(),
            );
        };
        if !BOUNDS.contains(&bound) && !SEQ_BOUNDS.contains(&bound) {
            return Err(format!(
                "`{text}`: `{bound}` is not one of {}, {}",
                BOUNDS.join(", "),
                SEQ_BOUNDS.join(", ")
            )
            .into());
        }
        if !["<", "<=", ">", ">="].contains(&op) {
            return Err(format!("`{text}`: `{op}` is not one of <, <=, >, >=").into());
        }
        let threshold: f64 = num
            .parse()
            .map_err(|_| format!("`{text}`: `{num}` is not a number"))?;
        if !threshold.is_finite() {
            return Err(format!("`{text}`: `{num}` is not a finite number").into());
        }
        Ok(Condition {
            bound: bound.into(),
            op: op.into(),
            threshold,
        })
    }

    /// The metric this condition reads: `metric` itself for `value`, else
    /// the interval bound (`delta_nll_mean` + `ci95_hi` → `delta_nll_ci95_hi`).
    pub(crate) fn metric_name(&self, metric: &str) -> String {
        if self.bound == "value" {
            metric.to_string()
        } else if SEQ_BOUNDS.contains(&self.bound.as_str()) {
            format!("{metric}_{}", self.bound)
        } else {
            format!(
                "{}_{}",
                metric.strip_suffix("_mean").unwrap_or(metric),
                self.bound
            )
        }
    }

    /// Whether `x` satisfies it; NaN satisfies nothing.
    pub(crate) fn holds(&self, x: f64) -> bool {
        match self.op.as_str() {
            "<" => x < self.threshold,
            "<=" => x <= self.threshold,
            ">" => x > self.threshold,
            _ => x >= self.threshold,
        }
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.bound, self.op, self.threshold)
    }
}

/// A parsed prereg file.
#[derive(Debug, Clone)]
pub struct Prereg {
    /// The file.
    pub path: PathBuf,
    /// Its path in the ledger: `<ledger dir name>/<file name>`.
    pub ledger_path: String,
    /// sha256 of its exact bytes.
    pub sha256: String,
    /// Candidate alias and where it is written.
    pub candidate: (String, Location),
    /// Baseline alias and where it is written.
    pub baseline: (String, Location),
    /// Size rule.
    pub size_rule: SizeRule,
    /// The deciding case (suite name, e.g. `prereg/q6k_vs_q8_0`).
    pub case: (String, Location),
    /// The deciding metric.
    pub metric: (String, Location),
    /// Windows that must be evaluated.
    pub windows: usize,
    /// Win condition.
    pub win: Condition,
    /// Loss condition (else tie).
    pub loss: Condition,
    /// Where the rule is written.
    pub rule_at: Location,
    /// Predicted value, low, high.
    pub prediction: (f64, f64, f64),
    /// Free text.
    pub note: String,
    /// A sequential design, sealed with the rule: (alpha, seed, bounds of
    /// the metric's per-window value), and where it is written.
    pub decide: Option<(f64, u64, (f64, f64), Location)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideFile {
    alpha: f64,
    seed: u64,
    bounds: [f64; 2],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PreregFile {
    compare: CompareFile,
    size_rule: Spanned<String>,
    case: Spanned<String>,
    metric: Spanned<String>,
    windows: Spanned<usize>,
    rule: Spanned<RuleFile>,
    prediction: Spanned<PredictionFile>,
    note: String,
    decide: Option<Spanned<DecideFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompareFile {
    candidate: Spanned<String>,
    baseline: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    win: Spanned<String>,
    loss: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PredictionFile {
    value: f64,
    low: f64,
    high: f64,
}

/// Parse a prereg file (schema and rule only; see [`check_case`]).
pub fn parse(path: &Path) -> Result<Prereg> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::input(format!("{}: {e}", path.display())))?;
    let src = String::from_utf8(bytes.clone())
        .map_err(|e| Error::input(format!("{}: not UTF-8: {e}", path.display())))?;
    let f: PreregFile = parse_toml(path, &src)?;
    let at = |offset: usize| {
        let (l, c) = line_col(&src, offset);
        Location(format!("{}:{l}:{c}", path.display()))
    };
    let mut errors = Vec::new();
    let size_rule = match f.size_rule.get_ref().as_str() {
        "none" => SizeRule::None,
        "candidate-not-larger" => SizeRule::CandidateNotLarger,
        other => {
            errors.push(format!(
                "{}: size_rule: `{other}` is not one of none, candidate-not-larger",
                at(f.size_rule.span().start)
            ));
            SizeRule::None
        }
    };
    let mut cond = |s: &Spanned<String>, key: &str| match Condition::parse(s.get_ref()) {
        Ok(c) => c,
        Err(e) => {
            errors.push(format!("{}: rule.{key}: {e}", at(s.span().start)));
            Condition {
                bound: "value".into(),
                op: "<".into(),
                threshold: f64::NAN,
            }
        }
    };
    let rule = f.rule.get_ref();
    let win = cond(&rule.win, "win");
    let loss = cond(&rule.loss, "loss");
    let p = f.prediction.get_ref();
    let pred_at = at(f.prediction.span().start);
    if !(p.low <= p.value && p.value <= p.high) {
        errors.push(format!(
            "{pred_at}: prediction: need low ≤ value ≤ high, got {} ≤ {} ≤ {}",
            p.low, p.value, p.high
        ));
    }
    if *f.windows.get_ref() == 0 {
        errors.push(format!(
            "{}: windows: must be ≥ 1",
            at(f.windows.span().start)
        ));
    }
    let decide = f.decide.as_ref().map(|d| {
        let v = d.get_ref();
        let [lo, hi] = v.bounds;
        let problems = [
            Decide::alpha_problem("decide.alpha", v.alpha),
            Decide::bounds_problem("decide.bounds", &v.bounds),
        ];
        for why in problems.into_iter().flatten() {
            errors.push(format!("{}: {why}", at(d.span().start)));
        }
        (v.alpha, v.seed, (lo, hi), at(d.span().start))
    });
    // A sequential rule tests its sequence's bounds; a fixed-N rule its
    // intervals.
    for (key, c) in [("win", &win), ("loss", &loss)] {
        let seq = SEQ_BOUNDS.contains(&c.bound.as_str());
        if seq != decide.is_some() {
            errors.push(format!(
                "{}: rule.{key}: `{c}`: {}",
                at(f.rule.span().start),
                if seq {
                    "seq_lo / seq_hi need a sealed sequential design (decide = { alpha, seed, bounds })"
                } else {
                    "a sequential design decides on its sequence's bounds: test seq_lo or seq_hi"
                }
            ));
        }
    }
    if f.compare.candidate.get_ref() == f.compare.baseline.get_ref() {
        errors.push(format!(
            "{}: compare: candidate and baseline are both `{}`",
            at(f.compare.candidate.span().start),
            f.compare.candidate.get_ref()
        ));
    }
    if !errors.is_empty() {
        return Err(Error::input(errors.join("\n")));
    }
    let dir = path
        .parent()
        .and_then(|d| d.file_name())
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_else(|| ".".into());
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Prereg {
        path: path.to_path_buf(),
        ledger_path: format!("{dir}/{name}"),
        sha256: sha256_bytes(&bytes),
        candidate: (
            f.compare.candidate.get_ref().clone(),
            at(f.compare.candidate.span().start),
        ),
        baseline: (
            f.compare.baseline.get_ref().clone(),
            at(f.compare.baseline.span().start),
        ),
        size_rule,
        case: (f.case.get_ref().clone(), at(f.case.span().start)),
        metric: (f.metric.get_ref().clone(), at(f.metric.span().start)),
        windows: *f.windows.get_ref(),
        win,
        loss,
        rule_at: at(f.rule.span().start),
        prediction: (p.value, p.low, p.high),
        note: f.note,
        decide,
    })
}

impl Prereg {
    /// The rule in words.
    pub(crate) fn rule_text(&self) -> String {
        let design = self
            .decide
            .as_ref()
            .map(|(alpha, seed, (lo, hi), _)| {
                format!(
                    " (sequential over up to {} windows: alpha {alpha}, seed {seed}, \
                     per-window values in [{lo}, {hi}])",
                    self.windows
                )
            })
            .unwrap_or_default();
        format!(
            "{}: win if {}; loss if {}; else tie{design}",
            self.metric.0, self.win, self.loss
        )
    }

    /// Every metric the rule and the prediction read.
    pub(crate) fn needed_metrics(&self) -> Vec<String> {
        let mut v = vec![
            self.metric.0.clone(),
            self.win.metric_name(&self.metric.0),
            self.loss.metric_name(&self.metric.0),
        ];
        v.dedup();
        v
    }

    /// Evaluate the rule on measured metrics. A missing or NaN value is an
    /// error (never a tie); both conditions holding is an error.
    pub fn decide(
        &self,
        metrics: &BTreeMap<String, f64>,
        sealed_at: &str,
    ) -> std::result::Result<Decision, NoDecision> {
        let get = |name: &str| -> std::result::Result<f64, NoDecision> {
            match metrics.get(name) {
                Some(v) if v.is_finite() => Ok(*v),
                Some(v) => Err(NoDecision::NotFinite {
                    metric: name.to_string(),
                    value: *v,
                }),
                None => Err(NoDecision::NotMeasured {
                    metric: name.to_string(),
                }),
            }
        };
        let value = get(&self.metric.0)?;
        let w = get(&self.win.metric_name(&self.metric.0))?;
        let l = get(&self.loss.metric_name(&self.metric.0))?;
        let outcome = match (self.win.holds(w), self.loss.holds(l)) {
            (true, true) => {
                return Err(NoDecision::Ambiguous {
                    rule_at: self.rule_at.to_string(),
                    win: self.win.to_string(),
                    loss: self.loss.to_string(),
                    w,
                    l,
                })
            }
            (true, false) => Verdict::Win,
            (false, true) => Verdict::Loss,
            (false, false) => Verdict::Tie,
        };
        let (pv, lo, hi) = self.prediction;
        let mut bounds = BTreeMap::new();
        bounds.insert(self.win.metric_name(&self.metric.0), w);
        bounds.insert(self.loss.metric_name(&self.metric.0), l);
        Ok(Decision {
            prereg: self.ledger_path.clone(),
            prereg_sha256: self.sha256.clone(),
            sealed_at: sealed_at.to_string(),
            outcome,
            prediction_hit: lo <= value && value <= hi,
            metric: self.metric.0.clone(),
            value,
            bounds,
            prediction: [pv, lo, hi],
            rule: self.rule_text(),
        })
    }
}

/// Check that `case` is the case this prereg names and can decide it:
/// same name, it names this file back, its only model is the candidate, its
/// reference the baseline, it produces the metric and the rule's bounds, and
/// its window count is the preregistered one.
pub fn check_case(p: &Prereg, case: &Case) -> Result<()> {
    let mut errors = Vec::new();
    let file = p.path.display();
    if p.case.0 != case.name {
        errors.push(format!(
            "{}: case: `{}`, but it is named by case `{}`",
            p.case.1, p.case.0, case.name
        ));
    }
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    match &case.prereg {
        Some((path, _)) if same(path, &p.path) => {}
        Some((path, at)) => errors.push(format!(
            "{at}: prereg: names {}, not {file}",
            path.display()
        )),
        None => errors.push(format!(
            "{}: case `{}` does not name this prereg (add `prereg = \"…\"` to it)",
            p.case.1, case.name
        )),
    }
    let models: Vec<&str> = case.models.iter().map(|(m, _)| m.as_str()).collect();
    if models != [p.candidate.0.as_str()] {
        errors.push(format!(
            "{}: compare.candidate: `{}`, but case `{}` runs {:?}; a preregistered case runs only the candidate",
            p.candidate.1, p.candidate.0, case.name, models
        ));
    }
    let reference = case.reference.as_ref().map(|(r, _)| r.as_str());
    if reference != Some(p.baseline.0.as_str()) {
        errors.push(format!(
            "{}: compare.baseline: `{}`, but case `{}` compares against {:?}",
            p.baseline.1, p.baseline.0, case.name, reference
        ));
    }
    let metrics = case.metric_names();
    for m in p.needed_metrics() {
        if !metrics.contains(&m) || PREREG_METRICS.contains(&m.as_str()) {
            errors.push(format!(
                "{}: metric/rule: `{m}` is not a metric of case `{}`; metrics: {}",
                p.metric.1,
                case.name,
                metrics.join(", ")
            ));
        }
    }
    match (&p.decide, &case.decide) {
        (None, None) => {}
        (Some((alpha, seed, bounds, at)), Some(d)) => {
            let theirs = d.bounds.get(&p.metric.0).copied();
            if d.alpha != *alpha || d.seed != *seed || theirs != Some(*bounds) {
                errors.push(format!(
                    "{at}: decide: the sealed design is alpha {alpha}, seed {seed}, bounds \
                     [{}, {}], but case `{}` declares alpha {}, seed {}, bounds {} ({})",
                    bounds.0,
                    bounds.1,
                    case.name,
                    d.alpha,
                    d.seed,
                    theirs.map_or("none".into(), |(l, h)| format!("[{l}, {h}]")),
                    d.at
                ));
            }
        }
        (Some((_, _, _, at)), None) => errors.push(format!(
            "{at}: decide: a sequential design is sealed, but case `{}` has no \
             `[decide] sequential = true`",
            case.name
        )),
        (None, Some(d)) => errors.push(format!(
            "{}: decide: case `{}` decides sequentially, but its sealed rule declares no \
             sequential design (seal one with `decide = {{ alpha, seed, bounds }}`)",
            d.at, case.name
        )),
    }
    match &case.windows {
        None => errors.push(format!(
            "{}: case `{}` is not a perplexity or kld case; a prereg compares windows",
            p.case.1, case.name
        )),
        Some((declared, window_at)) => {
            if *declared != Some(p.windows) {
                errors.push(format!(
                    "{file}: windows: {} preregistered, but case `{}` declares {} ({})",
                    p.windows,
                    case.name,
                    declared.map_or("no chunk count".to_string(), |c| format!("{c} windows")),
                    window_at
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::input(errors.join("\n")))
    }
}

/// One sealed comparison as `verify`/`report` see it.
#[derive(Debug)]
pub struct Checked {
    /// The ledger line.
    pub line: LedgerLine,
    /// The parsed file (None when it could not be read).
    pub prereg: Option<Prereg>,
    /// Everything wrong with it (empty: verified).
    pub problems: Vec<String>,
    /// The commit that added the seal (git checkouts only).
    pub commit: Option<String>,
}

/// Verify every prereg in `dir` and every ledger line without running a
/// model: chain, hashes, unsealed files, aliases, case consistency, size
/// rule (registry sizes, or the files when present) and git history.
/// A broken ledger is an error; per-file problems are listed per line.
pub fn verify_all(
    dir: &Path,
    suites: &Path,
    goldens: &Path,
) -> Result<(Vec<Checked>, Vec<String>)> {
    let ledger = dir.join(LEDGER);
    let lines = read_ledger(&ledger)?;
    let registry = crate::models::Registry::load(&suites.join("models.toml"))?;
    let mut unsealed = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::input(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    for f in &files {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        if !lines
            .iter()
            .any(|l| l.path.rsplit('/').next() == Some(&name))
        {
            unsealed.push(format!(
                "{}: not sealed (run `quantgate prereg seal {}`)",
                f.display(),
                f.display()
            ));
        }
    }
    let mut out = Vec::new();
    for line in lines {
        let name = line.path.rsplit('/').next().unwrap_or_default().to_string();
        let path = dir.join(&name);
        let mut problems = Vec::new();
        let mut commit = None;
        let p = match parse(&path) {
            Ok(p) => Some(p),
            Err(e) if !path.exists() => {
                problems.push(format!(
                    "{}:{}: sealed file {} is missing: a sealed prereg is never deleted ({})",
                    ledger.display(),
                    line.line_no,
                    line.path,
                    e.message
                ));
                None
            }
            Err(e) => {
                problems.push(e.message);
                None
            }
        };
        if let Some(p) = &p {
            if let Err(e) = sealed_line(p) {
                problems.push(e.message);
            }
            for (alias, at) in [&p.candidate, &p.baseline] {
                if let Err(e) = registry.entry(alias) {
                    problems.push(format!("{at}: {}", e.message));
                }
            }
            let case_file = suites.join(format!("{}.toml", p.case.0));
            match crate::plan::parse::parse_case(&case_file, &case_file, &p.case.0).map(|p| p.case)
            {
                Err(_) if !case_file.exists() => problems.push(format!(
                    "{}: case: `{}` is not a case ({} does not exist)",
                    p.case.1,
                    p.case.0,
                    case_file.display()
                )),
                Err(e) => problems.push(e.message),
                Ok(case) => {
                    if let Err(e) = check_case(p, &case) {
                        problems.push(e.message);
                    }
                }
            }
            let size_of = |alias: &str| registry.entry(alias).ok().and_then(|e| e.bytes);
            match (size_of(&p.candidate.0), size_of(&p.baseline.0)) {
                (Some(c), Some(b)) => {
                    if let Err(e) = check_size(p, c, b) {
                        problems.push(e.message);
                    }
                }
                _ if p.size_rule == SizeRule::None => {}
                _ => problems.push(format!(
                    "{}: size_rule: the registry records no `bytes` for `{}` or `{}`",
                    p.path.display(),
                    p.candidate.0,
                    p.baseline.0
                )),
            }
            if problems.is_empty() {
                let golden = crate::golden::Goldens::new(goldens.to_path_buf())
                    .path(&p.case.0, &p.candidate.0);
                match check_history(p, &line, &golden) {
                    Ok(c) => commit = c,
                    Err(e) => problems.push(e.message),
                }
            }
        }
        out.push(Checked {
            line,
            prereg: p,
            problems,
            commit,
        });
    }
    Ok((out, unsealed))
}

/// Check the size rule on the two files.
pub(crate) fn check_size(p: &Prereg, candidate_bytes: u64, baseline_bytes: u64) -> Result<()> {
    if p.size_rule == SizeRule::CandidateNotLarger && candidate_bytes > baseline_bytes {
        return Err(Error::input(format!(
            "{}: size_rule = \"candidate-not-larger\": candidate `{}` has {candidate_bytes} bytes, \
             more than baseline `{}` ({baseline_bytes} bytes)",
            p.candidate.1, p.candidate.0, p.baseline.0
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
