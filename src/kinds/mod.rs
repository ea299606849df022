//! Case kinds: one file each, behind one trait. This is the only file that
//! names every kind; adding a kind is its file plus its `mod` line and its
//! entry in [`KINDS`] below.
//!
//! Contract: a kind parses its own table (the keys every case shares are
//! parsed once by the plan stage), declares its metrics with their types,
//! its pinned input files, its windows, its test variants and the
//! observation it needs (so that the planner gives cases of one observation
//! one decode), starts on the narrow [`RunContext`] and reads its rows as a
//! [`Consumer`] of a shared decode — or, for a generation, runs whole in
//! [`Kind::start`] — and renders its texts and rows into the [`Outcome`].
//! Kinds never import the harness, goldens or the report.

use crate::core::case::{Location, Metric, Pin};
use crate::core::error::Result;
use crate::core::parse::Diagnostics;
use crate::core::present::Presentation;
use crate::core::{Case, Outcome};
use crate::execute::observe::{Consumer, Fill, Observation};
use crate::execute::RunContext;
use std::sync::Arc;

pub(crate) mod digit_rows;
pub(crate) mod digit_text;
pub mod digits;
pub mod drift;
pub mod reference_rows;
pub mod scored_text;

/// A case kind: what a case of this kind declares and how it runs.
pub trait Kind: Send + Sync + std::fmt::Debug {
    /// The metrics a case produces, with their types (a count compares
    /// exactly with its golden, a float within a tolerance).
    fn metrics(&self) -> Vec<Metric>;

    /// The metrics with their intervals: what a case of the kind declares.
    /// By default a metric `X_mean` (or `X`) carries the interval `I` of
    /// `ci95`, `boot95`, `wilson95` whose bounds `X_I_lo` and `X_I_hi` are
    /// among its metrics, over its `windows` when it counts them; a kind
    /// that names its bounds otherwise declares them itself.
    fn declared(&self) -> Vec<Metric> {
        crate::core::case::with_about(with_intervals(self.metrics()), self.about())
    }

    /// What a reader calls its metrics, and their units (the model card's
    /// gates, the book's metrics tables); a metric it leaves out is said
    /// by its name.
    fn about(&self) -> crate::core::case::About {
        &[]
    }

    /// The few metrics the terminal table shows, in order (the rest are in
    /// `--json` and the goldens); empty: all of them.
    fn headline(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Notes for the terminal table on an outcome of the kind (a caveat
    /// its numbers carry); none by default.
    fn notes(&self, _out: &Outcome) -> Vec<String> {
        Vec::new()
    }

    /// Why `metric` is not among this case's metrics when another case of
    /// the kind would produce it (appended to the gate error).
    fn why_not(&self, _metric: &str) -> Option<&'static str> {
        None
    }

    /// Whether an outcome read back (from the result cache, a shard, a
    /// `--json` file) holds together: each metric that can be computed
    /// again from what the outcome carries (a per-window series, counts)
    /// equals it. Err(why) names the metrics that disagree.
    fn recheck(&self, _out: &Outcome) -> std::result::Result<(), crate::core::error::Inconsistent> {
        Ok(())
    }

    /// Files pinned by sha256, checked before every run and before a cached
    /// result is used.
    fn pins(&self) -> Vec<Pin> {
        Vec::new()
    }

    /// The windows it scores (their declared count, and where the windowing
    /// is written), for a preregistered rule; None when it scores none.
    fn windows(&self) -> Option<(Option<usize>, Location)> {
        None
    }

    /// Test variants: (name suffix, the variant), one test each; empty for
    /// a case that is one test.
    fn variants(&self) -> Vec<(String, Arc<dyn Kind>)> {
        Vec::new()
    }

    /// A reference record (JSONL) of the case's windows on `alias`, for
    /// kinds that have them.
    fn reference_record(&self, _cx: &RunContext, _alias: &str) -> Option<Result<String>> {
        None
    }

    /// The observation a case needs on a model, as the case declares it —
    /// what is decoded and how, with no model loaded: the planner gives
    /// trials of equal (model, observation) one decode. None: a trial that
    /// decodes on its own (generation).
    fn observation(&self) -> Option<String> {
        None
    }

    /// About how many token rows a trial of this case decodes: groups are
    /// started heaviest first, so that the long ones do not end a run alone.
    fn weight(&self) -> usize {
        256
    }

    /// The observation this case needs on its reference model (declared as
    /// [`Kind::observation`]), when the reference is a model whose rows it
    /// reads: the planner folds that work into the reference model's decode
    /// of the same observation.
    fn reference_observation(&self) -> Option<String> {
        None
    }

    /// The gated metrics this case can decide sequentially (`[decide]`):
    /// means over its windows (or tasks) of a per-window value; none by
    /// default.
    fn sequential_metrics(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// What a sequential case visits, one at a time: `window` (its count
    /// `windows`, of `windows_total`) or `task` (`tasks` of `tasks_total`).
    fn sequential_unit(&self) -> &'static str {
        "window"
    }

    /// Whether the case decides sequentially (`[decide] sequential = true`):
    /// its trials on every model then run in one group, one process, so
    /// that the reference windows decoded for one candidate serve the next.
    fn decides_sequentially(&self) -> bool {
        false
    }

    /// Whether the case's trials on every model run in one group, one
    /// process: a sequential case (its reference windows, decoded for one
    /// candidate, serve the next) and a case whose candidates read their
    /// reference's rows live ([`Start::Live`]).
    fn runs_jointly(&self) -> bool {
        self.decides_sequentially()
    }

    /// What else keys a trial's cached result, found at run time (a drift
    /// case's runtimes, their sha256 and version); None: it cannot be told
    /// now, and the trial is not answered from the cache. Nothing by
    /// default.
    fn run_key(&self, _cx: &RunContext) -> Option<String> {
        Some(String::new())
    }

    /// Whether a trial measures the machine's speed: its group runs with
    /// no other group beside it (`quantgate run --jobs N`), and its result
    /// cache entry is keyed by the machine as well.
    fn measures_speed(&self) -> bool {
        false
    }

    /// Start the case on model `alias`: everything before the decode (load,
    /// tokenize, the reference from the store), recorded in `out`. A kind
    /// without an observation runs completely here ([`Start::Done`]).
    fn start(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<Start>;

    /// Start the case on several models at once: `aliases` are its trials
    /// of one group that the result cache did not answer (group order), and
    /// `outs` their outcomes, one each. For a kind that measures them better
    /// together than one by one (speed: every round measures each candidate
    /// and the reference once). None, the default: each starts by itself
    /// ([`Kind::start`]).
    fn start_together(
        &self,
        _cx: &RunContext,
        _case: &Case,
        _aliases: &[&str],
        _outs: &mut [&mut Outcome],
    ) -> Option<Vec<Result<Start>>> {
        None
    }

    /// The reference products this case needs, as a consumer of its
    /// reference model's observation; None when the reference store holds
    /// them already (or the case reads no reference rows).
    fn reference_work(&self, _cx: &RunContext, _case: &Case) -> Result<Option<RefWork>> {
        Ok(None)
    }
}

/// How a started trial goes on.
pub enum Start {
    /// It ran completely (its outcome is filled).
    Done,
    /// It reads the rows of an observation, then finishes.
    Observe(Observation, Box<dyn Finish>),
    /// It reads the rows of an observation in step with its reference's
    /// decode of the same windows, whose rows it reads live, then finishes.
    Live(Observation, Box<dyn Finish>, LiveFeed),
}

/// Reference rows that candidates read a range of windows at a time, as
/// they decode the same windows, so that none holds them all. Trials whose
/// feeds have equal keys share one feed.
pub struct LiveFeed {
    /// What identifies the rows (the product they are kept as).
    pub key: String,
    /// Where they come from.
    pub source: FeedSource,
}

/// Where a [`LiveFeed`]'s rows come from.
pub enum FeedSource {
    /// The reference model's decode, nothing kept (`store = "none"`).
    Decode {
        /// The reference model's observation.
        observation: Observation,
        /// Hands its rows to the readers, a range of windows at a time.
        producer: Box<dyn Consumer>,
    },
    /// A stored reference, read as it goes.
    Read(Box<dyn Fill>),
}

/// A trial's consumer: reads the rows, then fills the outcome.
pub trait Finish: Consumer {
    /// The rows are all read: compute the metrics, texts and rows into `out`.
    fn finish(self: Box<Self>, cx: &RunContext, out: &mut Outcome) -> Result<()>;
}

/// Reference products to build from a reference model's rows.
pub struct RefWork {
    /// What identifies the products in the reference store (equal keys:
    /// the same products; built once).
    pub key: String,
    /// The file they are kept in (checked again under the product's lock:
    /// another process may have built them meanwhile).
    pub path: std::path::PathBuf,
    /// The reference model's observation.
    pub observation: Observation,
    /// Reads the rows and, when finished, puts the products in the store.
    pub consumer: Box<dyn RefBuild>,
}

/// A consumer that builds reference products.
pub trait RefBuild: Consumer {
    /// The rows are all read: put the products in the reference store.
    fn finish(self: Box<Self>, cx: &RunContext) -> Result<()>;
}

/// A kind's parser: its own table of `src` (the case file) into a kind;
/// `case` holds the shared keys, `diag` collects positioned errors.
pub(crate) type Parse = fn(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>>;

/// A parsed case: the shared head every stage reads, and its kind.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// Shared keys and what the kind declared.
    pub case: Arc<Case>,
    /// The kind.
    pub kind: Arc<dyn Kind>,
}

pub mod kld;
pub mod multiple_choice;
pub(crate) mod perplexity;
pub(crate) mod recite;
pub mod release;
pub mod speed;
pub(crate) mod teacher_forcing;

/// How a kind shows in the ladder report (None: it does not).
pub(crate) type Present = fn() -> Option<Presentation>;

/// Every kind: its `kind = "…"` name, its parser and its part of the
/// ladder report (plain `mod` lines above, so that `cargo fmt` sees every
/// kind's file). The report lays out columns in this order.
pub(crate) const KINDS: &[(&str, Parse, Present)] = &[
    ("perplexity", perplexity::parse, perplexity::present),
    ("kld", kld::parse, kld::present),
    ("recite", recite::parse, recite::present),
    (
        "teacher_forcing",
        teacher_forcing::parse,
        teacher_forcing::present,
    ),
    ("speed", speed::parse, speed::present),
    (
        "multiple_choice",
        multiple_choice::parse,
        multiple_choice::present,
    ),
    ("drift", drift::parse, drift::present),
];

/// Every kind's part of the ladder report, in [`KINDS`] order.
pub fn presentations() -> Vec<Presentation> {
    KINDS
        .iter()
        .filter_map(|(_, _, present)| present())
        .collect()
}

/// `metrics` with the intervals their bound metrics show (see
/// [`Kind::declared`]).
pub(crate) fn with_intervals(mut metrics: Vec<Metric>) -> Vec<Metric> {
    let names: std::collections::BTreeSet<String> =
        metrics.iter().map(|m| m.name.clone()).collect();
    let windows = names.contains("windows").then_some("windows");
    for m in &mut metrics {
        let stem = m.name.strip_suffix("_mean").unwrap_or(&m.name).to_string();
        for i in ["ci95", "boot95", "wilson95"] {
            let (lo, hi) = (format!("{stem}_{i}_lo"), format!("{stem}_{i}_hi"));
            if names.contains(&lo) && names.contains(&hi) {
                *m = m.clone().with_interval(i, &lo, &hi, windows);
            }
        }
    }
    metrics
}

/// The names of every kind, for messages.
pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|(n, _, _)| *n).collect()
}
