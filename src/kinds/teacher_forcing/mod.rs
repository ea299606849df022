//! `kind = "teacher_forcing"`: the expected digits fed in after a prompt
//! (seed 000), every digit scored — log-prob, rank, margin, the first flip
//! vs the truth; with a reference model its KL and flips; the least certain
//! reference positions; the sampling forecast checked against seeded
//! sampled recitations; per-digit Parquet rows and an SVG plot.
//!
//! Contract: a digit without a token of its own is reported (E0), never
//! scored against a neighbour's row; a reference with another vocabulary or
//! token stream is an error before any scoring.

use crate::core::case::{metrics_of, Location, Metric};
use crate::core::error::{Error, Result};
use crate::core::parse::{case_table, parse_toml, Diagnostics};
use crate::core::present::{Cell, Field, Join, Presentation, ReportColumn};
use crate::core::{Artifact, Case, Outcome, Sampler, Settings};
use crate::engine::{LoadedModel, Token, TokenId, Window};
use crate::execute::observe::{mapped, Consumer, Mapped, Observation, Row};
use crate::execute::qgref::CacheHeader;
use crate::execute::reference::{rows_header, RefRows, Vocab};
use crate::execute::RunContext;
use crate::kinds::digit_rows::{DigitRow, DigitRows};
use crate::kinds::digit_text::{
    ids_sha256, piece_text, prompt_text, settings_for, tokenize, unit_tokens, Common, ExpectFile,
    Expected, Follow, Prompt, Template,
};
use crate::kinds::reference_rows::RowsBuild;
use crate::kinds::Kind;
use crate::kinds::{Finish, RefWork, Start};
use crate::measure::forecast;
use crate::measure::kld::{compare, RefPosition, DEFAULT_MAX_KEPT, DEFAULT_TAIL};
use crate::measure::stats::median;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use toml::Spanned;

mod trial;
use trial::*;
mod metrics;
use metrics::*;

/// Metrics of every teacher-forcing case.
pub(crate) const METRICS: &[&str] = &[
    "units",
    "units_measured",
    "own_token_units",
    "all_own_tokens",
    "prompt_tokens_match",
    "first_flip",
    "flips",
    "first_flip_margin",
    "logprob_mean",
    "p_true_mean",
    "margin_median",
];

/// How teacher-forcing cases show in the ladder report: per case, the
/// first unit whose true token is not the model's top pick, out of the
/// units (and, in the CSV, the flips, p(true) and the KL to the reference).
pub(crate) fn present() -> Option<Presentation> {
    let mut first = ReportColumn::new(
        "first flip",
        Cell::OutOf {
            part: "first_flip",
            whole: "units",
        },
    )
    .headline();
    first
        .csv
        .extend(["flips", "p_true_mean", "kl_mean"].map(|m| (m, Field::Metric(m))));
    Some(Presentation {
        kind: "teacher_forcing",
        join: Join::Case,
        columns: vec![first],
        plots: Vec::new(),
        legend: vec![
            "first flip CASE: fed the true text, the first unit whose true token is not the \
             model's top pick, out of the units, per teacher-forcing case.",
        ],
        align: None,
        hub: vec![],
        reference: vec![],
        unit: None,
    })
}

/// Metrics a teacher-forcing case adds with a reference model.
pub(crate) const REF_METRICS: &[&str] = &[
    "kl_mean",
    "kl_max",
    "kl_median",
    "top1_matches_ref",
    "top1_matches_ref_rate",
    "ref_first_flip",
    "ref_flips",
];

/// One sampler to forecast, and to check with seeded samples.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SamplerSpec {
    /// Name (metric prefix).
    pub name: String,
    /// The chain.
    pub sampler: Sampler,
    /// Sampled recitations to compare with the forecast (0: forecast only).
    pub samples: usize,
    /// Seed of the first sample; sample i uses `seed + i`.
    pub seed: u32,
}

/// A `kind = "teacher_forcing"` case.
#[derive(Debug, Clone)]
pub(crate) struct TeacherForcing {
    /// Raw or chat.
    pub template: Template,
    /// The continuation fed in after the prompt.
    pub expected: Expected,
    /// The prompt.
    pub prompt: Prompt,
    /// Reference model for `kl_vs_ref`.
    pub reference: Option<(String, Location)>,
    /// Rows per pass (padding), as the recite cases it is compared with.
    pub min_rows: u32,
    /// How many least-certain reference positions to list.
    pub least_certain: usize,
    /// Samplers to forecast.
    pub samplers: Vec<SamplerSpec>,
}

fn sampler_metrics(name: &str, sampled: bool) -> Vec<Metric> {
    let mut m = vec![Metric::float(format!("{name}_forecast_reach"))];
    if sampled {
        m.push(Metric::float(format!("{name}_sampled_reach_mean")));
        m.push(Metric::float(format!("{name}_sampled_reach_se")));
        m.push(Metric::count(format!("{name}_samples")));
    }
    m
}

/// The counts among [`METRICS`] and [`REF_METRICS`].
const COUNTS: &[&str] = &[
    "units",
    "units_measured",
    "own_token_units",
    "all_own_tokens",
    "prompt_tokens_match",
    "first_flip",
    "flips",
    "top1_matches_ref",
    "ref_first_flip",
    "ref_flips",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SamplerFile {
    name: Spanned<String>,
    temperature: Spanned<f32>,
    #[serde(default)]
    top_k: u32,
    top_p: Option<Spanned<f32>>,
    min_p: Option<Spanned<f32>>,
    samples: Option<Spanned<usize>>,
    #[serde(default)]
    seed: u32,
}

/// The most sampled recitations a sampler may ask for (each is a whole
/// generation).
pub(crate) const MAX_SAMPLES: usize = 10_000;

case_table! {
    struct TeacherForcingFile {
        template: Option<Spanned<String>>,
        format: Option<Spanned<String>>,
        expect: Spanned<ExpectFile>,
        prompt: Option<Spanned<String>>,
        min_rows: Option<Spanned<u32>>,
        least_certain: Option<usize>,
        #[serde(default)]
        sampler: Vec<SamplerFile>,
    }
}

/// Parse the kind's table.
pub fn parse(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>> {
    let f: TeacherForcingFile = parse_toml(diag.path(), src)?;
    let common = Common::parse(
        f.template.as_ref(),
        f.format.as_ref(),
        &f.expect,
        f.min_rows.as_ref(),
        diag,
    );
    let prompt = match &f.prompt {
        Some(p) => common.prompt("prompt", p.get_ref()),
        None => {
            diag.push_at(0, "give `prompt`");
            common.prompt("prompt", "")
        }
    };
    if f.prompt.is_some() && prompt.text.is_empty() {
        diag.push_at(0, "prompt: must not be empty");
    }
    let mut samplers = Vec::new();
    for s in &f.sampler {
        let n = s.name.get_ref();
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            diag.push_at(
                s.name.span().start,
                format!("sampler.name: `{n}` must be letters, digits or `_` (it prefixes metrics)"),
            );
        }
        if samplers.iter().any(|x: &SamplerSpec| x.name == *n) {
            diag.push_at(
                s.name.span().start,
                format!("sampler.name: `{n}` appears twice"),
            );
        }
        if let Some(n) = s.samples.as_ref().filter(|n| *n.get_ref() > MAX_SAMPLES) {
            diag.push_at(
                n.span().start,
                format!(
                    "sampler.samples: {} is more than {MAX_SAMPLES}",
                    n.get_ref()
                ),
            );
        }
        let t = *s.temperature.get_ref();
        if !(t > 0.0 && t <= 10.0) {
            diag.push_at(
                s.temperature.span().start,
                format!("sampler.temperature: {t} must be in (0, 10] (greedy is a recite case)"),
            );
        }
        let mut unit = |v: &Option<Spanned<f32>>, key: &str, dflt: f32| {
            v.as_ref().map_or(dflt, |x| {
                if !(0.0..=1.0).contains(x.get_ref()) {
                    diag.push_at(
                        x.span().start,
                        format!("sampler.{key}: {} must be in [0, 1]", x.get_ref()),
                    );
                }
                *x.get_ref()
            })
        };
        let top_p = unit(&s.top_p, "top_p", 1.0);
        let min_p = unit(&s.min_p, "min_p", 0.0);
        samplers.push(SamplerSpec {
            name: n.clone(),
            sampler: Sampler {
                temperature: t,
                top_k: s.top_k,
                top_p,
                min_p,
            },
            samples: s.samples.as_ref().map_or(0, |n| *n.get_ref()),
            seed: s.seed,
        });
    }
    Ok(Arc::new(TeacherForcing {
        template: common.template,
        expected: common.expected,
        prompt,
        reference: case.reference.clone(),
        min_rows: common.min_rows,
        least_certain: f.least_certain.unwrap_or(10),
        samplers,
    }))
}

/// What a reader calls a teacher-forcing case's metrics, and their units.
pub(crate) const TF_ABOUT: crate::core::case::About = &[
    ("units", "units", "units"),
    ("units_measured", "units measured", "units"),
    (
        "first_flip",
        "first unit whose true token is not the top pick",
        "units",
    ),
    (
        "flips",
        "units whose true token is not the top pick",
        "units",
    ),
    ("first_flip_margin", "margin at the first flip", "nats"),
    ("logprob_mean", "mean log-prob of the true tokens", "nats"),
    ("p_true_mean", "mean p(true token)", ""),
    ("margin_median", "median margin", "nats"),
    ("kl_mean", "KL mean to the reference", "nats"),
    ("kl_max", "KL max to the reference", "nats"),
    ("kl_median", "KL median to the reference", "nats"),
    ("ref_first_flip", "the reference's first flip", "units"),
    ("ref_flips", "the reference's flips", "units"),
];

impl Kind for TeacherForcing {
    fn about(&self) -> crate::core::case::About {
        TF_ABOUT
    }

    fn metrics(&self) -> Vec<Metric> {
        let mut m = metrics_of(METRICS, COUNTS);
        if self.reference.is_some() {
            m.extend(metrics_of(REF_METRICS, COUNTS));
        }
        for s in &self.samplers {
            m.extend(sampler_metrics(&s.name, s.samples > 0));
        }
        // KL against the reference's stored rows: within the store's error.
        m.into_iter()
            .map(
                |x| match crate::kinds::reference_rows::store_tolerance(&x.name) {
                    Some((t, why)) => x.with_tolerance(t, why),
                    None => x,
                },
            )
            .collect()
    }

    fn headline(&self) -> Vec<&'static str> {
        vec![
            "units",
            "first_flip",
            "flips",
            "p_true_mean",
            "logprob_mean",
            "kl_mean",
            "top1_matches_ref_rate",
        ]
    }

    fn observation(&self) -> Option<String> {
        Some(self.declared())
    }

    /// The one pass, and the sampled recitations (a few dozen tokens each).
    fn weight(&self) -> usize {
        self.expected.token_budget() + self.samplers.iter().map(|s| 24 * s.samples).sum::<usize>()
    }

    fn reference_observation(&self) -> Option<String> {
        self.reference.as_ref().map(|_| self.declared())
    }

    fn reference_work(&self, cx: &RunContext, case: &Case) -> Result<Option<RefWork>> {
        let Some((ref_alias, _)) = &self.reference else {
            return Ok(None);
        };
        let (_, rmodel) = cx.load(ref_alias)?;
        let rloc = locate(cx, &*rmodel, self, case)?;
        let ids: Vec<TokenId> = rloc.tokens.iter().map(|t| t.id).collect();
        let settings = settings_for(cx, &*rmodel, case, ids.len(), self.min_rows)?;
        let (window, unit_of_row) = tf_window(&rloc, &ids);
        let header = tf_rows_header(
            cx,
            ref_alias,
            &ids_sha256(&ids),
            &settings,
            &unit_of_row,
            rmodel.info().n_vocab,
        )?;
        let obs = Observation::new(rmodel.clone(), settings, vec![window.clone()]);
        Ok(tf_rows_build(header, &window, &unit_of_row, &*rmodel).work(cx, obs))
    }

    fn start(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<Start> {
        start_teacher_forcing(cx, case, self, alias, out)
    }
}

impl TeacherForcing {
    /// The observation as the case declares it: the template, prompt,
    /// expected text and padding that make the one teacher-forced pass.
    fn declared(&self) -> String {
        format!(
            "teacher-forcing {:?} prompt {:?} then {:?} min_rows={}",
            self.template,
            self.prompt.text,
            format!("{}{}", self.expected.lead, self.expected.body()),
            self.min_rows
        )
    }
}
