//! Every test that needs only the fake engine, in one test binary (each
//! binary links llama.cpp): the golden workflow's own output, kld and
//! teacher-forcing cases against independent computations, multiple
//! choice and speed through the fake engine's batches and bench,
//! preregistered rules.

mod common;
#[path = "fake_engine/drift.rs"]
mod drift;
#[path = "fake_engine/golden_selftest.rs"]
mod golden_selftest;
#[path = "fake_engine/goldens_agree.rs"]
mod goldens_agree;
#[path = "fake_engine/kld.rs"]
mod kld;
#[path = "fake_engine/mc_speed.rs"]
mod mc_speed;
#[path = "fake_engine/observe.rs"]
mod observe;
#[path = "fake_engine/pi_cases.rs"]
mod pi_cases;
#[path = "fake_engine/prereg.rs"]
mod prereg;
#[path = "fake_engine/sequential.rs"]
mod sequential;
