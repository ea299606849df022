//! A fake engine for unit tests: a byte-level tokenizer and a table of
//! synthetic logit rows, so every stage and metric can be tested without
//! llama.cpp. Faults (NaN logits, decode errors) can be injected.
//!
//! Token ids 0..=255 are bytes, 256 is BOS, 257 is EOS; rows have 258 entries.
//! The logit of token `j` after token `last` at position `pos` is
//! [`FakeSpec::logit`]: a small deterministic ripple plus `confidence` on the
//! "next byte" `(last + step) % 256`.

use super::{
    top_gap, BatchSink, BenchTest, BosPolicy, Engine, EngineTimings, LoadedModel, ModelFile,
    ModelInfo, PassSink, SeqToken, Step, Token, TokenId, Window,
};
use crate::core::error::{Error, Result};
use crate::core::{Decoding, EngineBuild, Sampler, Settings};
use std::collections::HashMap;
use std::sync::Arc;

/// BOS id of the fake vocabulary.
pub const BOS: TokenId = 256;
/// EOS id of the fake vocabulary.
pub(crate) const EOS: TokenId = 257;
/// Vocabulary size of the fake vocabulary.
pub const N_VOCAB: usize = 258;

/// How one fake model behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeSpec {
    /// Logit added to the favoured next byte.
    pub confidence: f32,
    /// The favoured next byte is `last + step`.
    pub step: i32,
    /// Whether the model asks for BOS.
    pub add_bos: bool,
    /// Training context.
    pub n_ctx_train: u32,
    /// Inject a NaN logit at (window, position).
    pub nan_at: Option<(usize, usize)>,
    /// Fail `llama_decode` in this window.
    pub decode_error_in: Option<usize>,
    /// Abort the whole process in this window, as a GGML_ASSERT does.
    pub abort_in: Option<usize>,
    /// Sleep this long per window (a slow model, for interruption tests).
    pub sleep_ms: u64,
    /// Tokenizer fingerprint (models of one base share it).
    pub tokenizer: &'static str,
    /// Prompt processing speed `bench` reports (tokens per second).
    pub pp_tps: f64,
    /// Generation speed `bench` reports (tokens per second).
    pub tg_tps: f64,
}

impl Default for FakeSpec {
    fn default() -> Self {
        FakeSpec {
            confidence: 4.0,
            step: 1,
            add_bos: true,
            n_ctx_train: 4096,
            nan_at: None,
            decode_error_in: None,
            abort_in: None,
            sleep_ms: 0,
            tokenizer: "fake-bytes-v1",
            pp_tps: 1000.0,
            tg_tps: 100.0,
        }
    }
}

impl FakeSpec {
    /// The logit of token `j` after token `last` at position `pos`.
    pub(crate) fn logit(&self, last: TokenId, pos: usize, j: usize) -> f32 {
        let ripple = ((j as i64 * 31 + last as i64 * 17 + pos as i64 * 7).rem_euclid(23)) as f32;
        let favoured = (last + self.step).rem_euclid(256) as usize;
        0.1 * ripple + if j == favoured { self.confidence } else { 0.0 }
    }

    /// The wall time `bench` reports for repetition `rep` of `test`: the
    /// tokens at the spec's speed, times `1 + 0.01·(rep mod 3 − 1)` (so that
    /// repetitions differ as measured ones do, by a known amount).
    pub fn bench_time(&self, test: BenchTest, rep: usize) -> std::time::Duration {
        let (n, tps) = match test {
            BenchTest::Prompt(n) => (n, self.pp_tps),
            BenchTest::Generate(n) => (n, self.tg_tps),
        };
        let jitter = 1.0 + 0.01 * ((rep % 3) as f64 - 1.0);
        std::time::Duration::from_secs_f64(n as f64 / tps * jitter)
    }

    /// The whole logit row after token `last` at position `pos`: what the
    /// fake engine hands to the measurement code, and what tests recompute
    /// their independent expectations from.
    pub fn logits(&self, last: TokenId, pos: usize) -> Vec<f32> {
        (0..N_VOCAB).map(|j| self.logit(last, pos, j)).collect()
    }

    fn row(&self, last: TokenId, pos: usize, out: &mut Vec<f32>) {
        out.clear();
        out.extend((0..N_VOCAB).map(|j| self.logit(last, pos, j)));
    }
}

/// The fake engine: per-alias specs, the default spec for other aliases.
#[derive(Debug, Default, Clone)]
pub struct FakeEngine {
    /// Specs by model alias.
    pub specs: HashMap<String, FakeSpec>,
    /// Teacher-forced decodes (calls of `score_passes`) of every model it
    /// loaded, counted for tests of what is decoded once.
    pub decodes: Arc<std::sync::atomic::AtomicUsize>,
    /// Windows those decodes held, counted the same way.
    pub windows: Arc<std::sync::atomic::AtomicUsize>,
    /// The alias of each `bench` call, in order, for tests of who a speed
    /// case measures when.
    pub benches: Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakeEngine {
    /// An engine where every alias gets the default spec.
    pub fn new() -> Self {
        Self::default()
    }

    /// Give `alias` its own behaviour.
    pub fn with(mut self, alias: &str, spec: FakeSpec) -> Self {
        self.specs.insert(alias.to_string(), spec);
        self
    }
}

impl Engine for FakeEngine {
    fn load(&self, file: &ModelFile) -> Result<Arc<dyn LoadedModel>> {
        let spec = self.specs.get(&file.alias).cloned().unwrap_or_default();
        Ok(Arc::new(FakeModel {
            info: ModelInfo {
                file: file.clone(),
                n_vocab: N_VOCAB,
                n_ctx_train: spec.n_ctx_train,
                add_bos: spec.add_bos,
                bos: BOS,
                tokenizer_fingerprint: spec.tokenizer.into(),
            },
            spec,
            decodes: self.decodes.clone(),
            windows: self.windows.clone(),
            benches: self.benches.clone(),
        }))
    }

    fn identity(&self) -> String {
        let mut specs: Vec<String> = self
            .specs
            .iter()
            .map(|(a, s)| format!("{a}={s:?}"))
            .collect();
        specs.sort();
        format!("{} {}", self.build().label(), specs.join(" "))
    }

    fn model_identity(&self, alias: &str) -> String {
        let spec = self.specs.get(alias).cloned().unwrap_or_default();
        format!("{} {spec:?}", self.build().label())
    }

    fn build(&self) -> EngineBuild {
        EngineBuild {
            engine: "fake".into(),
            llama_cpp_2: "-".into(),
            llama_cpp_sys_2: "-".into(),
            ggml: "-".into(),
            backend: "cpu".into(),
        }
    }

    fn quantize(
        &self,
        _src: &std::path::Path,
        dst: &std::path::Path,
        quant: &str,
        _threads: u32,
    ) -> Result<()> {
        Err(Error::engine(format!(
            "the fake engine cannot quantize ({quant} -> {})",
            dst.display()
        )))
    }
}

/// A loaded fake model.
pub(crate) struct FakeModel {
    info: ModelInfo,
    spec: FakeSpec,
    decodes: Arc<std::sync::atomic::AtomicUsize>,
    windows: Arc<std::sync::atomic::AtomicUsize>,
    benches: Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakeModel {
    /// Generate after `prompt`: `pick` chooses from each row, `push` sees
    /// each token kept and says whether to stop; EOS ends without a push.
    fn walk(
        &self,
        prompt: &[TokenId],
        max_new: usize,
        pick: &mut dyn FnMut(&[f32]) -> TokenId,
        push: &mut dyn FnMut(TokenId) -> bool,
    ) -> Result<()> {
        let mut last = *prompt
            .last()
            .ok_or_else(|| self.info.file.error("generation needs a non-empty prompt"))?;
        let mut row = Vec::with_capacity(N_VOCAB);
        for pos in (prompt.len() - 1..).take(max_new) {
            self.spec.row(last, pos, &mut row);
            let next = pick(&row);
            if next == EOS || push(next) {
                break;
            }
            last = next;
        }
        Ok(())
    }
}

impl LoadedModel for FakeModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn tokenize(&self, text: &str, bos: BosPolicy) -> Result<Vec<Token>> {
        let with_bos = match bos {
            BosPolicy::Model => self.spec.add_bos,
            BosPolicy::Always => true,
            BosPolicy::Never => false,
        };
        let mut out = Vec::with_capacity(text.len() + 1);
        if with_bos {
            out.push(Token {
                id: BOS,
                piece: Vec::new(),
                offset: None,
            });
        }
        out.extend(text.bytes().enumerate().map(|(i, b)| Token {
            id: TokenId::from(b),
            piece: vec![b],
            offset: Some(i),
        }));
        Ok(out)
    }

    fn tokenize_special(&self, text: &str, bos: BosPolicy) -> Result<Vec<Token>> {
        self.tokenize(text, bos)
    }

    fn piece(&self, id: TokenId) -> Vec<u8> {
        u8::try_from(id).map(|b| vec![b]).unwrap_or_default()
    }

    fn score_passes(
        &self,
        settings: &Settings,
        windows: &[Window],
        sink: &mut PassSink<'_>,
    ) -> Result<EngineTimings> {
        self.decodes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.windows
            .fetch_add(windows.len(), std::sync::atomic::Ordering::Relaxed);
        if settings.n_ctx > self.info.n_ctx_train {
            return Err(Error::input(format!(
                "model `{}`: n_ctx {} is larger than the model's training context {}",
                self.info.file.alias, settings.n_ctx, self.info.n_ctx_train
            )));
        }
        for (w, window) in windows.iter().enumerate() {
            if window.tokens.len() > settings.n_ctx as usize {
                return Err(self.info.file.error(format!(
                    "window {w} has {} tokens, more than n_ctx {}",
                    window.tokens.len(),
                    settings.n_ctx
                )));
            }
            if self.spec.sleep_ms > 0 {
                std::thread::sleep(std::time::Duration::from_millis(self.spec.sleep_ms));
            }
            if self.spec.abort_in == Some(w) {
                eprintln!("fake engine: GGML_ASSERT-style abort in window {w}");
                std::process::abort();
            }
            if self.spec.decode_error_in == Some(w) {
                return Err(self.info.file.error(format!(
                    "llama_decode failed (1) in window {w} at positions 0..{}",
                    window.tokens.len()
                )));
            }
            // One pass per window.
            let mut rows: Vec<(usize, Vec<f32>)> = Vec::new();
            for (pos, &t) in window.tokens.iter().enumerate().skip(window.logits_from) {
                let mut row = Vec::with_capacity(N_VOCAB);
                self.spec.row(t, pos, &mut row);
                if self.spec.nan_at == Some((w, pos)) {
                    row[7] = f32::NAN;
                }
                if let Some(j) = super::first_non_finite(&row) {
                    return Err(self.info.file.error(format!(
                        "non-finite logit {} for token {j} at position {pos}",
                        row[j]
                    )));
                }
                rows.push((pos, row));
            }
            let pass: Vec<(usize, &[f32])> = rows.iter().map(|(p, r)| (*p, &r[..])).collect();
            if !pass.is_empty() {
                sink(w, &pass)?;
            }
        }
        Ok(EngineTimings::default())
    }

    /// Each batch on cleared memory: every output token's row is the row
    /// after that token at its position (fake rows depend on nothing else),
    /// with the spec's faults by batch index (`decode_error_in`, `nan_at` as
    /// (batch, position)). A sequence's positions must count up from 0 and
    /// fit `n_ctx`, as llama.cpp's memory requires.
    fn decode_batches(
        &self,
        settings: &Settings,
        batches: &[Vec<SeqToken>],
        sink: &mut BatchSink<'_>,
    ) -> Result<EngineTimings> {
        self.decodes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (b, batch) in batches.iter().enumerate() {
            if self.spec.decode_error_in == Some(b) {
                return Err(self.info.file.error(format!(
                    "llama_decode failed (1) in batch {b} of {} tokens",
                    batch.len()
                )));
            }
            // Each sequence's next position: a token must continue it.
            let mut next: HashMap<i32, usize> = HashMap::new();
            for t in batch {
                for s in &t.seqs {
                    let want = next.entry(*s).or_insert(0);
                    if t.pos != *want {
                        return Err(self.info.file.error(format!(
                            "batch {b}: sequence {s} continues at position {} instead of {want}",
                            t.pos
                        )));
                    }
                    *want += 1;
                }
                if t.pos >= settings.n_ctx as usize {
                    return Err(self.info.file.error(format!(
                        "batch {b}: position {} is outside n_ctx {}",
                        t.pos, settings.n_ctx
                    )));
                }
            }
            let mut rows: Vec<Vec<f32>> = Vec::new();
            for t in batch.iter().filter(|t| t.output) {
                let mut row = Vec::with_capacity(N_VOCAB);
                self.spec.row(t.id, t.pos, &mut row);
                if self.spec.nan_at == Some((b, t.pos)) {
                    row[7] = f32::NAN;
                }
                if let Some(j) = super::first_non_finite(&row) {
                    return Err(self.info.file.error(format!(
                        "non-finite logit {} for token {j} at position {} of batch {b}",
                        row[j], t.pos
                    )));
                }
                rows.push(row);
            }
            let rows: Vec<&[f32]> = rows.iter().map(|r| &r[..]).collect();
            sink(b, &rows)?;
        }
        Ok(EngineTimings::default())
    }

    /// The spec's speed ([`FakeSpec::bench_time`] per repetition), after
    /// the same checks llama-bench's context makes.
    fn bench(
        &self,
        settings: &Settings,
        test: BenchTest,
        reps: usize,
        _warmup: bool,
        _seed: u64,
    ) -> Result<Vec<std::time::Duration>> {
        let n = match test {
            BenchTest::Prompt(n) | BenchTest::Generate(n) => n,
        };
        if n == 0 || n > settings.n_ctx as usize {
            return Err(self.info.file.error(format!(
                "a speed test of {n} tokens does not fit n_ctx {}",
                settings.n_ctx
            )));
        }
        self.benches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.info.file.alias.clone());
        Ok((0..reps).map(|r| self.spec.bench_time(test, r)).collect())
    }

    fn generate(
        &self,
        _settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
        _decoding: Decoding,
        stop: &mut dyn FnMut(&[TokenId]) -> bool,
    ) -> Result<Vec<Step>> {
        // Fake rows do not depend on the batch: both decodings agree.
        let mut out = Vec::new();
        let mut ids = Vec::new();
        self.walk(
            prompt,
            max_new,
            &mut |row| {
                let (next, gap) = top_gap(row);
                out.push(Step {
                    token: next as TokenId,
                    gap,
                });
                next as TokenId
            },
            &mut |t| {
                ids.push(t);
                stop(&ids)
            },
        )?;
        if out.last().is_some_and(|s| s.token == EOS) {
            out.pop();
        }
        Ok(out)
    }

    fn sample(
        &self,
        _settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
        sampler: &Sampler,
        seed: u32,
        stop: &mut dyn FnMut(&[TokenId]) -> bool,
    ) -> Result<Vec<TokenId>> {
        let mut rng = crate::measure::SplitMix64(u64::from(seed));
        let mut ids = Vec::new();
        self.walk(
            prompt,
            max_new,
            &mut |row| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                crate::measure::forecast::draw(&crate::measure::forecast::kept(row, sampler), u)
                    as TokenId
            },
            &mut |t| {
                ids.push(t);
                stop(&ids)
            },
        )?;
        Ok(ids)
    }

    fn chat_prompt(&self, user: &str, _builtin: Option<&str>) -> Result<String> {
        Ok(format!("<user>{user}</user><assistant>"))
    }
}
