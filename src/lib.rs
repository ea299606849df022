#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod core;
pub mod engine;
pub mod execute;
pub mod golden;
pub mod harness;
pub mod judge;
pub mod kinds;
pub mod measure;
pub mod models;
pub mod plan;
pub mod report;
pub mod schedule;

/// The `cargo test` entry point of a repository of cases: in
/// `tests/gate.rs` (a `[[test]]` with `harness = false`), this one line runs
/// every case under the crate's `suites/` on llama.cpp as a test, each
/// outcome against its golden under `goldens/` (paths relative to the
/// crate at run time, settings from [`core::config::Config`]).
///
/// ```ignore
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
