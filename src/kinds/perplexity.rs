//! `kind = "perplexity"`: a pinned text or token-id file scored over
//! llama-perplexity's windows (PPL, NLL, top-1), and with a reference model
//! or a reference record, the paired ΔNLL on identical tokens.
//!
//! Contract: numbers equal llama-perplexity's on the same windows; the
//! reference (model or record) shares the candidate's tokenizer and scores
//! the same token stream, or the case is an error before any comparison.

use crate::core::case::{metrics_of, Location, Metric, Pin};
use crate::core::error::{Error, Result};
use crate::core::parse::{case_table, parse_toml, Diagnostics};
use crate::core::present::{Cell, Join, Plot, Presentation, ReportColumn, Spread};
use crate::core::{Case, Outcome};
use crate::execute::observe::{Consumer, Mapped, Row};
use crate::execute::record::read_record;
use crate::execute::reference::{same_tokenizer, Vocab};
use crate::execute::windows::Scored;
use crate::execute::RunContext;
use crate::kinds::scored_text::{
    kept_scores, windows_prefix, BootstrapFile, LazyWindows, ModelWindows, PinnedFile, ScoredText,
    ScoresBuild, TextFile, WindowFile,
};
use crate::kinds::{Finish, Kind, RefWork, Start};
use crate::measure::perplexity_metrics;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use toml::Spanned;

/// Metrics of every perplexity (and kld) case.
pub(crate) const PPL_METRICS: &[&str] = &[
    "nll_mean",
    "ppl",
    "ppl_se",
    "tokens_scored",
    "top1_matches",
    "windows",
];

/// Metrics a case adds when it compares with a reference's scores.
pub(crate) const PAIRED_METRICS: &[&str] = &[
    "delta_nll_mean",
    "delta_nll_ci95_lo",
    "delta_nll_ci95_hi",
    "delta_nll_boot95_lo",
    "delta_nll_boot95_hi",
    "windows_better",
    "ppl_ref",
    "nll_mean_ref",
    "top1_matches_ref",
    "ln_ppl_ratio",
    "ln_ppl_ratio_se",
    "ppl_ratio",
    "ppl_ratio_se",
    "nll_token_corr",
];

/// The ladder columns of a scored text (perplexity and kld cases share
/// them): PPL ± se, ΔNLL with its interval, windows better; the log PPL
/// ratio in the CSV.
pub(crate) fn window_columns() -> Vec<ReportColumn> {
    vec![
        ReportColumn::new(
            "PPL ± se",
            Cell::PlusMinus {
                metric: "ppl",
                se: "ppl_se",
                digits: 4,
            },
        )
        .headline(),
        ReportColumn::new(
            "ΔNLL [95% CI]",
            Cell::Interval {
                metric: "delta_nll_mean",
                lo: "delta_nll_ci95_lo",
                hi: "delta_nll_ci95_hi",
                digits: 4,
                scale: 1.0,
                signed: true,
                suffix: "",
            },
        )
        .headline(),
        ReportColumn::new(
            "windows better",
            Cell::OutOf {
                part: "windows_better",
                whole: "windows",
            },
        ),
        ReportColumn::csv_only(&["ln_ppl_ratio", "ln_ppl_ratio_se"]),
    ]
}

/// A sequential case's columns: the windows it used of N, and the bounds
/// on the all-window mean ΔNLL its confidence sequence had at the stop;
/// shown only where a row has them.
pub(crate) fn sequential_columns() -> Vec<ReportColumn> {
    vec![
        windows_used_column(),
        ReportColumn::new(
            "ΔNLL [sequence at stop]",
            Cell::Interval {
                metric: "delta_nll_mean",
                lo: "delta_nll_mean_seq_lo",
                hi: "delta_nll_mean_seq_hi",
                digits: 4,
                scale: 1.0,
                signed: true,
                suffix: "",
            },
        )
        .optional(),
    ]
}

/// The windows a sequential case used of N, where a row has them.
pub(crate) fn windows_used_column() -> ReportColumn {
    ReportColumn::new(
        "windows used",
        Cell::OutOf {
            part: "windows",
            whole: "windows_total",
        },
    )
    .optional()
}

/// The plots of a scored text: ΔNLL against bits per weight, ΔNLL per
/// window.
pub(crate) fn window_plots() -> Vec<Plot> {
    vec![
        Plot::Frontier {
            metric: "delta_nll_mean",
            spread: Spread::Bounds("delta_nll_ci95_lo", "delta_nll_ci95_hi"),
            label: "ΔNLL (nats/token)",
        },
        Plot::Series {
            series: "delta_nll_per_window",
            title: "ΔNLL per window",
            xlabel: "window",
            ylabel: "ΔNLL (nats/token)",
        },
    ]
}

/// What the scored-text columns mean.
pub(crate) const WINDOW_LEGEND: &str =
    "PPL ± se as llama-perplexity prints it. ΔNLL: mean over windows of \
     the per-window mean NLL difference to the reference (nats/token), 95% Student-t interval \
     over windows; windows better: windows where the model's NLL is below the reference's.";

/// How perplexity cases show in the ladder report.
pub(crate) fn present() -> Option<Presentation> {
    Some(Presentation {
        kind: "perplexity",
        join: Join::Reference,
        columns: window_columns()
            .into_iter()
            .chain(sequential_columns())
            .collect(),
        plots: window_plots(),
        legend: vec![WINDOW_LEGEND],
        align: Some(crate::kinds::scored_text::same_windows),
        hub: vec![crate::core::present::HubMetric {
            metric: "ppl",
            hub_type: "perplexity",
            name: "PPL",
        }],
        reference: vec![("ppl", "ppl_ref")],
        unit: Some("windows"),
    })
}

/// What a reader calls the metrics of a scored text (perplexity and kld
/// cases), and their units.
pub(crate) const WINDOW_ABOUT: crate::core::case::About = &[
    ("nll_mean", "NLL mean", "nats/token"),
    ("ppl", "PPL", ""),
    ("ppl_se", "PPL standard error", ""),
    ("tokens_scored", "tokens scored", "tokens"),
    ("top1_matches", "top-1 matches of the text", "tokens"),
    ("windows", "windows", ""),
    ("delta_nll_mean", "ΔNLL", "nats/token"),
    (
        "delta_nll_ci95_lo",
        "ΔNLL, 95% CI lower bound",
        "nats/token",
    ),
    (
        "delta_nll_ci95_hi",
        "ΔNLL, 95% CI upper bound",
        "nats/token",
    ),
    (
        "delta_nll_boot95_lo",
        "ΔNLL, bootstrap 95% lower bound",
        "nats/token",
    ),
    (
        "delta_nll_boot95_hi",
        "ΔNLL, bootstrap 95% upper bound",
        "nats/token",
    ),
    ("windows_better", "windows better than the reference", ""),
    ("ppl_ref", "reference PPL", ""),
    ("nll_mean_ref", "reference NLL mean", "nats/token"),
    (
        "top1_matches_ref",
        "the reference's top-1 matches of the text",
        "tokens",
    ),
    ("ln_ppl_ratio", "ln(PPL ratio)", ""),
    ("ln_ppl_ratio_se", "ln(PPL ratio) standard error", ""),
    ("ppl_ratio", "PPL ratio to the reference", ""),
    ("ppl_ratio_se", "PPL ratio standard error", ""),
    (
        "nll_token_corr",
        "NLL correlation with the reference, per token",
        "",
    ),
];

/// The counts among [`PPL_METRICS`] and [`PAIRED_METRICS`].
pub(crate) const COUNTS: &[&str] = &[
    "tokens_scored",
    "top1_matches",
    "windows",
    "windows_better",
    "top1_matches_ref",
];

/// The metrics of a window-scoring case, paired or not.
pub(crate) fn window_metrics(paired: bool) -> Vec<Metric> {
    let mut m = metrics_of(PPL_METRICS, COUNTS);
    if paired {
        m.extend(metrics_of(PAIRED_METRICS, COUNTS));
    }
    m
}

case_table! {
    struct PerplexityFile {
        text: Option<TextFile>,
        tokens: Option<PinnedFile>,
        window: Spanned<WindowFile>,
        bootstrap: Option<BootstrapFile>,
        reference_record: Option<PinnedFile>,
    }
}

/// A perplexity case.
#[derive(Debug, Clone)]
pub(crate) struct Perplexity {
    /// What is scored, and how.
    pub text: ScoredText,
    /// The reference model, if any.
    pub reference: Option<(String, Location)>,
    /// A reference record (JSONL) standing in for the reference model.
    pub record: Option<Pin>,
    /// Whether the case decides its gates sequentially (`[decide]`).
    pub sequential: bool,
}

/// Parse the kind's tables.
pub fn parse(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>> {
    let f: PerplexityFile = parse_toml(diag.path(), src)?;
    let text = ScoredText::parse(
        case,
        f.text.as_ref(),
        f.tokens.as_ref(),
        &f.window,
        f.bootstrap.as_ref(),
        diag,
    )?;
    let record = f.reference_record.as_ref().map(|r| {
        if case.reference.is_some() {
            diag.push(
                &case
                    .reference
                    .as_ref()
                    .map_or_else(|| diag.at(0), |r| r.1.clone()),
                "reference: give a reference model or a reference_record, not both",
            );
        }
        r.pin("reference_record", case, diag)
    });
    Ok(Arc::new(Perplexity {
        text,
        reference: case.reference.clone(),
        record,
        sequential: case.decide.is_some(),
    }))
}

impl Kind for Perplexity {
    fn about(&self) -> crate::core::case::About {
        WINDOW_ABOUT
    }

    fn metrics(&self) -> Vec<Metric> {
        window_metrics(self.reference.is_some() || self.record.is_some())
    }

    fn headline(&self) -> Vec<&'static str> {
        vec![
            "ppl",
            "ppl_se",
            "ppl_ratio",
            "delta_nll_mean",
            "delta_nll_ci95_lo",
            "delta_nll_ci95_hi",
            "windows_better",
            "windows",
            "tokens_scored",
        ]
    }

    fn why_not(&self, metric: &str) -> Option<&'static str> {
        PAIRED_METRICS
            .contains(&metric)
            .then_some(" without a `reference` or `reference_record`")
    }

    fn recheck(&self, out: &Outcome) -> std::result::Result<(), crate::core::error::Inconsistent> {
        self.text.recheck(out)
    }

    fn pins(&self) -> Vec<Pin> {
        std::iter::once(self.text.pin.clone())
            .chain(self.record.clone())
            .collect()
    }

    fn windows(&self) -> Option<(Option<usize>, Location)> {
        Some(self.text.declared_windows())
    }

    fn reference_record(&self, cx: &RunContext, alias: &str) -> Option<Result<String>> {
        Some(self.text.reference_record(cx, alias))
    }

    fn observation(&self) -> Option<String> {
        Some(self.text.declared())
    }

    fn weight(&self) -> usize {
        self.text.weight()
    }

    fn reference_observation(&self) -> Option<String> {
        // A sequential case decodes its reference itself, window by window.
        self.reference
            .as_ref()
            .filter(|_| !self.sequential)
            .map(|_| self.text.declared())
    }

    fn decides_sequentially(&self) -> bool {
        self.sequential
    }

    fn sequential_metrics(&self) -> Vec<&'static str> {
        if self.reference.is_some() || self.record.is_some() {
            vec!["delta_nll_mean"]
        } else {
            Vec::new()
        }
    }

    fn reference_work(&self, cx: &RunContext, _case: &Case) -> Result<Option<RefWork>> {
        if self.sequential {
            return Ok(None);
        }
        match &self.reference {
            Some((alias, _)) => self.text.reference_scores_work(cx, alias),
            None => Ok(None),
        }
    }

    fn start(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<Start> {
        let tx = &self.text;
        let (src, model, plan) = tx.prepare(cx, alias, out)?;
        // Its scores are kept under its file's sha256 (`prepare` verified
        // it): never under a key another file could share.
        let sha = out
            .model_sha256
            .clone()
            .ok_or_else(|| Error::harness(format!("{alias}: the trial's model has no sha256")))?;
        if let Some(decide) = &case.decide {
            let t = Instant::now();
            let reference = self.reference_windows(cx, &src, &model, &plan)?;
            out.timings.decode += t.elapsed();
            let candidate = self.kept_windows(cx, alias, &sha, &model, plan.clone());
            let (scored, rscored) =
                tx.decide_sequentially(cx, case, decide, (&candidate, &plan), &reference, out)?;
            conclude(tx, Some(&rscored), out, &scored);
            return Ok(Start::Done);
        }
        // Loading and scoring the reference (once per process, when no
        // cache or shared decode holds it) count as decode time.
        let t_ref = Instant::now();
        let reference = if let Some(r) = &self.reference {
            Some(tx.reference_scores(cx, r, &src, &*model, &plan)?)
        } else if let Some(rec) = &self.record {
            Some(record_scores(rec, &*model, &plan)?)
        } else {
            None
        };
        out.timings.decode += t_ref.elapsed();
        let build = cx.identity_of(alias);
        let trial = PerplexityTrial {
            scores: ScoresBuild::new(tx, alias, &sha, &build, &model, &plan, cx.options()),
            reference,
            text: tx.clone(),
            case_path: case.path.clone(),
        };
        // This model's scores of these windows, when any earlier decode (as
        // a candidate or as a reference, in this process or another) kept
        // them: the same product, read back and checked, no decode.
        let settings = tx.settings(cx.threads, cx.options());
        let key = tx.scores_key(alias, &sha, &plan, &settings, &build);
        if let Some(scored) = cx.references.cached_scores(&key) {
            conclude(tx, trial.reference.as_deref(), out, &scored);
            return Ok(Start::Done);
        }
        // Or each of its windows, kept by decodes of other plans (a kld
        // case's, a sequential case's): read back, no decode, and the
        // whole kept for the next reader.
        if let Some(scored) = kept_scores(cx, &sha, &settings, &build, &plan) {
            let scored = trial.scores.store_scored(cx, scored)?;
            conclude(tx, trial.reference.as_deref(), out, &scored);
            return Ok(Start::Done);
        }
        let obs = tx.observation(cx, model.clone(), &plan);
        Ok(Start::Observe(obs, Box::new(trial)))
    }
}

/// A reference record's scores of `plan`, its tokenizer checked against
/// the candidate's.
fn record_scores(
    rec: &Pin,
    model: &dyn crate::engine::LoadedModel,
    plan: &crate::execute::windows::ScoringPlan,
) -> Result<Arc<Scored>> {
    let text = rec.read_text()?;
    let (header, rscored) = read_record(&text, plan)
        .map_err(|e| Error::input(format!("{}:{e}", rec.path.display())))?;
    let recorded = Vocab {
        alias: &header.model,
        n_vocab: header.n_vocab,
        fingerprint: &header.tokenizer_fingerprint,
    };
    same_tokenizer(
        &rec.at,
        "reference_record",
        recorded,
        Vocab::of(model.info()),
    )?;
    Ok(Arc::new(rscored))
}

impl Perplexity {
    /// The reference of a sequential run: a stored full reference or a
    /// record (every window at hand), else the reference model, decoded
    /// window by window as candidates need them.
    fn reference_windows(
        &self,
        cx: &RunContext,
        src: &str,
        model: &Arc<dyn crate::engine::LoadedModel>,
        plan: &Arc<crate::execute::windows::ScoringPlan>,
    ) -> Result<ModelWindows> {
        let tx = &self.text;
        if let Some(rec) = &self.record {
            return Ok(ModelWindows::Full(record_scores(rec, &**model, plan)?));
        }
        let Some((ralias, rat)) = &self.reference else {
            return Err(Error::harness(
                "a sequential perplexity case without a reference",
            ));
        };
        let (rv, rmodel) = cx.load_reference((ralias, rat), Vocab::of(model.info()))?;
        tx.check_context(&*rmodel)?;
        let rplan = tx.identical_plan(cx, rat, src, &*rmodel, &**model, plan)?;
        Ok(self.kept_windows(cx, ralias, &rv.file.sha256, &rmodel, Arc::new(rplan)))
    }

    /// `model`'s windows of `plan` (a candidate's, or a reference's
    /// identical plan): its whole scores when a decode kept them under its
    /// scores key (file, token stream, settings, build, windowing: a
    /// fixed-N run, or every window visited), else each window from the
    /// store (kept by any decode of that window of the model: a sequential
    /// run's, a kld case's) or decoded when first needed and kept, the
    /// whole kept once every window is.
    fn kept_windows(
        &self,
        cx: &RunContext,
        alias: &str,
        sha: &str,
        model: &Arc<dyn crate::engine::LoadedModel>,
        plan: Arc<crate::execute::windows::ScoringPlan>,
    ) -> ModelWindows {
        let tx = &self.text;
        let build = cx.identity_of(alias);
        let settings = tx.settings(cx.threads, cx.options());
        let key = tx.scores_key(alias, sha, &plan, &settings, &build);
        if let Some(full) = cx.references.cached_scores(&key) {
            return ModelWindows::Full(full);
        }
        let keep = ScoresBuild::new(tx, alias, sha, &build, model, &plan, cx.options());
        ModelWindows::Lazy(Box::new(LazyWindows {
            prefix: windows_prefix(sha, &settings.describe(), &build),
            model: model.clone(),
            plan,
            keep: std::sync::Mutex::new(Some(keep)),
        }))
    }
}

/// A perplexity trial reading its windows' rows.
struct PerplexityTrial {
    scores: ScoresBuild,
    reference: Option<Arc<Scored>>,
    text: ScoredText,
    case_path: PathBuf,
}

/// The metrics of the candidate's scores (paired with the reference's).
fn conclude(text: &ScoredText, reference: Option<&Scored>, out: &mut Outcome, scored: &Scored) {
    let t = Instant::now();
    out.metrics.extend(perplexity_metrics(&scored.windows));
    if let Some(rscored) = reference {
        text.add_paired(out, scored, rscored);
    }
    out.timings.measure += t.elapsed();
}

impl Consumer for PerplexityTrial {
    fn absorb(&mut self, r: &Row<'_>, m: Mapped) -> Result<()> {
        self.scores.absorb(r, m)
    }
}

impl Finish for PerplexityTrial {
    fn finish(self: Box<Self>, cx: &RunContext, out: &mut Outcome) -> Result<()> {
        let PerplexityTrial {
            scores,
            reference,
            text,
            case_path,
        } = *self;
        let scored = scores
            .store_with(cx, true)
            .map_err(|e| e.context(case_path.display()))?;
        conclude(&text, reference.as_deref(), out, &scored);
        Ok(())
    }
}
