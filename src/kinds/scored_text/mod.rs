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
use crate::core::{Case, EngineOptions, Outcome, Settings};
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

mod align;
pub(crate) use align::{same_windows, window_series};
mod parse;
pub(crate) use parse::*;
mod reference;
pub(crate) use reference::*;
mod kept;
pub use kept::kept_scores;
pub(crate) use kept::{keep_windows, window_id, windows_prefix, KeptWindow};
mod sequential;
pub use sequential::{
    equal_windows, in_window_order, run_sequence, window_of, LazyWindows, ModelWindows,
    WindowValues, STEP,
};

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

/// The largest context a case may ask for (n_ctx, a reset window's length).
pub(crate) const MAX_CONTEXT: u32 = 1 << 20;

/// The most bootstrap resamples a case may ask for.
pub(crate) const MAX_RESAMPLES: usize = 1_000_000;

impl ScoredText {
    /// The windows the case declares, for a preregistered rule.
    pub(crate) fn declared_windows(&self) -> (Option<usize>, Location) {
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
    pub(crate) fn declared(&self) -> String {
        format!(
            "windows of {} ({:?}) {:?} n_batch={}",
            self.pin.sha256, self.source, self.windowing, self.n_batch
        )
    }

    /// The observation of `plan` on `model`.
    pub(crate) fn observation(
        &self,
        cx: &RunContext,
        model: Arc<dyn LoadedModel>,
        plan: &ScoringPlan,
    ) -> Observation {
        plan.observation(model, self.n_batch, cx.threads, cx.options())
    }

    /// About how many token rows the windows are (unbounded chunks count
    /// as 64).
    pub(crate) fn weight(&self) -> usize {
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
    pub fn settings(&self, threads: u32, options: &EngineOptions) -> Settings {
        let mut s = Settings::new(self.windowing.context(), threads).with_options(options);
        s.n_batch = self.n_batch;
        s
    }

    /// What names `alias`'s kept windows under this text's settings
    /// ([`kept::window_id`]), once [`ScoredText::prepare`] recorded its
    /// file's sha256 in `out`.
    pub(crate) fn windows_prefix(
        &self,
        cx: &RunContext,
        alias: &str,
        out: &Outcome,
    ) -> Option<String> {
        let sha = out.model_sha256.as_deref()?;
        let settings = self.settings(cx.threads, cx.options()).describe();
        Some(windows_prefix(sha, &settings, &cx.identity_of(alias)))
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
    pub(crate) fn prepare(
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
        out.settings = Some(self.settings(cx.threads, cx.options()));
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

    /// An outcome read back (result cache, shard, `--json` file) holds
    /// together: its paired metrics equal those computed again from the
    /// per-window ΔNLL series it carries (mean, Student-t and bootstrap
    /// intervals, windows better, the window count). Err(why) when one
    /// differs, or when the metrics are there and the series is not.
    pub(crate) fn recheck(
        &self,
        out: &Outcome,
    ) -> std::result::Result<(), crate::core::error::Inconsistent> {
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
        // The per-window NLL series (what a report's rows are aligned
        // by) give the model's and the reference's PPL and token count.
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
        for (suffix, ppl) in [("", "ppl"), ("_ref", "ppl_ref")] {
            let get = |k: &str| out.series.get(&format!("{k}{suffix}"));
            let (Some(sum), Some(tokens)) = (get("window_nll_sum"), get("window_tokens")) else {
                continue;
            };
            let n: f64 = tokens.iter().sum();
            let from_series = (sum.iter().sum::<f64>() / n).exp();
            if sum.len() != d.len()
                || tokens.len() != d.len()
                || out.metrics.get(ppl).is_some_and(|p| !near(*p, from_series))
                || (suffix.is_empty() && out.metrics.get("tokens_scored").is_some_and(|t| *t != n))
            {
                return Err(format!(
                    "its {ppl} disagrees with its own per-window NLL series ({} windows give \
                     {from_series})",
                    sum.len()
                )
                .into());
            }
        }
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
            )
            .into())
        }
    }

    /// The paired metrics of a candidate against its reference's scores.
    pub(crate) fn add_paired(&self, out: &mut Outcome, scored: &Scored, rscored: &Scored) {
        let b = self.bootstrap;
        let per_window = |w: &crate::measure::WindowNll| w.nll_sum / w.count as f64;
        out.series.extend(window_series(&scored.windows, ""));
        out.series.extend(window_series(&rscored.windows, "_ref"));
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
