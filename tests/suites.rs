//! `cargo test` runs every case under `suites/` on real llama.cpp.
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let suites = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites");
    quantgate::harness::run_suites(
        &suites,
        Arc::new(quantgate::engine::llama::LlamaEngine::new()),
    )
}
