//! Execute stage: run a planned case on a loaded model and collect
//! observations, reducing each logit row as it arrives.
//!
//! Contract: windows are built exactly as `llama-perplexity` builds them
//! (tools/perplexity/perplexity.cpp, `perplexity()`): chunks of n_ctx tokens
//! from the text tokenized with BOS per the model, the first token of each
//! chunk replaced by BOS when the model adds one, logits requested from
//! position n_ctx/2, and positions n_ctx/2 .. n_ctx−2 scored against the
//! next token. Too short a text is an error, as it is there.

use crate::engine::{LoadedModel, Settings, TokenId, Window};
use crate::error::{Error, Result};
use crate::measure::{row_stats, WindowNll};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Windows of a text in llama-perplexity's default mode.
#[derive(Debug, Clone)]
pub struct PplWindows {
    /// The windows, BOS substituted.
    pub windows: Vec<Window>,
    /// Token index in the text where each window starts.
    pub starts: Vec<usize>,
    /// Window length.
    pub n_ctx: usize,
}

/// Cut `tokens` into llama-perplexity's default windows.
pub fn perplexity_windows(
    tokens: &[TokenId],
    n_ctx: usize,
    chunks: Option<usize>,
    add_bos: bool,
    bos: TokenId,
) -> std::result::Result<PplWindows, String> {
    if tokens.len() < 2 * n_ctx {
        return Err(format!(
            "the text tokenizes to only {} tokens; llama-perplexity needs at least 2 × n_ctx = {}",
            tokens.len(),
            2 * n_ctx
        ));
    }
    let n_chunk_max = tokens.len() / n_ctx;
    let n_chunk = chunks.map_or(n_chunk_max, |c| c.min(n_chunk_max));
    let mut windows = Vec::with_capacity(n_chunk);
    let mut starts = Vec::with_capacity(n_chunk);
    for i in 0..n_chunk {
        let start = i * n_ctx;
        let mut w = tokens[start..start + n_ctx].to_vec();
        if add_bos {
            w[0] = bos;
        }
        windows.push(Window {
            tokens: w,
            logits_from: n_ctx / 2,
        });
        starts.push(start);
    }
    Ok(PplWindows {
        windows,
        starts,
        n_ctx,
    })
}

/// Time per stage, for `--timings`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StageTimings {
    /// Fetch/derive and sha256 check.
    pub prepare: Duration,
    /// Model load (or wait for another thread's load).
    pub load: Duration,
    /// Tokenization.
    pub tokenize: Duration,
    /// llama_decode.
    pub decode: Duration,
    /// Row reduction and metrics.
    pub measure: Duration,
    /// Everything.
    pub total: Duration,
}

/// What a perplexity run observed.
#[derive(Debug, Clone)]
pub struct PplObservation {
    /// Per-window sums.
    pub windows: Vec<WindowNll>,
    /// Tokens in the whole text.
    pub tokens_total: usize,
    /// sha256 of the scored token stream (all windows' ids, little-endian i32).
    pub token_stream_sha256: String,
    /// Time spent.
    pub timings: StageTimings,
}

/// Score `text` on `model` in llama-perplexity's default mode.
pub fn run_perplexity(
    model: &dyn LoadedModel,
    text: &str,
    bos: crate::engine::BosPolicy,
    n_ctx: u32,
    n_batch: u32,
    chunks: Option<usize>,
    threads: u32,
) -> Result<PplObservation> {
    let mut timings = StageTimings::default();
    let info = model.info();
    let t = Instant::now();
    let ids: Vec<TokenId> = model
        .tokenize(text, bos)?
        .into_iter()
        .map(|t| t.id)
        .collect();
    timings.tokenize = t.elapsed();
    let add_bos = match bos {
        crate::engine::BosPolicy::Model => info.add_bos,
        crate::engine::BosPolicy::Always => true,
        crate::engine::BosPolicy::Never => false,
    };
    let plan = perplexity_windows(&ids, n_ctx as usize, chunks, add_bos, info.bos)
        .map_err(Error::input)?;
    let mut h = sha2::Sha256::default();
    for w in &plan.windows {
        for id in &w.tokens {
            sha2::Digest::update(&mut h, id.to_le_bytes());
        }
    }
    let token_stream_sha256 = crate::fsutil::hex(&sha2::Digest::finalize(h));
    let mut settings = Settings::new(n_ctx, threads);
    settings.n_batch = n_batch;
    let mut sums = vec![WindowNll::default(); plan.windows.len()];
    let n = plan.n_ctx;
    let et = model.score(&settings, &plan.windows, &mut |w, pos, row| {
        // The last position predicts a token outside the window.
        if pos + 1 >= n {
            return Ok(());
        }
        let target = ids[plan.starts[w] + pos + 1] as usize;
        if target >= row.len() {
            return Err(Error::engine(format!(
                "token id {target} at position {} is outside the vocabulary ({})",
                pos + 1,
                row.len()
            )));
        }
        let st = row_stats(row);
        sums[w].add(-st.logprob(row, target), st.argmax == target);
        Ok(())
    })?;
    timings.decode = et.decode;
    timings.measure = et.callback;
    Ok(PplObservation {
        windows: sums,
        tokens_total: ids.len(),
        token_stream_sha256,
        timings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_match_llama_perplexity() {
        let toks: Vec<TokenId> = (0..100).collect();
        let p = perplexity_windows(&toks, 16, None, true, -1).unwrap();
        assert_eq!(p.windows.len(), 6); // 100 / 16
        assert_eq!(p.windows[1].tokens[0], -1);
        assert_eq!(p.windows[1].tokens[1], 17);
        assert_eq!(p.windows[1].logits_from, 8);
        assert_eq!(p.starts[5], 80);
        let p = perplexity_windows(&toks, 16, Some(2), false, -1).unwrap();
        assert_eq!(p.windows.len(), 2);
        assert_eq!(p.windows[1].tokens[0], 16);
        let e = perplexity_windows(&toks, 64, None, true, -1).unwrap_err();
        assert!(e.contains("only 100 tokens"), "{e}");
    }
}
