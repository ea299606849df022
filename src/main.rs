//! The `quantgate` command line.
use clap::{Parser, Subcommand};
use quantgate::core::{Error, Status};
use quantgate::engine::llama::LlamaEngine;
use quantgate::execute::{threads_per_trial, RunContext};
use quantgate::models::{cache_dir, ensure, Registry};
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
        #[command(flatten)]
        select: Select,
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
        /// Layers to offload to the GPU: a number or `all` (default: all on
        /// a GPU build, none on CPU; env QUANTGATE_N_GPU_LAYERS).
        #[arg(long)]
        n_gpu_layers: Option<String>,
        /// KV cache type: f16 (default), f32, bf16, q8_0, q4_0, q4_1,
        /// iq4_nl, q5_0, q5_1 (quantized ones need --flash-attn on; env
        /// QUANTGATE_KV_TYPE).
        #[arg(long)]
        kv_type: Option<String>,
        /// Flash attention: off (default) or on (env QUANTGATE_FLASH_ATTN).
        #[arg(long)]
        flash_attn: Option<String>,
        /// Also write the ladder report (report.md, report.csv, report.html) to DIR.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Replace a report that DIR of --report holds already.
        #[arg(long)]
        force: bool,
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
    /// The ladder report (report.md, report.csv, report.html): from `--json`
    /// files of `quantgate run`, else from the result cache (the newest
    /// result of each selected case × model, e.g. after `cargo test`).
    Report {
        /// Which cases and models (with the result cache), as `run` selects them.
        #[command(flatten)]
        select: Select,
        /// `--json` files of `quantgate run` to report on.
        #[arg(long)]
        json: Vec<PathBuf>,
        /// Where to write the report.
        #[arg(long, default_value = "report")]
        out: PathBuf,
        /// Accept a selection of no case × model (otherwise an error).
        #[arg(long)]
        allow_empty: bool,
        /// Replace a report that --out holds already.
        #[arg(long)]
        force: bool,
    },
    /// Merge the outcomes of shards (folders a `QUANTGATE_OUT=DIR` run under
    /// nextest wrote, or `--json` files) into one run: every selected test
    /// exactly once, one build, one settings line per case, gates judged
    /// again; then the table, `--json` and `--report` as `run` writes them.
    /// Exit 0: all pass; 1: a test failed; 2: the shards do not make one run.
    Merge {
        /// Shard output folders (walked for `*.json`) or `--json` files.
        #[arg(required = true)]
        sources: Vec<PathBuf>,
        /// The cases the shards ran (files, directories or globs, as `run`
        /// takes them; default: every case).
        #[arg(long = "case")]
        cases: Vec<String>,
        /// Only these model aliases (or files), as `run --model`.
        #[arg(long = "model")]
        models: Vec<String>,
        /// The reference of every selected case, as `run --reference`.
        #[arg(long)]
        reference: Option<String>,
        /// Write the merged outcomes (one JSON array, as `run --json`).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also write the ladder report to DIR.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Accept a selection of no case × model (otherwise an error).
        #[arg(long)]
        allow_empty: bool,
        /// Replace a report that --report holds already.
        #[arg(long)]
        force: bool,
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

/// Which cases run on which models.
#[derive(clap::Args)]
struct Select {
    /// Case files, directories or globs (relative to the suites directory).
    patterns: Vec<String>,
    /// Only these model aliases; or GGUF files (paths, globs, a split
    /// file by its first part), pinned in `<suites>/models.lock`, which
    /// every selected case then runs on instead of its own models.
    #[arg(long = "model")]
    models: Vec<String>,
    /// The reference (an alias or a GGUF file) of every selected case
    /// that names one, instead of its own.
    #[arg(long)]
    reference: Option<String>,
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
    /// Build the reference products (`.qgref` rows for KL, `.qgscores` for
    /// paired ΔNLL) of the selected cases once, into DIR: shards then read
    /// them with QUANTGATE_REFERENCE_DIR=DIR and never load the reference model.
    Build {
        /// Which cases and models, as `run` selects them.
        #[command(flatten)]
        select: Select,
        /// The folder to write (created; products already in it are kept).
        #[arg(long)]
        out: PathBuf,
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
    /// Pin local GGUF files (paths or globs) in `<suites>/models.lock`, or
    /// pin every entry of the lock again: the only way a pinned file's
    /// new bytes are accepted.
    Pin {
        /// Files or globs (default: every file the lock pins).
        paths: Vec<String>,
    },
}

/// Write the ladder report of `outcomes` into `dir` and say where; its Markdown.
fn write_report(
    dir: &std::path::Path,
    outcomes: &[quantgate::core::Outcome],
    registry: &Registry,
    label: &str,
) -> Result<String, Error> {
    use quantgate::report::ladder;
    let facts = |m: &str| ladder::facts_of(registry, label, m);
    let views = ladder::views(outcomes, &facts);
    let files = ladder::write(dir, &views, outcomes)?;
    eprintln!(
        "quantgate: report ({} view(s)): {}",
        views.len(),
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(ladder::markdown(&views))
}

/// The planned tests of a selection: cases × models, the files named by
/// `--model` / `--reference` pinned first.
fn plan_selection(
    suites: &std::path::Path,
    patterns: &[String],
    models: &[String],
    reference: Option<&str>,
) -> Result<(Registry, Vec<quantgate::plan::Planned>), Error> {
    overrides(suites, models, reference)
        .and_then(|o| quantgate::plan::plan_with(suites, patterns, models, &o))
}

/// The goldens folder beside the suites folder.
fn default_goldens(suites: &std::path::Path) -> PathBuf {
    suites
        .parent()
        .unwrap_or(std::path::Path::new(""))
        .join("goldens")
}

/// Fix the engine options: each flag, else its environment variable.
fn engine_options(
    n_gpu_layers: &Option<String>,
    kv_type: &Option<String>,
    flash_attn: &Option<String>,
) -> Result<(), Error> {
    quantgate::core::EngineOptions::from_flags_or_env([
        n_gpu_layers.as_deref(),
        kv_type.as_deref(),
        flash_attn.as_deref(),
    ])
    .and_then(quantgate::core::EngineOptions::install)
}

/// The `--model` files and `--reference` of `quantgate run`, pinned and
/// resolved to aliases.
fn overrides(
    suites: &std::path::Path,
    models: &[String],
    reference: Option<&str>,
) -> Result<quantgate::plan::parse::Overrides, Error> {
    use quantgate::models::local;
    let specs: Vec<&String> = models.iter().filter(|m| local::is_path_spec(m)).collect();
    if specs.is_empty() && reference.is_none_or(|r| !local::is_path_spec(r)) {
        return Ok(quantgate::plan::parse::Overrides {
            models: None,
            reference: reference.map(str::to_string),
        });
    }
    let registry_file = suites.join("models.toml");
    let own = Registry::load(&registry_file)?.own_aliases();
    let cwd = std::path::Path::new(".");
    let pin_spec = |spec: &str| {
        let files = local::expand(spec, cwd).map_err(|e| e.context("--model"))?;
        local::pin(&registry_file, &own, &files, false)
    };
    let mut run_on = Vec::new();
    for m in models {
        if local::is_path_spec(m) {
            run_on.extend(pin_spec(m)?);
        } else {
            run_on.push(m.clone());
        }
    }
    let reference = match reference {
        Some(r) if local::is_path_spec(r) => {
            let a = pin_spec(r)?;
            if a.len() != 1 {
                return Err(Error::input(format!(
                    "--reference {r}: names {} models; name one",
                    a.len()
                )));
            }
            Some(a[0].clone())
        }
        r => r.map(str::to_string),
    };
    let mut seen = std::collections::BTreeSet::new();
    run_on.retain(|a| seen.insert(a.clone()));
    Ok(quantgate::plan::parse::Overrides {
        models: (!specs.is_empty()).then_some(run_on),
        reference,
    })
}

/// `--json FILE` and a report folder can be written (a report folder that
/// holds a report only with `force`): checked before any work.
fn outputs_ready(
    json: Option<&std::path::Path>,
    report_dir: Option<(&str, &std::path::Path)>,
    force: bool,
) -> Result<(), Error> {
    if let Some(p) = json {
        quantgate::core::fsutil::writable_file("--json", p)?;
    }
    if let Some((flag, d)) = report_dir {
        quantgate::report::ladder::ready(flag, d, force)?;
    }
    Ok(())
}

/// A selection of no case × model: an input error (a mistyped filter must
/// not pass), unless the command was given `--allow-empty`.
fn nothing_selected(what: &str, patterns: &[String], models: &[String]) -> Error {
    Error::input(format!(
        "nothing to {what}: {}{} selects no case × model (a case runs only the models it \
         lists); pass --allow-empty to accept an empty {what}",
        if patterns.is_empty() {
            "every case".to_string()
        } else {
            patterns.join(" ")
        },
        if models.is_empty() {
            String::new()
        } else {
            format!(" with --model {}", models.join(" --model "))
        }
    ))
}

fn fail(e: &Error) -> ExitCode {
    eprintln!("error: {}", e.message);
    match e.kind {
        quantgate::core::ErrorKind::Input => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

fn main() -> ExitCode {
    // A worker of `quantgate run` (this executable run again per model, so
    // that a llama.cpp abort fails only its own tests): its selection and
    // options come from its parent, its jobs on stdin.
    if let Some(alias) = std::env::var_os(quantgate::harness::WORKER_ENV) {
        return quantgate::harness::worker::serve(
            &quantgate::harness::Selection::default(),
            Arc::new(LlamaEngine::new()),
            &alias.to_string_lossy(),
        );
    }
    let cli = Cli::parse();
    // A bad signing key is refused before anything runs or is read.
    if let Err(e) = quantgate::core::auth::signing_key()
        .map(|_| ())
        .and_then(|()| quantgate::models::check_cache_dir())
    {
        return fail(&e);
    }
    quantgate::models::clean_stale_temps();
    match cli.command {
        Command::Run {
            select,
            json,
            out,
            timings,
            threads,
            jobs,
            goldens,
            allow_empty,
            no_cache,
            n_gpu_layers,
            kv_type,
            flash_attn,
            report: report_dir,
            force,
        } => {
            let Select {
                patterns,
                models,
                reference,
            } = select;
            if let Err(e) = engine_options(&n_gpu_layers, &kv_type, &flash_attn)
                .and_then(|()| quantgate::execute::reference::shipped_from_env().map(|_| ()))
            {
                return fail(&e);
            }
            // Output paths are checked before anything runs.
            if let Err(e) = outputs_ready(
                json.as_deref(),
                report_dir.as_deref().map(|d| ("--report", d)),
                force,
            )
            .and_then(|()| {
                out.as_ref().map_or(Ok(()), |d| {
                    quantgate::core::fsutil::writable_dir("--out", d)
                })
            }) {
                return fail(&e);
            }
            if threads == Some(0) {
                return fail(&Error::input(
                    "--threads 0: give at least 1 (the default is the cores here)".to_string(),
                ));
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
            let goldens = goldens.unwrap_or_else(|| default_goldens(&cli.suites));
            let isolation = match quantgate::harness::Isolation::from_env() {
                Ok(i) => i,
                Err(e) => return fail(&e),
            };
            let planned = overrides(&cli.suites, &models, reference.as_deref()).and_then(|o| {
                quantgate::plan::plan_with(&cli.suites, &patterns, &models, &o).map(|p| (o, p))
            });
            let (overrides, (registry, planned)) = match planned {
                Ok(p) => p,
                Err(e) => return fail(&e),
            };
            if planned.is_empty() && !allow_empty {
                return fail(&nothing_selected("run", &patterns, &models));
            }
            // A case that does not parse is said now, before any decode
            // (its test is an error in the table; the other cases run).
            let mut said = std::collections::BTreeSet::new();
            for e in planned.iter().filter_map(|p| p.case.as_ref().err()) {
                if said.insert(e.message.clone()) {
                    eprintln!("error: {}", e.message);
                }
            }
            // A model compared with itself passes every paired gate.
            for p in &planned {
                if let Ok(c) = &p.case {
                    if c.case.reference.as_ref().is_some_and(|r| r.0 == p.model) {
                        eprintln!(
                            "quantgate: warning: {}: `{}` is its own reference; its paired \
                             metrics compare it with itself (ΔNLL and KLD 0), a pass that says \
                             nothing",
                            p.name, p.model
                        );
                    }
                }
            }
            let runner = Arc::new(RunContext::new(
                registry,
                Arc::new(LlamaEngine::new()),
                threads.unwrap_or_else(|| threads_per_trial(jobs.max(1))),
            ));
            if let Some(dir) = &out {
                quantgate::report::clean_product_temps(dir, &planned);
            }
            // Plan by observation: each group is one decode, after the
            // groups whose references it reads; each runs in a worker
            // process of its model (QUANTGATE_ISOLATION=off: in this one).
            // Rows are not kept in the result cache: --out runs everything.
            let cache = !no_cache && out.is_none() && quantgate::judge::cache::enabled();
            let groups =
                quantgate::plan::groups::groups(&planned, &vec![true; planned.len()], true);
            let selection = Arc::new(quantgate::harness::Selection {
                suites: cli.suites.clone(),
                goldens: goldens.clone(),
                patterns: patterns.clone(),
                models: models.clone(),
                overrides,
            });
            let executors = quantgate::harness::worker::executors(
                isolation, &groups, &runner, &selection, true,
            );
            let exec = |g: usize,
                        run: &[&quantgate::plan::Planned],
                        provides: &[&quantgate::plan::Planned]| {
                let job = quantgate::harness::worker::Job {
                    run: run.iter().map(|p| p.name.clone()).collect(),
                    provide: provides.iter().map(|p| p.name.clone()).collect(),
                    cache,
                    rows: out.clone(),
                    outcomes: None,
                };
                executors[g]
                    .as_ref()
                    .expect("every group has an executor")
                    .run(run, provides, &job, &goldens, runner.threads)
            };
            let mut write_failed = false;
            let (outcomes, reference_work) = quantgate::judge::run_groups(
                &planned,
                &groups,
                jobs.max(1),
                &exec,
                &mut |names, provides| match names {
                    [] => eprintln!("quantgate: reference work for {provides} trials"),
                    [one] => eprintln!("quantgate: running {one}"),
                    _ => eprintln!("quantgate: running {} (one decode)", names.join(", ")),
                },
                &mut |_, unwritten| {
                    for e in unwritten {
                        eprintln!("error: {e}");
                        write_failed = true;
                    }
                },
            );
            drop(executors);
            print!("{}", report::table(&outcomes));
            if let Some(dir) = &report_dir {
                let label = quantgate::engine::Engine::build(&LlamaEngine::new()).label();
                if let Err(e) = write_report(dir, &outcomes, runner.registry(), &label) {
                    eprintln!("error: {}", e.message);
                    write_failed = true;
                }
            }
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
        Command::Reference {
            action: ReferenceAction::Build { select, out },
        } => {
            if out.exists() && !out.is_dir() {
                return fail(&Error::input(format!(
                    "--out {}: exists and is not a directory",
                    out.display()
                )));
            }
            let (registry, planned) = match plan_selection(
                &cli.suites,
                &select.patterns,
                &select.models,
                select.reference.as_deref(),
            ) {
                Ok(p) => p,
                Err(e) => return fail(&e),
            };
            // A selection that reads no reference builds nothing: say so
            // rather than leave an empty folder that every shard refuses.
            let reads = planned
                .iter()
                .filter(|p| {
                    p.case
                        .as_ref()
                        .is_ok_and(|c| c.kind.reference_observation().is_some())
                })
                .count();
            if reads == 0 {
                return fail(&Error::input(format!(
                    "nothing to build: none of the {} selected tests ({}) reads a reference model",
                    planned.len(),
                    if select.patterns.is_empty() {
                        "every case".to_string()
                    } else {
                        select.patterns.join(" ")
                    }
                )));
            }
            let mut runner =
                RunContext::new(registry, Arc::new(LlamaEngine::new()), threads_per_trial(1));
            // The products go to --out, whatever the environment ships.
            runner.references =
                quantgate::execute::reference::ReferenceStore::with_shipped(out.clone(), Ok(None));
            let goldens = default_goldens(&cli.suites);
            let t = std::time::Instant::now();
            let work = quantgate::judge::build_references(&runner, &planned, &goldens);
            for f in &work.failed {
                eprintln!("error: {f}");
            }
            let mut files: Vec<(String, u64)> = std::fs::read_dir(&out)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| {
                    let bytes = e.metadata().map_or(0, |m| m.len());
                    (e.file_name().to_string_lossy().into_owned(), bytes)
                })
                .collect();
            files.sort();
            for (name, bytes) in &files {
                println!("{}  {bytes} bytes", out.join(name).display());
            }
            println!(
                "quantgate: {} reference product(s) built in {:.1} s, {} in {}",
                work.built.len(),
                t.elapsed().as_secs_f64(),
                files.len(),
                out.display()
            );
            if work.failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
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
        Command::Report {
            select,
            json,
            out,
            allow_empty,
            force,
        } => {
            if let Err(e) = outputs_ready(None, Some(("--out", &out)), force) {
                return fail(&e);
            }
            let Select {
                patterns,
                models,
                reference,
            } = select;
            let label = quantgate::engine::Engine::build(&LlamaEngine::new()).label();
            let outcomes: Result<Vec<quantgate::core::Outcome>, Error> = if !json.is_empty() {
                // Judged again from the cases, as `merge` judges shards: a
                // status or a number is never taken on the file's word.
                plan_selection(&cli.suites, &patterns, &models, reference.as_deref()).and_then(
                    |(reg, planned)| {
                        if let Some(f) = json.iter().find(|f| !f.is_file()) {
                            return Err(Error::input(format!(
                                "--json {}: no such file",
                                f.display()
                            )));
                        }
                        let found = quantgate::judge::merge::read_outcomes(&json)?;
                        let given: std::collections::BTreeSet<String> = found
                            .iter()
                            .map(|(_, o)| format!("{}::{}", o.case, o.model))
                            .collect();
                        let planned: Vec<_> = planned
                            .into_iter()
                            .filter(|p| given.contains(&p.name))
                            .collect();
                        let pinned = |m: &str| reg.entry(m).ok()?.sha256.clone();
                        quantgate::judge::merge::merge(&planned, found, &pinned)
                    },
                )
            } else {
                plan_selection(&cli.suites, &patterns, &models, reference.as_deref())
                    .and_then(|(reg, planned)| {
                    let runner =
                        RunContext::new(reg, Arc::new(LlamaEngine::new()), threads_per_trial(1));
                    if planned.is_empty() && !allow_empty {
                        return Err(nothing_selected("report", &patterns, &models));
                    }
                    let mut found = Vec::new();
                    let mut missing = Vec::new();
                    for p in &planned {
                        match quantgate::judge::cache::latest(&runner, p) {
                            Some(o) => found.push(o),
                            None => missing.push(p.name.clone()),
                        }
                    }
                    if !missing.is_empty() {
                        return Err(Error::input(format!(
                            "no verified result in the result cache ({}) for {} of {} selected tests \
                             (run them first, or select fewer): {}",
                            cache_dir().join("results").display(),
                            missing.len(),
                            planned.len(),
                            missing.join(", ")
                        )));
                    }
                    Ok(found)
                })
            };
            let registry = Registry::load(&cli.suites.join("models.toml"));
            let outcomes = outcomes.and_then(|o| {
                if o.is_empty() && !json.is_empty() && !allow_empty {
                    Err(Error::input(format!(
                        "nothing to report: --json {} hold no outcome; pass --allow-empty to \
                         accept an empty report",
                        json.iter()
                            .map(|f| f.display().to_string())
                            .collect::<Vec<_>>()
                            .join(" --json ")
                    )))
                } else {
                    Ok(o)
                }
            });
            match (outcomes, registry) {
                (Ok(outcomes), Ok(registry)) => {
                    match write_report(&out, &outcomes, &registry, &label) {
                        Ok(md) => {
                            print!("{md}");
                            ExitCode::SUCCESS
                        }
                        Err(e) => fail(&e),
                    }
                }
                (Err(e), _) | (_, Err(e)) => fail(&e),
            }
        }
        Command::Merge {
            sources,
            cases,
            models,
            reference,
            json,
            report: report_dir,
            allow_empty,
            force,
        } => {
            if let Err(e) = outputs_ready(
                json.as_deref(),
                report_dir.as_deref().map(|d| ("--report", d)),
                force,
            ) {
                return fail(&e);
            }
            let merged = plan_selection(&cli.suites, &cases, &models, reference.as_deref())
                .and_then(|(registry, planned)| {
                    if planned.is_empty() && !allow_empty {
                        return Err(nothing_selected("merge", &cases, &models));
                    }
                    let found = quantgate::judge::merge::read_outcomes(&sources)?;
                    let pinned = |m: &str| registry.entry(m).ok()?.sha256.clone();
                    let merged = quantgate::judge::merge::merge(&planned, found, &pinned)?;
                    Ok((registry, merged))
                });
            let (registry, outcomes) = match merged {
                Ok(m) => m,
                Err(e) => return fail(&e),
            };
            print!("{}", report::table(&outcomes));
            if let Some(path) = &json {
                if let Err(e) = report::write_json(path, &outcomes) {
                    return fail(&e);
                }
            }
            if let Some(dir) = &report_dir {
                let label = quantgate::engine::Engine::build(&LlamaEngine::new()).label();
                if let Err(e) = write_report(dir, &outcomes, &registry, &label) {
                    return fail(&e);
                }
            }
            if outcomes.iter().all(|o| o.status == Status::Pass) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
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
                            let file = m
                                .path
                                .as_ref()
                                .map(|p| p.display().to_string())
                                .unwrap_or_default();
                            match (&m.pinned_in, m.parts.len()) {
                                (Some(_), 0) => format!("{file} (pinned in models.lock)"),
                                (Some(_), n) => {
                                    format!("{file} ({n} parts, pinned in models.lock)")
                                }
                                (None, _) => file,
                            }
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
                Some(ModelsAction::Pin { paths }) => {
                    use quantgate::models::local;
                    let registry_file = cli.suites.join("models.toml");
                    let files = if paths.is_empty() {
                        match local::Lock::beside(&registry_file) {
                            Ok(l) => Ok(l.entries.values().map(|p| p.path.clone()).collect()),
                            Err(e) => Err(e),
                        }
                    } else {
                        paths.iter().try_fold(Vec::new(), |mut all, p| {
                            all.extend(local::expand(p, std::path::Path::new("."))?);
                            Ok(all)
                        })
                    };
                    let pinned = files.and_then(|files| {
                        local::pin(&registry_file, &registry.own_aliases(), &files, true)
                            .map(|a| (a, files))
                    });
                    match pinned {
                        Ok((aliases, files)) => {
                            let lock = local::Lock::beside(&registry_file);
                            for (a, f) in aliases.iter().zip(&files) {
                                let p = lock.as_ref().ok().and_then(|l| l.entries.get(a));
                                println!(
                                    "{a:<24} {} {} bytes {}",
                                    p.map(|p| p.sha256.as_str()).unwrap_or("-"),
                                    p.map(|p| p.bytes).unwrap_or(0),
                                    f.display()
                                );
                            }
                            ExitCode::SUCCESS
                        }
                        Err(e) => fail(&e),
                    }
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
