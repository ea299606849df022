//! A loaded model behind the `LoadedModel` trait: scoring passes,
//! batches of sequences, generation, sampling and the bench.

use super::*;

impl LoadedModel for Loaded {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn contexts_made(&self) -> u64 {
        self.idle.made()
    }

    fn decode_batches(
        &self,
        settings: &Settings,
        batches: &[Vec<crate::engine::SeqToken>],
        sink: &mut crate::engine::BatchSink<'_>,
    ) -> Result<EngineTimings> {
        let _cores = crate::engine::cores::hold(settings.threads as usize);
        let t0 = Instant::now();
        let mut callback = std::time::Duration::ZERO;
        let n_batch = settings.n_batch as usize;
        self.decode_each(
            settings,
            (n_batch, settings.n_seq.max(1) as i32),
            batches,
            &|ctx, batch, _, b, tokens: &Vec<crate::engine::SeqToken>| {
                if tokens.len() > settings.n_ctx as usize {
                    return Err(self.err(format!(
                        "batch {b} holds {} tokens, more than n_ctx {}",
                        tokens.len(),
                        settings.n_ctx
                    )));
                }
                ctx.clear_kv_cache();
                let mut rows: Vec<Vec<f32>> = Vec::new();
                for chunk in tokens.chunks(n_batch) {
                    batch.clear();
                    for t in chunk {
                        batch
                            .add(LlamaToken(t.id), t.pos as i32, &t.seqs, t.output)
                            .map_err(|e| self.err(format!("batch {b}: {e}")))?;
                    }
                    ctx.decode(batch)
                        .map_err(|e| self.err(format!("llama_decode of batch {b}: {e}")))?;
                    for (i, t) in chunk.iter().enumerate() {
                        if t.output {
                            rows.push(self.row(ctx, i as i32, t.pos)?.to_vec());
                        }
                    }
                }
                Ok(rows)
            },
            &mut |b, _, rows| {
                let t = Instant::now();
                let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
                sink(b, &refs)?;
                callback += t.elapsed();
                Ok(())
            },
        )?;
        Ok(EngineTimings {
            decode: t0.elapsed() - callback,
            callback,
        })
    }

    fn bench(
        &self,
        settings: &Settings,
        test: crate::engine::BenchTest,
        reps: usize,
        warmup: bool,
        seed: u64,
    ) -> Result<Vec<std::time::Duration>> {
        // Measured with no other quantgate decode on the machine.
        let _cores = crate::engine::cores::hold_all();
        // A context of its own, as llama-bench makes one per test.
        let mut ctx = self.fresh_context(settings)?;
        let n_vocab = self.info.n_vocab as u64;
        // The ids do not matter to the speed, only their count.
        let mut rng = crate::measure::SplitMix64(seed);
        let mut next = move || LlamaToken((rng.next_u64() % n_vocab) as i32);
        let bos = self.info.add_bos.then_some(LlamaToken(self.info.bos));
        let n_batch = settings.n_batch as usize;
        let mut run = |ctx: &mut LlamaContext<'_>, test: crate::engine::BenchTest| -> Result<()> {
            let fail =
                |e: &dyn std::fmt::Display| self.err(format!("llama_decode (speed test): {e}"));
            match test {
                crate::engine::BenchTest::Prompt(n) => {
                    let mut done = 0;
                    while done < n {
                        let k = (n - done).min(n_batch);
                        let tokens: Vec<LlamaToken> = (0..k)
                            .map(|i| match bos {
                                Some(b) if done == 0 && i == 0 => b,
                                _ => next(),
                            })
                            .collect();
                        let mut batch = LlamaBatch::get_one(&tokens).map_err(|e| fail(&e))?;
                        ctx.decode(&mut batch).map_err(|e| fail(&e))?;
                        done += k;
                    }
                    ctx.synchronize();
                }
                crate::engine::BenchTest::Generate(n) => {
                    let mut token = bos.unwrap_or_else(&mut next);
                    for _ in 0..n {
                        let one = [token];
                        let mut batch = LlamaBatch::get_one(&one).map_err(|e| fail(&e))?;
                        ctx.decode(&mut batch).map_err(|e| fail(&e))?;
                        ctx.synchronize();
                        token = next();
                    }
                }
            }
            Ok(())
        };
        if warmup {
            ctx.clear_kv_cache();
            match test {
                crate::engine::BenchTest::Prompt(_) => run(&mut ctx, test)?,
                crate::engine::BenchTest::Generate(_) => {
                    run(&mut ctx, crate::engine::BenchTest::Generate(1))?
                }
            }
        }
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            ctx.clear_kv_cache();
            let t = Instant::now();
            run(&mut ctx, test)?;
            times.push(t.elapsed());
        }
        Ok(times)
    }

    fn tokenize(&self, text: &str, bos: BosPolicy) -> Result<Vec<Token>> {
        Ok(self.tokens(text, bos, false))
    }

    fn tokenize_special(&self, text: &str, bos: BosPolicy) -> Result<Vec<Token>> {
        Ok(self.tokens(text, bos, true))
    }

    fn piece(&self, id: TokenId) -> Vec<u8> {
        self.model
            .vocab()
            .token_to_piece(LlamaToken::new(id), false, None)
    }

    fn score_passes(
        &self,
        settings: &Settings,
        windows: &[Window],
        sink: &mut PassSink<'_>,
    ) -> Result<EngineTimings> {
        let _cores = crate::engine::cores::hold(settings.threads as usize);
        let n_batch = settings.n_batch as usize;
        let one_pass = windows
            .iter()
            .all(|w| w.tokens.len() <= n_batch.min(settings.n_ctx as usize));
        if one_pass {
            let t0 = Instant::now();
            let mut in_callback = std::time::Duration::ZERO;
            self.decode_each(
                settings,
                (settings.padded_rows(n_batch), 1),
                windows,
                &|ctx, batch, s, w, window| {
                    ctx.clear_kv_cache();
                    if window.tokens.is_empty() {
                        return Ok(());
                    }
                    let from = window.logits_from;
                    self.decode_padded(
                        ctx,
                        batch,
                        s,
                        &window.tokens,
                        0,
                        &|pos| pos >= from,
                        &|| format!("in window {w} at positions 0..{}", window.tokens.len()),
                    )
                },
                &mut |w, ctx, ()| {
                    let window = &windows[w];
                    let rows = (window.logits_from..window.tokens.len())
                        .map(|pos| Ok((pos, self.row(ctx, pos as i32, pos)?)))
                        .collect::<Result<Vec<(usize, &[f32])>>>()?;
                    if !rows.is_empty() {
                        let tc = Instant::now();
                        sink(w, &rows)?;
                        in_callback += tc.elapsed();
                    }
                    Ok(())
                },
            )?;
            return Ok(EngineTimings {
                decode: t0.elapsed().saturating_sub(in_callback),
                callback: in_callback,
            });
        }
        let mut timings = EngineTimings::default();
        let t0 = Instant::now();
        let mut ctx = self.context(settings)?;
        let mut batch = LlamaBatch::new(settings.padded_rows(n_batch), 1);
        let mut in_callback = std::time::Duration::ZERO;
        for (w, window) in windows.iter().enumerate() {
            if window.tokens.len() > settings.n_ctx as usize {
                return Err(self.err(format!(
                    "window {w} has {} tokens, more than n_ctx {}",
                    window.tokens.len(),
                    settings.n_ctx
                )));
            }
            ctx.clear_kv_cache();
            for (b, chunk) in window.tokens.chunks(n_batch).enumerate() {
                let base = b * n_batch;
                let from = window.logits_from;
                self.decode_padded(
                    &mut ctx,
                    &mut batch,
                    settings,
                    chunk,
                    base,
                    &|pos| pos >= from,
                    &|| format!("in window {w} at positions {base}..{}", base + chunk.len()),
                )?;
                let mut rows: Vec<(usize, &[f32])> = Vec::with_capacity(chunk.len());
                for k in 0..chunk.len() {
                    let pos = base + k;
                    if pos >= window.logits_from {
                        rows.push((pos, self.row(&ctx, k as i32, pos)?));
                    }
                }
                if !rows.is_empty() {
                    let tc = Instant::now();
                    sink(w, &rows)?;
                    in_callback += tc.elapsed();
                }
            }
        }
        timings.callback = in_callback;
        timings.decode = t0.elapsed().saturating_sub(in_callback);
        Ok(timings)
    }

    fn generate(
        &self,
        settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
        decoding: Decoding,
        stop: &mut dyn FnMut(&[TokenId]) -> bool,
    ) -> Result<Vec<Step>> {
        let _cores = crate::engine::cores::hold(settings.threads as usize);
        let n_batch = settings.n_batch as usize;
        // Rows of every pass that picks a token (invariant mode).
        let r = settings.padded_rows(1);
        if decoding == Decoding::Invariant && (settings.min_rows == 0 || r > n_batch) {
            return Err(self.err(format!(
                "invariant decoding needs 0 < min_rows ({}) ≤ n_batch ({n_batch})",
                settings.min_rows
            )));
        }
        // Incremental passes are never padded.
        let unpadded = settings.unpadded();
        let settings = match decoding {
            Decoding::Invariant => settings,
            Decoding::Incremental => &unpadded,
        };
        let mut ctx = self.start(settings, prompt, max_new)?;
        let mut batch = LlamaBatch::new(settings.padded_rows(n_batch), 1);
        let vocab = self.model.vocab();
        let mut tokens = prompt.to_vec();
        let mut out = Vec::new();
        // Positions [0, done) hold their final cache entries.
        let mut done = 0usize;
        // How many drafted tokens the next invariant pass checks.
        let mut want = r - 1;
        while out.len() < max_new {
            let n = tokens.len();
            // Invariant mode: the pass that picks the next token has r rows
            // whatever they hold. Drafted, its rows after the last token carry
            // the tokens that cheap one-row passes guess come next; each row's
            // logits depend only on the tokens up to it (the contract the
            // invariant mode rests on), so every guess the pass confirms is the
            // token a pass of its own would pick, bitwise, and saves that pass.
            let drafts = if decoding == Decoding::Invariant && self.drafts {
                let k = want
                    .min(r.saturating_sub(n - done))
                    .min(max_new - out.len() - 1);
                self.draft(&mut ctx, &mut batch, &unpadded, &tokens, done, k)?
            } else {
                Vec::new()
            };
            let k = drafts.len();
            tokens.extend_from_slice(&drafts);
            let m = tokens.len();
            // This pass decodes [s, m); its rows from n − 1 on pick tokens.
            let s = match decoding {
                Decoding::Invariant => m.saturating_sub(r),
                Decoding::Incremental => done,
            };
            if done > s {
                ctx.clear_kv_cache_seq(Some(0), Some(s as u32), None)
                    .map_err(|e| self.err(format!("trimming the cache: {e}")))?;
            }
            // The prompt before the trailing rows.
            self.decode_range(&mut ctx, &mut batch, settings, &tokens[..s], done.min(s))?;
            let last = self.decode_range(&mut ctx, &mut batch, settings, &tokens, s)?;
            tokens.truncate(n);
            // Rows n − 1 .. m of the last pass, every row kept (padded
            // passes keep all logits) and in it (k + 1 ≤ r ≤ n_batch rows).
            let mut matched = 0;
            let mut finished = false;
            for i in 0..=k {
                let row = self.row(&ctx, last - (k - i) as i32, n - 1 + i)?;
                let (next, gap) = top_gap(row);
                let next = next as TokenId;
                if vocab.is_eog(LlamaToken::new(next)) {
                    finished = true;
                    break;
                }
                out.push(Step { token: next, gap });
                tokens.push(next);
                if stop(&tokens[prompt.len()..]) {
                    finished = true;
                    break;
                }
                if out.len() == max_new || drafts.get(i) != Some(&next) {
                    break;
                }
                matched += 1;
            }
            if finished {
                break;
            }
            // Entries up to the last confirmed guess are final; those of
            // the guesses after it go.
            done = n + matched;
            if done < m {
                ctx.clear_kv_cache_seq(Some(0), Some(done as u32), None)
                    .map_err(|e| self.err(format!("dropping unconfirmed drafts: {e}")))?;
            }
            // Draft as far as the guesses held, at least a few tokens.
            want = if matched == k {
                r - 1
            } else {
                (2 * matched).max(4).min(r - 1)
            };
        }
        Ok(out)
    }

    fn sample(
        &self,
        settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
        sampler: &Sampler,
        seed: u32,
        stop: &mut dyn FnMut(&[TokenId]) -> bool,
    ) -> Result<Vec<TokenId>> {
        let _cores = crate::engine::cores::hold(settings.threads as usize);
        let settings = &settings.unpadded();
        let mut ctx = self.start(settings, prompt, max_new)?;
        let mut batch = LlamaBatch::new(settings.n_batch as usize, 1);
        let mut chain = sampler_chain(sampler, seed);
        let vocab = self.model.vocab();
        let mut tokens = prompt.to_vec();
        // Positions [0, done) are in the cache; each pass decodes the rest.
        let mut done = 0usize;
        while tokens.len() - prompt.len() < max_new {
            let n = tokens.len();
            let last = self.decode_range(&mut ctx, &mut batch, settings, &tokens, done)?;
            done = n;
            // Check the row as every other path does, then let llama.cpp sample it.
            self.row(&ctx, last, n - 1)?;
            let next = chain.sample(&ctx, last);
            if vocab.is_eog(next) {
                break;
            }
            tokens.push(next.0);
            if stop(&tokens[prompt.len()..]) {
                break;
            }
        }
        Ok(tokens.split_off(prompt.len()))
    }

    /// The prompt decoded once: each sample trims the cache back to the
    /// prompt (its cells, and so every later pass, as in a fresh context)
    /// and draws its first token from the prompt's last row, kept aside.
    fn sample_many(
        &self,
        settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
        sampler: &Sampler,
        seeds: &[u32],
        stop: &mut dyn FnMut(usize, &[TokenId]) -> bool,
    ) -> Result<Vec<Vec<TokenId>>> {
        let _cores = crate::engine::cores::hold(settings.threads as usize);
        let settings = &settings.unpadded();
        let mut ctx = self.start(settings, prompt, max_new)?;
        let mut batch = LlamaBatch::new(settings.n_batch as usize, 1);
        let vocab = self.model.vocab();
        let last = self.decode_range(&mut ctx, &mut batch, settings, prompt, 0)?;
        let first: Vec<LlamaTokenData> = self
            .row(&ctx, last, prompt.len() - 1)?
            .iter()
            .enumerate()
            .map(|(j, &l)| LlamaTokenData::new(LlamaToken::new(j as i32), l, 0.0))
            .collect();
        let mut out = Vec::with_capacity(seeds.len());
        for (k, &seed) in seeds.iter().enumerate() {
            if k > 0 {
                ctx.clear_kv_cache_seq(Some(0), Some(prompt.len() as u32), None)
                    .map_err(|e| self.err(format!("trimming the cache to the prompt: {e}")))?;
            }
            let mut chain = sampler_chain(sampler, seed);
            let mut tokens = prompt.to_vec();
            while tokens.len() - prompt.len() < max_new {
                let next = if tokens.len() == prompt.len() {
                    // What `llama_sampler_sample` does with the prompt's row.
                    let mut cur = LlamaTokenDataArray::new(first.clone(), false);
                    chain.apply(&mut cur);
                    let t = cur
                        .selected_token()
                        .ok_or_else(|| self.err("the sampler chain selected no token"))?;
                    chain.accept(t);
                    t
                } else {
                    let n = tokens.len();
                    let last = self.decode_range(&mut ctx, &mut batch, settings, &tokens, n - 1)?;
                    self.row(&ctx, last, n - 1)?;
                    chain.sample(&ctx, last)
                };
                if vocab.is_eog(next) {
                    break;
                }
                tokens.push(next.0);
                if stop(k, &tokens[prompt.len()..]) {
                    break;
                }
            }
            out.push(tokens.split_off(prompt.len()));
        }
        Ok(out)
    }

    fn chat_prompt(&self, user: &str, builtin: Option<&str>) -> Result<String> {
        let tmpl = match builtin {
            Some(name) => LlamaChatTemplate::new(name)
                .map_err(|e| self.err(format!("chat template `{name}`: {e}")))?,
            None => self.model.chat_template(None).map_err(|e| {
                self.err(format!(
                    "no chat template in the file ({e}); name one of llama.cpp's built-in \
                     templates as `chat_template` in the model registry"
                ))
            })?,
        };
        let msg = LlamaChatMessage::new("user".into(), user.into())
            .map_err(|e| self.err(format!("chat message: {e}")))?;
        self.model
            .apply_chat_template(&tmpl, &[msg], true)
            .map_err(|e| self.err(format!("applying the chat template: {e}")))
    }
}

/// llama.cpp's sampler chain in its default order: top-k, top-p, min-p,
/// temperature, then a draw seeded with `seed`.
pub(crate) fn sampler_chain(sampler: &Sampler, seed: u32) -> LlamaSampler {
    let mut chain = Vec::new();
    if sampler.top_k > 0 {
        chain.push(LlamaSampler::top_k(sampler.top_k as i32));
    }
    if sampler.top_p < 1.0 {
        chain.push(LlamaSampler::top_p(sampler.top_p, 1));
    }
    if sampler.min_p > 0.0 {
        chain.push(LlamaSampler::min_p(sampler.min_p, 1));
    }
    chain.push(LlamaSampler::temp(sampler.temperature));
    chain.push(LlamaSampler::dist(seed));
    LlamaSampler::chain_simple(chain)
}
