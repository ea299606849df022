//! `cargo test` runs every case under `suites/` on real llama.cpp and checks
//! each outcome against its golden under `goldens/` — of the checkout being
//! tested, found at run time.
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let root = quantgate::harness::project_root();
    quantgate::harness::run_suites(
        &root.join("suites"),
        &root.join("goldens"),
        Arc::new(quantgate::engine::llama::LlamaEngine::new()),
    )
}
