//! Shared types every stage may use: the parsed [`Case`] head, [`Outcome`],
//! engine [`Settings`], errors and diagnostics, file helpers. Contract: no
//! module here imports a stage; every stage may import this one.

pub mod auth;
pub mod case;
pub mod config;
pub mod error;
pub mod fsutil;
pub(crate) mod keys;
pub(crate) mod machine;
pub(crate) mod outcome;
pub mod parse;
pub(crate) mod present;
pub mod progress;
#[cfg(test)]
pub(crate) mod scratch;
pub(crate) mod settings;

pub use case::{Case, Gate, Location, Metric, MetricType, Pin, Tolerance};
pub use error::{Error, ErrorKind, Result};
pub use outcome::{
    Artifact, Column, Decision, GateResult, Outcome, StageTimings, Status, Table, TrialEnd, Verdict,
};
pub use settings::{Decoding, EngineBuild, EngineOptions, Sampler, Settings};
