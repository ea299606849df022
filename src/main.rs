//! The `quantgate` command line: dispatches to one command of `cli/`.
mod cli;

use clap::Parser;
use quantgate::engine::llama::LlamaEngine;
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    // A worker of `quantgate run` (this executable run again per model, so
    // that a llama.cpp abort fails only its own tests): its selection and
    // options come from its parent, its jobs on stdin.
    if let Some(alias) = std::env::var_os(quantgate::schedule::WORKER_ENV) {
        // Its engine under the parent's config (a bad one: the worker says
        // so when it reads the config again).
        let engine = match quantgate::core::config::Config::from_env([None; 3]) {
            Ok(c) => LlamaEngine::for_config(&c),
            Err(_) => LlamaEngine::new(),
        };
        return quantgate::schedule::worker::serve(
            &quantgate::schedule::Selection::default(),
            Arc::new(engine),
            &alias.to_string_lossy(),
        );
    }
    cli::conclude(cli::dispatch(cli::args::Cli::parse()))
}
