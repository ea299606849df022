//! Decoding on a llama.cpp context: contexts, tokens, padded and ranged
//! batches, lanes decoded in parallel, and the rows they give.

use super::*;

/// How [`Loaded::decode_each`] decodes one item: (context, batch, the
/// lane's settings, item index, item).
pub(crate) type LaneDecode<'f, T, R> =
    dyn Fn(&mut LlamaContext<'_>, &mut LlamaBatch, &Settings, usize, &T) -> Result<R> + Sync + 'f;

impl Loaded {
    pub(super) fn err(&self, what: impl std::fmt::Display) -> Error {
        self.info.file.error(what)
    }

    /// A new context for `settings` (most callers take one through
    /// [`Loaded::context`], which keeps them across calls).
    pub(super) fn fresh_context(&self, settings: &Settings) -> Result<LlamaContext<'_>> {
        if settings.n_ctx > self.info.n_ctx_train {
            return Err(Error::input(format!(
                "model `{}`: n_ctx {} is larger than the model's training context {}",
                self.info.file.alias, settings.n_ctx, self.info.n_ctx_train
            )));
        }
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(settings.n_ctx))
            .with_n_batch(settings.n_batch)
            .with_n_ubatch(settings.physical_batch())
            .with_n_seq_max(settings.n_seq.max(1))
            .with_kv_unified(settings.n_seq > 1)
            .with_n_threads(settings.threads as i32)
            .with_n_threads_batch(settings.threads as i32)
            .with_flash_attention_policy(if settings.flash_attn {
                llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED
            } else {
                llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED
            })
            .with_type_k(kv_type(&settings.kv_type)?)
            .with_type_v(kv_type(&settings.kv_type)?);
        let _guard = CONTEXT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let ctx = self
            .model
            .new_context(backend(false)?, params)
            .map_err(|e| self.err(format!("could not create a context: {e}")))?;
        if ctx.n_ctx() < settings.n_ctx {
            return Err(self.err(format!(
                "context has {} positions, {} were asked for",
                ctx.n_ctx(),
                settings.n_ctx
            )));
        }
        Ok(ctx)
    }

    pub(super) fn tokens(&self, text: &str, bos: BosPolicy, special: bool) -> Vec<Token> {
        let vocab = self.model.vocab();
        let mut ids = vocab.tokenize(text.as_bytes(), bos == BosPolicy::Model, special);
        if bos == BosPolicy::Always && ids.first() != Some(&vocab.bos()) {
            ids.insert(0, vocab.bos());
        }
        let bos_id = vocab.bos();
        let pieces: Vec<Vec<u8>> = ids
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let piece = vocab.token_to_piece(t, special, None);
                // A BOS the tokenizer added spells nothing; one parsed from
                // the text (a chat template's) spells itself.
                let added = !(special && text.as_bytes().starts_with(&piece));
                if i == 0 && t == bos_id && bos != BosPolicy::Never && added {
                    Vec::new()
                } else {
                    piece
                }
            })
            .collect();
        let offsets = piece_offsets(text.as_bytes(), &pieces);
        ids.iter()
            .zip(pieces)
            .zip(offsets)
            .map(|((t, piece), offset)| Token {
                id: t.0,
                piece,
                offset,
            })
            .collect()
    }

    /// Decode `tokens` at positions `first..`, padded to
    /// `settings.padded_rows` rows (copies of the last token at the
    /// following positions, dropped from the cache afterwards). Logits are
    /// kept for the rows `want` selects (for every row when padding is on).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decode_padded(
        &self,
        ctx: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch,
        settings: &Settings,
        tokens: &[TokenId],
        first: usize,
        want: &dyn Fn(usize) -> bool,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        let rows = settings.padded_rows(tokens.len());
        let end = first + tokens.len();
        if first + rows > settings.n_ctx as usize {
            return Err(self.err(format!(
                "{}: a pass of {rows} rows at position {first} does not fit n_ctx {}",
                what(),
                settings.n_ctx
            )));
        }
        batch.clear();
        let pad = *tokens.last().ok_or_else(|| self.err("empty pass"))?;
        // llama.cpp runs the last layer only on the rows whose logits are
        // kept: with padding on, keep them all, so that layer has the same
        // row count (and kernels) as every other.
        let all = settings.min_rows > 0;
        for k in 0..rows {
            let t = tokens.get(k).copied().unwrap_or(pad);
            let pos = first + k;
            batch
                .add(
                    LlamaToken::new(t),
                    pos as i32,
                    &[0],
                    all || (k < tokens.len() && want(pos)),
                )
                .map_err(|e| self.err(format!("batch: {e}")))?;
        }
        ctx.decode(batch)
            .map_err(|e| self.err(format!("llama_decode failed ({e}) {}", what())))?;
        if rows > tokens.len() {
            ctx.clear_kv_cache_seq(Some(0), Some(end as u32), None)
                .map_err(|e| self.err(format!("removing padding: {e}")))?;
        }
        Ok(())
    }

    /// Decode `tokens[from..]` in `n_batch` passes (each padded as
    /// [`Self::decode_padded`] pads), keeping the logits of the last
    /// token's row; returns that row's index in the last pass (0 when the
    /// range is empty).
    pub(super) fn decode_range(
        &self,
        ctx: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch,
        settings: &Settings,
        tokens: &[TokenId],
        from: usize,
    ) -> Result<i32> {
        let n = tokens.len();
        let n_batch = settings.n_batch as usize;
        let mut last = 0;
        for start in (from..n).step_by(n_batch) {
            let chunk = &tokens[start..n.min(start + n_batch)];
            self.decode_padded(
                ctx,
                batch,
                settings,
                chunk,
                start,
                &|pos| pos + 1 == n,
                &|| format!("at positions {start}..{}", start + chunk.len()),
            )?;
            last = (chunk.len() - 1) as i32;
        }
        Ok(last)
    }

    /// Decode `items` (windows or batches, each from empty memory) and hand
    /// each on in order: `decode(ctx, batch, settings, index, item)`, then
    /// `deliver(index, ctx, decoded)`. On a CPU build with two threads or
    /// more, items are decoded two at a time, each in a context of its own
    /// on its share of the threads: on this 2-core machine two one-thread
    /// decodes side by side take ~15% less time than one two-thread decode
    /// after the other (llama.cpp's threads wait for each other at every
    /// operation). Each item starts from empty memory either way and
    /// llama.cpp's logits do not depend on the thread count, so what is
    /// delivered is bitwise what one context gives (`tests/real_engine/engine_llama.rs`).
    /// The first error in item order is returned, after the items before it
    /// are delivered.
    pub(super) fn decode_each<T: Sync, R: Send>(
        &self,
        settings: &Settings,
        batch: (usize, i32),
        items: &[T],
        decode: &LaneDecode<'_, T, R>,
        deliver: &mut dyn FnMut(usize, &LlamaContext<'_>, R) -> Result<()>,
    ) -> Result<()> {
        let t = settings.threads;
        let threads = if compute_backend() == "cpu" && t >= 2 && items.len() >= 2 {
            vec![t - t / 2, t / 2]
        } else {
            vec![t]
        };
        let mut lanes: Vec<(Settings, super::pool::Pooled<'_>, LlamaBatch)> = threads
            .into_iter()
            .map(|threads| {
                let mut s = settings.clone();
                s.threads = threads;
                let ctx = self.context(&s)?;
                Ok((s, ctx, LlamaBatch::new(batch.0, batch.1)))
            })
            .collect::<Result<_>>()?;
        let n = lanes.len();
        let mut run = || -> Result<()> {
            for (c, group) in items.chunks(n).enumerate() {
                let decoded: Vec<Result<R>> = if n == 1 {
                    let (s, ctx, batch) = &mut lanes[0];
                    vec![decode(ctx, batch, s, c, &group[0])]
                } else {
                    std::thread::scope(|scope| {
                        let running: Vec<_> = group
                            .iter()
                            .zip(lanes.iter_mut())
                            .enumerate()
                            .map(|(j, (item, (s, ctx, batch)))| {
                                let ctx: &mut LlamaContext<'_> = ctx;
                                scope.spawn(move || decode(ctx, batch, s, c * n + j, item))
                            })
                            .collect();
                        running
                            .into_iter()
                            .map(|h| h.join().expect("a decode lane panicked"))
                            .collect()
                    })
                };
                for (j, r) in decoded.into_iter().enumerate() {
                    deliver(c * n + j, &lanes[j].1, r?)?;
                }
            }
            Ok(())
        };
        let done = run();
        if done.is_err() {
            // A context whose call failed is not kept.
            for (_, ctx, _) in lanes {
                ctx.discard();
            }
        }
        done
    }

    /// Up to `k` tokens that greedy one-row passes (llama.cpp's usual
    /// generation) predict after `tokens`, whose cache holds [0, `done`):
    /// guesses for an invariant pass to check, never a result. A pass that
    /// fails or a row that is not finite ends the guessing; the cache is
    /// left holding [0, `done`) again.
    pub(super) fn draft(
        &self,
        ctx: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch,
        unpadded: &Settings,
        tokens: &[TokenId],
        done: usize,
        k: usize,
    ) -> Result<Vec<TokenId>> {
        let vocab = self.model.vocab();
        let mut seq = tokens.to_vec();
        let mut at = done;
        while seq.len() - tokens.len() < k {
            let Ok(last) = self.decode_range(ctx, batch, unpadded, &seq, at) else {
                break;
            };
            at = seq.len();
            let Ok(row) = self.row(ctx, last, at - 1) else {
                break;
            };
            let next = top_gap(row).0 as TokenId;
            if vocab.is_eog(LlamaToken::new(next)) {
                break;
            }
            seq.push(next);
        }
        ctx.clear_kv_cache_seq(Some(0), Some(done as u32), None)
            .map_err(|e| self.err(format!("dropping drafts: {e}")))?;
        Ok(seq.split_off(tokens.len()))
    }

    /// A fresh context for generating `max_new` tokens after `prompt`.
    pub(super) fn start(
        &self,
        settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
    ) -> Result<super::pool::Pooled<'_>> {
        if prompt.is_empty() {
            return Err(self.err("generation needs a non-empty prompt"));
        }
        let need = settings.padded_rows(prompt.len() + max_new);
        if need > settings.n_ctx as usize {
            return Err(Error::input(format!(
                "model `{}`: prompt of {} tokens plus {max_new} new tokens (with padding {need}) exceeds n_ctx {}",
                self.info.file.alias,
                prompt.len(),
                settings.n_ctx
            )));
        }
        let mut ctx = self.context(settings)?;
        ctx.clear_kv_cache();
        Ok(ctx)
    }

    pub(super) fn row<'c>(
        &self,
        ctx: &'c LlamaContext<'_>,
        i: i32,
        pos: usize,
    ) -> Result<&'c [f32]> {
        let row = ctx.get_logits_ith(i);
        if row.len() != self.info.n_vocab {
            return Err(self.err(format!(
                "logit row at position {pos} has {} entries, expected {}",
                row.len(),
                self.info.n_vocab
            )));
        }
        if let Some(j) = first_non_finite(row) {
            return Err(self.err(format!(
                "non-finite logit {} for token {j} at position {pos}",
                row[j]
            )));
        }
        Ok(row)
    }
}
