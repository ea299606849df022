//! Plan and run: case × model trials, grouped by model, each producing an
//! [`Outcome`]. Used by the `cargo test` harness and by the CLI alike.
//!
//! Contract: planning (parse, registry lookup, names, filters) loads no
//! model; a broken case becomes one failing trial of its own and the others
//! still run; an engine error is an `error` outcome, never numbers.

use crate::case::{parse_case, Case, Spec};
use crate::discover::discover;
use crate::engine::{Engine, EngineBuild, ModelPool, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::execute::{run_perplexity, StageTimings};
use crate::judge::{judge, GateResult};
use crate::measure::perplexity_metrics;
use crate::models::{ensure, Registry};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// One planned test: a case on a model, or a case that failed to parse.
#[derive(Debug, Clone)]
pub struct Planned {
    /// `suite/case::model` (or `suite/case` for a broken case).
    pub name: String,
    /// The case, or why it could not be used.
    pub case: std::result::Result<Arc<Case>, Error>,
    /// Model alias (empty for a broken case).
    pub model: String,
}

/// Discover and parse; build the case × model matrix, sorted by model then name.
pub fn plan(suites: &Path, patterns: &[String], models: &[String]) -> Result<(Registry, Vec<Planned>)> {
    let registry = Registry::load(&suites.join("models.toml"))?;
    for m in models {
        registry.entry(m)?;
    }
    let mut out = Vec::new();
    for found in discover(suites, patterns)? {
        let rel_path = PathBuf::from("suites").join(&found.rel);
        match parse_case(&found.path, found.name()) {
            Err(e) => out.push(Planned {
                name: found.name().to_string(),
                case: Err(Error {
                    kind: e.kind,
                    message: e.message.replace(&found.path.display().to_string(), &rel_path.display().to_string()),
                }),
                model: String::new(),
            }),
            Ok(case) => {
                let case = Arc::new(case);
                for (alias, at) in &case.models {
                    if !models.is_empty() && !models.contains(alias) {
                        continue;
                    }
                    let case = match registry.entry(alias) {
                        Ok(_) => Ok(case.clone()),
                        Err(e) => Err(e.context(format!("{at}: models"))),
                    };
                    out.push(Planned {
                        name: format!("{}::{alias}", found.name()),
                        case,
                        model: alias.clone(),
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.model, &a.name).cmp(&(&b.model, &b.name)));
    Ok((registry, out))
}

/// pass, fail (a gate was violated) or error (the case could not run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// All gates held.
    Pass,
    /// A gate was violated.
    Fail,
    /// The case could not be run.
    Error,
}

/// The result of one trial; also one JSON object of `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Case name.
    pub case: String,
    /// Model alias.
    pub model: String,
    /// Verdict.
    pub status: Status,
    /// Flat metric name → value.
    pub metrics: BTreeMap<String, f64>,
    /// Gate verdicts.
    pub gates: Vec<GateResult>,
    /// Why the case could not run.
    pub error: Option<String>,
    /// Whether `error` was the input's fault (exit 2).
    #[serde(skip)]
    pub input_error: bool,
    /// Model file sha256.
    pub model_sha256: Option<String>,
    /// Case file sha256.
    pub case_sha256: Option<String>,
    /// Scored token stream sha256.
    pub token_stream_sha256: Option<String>,
    /// Engine settings.
    pub settings: Option<Settings>,
    /// Engine build.
    pub build: EngineBuild,
    /// Time per stage.
    pub timings: StageTimings,
}

impl Outcome {
    /// The failure message for a test, or None on pass.
    pub fn failure_message(&self) -> Option<String> {
        match self.status {
            Status::Pass => None,
            Status::Error => Some(self.error.clone().unwrap_or_default()),
            Status::Fail => {
                let mut m = format!("{}::{}: gate violated\n", self.case, self.model);
                for g in self.gates.iter().filter(|g| !g.passed) {
                    m.push_str(&format!("  {}\n", g.describe()));
                }
                Some(m)
            }
        }
    }
}

/// Everything a trial needs: registry, engine, loaded models, threads.
pub struct Runner {
    /// The registry.
    pub registry: Registry,
    /// Loaded models.
    pub pool: ModelPool,
    /// llama.cpp threads per trial.
    pub threads: u32,
}

impl Runner {
    /// A runner over `engine`.
    pub fn new(registry: Registry, engine: Arc<dyn Engine>, threads: u32) -> Self {
        Runner {
            registry,
            pool: ModelPool::new(engine),
            threads: threads.max(1),
        }
    }

    /// Make a model available and verified (fetch/derive as needed).
    pub fn prepare(&self, alias: &str) -> Result<crate::models::Verified> {
        let engine = self.pool.engine().clone();
        let threads = self.threads;
        let quantize = move |src: &Path, dst: &Path, quant: &str| engine.quantize(src, dst, quant, threads);
        ensure(&self.registry, alias, &self.pool.engine().build().label(), &quantize)
    }

    /// Run one planned trial.
    pub fn run(&self, p: &Planned) -> Outcome {
        let build = self.pool.engine().build();
        let mut out = Outcome {
            case: p.name.split("::").next().unwrap_or_default().to_string(),
            model: p.model.clone(),
            status: Status::Error,
            metrics: BTreeMap::new(),
            gates: Vec::new(),
            error: None,
            input_error: false,
            model_sha256: None,
            case_sha256: None,
            token_stream_sha256: None,
            settings: None,
            build,
            timings: StageTimings::default(),
        };
        let case = match &p.case {
            Ok(c) => c.clone(),
            Err(e) => {
                out.input_error = e.kind == ErrorKind::Input;
                out.error = Some(e.message.clone());
                return out;
            }
        };
        out.case_sha256 = Some(case.content_sha256.clone());
        let t0 = Instant::now();
        let result = self.run_case(&case, &p.model, &mut out);
        out.timings.total = t0.elapsed();
        match result {
            Err(e) => {
                out.input_error = e.kind == ErrorKind::Input;
                out.error = Some(e.message);
                out.status = Status::Error;
            }
            Ok(()) => {
                out.gates = judge(&case.gates, &out.metrics);
                out.status = if out.gates.iter().all(|g| g.passed) {
                    Status::Pass
                } else {
                    Status::Fail
                };
            }
        }
        out
    }

    fn run_case(&self, case: &Case, alias: &str, out: &mut Outcome) -> Result<()> {
        let t = Instant::now();
        let verified = self.prepare(alias)?;
        out.timings.prepare = t.elapsed();
        out.model_sha256 = Some(verified.file.sha256.clone());
        let t = Instant::now();
        let model = self.pool.get(&verified.file)?;
        out.timings.load = t.elapsed();
        match &case.spec {
            Spec::Perplexity(pp) => {
                let bytes = std::fs::read(&pp.text).map_err(|e| {
                    Error::input(format!("{}: text.path: {}: {e}", case.path.display(), pp.text.display()))
                })?;
                let sha = crate::fsutil::sha256_bytes(&bytes);
                if sha != pp.text_sha256 {
                    return Err(Error::input(format!(
                        "{}: text.sha256: {} does not match its pin\n  expected {}\n  actual   {sha} ({} bytes)",
                        pp.text_sha256_at,
                        pp.text.display(),
                        pp.text_sha256,
                        bytes.len()
                    )));
                }
                let text = String::from_utf8(bytes)
                    .map_err(|e| Error::input(format!("{}: not UTF-8: {e}", pp.text.display())))?;
                if pp.n_ctx > model.info().n_ctx_train {
                    return Err(Error::input(format!(
                        "{}: window.n_ctx: {} is larger than the training context {} of model `{alias}`",
                        pp.n_ctx_at,
                        pp.n_ctx,
                        model.info().n_ctx_train
                    )));
                }
                let mut settings = Settings::new(pp.n_ctx, self.threads);
                settings.n_batch = pp.n_batch;
                out.settings = Some(settings);
                let obs = run_perplexity(&*model, &text, pp.bos, pp.n_ctx, pp.n_batch, pp.chunks, self.threads)
                    .map_err(|e| match e.kind {
                        ErrorKind::Input => e.context(case.path.display()),
                        _ => e,
                    })?;
                let t = Instant::now();
                out.metrics = perplexity_metrics(&obs.windows);
                let measure = t.elapsed();
                out.token_stream_sha256 = Some(obs.token_stream_sha256);
                out.timings.tokenize = obs.timings.tokenize;
                out.timings.decode = obs.timings.decode;
                out.timings.measure = obs.timings.measure + measure;
            }
        }
        Ok(())
    }
}

/// Threads per trial so that test threads × llama threads ≤ cores.
pub fn threads_per_trial(concurrent: usize) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / concurrent.max(1)).max(1) as u32
}
