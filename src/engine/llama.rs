//! The llama.cpp engine, over `llama-cpp-2`. The only module that imports it.
//!
//! Contract: one `LlamaBackend` per process; contexts are created one at a
//! time (llama.cpp mutates the model while creating one); every setting that
//! changes numbers is pinned here and recorded in [`Settings`]; `llama_decode`
//! failures and non-finite logits are errors naming the model.

use super::{
    first_non_finite, piece_offsets, top_gap, BosPolicy, Engine, EngineTimings, LoadedModel,
    ModelFile, ModelInfo, PassSink, Step, Token, TokenId, Window,
};
use crate::core::error::{Error, Result};
use crate::core::{Decoding, EngineBuild, Sampler, Settings};
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use sha2::{Digest, Sha256};
use std::ffi::CStr;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// The pinned crate versions (checked against Cargo.lock by a test).
pub const LLAMA_CPP_2_VERSION: &str = "0.1.160";
/// The pinned sys crate version, which carries the llama.cpp sources.
pub const LLAMA_CPP_SYS_2_VERSION: &str = "0.1.161";

static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();
static CONTEXT_LOCK: Mutex<()> = Mutex::new(());

fn backend() -> Result<&'static LlamaBackend> {
    BACKEND
        .get_or_init(|| {
            let mut b = LlamaBackend::init().map_err(|e| e.to_string())?;
            // llama.cpp prints ~1,100 lines per load; QUANTGATE_LLAMA_LOG=1 keeps them.
            if std::env::var_os("QUANTGATE_LLAMA_LOG").is_none() {
                b.void_logs();
            }
            Ok(b)
        })
        .as_ref()
        .map_err(|e| Error::engine(format!("llama.cpp backend failed to initialise: {e}")))
}

/// The llama.cpp engine.
#[derive(Debug, Default, Clone, Copy)]
pub struct LlamaEngine {
    drafts: bool,
}

impl LlamaEngine {
    /// The engine (initialises the backend on first use).
    pub fn new() -> Self {
        LlamaEngine { drafts: true }
    }

    /// The engine without drafted invariant generation: every pass of
    /// [`Decoding::Invariant`] picks one token (the slower way to the same
    /// tokens, kept to measure and test the drafted one against).
    pub fn without_drafts() -> Self {
        LlamaEngine { drafts: false }
    }
}

fn compute_backend() -> &'static str {
    if cfg!(feature = "cuda") {
        "cuda"
    } else if cfg!(feature = "vulkan") {
        "vulkan"
    } else if cfg!(feature = "metal") {
        "metal"
    } else {
        "cpu"
    }
}

/// ggml's own version string and commit.
pub fn ggml_version() -> String {
    // SAFETY: both return static NUL-terminated strings.
    unsafe {
        let v = CStr::from_ptr(llama_cpp_sys_2::ggml_version()).to_string_lossy();
        let c = CStr::from_ptr(llama_cpp_sys_2::ggml_commit()).to_string_lossy();
        format!("{v} ({c})")
    }
}

/// The tokenizer fingerprint of a loaded model: every token's text, the
/// special ids and the BOS/EOS policy, hashed.
fn fingerprint(model: &LlamaModel) -> String {
    let vocab = model.vocab();
    let mut h = Sha256::new();
    for id in 0..vocab.n_tokens().max(0) {
        let text = vocab
            .text(LlamaToken::new(id))
            .map(|c| c.to_bytes().to_vec())
            .unwrap_or_default();
        h.update((text.len() as u64).to_le_bytes());
        h.update(&text);
    }
    for special in [vocab.bos(), vocab.eos(), vocab.eot()] {
        h.update(special.0.to_le_bytes());
    }
    h.update([
        u8::from(vocab.should_add_bos()),
        u8::from(vocab.should_add_eos()),
    ]);
    crate::core::fsutil::hex(&h.finalize())
}

/// A ggml tensor type, as ggml itself describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgmlType {
    /// ggml's name, upper-cased as in its `GGML_TYPE_*` enum (`Q4_K`, `MXFP4`, …).
    pub name: String,
    /// Elements per block.
    pub block: u64,
    /// Bytes per block.
    pub bytes: u64,
}

/// What ggml says of type `id`; None for an id it does not know or has
/// retired (a block size of 0).
pub fn ggml_type(id: u32) -> Option<GgmlType> {
    if id >= llama_cpp_sys_2::GGML_TYPE_COUNT {
        return None;
    }
    let t = id as llama_cpp_sys_2::ggml_type;
    // SAFETY: `t` is below GGML_TYPE_COUNT, the length of ggml's static type
    // table these read; the name is a static NUL-terminated string.
    let (name, block, bytes) = unsafe {
        let name = llama_cpp_sys_2::ggml_type_name(t);
        (
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned()),
            llama_cpp_sys_2::ggml_blck_size(t),
            llama_cpp_sys_2::ggml_type_size(t),
        )
    };
    let block = u64::try_from(block).ok().filter(|&b| b > 0)?;
    Some(GgmlType {
        // ggml spells them `q4_K`, `bf16`: upper-cased, its enum's names.
        name: name?.to_ascii_uppercase(),
        block,
        bytes: bytes as u64,
    })
}

/// The tokenizer fingerprint of the file at `path`, from a vocabulary-only
/// load (no weights read): the one [`Engine::load`] records.
pub fn vocab_fingerprint(path: &Path) -> Result<String> {
    let backend = backend()?;
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(backend, path, &params).map_err(|e| {
        Error::input(format!(
            "{}: llama.cpp could not load the vocabulary: {e}",
            path.display()
        ))
    })?;
    Ok(fingerprint(&model))
}

/// What llama.cpp's loader reports of the file at `path` (weights on the
/// CPU): its parameter count and its tensors' bytes, whose ratio is the
/// bits per weight llama.cpp prints.
pub fn loader_size(path: &Path) -> Result<(u64, u64)> {
    let backend = backend()?;
    let params = LlamaModelParams::default().with_n_gpu_layers(0);
    let model = LlamaModel::load_from_file(backend, path, &params).map_err(|e| {
        Error::input(format!(
            "{}: llama.cpp could not load the model: {e}",
            path.display()
        ))
    })?;
    Ok((model.n_params(), model.size()))
}

/// llama.cpp's KV cache type for a name of [`crate::core::settings::KV_TYPES`].
fn kv_type(name: &str) -> Result<KvCacheType> {
    Ok(match name {
        "f32" => KvCacheType::F32,
        "f16" => KvCacheType::F16,
        "bf16" => KvCacheType::BF16,
        "q8_0" => KvCacheType::Q8_0,
        "q4_0" => KvCacheType::Q4_0,
        "q4_1" => KvCacheType::Q4_1,
        "iq4_nl" => KvCacheType::IQ4_NL,
        "q5_0" => KvCacheType::Q5_0,
        "q5_1" => KvCacheType::Q5_1,
        other => {
            return Err(Error::input(format!(
                "KV cache type `{other}` is not one of {}",
                crate::core::settings::KV_TYPES.join(", ")
            )))
        }
    })
}

impl Engine for LlamaEngine {
    fn load(&self, file: &ModelFile) -> Result<Arc<dyn LoadedModel>> {
        let backend = backend()?;
        let path = file
            .path
            .to_str()
            .ok_or_else(|| file.error("path is not UTF-8"))?;
        // Layers on the GPU: as asked, else every layer on a GPU build and
        // none on a CPU build (the build's backend is in every key).
        let o = crate::core::EngineOptions::current();
        let ngl = o
            .n_gpu_layers
            .unwrap_or(if compute_backend() == "cpu" { 0 } else { 999 });
        let params = LlamaModelParams::default().with_n_gpu_layers(ngl);
        let model = LlamaModel::load_from_file(backend, Path::new(path), &params)
            .map_err(|e| file.error(format!("llama.cpp could not load the model: {e}")))?;
        let vocab = model.vocab();
        let n_vocab = usize::try_from(vocab.n_tokens())
            .map_err(|_| file.error("negative vocabulary size"))?;
        let info = ModelInfo {
            file: file.clone(),
            n_vocab,
            n_ctx_train: model.n_ctx_train(),
            add_bos: vocab.should_add_bos(),
            bos: vocab.bos().0,
            tokenizer_fingerprint: fingerprint(&model),
        };
        Ok(Arc::new(Loaded {
            model,
            info,
            drafts: self.drafts,
        }))
    }

    fn build(&self) -> EngineBuild {
        EngineBuild {
            engine: "llama.cpp".into(),
            llama_cpp_2: LLAMA_CPP_2_VERSION.into(),
            llama_cpp_sys_2: LLAMA_CPP_SYS_2_VERSION.into(),
            ggml: ggml_version(),
            backend: compute_backend().into(),
        }
    }

    fn quantize(&self, src: &Path, dst: &Path, quant: &str, threads: u32) -> Result<()> {
        quantize(src, dst, quant, threads)
    }

    /// ggml's backend devices as registered for this build: `name
    /// (description, total bytes)` each, `; `-separated.
    fn devices(&self) -> String {
        if backend().is_err() {
            return String::new();
        }
        llama_cpp_2::list_llama_ggml_backend_devices()
            .iter()
            .map(|d| format!("{} ({}, {} B)", d.name, d.description, d.memory_total))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// How [`Loaded::decode_each`] decodes one item: (context, batch, the
/// lane's settings, item index, item).
type LaneDecode<'f, T, R> =
    dyn Fn(&mut LlamaContext<'_>, &mut LlamaBatch, &Settings, usize, &T) -> Result<R> + Sync + 'f;

struct Loaded {
    model: LlamaModel,
    info: ModelInfo,
    /// Invariant generation checks drafted tokens (see `generate`).
    drafts: bool,
}

impl Loaded {
    fn err(&self, what: impl std::fmt::Display) -> Error {
        self.info.file.error(what)
    }

    fn context(&self, settings: &Settings) -> Result<LlamaContext<'_>> {
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
            .new_context(backend()?, params)
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

    fn tokens(&self, text: &str, bos: BosPolicy, special: bool) -> Vec<Token> {
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
    fn decode_padded(
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
    fn decode_range(
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
    /// delivered is bitwise what one context gives (`tests/engine_llama.rs`).
    /// The first error in item order is returned, after the items before it
    /// are delivered.
    fn decode_each<T: Sync, R: Send>(
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
        let mut lanes: Vec<(Settings, LlamaContext<'_>, LlamaBatch)> = threads
            .into_iter()
            .map(|threads| {
                let mut s = settings.clone();
                s.threads = threads;
                let ctx = self.context(&s)?;
                Ok((s, ctx, LlamaBatch::new(batch.0, batch.1)))
            })
            .collect::<Result<_>>()?;
        let n = lanes.len();
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
    }

    /// Up to `k` tokens that greedy one-row passes (llama.cpp's usual
    /// generation) predict after `tokens`, whose cache holds [0, `done`):
    /// guesses for an invariant pass to check, never a result. A pass that
    /// fails or a row that is not finite ends the guessing; the cache is
    /// left holding [0, `done`) again.
    fn draft(
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
    fn start(
        &self,
        settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
    ) -> Result<LlamaContext<'_>> {
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

    fn row<'c>(&self, ctx: &'c LlamaContext<'_>, i: i32, pos: usize) -> Result<&'c [f32]> {
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

impl LoadedModel for Loaded {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn decode_batches(
        &self,
        settings: &Settings,
        batches: &[Vec<super::SeqToken>],
        sink: &mut super::BatchSink<'_>,
    ) -> Result<EngineTimings> {
        let t0 = Instant::now();
        let mut callback = std::time::Duration::ZERO;
        let n_batch = settings.n_batch as usize;
        self.decode_each(
            settings,
            (n_batch, settings.n_seq.max(1) as i32),
            batches,
            &|ctx, batch, _, b, tokens: &Vec<super::SeqToken>| {
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
        test: super::BenchTest,
        reps: usize,
        warmup: bool,
        seed: u64,
    ) -> Result<Vec<std::time::Duration>> {
        let mut ctx = self.context(settings)?;
        let n_vocab = self.info.n_vocab as u64;
        // The ids do not matter to the speed, only their count.
        let mut rng = crate::measure::SplitMix64(seed);
        let mut next = move || LlamaToken((rng.next_u64() % n_vocab) as i32);
        let bos = self.info.add_bos.then_some(LlamaToken(self.info.bos));
        let n_batch = settings.n_batch as usize;
        let mut run = |ctx: &mut LlamaContext<'_>, test: super::BenchTest| -> Result<()> {
            let fail =
                |e: &dyn std::fmt::Display| self.err(format!("llama_decode (speed test): {e}"));
            match test {
                super::BenchTest::Prompt(n) => {
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
                super::BenchTest::Generate(n) => {
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
                super::BenchTest::Prompt(_) => run(&mut ctx, test)?,
                super::BenchTest::Generate(_) => run(&mut ctx, super::BenchTest::Generate(1))?,
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
fn sampler_chain(sampler: &Sampler, seed: u32) -> LlamaSampler {
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

/// The llama.cpp file type for a quant type name (as `llama-quantize` spells it).
pub fn ftype(name: &str) -> Option<llama_cpp_sys_2::llama_ftype> {
    use llama_cpp_sys_2 as s;
    Some(match name {
        "F16" => s::LLAMA_FTYPE_MOSTLY_F16,
        "BF16" => s::LLAMA_FTYPE_MOSTLY_BF16,
        "Q8_0" => s::LLAMA_FTYPE_MOSTLY_Q8_0,
        "Q6_K" => s::LLAMA_FTYPE_MOSTLY_Q6_K,
        "Q5_K_M" => s::LLAMA_FTYPE_MOSTLY_Q5_K_M,
        "Q5_K_S" => s::LLAMA_FTYPE_MOSTLY_Q5_K_S,
        "Q5_1" => s::LLAMA_FTYPE_MOSTLY_Q5_1,
        "Q5_0" => s::LLAMA_FTYPE_MOSTLY_Q5_0,
        "Q4_K_M" => s::LLAMA_FTYPE_MOSTLY_Q4_K_M,
        "Q4_K_S" => s::LLAMA_FTYPE_MOSTLY_Q4_K_S,
        "Q4_1" => s::LLAMA_FTYPE_MOSTLY_Q4_1,
        "Q4_0" => s::LLAMA_FTYPE_MOSTLY_Q4_0,
        "Q3_K_L" => s::LLAMA_FTYPE_MOSTLY_Q3_K_L,
        "Q3_K_M" => s::LLAMA_FTYPE_MOSTLY_Q3_K_M,
        "Q3_K_S" => s::LLAMA_FTYPE_MOSTLY_Q3_K_S,
        "Q2_K" => s::LLAMA_FTYPE_MOSTLY_Q2_K,
        _ => return None,
    })
}

/// llama.cpp's name for a `general.file_type` value (its `LLAMA_FTYPE_*`
/// constants without the prefix), None for a value this build does not know.
pub fn ftype_name(id: i128) -> Option<&'static str> {
    use llama_cpp_sys_2 as s;
    const NAMES: &[(llama_cpp_sys_2::llama_ftype, &str)] = &[
        (s::LLAMA_FTYPE_ALL_F32, "F32"),
        (s::LLAMA_FTYPE_MOSTLY_F16, "F16"),
        (s::LLAMA_FTYPE_MOSTLY_Q4_0, "Q4_0"),
        (s::LLAMA_FTYPE_MOSTLY_Q4_1, "Q4_1"),
        (s::LLAMA_FTYPE_MOSTLY_Q8_0, "Q8_0"),
        (s::LLAMA_FTYPE_MOSTLY_Q5_0, "Q5_0"),
        (s::LLAMA_FTYPE_MOSTLY_Q5_1, "Q5_1"),
        (s::LLAMA_FTYPE_MOSTLY_Q2_K, "Q2_K"),
        (s::LLAMA_FTYPE_MOSTLY_Q3_K_S, "Q3_K_S"),
        (s::LLAMA_FTYPE_MOSTLY_Q3_K_M, "Q3_K_M"),
        (s::LLAMA_FTYPE_MOSTLY_Q3_K_L, "Q3_K_L"),
        (s::LLAMA_FTYPE_MOSTLY_Q4_K_S, "Q4_K_S"),
        (s::LLAMA_FTYPE_MOSTLY_Q4_K_M, "Q4_K_M"),
        (s::LLAMA_FTYPE_MOSTLY_Q5_K_S, "Q5_K_S"),
        (s::LLAMA_FTYPE_MOSTLY_Q5_K_M, "Q5_K_M"),
        (s::LLAMA_FTYPE_MOSTLY_Q6_K, "Q6_K"),
        (s::LLAMA_FTYPE_MOSTLY_IQ2_XXS, "IQ2_XXS"),
        (s::LLAMA_FTYPE_MOSTLY_IQ2_XS, "IQ2_XS"),
        (s::LLAMA_FTYPE_MOSTLY_Q2_K_S, "Q2_K_S"),
        (s::LLAMA_FTYPE_MOSTLY_IQ3_XS, "IQ3_XS"),
        (s::LLAMA_FTYPE_MOSTLY_IQ3_XXS, "IQ3_XXS"),
        (s::LLAMA_FTYPE_MOSTLY_IQ1_S, "IQ1_S"),
        (s::LLAMA_FTYPE_MOSTLY_IQ4_NL, "IQ4_NL"),
        (s::LLAMA_FTYPE_MOSTLY_IQ3_S, "IQ3_S"),
        (s::LLAMA_FTYPE_MOSTLY_IQ3_M, "IQ3_M"),
        (s::LLAMA_FTYPE_MOSTLY_IQ2_S, "IQ2_S"),
        (s::LLAMA_FTYPE_MOSTLY_IQ2_M, "IQ2_M"),
        (s::LLAMA_FTYPE_MOSTLY_IQ4_XS, "IQ4_XS"),
        (s::LLAMA_FTYPE_MOSTLY_IQ1_M, "IQ1_M"),
        (s::LLAMA_FTYPE_MOSTLY_BF16, "BF16"),
        (s::LLAMA_FTYPE_MOSTLY_TQ1_0, "TQ1_0"),
        (s::LLAMA_FTYPE_MOSTLY_TQ2_0, "TQ2_0"),
        (s::LLAMA_FTYPE_MOSTLY_MXFP4_MOE, "MXFP4_MOE"),
        (s::LLAMA_FTYPE_MOSTLY_NVFP4, "NVFP4"),
        (s::LLAMA_FTYPE_MOSTLY_Q1_0, "Q1_0"),
        (s::LLAMA_FTYPE_MOSTLY_Q2_0, "Q2_0"),
    ];
    NAMES
        .iter()
        .find(|(v, _)| i128::from(*v) == id)
        .map(|(_, n)| *n)
}

/// Quant type names [`ftype`] accepts.
pub const QUANT_TYPES: &[&str] = &[
    "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1",
    "Q4_0", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K",
];

/// Quantize `src` into `dst` with `llama_model_quantize` (default params,
/// `allow_requantize`): byte-identical to `llama-quantize`.
pub fn quantize(src: &Path, dst: &Path, quant: &str, threads: u32) -> Result<()> {
    let ftype = ftype(quant).ok_or_else(|| {
        Error::input(format!(
            "unknown quant type `{quant}`; expected one of {}",
            QUANT_TYPES.join(", ")
        ))
    })?;
    backend()?;
    let c = |p: &Path| {
        std::ffi::CString::new(p.to_string_lossy().as_bytes())
            .map_err(|_| Error::input(format!("{}: path contains NUL", p.display())))
    };
    let (src_c, dst_c) = (c(src)?, c(dst)?);
    // SAFETY: plain C call with valid NUL-terminated paths and a params struct
    // from llama.cpp's own defaults.
    let rc = unsafe {
        let mut params = llama_cpp_sys_2::llama_model_quantize_default_params();
        params.ftype = ftype;
        params.allow_requantize = true;
        params.nthread = threads as i32;
        llama_cpp_sys_2::llama_model_quantize(src_c.as_ptr(), dst_c.as_ptr(), &params)
    };
    if rc != 0 {
        return Err(Error::engine(format!(
            "llama_model_quantize {} -> {} ({quant}) failed with code {rc}",
            src.display(),
            dst.display()
        )));
    }
    Ok(())
}

/// Split the GGUF at `src` into `n` files `<dir>/<stem>-0000i-of-0000n.gguf`
/// as llama.cpp's `gguf-split --split-max-tensors` writes them: the first part
/// holds every metadata entry, each part `split.no`, `split.count` and
/// `split.tensors.count`, and the tensors in order, ⌈tensors / n⌉ per part,
/// their data copied byte for byte. Returns the parts in order.
pub fn split_gguf(src: &Path, dir: &Path, stem: &str, n: u16) -> Result<Vec<std::path::PathBuf>> {
    use llama_cpp_sys_2 as sys;
    use std::ffi::CString;
    use std::io::{Read, Seek, SeekFrom, Write};
    let cstr = |s: &str| CString::new(s).map_err(|_| Error::input(format!("`{s}` contains NUL")));
    let src_c = cstr(&src.to_string_lossy())?;
    let mut meta: *mut sys::ggml_context = std::ptr::null_mut();
    // SAFETY: a valid path and out-pointer; no_alloc reads the header only.
    let g = unsafe {
        sys::gguf_init_from_file(
            src_c.as_ptr(),
            sys::gguf_init_params {
                no_alloc: true,
                ctx: &mut meta,
            },
        )
    };
    if g.is_null() {
        return Err(Error::input(format!(
            "{}: not a GGUF file ggml can read",
            src.display()
        )));
    }
    let result = (|| {
        // SAFETY: `g` and `meta` are valid until freed below.
        let (n_tensors, data_offset) =
            unsafe { (sys::gguf_get_n_tensors(g), sys::gguf_get_data_offset(g)) };
        if n == 0 || i64::from(n) > n_tensors {
            return Err(Error::input(format!(
                "{}: cannot split {n_tensors} tensors into {n} parts",
                src.display()
            )));
        }
        let per = (n_tensors as usize).div_ceil(n as usize);
        let mut input = std::fs::File::open(src).map_err(|e| Error::io(src, e))?;
        let (k_no, k_count, k_tensors) = (
            cstr("split.no")?,
            cstr("split.count")?,
            cstr("split.tensors.count")?,
        );
        let mut parts = Vec::new();
        for i in 0..n {
            let ids: Vec<i64> = ((i as usize * per) as i64
                ..(((i as usize + 1) * per) as i64).min(n_tensors))
                .collect();
            let path = dir.join(format!("{stem}-{:05}-of-{n:05}.gguf", i + 1));
            let path_c = cstr(&path.to_string_lossy())?;
            // SAFETY: `out` is a fresh context freed below; tensors come from `meta`.
            let (ok, align) = unsafe {
                let out = sys::gguf_init_empty();
                if i == 0 {
                    sys::gguf_set_kv(out, g);
                }
                sys::gguf_set_val_u16(out, k_no.as_ptr(), i);
                sys::gguf_set_val_u16(out, k_count.as_ptr(), n);
                sys::gguf_set_val_i32(out, k_tensors.as_ptr(), n_tensors as i32);
                for &t in &ids {
                    let name = sys::gguf_get_tensor_name(g, t);
                    sys::gguf_add_tensor(out, sys::ggml_get_tensor(meta, name));
                }
                let ok = sys::gguf_write_to_file(out, path_c.as_ptr(), true);
                let align = sys::gguf_get_alignment(out);
                sys::gguf_free(out);
                (ok, align)
            };
            if !ok {
                return Err(Error::io(
                    &path,
                    std::io::Error::other("gguf_write_to_file failed"),
                ));
            }
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            for &t in &ids {
                // SAFETY: valid context and tensor id.
                let (off, size) = unsafe {
                    (
                        sys::gguf_get_tensor_offset(g, t),
                        sys::gguf_get_tensor_size(g, t),
                    )
                };
                input
                    .seek(SeekFrom::Start((data_offset + off) as u64))
                    .map_err(|e| Error::io(src, e))?;
                let mut buf = vec![0u8; size];
                input.read_exact(&mut buf).map_err(|e| Error::io(src, e))?;
                buf.resize(size.next_multiple_of(align), 0);
                f.write_all(&buf).map_err(|e| Error::io(&path, e))?;
            }
            f.sync_all().map_err(|e| Error::io(&path, e))?;
            parts.push(path);
        }
        Ok(parts)
    })();
    // SAFETY: freed once, after their last use.
    unsafe {
        sys::gguf_free(g);
        sys::ggml_free(meta);
    }
    result
}
