//! Case kinds: one file each, behind one trait. This is the only file that
//! names every kind; adding a kind is its file plus its name in the
//! `kinds!` line below.
//!
//! Contract: a kind parses its own table (the keys every case shares are
//! parsed once by the plan stage), declares its metrics with their types,
//! its pinned input files, its windows and its test variants, runs on the
//! narrow [`RunContext`], and renders its texts and rows into the
//! [`Outcome`]. Kinds never import the harness, goldens or the report.

use crate::core::case::{Location, Metric, Pin};
use crate::core::error::Result;
use crate::core::parse::Diagnostics;
use crate::core::{Case, Outcome};
use crate::execute::RunContext;
use std::sync::Arc;

pub mod digit_rows;
pub mod digit_text;
pub mod digits;
pub mod scored_text;

/// A case kind: what a case of this kind declares and how it runs.
pub trait Kind: Send + Sync + std::fmt::Debug {
    /// The metrics a case produces, with their types (a count compares
    /// exactly with its golden, a float within a tolerance).
    fn metrics(&self) -> Vec<Metric>;

    /// Why `metric` is not among this case's metrics when another case of
    /// the kind would produce it (appended to the gate error).
    fn why_not(&self, _metric: &str) -> Option<&'static str> {
        None
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

    /// Run the case on model `alias`: fill `out` (metrics, texts, rows,
    /// model and token-stream hashes, settings, timings).
    fn run(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<()>;
}

/// A kind's parser: its own table of `src` (the case file) into a kind;
/// `case` holds the shared keys, `diag` collects positioned errors.
pub type Parse = fn(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>>;

/// A parsed case: the shared head every stage reads, and its kind.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// Shared keys and what the kind declared.
    pub case: Arc<Case>,
    /// The kind.
    pub kind: Arc<dyn Kind>,
}

macro_rules! kinds {
    ($($kind:ident),* $(,)?) => {
        $(pub mod $kind;)*
        /// Every kind: its `kind = "…"` name and its parser.
        pub const KINDS: &[(&str, Parse)] = &[$((stringify!($kind), $kind::parse)),*];
    };
}

kinds!(perplexity, kld, recite, teacher_forcing);

/// The names of every kind, for messages.
pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|(n, _)| *n).collect()
}
