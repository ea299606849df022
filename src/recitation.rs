//! Run stage for the digit experiments of seed 000: greedy recitation
//! (`recite`) and digit-by-digit teacher forcing (`teacher_forcing`), with
//! the reference's noise, the least-certain positions and the sampling
//! forecast checked against seeded sampled recitations.
//!
//! Contract: both kinds pad every llama.cpp pass to `min_rows` rows, so a
//! recitation and a teacher-forced case with the same prompt, model and
//! `min_rows` see bitwise the same logits, and `first_error == first_flip`
//! whenever every digit is its own token. A digit without a token of its own
//! is reported (E0), never scored against a neighbour's row. A reference
//! with another vocabulary or token stream is an error before any scoring.

use crate::case::Case;
use crate::digitcase::{Expected, Format, Prompt, Recite, SamplerSpec, TeacherForcing, Template};
use crate::engine::{LoadedModel, Settings, Token, TokenId, Window};
use crate::error::{Error, Result};
use crate::measure::row_stats_exps;
use crate::runner::{Outcome, Runner};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// One digit (unit) position of a teacher-forced case.
#[derive(Debug, Clone, PartialEq)]
pub struct DigitRow {
    /// 0-based unit index after the lead.
    pub unit: u32,
    /// Byte offset of the unit in the scored text.
    pub char_offset: u32,
    /// The token that starts the unit (−1: none, the unit is not measured).
    pub token_index: i32,
    /// Its id (−1: none).
    pub token_id: TokenId,
    /// Its piece.
    pub piece: String,
    /// The token is exactly the unit (E0).
    pub own_token: bool,
    /// log p(true token).
    pub logprob: f64,
    /// Tokens with a strictly higher logit.
    pub rank: i64,
    /// log p(true) − max over other tokens of log p; odds = e^margin.
    pub margin: f64,
    /// The model's top choice.
    pub top1_token: TokenId,
    /// Its piece.
    pub top1_piece: String,
    /// KL(ref ‖ model) over the whole vocabulary (NaN without a reference).
    pub kl_vs_ref: f64,
    /// The model's top choice is the reference's.
    pub top1_matches_ref: bool,
    /// The reference's margin at this position (NaN without a reference).
    pub ref_margin: f64,
    /// Percentile of `ref_margin` among all measured positions (0: the
    /// reference's least certain digit).
    pub ref_odds_percentile: f64,
    /// Chance each sampler draws the true token here.
    pub p_pick: Vec<f64>,
}

/// The per-digit rows of one teacher-forced case × model.
#[derive(Debug, Clone)]
pub struct DigitRows {
    /// One per unit.
    pub rows: Vec<DigitRow>,
    /// Sampler names, in `p_pick` order.
    pub samplers: Vec<String>,
    /// Whether a reference filled the `*_ref` columns.
    pub reference: bool,
}

/// How far a produced text follows the expected one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
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
pub fn reach(expected: &Expected, out: &str) -> Reach {
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
fn ids_sha256(ids: &[TokenId]) -> String {
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    crate::fsutil::sha256_bytes(&bytes)
}

/// A generated text followed against the expected one, token by token.
struct Follow<'a> {
    expected: &'a Expected,
    /// Skip the leading whitespace (a chat answer's).
    trim: bool,
    text: String,
    /// Byte end of each token's piece in `text`.
    ends: Vec<usize>,
}

impl<'a> Follow<'a> {
    fn new(expected: &'a Expected, template: Template) -> Self {
        Follow {
            expected,
            trim: template == Template::Chat,
            text: String::new(),
            ends: Vec::new(),
        }
    }

    /// Add one token's piece; how far the text follows now.
    fn push(&mut self, piece: &str) -> Reach {
        self.text.push_str(piece);
        self.ends.push(self.text.len());
        self.reach()
    }

    /// Bytes of leading whitespace skipped.
    fn skipped(&self) -> usize {
        if self.trim {
            self.text.len() - self.text.trim_start().len()
        } else {
            0
        }
    }

    /// The text compared with the expected one.
    fn shown(&self) -> &str {
        &self.text[self.skipped()..]
    }

    fn reach(&self) -> Reach {
        reach(self.expected, self.shown())
    }

    /// The token whose piece holds byte `at` of the shown text.
    fn token_at(&self, at: usize) -> Option<usize> {
        let at = at + self.skipped();
        self.ends.iter().position(|&e| e > at)
    }
}

fn prompt_text(
    runner: &Runner,
    model: &dyn LoadedModel,
    template: Template,
    prompt: &Prompt,
) -> Result<String> {
    match template {
        Template::Raw => Ok(prompt.text.clone()),
        Template::Chat => {
            let alias = &model.info().file.alias;
            let builtin = runner
                .registry
                .entry(alias)
                .ok()
                .and_then(|e| e.chat_template.clone());
            model.chat_prompt(&prompt.text, builtin.as_deref())
        }
    }
}

fn tokenize(model: &dyn LoadedModel, template: Template, text: &str) -> Result<Vec<Token>> {
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
fn settings_for(
    runner: &Runner,
    model: &dyn LoadedModel,
    case: &Case,
    tokens: usize,
    min_rows: u32,
) -> Result<Settings> {
    let need = (tokens + min_rows as usize + 8).div_ceil(256) * 256;
    let train = model.info().n_ctx_train as usize;
    if tokens + min_rows as usize > train {
        return Err(Error::input(format!(
            "{}: {tokens} tokens plus {min_rows} rows of padding exceed the training context {train} of `{}`",
            case.path.display(),
            model.info().file.alias
        )));
    }
    let mut s = Settings::new(need.min(train) as u32, runner.threads);
    s.min_rows = min_rows;
    Ok(s)
}

fn piece_text(model: &dyn LoadedModel, id: TokenId) -> String {
    String::from_utf8_lossy(&model.piece(id)).into_owned()
}

/// Bound a produced text for a golden: whole up to 200 bytes, else its
/// start and the stretch around where it departs.
fn bounded(out: &str, at: Option<usize>) -> String {
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

/// Run one wording of a `recite` case.
pub fn run_recite(
    runner: &Runner,
    case: &Case,
    r: &Recite,
    alias: &str,
    out: &mut Outcome,
) -> Result<()> {
    let prompt = r.prompts.first().ok_or_else(|| {
        Error::harness(format!(
            "{}: a recite trial without a prompt",
            case.path.display()
        ))
    })?;
    let t = Instant::now();
    let (verified, model) = runner.load(alias)?;
    out.timings.prepare = t.elapsed();
    out.model_sha256 = Some(verified.file.sha256.clone());
    let t = Instant::now();
    let text = prompt_text(runner, &*model, r.template, prompt)?;
    let ids: Vec<TokenId> = tokenize(&*model, r.template, &text)?
        .iter()
        .map(|t| t.id)
        .collect();
    out.token_stream_sha256 = Some(ids_sha256(&ids));
    out.timings.tokenize = t.elapsed();
    let settings = settings_for(runner, &*model, case, ids.len() + r.max_tokens, r.min_rows)?;
    out.settings = Some(settings.clone());
    let mut follow = Follow::new(&r.expected, r.template);
    let mut departed_at_step: Option<usize> = None;
    let mut stopped = "max_tokens";
    let t = Instant::now();
    let steps = model
        .generate(&settings, &ids, r.max_tokens, r.decoding, &mut |gen| {
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
            if departed_at_step.is_some_and(|d| gen.len() >= d + r.tail) {
                stopped = "departed";
                return true;
            }
            false
        })
        .map_err(|e| e.context(case.path.display()))?;
    out.timings.decode = t.elapsed();
    let t = Instant::now();
    if steps.len() < r.max_tokens && stopped == "max_tokens" {
        stopped = "end-of-generation";
    }
    let got = follow.reach();
    let m = &mut out.metrics;
    m.insert("first_error".into(), got.correct as f64);
    m.insert("digits_correct".into(), got.correct as f64);
    m.insert("complete".into(), f64::from(u8::from(got.complete)));
    m.insert("units_expected".into(), r.expected.units.len() as f64);
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
                r.expected.units.len(),
                r.max_tokens
            ),
            "departed" => format!(
                "departed from the expected text at unit {}; {} more tokens kept",
                got.correct, r.tail
            ),
            "max_tokens" => format!(
                "max_tokens {} reached after {} correct units (a lower bound)",
                r.max_tokens, got.correct
            ),
            _ => format!("end of generation after {} correct units", got.correct),
        },
    );
    tx.insert(
        "decoding".into(),
        format!("{:?} (min_rows {})", r.decoding, r.min_rows).to_lowercase(),
    );
    tx.insert("expected".into(), r.expected.source.clone());
    out.timings.measure = t.elapsed();
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
    runner: &Runner,
    model: &dyn LoadedModel,
    t: &TeacherForcing,
    case: &Case,
) -> Result<Located> {
    let prompt = prompt_text(runner, model, t.template, &t.prompt)?;
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

/// The token of each unit starting at byte `starts[k]` of `text`: the one
/// that begins exactly there, or at whitespace just before it (a word's
/// leading space), and reaches into it. None when no token does: the unit
/// shares a token with the text before it (merged digits).
pub fn unit_tokens(text: &[u8], starts: &[usize], tokens: &[Token]) -> Vec<Option<usize>> {
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
fn ref_margin(r: &crate::kld::RefPosition, target: u32) -> f64 {
    let best_other = r
        .entries
        .iter()
        .find(|(j, _)| *j != target)
        .map(|&(_, l)| l)
        .or_else(|| r.tail.as_ref().map(|t| t.hi))
        .unwrap_or(f32::NEG_INFINITY);
    r.lp_true - r.lp(best_other)
}

/// Run a `teacher_forcing` case.
pub fn run_teacher_forcing(
    runner: &Runner,
    case: &Case,
    t: &TeacherForcing,
    alias: &str,
    out: &mut Outcome,
) -> Result<()> {
    let t0 = Instant::now();
    let (verified, model) = runner.load(alias)?;
    out.timings.prepare = t0.elapsed();
    out.model_sha256 = Some(verified.file.sha256.clone());
    let t0 = Instant::now();
    let loc = locate(runner, &*model, t, case)?;
    let ids: Vec<TokenId> = loc.tokens.iter().map(|t| t.id).collect();
    let stream = ids_sha256(&ids);
    out.token_stream_sha256 = Some(stream.clone());
    out.timings.tokenize = t0.elapsed();
    let settings = settings_for(runner, &*model, case, ids.len(), t.min_rows)?;
    out.settings = Some(settings.clone());
    // Rows to keep: the row before each located unit's token.
    let mut unit_of_row: BTreeMap<usize, usize> = BTreeMap::new();
    for (k, (_, tok)) in loc.units.iter().enumerate() {
        if let Some(i) = tok {
            unit_of_row.insert(i - 1, k);
        }
    }
    let first_row = unit_of_row.keys().next().copied().unwrap_or(ids.len() - 1);
    let window = Window {
        tokens: ids.clone(),
        logits_from: first_row,
    };
    let reference = match &t.reference {
        Some((ref_alias, ref_at)) => Some(tf_reference(
            runner,
            case,
            t,
            &*model,
            ref_alias,
            ref_at,
            &settings,
            &window,
            &unit_of_row,
            &stream,
        )?),
        None => None,
    };
    let samplers: Vec<&SamplerSpec> = t.samplers.iter().collect();
    let mut rows: Vec<Option<DigitRow>> = vec![None; loc.units.len()];
    let mut exps = Vec::new();
    let mut refs_used = 0usize;
    let t0 = Instant::now();
    model
        .score(
            &settings,
            std::slice::from_ref(&window),
            &mut |_, pos, row| {
                let Some(&k) = unit_of_row.get(&pos) else {
                    return Ok(());
                };
                let target = ids[pos + 1] as usize;
                let st = row_stats_exps(row, &mut exps);
                let top = st.argmax;
                let (rank, margin) = rank_and_margin(row, target);
                let (kl, matches, rmargin) = match &reference {
                    Some(refs) => {
                        let r = &refs.rows[refs_used];
                        refs_used += 1;
                        let c = crate::kld::compare(r, row, &st, &exps, target, false);
                        (c.kl, c.ref_top == top as u32, ref_margin(r, target as u32))
                    }
                    None => (f64::NAN, false, f64::NAN),
                };
                let tok = &loc.tokens[pos + 1];
                rows[k] = Some(DigitRow {
                    unit: k as u32,
                    char_offset: loc.units[k].0 as u32,
                    token_index: (pos + 1) as i32,
                    token_id: tok.id,
                    piece: String::from_utf8_lossy(&tok.piece).into_owned(),
                    own_token: String::from_utf8_lossy(&tok.piece).trim() == t.expected.units[k],
                    logprob: st.logprob(row, target),
                    rank,
                    margin,
                    top1_token: top as TokenId,
                    top1_piece: piece_text(&*model, top as TokenId),
                    kl_vs_ref: kl,
                    top1_matches_ref: matches,
                    ref_margin: rmargin,
                    ref_odds_percentile: f64::NAN,
                    p_pick: samplers
                        .iter()
                        .map(|s| crate::forecast::p_pick(row, &s.sampler, target))
                        .collect(),
                });
                Ok(())
            },
        )
        .map_err(|e| e.context(case.path.display()))?;
    out.timings.decode += t0.elapsed();
    let t0 = Instant::now();
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
    tf_metrics(t, &loc, &mut rows, reference.is_some(), out);
    if !samplers.is_empty() {
        sampling(case, t, &*model, &loc, &rows, &settings, out)?;
    }
    out.digit_rows = Some(Arc::new(DigitRows {
        rows,
        samplers: samplers.iter().map(|s| s.name.clone()).collect(),
        reference: reference.is_some(),
    }));
    out.timings.measure += t0.elapsed();
    Ok(())
}

/// The reference's rows at the units' positions, through the `.qgref` cache.
#[allow(clippy::too_many_arguments)]
fn tf_reference(
    runner: &Runner,
    case: &Case,
    t: &TeacherForcing,
    model: &dyn LoadedModel,
    ref_alias: &str,
    ref_at: &crate::case::Location,
    settings: &Settings,
    window: &Window,
    unit_of_row: &BTreeMap<usize, usize>,
    stream: &str,
) -> Result<Arc<crate::runner::RefRows>> {
    let ci = model.info();
    let entry = runner
        .registry
        .entry(ref_alias)
        .map_err(|e| e.context(ref_at))?;
    let ref_sha = match &entry.sha256 {
        Some(s) => s.clone(),
        None => runner.prepare(ref_alias)?.file.sha256,
    };
    let rows_wanted: Vec<usize> = unit_of_row.keys().copied().collect();
    let header = crate::refcache::CacheHeader {
        reference_sha256: ref_sha,
        token_stream_sha256: stream.to_string(),
        windowing: format!("teacher-forcing rows {rows_wanted:?}"),
        settings: format!(
            "n_ctx={} n_batch={} min_rows={} flash_attn=off kv=f16",
            settings.n_ctx, settings.n_batch, settings.min_rows
        ),
        build: runner.pool.engine().build().label(),
        tail: crate::kld::DEFAULT_TAIL,
        max_kept: crate::kld::DEFAULT_MAX_KEPT,
        positions: rows_wanted.len(),
        n_vocab: ci.n_vocab,
        tokenizer_fingerprint: String::new(),
    };
    let refs = runner.cached_ref_rows(&header, &case.path, ref_alias, &|| {
        let (_, rmodel) = runner
            .load(ref_alias)
            .map_err(|e| e.context(format!("{ref_at}: reference")))?;
        let ri = rmodel.info();
        if ri.n_vocab != ci.n_vocab || ri.tokenizer_fingerprint != ci.tokenizer_fingerprint {
            return Err(Error::input(format!(
                "{ref_at}: reference: `{ref_alias}` and `{}` have different vocabularies \
                 ({} vs {} tokens, tokenizer {} vs {}): kl_vs_ref needs one vocabulary",
                ci.file.alias,
                ri.n_vocab,
                ci.n_vocab,
                &ri.tokenizer_fingerprint[..12.min(ri.tokenizer_fingerprint.len())],
                &ci.tokenizer_fingerprint[..12.min(ci.tokenizer_fingerprint.len())]
            )));
        }
        let rloc = locate(runner, &*rmodel, t, case)?;
        let rids: Vec<TokenId> = rloc.tokens.iter().map(|t| t.id).collect();
        if rids != window.tokens {
            return Err(Error::input(format!(
                "{ref_at}: reference: `{ref_alias}` and `{}` tokenize the text differently \
                 ({} vs {} tokens): teacher forcing compares identical token streams",
                ci.file.alias,
                rids.len(),
                window.tokens.len()
            )));
        }
        let mut rows = Vec::with_capacity(unit_of_row.len());
        rmodel.score(
            settings,
            std::slice::from_ref(window),
            &mut |_, pos, row| {
                if unit_of_row.contains_key(&pos) {
                    let st = crate::measure::row_stats(row);
                    rows.push(crate::kld::compress_row(
                        row,
                        &st,
                        window.tokens[pos + 1] as usize,
                        crate::kld::DEFAULT_TAIL,
                        crate::kld::DEFAULT_MAX_KEPT,
                    ));
                }
                Ok(())
            },
        )?;
        Ok((ri.n_vocab, ri.tokenizer_fingerprint.clone(), rows))
    })?;
    if refs.n_vocab != ci.n_vocab || refs.tokenizer_fingerprint != ci.tokenizer_fingerprint {
        return Err(Error::input(format!(
            "{ref_at}: reference: `{ref_alias}` and `{}` have different vocabularies ({} vs {} tokens): \
             kl_vs_ref needs one vocabulary",
            ci.file.alias, refs.n_vocab, ci.n_vocab
        )));
    }
    if refs.rows.len() != unit_of_row.len() {
        return Err(Error::harness(format!(
            "{}: the reference holds {} positions, the case scores {}",
            case.path.display(),
            refs.rows.len(),
            unit_of_row.len()
        )));
    }
    Ok(refs)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    crate::measure::quantile(&v, 0.5)
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
        let forecast = crate::forecast::expected_reach(&q);
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
        let mut reached = Vec::with_capacity(s.samples);
        let t0 = Instant::now();
        for k in 0..s.samples {
            let mut follow = Follow::new(&t.expected, t.template);
            model
                .sample(
                    &plain,
                    &loc.prompt_ids,
                    max_new,
                    &s.sampler,
                    s.seed.wrapping_add(k as u32),
                    &mut |gen| {
                        let Some(&last) = gen.last() else {
                            return false;
                        };
                        let r = follow.push(&piece_text(model, last));
                        r.complete || r.departs_at.is_some()
                    },
                )
                .map_err(|e| e.context(case.path.display()))?;
            reached.push(follow.reach().correct as f64);
        }
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
        let surv = crate::forecast::survival(&q);
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
    fn reach_counts_digits_and_whole_words() {
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
