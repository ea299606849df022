//! `cargo test` runs every case under `suites/` on real llama.cpp and checks
//! each outcome against its golden under `goldens/`.
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    quantgate::harness::run_suites(
        &root.join("suites"),
        &root.join("goldens"),
        Arc::new(quantgate::engine::llama::LlamaEngine::new()),
    )
}
