//! The `quantgate` command line.
use clap::{Parser, Subcommand};
use quantgate::engine::llama::LlamaEngine;
use quantgate::error::Error;
use quantgate::models::{cache_dir, ensure, Registry};
use quantgate::report;
use quantgate::runner::{plan, threads_per_trial, Runner, Status};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "quantgate",
    version,
    about = "Evaluate GGUF models and their quants against gates and goldens"
)]
struct Cli {
    /// The suites directory (holds models.toml and the cases).
    #[arg(long, global = true, default_value = "suites")]
    suites: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run cases (all by default) and print a table. Exit 0: all pass; 1: a case failed; 2: unusable input.
    Run {
        /// Case files, directories or globs (relative to the suites directory).
        patterns: Vec<String>,
        /// Only these model aliases.
        #[arg(long = "model")]
        models: Vec<String>,
        /// Write one JSON object per case × model to FILE.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Print per-model stage timings.
        #[arg(long)]
        timings: bool,
        /// llama.cpp threads (default: all cores).
        #[arg(long)]
        threads: Option<u32>,
    },
    /// List registry models with status, bytes and sha256; `models fetch` fetches/derives them.
    Models {
        #[command(subcommand)]
        action: Option<ModelsAction>,
    },
}

#[derive(Subcommand)]
enum ModelsAction {
    /// Fetch or derive models (all by default) and verify them.
    Fetch {
        /// Aliases.
        aliases: Vec<String>,
    },
}

fn fail(e: &Error) -> ExitCode {
    eprintln!("error: {}", e.message);
    match e.kind {
        quantgate::error::ErrorKind::Input => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    quantgate::models::clean_stale_temps();
    match cli.command {
        Command::Run {
            patterns,
            models,
            json,
            timings,
            threads,
        } => {
            let (registry, planned) = match plan(&cli.suites, &patterns, &models) {
                Ok(p) => p,
                Err(e) => return fail(&e),
            };
            let runner = Runner::new(
                registry,
                Arc::new(LlamaEngine::new()),
                threads.unwrap_or_else(|| threads_per_trial(1)),
            );
            let mut outcomes = Vec::new();
            for p in &planned {
                eprintln!("quantgate: running {}", p.name);
                outcomes.push(runner.run(p));
            }
            print!("{}", report::table(&outcomes));
            if timings {
                print!("\n{}", report::timings(&outcomes));
            }
            if let Some(path) = json {
                if let Err(e) = report::write_json(&path, &outcomes) {
                    return fail(&e);
                }
            }
            if outcomes
                .iter()
                .any(|o| o.status == Status::Error && o.input_error)
            {
                ExitCode::from(2)
            } else if outcomes.iter().all(|o| o.status == Status::Pass) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Models { action } => {
            let registry = match Registry::load(&cli.suites.join("models.toml")) {
                Ok(r) => r,
                Err(e) => return fail(&e),
            };
            let engine = LlamaEngine::new();
            let label = quantgate::engine::Engine::build(&engine).label();
            match action {
                None => {
                    println!("cache: {}", cache_dir().display());
                    println!(
                        "{:<18} {:<8} {:>12}  {:<64}  source",
                        "alias", "status", "bytes", "sha256"
                    );
                    for (alias, m) in &registry.models {
                        let present = registry
                            .location(alias, &label)
                            .map(|p| p.exists())
                            .unwrap_or(false);
                        let source = if let Some(f) = &m.fetch {
                            format!("pip {} :: {}", f.pip, f.member)
                        } else if let Some(d) = &m.derive {
                            format!("derive {} from {}", d.quant, d.from)
                        } else {
                            m.path
                                .as_ref()
                                .map(|p| p.display().to_string())
                                .unwrap_or_default()
                        };
                        println!(
                            "{alias:<18} {:<8} {:>12}  {:<64}  {source}",
                            if present { "present" } else { "missing" },
                            m.bytes.map(|b| b.to_string()).unwrap_or_else(|| "-".into()),
                            m.sha256.as_deref().unwrap_or("-"),
                        );
                    }
                    ExitCode::SUCCESS
                }
                Some(ModelsAction::Fetch { aliases }) => {
                    let aliases = if aliases.is_empty() {
                        registry.models.keys().cloned().collect()
                    } else {
                        aliases
                    };
                    let threads = threads_per_trial(1);
                    let q = |s: &std::path::Path, d: &std::path::Path, t: &str| {
                        quantgate::engine::llama::quantize(s, d, t, threads)
                    };
                    let mut code = ExitCode::SUCCESS;
                    for a in &aliases {
                        match ensure(&registry, a, &label, &q) {
                            Ok(v) => {
                                let types: Vec<String> = v
                                    .header
                                    .tensor_types
                                    .iter()
                                    .map(|(t, n)| format!("{t}×{n}"))
                                    .collect();
                                println!(
                                    "{a:<18} ok {} {} bytes [{}]",
                                    v.file.sha256,
                                    v.bytes,
                                    types.join(" ")
                                );
                            }
                            Err(e) => code = fail(&e),
                        }
                    }
                    code
                }
            }
        }
    }
}
