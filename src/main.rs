//! The `quantgate` command line.
use clap::{Parser, Subcommand};
use quantgate::core::{Error, Status};
use quantgate::engine::llama::LlamaEngine;
use quantgate::execute::{threads_per_trial, RunContext};
use quantgate::models::{cache_dir, ensure, Registry};
use quantgate::plan::plan;
use quantgate::report;
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
        /// Write per-position rows (kld cases) as DIR/<case>/<model>.parquet.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print per-model stage timings.
        #[arg(long)]
        timings: bool,
        /// llama.cpp threads of each job (default: the cores, shared by the jobs).
        #[arg(long)]
        threads: Option<u32>,
        /// Groups of cases (one decode each) run at once (default 1).
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// The goldens directory a preregistered case's history is checked
        /// against (default: `goldens` beside the suites directory).
        #[arg(long)]
        goldens: Option<PathBuf>,
        /// Accept a selection of no case × model (otherwise an error: a
        /// mistyped filter must not pass).
        #[arg(long)]
        allow_empty: bool,
        /// Run every case × model again instead of taking unchanged ones from
        /// the result cache (nor recording them there).
        #[arg(long)]
        no_cache: bool,
    },
    /// List registry models with status, bytes and sha256; `models fetch` fetches/derives them.
    Models {
        #[command(subcommand)]
        action: Option<ModelsAction>,
    },
    /// Reference records: a reference model's scores, exported once.
    Reference {
        #[command(subcommand)]
        action: ReferenceAction,
    },
    /// Preregistered decision rules: seal, verify, report.
    Prereg {
        #[command(subcommand)]
        action: PreregAction,
        /// The prereg directory (holds the files and LEDGER).
        #[arg(long, global = true, default_value = "prereg")]
        dir: PathBuf,
        /// The goldens directory.
        #[arg(long, global = true, default_value = "goldens")]
        goldens: PathBuf,
    },
    /// What GGUF files are: bytes, parameters, bits per weight, tensor types,
    /// architecture, context, vocabulary, tokenizer, quantization provenance.
    Inspect {
        /// GGUF files (a split file by any of its parts) or registry aliases.
        #[arg(required = true)]
        targets: Vec<String>,
        /// Print a JSON array, one object per target.
        #[arg(long)]
        json: bool,
    },
    /// Print the token ids of a text file, one per line (to pin as a `[tokens]` file).
    Tokenize {
        /// The text file.
        file: PathBuf,
        /// Model whose tokenizer to use.
        #[arg(long)]
        model: String,
        /// BOS policy: model, always, never.
        #[arg(long, default_value = "never")]
        bos: String,
        /// At most this many ids.
        #[arg(long)]
        limit: Option<usize>,
    },
}

#[derive(Subcommand)]
enum ReferenceAction {
    /// Score a perplexity case on its reference model and write the record (JSONL):
    /// per target the log-prob of the true token and the top-1 id.
    Export {
        /// The case file.
        case: PathBuf,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
        /// Model to record (default: the case's `reference`).
        #[arg(long)]
        model: Option<String>,
    },
}

#[derive(Subcommand)]
enum PreregAction {
    /// Append the sha256 of FILE's exact bytes to its directory's LEDGER (chained).
    Seal {
        /// The prereg file.
        file: PathBuf,
    },
    /// Check every prereg, the ledger chain and the git history; runs no model.
    Verify,
    /// Every sealed comparison with its outcome (from the goldens), wins and losses together.
    Report,
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
        quantgate::core::ErrorKind::Input => ExitCode::from(2),
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
            out,
            timings,
            threads,
            jobs,
            goldens,
            allow_empty,
            no_cache,
        } => {
            // Output paths are checked before anything runs.
            if let Some(p) = json.as_ref().filter(|p| p.is_dir()) {
                return fail(&Error::input(format!(
                    "--json {}: is a directory; give a file path",
                    p.display()
                )));
            }
            if let Some(p) = out.as_ref().filter(|p| p.exists() && !p.is_dir()) {
                return fail(&Error::input(format!(
                    "--out {}: exists and is not a directory",
                    p.display()
                )));
            }
            let cores = quantgate::execute::cores() as u32;
            let threads = threads.map(|t| {
                if t > cores {
                    eprintln!(
                        "quantgate: --threads {t} is more than the {cores} cores here (oversubscribed \
                         llama.cpp threads run slower, not faster); using {cores}"
                    );
                }
                t.clamp(1, cores)
            });
            let goldens = goldens.unwrap_or_else(|| {
                let root = cli.suites.parent().unwrap_or(std::path::Path::new(""));
                root.join("goldens")
            });
            let (registry, planned) = match plan(&cli.suites, &patterns, &models) {
                Ok(p) => p,
                Err(e) => return fail(&e),
            };
            if planned.is_empty() && !allow_empty {
                return fail(&Error::input(format!(
                    "nothing to run: {} with --model {} selects no case × model (a case runs \
                     only the models it lists); pass --allow-empty to accept an empty run",
                    if patterns.is_empty() {
                        "every case".to_string()
                    } else {
                        patterns.join(" ")
                    },
                    models.join(" --model ")
                )));
            }
            let runner = RunContext::new(
                registry,
                Arc::new(LlamaEngine::new()),
                threads.unwrap_or_else(|| threads_per_trial(jobs.max(1))),
            );
            if let Some(dir) = &out {
                quantgate::core::fsutil::clean_stale_temps(dir);
            }
            // Plan by observation: each group is one decode, after the
            // groups whose references it reads.
            // Rows are not kept in the result cache: --out runs everything.
            let cache = !no_cache && out.is_none() && quantgate::judge::cache::enabled();
            let mut write_failed = false;
            let (outcomes, reference_work) = quantgate::judge::run_plan(
                &runner,
                &planned,
                &goldens,
                cache,
                jobs.max(1),
                &mut |names, provides| match names {
                    [] => eprintln!("quantgate: reference work for {provides} trials"),
                    [one] => eprintln!("quantgate: running {one}"),
                    _ => eprintln!("quantgate: running {} (one decode)", names.join(", ")),
                },
                &mut |o| {
                    if let Some(dir) = &out {
                        if let Err(e) = quantgate::report::write_parquet(dir, o) {
                            eprintln!("error: {}", e.message);
                            write_failed = true;
                        }
                    }
                },
            );
            print!("{}", report::table(&outcomes));
            if timings {
                print!("\n{}", report::timings(&outcomes, &reference_work));
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
            } else if write_failed {
                ExitCode::from(1)
            } else if outcomes.iter().all(|o| o.status == Status::Pass) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Reference {
            action: ReferenceAction::Export { case, out, model },
        } => {
            if out.is_dir() {
                return fail(&Error::input(format!(
                    "--out {}: is a directory; give a file path",
                    out.display()
                )));
            }
            let registry = match Registry::load(&cli.suites.join("models.toml")) {
                Ok(r) => r,
                Err(e) => return fail(&e),
            };
            let name = case.display().to_string();
            let parsed = match quantgate::plan::parse::parse_case(&case, &case, &name) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let Some(alias) = model.or_else(|| parsed.case.reference.as_ref().map(|r| r.0.clone()))
            else {
                return fail(&Error::input(format!(
                    "{}: the case names no `reference`; pass --model ALIAS",
                    case.display()
                )));
            };
            let runner =
                RunContext::new(registry, Arc::new(LlamaEngine::new()), threads_per_trial(1));
            let record = parsed
                .kind
                .reference_record(&runner, &alias)
                .unwrap_or_else(|| {
                    Err(Error::input(format!(
                        "{}: only perplexity and kld cases have reference records",
                        case.display()
                    )))
                });
            match record.and_then(|jsonl| {
                quantgate::core::fsutil::write_atomic(&out, jsonl.as_bytes()).map(|()| jsonl)
            }) {
                Ok(jsonl) => {
                    let sha = quantgate::core::fsutil::sha256_bytes(jsonl.as_bytes());
                    println!(
                        "{}: {} targets, sha256 {sha}",
                        out.display(),
                        jsonl.lines().count() - 1
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Prereg {
            action,
            dir,
            goldens,
        } => match action {
            PreregAction::Seal { file } => {
                // Check it against the suites before sealing: a sealed file is final.
                let check = quantgate::judge::prereg::parse(&file).and_then(|p| {
                    let case_file = cli.suites.join(format!("{}.toml", p.case.0));
                    let case =
                        quantgate::plan::parse::parse_case(&case_file, &case_file, &p.case.0)
                            .map_err(|e| e.context(format!("{}: case", p.case.1)))?
                            .case;
                    let registry = Registry::load(&cli.suites.join("models.toml"))?;
                    for (alias, at) in [&p.candidate, &p.baseline] {
                        registry.entry(alias).map_err(|e| e.context(at))?;
                    }
                    quantgate::judge::prereg::check_case(&p, &case)
                });
                match check.and_then(|()| {
                    quantgate::judge::prereg::seal(&file, quantgate::judge::prereg::now_unix())
                }) {
                    Ok(line) => {
                        println!(
                            "sealed {} {} at {} (ledger line {}); commit prereg/ before the first run",
                            line.path, line.sha256, line.time, line.line_no
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(&e),
                }
            }
            PreregAction::Verify => {
                match quantgate::judge::prereg::verify_all(&dir, &cli.suites, &goldens) {
                    Err(e) => fail(&e),
                    Ok((checked, unsealed)) => {
                        let mut bad = !unsealed.is_empty();
                        for u in &unsealed {
                            eprintln!("error: {u}");
                        }
                        for c in &checked {
                            if c.problems.is_empty() {
                                println!(
                                    "ok   {} {} sealed {}{}",
                                    c.line.path,
                                    c.line.sha256,
                                    c.line.time,
                                    c.commit
                                        .as_ref()
                                        .map(|h| format!(" in commit {}", &h[..12]))
                                        .unwrap_or_else(|| {
                                            " (not a git checkout: history not checked)".into()
                                        })
                                );
                            } else {
                                bad = true;
                                println!("FAIL {}", c.line.path);
                                for p in &c.problems {
                                    eprintln!("error: {p}");
                                }
                            }
                        }
                        if bad {
                            ExitCode::from(2)
                        } else {
                            ExitCode::SUCCESS
                        }
                    }
                }
            }
            PreregAction::Report => {
                match quantgate::report::prereg::report(&dir, &cli.suites, &goldens) {
                    Err(e) => fail(&e),
                    Ok((text, ok)) => {
                        print!("{text}");
                        if ok {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::from(2)
                        }
                    }
                }
            }
        },
        Command::Tokenize {
            file,
            model,
            bos,
            limit,
        } => {
            let registry = match Registry::load(&cli.suites.join("models.toml")) {
                Ok(r) => r,
                Err(e) => return fail(&e),
            };
            let bos = match bos.as_str() {
                "model" => quantgate::engine::BosPolicy::Model,
                "always" => quantgate::engine::BosPolicy::Always,
                "never" => quantgate::engine::BosPolicy::Never,
                other => {
                    return fail(&Error::input(format!(
                        "--bos: `{other}` is not one of model, always, never"
                    )))
                }
            };
            let runner = RunContext::new(registry, Arc::new(LlamaEngine::new()), 1);
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => return fail(&Error::input(format!("{}: {e}", file.display()))),
            };
            let result = runner
                .load(&model)
                .and_then(|(_, m)| m.tokenize(&text, bos));
            match result {
                Ok(tokens) => {
                    for t in tokens.iter().take(limit.unwrap_or(usize::MAX)) {
                        println!("{}", t.id);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Inspect { targets, json } => {
            let mut registry = None;
            let mut all = Vec::new();
            let mut code = ExitCode::SUCCESS;
            for t in &targets {
                let path = std::path::Path::new(t);
                let resolved = if path.exists() || t.ends_with(".gguf") || t.contains('/') {
                    Ok((t.clone(), path.to_path_buf(), None))
                } else {
                    let reg = match &registry {
                        Some(r) => Ok(r),
                        None => Registry::load(&cli.suites.join("models.toml"))
                            .map(|r| &*registry.insert(r)),
                    };
                    reg.and_then(|reg| {
                        let label = quantgate::engine::Engine::build(&LlamaEngine::new()).label();
                        let threads = threads_per_trial(1);
                        let q = |s: &std::path::Path, d: &std::path::Path, q: &str| {
                            quantgate::engine::llama::quantize(s, d, q, threads)
                        };
                        ensure(reg, t, &label, &q)
                            .map(|v| (t.clone(), v.file.path.clone(), Some(v.file.sha256)))
                    })
                };
                let inspected = resolved.and_then(|(label, path, sha)| {
                    quantgate::models::inspect::inspect(&path, true).map(|i| (label, sha, i))
                });
                match inspected {
                    Ok((label, sha, i)) if json => {
                        let mut v = i.to_json();
                        v["target"] = label.into();
                        v["sha256"] = sha.into();
                        all.push(v);
                    }
                    Ok((label, sha, i)) => {
                        print!("{}", i.render(&label));
                        if let Some(sha) = sha {
                            println!("  sha256         {sha} (pinned, verified)");
                        }
                        println!();
                    }
                    Err(e) => code = fail(&e),
                }
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&all).expect("JSON of plain values")
                );
            }
            code
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
                        } else if let Some(parts) = &m.fetch_parts {
                            format!(
                                "pip, joined: {}",
                                parts
                                    .iter()
                                    .map(|f| f.pip.as_str())
                                    .collect::<Vec<_>>()
                                    .join(" + ")
                            )
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
                                    .types
                                    .iter()
                                    .map(|(t, n)| format!("{t}×{}", n.tensors))
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
