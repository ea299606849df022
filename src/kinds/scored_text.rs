//! What `perplexity` and `kld` cases share: a pinned text or token-id file,
//! cut into windows the way llama-perplexity cuts it, scored on a model,
//! and the paired comparison with a reference model's scores on identical
//! tokens. Not a kind: a helper of those two.
//!
//! Contract: the `[text]`/`[tokens]`, `[window]` and `[bootstrap]` tables
//! are checked here with every error positioned; the reference scores come
//! from the one reference store after the one tokenizer and context checks.

use crate::core::case::{bad_sha, beside, Location, Pin};
use crate::core::error::{Error, Result};
use crate::core::parse::Diagnostics;
use crate::core::{Case, Outcome, Settings};
use crate::engine::{BosPolicy, LoadedModel};
use crate::execute::observe::{observe_one, Consumer, Mapped, Observation, Row};
use crate::execute::record::RecordHeader;
use crate::execute::reference::{fits_context, same_tokenizer, ScoresKey, Vocab};
use crate::execute::windows::{
    parse_token_ids, plan_windows, PlanScorer, Scored, ScoringPlan, Windowing,
};
use crate::execute::RunContext;
use crate::kinds::{RefBuild, RefWork};
use crate::measure::paired_metrics;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Instant;
use toml::Spanned;

/// `[text]`: a text, tokenized by the model.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextFile {
    path: Spanned<String>,
    sha256: Spanned<String>,
    #[serde(default)]
    bos: Option<BosPolicy>,
}

/// `[tokens]` (and the other pinned-file tables): a path and its sha256.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedFile {
    path: Spanned<String>,
    sha256: Spanned<String>,
}

impl PinnedFile {
    /// The pin, checked for form (64 hex digits) into `diag`.
    pub fn pin(&self, table: &'static str, case: &Case, diag: &mut Diagnostics) -> Pin {
        if let Some(msg) = bad_sha(&format!("{table}.sha256"), self.sha256.get_ref()) {
            diag.push_at(self.sha256.span().start, msg);
        }
        Pin {
            table,
            path: beside(&case.path, self.path.get_ref()),
            sha256: self.sha256.get_ref().clone(),
            at: diag.at(self.sha256.span().start),
        }
    }

    /// Where its sha256 is written.
    pub fn at(&self) -> usize {
        self.sha256.span().start
    }
}

/// `[window]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowFile {
    mode: Spanned<String>,
    n_ctx: Option<Spanned<u32>>,
    chunks: Option<Spanned<usize>>,
    skip: Option<Spanned<usize>>,
    stride: Option<Spanned<u32>>,
    length: Option<Spanned<u32>>,
    starts: Option<Spanned<Vec<usize>>>,
    n_batch: Option<Spanned<u32>>,
}

/// `[bootstrap]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapFile {
    seed: Option<u64>,
    resamples: Option<Spanned<usize>>,
    block: Option<usize>,
}

/// Moving-block bootstrap settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bootstrap {
    /// Seed of the documented generator (SplitMix64).
    pub seed: u64,
    /// Number of resamples.
    pub resamples: usize,
    /// Block length in windows (0: ⌈n^(1/3)⌉).
    pub block: usize,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap {
            seed: 20_251_130,
            resamples: 2000,
            block: 0,
        }
    }
}

/// What is scored.
#[derive(Debug, Clone)]
pub enum Source {
    /// A text, tokenized by the model with this BOS policy.
    Text(BosPolicy),
    /// Token ids, whitespace-separated decimal integers; never retokenized,
    /// no synthetic BOS.
    TokenIds,
}

/// A pinned text or token stream, its windows and batch.
#[derive(Debug, Clone)]
pub struct ScoredText {
    /// Text or token ids.
    pub source: Source,
    /// The file and its pin.
    pub pin: Pin,
    /// Windowing.
    pub windowing: Windowing,
    /// Where the windowing is written (`window.mode`).
    pub window_at: Location,
    /// Batch size (`n_batch = n_ubatch`).
    pub n_batch: u32,
    /// Bootstrap settings of the paired comparison.
    pub bootstrap: Bootstrap,
}

const MODES: &[&str] = &["llama-perplexity", "strided", "resets"];

/// The largest context a case may ask for (n_ctx, a reset window's length).
pub const MAX_CONTEXT: u32 = 1 << 20;

/// The most bootstrap resamples a case may ask for.
pub const MAX_RESAMPLES: usize = 1_000_000;

impl ScoredText {
    /// Parse the `[text]`/`[tokens]`, `[window]` and `[bootstrap]` tables.
    pub fn parse(
        case: &Case,
        text: Option<&TextFile>,
        tokens: Option<&PinnedFile>,
        window: &Spanned<WindowFile>,
        bootstrap: Option<&BootstrapFile>,
        diag: &mut Diagnostics,
    ) -> Result<ScoredText> {
        let (source, pin) = match (text, tokens) {
            (Some(t), None) => {
                let file = PinnedFile {
                    path: t.path.clone(),
                    sha256: t.sha256.clone(),
                };
                (
                    Source::Text(t.bos.unwrap_or(BosPolicy::Model)),
                    file.pin("text", case, diag),
                )
            }
            (None, Some(t)) => (Source::TokenIds, t.pin("tokens", case, diag)),
            _ => {
                return Err(Error::input(format!(
                "{}: give exactly one of [text] (a text to tokenize) or [tokens] (a token-id file)",
                diag.path().display()
            )))
            }
        };
        let w = window.get_ref();
        let mode = w.mode.get_ref().as_str();
        let mode_at = diag.at(w.mode.span().start);
        // Which keys each mode takes.
        let allowed: &[&str] = match mode {
            "llama-perplexity" => &["n_ctx", "chunks", "skip", "n_batch"],
            "strided" => &["n_ctx", "stride", "chunks", "n_batch"],
            "resets" => &["length", "starts", "n_batch"],
            _ => {
                diag.push(
                    &mode_at,
                    format!("window.mode: `{mode}` is not one of {}", MODES.join(", ")),
                );
                &[]
            }
        };
        let present: [(&str, Option<usize>); 7] = [
            ("n_ctx", w.n_ctx.as_ref().map(|v| v.span().start)),
            ("skip", w.skip.as_ref().map(|v| v.span().start)),
            ("chunks", w.chunks.as_ref().map(|v| v.span().start)),
            ("stride", w.stride.as_ref().map(|v| v.span().start)),
            ("length", w.length.as_ref().map(|v| v.span().start)),
            ("starts", w.starts.as_ref().map(|v| v.span().start)),
            ("n_batch", w.n_batch.as_ref().map(|v| v.span().start)),
        ];
        if MODES.contains(&mode) {
            for (key, pos) in present {
                if let Some(pos) = pos.filter(|_| !allowed.contains(&key)) {
                    diag.push_at(
                        pos,
                        format!(
                            "window.{key}: not used by mode = \"{mode}\" (it takes {})",
                            allowed.join(", ")
                        ),
                    );
                }
            }
            if mode == "resets" && matches!(source, Source::Text(_)) {
                diag.push(
                    &mode_at,
                    "window.mode: `resets` scores a pinned token-id file: use [tokens], not [text]",
                );
            }
        }
        // Errors about values come after the errors about keys.
        let mut later: Vec<(Location, String)> = Vec::new();
        let need =
            |v: &Option<Spanned<u32>>, key: &str, later: &mut Vec<(Location, String)>| match v {
                Some(v) => *v.get_ref(),
                None => {
                    later.push((
                        mode_at.clone(),
                        format!("window: mode = \"{mode}\" needs `{key}`"),
                    ));
                    0
                }
            };
        let chunks = w.chunks.as_ref().map(|c| *c.get_ref());
        if let Some(c) = w.chunks.as_ref().filter(|c| *c.get_ref() == 0) {
            later.push((
                diag.at(c.span().start),
                "window.chunks: must be ≥ 1 (zero windows)".into(),
            ));
        }
        let windowing = match mode {
            "strided" => {
                let n_ctx = need(&w.n_ctx, "n_ctx", &mut later);
                let stride = need(&w.stride, "stride", &mut later);
                if let Some(s) = &w.stride {
                    // The first scored row is context − stride − 1, and llama-perplexity
                    // refuses a stride beyond the context it was given.
                    if stride == 0 || stride > n_ctx {
                        later.push((
                            diag.at(s.span().start),
                            format!(
                                "window.stride: {stride} must be between 1 and n_ctx ({n_ctx})"
                            ),
                        ));
                    }
                }
                Windowing::Strided {
                    n_ctx,
                    stride,
                    chunks,
                }
            }
            "resets" => {
                let length = need(&w.length, "length", &mut later);
                let starts = match &w.starts {
                    Some(s) if s.get_ref().is_empty() => {
                        later.push((
                            diag.at(s.span().start),
                            "window.starts: list at least one start (zero windows)".into(),
                        ));
                        Vec::new()
                    }
                    Some(s) => s.get_ref().clone(),
                    None => {
                        later.push((
                            mode_at.clone(),
                            "window: mode = \"resets\" needs `starts`".into(),
                        ));
                        Vec::new()
                    }
                };
                if !(2..=MAX_CONTEXT).contains(&length) && w.length.is_some() {
                    later.push((
                        mode_at.clone(),
                        format!("window.length: {length} must be between 2 and {MAX_CONTEXT}"),
                    ));
                }
                Windowing::Resets { length, starts }
            }
            _ => Windowing::LlamaPerplexity {
                n_ctx: need(&w.n_ctx, "n_ctx", &mut later),
                chunks,
                skip: w.skip.as_ref().map_or(0, |s| *s.get_ref()),
            },
        };
        if let Windowing::LlamaPerplexity { n_ctx, .. } | Windowing::Strided { n_ctx, .. } =
            &windowing
        {
            if let Some(v) = &w.n_ctx {
                if *n_ctx < 8 || !n_ctx.is_multiple_of(2) || *n_ctx > MAX_CONTEXT {
                    later.push((
                        diag.at(v.span().start),
                        format!(
                            "window.n_ctx: {n_ctx} must be an even number between 8 and {MAX_CONTEXT}"
                        ),
                    ));
                }
            }
        }
        let context = windowing.context();
        // llama-perplexity: n_batch = min(-b, -c), before the strided enlargement.
        let batch_cap = match &windowing {
            Windowing::Strided { n_ctx, .. } => *n_ctx,
            _ => context,
        };
        let n_batch = w
            .n_batch
            .as_ref()
            .map_or(512.min(batch_cap.max(1)), |b| *b.get_ref());
        if let Some(b) = &w.n_batch {
            if n_batch == 0 || n_batch > context {
                later.push((
                    diag.at(b.span().start),
                    format!(
                        "window.n_batch: {n_batch} must be between 1 and the context ({context})"
                    ),
                ));
            }
        }
        for (loc, msg) in later {
            diag.push(&loc, msg);
        }
        let mut boot = Bootstrap::default();
        if let Some(b) = bootstrap {
            if let Some(s) = b.seed {
                boot.seed = s;
            }
            if let Some(r) = &b.resamples {
                if !(100..=MAX_RESAMPLES).contains(r.get_ref()) {
                    diag.push_at(
                        r.span().start,
                        format!(
                            "bootstrap.resamples: {} must be between 100 and {MAX_RESAMPLES}",
                            r.get_ref()
                        ),
                    );
                }
                boot.resamples = *r.get_ref();
            }
            if let Some(k) = b.block {
                boot.block = k;
            }
        }
        Ok(ScoredText {
            source,
            pin,
            windowing,
            window_at: mode_at,
            n_batch,
            bootstrap: boot,
        })
    }

    /// The windows the case declares, for a preregistered rule.
    pub fn declared_windows(&self) -> (Option<usize>, Location) {
        let n = match &self.windowing {
            Windowing::LlamaPerplexity { chunks, .. } | Windowing::Strided { chunks, .. } => {
                *chunks
            }
            Windowing::Resets { starts, .. } => Some(starts.len()),
        };
        (n, self.window_at.clone())
    }

    /// The observation as the case declares it: the pinned file, how it
    /// becomes tokens, the windows and the batch. Equal on two cases and one
    /// model: the same decode.
    pub fn declared(&self) -> String {
        format!(
            "windows of {} ({:?}) {:?} n_batch={}",
            self.pin.sha256, self.source, self.windowing, self.n_batch
        )
    }

    /// The observation of `plan` on `model`.
    pub fn observation(
        &self,
        cx: &RunContext,
        model: Arc<dyn LoadedModel>,
        plan: &ScoringPlan,
    ) -> Observation {
        plan.observation(model, self.n_batch, cx.threads)
    }

    /// About how many token rows the windows are (unbounded chunks count
    /// as 64).
    pub fn weight(&self) -> usize {
        match &self.windowing {
            Windowing::LlamaPerplexity { n_ctx, chunks, .. } => {
                chunks.unwrap_or(64) * *n_ctx as usize
            }
            Windowing::Strided { chunks, .. } => {
                chunks.unwrap_or(64) * self.windowing.context() as usize
            }
            Windowing::Resets { length, starts } => starts.len() * *length as usize,
        }
    }

    /// Engine settings of every pass.
    pub fn settings(&self, threads: u32) -> Settings {
        let mut s = Settings::new(self.windowing.context(), threads);
        s.n_batch = self.n_batch;
        s
    }

    /// The training context must hold the windows.
    pub fn check_context(&self, model: &dyn LoadedModel) -> Result<()> {
        fits_context(
            &format!("{}: window", self.window_at),
            self.windowing.context() as usize,
            model.info(),
        )
    }

    /// What every run of a window-scoring case starts with: the pinned text
    /// (checked), the model (loaded, its context checked) and the candidate's
    /// plan, recorded with their hashes, settings and times in `out`.
    pub fn prepare(
        &self,
        cx: &RunContext,
        alias: &str,
        out: &mut Outcome,
    ) -> Result<(String, Arc<dyn LoadedModel>, Arc<ScoringPlan>)> {
        let src = self.pin.read_text()?;
        let t = Instant::now();
        let (verified, model) = cx.load(alias)?;
        out.timings.prepare = t.elapsed();
        out.model_sha256 = Some(verified.file.sha256.clone());
        self.check_context(&*model)?;
        out.settings = Some(self.settings(cx.threads));
        let t = Instant::now();
        let plan = self.plan_for(cx, &src, &*model)?;
        out.timings.tokenize = t.elapsed();
        out.token_stream_sha256 = Some(plan.token_stream_sha256.clone());
        Ok((src, model, Arc::new(plan)))
    }

    /// Token ids of `src` (the pinned file's text) for `model`, cut into
    /// windows; a text is tokenized once per process per tokenizer.
    pub fn plan_for(
        &self,
        cx: &RunContext,
        src: &str,
        model: &dyn LoadedModel,
    ) -> Result<ScoringPlan> {
        let info = model.info();
        let path = &self.pin.path;
        let owned;
        let (ids, bos): (&[i32], _) = match &self.source {
            Source::Text(bos) => {
                owned = cx.token_ids(model, src, *bos)?;
                let add = match bos {
                    BosPolicy::Model => info.add_bos,
                    BosPolicy::Always => true,
                    BosPolicy::Never => false,
                };
                (&owned[..], add.then_some(info.bos))
            }
            Source::TokenIds => {
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
                owned = Arc::new(ids);
                (&owned[..], None)
            }
        };
        plan_windows(ids, &self.windowing, bos).map_err(|e| {
            Error::input(format!(
                "{}: {} ({}): {e}",
                self.window_at,
                path.display(),
                self.windowing.mode()
            ))
        })
    }

    /// The key of a model's scores of `plan` (its own plan).
    pub fn scores_key<'a>(
        &self,
        ref_alias: &'a str,
        sha: &'a str,
        plan: &'a ScoringPlan,
        settings: &'a Settings,
        build: &'a str,
    ) -> ScoresKey<'a> {
        ScoresKey {
            alias: ref_alias,
            model_sha256: sha,
            plan,
            settings,
            build,
            windowing: format!("{:?}", self.windowing),
        }
    }

    /// A reference model's scores of the candidate's plan, through the
    /// reference store: the reference is loaded, checked (tokenizer, context,
    /// identical token stream) and scored only when no cache holds them.
    pub fn reference_scores(
        &self,
        cx: &RunContext,
        (ref_alias, ref_at): &(String, Location),
        src: &str,
        model: &dyn LoadedModel,
        plan: &ScoringPlan,
    ) -> Result<Arc<Scored>> {
        // From the store (memo, shipped folder, cache) when it holds them:
        // no load. The key is the candidate's plan, which the reference's
        // must equal. Else computed here, when the store may (a shipped
        // folder can refuse): loaded, checked and scored under its lock.
        let build = cx.identity_of(ref_alias);
        let settings = self.settings(cx.threads);
        let pinned = cx.pinned_sha256(ref_alias).map_err(|e| e.context(ref_at))?;
        let key = self.scores_key(ref_alias, &pinned, plan, &settings, &build);
        let stored = cx.references.scores(&key, ref_at, &|| {
            let (rv, rmodel) = cx.load_reference((ref_alias, ref_at), Vocab::of(model.info()))?;
            self.check_context(&*rmodel)?;
            let rplan = self.identical_plan(cx, ref_at, src, &*rmodel, model, plan)?;
            let obs = self.observation(cx, rmodel.clone(), &rplan);
            let mut b = ScoresBuild::new(self, ref_alias, &rv.file.sha256, &build, &rmodel, &rplan);
            observe_one(&obs, &mut b)?;
            b.scored()
        })?;
        let recorded = Vocab {
            alias: ref_alias,
            n_vocab: stored.n_vocab,
            fingerprint: &stored.fingerprint,
        };
        same_tokenizer(ref_at, "reference", recorded, Vocab::of(model.info()))?;
        Ok(stored.scored.clone())
    }

    /// The reference's scores of the case's windows as work for a shared
    /// decode of the reference model (None when the store holds them).
    pub fn reference_scores_work(
        &self,
        cx: &RunContext,
        ref_alias: &str,
    ) -> Result<Option<RefWork>> {
        let src = self.pin.read_text()?;
        let (rv, rmodel) = cx.load(ref_alias)?;
        self.check_context(&*rmodel)?;
        let rplan = Arc::new(self.plan_for(cx, &src, &*rmodel)?);
        let build = cx.identity_of(ref_alias);
        let settings = self.settings(cx.threads);
        let key = self.scores_key(ref_alias, &rv.file.sha256, &rplan, &settings, &build);
        let (id, path) = cx.references.scores_product(&key);
        if cx.references.holds(&id, &path) {
            return Ok(None);
        }
        let b = ScoresBuild::new(self, ref_alias, &rv.file.sha256, &build, &rmodel, &rplan);
        Ok(Some(RefWork {
            key: id,
            path,
            observation: self.observation(cx, rmodel, &rplan),
            consumer: Box::new(b),
        }))
    }

    /// The reference's plan, which must score the candidate's tokens.
    pub fn identical_plan(
        &self,
        cx: &RunContext,
        ref_at: &Location,
        src: &str,
        reference: &dyn LoadedModel,
        candidate: &dyn LoadedModel,
        plan: &ScoringPlan,
    ) -> Result<ScoringPlan> {
        let rplan = self.plan_for(cx, src, reference)?;
        if rplan.token_stream_sha256 != plan.token_stream_sha256 {
            return Err(Error::input(format!(
                "{ref_at}: reference: `{}` and `{}` do not score identical tokens \
                 (token stream {} vs {})",
                reference.info().file.alias,
                candidate.info().file.alias,
                rplan.token_stream_sha256,
                plan.token_stream_sha256
            )));
        }
        Ok(rplan)
    }

    /// Score the windows on `alias` and return them as a reference record
    /// (JSONL) that later runs can compare against without the model.
    pub fn reference_record(&self, cx: &RunContext, alias: &str) -> Result<String> {
        let src = self.pin.read_text()?;
        let (verified, model) = cx.load(alias)?;
        let plan = self.plan_for(cx, &src, &*model)?;
        let build = cx.identity_of(alias);
        let obs = self.observation(cx, model.clone(), &plan);
        let mut b = ScoresBuild::new(self, alias, &verified.file.sha256, &build, &model, &plan);
        observe_one(&obs, &mut b)?;
        let (header, scored) = b.scored()?;
        Ok(crate::execute::record::record_jsonl(
            &header, &plan, &scored,
        ))
    }

    /// An outcome read back (result cache, shard, `--json` file) holds
    /// together: its paired metrics equal those computed again from the
    /// per-window ΔNLL series it carries (mean, Student-t and bootstrap
    /// intervals, windows better, the window count). Err(why) when one
    /// differs, or when the metrics are there and the series is not.
    pub fn recheck(&self, out: &Outcome) -> std::result::Result<(), String> {
        if !out.metrics.contains_key("delta_nll_mean") {
            return Ok(());
        }
        let Some(d) = out.series.get("delta_nll_per_window") else {
            return Err("it carries delta_nll_mean but not the per-window series \
                 (delta_nll_per_window) the paired metrics are computed from"
                .into());
        };
        let b = self.bootstrap;
        let (mean, lo, hi) = crate::measure::t_interval95(d);
        let (blo, bhi) = crate::measure::block_bootstrap95(d, b.block, b.resamples, b.seed);
        let mut expected = vec![
            ("windows", d.len() as f64),
            ("delta_nll_mean", mean),
            ("delta_nll_ci95_lo", lo),
            ("delta_nll_ci95_hi", hi),
            (
                "windows_better",
                d.iter().filter(|x| **x < 0.0).count() as f64,
            ),
        ];
        if !blo.is_nan() {
            expected.extend([("delta_nll_boot95_lo", blo), ("delta_nll_boot95_hi", bhi)]);
        }
        let same = |a: f64, b: f64| {
            a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
        };
        let wrong: Vec<String> = expected
            .iter()
            .filter(|(m, want)| !out.metrics.get(*m).is_some_and(|got| same(*got, *want)))
            .map(|(m, want)| {
                format!(
                    "{m} = {} but its {} windows give {want}",
                    out.metrics
                        .get(*m)
                        .map_or("missing".to_string(), |v| v.to_string()),
                    d.len()
                )
            })
            .collect();
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "its metrics disagree with its own per-window ΔNLL series: {}",
                wrong.join("; ")
            ))
        }
    }

    /// The paired metrics of a candidate against its reference's scores.
    pub fn add_paired(&self, out: &mut Outcome, scored: &Scored, rscored: &Scored) {
        let b = self.bootstrap;
        let per_window = |w: &crate::measure::WindowNll| w.nll_sum / w.count as f64;
        out.series.insert(
            "delta_nll_per_window".into(),
            scored
                .windows
                .iter()
                .zip(&rscored.windows)
                .map(|(c, r)| per_window(c) - per_window(r))
                .collect(),
        );
        out.metrics.extend(paired_metrics(
            &scored.windows,
            &rscored.windows,
            &scored.token_nll,
            &rscored.token_nll,
            (b.block, b.resamples, b.seed),
        ));
    }
}

/// A reference's scores of a plan (its reference record), built as a
/// consumer of the reference's observation.
pub struct ScoresBuild {
    scorer: PlanScorer,
    header: RecordHeader,
    key: (String, String, Settings, String, String),
}

impl ScoresBuild {
    /// A builder of `alias`'s scores of `plan`.
    pub fn new(
        text: &ScoredText,
        alias: &str,
        sha256: &str,
        build: &str,
        model: &Arc<dyn LoadedModel>,
        plan: &ScoringPlan,
    ) -> Self {
        let info = model.info();
        ScoresBuild {
            scorer: PlanScorer::new(Arc::new(plan.clone()), info.n_vocab),
            header: RecordHeader {
                quantgate_reference_record: 1,
                model: alias.to_string(),
                model_sha256: sha256.to_string(),
                build: build.to_string(),
                n_vocab: info.n_vocab,
                tokenizer_fingerprint: info.tokenizer_fingerprint.clone(),
                mode: text.windowing.mode().to_string(),
                windows: plan.windows.len(),
                targets: plan.targets(),
                token_stream_sha256: plan.token_stream_sha256.clone(),
                settings: None,
            },
            key: (
                alias.to_string(),
                sha256.to_string(),
                text.settings(0),
                build.to_string(),
                format!("{:?}", text.windowing),
            ),
        }
    }

    /// The record header and the scores.
    pub fn scored(self) -> Result<(RecordHeader, Scored)> {
        Ok((self.header, self.scorer.finish()?))
    }
}

impl Consumer for ScoresBuild {
    fn absorb(&mut self, r: &Row<'_>, _: Mapped) -> Result<()> {
        self.scorer.take(r).map(|_| ())
    }
}

impl ScoresBuild {
    /// The scores, put in the store (file and memo) for later readers.
    pub fn store(self, cx: &RunContext) -> Result<Arc<Scored>> {
        self.store_with(cx, false)
    }

    /// [`ScoresBuild::store`], or with `best_effort` the scores even when
    /// they cannot be kept (said on stderr: later runs decode again).
    pub fn store_with(self, cx: &RunContext, best_effort: bool) -> Result<Arc<Scored>> {
        let (alias, sha, settings, build, windowing) = self.key.clone();
        let plan = self.scorer.plan().clone();
        let (header, scored) = self.scored()?;
        let key = ScoresKey {
            alias: &alias,
            model_sha256: &sha,
            plan: &plan,
            settings: &settings,
            build: &build,
            windowing,
        };
        if !best_effort {
            return cx.references.put_scores(&key, &header, scored);
        }
        let kept = scored.clone();
        cx.references.put_scores(&key, &header, scored).or_else(|e| {
            eprintln!(
                "quantgate: the scores of `{alias}` could not be kept ({}); later runs decode them again",
                e.message
            );
            Ok(Arc::new(kept))
        })
    }
}

impl RefBuild for ScoresBuild {
    fn finish(self: Box<Self>, cx: &RunContext) -> Result<()> {
        self.store(cx).map(|_| ())
    }
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
