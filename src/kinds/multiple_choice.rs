//! `kind = "multiple_choice"`: tasks of a question and its choices, scored
//! exactly as `llama-perplexity --multiple-choice` scores its binary task
//! file (ARC, MMLU, TruthfulQA as llama.cpp ships them): each choice is
//! tokenized as `question + " " + choice` (BOS as the model adds it), the
//! tokens all choices share are decoded once for all of them as one
//! sequence prefix, and a choice's score is the mean log-probability of its
//! tokens after that prefix; the highest score is the answer.
//!
//! Contract: the same batches as the tool (as many tasks as fit in
//! 4 × n_ctx tokens and 4 sequences, a unified KV cache), the same float
//! arithmetic, so accuracy and every task's choice equal the tool's on the
//! same file (`tests/llama_perplexity.rs`). With a reference model: answer
//! agreement, flips right → wrong and wrong → right with McNemar's exact
//! test, and changed answers binned by the reference's margin. A task that
//! cannot be scored (no question, fewer than 2 choices, no correct choice,
//! longer than the context) is an error naming the file and task, never a
//! task counted as wrong. A model's scores of a task file are kept in the
//! reference store ([`kept_scores`]), whichever role it plays: a reference
//! is scored once for all its candidates.

use crate::core::case::{Metric, Pin};
use crate::core::error::{Error, Result};
use crate::core::outcome::{Column, Table};
use crate::core::parse::{case_table, parse_toml, Diagnostics};
use crate::core::{Case, Outcome, Settings};
use crate::engine::{BosPolicy, LoadedModel, SeqToken, TokenId};
use crate::execute::reference::{same_tokenizer, Vocab};
use crate::execute::RunContext;
use crate::kinds::scored_text::PinnedFile;
use crate::kinds::{Kind, Start};
use crate::measure::kld::wilson95;
use std::sync::Arc;
use std::time::Instant;
use toml::Spanned;

/// One task: the question, its choices, which are correct (1).
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The question (or context to continue).
    pub question: String,
    /// The choices.
    pub choices: Vec<String>,
    /// 1 for a correct choice, else 0.
    pub labels: Vec<i32>,
}

/// The sequences of one decode that llama-perplexity allows: `-np 4`.
pub const N_SEQ: usize = 4;

/// A task file's format, as llama-perplexity reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `--multiple-choice`: the binary format (ARC, MMLU, TruthfulQA).
    MultipleChoice,
    /// `--hellaswag`: 6 lines per task (context, gold index, 4 endings).
    Hellaswag,
    /// `--winogrande`: a CSV of sentences with a blank and two choices.
    Winogrande,
    /// Our own, for hand-written suites: one JSON object per line,
    /// `{"question": …, "choices": […], "answer": k}` (k counts from 0),
    /// scored as `--multiple-choice` scores a task.
    Jsonl,
}

/// A `kind = "multiple_choice"` case.
#[derive(Debug, Clone)]
pub struct MultipleChoice {
    /// The task file's format.
    pub format: Format,
    /// The pinned task file.
    pub file: Pin,
    /// How many tasks (0: all), chosen as the tool chooses them.
    pub tasks: usize,
    /// The count the case asked for, when it named one: more than the file
    /// holds is an error (the tool's own default, 400 HellaSwag tasks,
    /// takes all of a smaller file).
    pub tasks_given: Option<usize>,
    /// The tool's `-c`: the context holds `N_SEQ` times this.
    pub n_ctx: u32,
    /// Upper edges of the reference-margin bins, increasing in (0, 1).
    pub margin_bins: Vec<f64>,
    /// A reference model.
    pub reference: Option<(String, crate::core::Location)>,
}

case_table! {
    struct McFile {
        tasks_file: Spanned<PinnedFile>,
        format: Option<Spanned<String>>,
        tasks: Option<usize>,
        n_ctx: Option<Spanned<u32>>,
        margin_bins: Option<Spanned<Vec<f64>>>,
    }
}

/// Parse the kind's keys.
pub fn parse(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>> {
    let f: McFile = parse_toml(diag.path(), src)?;
    let file = f.tasks_file.get_ref().pin("tasks_file", case, diag);
    let format = crate::core::parse::choice(
        f.format.as_ref(),
        "format",
        &[
            ("multiple-choice", Format::MultipleChoice),
            ("hellaswag", Format::Hellaswag),
            ("winogrande", Format::Winogrande),
            ("jsonl", Format::Jsonl),
        ],
        diag,
    );
    let n_ctx = f.n_ctx.as_ref().map_or(512, |n| *n.get_ref());
    if let Some(n) = f.n_ctx.as_ref().filter(|n| *n.get_ref() < 8) {
        diag.push_at(n.span().start, "n_ctx: must be ≥ 8");
    }
    let margin_bins = f
        .margin_bins
        .as_ref()
        .map_or(vec![0.1, 0.3, 0.6], |b| b.get_ref().clone());
    let ok = margin_bins.iter().all(|x| *x > 0.0 && *x < 1.0)
        && margin_bins.windows(2).all(|w| w[0] < w[1]);
    if !ok {
        diag.push_at(
            f.margin_bins.as_ref().map_or(0, |b| b.span().start),
            format!(
                "margin_bins: {margin_bins:?} must be increasing numbers strictly between 0 and 1"
            ),
        );
    }
    Ok(Arc::new(MultipleChoice {
        format,
        file,
        // The tool's defaults: every task, and 400 HellaSwag tasks.
        tasks: f
            .tasks
            .unwrap_or(if format == Format::Hellaswag { 400 } else { 0 }),
        tasks_given: f.tasks.filter(|&k| k > 0),
        n_ctx,
        margin_bins,
        reference: case.reference.clone(),
    }))
}

/// Read llama-perplexity's binary multiple-choice file: `u32` task count,
/// `u32` byte offset of each task, then per task the question (`u32`
/// length + bytes) and two answer sets (`u32` count ≤ 100, the strings,
/// `i32` labels); only the first set is scored. Tasks in file order, or
/// `tasks` of them drawn as the tool draws them (mt19937 seeded 1).
pub fn read_binary(bytes: &[u8], tasks: usize, shown: &str) -> Result<Vec<(usize, Task)>> {
    let bad = |what: String| Error::input(format!("{shown}: {what}"));
    let u32_at = |at: usize, what: &str| -> Result<u32> {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| {
                bad(format!(
                    "{what} at byte {at}: the file ends at byte {}",
                    bytes.len()
                ))
            })
    };
    let n_task = u32_at(0, "task count")? as usize;
    if n_task == 0 {
        return Err(bad("no tasks (task count 0)".into()));
    }
    if 4 + 4 * n_task > bytes.len() {
        return Err(bad(format!(
            "{n_task} tasks claimed, but {} bytes cannot hold their offsets (not a --multiple-choice file?)",
            bytes.len()
        )));
    }
    let offsets: Vec<usize> = (0..n_task)
        .map(|i| u32_at(4 + 4 * i, "task offset").map(|o| o as usize))
        .collect::<Result<_>>()?;
    let read_task = |i: usize, mut at: usize| -> Result<(Task, usize)> {
        let ctx = |w: &str| format!("task {i}: {w}");
        let string = |at: &mut usize, w: &str| -> Result<String> {
            let n = u32_at(*at, &ctx(w))? as usize;
            let s = bytes.get(*at + 4..*at + 4 + n).ok_or_else(|| {
                bad(format!(
                    "{} of {n} bytes at byte {}: the file ends first",
                    ctx(w),
                    *at
                ))
            })?;
            *at += 4 + n;
            String::from_utf8(s.to_vec())
                .map_err(|_| bad(format!("{} at byte {}: not UTF-8", ctx(w), *at - n)))
        };
        let question = string(&mut at, "question")?;
        let mut sets = Vec::new();
        for set in ["mc1", "mc2"] {
            let n = u32_at(at, &ctx(&format!("{set} answer count")))? as usize;
            if n > 100 {
                return Err(bad(ctx(&format!(
                    "{set} has {n} answers, more than the tool's 100"
                ))));
            }
            at += 4;
            let answers: Vec<String> = (0..n)
                .map(|j| string(&mut at, &format!("{set} answer {j}")))
                .collect::<Result<_>>()?;
            let labels: Vec<i32> = (0..n)
                .map(|j| u32_at(at + 4 * j, &ctx(&format!("{set} label {j}"))).map(|v| v as i32))
                .collect::<Result<_>>()?;
            at += 4 * n;
            sets.push((answers, labels));
        }
        let (choices, labels) = sets.swap_remove(0);
        Ok((
            Task {
                question,
                choices,
                labels,
            },
            at,
        ))
    };
    let order: Vec<usize> = if tasks == 0 || tasks >= n_task {
        (0..n_task).collect()
    } else {
        tool_selection(n_task, tasks)
    };
    let mut out = Vec::new();
    if order.len() == n_task {
        // All tasks: read one after another from the end of the offsets, as the tool does.
        let mut at = 4 + 4 * n_task;
        for i in 0..n_task {
            let (t, next) = read_task(i, at)?;
            out.push((i, t));
            at = next;
        }
    } else {
        for i in order {
            out.push((i, read_task(i, offsets[i])?.0));
        }
    }
    for (i, t) in &out {
        let why = if t.question.is_empty() {
            Some("an empty question".to_string())
        } else if t.choices.len() < 2 {
            Some(format!(
                "{} choice(s); a task needs at least 2",
                t.choices.len()
            ))
        } else if let Some(j) = t.choices.iter().position(String::is_empty) {
            Some(format!("choice {j} is empty"))
        } else if !t.labels.contains(&1) {
            Some("no choice is labelled correct (1)".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(bad(format!("task {i}: {why}")));
        }
    }
    Ok(out)
}

/// The tasks llama-perplexity draws for `--multiple-choice-tasks k` out of
/// `n`: mt19937 seeded 1, `j = (int)(scale · rng() · left)` in float, swap
/// with the last.
pub fn tool_selection(n: usize, k: usize) -> Vec<usize> {
    let mut rng = Mt19937::new(1);
    let mut aux: Vec<usize> = (0..n).collect();
    let scale = 1.0f32 / (1.0f32 + u32::MAX as f32);
    (0..k)
        .map(|_| {
            let j = (scale * rng.next() as f32 * aux.len() as f32) as usize;
            let idx = aux[j];
            let last = aux.len() - 1;
            aux[j] = aux[last];
            aux.pop();
            idx
        })
        .collect()
}

/// Read llama-perplexity's HellaSwag file: 6 lines per task (the context,
/// the gold ending's index, 4 endings). `tasks` of them (all when fewer),
/// drawn as the tool draws them: each the `uniform_int_distribution` pick
/// (libstdc++'s) of mt19937(1) among those left, then removed.
pub fn read_hellaswag(bytes: &[u8], tasks: usize, shown: &str) -> Result<Vec<(usize, Task)>> {
    let bad = |what: String| Error::input(format!("{shown}: {what}"));
    let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let mut lines: Vec<&str> = text.split('\n').collect();
    // std::getline: a final newline ends the last line, it does not start one.
    if lines.last() == Some(&"") {
        lines.pop();
    }
    if lines.is_empty() || !lines.len().is_multiple_of(6) {
        return Err(bad(format!(
            "{} lines, not a positive multiple of 6 (a --hellaswag file has 6 lines per task)",
            lines.len()
        )));
    }
    let mut left: Vec<(usize, &[&str])> = lines.chunks(6).enumerate().collect();
    let n = tasks.min(left.len());
    let mut rng = Mt19937::new(1);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let j = uniform_below(&mut rng, left.len() as u32) as usize;
        let (i, t) = left.remove(j);
        let gold: usize = t[1].trim().parse().ok().filter(|g| *g < 4).ok_or_else(|| {
            bad(format!(
                "task {i} (line {}): gold ending `{}` is not 0, 1, 2 or 3",
                6 * i + 2,
                t[1]
            ))
        })?;
        if t[0].is_empty() {
            return Err(bad(format!(
                "task {i} (line {}): an empty context",
                6 * i + 1
            )));
        }
        if let Some(k) = t[2..].iter().position(|e| e.is_empty()) {
            return Err(bad(format!(
                "task {i} (line {}): ending {k} is empty",
                6 * i + 3 + k
            )));
        }
        out.push((
            i,
            Task {
                question: t[0].to_string(),
                choices: t[2..].iter().map(|e| e.to_string()).collect(),
                labels: (0..4).map(|k| i32::from(k == gold)).collect(),
            },
        ));
    }
    Ok(out)
}

/// libstdc++'s `uniform_int_distribution<size_t>(0, range − 1)` on a 32-bit
/// engine: Lemire's multiply-and-reject (`_S_nd`, GCC ≥ 11).
pub fn uniform_below(rng: &mut Mt19937, range: u32) -> u32 {
    let mut product = u64::from(rng.next()) * u64::from(range);
    let mut low = product as u32;
    if low < range {
        let threshold = range.wrapping_neg() % range;
        while low < threshold {
            product = u64::from(rng.next()) * u64::from(range);
            low = product as u32;
        }
    }
    (product >> 32) as u32
}

/// Read llama-perplexity's WinoGrande CSV: per line `index,sentence,choice1,choice2,answer`
/// (the sentence quoted when it holds commas, one `_` where a choice goes,
/// the answer 1 or 2), split at the first four commas outside quotes as the
/// tool splits it. A line the tool would skip (not four commas, no `_`, an
/// answer not 1 or 2) or leave out (the last line, unless an empty line
/// ends the file) is an error here, naming the line. `tasks` of them (0: all) drawn as
/// `--winogrande-tasks` draws them.
pub fn read_winogrande(
    bytes: &[u8],
    tasks: usize,
    shown: &str,
) -> Result<Vec<(usize, Winogrande)>> {
    let bad = |what: String| Error::input(format!("{shown}: {what}"));
    let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    // `-f` drops one final newline; the tool's reader then stops at the line
    // that reaches the end of the text, leaving it out: only an empty last
    // line (a file ending in a blank line) leaves none out.
    let text = text.strip_suffix('\n').unwrap_or(text);
    let mut lines: Vec<&str> = text.split('\n').collect();
    match lines.pop() {
        Some("") | None => {}
        Some(last) => return Err(bad(format!(
            "line {}: `{last}`: llama-perplexity leaves out the last line of a --winogrande file \
                 unless the file ends with an empty line; add one, so that every task counts",
            lines.len() + 1
        ))),
    }
    let mut all = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let at = |what: &str| bad(format!("line {}: {what}", n + 1));
        let b = line.as_bytes();
        let mut commas = Vec::new();
        let mut quoted = false;
        for (i, &c) in b.iter().enumerate() {
            if !quoted && c == b',' {
                commas.push(i);
                if commas.len() == 4 {
                    break;
                }
            } else if c == b'"' {
                quoted = !quoted;
            }
        }
        if commas.len() != 4 {
            return Err(at(
                "not 5 comma-separated fields (index,sentence,choice1,choice2,answer)",
            ));
        }
        let sub = |a: usize, len: usize| line.get(a..a + len).ok_or_else(|| at("a field is cut"));
        let sentence = if b.get(commas[0] + 1) == Some(&b'"') {
            sub(commas[0] + 2, (commas[1] - commas[0]).saturating_sub(3))?
        } else {
            sub(commas[0] + 1, commas[1] - commas[0] - 1)?
        };
        let choice1 = sub(commas[1] + 1, commas[2] - commas[1] - 1)?;
        let choice2 = sub(commas[2] + 1, commas[3] - commas[2] - 1)?;
        let answer = &line[commas[3] + 1..];
        let Some(blank) = sentence.find('_') else {
            return Err(at("the sentence has no `_` where a choice goes"));
        };
        // `stream >> int`: leading blanks, then a number; trailing text ignored.
        let digits: String = answer
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-' || *c == '+')
            .collect();
        let answer: i32 = match digits.parse() {
            Ok(a @ 1..=2) => a,
            _ => return Err(at(&format!("answer `{answer}` is not 1 or 2"))),
        };
        all.push(Winogrande {
            first: sentence[..blank].to_string(),
            second: sentence[blank + 1..].to_string(),
            choices: [choice1.to_string(), choice2.to_string()],
            answer,
        });
    }
    drawn(all, tasks, &bad)
}

/// One WinoGrande task: the sentence around the blank, the two choices,
/// the answer (1 or 2).
#[derive(Debug, Clone, PartialEq)]
pub struct Winogrande {
    /// The sentence before the blank.
    pub first: String,
    /// The sentence after the blank.
    pub second: String,
    /// The two choices.
    pub choices: [String; 2],
    /// 1 or 2.
    pub answer: i32,
}

impl Winogrande {
    /// As a [`Task`]: the sentence with a blank, the choices, the labels.
    pub fn task(&self) -> Task {
        Task {
            question: format!("{}_{}", self.first, self.second),
            choices: self.choices.to_vec(),
            labels: vec![i32::from(self.answer == 1), i32::from(self.answer == 2)],
        }
    }
}

/// The tool's minimum of tokens after the choice for partial scoring.
const K_MIN_TRAILING_CTX: usize = 3;

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
    let token_batches: Vec<Vec<SeqToken>> = batches
        .iter()
        .map(|&(a, b)| {
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
    model.decode_batches(settings, &token_batches, &mut |b, rows| {
        let (a, e) = batches[b];
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
    Ok(scores)
}

/// `n` computed WinoGrande lines (a CSV as [`read_winogrande`] reads it):
/// two people and two numbers, and a blank only the larger (or smaller)
/// number answers; sentences with commas are quoted; some tails are short
/// (the tool then scores from the shared prefix) and some long (it scores
/// after the choice word). The task file `suites/mc/winogrande.toml` pins.
pub fn computed_winogrande(n: usize, seed: u64) -> String {
    let mut rng = crate::measure::SplitMix64(seed);
    let mut next = move |m: u64| rng.next_u64() % m;
    const NAMES: [&str; 8] = [
        "Tom", "Ann", "Maria", "Ken", "Sarah", "Omar", "Lena", "Paul",
    ];
    const FORMS: [(&str, &str, bool); 4] = [
        (
            "{a} is {x} years old and {b} is {y}, so _ is older.",
            "years",
            true,
        ),
        (
            "{a} ran {x} km and {b} ran {y} km, so _ ran farther than the other runner did today.",
            "km",
            true,
        ),
        (
            "{a} paid {x} dollars and {b} paid {y} dollars, so _ paid less.",
            "dollars",
            false,
        ),
        (
            "{a} has {x} books while {b} has {y} books so _ has more books on the shelf at home.",
            "books",
            true,
        ),
    ];
    let mut out = String::new();
    for i in 0..n {
        let a = NAMES[next(8) as usize];
        let b = loop {
            let b = NAMES[next(8) as usize];
            if b != a {
                break b;
            }
        };
        let (x, y) = loop {
            let (x, y) = (2 + next(60), 2 + next(60));
            if x != y {
                break (x, y);
            }
        };
        let (form, _, larger) = FORMS[i % FORMS.len()];
        let sentence = form
            .replace("{a}", a)
            .replace("{b}", b)
            .replace("{x}", &x.to_string())
            .replace("{y}", &y.to_string());
        let answer = if (x > y) == larger { 1 } else { 2 };
        let field = if sentence.contains(',') {
            format!("\"{sentence}\"")
        } else {
            sentence
        };
        out.push_str(&format!("{i},{field},{a},{b},{answer}\n"));
    }
    // An empty last line: the tool reads every task (see `read_winogrande`).
    out.push('\n');
    out
}

/// Read our own task format: one JSON object per line (blank lines
/// skipped), `question` (a string), `choices` (at least 2 strings),
/// `answer` (the index of the correct choice, from 0); `tasks` of them
/// (0: all) drawn as `--multiple-choice-tasks` draws them. Every problem is
/// an error naming the line.
pub fn read_jsonl(bytes: &[u8], tasks: usize, shown: &str) -> Result<Vec<(usize, Task)>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Line {
        question: String,
        choices: Vec<String>,
        answer: usize,
    }
    let bad = |what: String| Error::input(format!("{shown}: {what}"));
    let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let mut all = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = |what: String| bad(format!("line {}: {what}", n + 1));
        let l: Line = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        if l.choices.len() < 2 {
            return Err(at(format!(
                "{} choice(s); a task needs at least 2",
                l.choices.len()
            )));
        }
        if l.answer >= l.choices.len() {
            return Err(at(format!(
                "answer {} is out of range: choices count from 0 to {}",
                l.answer,
                l.choices.len() - 1
            )));
        }
        if l.question.is_empty() || l.choices.iter().any(String::is_empty) {
            return Err(at("an empty question or choice".into()));
        }
        all.push(Task {
            question: l.question,
            labels: (0..l.choices.len())
                .map(|k| i32::from(k == l.answer))
                .collect(),
            choices: l.choices,
        });
    }
    drawn(all, tasks, &bad)
}

/// `tasks` of `all` (0: every one, in order) drawn as the tool's
/// `--multiple-choice-tasks` / `--winogrande-tasks` draw them, with their
/// indices; no task at all is an error.
fn drawn<T: Clone>(
    all: Vec<T>,
    tasks: usize,
    bad: &dyn Fn(String) -> Error,
) -> Result<Vec<(usize, T)>> {
    if all.is_empty() {
        return Err(bad("no tasks".into()));
    }
    let order: Vec<usize> = if tasks == 0 || tasks >= all.len() {
        (0..all.len()).collect()
    } else {
        tool_selection(all.len(), tasks)
    };
    Ok(order.into_iter().map(|i| (i, all[i].clone())).collect())
}

/// The 32-bit Mersenne Twister (`std::mt19937`).
pub struct Mt19937 {
    mt: [u32; 624],
    i: usize,
}

impl Mt19937 {
    /// Seeded as `std::mt19937(seed)`.
    pub fn new(seed: u32) -> Self {
        let mut mt = [0u32; 624];
        mt[0] = seed;
        for i in 1..624 {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { mt, i: 624 }
    }

    /// The next output.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u32 {
        if self.i >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7fff_ffff);
                let mut v = self.mt[(k + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[k] = v;
            }
            self.i = 0;
        }
        let mut y = self.mt[self.i];
        self.i += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

/// Write tasks in the binary format [`read_binary`] reads (and
/// llama-perplexity's `--multiple-choice`), with an empty second answer set.
pub fn write_binary(tasks: &[Task]) -> Vec<u8> {
    let mut body: Vec<Vec<u8>> = Vec::new();
    for t in tasks {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u32).to_le_bytes());
            b.extend(x.as_bytes());
        };
        s(&mut b, &t.question);
        b.extend((t.choices.len() as u32).to_le_bytes());
        for c in &t.choices {
            s(&mut b, c);
        }
        for l in &t.labels {
            b.extend(l.to_le_bytes());
        }
        b.extend(0u32.to_le_bytes());
        body.push(b);
    }
    let mut out = Vec::new();
    out.extend((tasks.len() as u32).to_le_bytes());
    let mut at = 4 + 4 * tasks.len();
    for b in &body {
        out.extend((at as u32).to_le_bytes());
        at += b.len();
    }
    for b in body {
        out.extend(b);
    }
    out
}

/// `n` computed tasks with one verifiable answer each — sums and products,
/// decimal digits of π, unit conversions — with 2 to 4 choices (distractors
/// near the answer), the correct one at a seeded position: the task file
/// `suites/mc/` pins (`suites/data/mc-computed.bin`).
pub fn computed_tasks(n: usize, seed: u64) -> Vec<Task> {
    generate(n, seed, None)
}

/// [`computed_tasks`] with 4 choices each and one-line questions: a
/// `--hellaswag` file's tasks ([`write_hellaswag`]).
pub fn computed_hellaswag(n: usize, seed: u64) -> Vec<Task> {
    generate(n, seed, Some(4))
        .into_iter()
        .map(|t| Task {
            question: t.question.replace('\n', " "),
            ..t
        })
        .collect()
}

fn generate(n: usize, seed: u64, forced: Option<usize>) -> Vec<Task> {
    let mut rng = crate::measure::SplitMix64(seed);
    let mut next = move |m: u64| rng.next_u64() % m;
    let pi = crate::kinds::digits::pi(60);
    let frac: Vec<char> = pi.chars().skip(2).collect();
    let ordinal = |k: u64| {
        let suffix = match (k % 10, k % 100) {
            (1, r) if r != 11 => "st",
            (2, r) if r != 12 => "nd",
            (3, r) if r != 13 => "rd",
            _ => "th",
        };
        format!("{k}{suffix}")
    };
    (0..n)
        .map(|i| {
            let n_choices = 2 + next(3) as usize;
            let n_choices = forced.unwrap_or(n_choices);
            let (question, answer, mut near): (String, i64, Vec<i64>) = match i % 4 {
                0 => {
                    let (a, b) = (10 + next(90) as i64, 10 + next(90) as i64);
                    (format!("Question: What is {a} + {b}?\nAnswer:"), a + b, vec![1, -1, 10, -10, 2])
                }
                1 => {
                    let (a, b) = (2 + next(11) as i64, 2 + next(11) as i64);
                    (format!("Question: What is {a} times {b}?\nAnswer:"), a * b, vec![a, -a, b, 1, -1])
                }
                2 => {
                    let k = 1 + next(40);
                    let d = frac[k as usize - 1].to_digit(10).unwrap_or(0) as i64;
                    (
                        format!("Question: What is the {} digit after the decimal point of pi?\nAnswer:", ordinal(k)),
                        d,
                        vec![1, -1, 2, -2, 3],
                    )
                }
                _ => {
                    let m = 2 + next(9) as i64;
                    (format!("Question: How many centimetres are in {m} metres?\nAnswer:"), m * 100, vec![-90 * m, 900 * m, -50, 50, 100])
                }
            };
            if forced.is_some() {
                near.extend([3, -3, 4, -4, 5, -5, 20, -20, 7, 30]);
            }
            // No choice spells the start of another: the shared prefix of
            // their tokens would swallow the shorter one.
            let mut choices = vec![answer];
            for d in near {
                let c = answer + d;
                let clash = |o: &i64| {
                    let (a, b) = (c.to_string(), o.to_string());
                    a.starts_with(&b) || b.starts_with(&a)
                };
                if choices.len() < n_choices && c >= 0 && !choices.iter().any(clash) && (i % 4 != 2 || c <= 9) {
                    choices.push(c);
                }
            }
            // The correct choice at a seeded position.
            let at = next(choices.len() as u64) as usize;
            choices.swap(0, at);
            Task {
                question,
                labels: choices.iter().map(|c| i32::from(*c == answer)).collect(),
                choices: choices.iter().map(|c| c.to_string()).collect(),
            }
        })
        .collect()
}

/// Write 4-choice tasks as a `--hellaswag` file (6 lines per task).
pub fn write_hellaswag(tasks: &[Task]) -> Result<String> {
    let mut out = String::new();
    for (i, t) in tasks.iter().enumerate() {
        let gold = t.labels.iter().position(|l| *l == 1);
        let clean = |s: &str| !s.contains('\n');
        match gold {
            Some(g)
                if t.choices.len() == 4
                    && clean(&t.question)
                    && t.choices.iter().all(|c| clean(c)) =>
            {
                out.push_str(&format!("{}\n{g}\n{}\n", t.question, t.choices.join("\n")));
            }
            _ => {
                return Err(Error::input(format!(
                    "task {i}: a --hellaswag task has 4 one-line endings and one gold one"
                )))
            }
        }
    }
    Ok(out)
}

/// A task's tokens: one sequence per choice, the shared prefix length.
struct Prepared {
    seqs: Vec<Vec<TokenId>>,
    prefix: usize,
    required: usize,
}

fn prepare(model: &dyn LoadedModel, t: &Task) -> Result<Prepared> {
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
fn scoring_source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| {
        let code = [
            include_str!("multiple_choice.rs"),
            include_str!("../engine/mod.rs"),
            include_str!("../engine/llama.rs"),
        ]
        .concat();
        crate::core::fsutil::sha256_bytes(code.as_bytes())
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
    let key = format!(
        "multiple_choice scores|model {}|{}|tasks {} {:?} {}|{}|code {}",
        id.model_sha256,
        id.build,
        id.file_sha256,
        id.format,
        id.tasks,
        id.settings.describe(),
        scoring_source()
    );
    let finite = |k: &KeptScores| k.scores.iter().flatten().all(|x| x.is_finite());
    store.kept(&key, "qgmc", &finite, score)
}

/// The tool's softmax: float exps, a double sum, float quotients.
fn tool_softmax_at(row: &[f32], tok: usize) -> f32 {
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
fn tool_logprob(row: &[f32], tok: usize) -> f32 {
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
    let prepared: Vec<Prepared> = tasks
        .iter()
        .map(|(i, t)| prepare(model, t).map_err(|e| e.context(format!("{shown}: task {i}"))))
        .collect::<Result<_>>()?;
    let sizes: Vec<(usize, usize)> = prepared
        .iter()
        .map(|p| (p.required, p.seqs.len()))
        .collect();
    let batches = tool_batches(&sizes, settings.n_ctx as usize, tasks, shown)?;
    let mut token_batches = Vec::new();
    for &(a, b) in &batches {
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
    model.decode_batches(settings, &token_batches, &mut |b, rows| {
        let (a, e) = batches[b];
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
    Ok(scores)
}

/// The tool's batches, as task ranges: tasks while their tokens (`sizes`:
/// tokens, sequences per task) fit `n_ctx` and their sequences [`N_SEQ`].
fn tool_batches<T>(
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
pub fn choice_probs(scores: &[f64]) -> Vec<f64> {
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|&s| (s - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

/// The best choice's probability minus the second best's.
pub fn margin(scores: &[f64]) -> f64 {
    let mut p = choice_probs(scores);
    p.sort_by(|a, b| b.total_cmp(a));
    p[0] - p.get(1).copied().unwrap_or(0.0)
}

/// McNemar's exact test: the two-sided binomial p-value of `b` against `c`
/// discordant pairs.
pub fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // Σ_{i ≤ k} C(n, i) / 2^n, in logs.
    let ln_c = |i: u64| {
        statrs::function::gamma::ln_gamma(n as f64 + 1.0)
            - statrs::function::gamma::ln_gamma(i as f64 + 1.0)
            - statrs::function::gamma::ln_gamma((n - i) as f64 + 1.0)
    };
    let tail: f64 = (0..=k)
        .map(|i| (ln_c(i) - n as f64 * std::f64::consts::LN_2).exp())
        .sum();
    (2.0 * tail).min(1.0)
}

impl MultipleChoice {
    fn settings(&self, threads: u32) -> Settings {
        let n_ctx = self.n_ctx * N_SEQ as u32;
        let mut s = Settings::new(n_ctx, threads);
        s.n_batch = 2048.min(n_ctx);
        s.n_ubatch = 512.min(s.n_batch);
        s.n_seq = N_SEQ as u32;
        s
    }

    fn metric_names(&self) -> Vec<String> {
        let mut m: Vec<String> = [
            "tasks",
            "correct",
            "accuracy",
            "accuracy_se",
            "accuracy_wilson95_lo",
            "accuracy_wilson95_hi",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if self.reference.is_some() {
            for s in [
                "ref_correct",
                "ref_accuracy",
                "agreement",
                "flips_right_to_wrong",
                "flips_wrong_to_right",
                "mcnemar_p",
            ] {
                m.push(s.into());
            }
            for b in 0..=self.margin_bins.len() {
                for s in [
                    "n",
                    "changed",
                    "right_to_wrong",
                    "changed_rate",
                    "changed_rate_wilson95_lo",
                    "changed_rate_wilson95_hi",
                ] {
                    m.push(format!("margin_bin{b}_{s}"));
                }
            }
        }
        m
    }
}

const COUNTS: &[&str] = &[
    "tasks",
    "correct",
    "ref_correct",
    "flips_right_to_wrong",
    "flips_wrong_to_right",
];

impl Kind for MultipleChoice {
    fn metrics(&self) -> Vec<Metric> {
        self.metric_names()
            .into_iter()
            .map(|n| {
                let count = COUNTS.contains(&n.as_str())
                    || (n.starts_with("margin_bin")
                        && (n.ends_with("_n")
                            || n.ends_with("_changed")
                            || n.ends_with("_right_to_wrong")));
                if count {
                    Metric::count(n)
                } else {
                    Metric::float(n)
                }
            })
            .collect()
    }

    fn headline(&self) -> Vec<&'static str> {
        vec![
            "accuracy",
            "accuracy_wilson95_lo",
            "accuracy_wilson95_hi",
            "tasks",
            "agreement",
            "flips_right_to_wrong",
            "flips_wrong_to_right",
            "mcnemar_p",
        ]
    }

    fn pins(&self) -> Vec<Pin> {
        vec![self.file.clone()]
    }

    /// About a row per 4 bytes of the task file (every ending is scored
    /// after its context), for the candidate and the reference; read from
    /// the file's size, 0 when it cannot be read (the run says why).
    fn weight(&self) -> usize {
        let bytes = std::fs::metadata(&self.file.path).map_or(0, |m| m.len() as usize);
        bytes / 4 * (1 + usize::from(self.reference.is_some()))
    }

    fn start(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<Start> {
        let t = Instant::now();
        let shown = self.file.path.display().to_string();
        let bytes = self.file.read_bytes()?;
        let wino = match self.format {
            Format::Winogrande => Some(read_winogrande(&bytes, self.tasks, &shown)?),
            _ => None,
        };
        let tasks = match (self.format, &wino) {
            (Format::MultipleChoice, _) => read_binary(&bytes, self.tasks, &shown)?,
            (Format::Hellaswag, _) => read_hellaswag(&bytes, self.tasks, &shown)?,
            (Format::Jsonl, _) => read_jsonl(&bytes, self.tasks, &shown)?,
            (Format::Winogrande, w) => w.iter().flatten().map(|(i, t)| (*i, t.task())).collect(),
        };
        // Fewer drawn than asked for: the file holds fewer (all were taken).
        if let Some(k) = self.tasks_given.filter(|&k| k > tasks.len()) {
            return Err(Error::input(format!(
                "{}: tasks = {k}, but {shown} holds {} tasks: give at most {}, or leave \
                 `tasks` out to score all of them",
                case.path.display(),
                tasks.len(),
                tasks.len()
            )));
        }
        let score = |m: &dyn LoadedModel, settings: &Settings| match &wino {
            Some(w) => score_winogrande(m, settings, w, &shown),
            None => score(m, settings, &tasks, self.format, &shown),
        };
        let (verified, model) = cx.load(alias)?;
        out.timings.prepare = t.elapsed();
        out.model_sha256 = Some(verified.file.sha256.clone());
        let settings = self.settings(cx.threads);
        out.settings = Some(settings.clone());
        let t = Instant::now();
        // Both models' scores through the reference store: a reference
        // scored for one candidate (or a model scored by another case or
        // test) is not scored again.
        let build = cx.identity_of(alias);
        let of = |model_sha256, build| ScoresId {
            model_sha256,
            build,
            file_sha256: &self.file.sha256,
            format: self.format,
            tasks: self.tasks,
            settings: &settings,
        };
        let kept = kept_scores(&cx.references, &of(&verified.file.sha256, &build), &|| {
            Ok(KeptScores::of(&*model, score(&*model, &settings)?))
        })
        .map_err(|e| e.context(case.path.display()))?;
        let scores = &kept.scores;
        let refs = match &self.reference {
            Some((r, at)) => {
                let pinned = cx.pinned_sha256(r).map_err(|e| e.context(at))?;
                let rbuild = cx.identity_of(r);
                let kept = kept_scores(&cx.references, &of(&pinned, &rbuild), &|| {
                    let (_, rmodel) = cx.load_reference((r, at), Vocab::of(model.info()))?;
                    Ok(KeptScores::of(&*rmodel, score(&*rmodel, &settings)?))
                })?;
                let scored_by = Vocab {
                    alias: r,
                    n_vocab: kept.n_vocab,
                    fingerprint: &kept.fingerprint,
                };
                same_tokenizer(at, "reference", scored_by, Vocab::of(model.info()))?;
                Some(kept)
            }
            None => None,
        };
        let refs = refs.as_ref().map(|k| &k.scores);
        out.timings.decode = t.elapsed();
        // Each task's pick, and whether it is a correct choice.
        let verdicts = |scores: &Scores| -> (Vec<usize>, Vec<bool>) {
            let chosen: Vec<usize> = scores.iter().map(|s| pick(self.format, s)).collect();
            let right = tasks
                .iter()
                .zip(&chosen)
                .map(|((_, t), &c)| t.labels[c] == 1)
                .collect();
            (chosen, right)
        };
        let (chosen, right) = verdicts(scores);
        let n = tasks.len();
        let k = right.iter().filter(|r| **r).count();
        let m = &mut out.metrics;
        let p = k as f64 / n as f64;
        let (lo, hi) = wilson95(k, n);
        m.insert("tasks".into(), n as f64);
        m.insert("correct".into(), k as f64);
        m.insert("accuracy".into(), p);
        m.insert(
            "accuracy_se".into(),
            (p * (1.0 - p) / (n as f64 - 1.0)).sqrt(),
        );
        m.insert("accuracy_wilson95_lo".into(), lo);
        m.insert("accuracy_wilson95_hi".into(), hi);
        let mut columns: Vec<(String, Column)> = vec![
            (
                "task".into(),
                Column::I32(tasks.iter().map(|(i, _)| *i as i32).collect()),
            ),
            (
                "chosen".into(),
                Column::I32(chosen.iter().map(|c| *c as i32).collect()),
            ),
            ("correct".into(), Column::Bool(right.clone())),
            (
                "logprobs".into(),
                Column::Str(scores.iter().map(|s| format!("{s:?}")).collect()),
            ),
            (
                "margin".into(),
                Column::F64(scores.iter().map(|s| margin(s)).collect()),
            ),
        ];
        if let Some(refs) = &refs {
            let (rchosen, rright) = verdicts(refs);
            let b = rright
                .iter()
                .zip(&right)
                .filter(|(r, c)| **r && !**c)
                .count() as u64;
            let c = rright
                .iter()
                .zip(&right)
                .filter(|(r, c)| !**r && **c)
                .count() as u64;
            let agree = rchosen.iter().zip(&chosen).filter(|(a, b)| a == b).count();
            m.insert(
                "ref_correct".into(),
                rright.iter().filter(|r| **r).count() as f64,
            );
            m.insert(
                "ref_accuracy".into(),
                rright.iter().filter(|r| **r).count() as f64 / n as f64,
            );
            m.insert("agreement".into(), agree as f64 / n as f64);
            m.insert("flips_right_to_wrong".into(), b as f64);
            m.insert("flips_wrong_to_right".into(), c as f64);
            m.insert("mcnemar_p".into(), mcnemar_exact(b, c));
            let rmargin: Vec<f64> = refs.iter().map(|s| margin(s)).collect();
            for bin in 0..=self.margin_bins.len() {
                let lo = if bin == 0 {
                    0.0
                } else {
                    self.margin_bins[bin - 1]
                };
                let hi = self.margin_bins.get(bin).copied().unwrap_or(f64::INFINITY);
                let idx: Vec<usize> = (0..n)
                    .filter(|&i| rmargin[i] >= lo && rmargin[i] < hi)
                    .collect();
                let changed = idx.iter().filter(|&&i| rchosen[i] != chosen[i]).count();
                let r2w = idx.iter().filter(|&&i| rright[i] && !right[i]).count();
                m.insert(format!("margin_bin{bin}_n"), idx.len() as f64);
                m.insert(format!("margin_bin{bin}_changed"), changed as f64);
                m.insert(format!("margin_bin{bin}_right_to_wrong"), r2w as f64);
                if !idx.is_empty() {
                    let (wl, wh) = wilson95(changed, idx.len());
                    m.insert(
                        format!("margin_bin{bin}_changed_rate"),
                        changed as f64 / idx.len() as f64,
                    );
                    m.insert(format!("margin_bin{bin}_changed_rate_wilson95_lo"), wl);
                    m.insert(format!("margin_bin{bin}_changed_rate_wilson95_hi"), wh);
                }
            }
            columns.push((
                "ref_chosen".into(),
                Column::I32(rchosen.iter().map(|c| *c as i32).collect()),
            ));
            columns.push(("ref_correct".into(), Column::Bool(rright)));
            columns.push((
                "ref_logprobs".into(),
                Column::Str(refs.iter().map(|s| format!("{s:?}")).collect()),
            ));
            columns.push(("ref_margin".into(), Column::F64(rmargin)));
        }
        out.rows = Some(Arc::new(Table {
            name: "mc_task",
            columns,
        }));
        Ok(Start::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// std::mt19937(1)'s first outputs, and its 10000th (the C++ standard's
    /// check value for the default seed 5489).
    #[test]
    fn mersenne_twister_is_std_mt19937() {
        let mut r = Mt19937::new(1);
        assert_eq!(r.next(), 1_791_095_845);
        assert_eq!(r.next(), 4_282_876_139);
        let mut d = Mt19937::new(5489);
        let mut v = 0;
        for _ in 0..10000 {
            v = d.next();
        }
        assert_eq!(v, 4_123_659_995);
    }

    /// The binary format round-trips; bad files are errors naming the task
    /// and the byte; a task without a correct choice or with one choice is
    /// refused, not scored.
    #[test]
    fn binary_tasks_round_trip_and_bad_ones_are_named() {
        let t = |q: &str, c: &[&str], right: usize| Task {
            question: q.into(),
            choices: c.iter().map(|s| s.to_string()).collect(),
            labels: (0..c.len()).map(|i| i32::from(i == right)).collect(),
        };
        let tasks = vec![t("2+2=", &["4", "5"], 0), t("3+3=", &["5", "6", "7"], 1)];
        let bytes = write_binary(&tasks);
        let back = read_binary(&bytes, 0, "f.bin").unwrap();
        assert_eq!(back.iter().map(|x| x.1.clone()).collect::<Vec<_>>(), tasks);
        let cut = read_binary(&bytes[..bytes.len() - 3], 0, "f.bin")
            .unwrap_err()
            .to_string();
        assert!(
            cut.contains("f.bin: task 1:") && cut.contains("the file ends"),
            "{cut}"
        );
        let e = read_binary(&write_binary(&[t("q", &["a"], 0)]), 0, "f.bin")
            .unwrap_err()
            .to_string();
        assert!(e.contains("task 0: 1 choice(s)"), "{e}");
        let mut none = t("q", &["a", "b"], 0);
        none.labels = vec![0, 0];
        let e = read_binary(&write_binary(&[none]), 0, "f.bin")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no choice is labelled correct"), "{e}");
        let e = read_binary(b"\x05\0\0\0", 0, "f.bin")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a --multiple-choice file"), "{e}");
        assert_eq!(tool_selection(5, 5).len(), 5);
    }

    /// HellaSwag files: 6 lines per task, a gold index 0–3; the tool's draw
    /// takes every task once; bad files name the line.
    #[test]
    fn hellaswag_files_are_read_as_the_tool_reads_them() {
        let text = write_hellaswag(&computed_hellaswag(10, 7)).unwrap();
        let tasks = read_hellaswag(text.as_bytes(), 400, "hs").unwrap();
        let mut seen: Vec<usize> = tasks.iter().map(|t| t.0).collect();
        assert_ne!(
            seen,
            (0..10).collect::<Vec<_>>(),
            "drawn in the tool's order"
        );
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(read_hellaswag(text.as_bytes(), 3, "hs").unwrap().len(), 3);
        let e = read_hellaswag(b"a\n1\nx\ny\nz\n", 400, "hs")
            .unwrap_err()
            .to_string();
        assert!(e.contains("5 lines, not a positive multiple of 6"), "{e}");
        let e = read_hellaswag(b"a\n7\nw\nx\ny\nz\n", 400, "hs")
            .unwrap_err()
            .to_string();
        assert!(e.contains("task 0 (line 2): gold ending `7`"), "{e}");
        // Lemire's method on a range of 1 is 0, whatever the engine says.
        assert_eq!(uniform_below(&mut Mt19937::new(1), 1), 0);
    }

    /// WinoGrande CSV as the tool splits it (a quoted sentence with commas,
    /// one `_`), and every line it would skip or leave out is an error.
    #[test]
    fn winogrande_lines_are_split_as_the_tool_splits_them() {
        let csv = computed_winogrande(4, 3);
        let t = read_winogrande(csv.as_bytes(), 0, "wg").unwrap();
        assert_eq!(t.len(), 4);
        let line0 = csv.lines().next().unwrap();
        assert!(
            line0.contains('"') && t[0].1.first.contains(", so "),
            "{line0}"
        );
        assert!(!t[0].1.first.contains('"') && t[0].1.second.ends_with('.'));
        let e = read_winogrande(b"0,no blank here,a,b,1\n\n", 0, "wg")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1: the sentence has no `_`"), "{e}");
        let e = read_winogrande(b"0,a _ b,x,y,3\n\n", 0, "wg")
            .unwrap_err()
            .to_string();
        assert!(e.contains("answer `3` is not 1 or 2"), "{e}");
        let e = read_winogrande(b"0,a _ b,x,y,1\n", 0, "wg")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 1:") && e.contains("leaves out the last line"),
            "{e}"
        );
        let e = read_winogrande(b"0,a _ b,x\n\n", 0, "wg")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not 5 comma-separated fields"), "{e}");
    }

    /// Our own JSONL format: read as written; a bad line is named, an
    /// answer out of range or a single choice refused.
    #[test]
    fn jsonl_tasks_and_their_errors() {
        let ok = b"{\"question\": \"2+2=\", \"choices\": [\"4\", \"5\"], \"answer\": 0}\n\n{\"question\": \"q\", \"choices\": [\"a\", \"b\", \"c\"], \"answer\": 2}\n";
        let t = read_jsonl(ok, 0, "t.jsonl").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].0, 1);
        assert_eq!(t[1].1.labels, vec![0, 0, 1]);
        let e = read_jsonl(
            b"{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 2}\n",
            0,
            "t.jsonl",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("t.jsonl: line 1: answer 2 is out of range"),
            "{e}"
        );
        let e = read_jsonl(
            b"\n{\"question\": \"q\", \"choices\": [\"a\"], \"answer\": 0}\n",
            0,
            "t.jsonl",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 2: 1 choice(s)"), "{e}");
        let e = read_jsonl(b"{\"question\": 3}\n", 0, "t.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1:"), "{e}");
    }

    #[test]
    fn mcnemar_exact_by_hand() {
        // b = 0, c = 5: 2 × (1/32).
        assert!((mcnemar_exact(0, 5) - 0.0625).abs() < 1e-12);
        // b = 1, c = 4: 2 × (1 + 5)/32.
        assert!((mcnemar_exact(1, 4) - 0.375).abs() < 1e-12);
        assert_eq!(mcnemar_exact(3, 3), 1.0);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
    }
}
