//! llama-perplexity's `--kl-divergence-base` files, imported as reference
//! rows: the tool's own layout (`_logits_`, context, vocabulary, chunks,
//! the tokens, then per position a scale, a minimum and u16 log-probs),
//! every length and value checked before a row is believed.

use crate::core::error::Malformed;
use crate::execute::runtime::basefile;
use crate::execute::windows::ScoringPlan;
use crate::measure::kld::RefPosition;

/// Import a llama-perplexity `--kl-divergence-base` file for a case's plan
/// (llama-perplexity windowing): checks the exact length, the dimensions
/// against the case and the candidate, the token stream against the case's,
/// and finite scale/min in every row. Rows keep the entries llama.cpp's KLD
/// sums (log-prob > −16), as f32 values exactly as it decodes them.
pub(crate) fn import_llama_kld(
    bytes: &[u8],
    plan: &ScoringPlan,
    n_ctx: u32,
    n_vocab_cand: usize,
) -> Result<Vec<RefPosition>, Malformed> {
    // The layout, dimensions, length and every row's scale and minimum
    // are checked by the runtimes' reader of the same files.
    let mut r = basefile::Reader::new(bytes, bytes.len() as u64)?;
    let head = r.head.clone();
    let (n_vocab, n_chunk, n_ctx_f) = (head.n_vocab, head.n_chunk, head.n_ctx);
    let per_chunk = head.per_chunk();
    if n_ctx_f != n_ctx as usize {
        return Err(
            format!("offset 8: n_ctx {n_ctx_f}, the case's window.n_ctx is {n_ctx}").into(),
        );
    }
    if n_vocab != n_vocab_cand {
        return Err(format!(
            "offset 12: n_vocab {n_vocab}, the candidate's vocabulary has {n_vocab_cand}"
        )
        .into());
    }
    if n_chunk != plan.windows.len() {
        return Err(format!(
            "offset 16: n_chunk {n_chunk}, the case scores {} chunks",
            plan.windows.len()
        )
        .into());
    }
    let tokens = &head.tokens;
    for (w, pw) in plan.windows.iter().enumerate() {
        let file = &tokens[w * n_ctx_f..(w + 1) * n_ctx_f];
        // Position 0 is replaced by BOS in the pass; compare the rest.
        if let Some(i) = (1..n_ctx_f).find(|&i| file[i] != pw.window.tokens[i]) {
            return Err(format!(
                "offset {}: token stream differs from the case's: chunk {w}, position {i}: file {} vs case {}",
                20 + 4 * (w * n_ctx_f + i),
                file[i],
                pw.window.tokens[i]
            ).into());
        }
        if pw.first_scored != n_ctx_f / 2 || pw.targets.len() != per_chunk {
            return Err("the case's windows are not llama-perplexity's default windows".into());
        }
    }
    let mut rows = Vec::with_capacity(per_chunk * n_chunk);
    let mut row = basefile::OwnedRow {
        scale: 0.0,
        min: 0.0,
        q: Vec::new(),
    };
    for (w, pw) in plan.windows.iter().enumerate() {
        for (k, &target) in pw.targets.iter().enumerate() {
            let at = r.offset();
            let place = |e: &dyn std::fmt::Display| {
                Malformed(format!("chunk {w}, scored position {k}: {e}"))
            };
            if !r.next_row(&mut row).map_err(|e| place(&e))? {
                return Err(place(&format!("offset {at}: the file ends")));
            }
            let lp = |j: usize| -> f32 { row.scale * f32::from(row.q[j]) + row.min };
            let mut entries: Vec<(u32, f32)> = (0..n_vocab)
                .map(|j| (j as u32, lp(j)))
                .filter(|&(_, v)| v > -16.0)
                .collect();
            if entries.is_empty() {
                return Err(format!(
                    "offset {at}: chunk {w}, scored position {k}: no entry above the −16 floor"
                )
                .into());
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
