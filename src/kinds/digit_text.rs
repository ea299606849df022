//! What `recite` and `teacher_forcing` cases share (seed 000): the expected
//! text (digit sources, literal, digits or words), the prompt and template,
//! following a produced text against the expected one, and where each unit's
//! token is. Not a kind: a helper of those two.
//!
//! Contract: expected text is computed here (digit sources) and never read
//! from a model; both kinds pad every llama.cpp pass to `min_rows` rows, so
//! a recitation and a teacher-forced case with the same prompt, model and
//! `min_rows` see bitwise the same logits.

use crate::core::error::Result;
use crate::core::parse::{choice, Diagnostics};
use crate::core::{Case, Settings};
use crate::engine::{LoadedModel, Token, TokenId};
use crate::execute::reference::fits_context;
use crate::execute::RunContext;
use serde::Deserialize;
use toml::Spanned;

/// Digit sources an expected text can name.
pub(crate) const SOURCES: &[&str] = &["pi", "e", "sqrt2", "random", "seed000"];

/// How the prompt reaches the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Template {
    /// As raw text; the model continues it.
    Raw,
    /// Through the model's chat template, as one user message.
    Chat,
}

/// How the expected units are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// One character per unit, nothing between.
    Digits,
    /// English words (`zero` … `nine`), single spaces between.
    Words,
}

/// The text a model is expected to produce.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expected {
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
    pub(crate) fn body(&self) -> String {
        match self.format {
            Format::Digits => self.units.concat(),
            Format::Words => self.units.join(" "),
        }
    }

    /// Tokens enough to write the expected text, with 16 to spare: a
    /// token per character of the lead and per digit, three per word.
    pub(crate) fn token_budget(&self) -> usize {
        let per_unit = if self.format == Format::Words { 3 } else { 1 };
        (self.lead.len() + self.units.len()) * per_unit + 16
    }

    /// Byte span of each unit in `lead + body`.
    pub(crate) fn spans(&self) -> Vec<(usize, usize)> {
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
pub(crate) struct Prompt {
    /// Its name (test-name suffix when a case has several).
    pub name: String,
    /// The text, `{digits}` already replaced.
    pub text: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
/// `[expect]`: the expected text.
pub(crate) struct ExpectFile {
    source: Option<Spanned<String>>,
    count: Option<Spanned<usize>>,
    seed: Option<u64>,
    literal: Option<Spanned<String>>,
    #[serde(default)]
    lead: String,
}

/// The keys both kinds read: template, format, expected text, min_rows.
pub(crate) struct Common {
    /// Raw or chat.
    pub template: Template,
    /// What should come out.
    pub expected: Expected,
    /// Rows per pass.
    pub min_rows: u32,
}

impl Common {
    /// Parse the shared keys.
    pub fn parse(
        template: Option<&Spanned<String>>,
        format: Option<&Spanned<String>>,
        expect: &Spanned<ExpectFile>,
        min_rows: Option<&Spanned<u32>>,
        diag: &mut Diagnostics,
    ) -> Common {
        let template = choice(
            template,
            "template",
            &[("raw", Template::Raw), ("chat", Template::Chat)],
            diag,
        );
        let format = choice(
            format,
            "format",
            &[("digits", Format::Digits), ("words", Format::Words)],
            diag,
        );
        let expected = expected(expect, format, diag);
        if let Some(m) = min_rows {
            if !(1..=512).contains(m.get_ref()) {
                diag.push_at(
                    m.span().start,
                    format!("min_rows: {} must be between 1 and 512", m.get_ref()),
                );
            }
        }
        Common {
            template,
            expected,
            min_rows: min_rows.map_or(32, |m| *m.get_ref()),
        }
    }

    /// A prompt's text with `{digits}` replaced by the expected digits.
    pub(crate) fn prompt(&self, name: &str, text: &str) -> Prompt {
        Prompt {
            name: name.to_string(),
            text: text.replace("{digits}", &self.expected.digits),
        }
    }
}

fn expected(e: &Spanned<ExpectFile>, format: Format, diag: &mut Diagnostics) -> Expected {
    let f = e.get_ref();
    let here = diag.at(e.span().start);
    let (source, digits): (String, String) = match (&f.source, &f.literal) {
        (Some(s), None) => {
            let n = f.count.as_ref().map_or(0, |c| *c.get_ref());
            if f.count.is_none() || n == 0 {
                diag.push(&here, "expect: a digit source needs `count` ≥ 1");
            }
            if n > 100_000 {
                diag.push_at(
                    f.count.as_ref().map_or(0, |c| c.span().start),
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
                "pi" => ("pi".into(), decimals(crate::kinds::digits::pi(n))),
                "e" => ("e".into(), decimals(crate::kinds::digits::e(n))),
                "sqrt2" => ("sqrt2".into(), decimals(crate::kinds::digits::sqrt2(n))),
                "random" => {
                    let Some(seed) = f.seed else {
                        diag.push(&here, "expect: source = \"random\" needs `seed`");
                        return empty(format);
                    };
                    (
                        format!("random(seed={seed})"),
                        crate::kinds::digits::random(seed, n),
                    )
                }
                "seed000" => {
                    let lit = crate::kinds::digits::SEED_000_RANDOM;
                    if n > lit.len() {
                        diag.push_at(
                            f.count.as_ref().map_or(0, |c| c.span().start),
                            format!("expect.count: seed000 has {} digits", lit.len()),
                        );
                    }
                    ("seed000".into(), lit[..n.min(lit.len())].to_string())
                }
                other => {
                    diag.push_at(
                        s.span().start,
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
                diag.push_at(l.span().start, "expect.literal: must not be empty");
            }
            if f.count.is_some() || f.seed.is_some() {
                diag.push(&here, "expect: a literal takes no `count` or `seed`");
            }
            ("literal".into(), l.get_ref().clone())
        }
        _ => {
            diag.push(
                &here,
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
        (Format::Words, _) => crate::kinds::digits::spell(&digits)
            .split(' ')
            .map(String::from)
            .collect(),
    };
    if format == Format::Words && units.iter().any(String::is_empty) {
        let at_lit = f.literal.as_ref().map_or(0, |l| l.span().start);
        diag.push_at(
            at_lit,
            "expect.literal: words are separated by single spaces",
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

/// How far a produced text follows the expected one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reach {
    /// Units right before the first wrong (or missing) one.
    pub correct: usize,
    /// Byte offset in the compared output where it departs from the
    /// expected text (None: it has not departed, maybe only ended early).
    pub departs_at: Option<usize>,
    /// The whole expected text was produced.
    pub complete: bool,
}

/// Compare `out` with `expected` (lead, then units) character by character.
/// A word counts only when the space after it (or the end of the expected
/// text, or the end of `out`) follows.
pub(crate) fn reach(expected: &Expected, out: &str) -> Reach {
    let exp = format!("{}{}", expected.lead, expected.body());
    let m = out
        .bytes()
        .zip(exp.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let ended = m == out.len();
    let complete = m == exp.len();
    let spans = expected.spans();
    let last = spans.len().saturating_sub(1);
    let correct = spans
        .iter()
        .enumerate()
        .take_while(|(k, &(_, b))| {
            m >= b && (expected.format == Format::Digits || *k == last || m > b || ended)
        })
        .count();
    Reach {
        correct,
        departs_at: (!ended && !complete).then_some(m),
        complete,
    }
}

/// sha256 over token ids (little-endian i32): equal hashes, equal streams.
pub(crate) fn ids_sha256(ids: &[TokenId]) -> String {
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    crate::core::fsutil::sha256_bytes(&bytes)
}

/// A generated text followed against the expected one, token by token.
pub(crate) struct Follow<'a> {
    expected: &'a Expected,
    /// Skip the leading whitespace (a chat answer's).
    trim: bool,
    text: String,
    /// Byte end of each token's piece in `text`.
    ends: Vec<usize>,
}

impl<'a> Follow<'a> {
    /// Follow a text produced through `template`.
    pub(crate) fn new(expected: &'a Expected, template: Template) -> Self {
        Follow {
            expected,
            trim: template == Template::Chat,
            text: String::new(),
            ends: Vec::new(),
        }
    }

    /// Add one token's piece; how far the text follows now.
    pub(crate) fn push(&mut self, piece: &str) -> Reach {
        self.text.push_str(piece);
        self.ends.push(self.text.len());
        self.reach()
    }

    /// Bytes of leading whitespace skipped.
    pub(crate) fn skipped(&self) -> usize {
        if self.trim {
            self.text.len() - self.text.trim_start().len()
        } else {
            0
        }
    }

    /// The text compared with the expected one.
    pub(crate) fn shown(&self) -> &str {
        &self.text[self.skipped()..]
    }

    /// How far the whole text follows.
    pub(crate) fn reach(&self) -> Reach {
        reach(self.expected, self.shown())
    }

    /// The token whose piece holds byte `at` of the shown text.
    pub(crate) fn token_at(&self, at: usize) -> Option<usize> {
        let at = at + self.skipped();
        self.ends.iter().position(|&e| e > at)
    }
}

/// The prompt as the model reads it: raw, or through its chat template.
pub(crate) fn prompt_text(
    cx: &RunContext,
    model: &dyn LoadedModel,
    template: Template,
    prompt: &Prompt,
) -> Result<String> {
    match template {
        Template::Raw => Ok(prompt.text.clone()),
        Template::Chat => {
            let alias = &model.info().file.alias;
            let builtin = cx
                .registry()
                .entry(alias)
                .ok()
                .and_then(|e| e.chat_template.clone());
            model.chat_prompt(&prompt.text, builtin.as_deref())
        }
    }
}

/// Tokenize a text written through `template` (a chat template's special
/// tokens parsed, no second BOS).
pub(crate) fn tokenize(
    model: &dyn LoadedModel,
    template: Template,
    text: &str,
) -> Result<Vec<Token>> {
    let policy = crate::engine::BosPolicy::Model;
    match template {
        Template::Raw => model.tokenize(text, policy),
        Template::Chat => {
            // A template that writes BOS itself must not get a second one.
            let mut t = model.tokenize_special(text, policy)?;
            let bos = model.info().bos;
            if t.len() > 1 && t[0].id == bos && t[1].id == bos {
                t.remove(0);
            }
            Ok(t)
        }
    }
}

/// Settings for `tokens` positions plus a pass of padding.
pub(crate) fn settings_for(
    cx: &RunContext,
    model: &dyn LoadedModel,
    case: &Case,
    tokens: usize,
    min_rows: u32,
) -> Result<Settings> {
    let need = (tokens + min_rows as usize + 8).div_ceil(256) * 256;
    let train = model.info().n_ctx_train as usize;
    // The tokens plus one pass of padding.
    fits_context(
        &case.path.display(),
        tokens + min_rows as usize,
        model.info(),
    )?;
    let mut s = Settings::new(need.min(train) as u32, cx.threads).with_options(cx.options());
    s.min_rows = min_rows;
    Ok(s)
}

/// A token's piece as text.
pub(crate) fn piece_text(model: &dyn LoadedModel, id: TokenId) -> String {
    String::from_utf8_lossy(&model.piece(id)).into_owned()
}

/// Bound a produced text for a golden: whole up to 200 bytes, else its
/// start and the stretch around where it departs.
pub(crate) fn bounded(out: &str, at: Option<usize>) -> String {
    if out.len() <= 200 {
        return out.to_string();
    }
    let cut = |i: usize| {
        let mut i = i.min(out.len());
        while !out.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let head = &out[..cut(100)];
    match at {
        Some(a) if a > 150 => format!("{head}…{}…", &out[cut(a.saturating_sub(50))..cut(a + 50)]),
        _ => format!("{}…", &out[..cut(200)]),
    }
}

/// The token of each unit starting at byte `starts[k]` of `text`: the one
/// that begins exactly there, or at whitespace just before it (a word's
/// leading space), and reaches into it. None when no token does: the unit
/// shares a token with the text before it (merged digits).
pub(crate) fn unit_tokens(text: &[u8], starts: &[usize], tokens: &[Token]) -> Vec<Option<usize>> {
    let mut cursor = 0usize;
    starts
        .iter()
        .map(|&at| {
            let found = tokens.iter().enumerate().skip(cursor).find(|(_, tok)| {
                tok.offset.is_some_and(|o| {
                    o <= at
                        && o + tok.piece.len() > at
                        && text[o..at].iter().all(u8::is_ascii_whitespace)
                })
            });
            let i = found.map(|(i, _)| i);
            if let Some(i) = i {
                cursor = i + 1;
            }
            i
        })
        .collect()
}

/// Rank of the true token (tokens with a strictly higher logit) and its
/// margin (its logit minus the best other's, f64), in one pass.
#[cfg(test)]
mod tests {
    use super::*;

    fn exp(lead: &str, units: &[&str], format: Format) -> Expected {
        Expected {
            source: "literal".into(),
            lead: lead.into(),
            units: units.iter().map(|s| s.to_string()).collect(),
            digits: String::new(),
            format,
        }
    }

    #[test]
    pub(crate) fn reach_counts_digits_and_whole_words() {
        let d = exp("3.", &["1", "4", "1", "5"], Format::Digits);
        assert_eq!(reach(&d, "3.1415").correct, 4);
        assert!(reach(&d, "3.1415").complete);
        let r = reach(&d, "3.1419");
        assert_eq!((r.correct, r.departs_at, r.complete), (3, Some(5), false));
        // Ended early: correct so far, not departed.
        assert_eq!(
            reach(&d, "3.14"),
            Reach {
                correct: 2,
                departs_at: None,
                complete: false
            }
        );
        // Wrong lead: nothing counts.
        assert_eq!(reach(&d, "3,1415").correct, 0);
        let w = exp("", &["two", "zero", "two"], Format::Words);
        assert_eq!(reach(&w, "two zero two").correct, 3);
        assert_eq!(reach(&w, "two zeros").correct, 1);
        assert_eq!(reach(&w, "two zero").correct, 2);
        assert_eq!(reach(&w, "two zero three").correct, 2);
        assert_eq!(reach(&w, "tw").correct, 0);
    }

    fn toks(text: &str, pieces: &[&str]) -> Vec<Token> {
        let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.as_bytes().to_vec()).collect();
        let offsets = crate::engine::piece_offsets(text.as_bytes(), &pieces);
        pieces
            .into_iter()
            .zip(offsets)
            .enumerate()
            .map(|(i, (piece, offset))| Token {
                id: i as TokenId,
                piece,
                offset,
            })
            .collect()
    }

    #[test]
    fn units_are_found_by_offset_and_merged_digits_are_not() {
        // One token per digit.
        let text = "pi: 3.1415";
        let t = toks(text, &["pi", ":", " ", "3", ".", "1", "4", "1", "5"]);
        assert_eq!(
            unit_tokens(text.as_bytes(), &[6, 7, 8, 9], &t),
            vec![Some(5), Some(6), Some(7), Some(8)]
        );
        // A tokenizer that merges digit pairs: "14" starts unit 0, unit 1
        // has no token of its own, never the neighbour's.
        let t = toks(text, &["pi", ":", " ", "3", ".", "14", "15"]);
        assert_eq!(
            unit_tokens(text.as_bytes(), &[6, 7, 8, 9], &t),
            vec![Some(5), None, Some(6), None]
        );
        // ".1" merges the lead with the first digit: unit 0 is not found.
        let t = toks(text, &["pi", ":", " ", "3", ".1", "4", "1", "5"]);
        assert_eq!(
            unit_tokens(text.as_bytes(), &[6, 7, 8, 9], &t),
            vec![None, Some(5), Some(6), Some(7)]
        );
        // Words: the token carries the space before the word.
        let text = "say: two zero";
        let t = toks(text, &["say", ":", " two", " zero"]);
        assert_eq!(
            unit_tokens(text.as_bytes(), &[5, 9], &t),
            vec![Some(2), Some(3)]
        );
    }

    #[test]
    fn bounded_keeps_the_departure_in_view() {
        let long = "1".repeat(300) + "X" + &"2".repeat(100);
        let b = bounded(&long, Some(300));
        assert!(b.contains('X') && b.len() < 260, "{b}");
        assert_eq!(bounded("short", None), "short");
    }
}
