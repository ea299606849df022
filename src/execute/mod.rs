//! Execute stage: the run context kinds run on, windows cut from a token
//! stream and scored row by row, and the one reference store with its
//! on-disk formats (reference records, `.qgref` rows, llama-perplexity
//! `.kld` import).

pub(crate) mod context;
pub(crate) mod observe;
pub mod qgref;
pub(crate) mod rans;
pub mod record;
pub mod reference;
pub mod runtime;
pub mod windows;

pub use context::{cores, threads_per_trial, RunContext};
