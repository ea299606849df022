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

/// Metrics of every teacher-forcing case.
pub const METRICS: &[&str] = &[
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

/// Metrics a teacher-forcing case adds with a reference model.
pub const REF_METRICS: &[&str] = &[
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
pub struct SamplerSpec {
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
pub struct TeacherForcing {
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
pub const MAX_SAMPLES: usize = 10_000;

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

impl Kind for TeacherForcing {
    fn metrics(&self) -> Vec<Metric> {
        let mut m = metrics_of(METRICS, COUNTS);
        if self.reference.is_some() {
            m.extend(metrics_of(REF_METRICS, COUNTS));
        }
        for s in &self.samplers {
            m.extend(sampler_metrics(&s.name, s.samples > 0));
        }
        m
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

/// Rank of the true token (tokens with a strictly higher logit) and its
/// margin (its logit minus the best other's, f64), in one pass.
fn rank_and_margin(row: &[f32], target: usize) -> (i64, f64) {
    let t = row[target];
    let (mut rank, mut best_other) = (0i64, f32::NEG_INFINITY);
    for (j, &v) in row.iter().enumerate() {
        if j != target {
            rank += i64::from(v > t);
            best_other = best_other.max(v);
        }
    }
    (rank, f64::from(t) - f64::from(best_other))
}

/// The reference's margin at a stored position (exact: its top entries
/// are stored with their f32 logits, and the tail's largest logit too).
fn ref_margin(r: &RefPosition, target: u32) -> f64 {
    let best_other = r
        .entries
        .iter()
        .find(|(j, _)| *j != target)
        .map(|&(_, l)| l)
        .or_else(|| r.tail.as_ref().map(|t| t.hi))
        .unwrap_or(f32::NEG_INFINITY);
    r.lp_true - r.lp(best_other)
}

/// The one window of a teacher-forced text, and the row before each
/// located unit's token (row → unit).
fn tf_window(loc: &Located, ids: &[TokenId]) -> (Window, BTreeMap<usize, usize>) {
    let mut unit_of_row: BTreeMap<usize, usize> = BTreeMap::new();
    for (k, (_, tok)) in loc.units.iter().enumerate() {
        if let Some(i) = tok {
            unit_of_row.insert(i - 1, k);
        }
    }
    let first_row = unit_of_row.keys().next().copied().unwrap_or(ids.len() - 1);
    let window = Window {
        tokens: ids.to_vec(),
        logits_from: first_row,
    };
    (window, unit_of_row)
}

/// Start a `teacher_forcing` case: load, locate the units, take the
/// reference's rows from the store; the rows are read by [`TfTrial`].
fn start_teacher_forcing(
    cx: &RunContext,
    case: &Case,
    t: &TeacherForcing,
    alias: &str,
    out: &mut Outcome,
) -> Result<Start> {
    let t0 = Instant::now();
    let (verified, model) = cx.load(alias)?;
    out.timings.prepare = t0.elapsed();
    out.model_sha256 = Some(verified.file.sha256.clone());
    let t0 = Instant::now();
    let loc = locate(cx, &*model, t, case)?;
    let ids: Vec<TokenId> = loc.tokens.iter().map(|t| t.id).collect();
    let stream = ids_sha256(&ids);
    out.token_stream_sha256 = Some(stream.clone());
    out.timings.tokenize = t0.elapsed();
    let settings = settings_for(cx, &*model, case, ids.len(), t.min_rows)?;
    out.settings = Some(settings.clone());
    let (window, unit_of_row) = tf_window(&loc, &ids);
    let t0 = Instant::now();
    let reference = match &t.reference {
        Some(r) => Some(tf_reference(
            cx,
            case,
            t,
            &*model,
            r,
            &settings,
            &window,
            &unit_of_row,
            &stream,
        )?),
        None => None,
    };
    out.timings.decode += t0.elapsed();
    let obs = Observation::new(model.clone(), settings.clone(), vec![window]);
    let n_units = loc.units.len();
    Ok(Start::Observe(
        obs,
        Box::new(TfTrial {
            t: t.clone(),
            case: case.clone(),
            alias: alias.to_string(),
            model,
            settings,
            loc,
            ids,
            unit_of_row,
            reference,
            rows: vec![None; n_units],
        }),
    ))
}

/// A teacher-forcing trial reading the rows of its one pass.
struct TfTrial {
    t: TeacherForcing,
    case: Case,
    alias: String,
    model: Arc<dyn LoadedModel>,
    settings: Settings,
    loc: Located,
    ids: Vec<TokenId>,
    unit_of_row: BTreeMap<usize, usize>,
    reference: Option<Arc<RefRows>>,
    rows: Vec<Option<DigitRow>>,
}

impl Consumer for TfTrial {
    fn wants_exps(&self) -> bool {
        self.reference.is_some()
    }

    /// A unit's row: rank, margin, the comparison with the reference row and
    /// the samplers' chances, on any thread.
    fn map(&self, r: &Row<'_>) -> Result<Mapped> {
        let (pos, row, st) = (r.pos, r.logits, r.stats);
        let Some(&k) = self.unit_of_row.get(&pos) else {
            return Ok(None);
        };
        let target = self.ids[pos + 1] as usize;
        let top = st.argmax;
        let (rank, margin) = rank_and_margin(row, target);
        let (kl, matches, rmargin) = match &self.reference {
            Some(refs) => {
                // The reference holds the units' rows in position order.
                let at = self.unit_of_row.range(..pos).count();
                let rp = &refs.rows[at];
                let c = compare(rp, row, st, r.exps, target, false);
                (c.kl, c.ref_top == top as u32, ref_margin(rp, target as u32))
            }
            None => (f64::NAN, false, f64::NAN),
        };
        let tok = &self.loc.tokens[pos + 1];
        let units = &self.t.expected.units;
        Ok(Some(Box::new(DigitRow {
            unit: k as u32,
            char_offset: self.loc.units[k].0 as u32,
            token_index: (pos + 1) as i32,
            token_id: tok.id,
            piece: String::from_utf8_lossy(&tok.piece).into_owned(),
            own_token: String::from_utf8_lossy(&tok.piece).trim() == units[k],
            logprob: st.logprob(row, target),
            rank,
            margin,
            top1_token: top as TokenId,
            top1_piece: piece_text(&*self.model, top as TokenId),
            kl_vs_ref: kl,
            top1_matches_ref: matches,
            ref_margin: rmargin,
            ref_odds_percentile: f64::NAN,
            p_pick: self
                .t
                .samplers
                .iter()
                .map(|s| forecast::p_pick(row, &s.sampler, target))
                .collect(),
        })))
    }

    fn absorb(&mut self, r: &Row<'_>, m: Mapped) -> Result<()> {
        if let Some(&k) = self.unit_of_row.get(&r.pos) {
            let row = mapped::<DigitRow>(m)
                .ok_or_else(|| Error::harness("a unit's row was not measured"))?;
            self.rows[k] = Some(row);
        }
        Ok(())
    }
}

impl Finish for TfTrial {
    fn finish(self: Box<Self>, _cx: &RunContext, out: &mut Outcome) -> Result<()> {
        let TfTrial {
            t,
            case,
            alias,
            model,
            settings,
            loc,
            unit_of_row,
            reference,
            rows,
            ..
        } = *self;
        let t0 = Instant::now();
        let samplers: Vec<&SamplerSpec> = t.samplers.iter().collect();
        let measured = rows.iter().flatten().count();
        if measured == 0 {
            return Err(Error::input(format!(
                "{}: no unit of the expected text starts a token of `{alias}`: nothing to score \
                 (the tokenizer merges the units with their neighbours)",
                case.path.display()
            )));
        }
        if measured != unit_of_row.len() {
            return Err(Error::harness(format!(
                "{}: scored {measured} of {} located units",
                case.path.display(),
                unit_of_row.len()
            )));
        }
        // A unit without a token of its own keeps a row, with nothing scored.
        let mut rows: Vec<DigitRow> = rows
            .into_iter()
            .enumerate()
            .map(|(k, r)| {
                r.unwrap_or_else(|| DigitRow {
                    unit: k as u32,
                    char_offset: loc.units[k].0 as u32,
                    token_index: -1,
                    token_id: -1,
                    piece: String::new(),
                    own_token: false,
                    logprob: f64::NAN,
                    rank: -1,
                    margin: f64::NAN,
                    top1_token: -1,
                    top1_piece: String::new(),
                    kl_vs_ref: f64::NAN,
                    top1_matches_ref: false,
                    ref_margin: f64::NAN,
                    ref_odds_percentile: f64::NAN,
                    p_pick: vec![f64::NAN; samplers.len()],
                })
            })
            .collect();
        tf_metrics(&t, &loc, &mut rows, reference.is_some(), out);
        out.timings.measure += t0.elapsed();
        if !samplers.is_empty() {
            sampling(&case, &t, &*model, &loc, &rows, &settings, out)?;
        }
        let t0 = Instant::now();
        let rows = DigitRows {
            rows,
            samplers: samplers.iter().map(|s| s.name.clone()).collect(),
            reference: reference.is_some(),
        };
        // The per-digit plot beside the rows.
        let first_flip = out.metrics.get("first_flip").map(|f| *f as usize);
        let title = format!("{}::{alias}", case.name);
        out.artifacts.push(Artifact {
            extension: "svg",
            body: rows.svg(&title, first_flip),
        });
        out.rows = Some(Arc::new(rows.table()));
        out.timings.measure += t0.elapsed();
        Ok(())
    }
}

/// The `.qgref` header of a reference's rows at the units' positions.
fn tf_rows_header(
    cx: &RunContext,
    ref_alias: &str,
    stream: &str,
    settings: &Settings,
    unit_of_row: &BTreeMap<usize, usize>,
    n_vocab: usize,
) -> Result<CacheHeader> {
    let ref_sha = cx.pinned_sha256(ref_alias)?;
    let rows_wanted: Vec<usize> = unit_of_row.keys().copied().collect();
    Ok(rows_header(
        ref_sha,
        stream,
        format!("teacher-forcing rows {rows_wanted:?}"),
        settings,
        cx.identity_of(ref_alias),
        DEFAULT_TAIL,
        DEFAULT_MAX_KEPT,
        rows_wanted.len(),
        n_vocab,
    ))
}

/// The builder of a reference's rows at the units' positions.
fn tf_rows_build(
    header: CacheHeader,
    window: &Window,
    unit_of_row: &BTreeMap<usize, usize>,
    reference: &dyn LoadedModel,
) -> RowsBuild {
    let wanted = unit_of_row
        .keys()
        .map(|&pos| (0, pos, window.tokens[pos + 1] as usize))
        .collect();
    let ri = reference.info();
    RowsBuild::new(
        header,
        wanted,
        (DEFAULT_TAIL, DEFAULT_MAX_KEPT),
        ri.n_vocab,
        ri.tokenizer_fingerprint.clone(),
    )
}

/// The reference's rows at the units' positions, through the reference store.
#[allow(clippy::too_many_arguments)]
fn tf_reference(
    cx: &RunContext,
    case: &Case,
    t: &TeacherForcing,
    model: &dyn LoadedModel,
    (ref_alias, ref_at): &(String, Location),
    settings: &Settings,
    window: &Window,
    unit_of_row: &BTreeMap<usize, usize>,
    stream: &str,
) -> Result<Arc<RefRows>> {
    let ci = model.info();
    let header = tf_rows_header(cx, ref_alias, stream, settings, unit_of_row, ci.n_vocab)
        .map_err(|e| e.context(ref_at))?;
    let at = (ref_alias.as_str(), ref_at);
    cx.references
        .rows(&header, &case.path, at, Vocab::of(ci), &|| {
            let (_, rmodel) = cx.load_reference(at, Vocab::of(ci))?;
            let rloc = locate(cx, &*rmodel, t, case)?;
            let rids: Vec<TokenId> = rloc.tokens.iter().map(|t| t.id).collect();
            if rids != window.tokens {
                return Err(Error::input(format!(
                    "{ref_at}: reference: `{ref_alias}` and `{}` do not score identical tokens \
                 ({} vs {} tokens)",
                    ci.file.alias,
                    rids.len(),
                    window.tokens.len()
                )));
            }
            let obs = Observation::new(rmodel.clone(), settings.clone(), vec![window.clone()]);
            tf_rows_build(header.clone(), window, unit_of_row, &*rmodel).decode(&obs)
        })
}

fn tf_metrics(
    t: &TeacherForcing,
    loc: &Located,
    rows: &mut [DigitRow],
    with_ref: bool,
    out: &mut Outcome,
) {
    let measured: Vec<&DigitRow> = rows.iter().filter(|r| r.token_index >= 0).collect();
    let n = rows.len();
    let own = rows.iter().filter(|r| r.own_token).count();
    let prefix = loc.tokens.len() >= loc.prompt_ids.len()
        && loc
            .tokens
            .iter()
            .zip(&loc.prompt_ids)
            .all(|(a, &b)| a.id == b);
    // A unit without a token of its own stops the first-flip walk: its
    // recitation cannot be compared token for token.
    let first_flip = rows
        .iter()
        .position(|r| !r.own_token || r.rank > 0)
        .unwrap_or(n);
    let m = &mut out.metrics;
    m.insert("units".into(), n as f64);
    m.insert("units_measured".into(), measured.len() as f64);
    m.insert("own_token_units".into(), own as f64);
    m.insert("all_own_tokens".into(), f64::from(u8::from(own == n)));
    m.insert("prompt_tokens_match".into(), f64::from(u8::from(prefix)));
    m.insert("first_flip".into(), first_flip as f64);
    m.insert(
        "flips".into(),
        measured.iter().filter(|r| r.rank > 0).count() as f64,
    );
    if let Some(r) = rows.get(first_flip) {
        if r.token_index >= 0 {
            m.insert("first_flip_margin".into(), r.margin);
        }
    }
    let nm = measured.len() as f64;
    m.insert(
        "logprob_mean".into(),
        measured.iter().map(|r| r.logprob).sum::<f64>() / nm,
    );
    m.insert(
        "p_true_mean".into(),
        measured.iter().map(|r| r.logprob.exp()).sum::<f64>() / nm,
    );
    m.insert(
        "margin_median".into(),
        median(measured.iter().map(|r| r.margin).collect()),
    );
    let mut tx = BTreeMap::new();
    let not_own: Vec<String> = rows
        .iter()
        .filter(|r| !r.own_token)
        .take(10)
        .map(|r| {
            if r.token_index < 0 {
                format!("{} (no token starts there)", r.unit)
            } else {
                format!("{} ({:?})", r.unit, r.piece)
            }
        })
        .collect();
    tx.insert(
        "e0_own_tokens".into(),
        if not_own.is_empty() {
            format!("every unit is its own token ({n} units)")
        } else {
            format!(
                "{} of {n} units are not their own token; first: {}",
                n - own,
                not_own.join(", ")
            )
        },
    );
    if with_ref {
        let kls: Vec<f64> = measured.iter().map(|r| r.kl_vs_ref).collect();
        m.insert("kl_mean".into(), kls.iter().sum::<f64>() / nm);
        m.insert(
            "kl_max".into(),
            kls.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
        m.insert("kl_median".into(), median(kls));
        let matches = measured.iter().filter(|r| r.top1_matches_ref).count();
        m.insert("top1_matches_ref".into(), matches as f64);
        m.insert("top1_matches_ref_rate".into(), matches as f64 / nm);
        let ref_first = rows
            .iter()
            .position(|r| !r.own_token || r.ref_margin <= 0.0 || r.ref_margin.is_nan())
            .unwrap_or(n);
        m.insert("ref_first_flip".into(), ref_first as f64);
        m.insert(
            "ref_flips".into(),
            measured.iter().filter(|r| r.ref_margin <= 0.0).count() as f64,
        );
        // Percentile of each position's reference odds (0 = least certain).
        let mut order: Vec<usize> = (0..rows.len())
            .filter(|&k| rows[k].token_index >= 0)
            .collect();
        order.sort_by(|&a, &b| {
            rows[a]
                .ref_margin
                .total_cmp(&rows[b].ref_margin)
                .then(a.cmp(&b))
        });
        let denom = (order.len().max(2) - 1) as f64;
        for (rank, &k) in order.iter().enumerate() {
            rows[k].ref_odds_percentile = 100.0 * rank as f64 / denom;
        }
        let least: Vec<String> = order
            .iter()
            .take(t.least_certain)
            .map(|&k| {
                let r = &rows[k];
                format!(
                    "{k}: ref odds {}, model odds {}, kl {:.3e}",
                    odds(r.ref_margin),
                    odds(r.margin),
                    r.kl_vs_ref
                )
            })
            .collect();
        tx.insert("least_certain_ref".into(), least.join("; "));
    }
    out.texts.extend(tx);
}

/// Odds e^margin as the seed writes them (`0.2x`, `5600x`).
fn odds(margin: f64) -> String {
    let o = margin.exp();
    if o >= 100.0 {
        format!("{o:.0}x")
    } else if o >= 1.0 {
        format!("{o:.2}x")
    } else {
        format!("{o:.3}x")
    }
}

/// The forecast from the teacher-forced chances, and seeded sampled
/// recitations through llama.cpp's sampler chain beside it.
#[allow(clippy::too_many_arguments)]
fn sampling(
    case: &Case,
    t: &TeacherForcing,
    model: &dyn LoadedModel,
    loc: &Located,
    rows: &[DigitRow],
    settings: &Settings,
    out: &mut Outcome,
) -> Result<()> {
    let all_own = rows.iter().all(|r| r.own_token);
    let mut lines = Vec::new();
    for (i, s) in t.samplers.iter().enumerate() {
        if !all_own {
            lines.push(format!(
                "{}: no forecast: not every unit is its own token (see e0_own_tokens)",
                s.name
            ));
            continue;
        }
        let q: Vec<f64> = rows.iter().map(|r| r.p_pick[i]).collect();
        let forecast = forecast::expected_reach(&q);
        out.metrics
            .insert(format!("{}_forecast_reach", s.name), forecast);
        if s.samples == 0 {
            lines.push(format!("{}: forecast reach {forecast:.2}", s.name));
            continue;
        }
        let max_new = t.expected.token_budget();
        // Sampling passes are never padded (the engine decodes them one
        // token at a time); the context only needs the prompt and the budget.
        let plain = Settings {
            n_ctx: (loc.prompt_ids.len() + max_new + 8).div_ceil(256) as u32 * 256,
            ..settings.clone()
        };
        let t0 = Instant::now();
        let seeds: Vec<u32> = (0..s.samples)
            .map(|k| s.seed.wrapping_add(k as u32))
            .collect();
        let mut follows: Vec<Follow> = seeds
            .iter()
            .map(|_| Follow::new(&t.expected, t.template))
            .collect();
        model
            .sample_many(
                &plain,
                &loc.prompt_ids,
                max_new,
                &s.sampler,
                &seeds,
                &mut |k, gen| {
                    let Some(&last) = gen.last() else {
                        return false;
                    };
                    let r = follows[k].push(&piece_text(model, last));
                    r.complete || r.departs_at.is_some()
                },
            )
            .map_err(|e| e.context(case.path.display()))?;
        let reached: Vec<f64> = follows.iter().map(|f| f.reach().correct as f64).collect();
        out.timings.decode += t0.elapsed();
        let n = reached.len() as f64;
        let mean = reached.iter().sum::<f64>() / n;
        let var = reached.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        let se = (var / n).sqrt();
        out.metrics
            .insert(format!("{}_sampled_reach_mean", s.name), mean);
        out.metrics
            .insert(format!("{}_sampled_reach_se", s.name), se);
        out.metrics.insert(format!("{}_samples", s.name), n);
        // The survival curve at a few depths: forecast beside observed.
        let surv = forecast::survival(&q);
        let at: Vec<String> = [1usize, 5, 20]
            .iter()
            .filter(|&&k| k < surv.len())
            .map(|&k| {
                let seen = reached.iter().filter(|&&r| r >= k as f64).count();
                format!("P(≥{k}) {:.3} vs {seen}/{}", surv[k], reached.len())
            })
            .collect();
        lines.push(format!(
            "{}: forecast reach {forecast:.2}, sampled {mean:.2} ± {se:.2} (n = {}, seeds {}..{}); {}",
            s.name,
            s.samples,
            s.seed,
            s.seed.wrapping_add(s.samples as u32 - 1),
            at.join(", ")
        ));
    }
    out.texts.insert("sampling".into(), lines.join("; "));
    Ok(())
}

/// The scored text of a teacher-forced case and where each unit's token is.
struct Located {
    tokens: Vec<Token>,
    prompt_ids: Vec<TokenId>,
    /// Per unit: (byte offset in the text, token index or None).
    units: Vec<(usize, Option<usize>)>,
}

fn locate(
    cx: &RunContext,
    model: &dyn LoadedModel,
    t: &TeacherForcing,
    case: &Case,
) -> Result<Located> {
    let prompt = prompt_text(cx, model, t.template, &t.prompt)?;
    let text = format!("{prompt}{}{}", t.expected.lead, t.expected.body());
    let tokens = tokenize(model, t.template, &text)?;
    let prompt_ids: Vec<TokenId> = tokenize(model, t.template, &prompt)?
        .iter()
        .map(|t| t.id)
        .collect();
    let starts: Vec<usize> = t
        .expected
        .spans()
        .iter()
        .map(|&(a, _)| prompt.len() + a)
        .collect();
    let found = unit_tokens(text.as_bytes(), &starts, &tokens);
    let units = starts
        .into_iter()
        .zip(found)
        .map(|(a, i)| (a, i.filter(|&i| i > 0)))
        .collect();
    if tokens.iter().all(|t| t.offset.is_none()) {
        return Err(Error::harness(format!(
            "{}: the pieces of `{}` do not spell the text; units cannot be located",
            case.path.display(),
            model.info().file.alias
        )));
    }
    Ok(Located {
        tokens,
        prompt_ids,
        units,
    })
}
