//! The subcommands of `quantgate`, one file each. Each returns a
//! [`Conclusion`] (or an error); [`Conclusion::exit_code`] is the one
//! mapping from a conclusion to the process's exit code.

pub mod args;
mod diff;
mod drift;
mod init;
mod inspect;
mod merge;
mod models;
mod prereg;
mod reference;
mod report;
mod run;
mod tokenize;

use args::{Cli, Command};
use quantgate::core::{Error, ErrorKind, Outcome, Status};
use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::Engine;
use quantgate::models::Registry;
use quantgate::plan::parse::Overrides;
use quantgate::plan::Planned;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Conclusion {
    /// Everything it did passed (exit 0).
    Pass,
    /// A test failed, or llama.cpp or the harness could not finish (exit 1).
    Fail,
    /// The input could not be used (exit 2).
    Unusable,
}

impl Conclusion {
    /// The process's exit code.
    pub fn exit_code(self) -> ExitCode {
        match self {
            Conclusion::Pass => ExitCode::SUCCESS,
            Conclusion::Fail => ExitCode::from(1),
            Conclusion::Unusable => ExitCode::from(2),
        }
    }

    /// Pass when `pass`, else Fail.
    fn of(pass: bool) -> Self {
        if pass {
            Conclusion::Pass
        } else {
            Conclusion::Fail
        }
    }

    /// The conclusion of outcomes: Pass when all pass.
    fn of_outcomes(outcomes: &[Outcome]) -> Self {
        Self::of(outcomes.iter().all(|o| o.status == Status::Pass))
    }
}

/// Say `e` on stderr; the conclusion its kind means (input: unusable).
pub fn said(e: &Error) -> Conclusion {
    eprintln!("error: {}", e.message);
    match e.kind {
        ErrorKind::Input => Conclusion::Unusable,
        _ => Conclusion::Fail,
    }
}

/// A command's result as the process's exit code (an error is said first).
pub fn conclude(result: Result<Conclusion, Error>) -> ExitCode {
    result.unwrap_or_else(|e| said(&e)).exit_code()
}

/// What every command shares: the suites folder and the engine.
pub struct Ctx {
    /// The config, built here from the flags and the environment.
    pub config: quantgate::Config,
    /// `--suites`.
    pub suites: PathBuf,
    /// The engine that runs models.
    pub engine: std::sync::Arc<LlamaEngine>,
}

impl Ctx {
    /// The model registry file, `<suites>/models.toml`.
    pub fn registry_file(&self) -> PathBuf {
        self.suites.join("models.toml")
    }

    /// The model registry.
    pub fn registry(&self) -> Result<Registry, Error> {
        Registry::load(&self.registry_file())
    }

    /// The engine build's label (it keys derived models and results).
    pub fn label(&self) -> String {
        self.engine.build().label()
    }

    /// The goldens folder beside the suites folder.
    pub fn default_goldens(&self) -> PathBuf {
        self.suites
            .parent()
            .unwrap_or(Path::new(""))
            .join("goldens")
    }

    /// The planned tests of a selection: cases × models, the files named
    /// by `--model` / `--reference` pinned first.
    pub fn plan_selection(
        &self,
        patterns: &[String],
        models: &[String],
        reference: Option<&str>,
    ) -> Result<(Registry, Vec<Planned>), Error> {
        self.overrides(models, reference)
            .and_then(|o| quantgate::plan::plan_with(&self.suites, patterns, models, &o))
    }

    /// The `--model` files and `--reference` of a selection, pinned and
    /// resolved to aliases.
    pub fn overrides(
        &self,
        models: &[String],
        reference: Option<&str>,
    ) -> Result<Overrides, Error> {
        use quantgate::models::local;
        let specs: Vec<&String> = models.iter().filter(|m| local::is_path_spec(m)).collect();
        if specs.is_empty() && reference.is_none_or(|r| !local::is_path_spec(r)) {
            return Ok(Overrides {
                models: None,
                reference: reference.map(str::to_string),
            });
        }
        let registry_file = self.registry_file();
        let own = self.registry()?.own_aliases();
        let cwd = Path::new(".");
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
        Ok(Overrides {
            models: (!specs.is_empty()).then_some(run_on),
            reference,
        })
    }

    /// A run context of one job on `registry` (the threads of one trial).
    pub fn runner(&self, registry: Registry) -> quantgate::execute::RunContext {
        quantgate::execute::RunContext::new(
            &self.config,
            registry,
            self.engine.clone(),
            quantgate::execute::threads_per_trial(1),
        )
    }

    /// Make `alias` available and verified (fetched or derived into the
    /// cache folder).
    pub fn ensure(
        &self,
        registry: &Registry,
        alias: &str,
    ) -> Result<quantgate::models::Verified, Error> {
        quantgate::models::ensure(
            &self.config,
            registry,
            alias,
            &self.label(),
            &self.quantizer(),
        )
    }

    /// A derived model's quantizer, through the engine.
    pub fn quantizer(&self) -> impl Fn(&Path, &Path, &str) -> Result<(), Error> + '_ {
        let threads = quantgate::execute::threads_per_trial(1);
        move |s: &Path, d: &Path, q: &str| self.engine.quantize(s, d, q, threads)
    }
}

/// Write the ladder report of `outcomes` into `dir` and say where; its Markdown.
pub fn write_report(
    dir: &Path,
    outcomes: &[Outcome],
    registry: &Registry,
    label: &str,
    cache: &Path,
    base_model: Option<&str>,
) -> Result<String, Error> {
    use quantgate::report::ladder;
    let facts = |m: &str| ladder::facts_of(registry, label, cache, m);
    let views = ladder::views(outcomes, &quantgate::kinds::presentations(), &facts);
    let files = ladder::write(dir, &views, outcomes, base_model)?;
    eprintln!(
        "quantgate: report ({} view(s)): {}",
        views.len(),
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(ladder::model_card(&views, base_model))
}

/// `--json FILE` and a report folder can be written (a report folder that
/// holds a report only with `force`): checked before any work.
pub fn outputs_ready(
    json: Option<&Path>,
    report_dir: Option<(&str, &Path)>,
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
pub fn nothing_selected(what: &str, patterns: &[String], models: &[String]) -> Error {
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

/// Run the command `cli` names.
pub fn dispatch(cli: Cli) -> Result<Conclusion, Error> {
    // The config (a bad value of any variable or engine flag is refused
    // before anything runs or is read).
    let flags = match &cli.command {
        Command::Run(a) => [
            a.n_gpu_layers.as_deref(),
            a.kv_type.as_deref(),
            a.flash_attn.as_deref(),
        ],
        _ => [None; 3],
    };
    let config = quantgate::core::config::Config::for_command_line(flags)?;
    // One source for the suites folder: the flag, else the config's
    // (`QUANTGATE_SUITES`, else `suites`).
    let suites = cli.suites.unwrap_or_else(|| config.suites.clone());
    quantgate::models::clean_stale_temps(&config.cache);
    let ctx = Ctx {
        suites,
        engine: std::sync::Arc::new(LlamaEngine::for_config(&config)),
        config,
    };
    match cli.command {
        Command::Init(a) => init::run(a),
        Command::Run(a) => run::run(&ctx, a),
        Command::Reference(a) => reference::run(&ctx, a),
        Command::Prereg(a) => prereg::run(&ctx, a),
        Command::Report(a) => report::run(&ctx, a),
        Command::Merge(a) => merge::run(&ctx, a),
        Command::Tokenize(a) => tokenize::run(&ctx, a),
        Command::Inspect(a) => inspect::run(&ctx, a),
        Command::Models(a) => models::run(&ctx, a),
        Command::Diff(a) => diff::run(&ctx, a),
        Command::Drift(a) => drift::run(&ctx, a),
        Command::Runtimes(a) => drift::runtimes(&ctx, a),
    }
}
