#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// The machinery modules below are hidden from the documentation; their doc
// comments are read in the source, where a link to a crate-private item is
// what the reader wants.
#![allow(rustdoc::private_intra_doc_links)]

// The library's API is what this file exports at its top and in
// [`prelude`]: the `cargo test` entry point ([`gate!`], [`run_gate`]), its
// [`Config`], and the verdicts ([`Outcome`], [`TrialEnd`], [`read_outcomes`],
// [`table`]). The modules below are quantgate's own machinery: public only
// because its binary, its integration tests and its benches (separate
// crates to cargo) drive them directly, hidden from the documentation and
// under no stability promise.

#[doc(hidden)]
pub mod core;
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod execute;
#[doc(hidden)]
pub mod golden;
#[doc(hidden)]
pub mod harness;
#[doc(hidden)]
pub mod judge;
#[doc(hidden)]
pub mod kinds;
#[doc(hidden)]
pub mod measure;
#[doc(hidden)]
pub mod models;
#[doc(hidden)]
pub mod plan;
#[doc(hidden)]
pub mod report;
#[doc(hidden)]
pub mod schedule;

pub use crate::core::config::{Config, ConfigBuilder, Isolation, Missing, Shipped, UpdateMode};
pub use crate::core::error::{Error, ErrorKind, Result};
pub use crate::core::outcome::{GateResult, Outcome, Status, TrialEnd};
/// Where the library's notes go (a reference read unauthenticated, a model
/// derived): stderr unless a program embedding quantgate sets its own.
pub use crate::core::progress::{set_sink, Sink};

/// What a crate that gates its quants with quantgate uses:
/// `use quantgate::prelude::*;`.
pub mod prelude {
    pub use crate::{gate, read_outcomes, run_gate, table, Config, Outcome, Status, TrialEnd};
}

/// The `cargo test` entry point of a repository of cases: in
/// `tests/gate.rs` (a `[[test]]` with `harness = false`), this one line runs
/// every case under the crate's `suites/` on llama.cpp as a test, each
/// outcome against its golden under `goldens/` (folders from [`Config`]:
/// `QUANTGATE_SUITES`, `QUANTGATE_GOLDENS`, relative to the crate at run
/// time). It defines the test binary's `main`: [`run_gate`] under the
/// environment's [`Config`], where a bad value fails every test by name.
///
/// ```no_run
/// quantgate::gate!();
/// ```
#[macro_export]
macro_rules! gate {
    () => {
        fn main() -> std::process::ExitCode {
            $crate::harness::gate()
        }
    };
}

/// Run the crate's cases as tests under `config` (what [`gate!`] does
/// under the environment's): the cases under [`Config::suites`], each
/// against its golden under [`Config::goldens`], with libtest's arguments
/// (`--list`, a filter, `--exact`, `--test-threads`, nextest's protocol)
/// from the command line. A run that cannot be planned is one failing test
/// saying why. Worker processes are given the same config.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     let config = quantgate::Config::builder()
///         .suites("quants/suites")
///         .goldens("quants/goldens")
///         .build();
///     match config {
///         Ok(c) => quantgate::run_gate(&c),
///         Err(e) => {
///             eprintln!("{e}");
///             std::process::ExitCode::from(2)
///         }
///     }
/// }
/// ```
pub fn run_gate(config: &Config) -> std::process::ExitCode {
    harness::gate_with(config)
}

/// The outcomes under `sources`, verified as they are read: `--json` files
/// of `quantgate run` (an array of outcomes) and the folders a sharded run
/// writes (`QUANTGATE_OUT`, one `<case>/<model>.json` per test). With a
/// signing key configured (`QUANTGATE_SIGNING_KEY`), only outcomes that
/// carry a valid MAC are taken (`config`'s key). A file that is not
/// outcome JSON is an input error naming it.
pub fn read_outcomes(config: &Config, sources: &[std::path::PathBuf]) -> Result<Vec<Outcome>> {
    Ok(judge::merge::read_outcomes(sources, config.signing_key())?
        .into_iter()
        .map(|(_, o)| o)
        .collect())
}

/// The terminal table of `quantgate run`: rows grouped per case, with the
/// headline metrics its kind declares, at most 120 columns wide.
pub fn table(outcomes: &[Outcome]) -> String {
    report::table(outcomes)
}
