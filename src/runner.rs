//! Plan and run: case × model trials, grouped by model, each producing an
//! [`Outcome`]. Used by the `cargo test` harness and by the CLI alike.
//!
//! Contract: planning (parse, registry lookup, names, filters) loads no
//! model; a broken case becomes one failing trial of its own and the others
//! still run; an engine error is an `error` outcome, never numbers.

use crate::case::{parse_case, Case, Source, Spec};
use crate::discover::discover;
use crate::engine::{Engine, EngineBuild, ModelPool, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::execute::{
    parse_token_ids, plan_windows, read_record, record_jsonl, score_plan, score_plan_with,
    RecordHeader, Scored, ScoringPlan, StageTimings,
};
use crate::judge::{judge, GateResult};
use crate::measure::{paired_metrics, perplexity_metrics};
use crate::models::{ensure, Registry};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
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
pub fn plan(
    suites: &Path,
    patterns: &[String],
    models: &[String],
) -> Result<(Registry, Vec<Planned>)> {
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
                    message: e.message.replace(
                        &found.path.display().to_string(),
                        &rel_path.display().to_string(),
                    ),
                }),
                model: String::new(),
            }),
            Ok(case) => {
                // Several wordings of a recite prompt: one case (and test) each.
                let variants: Vec<(String, Arc<Case>)> = match &case.spec {
                    Spec::Recite(r) if r.prompts.len() > 1 => r
                        .prompts
                        .iter()
                        .map(|p| {
                            let mut one = r.clone();
                            one.prompts = vec![p.clone()];
                            let name = format!("{}/{}", found.name(), p.name);
                            let c = Case {
                                name: name.clone(),
                                spec: Spec::Recite(one),
                                ..case.clone()
                            };
                            (name, Arc::new(c))
                        })
                        .collect(),
                    _ => vec![(found.name().to_string(), Arc::new(case))],
                };
                for (stem, case) in variants {
                    plan_models(&registry, models, &stem, &case, &mut out);
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.model, &a.name).cmp(&(&b.model, &b.name)));
    Ok((registry, out))
}

/// One planned trial per model of `case` (those in `models` when given).
fn plan_models(
    registry: &Registry,
    models: &[String],
    stem: &str,
    case: &Arc<Case>,
    out: &mut Vec<Planned>,
) {
    for (alias, at) in &case.models {
        if !models.is_empty() && !models.contains(alias) {
            continue;
        }
        let reference = case.spec.reference().cloned();
        let case = match (registry.entry(alias), reference) {
            (Err(e), _) => Err(e.context(format!("{at}: models"))),
            (Ok(_), Some((r, rat))) if registry.entry(&r).is_err() => Err(registry
                .entry(&r)
                .unwrap_err()
                .context(format!("{rat}: reference"))),
            _ => Ok(case.clone()),
        };
        out.push(Planned {
            name: format!("{stem}::{alias}"),
            case,
            model: alias.clone(),
        });
    }
}

/// pass, fail (a gate was violated) or error (the case could not run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
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
    /// The decision of a preregistered comparison (never read back from the
    /// result cache: preregistered cases always run).
    #[serde(skip_deserializing)]
    pub prereg: Option<crate::prereg::Decision>,
    /// Per-position KLD rows (kld cases), for the Parquet output.
    #[serde(skip)]
    pub kld_rows: Option<Arc<KldRows>>,
    /// Discrete text outcomes (recitation output, stop reason, least
    /// certain positions), compared exactly with the golden.
    #[serde(default)]
    pub texts: BTreeMap<String, String>,
    /// Per-digit rows (teacher-forcing cases), for the Parquet output.
    #[serde(skip)]
    pub digit_rows: Option<Arc<crate::recitation::DigitRows>>,
}

/// Per-position results of a kld case.
#[derive(Debug)]
pub struct KldRows {
    /// One per scored position, window after window.
    pub positions: Vec<crate::kld::PosKld>,
    /// Candidate NLL per position.
    pub token_nll: Vec<f64>,
    /// Window of each position.
    pub window: Vec<u32>,
    /// Position in its window.
    pub position: Vec<u32>,
    /// The true next token.
    pub target: Vec<i32>,
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

/// One reference score, computed by the first trial that needs it.
type ScoreSlot = Arc<OnceLock<Result<Arc<Scored>>>>;

/// Everything a trial needs: registry, engine, loaded models, threads.
pub struct Runner {
    /// The registry.
    pub registry: Registry,
    /// Loaded models.
    pub pool: ModelPool,
    /// llama.cpp threads per trial.
    pub threads: u32,
    /// Reference scores, computed once per process per (reference file,
    /// token stream, context, batch) and shared by every candidate.
    reference_scores: Mutex<HashMap<String, ScoreSlot>>,
    /// Reference rows for KLD, once per process per cache key.
    reference_rows: Mutex<HashMap<String, RowsSlot>>,
    /// Where reference caches live (`<cache>/reference` by default): KLD
    /// reference rows (`.qgref`) and reference scores (`.jsonl` records).
    pub ref_cache_dir: PathBuf,
}

/// Stored reference rows, loaded or built by the first trial that needs them.
type RowsSlot = Arc<OnceLock<Result<Arc<RefRows>>>>;

/// A KLD reference: its rows, and where they came from.
pub struct RefRows {
    /// One per scored position.
    pub rows: Vec<crate::kld::RefPosition>,
    /// Reference vocabulary size.
    pub n_vocab: usize,
    /// Reference tokenizer fingerprint.
    pub tokenizer_fingerprint: String,
}

impl RefRows {
    /// The rows are an imported 16-bit llama-perplexity reference.
    pub fn imported(&self) -> bool {
        self.rows.iter().any(|r| r.approximate)
    }
}

impl Runner {
    /// A runner over `engine`.
    pub fn new(registry: Registry, engine: Arc<dyn Engine>, threads: u32) -> Self {
        Runner {
            registry,
            pool: ModelPool::new(engine),
            threads: threads.max(1),
            reference_scores: Mutex::new(HashMap::new()),
            reference_rows: Mutex::new(HashMap::new()),
            ref_cache_dir: crate::models::cache_dir().join("reference"),
        }
    }

    /// Make a model available and verified (fetch/derive as needed).
    pub fn prepare(&self, alias: &str) -> Result<crate::models::Verified> {
        let engine = self.pool.engine().clone();
        let threads = self.threads;
        let quantize =
            move |src: &Path, dst: &Path, quant: &str| engine.quantize(src, dst, quant, threads);
        ensure(
            &self.registry,
            alias,
            &self.pool.engine().build().label(),
            &quantize,
        )
    }

    /// Check every input of a trial still matches its pin (the case's text
    /// or token file, reference record or `.kld`, the model and reference
    /// files) without running anything: what a cached result relies on.
    pub fn verify_inputs(&self, p: &Planned) -> Result<()> {
        let case = p.case.as_ref().map_err(|e| e.clone())?;
        let Some(pp) = case.spec.perplexity() else {
            self.prepare(&p.model)?;
            if let Some((r, _)) = case.spec.reference() {
                self.prepare(r)?;
            }
            return Ok(());
        };
        read_source(pp)?;
        if let Some(rec) = &pp.reference_record {
            read_pinned_bytes(&rec.path, "reference_record", &rec.sha256, &rec.at)?;
        }
        if let Some(rec) = pp.kld.as_ref().and_then(|k| k.import.as_ref()) {
            read_pinned_bytes(&rec.path, "reference_kld", &rec.sha256, &rec.at)?;
        }
        self.prepare(&p.model)?;
        if let Some((r, _)) = &pp.reference {
            self.prepare(r)?;
        }
        Ok(())
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
            prereg: None,
            kld_rows: None,
            texts: BTreeMap::new(),
            digit_rows: None,
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

    pub(crate) fn load(
        &self,
        alias: &str,
    ) -> Result<(crate::models::Verified, Arc<dyn crate::engine::LoadedModel>)> {
        let v = self.prepare(alias)?;
        let m = self.pool.get(&v.file)?;
        Ok((v, m))
    }

    fn run_case(&self, case: &Case, alias: &str, out: &mut Outcome) -> Result<()> {
        let pp = match &case.spec {
            Spec::Perplexity(pp) => pp,
            Spec::Recite(r) => return crate::recitation::run_recite(self, case, r, alias, out),
            Spec::TeacherForcing(t) => {
                return crate::recitation::run_teacher_forcing(self, case, t, alias, out)
            }
        };
        let in_case = |e: Error| match e.kind {
            ErrorKind::Input if !e.message.contains(&case.path.display().to_string()) => {
                e.context(case.path.display())
            }
            _ => e,
        };
        // A preregistered rule is verified before any model runs.
        let prereg = match &case.prereg {
            Some((path, at)) => Some(verify_prereg(case, alias, path).map_err(|e| {
                if e.message.contains(&path.display().to_string()) {
                    e
                } else {
                    e.context(format!("{at}: prereg"))
                }
            })?),
            None => None,
        };
        let src = read_source(pp)?;
        let t = Instant::now();
        let (verified, model) = self.load(alias)?;
        out.timings.prepare = t.elapsed();
        out.model_sha256 = Some(verified.file.sha256.clone());
        let context = pp.windowing.context();
        let check_context = |m: &dyn crate::engine::LoadedModel, a: &str| -> Result<()> {
            if context > m.info().n_ctx_train {
                return Err(Error::input(format!(
                    "{}: window: context {context} is larger than the training context {} of model `{a}`",
                    pp.window_at,
                    m.info().n_ctx_train
                )));
            }
            Ok(())
        };
        check_context(&*model, alias)?;
        let mut settings = Settings::new(context, self.threads);
        settings.n_batch = pp.n_batch;
        out.settings = Some(settings);
        let t = Instant::now();
        let plan = self.plan_for(pp, &src, &*model).map_err(in_case)?;
        out.timings.tokenize = t.elapsed();
        out.token_stream_sha256 = Some(plan.token_stream_sha256.clone());
        if let Some(k) = &pp.kld {
            return self.run_kld(
                case,
                pp,
                k,
                alias,
                &src,
                &*model,
                &plan,
                out,
                prereg.as_ref(),
            );
        }
        let scored = score_plan(&*model, &plan, pp.n_batch, self.threads).map_err(in_case)?;
        out.timings.decode = scored.decode;
        out.timings.measure = scored.measure;
        let t = Instant::now();
        out.metrics = perplexity_metrics(&scored.windows);
        // Loading and scoring the reference (once per process) count as decode time.
        let t_ref = Instant::now();
        let reference: Option<Arc<Scored>> = if let Some((ref_alias, ref_at)) = &pp.reference {
            let (rv, rmodel) = self
                .load(ref_alias)
                .map_err(|e| e.context(format!("{ref_at}: reference")))?;
            let (ci, ri) = (model.info(), rmodel.info());
            if ci.n_vocab != ri.n_vocab || ci.tokenizer_fingerprint != ri.tokenizer_fingerprint {
                return Err(Error::input(format!(
                    "{ref_at}: reference: `{ref_alias}` and `{alias}` have different tokenizers \
                     (vocabulary {} vs {}, fingerprint {} vs {}): perplexity compares only within one base model",
                    ri.n_vocab, ci.n_vocab, &ri.tokenizer_fingerprint[..12.min(ri.tokenizer_fingerprint.len())],
                    &ci.tokenizer_fingerprint[..12.min(ci.tokenizer_fingerprint.len())]
                )));
            }
            check_context(&*rmodel, ref_alias)?;
            if let Some((p, _)) = &prereg {
                crate::prereg::check_size(
                    p,
                    crate::prereg::gguf_total_bytes(&verified.file.path)?,
                    crate::prereg::gguf_total_bytes(&rv.file.path)?,
                )?;
            }
            let rplan = self.plan_for(pp, &src, &*rmodel).map_err(in_case)?;
            if rplan.token_stream_sha256 != plan.token_stream_sha256 {
                return Err(Error::input(format!(
                    "{ref_at}: reference: `{ref_alias}` and `{alias}` do not score identical tokens \
                     (token stream {} vs {})",
                    rplan.token_stream_sha256, plan.token_stream_sha256
                )));
            }
            let build = self.pool.engine().build().label();
            let key = format!(
                "{}|{}|{}|{}|{}|{:?}",
                rv.file.sha256, plan.token_stream_sha256, context, pp.n_batch, build, pp.windowing
            );
            let slot = memo_slot(&self.reference_scores, &key);
            let rscored = slot
                .get_or_init(|| {
                    // Other processes (test workers, later runs) share the
                    // scores through a reference record in the cache.
                    let path = self
                        .ref_cache_dir
                        .join(format!("{}.jsonl", crate::fsutil::sha256_bytes(key.as_bytes())));
                    if let Ok(text) = std::fs::read_to_string(&path) {
                        match read_record(&text, &rplan) {
                            Ok((h, scored))
                                if h.model_sha256 == rv.file.sha256 && h.build == build =>
                            {
                                return Ok(Arc::new(scored))
                            }
                            Ok(_) => eprintln!(
                                "quantgate: reference cache {} is for another model or build; rescoring",
                                path.display()
                            ),
                            Err(e) => eprintln!(
                                "quantgate: reference cache {} is unusable ({e}); rescoring `{ref_alias}`",
                                path.display()
                            ),
                        }
                    }
                    let scored = score_plan(&*rmodel, &rplan, pp.n_batch, self.threads)?;
                    let header =
                        record_header(ref_alias, &rv.file.sha256, &build, &*rmodel, pp, &rplan, &scored);
                    crate::fsutil::write_atomic(
                        &path,
                        record_jsonl(&header, &rplan, &scored).as_bytes(),
                    )?;
                    Ok(Arc::new(scored))
                })
                .clone()?;
            Some(rscored)
        } else if let Some(rec) = &pp.reference_record {
            let text = read_pinned(&rec.path, "reference_record", &rec.sha256, &rec.at)?;
            let (header, rscored) = read_record(&text, &plan)
                .map_err(|e| Error::input(format!("{}:{e}", rec.path.display())))?;
            let ci = model.info();
            if header.n_vocab != ci.n_vocab
                || header.tokenizer_fingerprint != ci.tokenizer_fingerprint
            {
                return Err(Error::input(format!(
                    "{}: reference_record: recorded on `{}` whose tokenizer differs from `{alias}`'s \
                     (vocabulary {} vs {}): perplexity compares only within one base model",
                    rec.at, header.model, header.n_vocab, ci.n_vocab
                )));
            }
            Some(Arc::new(rscored))
        } else {
            None
        };
        let ref_time = t_ref.elapsed();
        out.timings.decode += ref_time;
        if let Some(rscored) = reference {
            add_paired(out, pp, &scored, &rscored);
        }
        out.timings.measure += t.elapsed().saturating_sub(ref_time);
        decide_prereg(prereg.as_ref(), out)
    }

    /// A `kind = "kld"` case: reference rows (cache, built once, or an
    /// imported `.kld`), then the candidate scored with every row compared.
    #[allow(clippy::too_many_arguments)]
    fn run_kld(
        &self,
        case: &Case,
        pp: &crate::case::Perplexity,
        k: &crate::case::KldSpec,
        alias: &str,
        src: &str,
        model: &dyn crate::engine::LoadedModel,
        plan: &ScoringPlan,
        out: &mut Outcome,
        prereg: Option<&(crate::prereg::Prereg, crate::prereg::LedgerLine)>,
    ) -> Result<()> {
        let ci = model.info();
        let t_ref = Instant::now();
        let refs = self.kld_reference(case, pp, k, src, model, plan)?;
        out.timings.decode += t_ref.elapsed();
        // Error before computing: one vocabulary and tokenizer.
        if refs.n_vocab != ci.n_vocab || refs.tokenizer_fingerprint != ci.tokenizer_fingerprint {
            return Err(Error::input(format!(
                "{}: the reference and `{alias}` have different tokenizers (vocabulary {} vs {}, fingerprint {} vs {}): KL needs one vocabulary",
                case.path.display(),
                refs.n_vocab,
                ci.n_vocab,
                refs.tokenizer_fingerprint,
                ci.tokenizer_fingerprint
            )));
        }
        let total: usize = plan.windows.iter().map(|w| w.targets.len()).sum();
        if refs.rows.len() != total {
            return Err(Error::harness(format!(
                "{}: the reference holds {} positions, the case scores {total}",
                case.path.display(),
                refs.rows.len()
            )));
        }
        let copy: Vec<bool> = plan
            .windows
            .iter()
            .flat_map(|w| crate::kld::copy_flags(&w.window.tokens, w.first_scored, &w.targets))
            .collect();
        let mut pos = Vec::with_capacity(total);
        let scored = score_plan_with(model, plan, pp.n_batch, self.threads, true, &mut |r| {
            let rp = &refs.rows[r.index];
            pos.push(crate::kld::compare(
                rp,
                r.row,
                r.stats,
                r.exps,
                r.target,
                copy[r.index],
            ));
            Ok(())
        })
        .map_err(|e| e.context(case.path.display()))?;
        out.timings.decode += scored.decode;
        out.timings.measure += scored.measure;
        let t = Instant::now();
        if pos.len() != total {
            return Err(Error::harness(format!(
                "{}: compared {} positions of {total}",
                case.path.display(),
                pos.len()
            )));
        }
        out.metrics = perplexity_metrics(&scored.windows);
        if !refs.imported() {
            let rscored = crate::execute::scored_from_rows(plan, &refs.rows);
            add_paired(out, pp, &scored, &rscored);
        }
        out.metrics.extend(crate::kld::kld_metrics(&pos, &k.bins));
        let (mut window, mut position, mut target) = (Vec::new(), Vec::new(), Vec::new());
        for (w, pw) in plan.windows.iter().enumerate() {
            for (k, &t) in pw.targets.iter().enumerate() {
                window.push(w as u32);
                position.push((pw.first_scored + k) as u32);
                target.push(t);
            }
        }
        out.kld_rows = Some(Arc::new(KldRows {
            positions: pos,
            token_nll: scored.token_nll.clone(),
            window,
            position,
            target,
        }));
        out.timings.measure += t.elapsed();
        decide_prereg(prereg, out)
    }

    /// The reference rows of a kld case.
    fn kld_reference(
        &self,
        case: &Case,
        pp: &crate::case::Perplexity,
        k: &crate::case::KldSpec,
        src: &str,
        model: &dyn crate::engine::LoadedModel,
        plan: &ScoringPlan,
    ) -> Result<Arc<RefRows>> {
        let ci = model.info();
        if let Some(rec) = &k.import {
            let bytes = read_pinned_bytes(&rec.path, "reference_kld", &rec.sha256, &rec.at)?;
            let rows =
                crate::refcache::import_llama_kld(&bytes, plan, pp.windowing.context(), ci.n_vocab)
                    .map_err(|e| Error::input(format!("{}: {e}", rec.path.display())))?;
            return Ok(Arc::new(RefRows {
                rows,
                n_vocab: ci.n_vocab,
                tokenizer_fingerprint: ci.tokenizer_fingerprint.clone(),
            }));
        }
        let Some((ref_alias, ref_at)) = &pp.reference else {
            return Err(Error::input(format!(
                "{}: a kld case needs a reference",
                case.path.display()
            )));
        };
        let entry = self
            .registry
            .entry(ref_alias)
            .map_err(|e| e.context(ref_at))?;
        let ref_sha = match &entry.sha256 {
            Some(s) => s.clone(),
            None => self.prepare(ref_alias)?.file.sha256,
        };
        let context = pp.windowing.context();
        let header = crate::refcache::CacheHeader {
            reference_sha256: ref_sha,
            token_stream_sha256: plan.token_stream_sha256.clone(),
            windowing: format!("{:?}", pp.windowing),
            settings: format!(
                "n_ctx={context} n_batch={} flash_attn=off kv=f16",
                pp.n_batch
            ),
            build: self.pool.engine().build().label(),
            tail: k.tail,
            max_kept: k.max_kept,
            positions: plan.windows.iter().map(|w| w.targets.len()).sum(),
            n_vocab: ci.n_vocab,
            tokenizer_fingerprint: String::new(),
        };
        self.cached_ref_rows(&header, &case.path, ref_alias, &|| {
            let (_, rmodel) = self
                .load(ref_alias)
                .map_err(|e| e.context(format!("{ref_at}: reference")))?;
            let ri = rmodel.info();
            if ri.n_vocab != ci.n_vocab || ri.tokenizer_fingerprint != ci.tokenizer_fingerprint {
                return Err(Error::input(format!(
                    "{ref_at}: reference: `{ref_alias}` and `{}` have different tokenizers \
                     (vocabulary {} vs {}): KL needs one vocabulary",
                    ci.file.alias, ri.n_vocab, ci.n_vocab
                )));
            }
            if context > ri.n_ctx_train {
                return Err(Error::input(format!(
                    "{}: window: context {context} is larger than the training context {} of model `{ref_alias}`",
                    pp.window_at, ri.n_ctx_train
                )));
            }
            let rplan = self.plan_for(pp, src, &*rmodel)?;
            if rplan.token_stream_sha256 != plan.token_stream_sha256 {
                return Err(Error::input(format!(
                    "{ref_at}: reference: `{ref_alias}` and `{}` do not score identical tokens",
                    ci.file.alias
                )));
            }
            let mut rows = Vec::with_capacity(header.positions);
            score_plan_with(&*rmodel, &rplan, pp.n_batch, self.threads, false, &mut |r| {
                rows.push(crate::kld::compress_row(
                    r.row,
                    r.stats,
                    r.target,
                    k.tail,
                    k.max_kept,
                ));
                Ok(())
            })?;
            Ok((ri.n_vocab, ri.tokenizer_fingerprint.clone(), rows))
        })
    }

    /// Reference rows from the `.qgref` cache file of `header`, or built by
    /// `build` (which loads the reference model, scores it and returns its
    /// vocabulary size, tokenizer fingerprint and rows) and written there.
    /// Once per process per key; a corrupt cache is rebuilt, or reported
    /// with the reason when the reference model is not available.
    pub(crate) fn cached_ref_rows(
        &self,
        header: &crate::refcache::CacheHeader,
        case_path: &Path,
        ref_alias: &str,
        build: &dyn Fn() -> Result<(usize, String, Vec<crate::kld::RefPosition>)>,
    ) -> Result<Arc<RefRows>> {
        let key = header.key();
        let path = self.ref_cache_dir.join(format!("{key}.qgref"));
        let slot = memo_slot(&self.reference_rows, &key);
        slot.get_or_init(|| {
            let corrupt = match std::fs::read(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => Some(e.to_string()),
                Ok(bytes) => match crate::refcache::decode(&bytes, header) {
                    Ok((h, rows)) => {
                        return Ok(Arc::new(RefRows {
                            rows,
                            n_vocab: h.n_vocab,
                            tokenizer_fingerprint: h.tokenizer_fingerprint,
                        }))
                    }
                    Err(why) => Some(why),
                },
            };
            if let Some(why) = &corrupt {
                eprintln!(
                    "quantgate: reference cache {} is unusable ({why}); rebuilding it from `{ref_alias}`",
                    path.display()
                );
            }
            let (n_vocab, fingerprint, rows) = build().map_err(|e| match &corrupt {
                Some(why) => Error::input(format!(
                    "{}: reference cache {} is unusable ({why}), and the reference model `{ref_alias}` \
                     is not available to rebuild it: {}",
                    case_path.display(),
                    path.display(),
                    e.message
                )),
                None => e,
            })?;
            let mut h = header.clone();
            h.n_vocab = n_vocab;
            h.tokenizer_fingerprint = fingerprint;
            std::fs::create_dir_all(&self.ref_cache_dir).map_err(|e| {
                Error::harness(format!("{}: {e}", self.ref_cache_dir.display()))
            })?;
            crate::fsutil::write_atomic(&path, &crate::refcache::encode(&h, &rows))?;
            Ok(Arc::new(RefRows {
                rows,
                n_vocab: h.n_vocab,
                tokenizer_fingerprint: h.tokenizer_fingerprint,
            }))
        })
        .clone()
    }
}

/// The once-per-process slot of `key` in a memo of shared results.
fn memo_slot<T>(memo: &Mutex<HashMap<String, Arc<OnceLock<T>>>>, key: &str) -> Arc<OnceLock<T>> {
    let mut m = memo.lock().unwrap_or_else(|p| p.into_inner());
    m.entry(key.to_string()).or_default().clone()
}

/// The header of a reference record of `scored` (`plan` on `model`).
fn record_header(
    alias: &str,
    sha256: &str,
    build: &str,
    model: &dyn crate::engine::LoadedModel,
    pp: &crate::case::Perplexity,
    plan: &ScoringPlan,
    scored: &Scored,
) -> RecordHeader {
    let info = model.info();
    RecordHeader {
        quantgate_reference_record: 1,
        model: alias.to_string(),
        model_sha256: sha256.to_string(),
        build: build.to_string(),
        n_vocab: info.n_vocab,
        tokenizer_fingerprint: info.tokenizer_fingerprint.clone(),
        mode: pp.windowing.mode().to_string(),
        windows: plan.windows.len(),
        targets: scored.token_nll.len(),
        token_stream_sha256: plan.token_stream_sha256.clone(),
    }
}

/// The paired metrics of a candidate against its reference's scores.
fn add_paired(out: &mut Outcome, pp: &crate::case::Perplexity, scored: &Scored, rscored: &Scored) {
    let b = pp.bootstrap;
    out.metrics.extend(paired_metrics(
        &scored.windows,
        &rscored.windows,
        &scored.token_nll,
        &rscored.token_nll,
        (b.block, b.resamples, b.seed),
    ));
}

/// Evaluate a prereg's rule on the measured metrics.
fn decide_prereg(
    prereg: Option<&(crate::prereg::Prereg, crate::prereg::LedgerLine)>,
    out: &mut Outcome,
) -> Result<()> {
    if let Some((p, line)) = prereg {
        let windows = out.metrics.get("windows").copied().unwrap_or(f64::NAN);
        if windows != p.windows as f64 {
            return Err(Error::input(format!(
                "{}: windows: {} preregistered, {windows} evaluated",
                p.path.display(),
                p.windows
            )));
        }
        let d = p
            .decide(&out.metrics, &line.time)
            .map_err(|e| Error::harness(format!("{}: {e}", p.path.display())))?;
        out.metrics
            .insert("prereg_outcome".into(), d.outcome.as_metric());
        out.metrics.insert(
            "prereg_prediction_hit".into(),
            if d.prediction_hit { 1.0 } else { 0.0 },
        );
        out.prereg = Some(d);
    }
    Ok(())
}

impl Runner {
    /// Score the case's windows on `alias` and return them as a reference
    /// record (JSONL) that later runs can compare against without the model.
    pub fn export_reference(&self, case: &Case, alias: &str) -> Result<String> {
        let Some(pp) = case.spec.perplexity() else {
            return Err(Error::input(format!(
                "{}: only perplexity and kld cases have reference records",
                case.path.display()
            )));
        };
        let src = read_source(pp)?;
        let (verified, model) = self.load(alias)?;
        let plan = self.plan_for(pp, &src, &*model)?;
        let scored = score_plan(&*model, &plan, pp.n_batch, self.threads)?;
        let build = self.pool.engine().build().label();
        let header = record_header(
            alias,
            &verified.file.sha256,
            &build,
            &*model,
            pp,
            &plan,
            &scored,
        );
        Ok(record_jsonl(&header, &plan, &scored))
    }

    /// Token ids of the case's source for `model`, cut into windows.
    fn plan_for(
        &self,
        pp: &crate::case::Perplexity,
        src: &str,
        model: &dyn crate::engine::LoadedModel,
    ) -> Result<ScoringPlan> {
        let info = model.info();
        let (ids, bos) = match &pp.source {
            Source::Text { bos, .. } => {
                let ids: Vec<_> = model.tokenize(src, *bos)?.iter().map(|t| t.id).collect();
                let add = match bos {
                    crate::engine::BosPolicy::Model => info.add_bos,
                    crate::engine::BosPolicy::Always => true,
                    crate::engine::BosPolicy::Never => false,
                };
                (ids, add.then_some(info.bos))
            }
            Source::TokenIds { path } => {
                let ids = parse_token_ids(src)
                    .map_err(|e| Error::input(format!("{}:{e}", path.display())))?;
                if let Some((i, id)) = ids
                    .iter()
                    .enumerate()
                    .find(|(_, id)| **id as usize >= info.n_vocab)
                {
                    let (line, col) = token_position(src, i);
                    return Err(Error::input(format!(
                        "{}:{line}:{col}: token id {id} is not below the vocabulary size {} of model `{}`",
                        path.display(),
                        info.n_vocab,
                        info.file.alias
                    )));
                }
                (ids, None)
            }
        };
        plan_windows(&ids, &pp.windowing, bos).map_err(|e| {
            Error::input(format!(
                "{}: {} ({}): {e}",
                pp.window_at,
                pp.source.path().display(),
                pp.windowing.mode()
            ))
        })
    }
}

/// The case's text or token-id file, checked against its pin.
/// Parse the case's prereg, check it is sealed, unchanged, consistent with
/// the case and (in git) committed before the case's golden.
fn verify_prereg(
    case: &Case,
    alias: &str,
    path: &Path,
) -> Result<(crate::prereg::Prereg, crate::prereg::LedgerLine)> {
    use crate::prereg;
    let p = prereg::parse(path)?;
    let line = prereg::sealed_line(&p)?;
    prereg::check_case(&p, case)?;
    let golden =
        crate::golden::Goldens::new(prereg::root_of(path).join("goldens")).path(&case.name, alias);
    prereg::check_history(&p, &line, &golden)?;
    Ok((p, line))
}

fn read_source(pp: &crate::case::Perplexity) -> Result<String> {
    read_pinned(
        pp.source.path(),
        pp.source.table(),
        &pp.sha256,
        &pp.sha256_at,
    )
}

/// Read a file pinned by sha256 as UTF-8 text; a mismatch names the pin's place.
fn read_pinned(
    path: &Path,
    table: &str,
    sha256: &str,
    at: &crate::case::Location,
) -> Result<String> {
    let bytes = read_pinned_bytes(path, table, sha256, at)?;
    String::from_utf8(bytes)
        .map_err(|e| Error::input(format!("{}: not UTF-8: {e}", path.display())))
}

fn read_pinned_bytes(
    path: &Path,
    table: &str,
    sha256: &str,
    at: &crate::case::Location,
) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::input(format!("{at}: {table}.path: {}: {e}", path.display())))?;
    let sha = crate::fsutil::sha256_bytes(&bytes);
    if sha != sha256 {
        return Err(Error::input(format!(
            "{at}: {table}.sha256: {} does not match its pin\n  expected {sha256}\n  actual   {sha} ({} bytes)",
            path.display(),
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Line and column (1-based) of the `index`-th whitespace-separated word.
fn token_position(src: &str, index: usize) -> (usize, usize) {
    let mut k = 0;
    for (l, line) in src.lines().enumerate() {
        let mut col = 0;
        for word in line.split_whitespace() {
            col = line[col..].find(word).map_or(col, |i| col + i);
            if k == index {
                return (l + 1, col + 1);
            }
            col += word.len();
            k += 1;
        }
    }
    (0, 0)
}

/// Threads per trial so that test threads × llama threads ≤ cores.
pub fn threads_per_trial(concurrent: usize) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / concurrent.max(1)).max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::{FakeEngine, FakeSpec, N_VOCAB};

    /// A suites tree with two tiny GGUF "models" and one perplexity case.
    fn suite(tag: &str, case_extra: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("qg-runner-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("ppl")).unwrap();
        let gguf = crate::gguf::tests::tiny_header();
        std::fs::write(root.join("m.gguf"), &gguf).unwrap();
        let sha = crate::fsutil::sha256_bytes(&gguf);
        std::fs::write(
            root.join("models.toml"),
            format!(
                "[good]\nsha256 = \"{sha}\"\nbytes = {}\npath = \"m.gguf\"\n\n[sharp]\nsha256 = \"{sha}\"\npath = \"m.gguf\"\n",
                gguf.len()
            ),
        )
        .unwrap();
        let text: String = (0..300)
            .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
            .collect();
        std::fs::write(root.join("ppl/t.txt"), &text).unwrap();
        let tsha = crate::fsutil::sha256_bytes(text.as_bytes());
        std::fs::write(
            root.join("ppl/case.toml"),
            format!(
                "kind = \"perplexity\"\nmodels = [\"good\", \"sharp\"]\n[text]\npath = \"t.txt\"\nsha256 = \"{tsha}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = 3\n{case_extra}"
            ),
        )
        .unwrap();
        root
    }

    /// Independent reference: llama-perplexity's windows and a naive
    /// log-softmax over the fake engine's logit formula.
    fn reference_nll(spec: &FakeSpec, text: &[u8], n_ctx: usize, chunks: usize) -> (f64, usize) {
        let mut toks = vec![crate::engine::fake::BOS];
        toks.extend(text.iter().map(|&b| i32::from(b)));
        let (mut sum, mut n) = (0.0, 0);
        for c in 0..chunks.min(toks.len() / n_ctx) {
            let start = c * n_ctx;
            for pos in n_ctx / 2..n_ctx - 1 {
                let input = if pos == 0 {
                    crate::engine::fake::BOS
                } else {
                    toks[start + pos]
                };
                let row: Vec<f64> = (0..N_VOCAB)
                    .map(|j| f64::from(spec.logit(input, pos, j)))
                    .collect();
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
                sum += lse - row[toks[start + pos + 1] as usize];
                n += 1;
            }
        }
        (sum / n as f64, n)
    }

    fn run_all(root: &Path, engine: FakeEngine) -> Vec<Outcome> {
        let (registry, planned) = plan(root, &[], &[]).unwrap();
        let runner = Runner::new(registry, Arc::new(engine), 1);
        planned.iter().map(|p| runner.run(p)).collect()
    }

    #[test]
    fn fake_engine_through_every_stage() {
        let sharp = FakeSpec {
            confidence: 9.0,
            ..FakeSpec::default()
        };
        let root = suite("stages", "[[gate]]\nmetric = \"ppl\"\nmax = 1e9\n");
        let out = run_all(&root, FakeEngine::new().with("sharp", sharp.clone()));
        assert_eq!(out.len(), 2);
        let text = std::fs::read(root.join("ppl/t.txt")).unwrap();
        for (o, spec) in out.iter().zip([FakeSpec::default(), sharp]) {
            assert_eq!(o.status, Status::Pass, "{o:?}");
            let (want, n) = reference_nll(&spec, &text, 64, 3);
            assert_eq!(o.metrics["tokens_scored"], n as f64);
            assert_eq!(o.metrics["windows"], 3.0);
            assert!(
                (o.metrics["nll_mean"] - want).abs() < 1e-12,
                "{} vs {want}",
                o.metrics["nll_mean"]
            );
            assert!((o.metrics["ppl"] - want.exp()).abs() < 1e-9);
        }
    }

    /// Per-window mean NLLs and per-token NLLs, recomputed independently.
    fn reference_windows(
        spec: &FakeSpec,
        text: &[u8],
        n_ctx: usize,
        chunks: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut toks = vec![crate::engine::fake::BOS];
        toks.extend(text.iter().map(|&b| i32::from(b)));
        let (mut means, mut all) = (Vec::new(), Vec::new());
        for c in 0..chunks {
            let start = c * n_ctx;
            let mut v = Vec::new();
            for pos in n_ctx / 2..n_ctx - 1 {
                let row: Vec<f64> = (0..N_VOCAB)
                    .map(|j| f64::from(spec.logit(toks[start + pos], pos, j)))
                    .collect();
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
                v.push(lse - row[toks[start + pos + 1] as usize]);
            }
            means.push(v.iter().sum::<f64>() / v.len() as f64);
            all.extend(v);
        }
        (means, all)
    }

    /// The test suite with `sharp` as the candidate and `good` as its reference.
    fn paired_suite(tag: &str, extra: &str) -> PathBuf {
        let root = suite(tag, extra);
        let case = std::fs::read_to_string(root.join("ppl/case.toml")).unwrap();
        let case = case.replace(
            "models = [\"good\", \"sharp\"]",
            "models = [\"sharp\"]\nreference = \"good\"",
        );
        std::fs::write(root.join("ppl/case.toml"), case).unwrap();
        root
    }

    #[test]
    fn paired_delta_nll_against_a_reference_is_recomputed_independently() {
        let root = paired_suite(
            "paired",
            "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = 0.05\n",
        );
        let sharp = FakeSpec {
            confidence: 6.0,
            ..FakeSpec::default()
        };
        let out = run_all(&root, FakeEngine::new().with("sharp", sharp.clone()));
        let o = &out[0];
        assert!(o.error.is_none(), "{o:?}");
        let text = std::fs::read(root.join("ppl/t.txt")).unwrap();
        let (cm, ct) = reference_windows(&sharp, &text, 64, 3);
        let (rm, rt) = reference_windows(&FakeSpec::default(), &text, 64, 3);
        let d: Vec<f64> = cm.iter().zip(&rm).map(|(a, b)| a - b).collect();
        let mean = d.iter().sum::<f64>() / 3.0;
        let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
        use statrs::distribution::ContinuousCDF;
        let t = statrs::distribution::StudentsT::new(0.0, 1.0, 2.0)
            .unwrap()
            .inverse_cdf(0.975);
        let close = |name: &str, want: f64| {
            let got = o.metrics[name];
            assert!(
                (got - want).abs() < 1e-9 * want.abs().max(1.0),
                "{name}: {got} vs {want}"
            );
        };
        close("delta_nll_mean", mean);
        close("delta_nll_ci95_lo", mean - t * sd / 3f64.sqrt());
        close("delta_nll_ci95_hi", mean + t * sd / 3f64.sqrt());
        close(
            "windows_better",
            d.iter().filter(|x| **x < 0.0).count() as f64,
        );
        close("ppl_ref", (rt.iter().sum::<f64>() / rt.len() as f64).exp());
        // llama-perplexity's token-level figures from the per-token NLLs.
        let n = ct.len() as f64;
        let (fa, fb) = (ct.iter().sum::<f64>() / n, rt.iter().sum::<f64>() / n);
        let va = ct.iter().map(|x| (x - fa).powi(2)).sum::<f64>() / n / (n - 1.0);
        let vb = rt.iter().map(|x| (x - fb).powi(2)).sum::<f64>() / n / (n - 1.0);
        let cov = ct
            .iter()
            .zip(&rt)
            .map(|(a, b)| (a - fa) * (b - fb))
            .sum::<f64>()
            / n
            / (n - 1.0);
        close("ln_ppl_ratio", fa - fb);
        close("ln_ppl_ratio_se", (va + vb - 2.0 * cov).sqrt());
        close("ppl_ratio", (fa - fb).exp());
        close("nll_token_corr", cov / (va.sqrt() * vb.sqrt()));
        let (lo, hi) = (
            o.metrics.get("delta_nll_boot95_lo"),
            o.metrics.get("delta_nll_boot95_hi"),
        );
        // Three windows are too few for a block bootstrap: no interval at all.
        assert!(lo.is_none() && hi.is_none(), "{lo:?} {hi:?}");
        // Confidence on the wrong next byte costs: the candidate is worse.
        assert!(mean > 0.0);
        assert_eq!(
            o.status,
            if mean <= 0.05 {
                Status::Pass
            } else {
                Status::Fail
            }
        );
    }

    #[test]
    fn reference_with_another_tokenizer_is_refused() {
        let root = paired_suite("tok", "");
        let other = FakeSpec {
            tokenizer: "another-base-model",
            ..FakeSpec::default()
        };
        let out = run_all(&root, FakeEngine::new().with("good", other));
        let e = out[0].error.as_deref().unwrap();
        assert!(
            e.contains("case.toml:3:13: reference: `good` and `sharp` have different tokenizers"),
            "{e}"
        );
        assert!(out[0].input_error);
    }

    #[test]
    fn gate_violation_fails_with_observed_and_threshold() {
        let root = suite(
            "gate",
            "[[gate]]\nmetric = \"ppl\"\nmax = 1.5\n[[gate]]\nmetric = \"windows\"\nmin = 3\n",
        );
        let out = run_all(&root, FakeEngine::new());
        let o = &out[0];
        assert_eq!(o.status, Status::Fail);
        let msg = o.failure_message().unwrap();
        assert!(
            msg.starts_with("ppl/case::good: gate violated\n  ppl = "),
            "{msg}"
        );
        assert!(msg.contains("violates ppl ≤ 1.5 (max 1.5)"), "{msg}");
        assert!(!msg.contains("windows"), "{msg}");
    }

    #[test]
    fn nan_logits_and_decode_errors_are_errors_not_numbers() {
        let root = suite("faults", "[[gate]]\nmetric = \"ppl\"\nmax = 1e9\n");
        let engine = FakeEngine::new()
            .with(
                "good",
                FakeSpec {
                    nan_at: Some((1, 40)),
                    ..FakeSpec::default()
                },
            )
            .with(
                "sharp",
                FakeSpec {
                    decode_error_in: Some(2),
                    ..FakeSpec::default()
                },
            );
        let out = run_all(&root, engine);
        assert!(
            out.iter()
                .all(|o| o.status == Status::Error && o.metrics.is_empty()),
            "{out:?}"
        );
        let e0 = out[0].error.as_deref().unwrap();
        assert!(
            e0.contains("model `good`") && e0.contains("m.gguf") && e0.contains("sha256 "),
            "{e0}"
        );
        assert!(
            e0.contains("non-finite logit NaN for token 7 at position 40"),
            "{e0}"
        );
        let e1 = out[1].error.as_deref().unwrap();
        assert!(e1.contains("llama_decode failed (1) in window 2"), "{e1}");
    }

    #[test]
    fn n_ctx_beyond_training_and_text_pin_mismatch_name_the_case() {
        let root = suite("ctx", "");
        let small = FakeSpec {
            n_ctx_train: 32,
            ..FakeSpec::default()
        };
        let out = run_all(&root, FakeEngine::new().with("good", small));
        let e = out[0].error.as_deref().unwrap();
        assert!(e.contains("case.toml:7:8: window: context 64 is larger than the training context 32 of model `good`"), "{e}");
        assert!(out[0].input_error);
        std::fs::write(root.join("ppl/t.txt"), "changed").unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[1].error.as_deref().unwrap();
        assert!(
            e.contains("case.toml:5:10: text.sha256:") && e.contains("does not match its pin"),
            "{e}"
        );
    }

    #[test]
    fn broken_case_fails_alone_and_unknown_alias_names_the_case() {
        let root = suite("broken", "");
        std::fs::write(root.join("ppl/bad.toml"), "kind = \"perplexity\"\nmodels = [\"nosuch\"]\n[text]\npath = \"t.txt\"\nsha256 = \"x\"\npromt = 1\n").unwrap();
        std::fs::write(
            root.join("ppl/alias.toml"),
            std::fs::read_to_string(root.join("ppl/case.toml"))
                .unwrap()
                .replace("\"sharp\"", "\"shrap\""),
        )
        .unwrap();
        let (_, planned) = plan(&root, &[], &[]).unwrap();
        let names: Vec<_> = planned.iter().map(|p| p.name.as_str()).collect();
        assert!(
            names.contains(&"ppl/bad") && names.contains(&"ppl/case::good"),
            "{names:?}"
        );
        let bad = planned.iter().find(|p| p.name == "ppl/bad").unwrap();
        let e = bad.case.as_ref().unwrap_err();
        assert!(
            e.message
                .contains("suites/ppl/bad.toml:6:1: text.promt: unknown key `promt`"),
            "{}",
            e.message
        );
        let alias = planned
            .iter()
            .find(|p| p.name == "ppl/alias::shrap")
            .unwrap();
        let e = alias.case.as_ref().unwrap_err();
        assert!(
            e.message
                .contains("alias.toml:2:19: models: model alias `shrap` is not in"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("(did you mean `sharp`?)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn registry_problems_are_input_errors() {
        let root = suite("registry", "");
        let good = std::fs::read_to_string(root.join("models.toml")).unwrap();
        std::fs::write(
            root.join("models.toml"),
            good.replace("path = \"m.gguf\"\n\n", "path = \"missing.gguf\"\n\n"),
        )
        .unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[0].error.as_deref().unwrap_or_else(|| panic!("{out:?}"));
        assert!(
            e.contains("model `good`: file") && e.contains("missing.gguf does not exist"),
            "{e}"
        );
        // Wrong sha256: expected, actual and size are shown.
        let wrong = format!("0{}", &crate::fsutil::sha256_bytes(b"other")[1..]);
        std::fs::write(
            root.join("models.toml"),
            format!("[good]\nsha256 = \"{wrong}\"\npath = \"m.gguf\"\n[sharp]\nsha256 = \"{wrong}\"\npath = \"m.gguf\"\n"),
        )
        .unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[0].error.as_deref().unwrap();
        assert!(
            e.contains("sha256 mismatch")
                && e.contains("expected 0")
                && e.contains("actual   ")
                && e.contains("bytes)"),
            "{e}"
        );
        // A truncated GGUF pinned by its own sha256 is stopped by the preflight.
        let t = &crate::gguf::tests::tiny_header()[..30];
        std::fs::write(root.join("m.gguf"), t).unwrap();
        std::fs::write(root.join("models.toml"), format!("[good]\nsha256 = \"{}\"\npath = \"m.gguf\"\n[sharp]\nsha256 = \"{}\"\npath = \"m.gguf\"\n", crate::fsutil::sha256_bytes(t), crate::fsutil::sha256_bytes(t))).unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[0].error.as_deref().unwrap();
        assert!(
            e.contains("not a usable GGUF file") && e.contains("m.gguf"),
            "{e}"
        );
        assert!(out[0].input_error);
    }
}
