//! `cargo test` runs every case under `suites/` on real llama.cpp and checks
//! each outcome against its golden under `goldens/` — of the checkout being
//! tested, found at run time: this repository as one user of the harness.
quantgate::gate!();
