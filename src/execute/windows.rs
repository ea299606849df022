//! Execute stage: cut a token stream into windows, run them on a loaded
//! model and collect observations, reducing each logit row as it arrives.
//!
//! Contract: the windows are exactly those `llama-perplexity`
//! (tools/perplexity/perplexity.cpp) builds, in each of its modes:
//! - default: chunks of n_ctx tokens of the text tokenized with BOS per the
//!   model; the first token of each chunk replaced by BOS when the model adds
//!   one; logits requested from n_ctx/2; positions n_ctx/2 .. n_ctx−2 scored.
//! - strided (`--ppl-stride S`): the tool enlarges the context to n_ctx + S/2,
//!   llama.cpp pads it to a multiple of 256, and the tool's chunk is that
//!   padded length C; chunk i is tokens [i·S, i·S + C); every position's
//!   logits requested; the last S positions before the end scored. The tool writes its BOS into the token
//!   list only after the chunk is decoded, so chunks after the first start
//!   with an ordinary token: the model sees no BOS there, and neither here.
//! - resets (seed 002): independent windows of L pinned ids at given starts,
//!   no BOS added, every position scored against the actual next id.
//!
//! Too few tokens is an error, as it is in the tool.

use crate::core::error::{Error, Result};
use crate::core::Settings;
use crate::engine::{LoadedModel, TokenId, Window};
use crate::execute::observe::{observe_one, Consumer, Mapped, Observation, Row};
use crate::measure::{RowStats, WindowNll};
use std::sync::Arc;
use std::time::Duration;

/// How a token stream is cut into windows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Windowing {
    /// `llama-perplexity` default: chunks of n_ctx, first token → BOS when
    /// the model adds one, the second half of each chunk scored.
    LlamaPerplexity {
        /// Chunk length.
        n_ctx: u32,
        /// At most this many chunks.
        chunks: Option<usize>,
        /// Chunks to leave out at the start (held-out text: the tool's
        /// chunks `skip..skip + chunks`); 0 is the tool itself.
        skip: usize,
    },
    /// `llama-perplexity --ppl-stride`: chunks every `stride` tokens, each as
    /// long as the tool's context, the last `stride` positions of each scored.
    /// The tool enlarges `-c` by stride/2 and llama.cpp then pads the context
    /// to a multiple of 256; the tool's chunk is that padded length.
    Strided {
        /// `-c` as given (before the tool's enlargement by stride/2).
        n_ctx: u32,
        /// `--ppl-stride`.
        stride: u32,
        /// At most this many chunks.
        chunks: Option<usize>,
    },
    /// Independent contexts of `length` input tokens at `starts`, scoring the
    /// actual next id at every position (seed 002).
    Resets {
        /// Input tokens per window.
        length: u32,
        /// Start offsets.
        starts: Vec<usize>,
    },
}

impl Windowing {
    /// The mode's name as the case writes it.
    pub fn mode(&self) -> &'static str {
        match self {
            Windowing::LlamaPerplexity { .. } => "llama-perplexity",
            Windowing::Strided { .. } => "strided",
            Windowing::Resets { .. } => "resets",
        }
    }

    /// Context length the engine needs.
    pub(crate) fn context(&self) -> u32 {
        match self {
            Windowing::LlamaPerplexity { n_ctx, .. } => *n_ctx,
            Windowing::Strided { n_ctx, stride, .. } => {
                // In u64: a huge n_ctx must not wrap (the parser bounds it anyway).
                let c = (u64::from(*n_ctx) + u64::from(*stride / 2)).div_ceil(256) * 256;
                u32::try_from(c).unwrap_or(u32::MAX)
            }
            Windowing::Resets { length, .. } => *length,
        }
    }
}

/// A window with what to score in it.
#[derive(Debug, Clone)]
pub struct PlannedWindow {
    /// What the engine decodes.
    pub window: Window,
    /// First scored position; positions `first_scored..first_scored + targets.len()`.
    pub first_scored: usize,
    /// The true next token of each scored position.
    pub targets: Vec<TokenId>,
}

/// All windows of a case on one token stream.
#[derive(Debug, Clone)]
pub struct ScoringPlan {
    /// Windows in order.
    pub windows: Vec<PlannedWindow>,
    /// Context length the engine needs.
    pub n_ctx: u32,
    /// sha256 over every window's input ids and targets (little-endian i32):
    /// two models scoring equal hashes scored identical tokens.
    pub token_stream_sha256: String,
}

/// Why a text cannot be cut into the windows a case asks for: too few
/// tokens for its context, a skip past the end, no window left.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unplannable(pub String);

crate::core::error::from_words!(Unplannable);

/// Cut `ids` into windows. `bos` is Some(id) when the model adds BOS
/// (llama-perplexity default mode substitutes it).
pub fn plan_windows(
    ids: &[TokenId],
    windowing: &Windowing,
    bos: Option<TokenId>,
) -> std::result::Result<ScoringPlan, Unplannable> {
    let mut windows = Vec::new();
    let n = ids.len();
    match windowing {
        Windowing::LlamaPerplexity {
            n_ctx,
            chunks,
            skip,
        } => {
            let n_ctx = *n_ctx as usize;
            if n < 2 * n_ctx {
                return Err(format!("the text tokenizes to only {n} tokens; llama-perplexity needs at least 2 × n_ctx = {}", 2 * n_ctx).into());
            }
            let total = n / n_ctx;
            if *skip >= total {
                return Err(format!(
                    "window.skip: {skip} chunks leaves none of the {total} chunks of {n_ctx} tokens"
                )
                .into());
            }
            let left = total - skip;
            let n_chunk = chunks.map_or(left, |c| c.min(left));
            let first = n_ctx / 2;
            for i in *skip..*skip + n_chunk {
                let start = i * n_ctx;
                let mut tokens = ids[start..start + n_ctx].to_vec();
                if let Some(b) = bos {
                    tokens[0] = b;
                }
                windows.push(PlannedWindow {
                    window: Window {
                        tokens,
                        logits_from: first,
                    },
                    first_scored: first,
                    targets: ids[start + first + 1..start + n_ctx].to_vec(),
                });
            }
        }
        Windowing::Strided { stride, chunks, .. } => {
            let calc = windowing.context() as usize;
            let stride = *stride as usize;
            if n < 2 * calc || n <= calc {
                return Err(format!(
                    "the text tokenizes to only {n} tokens; strided mode needs at least 2 × context = {}",
                    2 * calc
                ).into());
            }
            // The tool's (n − C + S − 1) / S.
            let n_chunk_max = (n - calc).div_ceil(stride);
            let n_chunk = chunks.map_or(n_chunk_max, |c| c.min(n_chunk_max));
            let first = calc - stride - 1;
            for i in 0..n_chunk {
                let start = i * stride;
                windows.push(PlannedWindow {
                    window: Window {
                        tokens: ids[start..start + calc].to_vec(),
                        logits_from: 0,
                    },
                    first_scored: first,
                    targets: ids[start + first + 1..start + calc].to_vec(),
                });
            }
        }
        Windowing::Resets { length, starts } => {
            let l = *length as usize;
            for &s in starts {
                if s.checked_add(l + 1).is_none_or(|end| end > n) {
                    return Err(format!(
                        "the window at start {s} needs ids {s}..={}, so at least {} ids; the file has {n}",
                        s.saturating_add(l),
                        s.saturating_add(l + 1)
                    ).into());
                }
                windows.push(PlannedWindow {
                    window: Window {
                        tokens: ids[s..s + l].to_vec(),
                        logits_from: 0,
                    },
                    first_scored: 0,
                    targets: ids[s + 1..s + l + 1].to_vec(),
                });
            }
        }
    }
    if windows.is_empty() {
        return Err("zero windows to score".into());
    }
    let mut h = sha2::Sha256::default();
    for w in &windows {
        for id in w.window.tokens.iter().chain(&w.targets) {
            sha2::Digest::update(&mut h, id.to_le_bytes());
        }
    }
    Ok(ScoringPlan {
        windows,
        n_ctx: windowing.context(),
        token_stream_sha256: crate::core::fsutil::hex(&sha2::Digest::finalize(h)),
    })
}

/// Parse a token-id file: decimal integers separated by whitespace.
/// Errors name the line and column.
pub(crate) fn parse_token_ids(
    src: &str,
) -> std::result::Result<Vec<TokenId>, crate::core::error::Malformed> {
    let mut out = Vec::new();
    for (l, line) in src.lines().enumerate() {
        let mut col = 0;
        for word in line.split_whitespace() {
            col = line[col..].find(word).map_or(col, |i| col + i);
            let id: TokenId = word
                .parse()
                .ok()
                .filter(|v: &TokenId| *v >= 0)
                .ok_or_else(|| {
                    crate::core::error::Malformed(format!(
                        "{}:{}: `{word}` is not a token id (a non-negative integer)",
                        l + 1,
                        col + 1
                    ))
                })?;
            out.push(id);
            col += word.len();
        }
    }
    Ok(out)
}

/// What scoring a plan observed.
#[derive(Debug, Clone, Default)]
pub struct Scored {
    /// Per-window sums.
    pub windows: Vec<WindowNll>,
    /// NLL of every scored position, window after window.
    pub token_nll: Vec<f64>,
    /// Whether the argmax was the true token, same order.
    pub token_top1: Vec<bool>,
    /// The argmax token, same order.
    pub token_argmax: Vec<TokenId>,
    /// Decode time.
    pub decode: Duration,
    /// Row reduction time.
    pub measure: Duration,
}

impl Scored {
    /// `other`'s windows after this one's (its per-position values too; the
    /// times are left as they are).
    pub(crate) fn append(&mut self, other: &Scored) {
        self.windows.extend_from_slice(&other.windows);
        self.token_nll.extend_from_slice(&other.token_nll);
        self.token_top1.extend_from_slice(&other.token_top1);
        self.token_argmax.extend_from_slice(&other.token_argmax);
    }
}

impl ScoringPlan {
    /// The engine windows of the plan.
    pub(crate) fn engine_windows(&self) -> Vec<Window> {
        self.windows.iter().map(|w| w.window.clone()).collect()
    }

    /// Windows `ws` of the plan, in that order, as a plan of their own (a
    /// sequential run's visit); the token stream's hash stays the whole's.
    pub(crate) fn part(&self, ws: &[usize]) -> ScoringPlan {
        ScoringPlan {
            windows: ws.iter().map(|&w| self.windows[w].clone()).collect(),
            n_ctx: self.n_ctx,
            token_stream_sha256: self.token_stream_sha256.clone(),
        }
    }

    /// Scored targets over all windows.
    pub fn targets(&self) -> usize {
        self.windows.iter().map(|w| w.targets.len()).sum()
    }

    /// The observation of the plan on `model` with `n_batch` and `threads`.
    pub(crate) fn observation(
        &self,
        model: Arc<dyn LoadedModel>,
        n_batch: u32,
        threads: u32,
        options: &crate::core::EngineOptions,
    ) -> Observation {
        let mut settings = Settings::new(self.n_ctx, threads).with_options(options);
        settings.n_batch = n_batch;
        Observation::new(model, settings, self.engine_windows())
    }
}

/// Score every planned window on `model`.
pub fn score_plan(
    model: Arc<dyn LoadedModel>,
    plan: &ScoringPlan,
    n_batch: u32,
    threads: u32,
    options: &crate::core::EngineOptions,
) -> Result<Scored> {
    score_plan_with(model, plan, n_batch, threads, options, false, &mut |_| {
        Ok(())
    })
}

/// One scored position, as a [`score_plan_with`] hook sees it.
pub struct ScoredRow<'a> {
    /// Index of the position over the whole plan (window after window).
    pub index: usize,
    /// Window.
    pub window: usize,
    /// Index among the window's targets.
    pub k: usize,
    /// The true next token.
    pub target: usize,
    /// The logits.
    pub row: &'a [f32],
    /// Their max, argmax and log-sum-exp.
    pub stats: &'a RowStats,
    /// `exp(row[j] − max)` for every j (the terms of the log-sum-exp).
    pub exps: &'a [f64],
}

/// Where a row falls in a plan: its index over all scored positions, its
/// window, its index among the window's targets, and the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScoredAt {
    /// Index over the whole plan (window after window).
    pub index: usize,
    /// Window.
    pub window: usize,
    /// Index among the window's targets.
    pub k: usize,
    /// The true next token.
    pub target: usize,
}

/// What every window-scoring consumer collects, row by row: the NLL, top-1
/// and argmax of each scored position and the per-window sums.
#[derive(Debug)]
pub(crate) struct PlanScorer {
    plan: Arc<ScoringPlan>,
    n_vocab: usize,
    /// Index over the plan of each window's first target.
    offsets: Vec<usize>,
    scored: Scored,
}

impl PlanScorer {
    /// A scorer of `plan` for a model of `n_vocab` tokens.
    pub(crate) fn new(plan: Arc<ScoringPlan>, n_vocab: usize) -> Self {
        let total = plan.targets();
        let scored = Scored {
            windows: vec![WindowNll::default(); plan.windows.len()],
            token_nll: Vec::with_capacity(total),
            token_top1: Vec::with_capacity(total),
            token_argmax: Vec::with_capacity(total),
            ..Scored::default()
        };
        let offsets = plan
            .windows
            .iter()
            .scan(0, |at, w| {
                let here = *at;
                *at += w.targets.len();
                Some(here)
            })
            .collect();
        PlanScorer {
            plan,
            n_vocab,
            offsets,
            scored,
        }
    }

    /// Where the row of (`window`, `pos`) falls in the plan, if it scores a
    /// target there; stateless (any thread, any order).
    pub(crate) fn locate(&self, window: usize, pos: usize) -> Option<ScoredAt> {
        let pw = self.plan.windows.get(window)?;
        let k = pos
            .checked_sub(pw.first_scored)
            .filter(|k| *k < pw.targets.len())?;
        Some(ScoredAt {
            index: self.offsets[window] + k,
            window,
            k,
            target: pw.targets[k] as usize,
        })
    }

    /// The plan.
    pub(crate) fn plan(&self) -> &Arc<ScoringPlan> {
        &self.plan
    }

    /// Score `row` when the plan scores a target there (its place), else
    /// None. Rows come in order.
    pub(crate) fn take(&mut self, row: &Row<'_>) -> Result<Option<ScoredAt>> {
        let Some(at) = self.locate(row.window, row.pos) else {
            return Ok(None);
        };
        let target = self.plan.windows[row.window].targets[at.k];
        if target < 0 || target as usize >= self.n_vocab {
            return Err(Error::input(format!(
                "token id {target} (window {}, position {}) is outside the vocabulary of {} tokens",
                row.window,
                row.pos + 1,
                self.n_vocab
            )));
        }
        if at.index != self.scored.token_nll.len() {
            return Err(Error::engine(format!(
                "row of window {}, position {} out of order",
                row.window, row.pos
            )));
        }
        let st = row.stats;
        let nll = -st.logprob(row.logits, target as usize);
        let top1 = st.argmax == target as usize;
        self.scored.windows[row.window].add(nll, top1);
        self.scored.token_nll.push(nll);
        self.scored.token_top1.push(top1);
        self.scored.token_argmax.push(st.argmax as TokenId);
        Ok(Some(at))
    }

    /// Every planned target scored, or rows went missing.
    pub(crate) fn finish(self) -> Result<Scored> {
        let total = self.plan.targets();
        if self.scored.token_nll.len() != total {
            return Err(Error::engine(format!(
                "scored {} positions, planned {total}: rows went missing",
                self.scored.token_nll.len()
            )));
        }
        Ok(self.scored)
    }
}

/// A [`score_plan_with`] hook.
pub(crate) type RowHook<'a> = dyn FnMut(ScoredRow<'_>) -> Result<()> + Send + 'a;

/// [`score_plan`], also handing every scored row to `hook` (its time counts
/// as measure time); with `want_exps` the row's `exp(l − max)` terms too
/// (otherwise `exps` is empty).
pub fn score_plan_with(
    model: Arc<dyn LoadedModel>,
    plan: &ScoringPlan,
    n_batch: u32,
    threads: u32,
    options: &crate::core::EngineOptions,
    want_exps: bool,
    hook: &mut RowHook<'_>,
) -> Result<Scored> {
    /// The hook is stateful: it runs in `absorb`, in order, with the
    /// row's exps recomputed there when asked for (the mutex only makes the
    /// consumer shareable; `map` never touches it).
    struct Hooked<'h> {
        scorer: PlanScorer,
        want_exps: bool,
        exps: Vec<f64>,
        hook: std::sync::Mutex<&'h mut RowHook<'h>>,
    }
    impl Consumer for Hooked<'_> {
        fn absorb(&mut self, row: &Row<'_>, _: Mapped) -> Result<()> {
            if let Some(at) = self.scorer.take(row)? {
                if self.want_exps {
                    crate::measure::row_stats_exps(row.logits, &mut self.exps);
                }
                let hook = self.hook.get_mut().unwrap_or_else(|p| p.into_inner());
                hook(ScoredRow {
                    index: at.index,
                    window: at.window,
                    k: at.k,
                    target: at.target,
                    row: row.logits,
                    stats: row.stats,
                    exps: if self.want_exps { &self.exps } else { &[] },
                })?;
            }
            Ok(())
        }
    }
    let n_vocab = model.info().n_vocab;
    let obs = plan.observation(model, n_batch, threads, options);
    let mut c = Hooked {
        scorer: PlanScorer::new(Arc::new(plan.clone()), n_vocab),
        want_exps,
        exps: Vec::new(),
        hook: std::sync::Mutex::new(hook),
    };
    let seen = observe_one(&obs, &mut c)?;
    let mut out = c.scorer.finish()?;
    out.decode = seen.decode;
    out.measure = seen.reduce + seen.consumer[0];
    Ok(out)
}

/// The scores of `plan` from each scored position's log-prob of its
/// target and argmax, in order (a reference's rows, as a candidate read
/// them).
pub(crate) fn scored_from_targets(
    plan: &ScoringPlan,
    mut rows: impl Iterator<Item = (f64, u32)>,
) -> Scored {
    let mut out = Scored {
        windows: vec![WindowNll::default(); plan.windows.len()],
        ..Scored::default()
    };
    for (w, pw) in plan.windows.iter().enumerate() {
        for &t in &pw.targets {
            let Some((lp, argmax)) = rows.next() else {
                return out;
            };
            let nll = -lp;
            let top1 = argmax as TokenId == t;
            out.windows[w].add(nll, top1);
            out.token_nll.push(nll);
            out.token_top1.push(top1);
            out.token_argmax.push(argmax as TokenId);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_windows_match_llama_perplexity() {
        let toks: Vec<TokenId> = (0..100).collect();
        let w = Windowing::LlamaPerplexity {
            n_ctx: 16,
            chunks: None,
            skip: 0,
        };
        let p = plan_windows(&toks, &w, Some(-1)).unwrap();
        assert_eq!(p.windows.len(), 6); // 100 / 16
        let w1 = &p.windows[1];
        assert_eq!(w1.window.tokens[0], -1);
        assert_eq!(w1.window.tokens[1], 17);
        assert_eq!(w1.window.logits_from, 8);
        assert_eq!((w1.first_scored, w1.targets.len()), (8, 7));
        assert_eq!(w1.targets[0], 16 + 9);
        assert_eq!(*w1.targets.last().unwrap(), 31);
        let p = plan_windows(
            &toks,
            &Windowing::LlamaPerplexity {
                n_ctx: 16,
                chunks: Some(2),
                skip: 0,
            },
            None,
        )
        .unwrap();
        assert_eq!(p.windows.len(), 2);
        assert_eq!(p.windows[1].window.tokens[0], 16);
        let e = plan_windows(
            &toks,
            &Windowing::LlamaPerplexity {
                n_ctx: 64,
                chunks: None,
                skip: 0,
            },
            None,
        )
        .unwrap_err();
        assert!(e.0.contains("only 100 tokens"), "{e}");
        // skip: the tool's chunks 4 and 5, nothing else.
        let held_out = Windowing::LlamaPerplexity {
            n_ctx: 16,
            chunks: Some(3),
            skip: 4,
        };
        let p = plan_windows(&toks, &held_out, None).unwrap();
        assert_eq!(p.windows.len(), 2);
        assert_eq!(p.windows[0].window.tokens[0], 64);
        assert_eq!(*p.windows[1].targets.last().unwrap(), 95);
        let none_left = Windowing::LlamaPerplexity {
            n_ctx: 16,
            chunks: None,
            skip: 6,
        };
        let e = plan_windows(&toks, &none_left, None).unwrap_err();
        assert!(e.0.contains("window.skip: 6"), "{e}");
    }

    #[test]
    fn strided_windows_match_ppl_stride() {
        // -c 240 --ppl-stride 64: context 240 + 32 = 272, padded to 512;
        // chunks every 64 tokens, the last 64 positions scored.
        let toks: Vec<TokenId> = (0..2000).collect();
        let w = Windowing::Strided {
            n_ctx: 240,
            stride: 64,
            chunks: None,
        };
        let p = plan_windows(&toks, &w, Some(-1)).unwrap();
        assert_eq!(p.n_ctx, 512);
        assert_eq!(p.windows.len(), 24); // (2000 − 512 + 63) / 64
        let w2 = &p.windows[2];
        // No BOS in the decoded tokens: the tool writes it after decoding.
        assert_eq!(w2.window.tokens[0], 128);
        assert_eq!(w2.window.tokens.len(), 512);
        assert_eq!(w2.window.logits_from, 0);
        assert_eq!(w2.first_scored, 512 - 64 - 1);
        assert_eq!(w2.targets, (128 + 448..128 + 512).collect::<Vec<_>>());
        // Consecutive chunks score consecutive targets.
        assert_eq!(
            *p.windows[1].targets.last().unwrap() + 1,
            p.windows[2].targets[0]
        );
    }

    #[test]
    fn resets_score_every_next_id_without_bos() {
        let toks: Vec<TokenId> = (0..1025).collect();
        let w = Windowing::Resets {
            length: 512,
            starts: vec![0, 512],
        };
        let p = plan_windows(&toks, &w, Some(-1)).unwrap();
        assert_eq!(p.windows[1].window.tokens[0], 512);
        let targets: Vec<TokenId> = p.windows.iter().flat_map(|w| w.targets.clone()).collect();
        assert_eq!(targets, (1..=1024).collect::<Vec<_>>());
        // A start near the top of usize is an error, not an overflow.
        let far = Windowing::Resets {
            length: 512,
            starts: vec![usize::MAX - 10],
        };
        let e = plan_windows(&toks, &far, None).unwrap_err();
        assert!(e.0.contains("the file has 1025"), "{e}");
        // The strided context is computed without wrapping.
        let huge = Windowing::Strided {
            n_ctx: u32::MAX - 1,
            stride: u32::MAX - 1,
            chunks: None,
        };
        assert_eq!(huge.context(), u32::MAX);
        let e = plan_windows(&toks[..1024], &w, None).unwrap_err();
        assert!(
            e.0.contains("start 512 needs ids 512..=1024, so at least 1025 ids; the file has 1024"),
            "{e}"
        );
    }

    #[test]
    fn token_id_files_name_the_bad_position() {
        assert_eq!(parse_token_ids("1 2\n3\n\n 4").unwrap(), vec![1, 2, 3, 4]);
        let e = parse_token_ids("1 2\n3 x4 5\n").unwrap_err();
        assert_eq!(e.0, "2:3: `x4` is not a token id (a non-negative integer)");
        assert!(parse_token_ids("-1").unwrap_err().0.starts_with("1:1:"));
    }
}
