//! The real llama.cpp on the real fixture models, and the independent
//! computations its numbers are checked against, one module per concern:
//! one test binary, so llama.cpp is linked once for all of them and their
//! tests run side by side (every decode holds its core slots, so they never
//! oversubscribe the machine; see `engine::cores`).
//!
//! - `engine_llama`: the engine itself (tokenization, teacher forcing
//!   against an independent log-softmax, generation, lanes, the loader);
//! - `batch_invariance`: batch-invariant greedy decoding, bitwise;
//! - `llama_perplexity`: quantgate's numbers against llama.cpp's own
//!   `llama-perplexity` (PPL, KLD, multiple choice, strides, runtimes);
//! - `kld_real`: stored reference rows give the exact KL on real rows;
//! - `pi_real`: the π experiments against an f64 computation of the logits;
//! - `reference_record`: the F16 record stands in for the F16 model bitwise;
//! - `gate_selftest`: quants that must fail the release gates fail them;
//! - `sequential_oracle`: the sequential rule's bounds against `confseq`.

#[path = "../common/mod.rs"]
mod common;

mod batch_invariance;
mod engine_llama;
mod gate_selftest;
mod kld_real;
mod llama_perplexity;
mod pi_real;
mod reference_record;
mod sequential_oracle;
