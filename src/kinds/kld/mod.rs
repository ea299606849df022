//! `kind = "kld"`: the same windows as a perplexity case, every position
//! compared over the whole vocabulary with a reference distribution — a
//! reference model's rows (through the `.qgref` reference store) or an
//! imported llama-perplexity `--kl-divergence-base` file. llama-perplexity's
//! KLD/Δp block, same-top with a Wilson interval, flips binned by the
//! reference's confidence, the copy subset, per-position Parquet rows.
//!
//! Contract: one vocabulary and tokenizer on both sides, the reference holds
//! exactly the positions the case scores, or the case is an error.

use crate::core::case::{Location, Metric, MetricType, Pin};
use crate::core::error::{Error, Result};
use crate::core::parse::{case_table, parse_toml, Diagnostics};
use crate::core::{Case, Column, Outcome, Table};
use crate::engine::LoadedModel;
use crate::execute::observe::{mapped, Consumer, Mapped, Row};
use crate::execute::reference::{LiveRows, RefRows, Vocab};
use crate::execute::windows::{scored_from_targets, PlanScorer, ScoringPlan, Windowing};
use crate::execute::RunContext;
use crate::kinds::perplexity::window_metrics;
use crate::kinds::scored_text::{
    keep_windows, BootstrapFile, PinnedFile, ScoredText, TextFile, WindowFile,
};
use crate::kinds::{Finish, Kind, RefWork, Start};
use crate::measure::kld::{self as math, PosKld};

mod kept;
mod metrics;
mod present;
mod reference;
mod sequential;
use crate::measure::perplexity_metrics;
pub use metrics::{kld_metrics, metric_names};
pub(crate) use present::present;
#[cfg(test)]
pub(crate) use present::top_flips;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KldTable {
    bins: Option<Spanned<Vec<f64>>>,
    tail: Option<Spanned<f64>>,
    max_kept: Option<Spanned<usize>>,
    store: Option<Spanned<String>>,
}

case_table! {
    struct KldFile {
        text: Option<TextFile>,
        tokens: Option<PinnedFile>,
        window: Spanned<WindowFile>,
        bootstrap: Option<BootstrapFile>,
        kld: Option<Spanned<KldTable>>,
        reference_kld: Option<PinnedFile>,
        reference_record: Option<PinnedFile>,
    }
}

/// A kld case.
#[derive(Debug, Clone)]
pub(crate) struct Kld {
    /// What is scored, and how.
    pub text: ScoredText,
    /// The reference model (None with an imported `.kld`).
    pub reference: Option<(String, Location)>,
    /// Reference top-1 probability bin edges, increasing, in (0, 1).
    pub bins: Vec<f64>,
    /// Tail mass a stored reference row may leave out.
    pub tail: f64,
    /// Cap on stored entries per reference row.
    pub max_kept: usize,
    /// A llama-perplexity `--kl-divergence-base` file as the reference.
    pub import: Option<Pin>,
    /// Whether the case decides its gates sequentially (`[decide]`).
    pub sequential: bool,
    /// The reference model's rows are read live by its candidates, in one
    /// process, and never kept (`[kld] store = "none"`); else they go
    /// through the compact reference store (`"compact"`, the default).
    pub live: bool,
}

/// Parse the kind's tables.
pub fn parse(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>> {
    let f: KldFile = parse_toml(diag.path(), src)?;
    let text = ScoredText::parse(
        case,
        f.text.as_ref(),
        f.tokens.as_ref(),
        &f.window,
        f.bootstrap.as_ref(),
        diag,
    )?;
    let mut k = Kld {
        text,
        reference: case.reference.clone(),
        bins: math::DEFAULT_BINS.to_vec(),
        tail: math::DEFAULT_TAIL,
        max_kept: math::DEFAULT_MAX_KEPT,
        import: None,
        sequential: case.decide.is_some(),
        live: false,
    };
    if let Some(t) = &f.kld {
        let t = t.get_ref();
        if let Some(b) = &t.bins {
            let v = b.get_ref();
            let ok = !v.is_empty()
                && v.iter().all(|x| *x > 0.0 && *x < 1.0)
                && v.windows(2).all(|w| w[0] < w[1]);
            if !ok {
                diag.push_at(
                    b.span().start,
                    format!("kld.bins: {v:?} must be increasing numbers strictly between 0 and 1"),
                );
            }
            k.bins = v.clone();
        }
        if let Some(t) = &t.tail {
            if !(0.0..=1e-3).contains(t.get_ref()) {
                diag.push_at(
                    t.span().start,
                    format!("kld.tail: {} must be in [0, 0.001]", t.get_ref()),
                );
            }
            k.tail = *t.get_ref();
        }
        if let Some(m) = &t.max_kept {
            if *m.get_ref() == 0 {
                diag.push_at(m.span().start, "kld.max_kept: must be ≥ 1");
            }
            k.max_kept = *m.get_ref();
        }
        if let Some(st) = &t.store {
            match st.get_ref().as_str() {
                "compact" => {}
                "none" if f.reference_kld.is_some() => diag.push_at(
                    st.span().start,
                    "kld.store: \"none\" reads a reference model's rows live; \
                     an imported [reference_kld] file is read as it is",
                ),
                "none" => k.live = true,
                other => diag.push_at(
                    st.span().start,
                    format!("kld.store: `{other}` is not one of \"compact\", \"none\""),
                ),
            }
        }
    }
    if let Some(r) = &f.reference_kld {
        if case.reference.is_some() {
            diag.push_at(
                r.at(),
                "reference_kld: give a reference model or a reference_kld file, not both",
            );
        }
        if !matches!(k.text.windowing, Windowing::LlamaPerplexity { skip: 0, .. }) {
            diag.push(
                &k.text.window_at,
                "reference_kld: a llama-perplexity base file holds its default windows: \
                 use window.mode = \"llama-perplexity\" without skip",
            );
        }
        k.import = Some(r.pin("reference_kld", case, diag));
    } else if case.reference.is_none() {
        let at = case
            .models
            .first()
            .map_or_else(|| diag.at(0), |m| m.1.clone());
        diag.push(
            &at,
            "kind = \"kld\" needs `reference` (a model) or [reference_kld] (a llama-perplexity base file)",
        );
    }
    if let Some(r) = &f.reference_record {
        diag.push_at(
            r.at(),
            "reference_record: holds only the true token's log-prob; a kld case needs `reference` or [reference_kld]",
        );
    }
    Ok(Arc::new(k))
}

/// Counts among the kld block's metrics: compared exactly.
fn is_count(name: &str) -> bool {
    let base = name.strip_prefix("copy_").unwrap_or(name);
    matches!(base, "positions" | "approx_positions")
        || base
            .strip_prefix("flip_bin")
            .and_then(|r| r.split_once('_'))
            .is_some_and(|(b, s)| {
                b.bytes().all(|c| c.is_ascii_digit()) && (s == "n" || s == "flips")
            })
}

impl Kind for Kld {
    fn about(&self) -> crate::core::case::About {
        metrics::kld_about()
    }

    fn metrics(&self) -> Vec<Metric> {
        let mut m = window_metrics(self.reference.is_some());
        m.extend(metric_names(self.bins.len()).into_iter().map(|name| {
            let ty = if is_count(&name) {
                MetricType::Count
            } else {
                MetricType::Float
            };
            let metric = Metric::new(name.clone(), ty);
            match crate::kinds::reference_rows::store_tolerance(&name) {
                Some((t, why)) => metric.with_tolerance(t, why),
                None => metric,
            }
        }));
        m
    }

    fn headline(&self) -> Vec<&'static str> {
        vec![
            "kld_mean",
            "kld_p99",
            "kld_max",
            "dp_rms",
            "same_top",
            "same_top_wilson95_lo",
            "same_top_wilson95_hi",
            "ppl_ratio",
            "delta_nll_mean",
            "positions",
        ]
    }

    fn notes(&self, out: &Outcome) -> Vec<String> {
        match out.metrics.get("approx_positions") {
            Some(&n) if n > 0.0 => vec![format!(
                "KL at {n} positions is approximate (a 16-bit llama-perplexity reference, its −16 floor)"
            )],
            _ => Vec::new(),
        }
    }

    fn recheck(&self, out: &Outcome) -> std::result::Result<(), crate::core::error::Inconsistent> {
        self.text.recheck(out)
    }

    fn pins(&self) -> Vec<Pin> {
        std::iter::once(self.text.pin.clone())
            .chain(self.import.clone())
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
        // A sequential case decodes its reference itself, visit by visit;
        // a live one in step with its candidates.
        match (&self.reference, &self.import, self.sequential || self.live) {
            (Some(_), None, false) => Some(self.text.declared()),
            _ => None,
        }
    }

    fn decides_sequentially(&self) -> bool {
        self.sequential
    }

    fn runs_jointly(&self) -> bool {
        self.sequential || self.live
    }

    fn sequential_metrics(&self) -> Vec<&'static str> {
        if self.import.is_some() {
            vec!["kld_mean", "same_top"]
        } else {
            vec!["kld_mean", "same_top", "delta_nll_mean"]
        }
    }

    fn reference_work(&self, cx: &RunContext, _case: &Case) -> Result<Option<RefWork>> {
        let (Some((ref_alias, ref_at)), None, false) =
            (&self.reference, &self.import, self.sequential || self.live)
        else {
            return Ok(None);
        };
        let tx = &self.text;
        let src = tx.pin.read_text()?;
        let (_, rmodel) = cx.load(ref_alias)?;
        tx.check_context(&*rmodel)?;
        let rplan = tx.plan_for(cx, &src, &*rmodel)?;
        let header =
            self.rows_header(cx, (ref_alias, ref_at), &rplan, rmodel.info().n_vocab, None)?;
        let obs = tx.observation(cx, rmodel.clone(), &rplan);
        Ok(self.rows_build(header, &rplan, &*rmodel).work(cx, obs))
    }

    fn start(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<Start> {
        let tx = &self.text;
        let (src, model, plan) = tx.prepare(cx, alias, out)?;
        if let Some(decide) = &case.decide {
            self.decide_sequentially(cx, case, decide, &src, (&model, &plan), out)?;
            return Ok(Start::Done);
        }
        // Every window compared already (by any case on the same windows
        // of the same files, in any run): nothing is decoded.
        let kept = self
            .kept_key(cx, alias, &plan, model.info().n_vocab, out)?
            .map(Arc::new);
        if let Some(c) = kept.as_ref().and_then(|k| k.read(cx, &plan)) {
            let t = Instant::now();
            self.conclude(out, &plan, c);
            out.timings.measure += t.elapsed();
            return Ok(Start::Done);
        }
        let obs = tx.observation(cx, model.clone(), &plan);
        // Its windows kept for a sequential case, unless the case keeps
        // nothing (`store = "none"`).
        let keep = tx.windows_prefix(cx, alias, out).filter(|_| !self.live);
        let trial = |plan, refs| KldTrial {
            keep: keep.clone(),
            kept: kept.clone(),
            ..self.trial(case, plan, model.info().n_vocab, refs)
        };
        if self.live {
            let (refs, feed) = self.live_feed(cx, case, &src, &model, &plan)?;
            let trial = trial(plan, refs);
            return Ok(Start::Live(obs, Box::new(trial), feed));
        }
        // A stored reference is read as the candidate decodes, a pair of
        // windows at a time, never held whole.
        if let Some((refs, feed)) = self.stored_feed(cx, case, &*model, (&plan, obs.key()))? {
            let trial = trial(plan, refs);
            return Ok(Start::Live(obs, Box::new(trial), feed));
        }
        // None stored yet (a trial run alone, QUANTGATE_ISOLATION=test: no
        // reference work ran before it): the reference's rows are written
        // to the store as they are decoded, then read as a stored reference
        // is. Only an imported file, rows this process holds, or a store
        // that cannot keep them are read whole.
        let t_ref = Instant::now();
        self.build_stored(cx, case, &src, &*model, &plan)?;
        out.timings.decode += t_ref.elapsed();
        if let Some((refs, feed)) = self.stored_feed(cx, case, &*model, (&plan, obs.key()))? {
            let trial = trial(plan, refs);
            return Ok(Start::Live(obs, Box::new(trial), feed));
        }
        let t_ref = Instant::now();
        let refs = self.reference_rows(cx, case, &src, &*model, &plan)?;
        out.timings.decode += t_ref.elapsed();
        let total = plan.targets();
        if refs.rows.len() != total {
            return Err(Error::harness(format!(
                "{}: the reference holds {} positions, the case scores {total}",
                case.path.display(),
                refs.rows.len()
            )));
        }
        let trial = trial(plan, Refs::Rows(refs));
        Ok(Start::Observe(obs, Box::new(trial)))
    }
}

/// Where a trial's reference rows are.
enum Refs {
    /// All of them, in memory (from the store, or an imported file).
    Rows(Arc<RefRows>),
    /// Those of the windows being decoded, live.
    Live(Arc<LiveRows>),
}

/// A kld trial: every scored row compared with its reference row.
struct KldTrial {
    scorer: PlanScorer,
    refs: Refs,
    copy: Vec<bool>,
    pos: Vec<PosKld>,
    /// Per compared position, the reference's log-prob of the true token
    /// (its paired NLL).
    ref_lp: Vec<f64>,
    text: ScoredText,
    bins: Vec<f64>,
    case_path: PathBuf,
    /// What names the candidate's windows in the store, to keep them
    /// ([`keep_windows`]) for a sequential case on the same windows.
    keep: Option<String>,
    /// What names its comparisons in the store, to keep them for a case
    /// comparing the same windows ([`kept::KldKey`]).
    kept: Option<Arc<kept::KldKey>>,
}

impl Consumer for KldTrial {
    fn wants_exps(&self) -> bool {
        true
    }

    /// The comparison with the reference row, on any thread.
    fn map(&self, r: &Row<'_>) -> Result<Mapped> {
        let Some(at) = self.scorer.locate(r.window, r.pos) else {
            return Ok(None);
        };
        let compare = |rp: &math::RefPosition| {
            let p = math::compare(
                rp,
                r.logits,
                r.stats,
                r.exps,
                at.target,
                self.copy[at.index],
            );
            (p, rp.lp_true)
        };
        let p = match &self.refs {
            Refs::Rows(refs) => compare(&refs.rows[at.index]),
            Refs::Live(live) => live.with(at.index, r.window, compare)?,
        };
        Ok(Some(Box::new(p)))
    }

    fn absorb(&mut self, r: &Row<'_>, m: Mapped) -> Result<()> {
        if self.scorer.take(r)?.is_some() {
            let (p, lp) = mapped::<(PosKld, f64)>(m)
                .ok_or_else(|| Error::harness("a scored row without its comparison"))?;
            self.pos.push(p);
            self.ref_lp.push(lp);
        }
        Ok(())
    }
}

impl Finish for KldTrial {
    fn finish(self: Box<Self>, cx: &RunContext, out: &mut Outcome) -> Result<()> {
        let KldTrial {
            scorer,
            pos,
            ref_lp,
            text,
            bins,
            case_path,
            keep,
            kept,
            ..
        } = *self;
        let plan = scorer.plan().clone();
        let scored = scorer
            .finish()
            .map_err(|e| e.context(case_path.display()))?;
        let t = Instant::now();
        let total = plan.targets();
        if pos.len() != total {
            return Err(Error::harness(format!(
                "{}: compared {} positions of {total}",
                case_path.display(),
                pos.len()
            )));
        }
        if let Some(prefix) = &keep {
            keep_windows(cx, prefix, &plan, &scored);
        }
        if let Some(key) = &kept {
            key.keep(cx, &plan, (&scored, &pos, &ref_lp));
        }
        conclude((&text, &bins), out, &plan, (scored, pos, ref_lp));
        out.timings.measure += t.elapsed();
        Ok(())
    }
}

/// The reference's scores of `plan` from the compared positions (its
/// log-prob of each truth and its argmax): what scoring the reference would
/// have observed, so paired metrics are bitwise those of a live reference.
/// None with an imported 16-bit reference, which has no exact log-prob of
/// the truth.
fn reference_scored(
    plan: &ScoringPlan,
    pos: &[PosKld],
    ref_lp: &[f64],
) -> Option<crate::execute::windows::Scored> {
    (!pos.iter().any(|p| p.approximate))
        .then(|| scored_from_targets(plan, ref_lp.iter().zip(pos).map(|(&lp, p)| (lp, p.ref_top))))
}

/// A fixed-N case's metrics and rows from its comparison of every
/// position of `plan` (decoded, or read from kept windows).
fn conclude(
    (text, bins): (&ScoredText, &[f64]),
    out: &mut Outcome,
    plan: &ScoringPlan,
    (scored, pos, ref_lp): kept::Compared,
) {
    out.metrics = perplexity_metrics(&scored.windows);
    if let Some(rscored) = reference_scored(plan, &pos, &ref_lp) {
        text.add_paired(out, &scored, &rscored);
    }
    out.metrics.extend(kld_metrics(&pos, bins));
    let ids: Vec<usize> = (0..plan.windows.len()).collect();
    out.rows = Some(Arc::new(rows_table(plan, &ids, &pos, &scored.token_nll)));
}

impl Kld {
    /// A trial of `case` comparing `plan`'s rows (of `n_vocab` entries)
    /// with `refs`.
    fn trial(&self, case: &Case, plan: Arc<ScoringPlan>, n_vocab: usize, refs: Refs) -> KldTrial {
        let copy: Vec<bool> = plan
            .windows
            .iter()
            .flat_map(|w| math::copy_flags(&w.window.tokens, w.first_scored, &w.targets))
            .collect();
        let total = plan.targets();
        KldTrial {
            scorer: PlanScorer::new(plan, n_vocab),
            refs,
            copy,
            pos: Vec::with_capacity(total),
            ref_lp: Vec::with_capacity(total),
            text: self.text.clone(),
            bins: self.bins.clone(),
            case_path: case.path.clone(),
            keep: None,
            kept: None,
        }
    }

    /// [`conclude`] with this case's text and bins.
    fn conclude(&self, out: &mut Outcome, plan: &ScoringPlan, compared: kept::Compared) {
        conclude((&self.text, &self.bins), out, plan, compared);
    }
}

/// One row per scored position (DESIGN.md, Outputs); `ids[w]` is the
/// case's number of `plan`'s window `w`.
fn rows_table(plan: &ScoringPlan, ids: &[usize], p: &[PosKld], token_nll: &[f64]) -> Table {
    let (mut window, mut position, mut target) = (Vec::new(), Vec::new(), Vec::new());
    for (pw, &w) in plan.windows.iter().zip(ids) {
        for (k, &t) in pw.targets.iter().enumerate() {
            window.push(w as i32);
            position.push((pw.first_scored + k) as i32);
            target.push(t);
        }
    }
    let f = |g: &dyn Fn(&PosKld) -> f64| Column::F64(p.iter().map(g).collect());
    let b = |g: &dyn Fn(&PosKld) -> bool| Column::Bool(p.iter().map(g).collect());
    let i = |g: &dyn Fn(&PosKld) -> i32| Column::I32(p.iter().map(g).collect());
    let columns = vec![
        ("window", Column::I32(window)),
        ("position", Column::I32(position)),
        ("token_id", Column::I32(target)),
        ("nll", Column::F64(token_nll.to_vec())),
        ("kl_vs_ref", f(&|x| x.kl)),
        ("kl_rev", f(&|x| x.kl_rev)),
        ("ref_p1", f(&|x| x.p1)),
        ("ref_top1_token", i(&|x| x.ref_top as i32)),
        ("top1_token", i(&|x| x.cand_top as i32)),
        ("flip", b(&|x| x.flip())),
        ("p_ref", f(&|x| x.p_ref)),
        ("p_cand", f(&|x| x.p_cand)),
        ("dp", f(&|x| x.dp())),
        ("copy", b(&|x| x.copy)),
        ("approximate", b(&|x| x.approximate)),
    ];
    Table {
        name: "kld_position",
        columns: columns
            .into_iter()
            .map(|(n, c)| (n.to_string(), c))
            .collect(),
    }
}
