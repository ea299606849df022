//! `kind = "recite"`: free greedy recitation from a prompt (seed 000),
//! compared character by character with an expected text — the position of
//! the first wrong unit and the text produced. Several wordings of a prompt
//! (`[[prompts]]`) are one test each.
//!
//! Contract: batch-invariant decoding by default, so the first error equals
//! the first flip of teacher forcing with the same prompt, model and
//! `min_rows`; the output kept in the golden is bounded around the error.

use crate::core::case::{metrics_of, Metric};
use crate::core::error::{Error, Result};
use crate::core::parse::{case_table, choice, parse_toml, Diagnostics};
use crate::core::present::{Cell, Field, Join, Presentation, ReportColumn};
use crate::core::{Case, Decoding, Outcome};
use crate::engine::TokenId;
use crate::execute::RunContext;
use crate::kinds::digit_text::{
    bounded, ids_sha256, piece_text, prompt_text, settings_for, tokenize, Common, ExpectFile,
    Expected, Follow, Prompt, Template,
};
use crate::kinds::{Kind, Start};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Instant;
use toml::Spanned;

/// Metrics of every recite case.
pub(crate) const METRICS: &[&str] = &[
    "first_error",
    "digits_correct",
    "complete",
    "units_expected",
    "tokens_generated",
    "max_tokens_reached",
    "error_gap",
];

/// How recitation cases show in the ladder report: per case, the first
/// wrong unit of the greedy recitation out of the units expected.
pub(crate) fn present() -> Option<Presentation> {
    let mut first = ReportColumn::new(
        "first error",
        Cell::OutOf {
            part: "first_error",
            whole: "units_expected",
        },
    )
    .headline();
    first.csv.push(("complete", Field::Metric("complete")));
    Some(Presentation {
        kind: "recite",
        join: Join::Case,
        columns: vec![first],
        plots: Vec::new(),
        legend: vec![
            "first error CASE: the greedy recitation's first wrong unit (digit, word) out \
             of the units expected, per recitation case (a full recitation shows n/n).",
        ],
        align: None,
        hub: vec![],
        reference: vec![],
        unit: None,
    })
}

/// A `kind = "recite"` case.
#[derive(Debug, Clone)]
pub(crate) struct Recite {
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

/// The counts among [`METRICS`].
const COUNTS: &[&str] = &[
    "first_error",
    "digits_correct",
    "complete",
    "units_expected",
    "tokens_generated",
    "max_tokens_reached",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptFile {
    name: Spanned<String>,
    text: String,
}

case_table! {
    struct ReciteFile {
        template: Option<Spanned<String>>,
        format: Option<Spanned<String>>,
        expect: Spanned<ExpectFile>,
        prompt: Option<Spanned<String>>,
        prompts: Option<Spanned<Vec<PromptFile>>>,
        max_tokens: Option<Spanned<usize>>,
        decoding: Option<Spanned<String>>,
        min_rows: Option<Spanned<u32>>,
        tail: Option<usize>,
    }
}

/// Parse the kind's table.
pub fn parse(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>> {
    let f: ReciteFile = parse_toml(diag.path(), src)?;
    if let Some((_, at)) = &case.reference {
        diag.push(at, "reference: a kind = \"recite\" case does not take it");
    }
    let common = Common::parse(
        f.template.as_ref(),
        f.format.as_ref(),
        &f.expect,
        f.min_rows.as_ref(),
        diag,
    );
    let mut prompts = Vec::new();
    match (&f.prompt, &f.prompts) {
        (Some(p), None) => prompts.push(common.prompt("prompt", p.get_ref())),
        (None, Some(list)) => {
            if list.get_ref().is_empty() {
                diag.push_at(list.span().start, "prompts: list at least one");
            }
            for p in list.get_ref() {
                let n = p.name.get_ref();
                let ok = !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !ok {
                    diag.push_at(
                        p.name.span().start,
                        format!("prompts.name: `{n}` must be letters, digits, `-` or `_` (it names a test)"),
                    );
                }
                if prompts.iter().any(|q: &Prompt| q.name == *n) {
                    diag.push_at(
                        p.name.span().start,
                        format!("prompts.name: `{n}` appears twice"),
                    );
                }
                prompts.push(common.prompt(n, &p.text));
            }
        }
        _ => diag.push_at(
            0,
            "give exactly one of `prompt` (one wording) or [[prompts]] (several)",
        ),
    }
    if prompts.iter().any(|p| p.text.is_empty()) {
        diag.push_at(0, "prompt: must not be empty");
    }
    let decoding = choice(
        f.decoding.as_ref(),
        "decoding",
        &[
            ("invariant", Decoding::Invariant),
            ("incremental", Decoding::Incremental),
        ],
        diag,
    );
    let max_tokens = f
        .max_tokens
        .as_ref()
        .map_or(common.expected.token_budget(), |m| *m.get_ref());
    if max_tokens == 0 {
        diag.push_at(
            f.max_tokens.as_ref().map_or(0, |m| m.span().start),
            "max_tokens: must be ≥ 1",
        );
    }
    Ok(Arc::new(Recite {
        template: common.template,
        expected: common.expected,
        prompts,
        max_tokens,
        decoding,
        min_rows: common.min_rows,
        tail: f.tail.unwrap_or(8),
    }))
}

/// What a reader calls a recitation case's metrics, and their units.
pub(crate) const RECITE_ABOUT: crate::core::case::About = &[
    (
        "first_error",
        "first wrong unit of the recitation (its index)",
        "units",
    ),
    ("digits_correct", "units right", "units"),
    ("complete", "recited whole (1) or not (0)", ""),
    ("units_expected", "units expected", "units"),
    ("tokens_generated", "tokens generated", "tokens"),
    (
        "max_tokens_reached",
        "stopped at max_tokens (1) or not (0)",
        "",
    ),
    (
        "error_gap",
        "the wrong pick's logit margin over the runner-up",
        "logits",
    ),
];

impl Kind for Recite {
    fn about(&self) -> crate::core::case::About {
        RECITE_ABOUT
    }

    fn metrics(&self) -> Vec<Metric> {
        metrics_of(METRICS, COUNTS)
    }

    /// Several wordings of a prompt: one test each.
    fn variants(&self) -> Vec<(String, Arc<dyn Kind>)> {
        if self.prompts.len() < 2 {
            return Vec::new();
        }
        self.prompts
            .iter()
            .map(|p| {
                let one = Recite {
                    prompts: vec![p.clone()],
                    ..self.clone()
                };
                (p.name.clone(), Arc::new(one) as Arc<dyn Kind>)
            })
            .collect()
    }

    /// Generation decodes on its own: the whole trial runs here.
    fn start(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<Start> {
        let prompt = self.prompts.first().ok_or_else(|| {
            Error::harness(format!(
                "{}: a recite trial without a prompt",
                case.path.display()
            ))
        })?;
        let t = Instant::now();
        let (verified, model) = cx.load(alias)?;
        out.timings.prepare = t.elapsed();
        out.model_sha256 = Some(verified.file.sha256.clone());
        let t = Instant::now();
        let text = prompt_text(cx, &*model, self.template, prompt)?;
        let ids: Vec<TokenId> = tokenize(&*model, self.template, &text)?
            .iter()
            .map(|t| t.id)
            .collect();
        out.token_stream_sha256 = Some(ids_sha256(&ids));
        out.timings.tokenize = t.elapsed();
        let settings = settings_for(
            cx,
            &*model,
            case,
            ids.len() + self.max_tokens,
            self.min_rows,
        )?;
        out.settings = Some(settings.clone());
        let mut follow = Follow::new(&self.expected, self.template);
        let mut departed_at_step: Option<usize> = None;
        let mut stopped = "max_tokens";
        let t = Instant::now();
        let steps = model
            .generate(
                &settings,
                &ids,
                self.max_tokens,
                self.decoding,
                &mut |gen| {
                    let Some(&last) = gen.last() else {
                        return false;
                    };
                    let now = follow.push(&piece_text(&*model, last));
                    if now.complete {
                        stopped = "complete";
                        return true;
                    }
                    if now.departs_at.is_some() && departed_at_step.is_none() {
                        departed_at_step = Some(gen.len());
                    }
                    if departed_at_step.is_some_and(|d| gen.len() >= d + self.tail) {
                        stopped = "departed";
                        return true;
                    }
                    false
                },
            )
            .map_err(|e| e.context(case.path.display()))?;
        out.timings.decode = t.elapsed();
        let t = Instant::now();
        if steps.len() < self.max_tokens && stopped == "max_tokens" {
            stopped = "end-of-generation";
        }
        let got = follow.reach();
        let m = &mut out.metrics;
        m.insert("first_error".into(), got.correct as f64);
        m.insert("digits_correct".into(), got.correct as f64);
        m.insert("complete".into(), f64::from(u8::from(got.complete)));
        m.insert("units_expected".into(), self.expected.units.len() as f64);
        m.insert("tokens_generated".into(), steps.len() as f64);
        m.insert(
            "max_tokens_reached".into(),
            f64::from(u8::from(stopped == "max_tokens")),
        );
        if let Some(s) = got.departs_at.and_then(|at| follow.token_at(at)) {
            m.insert("error_gap".into(), f64::from(steps[s].gap));
        }
        let tx = &mut out.texts;
        tx.insert("output".into(), bounded(follow.shown(), got.departs_at));
        tx.insert(
            "stopped".into(),
            match stopped {
                "complete" => format!(
                    "complete: all {} units produced (expected text ends before max_tokens {})",
                    self.expected.units.len(),
                    self.max_tokens
                ),
                "departed" => format!(
                    "departed from the expected text at unit {}; {} more tokens kept",
                    got.correct, self.tail
                ),
                "max_tokens" => format!(
                    "max_tokens {} reached after {} correct units (a lower bound)",
                    self.max_tokens, got.correct
                ),
                _ => format!("end of generation after {} correct units", got.correct),
            },
        );
        tx.insert(
            "decoding".into(),
            format!("{:?} (min_rows {})", self.decoding, self.min_rows).to_lowercase(),
        );
        tx.insert("expected".into(), self.expected.source.clone());
        out.timings.measure = t.elapsed();
        Ok(Start::Done)
    }
}
