//! Parse stage for the digit experiments of seed 000: `kind = "recite"`
//! (free greedy generation) and `kind = "teacher_forcing"` (the true text
//! fed in, every digit scored).
//!
//! Contract: like [`crate::case::parse_case`]: unknown keys, wrong types,
//! keys a kind does not take, bad samplers and gates on metrics the case
//! does not produce are errors naming `path:line:col`; expected text is
//! computed here (digit sources) and never read from a model.

use crate::case::{gates_and_tolerances, Case, GateFile, Location, Spec, Tolerance};
use crate::engine::{Decoding, Sampler};
use crate::error::{Error, Result};
use crate::parse::parse_toml;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use toml::Spanned;

/// Digit sources an expected text can name.
pub const SOURCES: &[&str] = &["pi", "e", "sqrt2", "random", "seed000"];

/// Metrics of every recite case.
pub const RECITE_METRICS: &[&str] = &[
    "first_error",
    "digits_correct",
    "complete",
    "units_expected",
    "tokens_generated",
    "max_tokens_reached",
    "error_gap",
];

/// Metrics of every teacher-forcing case.
pub const TF_METRICS: &[&str] = &[
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
pub const TF_REF_METRICS: &[&str] = &[
    "kl_mean",
    "kl_max",
    "kl_median",
    "top1_matches_ref",
    "top1_matches_ref_rate",
    "ref_first_flip",
    "ref_flips",
];

/// How the prompt reaches the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// As raw text; the model continues it.
    Raw,
    /// Through the model's chat template, as one user message.
    Chat,
}

/// How the expected units are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One character per unit, nothing between.
    Digits,
    /// English words (`zero` … `nine`), single spaces between.
    Words,
}

/// The text a model is expected to produce.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// Where it comes from (`pi`, `random(seed=7)`, `literal`).
    pub source: String,
    /// Text before the counted units (e.g. `3.`), part of the expected text.
    pub lead: String,
    /// The units: one digit (or character) each, or one word each.
    pub units: Vec<String>,
    /// The digits the units spell (for prompts' `{digits}`).
    pub digits: String,
    /// How the units are joined.
    pub format: Format,
}

impl Expected {
    /// The units as written: concatenated, or words joined by spaces.
    pub fn body(&self) -> String {
        match self.format {
            Format::Digits => self.units.concat(),
            Format::Words => self.units.join(" "),
        }
    }

    /// Tokens enough to write the expected text, with 16 to spare: a
    /// token per character of the lead and per digit, three per word.
    pub fn token_budget(&self) -> usize {
        let per_unit = if self.format == Format::Words { 3 } else { 1 };
        (self.lead.len() + self.units.len()) * per_unit + 16
    }

    /// Byte span of each unit in `lead + body`.
    pub fn spans(&self) -> Vec<(usize, usize)> {
        let mut at = self.lead.len();
        let sep = usize::from(self.format == Format::Words);
        self.units
            .iter()
            .map(|u| {
                let s = (at, at + u.len());
                at += u.len() + sep;
                s
            })
            .collect()
    }
}

/// One wording of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// Its name (test-name suffix when a case has several).
    pub name: String,
    /// The text, `{digits}` already replaced.
    pub text: String,
}

/// A `kind = "recite"` case.
#[derive(Debug, Clone)]
pub struct Recite {
    /// Raw or chat.
    pub template: Template,
    /// What should come out.
    pub expected: Expected,
    /// The wordings; the planner gives each its own test.
    pub prompts: Vec<Prompt>,
    /// Generation cap.
    pub max_tokens: usize,
    /// Batch-invariant (default) or token-at-a-time decoding.
    pub decoding: Decoding,
    /// Rows per pass of the invariant mode (and of the matching teacher forcing).
    pub min_rows: u32,
    /// Tokens generated after the first error, for the golden's text.
    pub tail: usize,
}

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

impl TeacherForcing {
    /// The metrics this case produces.
    pub fn metrics(&self) -> Vec<String> {
        let mut m: Vec<String> = TF_METRICS.iter().map(|s| s.to_string()).collect();
        if self.reference.is_some() {
            m.extend(TF_REF_METRICS.iter().map(|s| s.to_string()));
        }
        for s in &self.samplers {
            m.extend(sampler_metrics(&s.name, s.samples > 0));
        }
        m
    }
}

fn sampler_metrics(name: &str, sampled: bool) -> Vec<String> {
    let mut m = vec![format!("{name}_forecast_reach")];
    if sampled {
        m.push(format!("{name}_sampled_reach_mean"));
        m.push(format!("{name}_sampled_reach_se"));
        m.push(format!("{name}_samples"));
    }
    m
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DigitFile {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    description: String,
    models: Spanned<Vec<Spanned<String>>>,
    template: Option<Spanned<String>>,
    format: Option<Spanned<String>>,
    expect: Spanned<ExpectFile>,
    prompt: Option<Spanned<String>>,
    prompts: Option<Spanned<Vec<PromptFile>>>,
    max_tokens: Option<Spanned<usize>>,
    decoding: Option<Spanned<String>>,
    min_rows: Option<Spanned<u32>>,
    tail: Option<usize>,
    reference: Option<Spanned<String>>,
    least_certain: Option<usize>,
    #[serde(default)]
    sampler: Vec<SamplerFile>,
    #[serde(default)]
    gate: Vec<GateFile>,
    #[serde(default)]
    tolerance: BTreeMap<String, Spanned<Tolerance>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectFile {
    source: Option<Spanned<String>>,
    count: Option<Spanned<usize>>,
    seed: Option<u64>,
    literal: Option<Spanned<String>>,
    #[serde(default)]
    lead: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptFile {
    name: Spanned<String>,
    text: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SamplerFile {
    name: Spanned<String>,
    temperature: Spanned<f32>,
    #[serde(default)]
    top_k: u32,
    top_p: Option<Spanned<f32>>,
    min_p: Option<Spanned<f32>>,
    #[serde(default)]
    samples: usize,
    #[serde(default)]
    seed: u32,
}

/// Parse a `recite` or `teacher_forcing` case (the caller read `kind`).
pub fn parse(path: &Path, name: &str, src: &str, kind: &str, sha: String) -> Result<Case> {
    let f: DigitFile = parse_toml(path, src)?;
    let at = |offset: usize| {
        let (l, c) = crate::fsutil::line_col(src, offset);
        Location(format!("{}:{l}:{c}", path.display()))
    };
    let mut errors = Vec::new();
    let mut err = |loc: Location, msg: String| errors.push(Error::input(format!("{loc}: {msg}")));
    let recite = kind == "recite";
    if f.models.get_ref().is_empty() {
        err(
            at(f.models.span().start),
            "models: list at least one model alias".into(),
        );
    }
    // Keys the other kind takes.
    let foreign: Vec<(&str, Option<usize>)> = if recite {
        vec![
            ("reference", f.reference.as_ref().map(|v| v.span().start)),
            (
                "least_certain",
                f.least_certain.map(|_| f.models.span().start),
            ),
            (
                "sampler",
                (!f.sampler.is_empty()).then(|| f.sampler[0].name.span().start),
            ),
        ]
    } else {
        vec![
            ("prompts", f.prompts.as_ref().map(|v| v.span().start)),
            ("max_tokens", f.max_tokens.as_ref().map(|v| v.span().start)),
            ("decoding", f.decoding.as_ref().map(|v| v.span().start)),
            ("tail", f.tail.map(|_| f.models.span().start)),
        ]
    };
    for (key, pos) in foreign {
        if let Some(pos) = pos {
            err(
                at(pos),
                format!("{key}: a kind = \"{kind}\" case does not take it"),
            );
        }
    }
    let template = choice(
        &f.template,
        "template",
        &[("raw", Template::Raw), ("chat", Template::Chat)],
        &at,
        &mut err,
    );
    let format = choice(
        &f.format,
        "format",
        &[("digits", Format::Digits), ("words", Format::Words)],
        &at,
        &mut err,
    );
    let expected = expected(&f.expect, format, &at, &mut err);
    let subst = |t: &str| t.replace("{digits}", &expected.digits);
    let mut prompts = Vec::new();
    match (&f.prompt, &f.prompts) {
        (Some(p), None) => prompts.push(Prompt {
            name: "prompt".into(),
            text: subst(p.get_ref()),
        }),
        (None, Some(list)) if recite => {
            if list.get_ref().is_empty() {
                err(at(list.span().start), "prompts: list at least one".into());
            }
            for p in list.get_ref() {
                let n = p.name.get_ref();
                let ok = !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !ok {
                    err(
                        at(p.name.span().start),
                        format!("prompts.name: `{n}` must be letters, digits, `-` or `_` (it names a test)"),
                    );
                }
                if prompts.iter().any(|q: &Prompt| q.name == *n) {
                    err(
                        at(p.name.span().start),
                        format!("prompts.name: `{n}` appears twice"),
                    );
                }
                prompts.push(Prompt {
                    name: n.clone(),
                    text: subst(&p.text),
                });
            }
        }
        (None, Some(_)) => {}
        _ => err(
            at(0),
            if recite {
                "give exactly one of `prompt` (one wording) or [[prompts]] (several)".into()
            } else {
                "give `prompt`".into()
            },
        ),
    }
    if prompts.iter().any(|p| p.text.is_empty()) {
        err(at(0), "prompt: must not be empty".into());
    }
    let min_rows = f.min_rows.as_ref().map_or(32, |m| *m.get_ref());
    if let Some(m) = &f.min_rows {
        if !(1..=512).contains(m.get_ref()) {
            err(
                at(m.span().start),
                format!("min_rows: {} must be between 1 and 512", m.get_ref()),
            );
        }
    }
    let reference = f
        .reference
        .as_ref()
        .map(|r| (r.get_ref().clone(), at(r.span().start)));
    let spec = if recite {
        let decoding = choice(
            &f.decoding,
            "decoding",
            &[
                ("invariant", Decoding::Invariant),
                ("incremental", Decoding::Incremental),
            ],
            &at,
            &mut err,
        );
        let max_tokens = f
            .max_tokens
            .as_ref()
            .map_or(expected.token_budget(), |m| *m.get_ref());
        if max_tokens == 0 {
            err(
                at(f.max_tokens.as_ref().map_or(0, |m| m.span().start)),
                "max_tokens: must be ≥ 1".into(),
            );
        }
        Spec::Recite(Recite {
            template,
            expected,
            prompts,
            max_tokens,
            decoding,
            min_rows,
            tail: f.tail.unwrap_or(8),
        })
    } else {
        let mut samplers = Vec::new();
        for s in &f.sampler {
            let n = s.name.get_ref();
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                err(
                    at(s.name.span().start),
                    format!(
                        "sampler.name: `{n}` must be letters, digits or `_` (it prefixes metrics)"
                    ),
                );
            }
            if samplers.iter().any(|x: &SamplerSpec| x.name == *n) {
                err(
                    at(s.name.span().start),
                    format!("sampler.name: `{n}` appears twice"),
                );
            }
            let t = *s.temperature.get_ref();
            if !(t > 0.0 && t <= 10.0) {
                err(
                    at(s.temperature.span().start),
                    format!(
                        "sampler.temperature: {t} must be in (0, 10] (greedy is a recite case)"
                    ),
                );
            }
            let unit = |v: &Option<Spanned<f32>>,
                        key: &str,
                        dflt: f32,
                        err: &mut dyn FnMut(Location, String)| {
                v.as_ref().map_or(dflt, |x| {
                    if !(0.0..=1.0).contains(x.get_ref()) {
                        err(
                            at(x.span().start),
                            format!("sampler.{key}: {} must be in [0, 1]", x.get_ref()),
                        );
                    }
                    *x.get_ref()
                })
            };
            let top_p = unit(&s.top_p, "top_p", 1.0, &mut err);
            let min_p = unit(&s.min_p, "min_p", 0.0, &mut err);
            samplers.push(SamplerSpec {
                name: n.clone(),
                sampler: Sampler {
                    temperature: t,
                    top_k: s.top_k,
                    top_p,
                    min_p,
                },
                samples: s.samples,
                seed: s.seed,
            });
        }
        Spec::TeacherForcing(TeacherForcing {
            template,
            expected,
            prompt: prompts.into_iter().next().unwrap_or(Prompt {
                name: "prompt".into(),
                text: String::new(),
            }),
            reference,
            min_rows,
            least_certain: f.least_certain.unwrap_or(10),
            samplers,
        })
    };
    let metrics: Vec<String> = match &spec {
        Spec::TeacherForcing(t) => t.metrics(),
        _ => RECITE_METRICS.iter().map(|s| s.to_string()).collect(),
    };
    let metrics: Vec<&str> = metrics.iter().map(String::as_str).collect();
    let (gates, tolerances) =
        gates_and_tolerances(&f.gate, &f.tolerance, &metrics, kind, &at, &mut err);
    if !errors.is_empty() {
        return Err(crate::error::join(errors));
    }
    Ok(Case {
        name: name.to_string(),
        path: path.to_path_buf(),
        content_sha256: sha,
        description: f.description,
        models: f
            .models
            .get_ref()
            .iter()
            .map(|m| (m.get_ref().clone(), at(m.span().start)))
            .collect(),
        spec,
        gates,
        tolerances,
        prereg: None,
    })
}

/// A value from a closed set: the first option when absent; otherwise an
/// error listing the options (and the first option, to go on checking).
fn choice<T: Copy>(
    value: &Option<Spanned<String>>,
    key: &str,
    options: &[(&str, T)],
    at: &dyn Fn(usize) -> Location,
    err: &mut dyn FnMut(Location, String),
) -> T {
    let Some(v) = value else {
        return options[0].1;
    };
    match options.iter().find(|(name, _)| *name == v.get_ref()) {
        Some(&(_, t)) => t,
        None => {
            let names: Vec<&str> = options.iter().map(|o| o.0).collect();
            err(
                at(v.span().start),
                format!(
                    "{key}: `{}` is not one of {}",
                    v.get_ref(),
                    names.join(", ")
                ),
            );
            options[0].1
        }
    }
}

fn expected(
    e: &Spanned<ExpectFile>,
    format: Format,
    at: &dyn Fn(usize) -> Location,
    err: &mut dyn FnMut(Location, String),
) -> Expected {
    let f = e.get_ref();
    let here = at(e.span().start);
    let (source, digits): (String, String) = match (&f.source, &f.literal) {
        (Some(s), None) => {
            let n = f.count.as_ref().map_or(0, |c| *c.get_ref());
            if f.count.is_none() || n == 0 {
                err(
                    here.clone(),
                    "expect: a digit source needs `count` ≥ 1".into(),
                );
            }
            if n > 100_000 {
                err(
                    at(f.count.as_ref().map_or(0, |c| c.span().start)),
                    format!("expect.count: {n} is more than 100000"),
                );
            }
            let decimals = |s: String| {
                s.split_once('.')
                    .map(|x| x.1.to_string())
                    .unwrap_or_default()
            };
            let n = n.min(100_000);
            match s.get_ref().as_str() {
                "pi" => ("pi".into(), decimals(crate::digits::pi(n))),
                "e" => ("e".into(), decimals(crate::digits::e(n))),
                "sqrt2" => ("sqrt2".into(), decimals(crate::digits::sqrt2(n))),
                "random" => {
                    let Some(seed) = f.seed else {
                        err(
                            here.clone(),
                            "expect: source = \"random\" needs `seed`".into(),
                        );
                        return empty(format);
                    };
                    (
                        format!("random(seed={seed})"),
                        crate::digits::random(seed, n),
                    )
                }
                "seed000" => {
                    let lit = crate::digits::SEED_000_RANDOM;
                    if n > lit.len() {
                        err(
                            at(f.count.as_ref().map_or(0, |c| c.span().start)),
                            format!("expect.count: seed000 has {} digits", lit.len()),
                        );
                    }
                    ("seed000".into(), lit[..n.min(lit.len())].to_string())
                }
                other => {
                    err(
                        at(s.span().start),
                        format!(
                            "expect.source: `{other}` is not one of {}",
                            SOURCES.join(", ")
                        ),
                    );
                    return empty(format);
                }
            }
        }
        (None, Some(l)) => {
            if l.get_ref().is_empty() {
                err(
                    at(l.span().start),
                    "expect.literal: must not be empty".into(),
                );
            }
            if f.count.is_some() || f.seed.is_some() {
                err(
                    here.clone(),
                    "expect: a literal takes no `count` or `seed`".into(),
                );
            }
            ("literal".into(), l.get_ref().clone())
        }
        _ => {
            err(
                here,
                format!(
                    "expect: give exactly one of `source` ({}) or `literal`",
                    SOURCES.join(", ")
                ),
            );
            return empty(format);
        }
    };
    let units: Vec<String> = match (format, source.as_str()) {
        (Format::Digits, _) => digits.chars().map(String::from).collect(),
        (Format::Words, "literal") => digits.split(' ').map(String::from).collect(),
        (Format::Words, _) => crate::digits::spell(&digits)
            .split(' ')
            .map(String::from)
            .collect(),
    };
    if format == Format::Words && units.iter().any(String::is_empty) {
        let at_lit = f.literal.as_ref().map_or(0, |l| l.span().start);
        err(
            at(at_lit),
            "expect.literal: words are separated by single spaces".into(),
        );
    }
    Expected {
        source,
        lead: f.lead.clone(),
        units,
        digits,
        format,
    }
}

fn empty(format: Format) -> Expected {
    Expected {
        source: String::new(),
        lead: String::new(),
        units: Vec::new(),
        digits: String::new(),
        format,
    }
}
