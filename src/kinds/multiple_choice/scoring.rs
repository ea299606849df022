//! Scoring as the tool scores: prepared tasks batched as its batches,
//! the tool's own float arithmetic, and kept scores keyed by the code
//! that computes them.

use super::*;

/// The tool's minimum of tokens after the choice for partial scoring.
pub(crate) const K_MIN_TRAILING_CTX: usize = 3;

/// Score WinoGrande tasks as the tool does: both completions in one batch
/// (2 sequences per task, as many tasks as fit in n_ctx and 4 sequences),
/// every token after the shared prefix an output; each choice scored by the
/// mean log-probability of the sentence after the choice word when both
/// completions have more than 3 tokens after the prefix, else from the
/// prefix on — with the tool's own row indices (including, in the second
/// case, the row its source marks FIXME), so the scores are the tool's.
pub fn score_winogrande(
    model: &dyn LoadedModel,
    settings: &Settings,
    tasks: &[(usize, Winogrande)],
    shown: &str,
) -> Result<Scores> {
    Ok(score_winogrande_part(model, settings, tasks, shown, None)?.0)
}

/// [`score_winogrande`] of the tool's batches `only` (all when None): the
/// scores of their tasks (empty for the others) and every batch's task
/// range.
pub(crate) fn score_winogrande_part(
    model: &dyn LoadedModel,
    settings: &Settings,
    tasks: &[(usize, Winogrande)],
    shown: &str,
    only: Option<&[usize]>,
) -> Result<(Scores, Vec<(usize, usize)>)> {
    struct Prep {
        seqs: [Vec<TokenId>; 2],
        prefix: usize,
        base: [usize; 2],
        required: usize,
    }
    let tok = |s: String| -> Result<Vec<TokenId>> {
        Ok(model
            .tokenize(&s, BosPolicy::Model)?
            .iter()
            .map(|t| t.id)
            .collect())
    };
    let mut prepared = Vec::new();
    for (i, t) in tasks {
        let s0 = tok(format!("{}{}{}", t.first, t.choices[0], t.second))?;
        let s1 = tok(format!("{}{}{}", t.first, t.choices[1], t.second))?;
        let prefix = s0.iter().zip(&s1).take_while(|(a, b)| a == b).count();
        if prefix == 0 || prefix == s0.len() || prefix == s1.len() {
            return Err(Error::input(format!(
                "{shown}: task {i}: its two completions share {prefix} tokens of {} and {}: nothing to score",
                s0.len(),
                s1.len()
            )));
        }
        let base = [
            tok(format!("{}{}", t.first, t.choices[0]))?.len(),
            tok(format!("{}{}", t.first, t.choices[1]))?.len(),
        ];
        let skip = s0.len() - prefix > K_MIN_TRAILING_CTX && s1.len() - prefix > K_MIN_TRAILING_CTX;
        for (k, seq) in [&s0, &s1].into_iter().enumerate() {
            let b = if skip { base[k] } else { prefix };
            if b < prefix || b >= seq.len() {
                return Err(Error::input(format!(
                    "{shown}: task {i}: choice {} ends at token {b} of {}, outside the part after the shared {prefix}: the tool cannot score it",
                    k + 1,
                    seq.len()
                )));
            }
        }
        let required = s0.len() + s1.len() - prefix;
        prepared.push(Prep {
            seqs: [s0, s1],
            prefix,
            base,
            required,
        });
    }
    let sizes: Vec<(usize, usize)> = prepared.iter().map(|p| (p.required, 2)).collect();
    let batches = tool_batches(&sizes, settings.n_ctx as usize, tasks, shown)?;
    let which = chosen(only, batches.len())?;
    let token_batches: Vec<Vec<SeqToken>> = which
        .iter()
        .map(|&w| {
            let (a, b) = batches[w];
            let mut tokens = Vec::new();
            for (k, p) in prepared[a..b].iter().enumerate() {
                let s0 = 2 * k as i32;
                for (i, &id) in p.seqs[0][..p.prefix].iter().enumerate() {
                    tokens.push(SeqToken {
                        id,
                        pos: i,
                        seqs: vec![s0, s0 + 1],
                        output: i + 1 == p.prefix,
                    });
                }
                for s in 0..2 {
                    for (i, &id) in p.seqs[s].iter().enumerate().skip(p.prefix) {
                        tokens.push(SeqToken {
                            id,
                            pos: i,
                            seqs: vec![s0 + s as i32],
                            output: true,
                        });
                    }
                }
            }
            tokens
        })
        .collect();
    let mut scores: Scores = vec![Vec::new(); tasks.len()];
    if token_batches.is_empty() {
        return Ok((scores, batches));
    }
    let bar = tasks_bar(model, &token_batches, &which, &batches);
    model.decode_batches(settings, &token_batches, &mut |b, rows| {
        let (a, e) = batches[which[b]];
        bar.inc((e - a) as u64);
        let mut at = 0; // the task's first row (its prefix's last token)
        for (k, p) in prepared[a..e].iter().enumerate() {
            let skip = p.seqs[0].len() - p.prefix > K_MIN_TRAILING_CTX
                && p.seqs[1].len() - p.prefix > K_MIN_TRAILING_CTX;
            let mut out = Vec::with_capacity(2);
            for s in 0..2 {
                let seq = &p.seqs[s];
                let base = if skip { p.base[s] } else { p.prefix };
                let last = usize::from(seq.len() - base > 1);
                // The tool's first row index (for the second choice, its FIXME).
                let li = if s == 0 {
                    base - p.prefix
                } else {
                    p.seqs[0].len() - p.prefix + base - p.prefix
                };
                let mut score = 0.0f32;
                for (k, j) in (base - 1..seq.len() - 1 - last).enumerate() {
                    score += tool_logprob(rows[at + li + k], seq[j + 1] as usize);
                }
                out.push(f64::from(score / (seq.len() - base - last) as f32));
            }
            scores[a + k] = out;
            at += 1 + p.seqs[0].len() - p.prefix + p.seqs[1].len() - p.prefix;
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    Ok((scores, batches))
}

/// The batches to decode: `only` (each below `n`), else all `n`.
fn chosen(only: Option<&[usize]>, n: usize) -> Result<Vec<usize>> {
    match only {
        None => Ok((0..n).collect()),
        Some(o) if o.iter().all(|&b| b < n) => Ok(o.to_vec()),
        Some(o) => Err(Error::harness(format!(
            "multiple-choice batches {o:?} asked of {n}"
        ))),
    }
}

/// A task's tokens: one sequence per choice, the shared prefix length.
pub(crate) struct Prepared {
    seqs: Vec<Vec<TokenId>>,
    prefix: usize,
    required: usize,
}

pub(crate) fn prepare(model: &dyn LoadedModel, t: &Task) -> Result<Prepared> {
    let seqs: Vec<Vec<TokenId>> = t
        .choices
        .iter()
        .map(|c| {
            model
                .tokenize(&format!("{} {c}", t.question), BosPolicy::Model)
                .map(|v| v.iter().map(|t| t.id).collect())
        })
        .collect::<Result<_>>()?;
    let min_len = seqs.iter().map(Vec::len).min().unwrap_or(0);
    let prefix = (0..min_len)
        .take_while(|&k| seqs.iter().all(|s| s[k] == seqs[0][k]))
        .count();
    if let Some(j) = seqs.iter().position(|s| s.len() == prefix) {
        return Err(Error::input(format!(
            "choice {j} (`{}`) has no token of its own: its tokens are a prefix of every other choice's",
            t.choices[j]
        )));
    }
    let required = prefix + seqs.iter().map(|s| s.len() - prefix).sum::<usize>();
    Ok(Prepared {
        seqs,
        prefix,
        required,
    })
}

/// Per task: the mean log-probability of each choice, as the tool computes
/// it (in float for `--multiple-choice`, in double for `--hellaswag`).
pub type Scores = Vec<Vec<f64>>;

/// A model's scores of a task file, as the reference store keeps them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KeptScores {
    /// Vocabulary size of the model that scored them (the tokenizer check).
    pub n_vocab: usize,
    /// Its tokenizer fingerprint.
    pub fingerprint: String,
    /// Per task, per choice.
    pub scores: Scores,
}

impl KeptScores {
    /// `model`'s `scores`, with its vocabulary.
    pub fn of(model: &dyn LoadedModel, scores: Scores) -> Self {
        KeptScores {
            n_vocab: model.info().n_vocab,
            fingerprint: model.info().tokenizer_fingerprint.clone(),
            scores,
        }
    }
}

/// What a model's scores of tasks are computed from.
#[derive(Debug, Clone, Copy)]
pub struct ScoresId<'a> {
    /// The model file's sha256.
    pub model_sha256: &'a str,
    /// The engine build that scores it ([`crate::engine::Engine::model_identity`]).
    pub build: &'a str,
    /// The task file's sha256.
    pub file_sha256: &'a str,
    /// Its format.
    pub format: Format,
    /// How many tasks are drawn (0: all), as the tool draws them.
    pub tasks: usize,
    /// The engine settings (threads aside, which change no score).
    pub settings: &'a Settings,
}

/// The sha256 of the code that turns tasks into scores (this kind and the
/// llama.cpp engine): part of every kept score's id, so that a change to
/// how tasks are scored scores them again instead of reading old numbers.
pub(crate) fn scoring_source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| {
        crate::engine::code_sha256(&[
            include_str!("mod.rs"),
            include_str!("formats.rs"),
            include_str!("scoring.rs"),
        ])
    })
}

/// A model's scores of `id`'s tasks as the reference store keeps them for
/// every case and test that scores the same (a candidate's and a
/// reference's scores are one product): `score` runs only when no cache
/// holds them, once across concurrent processes. Scores that are not all
/// finite are returned but not kept.
pub fn kept_scores(
    store: &crate::execute::reference::ReferenceStore,
    id: &ScoresId,
    score: &dyn Fn() -> Result<KeptScores>,
) -> Result<Arc<KeptScores>> {
    let finite = |k: &KeptScores| k.scores.iter().flatten().all(|x| x.is_finite());
    store.kept(&id.key(), "qgmc", &finite, score)
}

impl ScoresId<'_> {
    /// The id of these scores in the reference store.
    pub(crate) fn key(&self) -> String {
        format!(
            "multiple_choice scores|model {}|{}|tasks {} {:?} {}|{}|code {}",
            self.model_sha256,
            self.build,
            self.file_sha256,
            self.format,
            self.tasks,
            self.settings.describe(),
            scoring_source()
        )
    }
}

/// The tool's softmax: float exps, a double sum, float quotients.
pub(crate) fn tool_softmax_at(row: &[f32], tok: usize) -> f32 {
    let max = row.iter().copied().fold(row[0], f32::max);
    let mut sum = 0.0f64;
    let mut p_tok = 0.0f32;
    for (i, &v) in row.iter().enumerate() {
        let e = (v - max).exp();
        sum += f64::from(e);
        if i == tok {
            p_tok = e;
        }
    }
    (f64::from(p_tok) / sum) as f32
}

/// The tool's `compute_logprobs`: all in float.
pub(crate) fn tool_logprob(row: &[f32], tok: usize) -> f32 {
    let max = row.iter().copied().fold(row[0], f32::max);
    let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    row[tok] - max - sum.ln()
}

/// Score `tasks` on `model` with the tool's batches: the scores per task.
pub fn score(
    model: &dyn LoadedModel,
    settings: &Settings,
    tasks: &[(usize, Task)],
    format: Format,
    shown: &str,
) -> Result<Scores> {
    Ok(score_part(model, settings, tasks, format, shown, None)?.0)
}

/// [`score`] of the tool's batches `only` (all when None): the scores of
/// their tasks (empty for the others) and every batch's task range. A
/// batch decodes alone (the cache cleared before it), so its scores are
/// those of the whole run.
pub(crate) fn score_part(
    model: &dyn LoadedModel,
    settings: &Settings,
    tasks: &[(usize, Task)],
    format: Format,
    shown: &str,
    only: Option<&[usize]>,
) -> Result<(Scores, Vec<(usize, usize)>)> {
    let prepared: Vec<Prepared> = tasks
        .iter()
        .map(|(i, t)| prepare(model, t).map_err(|e| e.context(format!("{shown}: task {i}"))))
        .collect::<Result<_>>()?;
    let sizes: Vec<(usize, usize)> = prepared
        .iter()
        .map(|p| (p.required, p.seqs.len()))
        .collect();
    let batches = tool_batches(&sizes, settings.n_ctx as usize, tasks, shown)?;
    let which = chosen(only, batches.len())?;
    let mut token_batches = Vec::new();
    for &(a, b) in which.iter().map(|&w| &batches[w]) {
        let mut tokens = Vec::new();
        let mut s0 = 0i32;
        for p in &prepared[a..b] {
            let seqs: Vec<i32> = (0..p.seqs.len() as i32).map(|s| s0 + s).collect();
            for (i, &id) in p.seqs[0][..p.prefix].iter().enumerate() {
                tokens.push(SeqToken {
                    id,
                    pos: i,
                    seqs: seqs.clone(),
                    output: i + 1 == p.prefix,
                });
            }
            for (s, seq) in p.seqs.iter().enumerate() {
                for (i, &id) in seq.iter().enumerate().skip(p.prefix) {
                    tokens.push(SeqToken {
                        id,
                        pos: i,
                        seqs: vec![s0 + s as i32],
                        output: i + 1 < seq.len(),
                    });
                }
            }
            s0 += p.seqs.len() as i32;
        }
        token_batches.push(tokens);
    }
    let mut scores: Scores = vec![Vec::new(); tasks.len()];
    if token_batches.is_empty() {
        return Ok((scores, batches));
    }
    let bar = tasks_bar(model, &token_batches, &which, &batches);
    model.decode_batches(settings, &token_batches, &mut |b, rows| {
        let (a, e) = batches[which[b]];
        bar.inc((e - a) as u64);
        let mut r = 0;
        for (ti, p) in prepared[a..e].iter().enumerate() {
            let first = rows[r];
            r += 1;
            let mut out = Vec::with_capacity(p.seqs.len());
            for seq in &p.seqs {
                let first_lp = tool_softmax_at(first, seq[p.prefix] as usize).ln();
                let rest = (p.prefix..seq.len() - 1)
                    .map(|j| tool_logprob(rows[r + j - p.prefix], seq[j + 1] as usize));
                let count = seq.len() - p.prefix;
                out.push(match format {
                    // (WinoGrande is scored by `score_winogrande`.)
                    Format::MultipleChoice | Format::Jsonl | Format::Winogrande => {
                        f64::from(rest.fold(first_lp, |a, x| a + x) / count as f32)
                    }
                    Format::Hellaswag => {
                        rest.fold(f64::from(first_lp), |a, x| a + f64::from(x)) / count as f64
                    }
                });
                r += count - 1;
            }
            scores[a + ti] = out;
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    Ok((scores, batches))
}

/// The tool's batches, as task ranges: tasks while their tokens (`sizes`:
/// tokens, sequences per task) fit `n_ctx` and their sequences [`N_SEQ`].
pub(crate) fn tool_batches<T>(
    sizes: &[(usize, usize)],
    n_ctx: usize,
    tasks: &[(usize, T)],
    shown: &str,
) -> Result<Vec<(usize, usize)>> {
    let mut batches = Vec::new();
    let mut i0 = 0;
    while i0 < sizes.len() {
        let (mut n_cur, mut s0, mut i1) = (0, 0, i0);
        while i1 < sizes.len() && n_cur + sizes[i1].0 <= n_ctx {
            let k = sizes[i1].1;
            if s0 + k > N_SEQ {
                if s0 == 0 {
                    return Err(Error::input(format!(
                        "{shown}: task {} has {k} choices, more than the {N_SEQ} sequences of a decode",
                        tasks[i1].0
                    )));
                }
                break;
            }
            s0 += k;
            n_cur += sizes[i1].0;
            i1 += 1;
        }
        if i1 == i0 {
            return Err(Error::input(format!(
                "{shown}: task {} needs {} tokens, more than the context's {n_ctx} (n_ctx × {N_SEQ})",
                tasks[i0].0, sizes[i0].0
            )));
        }
        batches.push((i0, i1));
        i0 = i1;
    }
    Ok(batches)
}

/// The answer as the tool picks it: the highest score, the first on a tie
/// (WinoGrande: the second on a tie, `score_1st > score_2nd ? 1 : 2`).
pub fn pick(format: Format, scores: &[f64]) -> usize {
    match format {
        Format::Winogrande => usize::from(scores[0] <= scores[1]),
        _ => choice(scores),
    }
}

/// The index of the highest score (the first on a tie, as the tool takes it).
pub fn choice(scores: &[f64]) -> usize {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate().skip(1) {
        if s > scores[best] {
            best = i;
        }
    }
    best
}

/// The choices' probabilities: the scores' softmax.
pub(crate) fn choice_probs(scores: &[f64]) -> Vec<f64> {
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|&s| (s - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

/// The best choice's probability minus the second best's.
pub(crate) fn margin(scores: &[f64]) -> f64 {
    let mut p = choice_probs(scores);
    p.sort_by(|a, b| b.total_cmp(a));
    p[0] - p.get(1).copied().unwrap_or(0.0)
}

/// The progress bar of a multiple-choice decode: the tasks of the batches
/// `which` (of `batches`) on `model`.
fn tasks_bar<T>(
    model: &dyn LoadedModel,
    _tokens: &[T],
    which: &[usize],
    batches: &[(usize, usize)],
) -> crate::core::progress::Bar {
    let n: usize = which.iter().map(|&w| batches[w].1 - batches[w].0).sum();
    crate::core::progress::bar(
        n as u64,
        &format!("MC {}", model.info().file.alias),
        "tasks",
    )
}
