//! llama-perplexity's `--kl-divergence-base` files, imported as reference
//! rows: the tool's own layout (`_logits_`, context, vocabulary, chunks,
//! the tokens, then per position a scale, a minimum and u16 log-probs),
//! every length and value checked before a row is believed.

use super::{Reader, Source};
use crate::execute::windows::ScoringPlan;
use crate::measure::kld::RefPosition;

/// Import a llama-perplexity `--kl-divergence-base` file for a case's plan
/// (llama-perplexity windowing): checks the exact length, the dimensions
/// against the case and the candidate, the token stream against the case's,
/// and finite scale/min in every row. Rows keep the entries llama.cpp's KLD
/// sums (log-prob > −16), as f32 values exactly as it decodes them.
pub fn import_llama_kld(
    bytes: &[u8],
    plan: &ScoringPlan,
    n_ctx: u32,
    n_vocab_cand: usize,
) -> Result<Vec<RefPosition>, String> {
    if bytes.len() < 8 || &bytes[..8] != b"_logits_" {
        return Err(
            "offset 0: not a llama-perplexity KL-divergence base file (magic `_logits_` missing)"
                .into(),
        );
    }
    let mut r = Reader { b: bytes, at: 8 };
    let f_ctx = r.u32("n_ctx")?;
    let f_vocab = r.i32("n_vocab")?;
    let f_chunk = r.i32("n_chunk")?;
    if f_vocab <= 0 || f_chunk <= 0 || f_ctx < 4 {
        return Err(format!(
            "offset 12: impossible dimensions n_ctx {f_ctx}, n_vocab {f_vocab}, n_chunk {f_chunk}"
        ));
    }
    let (n_vocab, n_chunk, n_ctx_f) = (f_vocab as usize, f_chunk as usize, f_ctx as usize);
    let per_chunk = n_ctx_f - 1 - n_ctx_f / 2;
    let nv = 2 * n_vocab.div_ceil(2) + 4;
    let expected_len = n_ctx_f
        .checked_mul(n_chunk)
        .and_then(|t| t.checked_mul(4))
        .and_then(|t| {
            per_chunk
                .checked_mul(n_chunk)?
                .checked_mul(nv)?
                .checked_mul(2)?
                .checked_add(t)
        })
        .and_then(|t| t.checked_add(20))
        .ok_or("dimensions overflow")?;
    if bytes.len() != expected_len {
        return Err(format!(
            "{} bytes, but n_ctx {f_ctx}, n_vocab {f_vocab}, n_chunk {f_chunk} make {expected_len}: {}",
            bytes.len(),
            if bytes.len() < expected_len {
                "truncated"
            } else {
                "trailing bytes"
            }
        ));
    }
    if f_ctx != n_ctx {
        return Err(format!(
            "offset 8: n_ctx {f_ctx}, the case's window.n_ctx is {n_ctx}"
        ));
    }
    if n_vocab != n_vocab_cand {
        return Err(format!(
            "offset 12: n_vocab {n_vocab}, the candidate's vocabulary has {n_vocab_cand}"
        ));
    }
    if n_chunk != plan.windows.len() {
        return Err(format!(
            "offset 16: n_chunk {n_chunk}, the case scores {} chunks",
            plan.windows.len()
        ));
    }
    let mut tokens = Vec::with_capacity(n_ctx_f * n_chunk);
    for _ in 0..n_ctx_f * n_chunk {
        tokens.push(r.i32("tokens")?);
    }
    for (w, pw) in plan.windows.iter().enumerate() {
        let file = &tokens[w * n_ctx_f..(w + 1) * n_ctx_f];
        // Position 0 is replaced by BOS in the pass; compare the rest.
        if let Some(i) = (1..n_ctx_f).find(|&i| file[i] != pw.window.tokens[i]) {
            return Err(format!(
                "offset {}: token stream differs from the case's: chunk {w}, position {i}: file {} vs case {}",
                20 + 4 * (w * n_ctx_f + i),
                file[i],
                pw.window.tokens[i]
            ));
        }
        if pw.first_scored != n_ctx_f / 2 || pw.targets.len() != per_chunk {
            return Err("the case's windows are not llama-perplexity's default windows".into());
        }
    }
    let mut rows = Vec::with_capacity(per_chunk * n_chunk);
    for (w, pw) in plan.windows.iter().enumerate() {
        for (k, &target) in pw.targets.iter().enumerate() {
            let at = r.at;
            let rec = r.take(nv * 2, "record")?;
            let scale = f32::from_le_bytes(rec[0..4].try_into().unwrap());
            let min_lp = f32::from_le_bytes(rec[4..8].try_into().unwrap());
            if !scale.is_finite() || !min_lp.is_finite() || scale < 0.0 {
                return Err(format!(
                    "offset {at}: chunk {w}, scored position {k}: scale {scale}, min_log_prob {min_lp} (must be finite, scale ≥ 0)"
                ));
            }
            let us = &rec[8..];
            let lp = |j: usize| -> f32 {
                let u = u16::from_le_bytes([us[2 * j], us[2 * j + 1]]);
                scale * f32::from(u) + min_lp
            };
            let mut entries: Vec<(u32, f32)> = (0..n_vocab)
                .map(|j| (j as u32, lp(j)))
                .filter(|&(_, v)| v > -16.0)
                .collect();
            if entries.is_empty() {
                return Err(format!(
                    "offset {at}: chunk {w}, scored position {k}: no entry above the −16 floor"
                ));
            }
            entries.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            rows.push(RefPosition {
                max: 0.0,
                lse: 0.0,
                lp_true: f64::from(lp(target as usize)),
                entries,
                tail_mass: 0.0,
                tail: None,
                approximate: true,
            });
        }
    }
    Ok(rows)
}
