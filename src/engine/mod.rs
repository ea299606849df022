//! The engine boundary. Contract: a model is loaded once per process per file
//! ([`ModelPool`]); scoring streams one full-vocabulary logit row at a time to
//! a callback and never holds a positions × vocab matrix; any decode failure
//! or non-finite logit is an `Error` naming the model alias, path and sha256,
//! never a number. `llama_cpp_2` is used only in [`llama`].

pub(crate) mod cores;
pub mod fake;
pub mod llama;

/// The source of the engine's decode (this boundary and its llama.cpp
/// side), in order.
const DECODE_SOURCE: [&str; 4] = [
    include_str!("mod.rs"),
    include_str!("llama/mod.rs"),
    include_str!("llama/decode.rs"),
    include_str!("llama/model.rs"),
];

/// The sha256 of `code` followed by the engine's decode source: the code
/// hash of a kept product that depends on how a model is decoded
/// (multiple-choice scores, kld comparisons), so that a change to either
/// computes it again instead of reading old numbers.
pub(crate) fn code_sha256(code: &[&str]) -> String {
    let all: String = code.iter().chain(&DECODE_SOURCE).copied().collect();
    crate::core::fsutil::sha256_bytes(all.as_bytes())
}

use crate::core::error::{Error, Result};
use crate::core::{Decoding, EngineBuild, Sampler, Settings};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A token id as llama.cpp numbers it.
pub(crate) type TokenId = i32;

/// One token of a tokenized text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Token id.
    pub id: TokenId,
    /// The token's bytes as it renders in text (empty for BOS).
    pub piece: Vec<u8>,
    /// Byte offset of the piece in the tokenized text, when the pieces
    /// concatenate to the text there; `None` for BOS and unmatched pieces.
    pub offset: Option<usize>,
}

/// Whether a BOS token is put in front of a tokenized text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BosPolicy {
    /// As the model's metadata says (`tokenizer.ggml.add_bos_token`), like `llama-perplexity`.
    Model,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Which file a model is, for messages and caching.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelFile {
    /// Registry alias.
    pub alias: String,
    /// Path on disk.
    pub path: PathBuf,
    /// sha256 of the file (checked before loading).
    pub sha256: String,
}

impl ModelFile {
    /// Wrap an engine failure with the model's identity.
    pub(crate) fn error(&self, what: impl std::fmt::Display) -> Error {
        Error::engine(format!(
            "model `{}` ({}, sha256 {}): {what}",
            self.alias,
            self.path.display(),
            self.sha256
        ))
    }
}

/// Facts about a loaded model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    /// The file.
    pub file: ModelFile,
    /// Vocabulary size (length of every logit row).
    pub n_vocab: usize,
    /// Training context length.
    pub n_ctx_train: u32,
    /// Whether the model's metadata asks for BOS.
    pub add_bos: bool,
    /// BOS token id.
    pub bos: TokenId,
    /// sha256 over every token's piece and the special ids: equal fingerprints
    /// mean the same tokenizer.
    pub tokenizer_fingerprint: String,
}

/// The top two logits of a row: (argmax, its logit − the runner-up's).
pub fn top_gap(row: &[f32]) -> (usize, f32) {
    let best = argmax(row);
    let second = row
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != best)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    (best, row[best] - second)
}

/// One generated token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The token picked.
    pub token: TokenId,
    /// Its logit minus the runner-up's (≥ 0; the log-odds of the pick).
    pub gap: f32,
}

/// One teacher-forced window: fresh memory, positions 0..tokens.len().
#[derive(Debug, Clone)]
pub struct Window {
    /// Input tokens, position i gets `tokens[i]`.
    pub tokens: Vec<TokenId>,
    /// Rows are produced for positions `logits_from..tokens.len()`.
    pub logits_from: usize,
}

/// Wall time spent inside the engine.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EngineTimings {
    /// Time in `llama_decode` (and context setup).
    pub decode: Duration,
    /// Time in the row callback (measurement).
    pub callback: Duration,
}

/// A row callback: (window index, position, logits) → keep going or error.
pub(crate) type RowSink<'a> = dyn FnMut(usize, usize, &[f32]) -> Result<()> + 'a;

/// A pass callback: (window index, the pass's rows as (position, logits) in
/// order) → keep going or error. The rows stay valid for the call only.
pub(crate) type PassSink<'a> = dyn FnMut(usize, &[(usize, &[f32])]) -> Result<()> + 'a;

/// A speed test as llama-bench runs one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchTest {
    /// `pp`: this many prompt tokens, decoded in batches of `n_batch`.
    Prompt(usize),
    /// `tg`: this many tokens, one `llama_decode` each.
    Generate(usize),
}

/// One token of a batch that holds several sequences.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqToken {
    /// The token.
    pub id: TokenId,
    /// Its position.
    pub pos: usize,
    /// The sequences it belongs to (a shared prefix belongs to several).
    pub seqs: Vec<i32>,
    /// Whether its logits are wanted.
    pub output: bool,
}

/// Rows of one batch's output tokens, in batch order.
pub(crate) type BatchSink<'a> = dyn FnMut(usize, &[&[f32]]) -> Result<()> + 'a;

/// A loaded model.
pub trait LoadedModel: Send + Sync {
    /// Facts about the model.
    fn info(&self) -> &ModelInfo;
    /// How many contexts this model has set up so far: calls whose
    /// settings found one kept idle set up none (0 for an engine without
    /// contexts).
    fn contexts_made(&self) -> u64 {
        0
    }
    /// Tokenize `text` (special tokens not parsed) with pieces and offsets.
    fn tokenize(&self, text: &str, bos: BosPolicy) -> Result<Vec<Token>>;
    /// Tokenize a text that holds special tokens (a chat template's), which
    /// are parsed and rendered in the pieces.
    fn tokenize_special(&self, text: &str, bos: BosPolicy) -> Result<Vec<Token>>;
    /// The text piece of one token.
    fn piece(&self, id: TokenId) -> Vec<u8>;
    /// Teacher-forced scoring: memory cleared before each window; after
    /// each pass, its finite rows (positions from `logits_from`, in order)
    /// handed over at once, so that they can be reduced in parallel.
    fn score_passes(
        &self,
        settings: &Settings,
        windows: &[Window],
        sink: &mut PassSink<'_>,
    ) -> Result<EngineTimings>;
    /// [`LoadedModel::score_passes`], one row at a time.
    fn score(
        &self,
        settings: &Settings,
        windows: &[Window],
        sink: &mut RowSink<'_>,
    ) -> Result<EngineTimings> {
        self.score_passes(settings, windows, &mut |w, rows| {
            for &(pos, row) in rows {
                sink(w, pos, row)?;
            }
            Ok(())
        })
    }
    /// Decode each batch on cleared memory, in `llama_decode` calls of at
    /// most `settings.n_batch` tokens (as llama-perplexity's multiple-choice
    /// scoring does); hand over the rows of its output tokens, in order.
    fn decode_batches(
        &self,
        _settings: &Settings,
        _batches: &[Vec<SeqToken>],
        _sink: &mut BatchSink<'_>,
    ) -> Result<EngineTimings> {
        Err(crate::core::Error::engine(
            "this engine cannot decode several sequences at once".to_string(),
        ))
    }
    /// Time `reps` repetitions of `test` on one context, as llama-bench does:
    /// a warm-up run first (`warmup`: the prompt, or one generated token),
    /// memory cleared before each repetition, token ids drawn at random
    /// (seeded by `seed`; BOS first when the model adds one). Wall time of
    /// each repetition, in order.
    fn bench(
        &self,
        _settings: &Settings,
        _test: BenchTest,
        _reps: usize,
        _warmup: bool,
        _seed: u64,
    ) -> Result<Vec<Duration>> {
        Err(crate::core::Error::engine(
            "this engine cannot measure speed".to_string(),
        ))
    }
    /// Greedy generation (argmax of raw logits, lowest id on ties) of up to
    /// `max_new` tokens after `prompt`; stops early at end-of-generation or
    /// when `stop` returns true for the tokens generated so far.
    fn generate(
        &self,
        settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
        decoding: Decoding,
        stop: &mut dyn FnMut(&[TokenId]) -> bool,
    ) -> Result<Vec<Step>>;
    /// Sampled generation through `sampler` seeded with `seed`, one new
    /// token per pass; stops as [`LoadedModel::generate`] does.
    fn sample(
        &self,
        settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
        sampler: &Sampler,
        seed: u32,
        stop: &mut dyn FnMut(&[TokenId]) -> bool,
    ) -> Result<Vec<TokenId>>;
    /// [`LoadedModel::sample`] once per seed, the same prompt each time:
    /// stops as `stop(sample, generated)` says. A model may decode the
    /// prompt once and reuse its cache and last row — each sample's tokens
    /// are bitwise those of its own [`LoadedModel::sample`].
    fn sample_many(
        &self,
        settings: &Settings,
        prompt: &[TokenId],
        max_new: usize,
        sampler: &Sampler,
        seeds: &[u32],
        stop: &mut dyn FnMut(usize, &[TokenId]) -> bool,
    ) -> Result<Vec<Vec<TokenId>>> {
        seeds
            .iter()
            .enumerate()
            .map(|(k, &seed)| {
                self.sample(settings, prompt, max_new, sampler, seed, &mut |g| {
                    stop(k, g)
                })
            })
            .collect()
    }
    /// The model's chat template applied to one user message, with the
    /// assistant turn opened. `builtin` names one of llama.cpp's built-in
    /// templates (`gemma`, `chatml`, …) for a file that carries none.
    fn chat_prompt(&self, user: &str, builtin: Option<&str>) -> Result<String>;
}

/// An engine: loads models.
pub trait Engine: Send + Sync {
    /// Load a file (already sha-checked and preflighted by the caller).
    fn load(&self, file: &ModelFile) -> Result<Arc<dyn LoadedModel>>;
    /// What build produces the numbers.
    fn build(&self) -> EngineBuild;
    /// The options it runs with (GPU layers, KV cache type, flash
    /// attention): what every [`crate::core::Settings`] of a run carries
    /// (each kind fills them in) and its cache keys hold.
    fn options(&self) -> crate::core::EngineOptions {
        crate::core::EngineOptions::default()
    }
    /// Everything about this engine that changes results, for cache keys
    /// (the build label; a fake engine adds its models' behaviour).
    fn identity(&self) -> String {
        self.build().label()
    }
    /// The compute devices this engine runs on (name, description,
    /// memory), for the keys of measurements of speed; empty where there
    /// is nothing to name.
    fn devices(&self) -> String {
        String::new()
    }
    /// What decides the numbers of model `alias` besides its file's bytes,
    /// for cache keys of its products: the build (a fake engine adds the
    /// behaviour it gives that alias).
    fn model_identity(&self, _alias: &str) -> String {
        self.build().label()
    }
    /// Derive a quantized file (`quant` as `llama-quantize` names it).
    fn quantize(
        &self,
        src: &std::path::Path,
        dst: &std::path::Path,
        quant: &str,
        threads: u32,
    ) -> Result<()>;
}

type Slot = Arc<OnceLock<Result<Arc<dyn LoadedModel>>>>;

/// Loads each (alias, file) once per process and shares it between test
/// threads. Keyed by alias too, so errors name the alias the case used.
pub struct ModelPool {
    engine: Arc<dyn Engine>,
    slots: Mutex<HashMap<String, Slot>>,
}

impl ModelPool {
    /// A pool over `engine`.
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        ModelPool {
            engine,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// Load `file`, or return the already loaded model. Two threads asking for
    /// the same file wait for one load; a failed load is remembered.
    pub fn get(&self, file: &ModelFile) -> Result<Arc<dyn LoadedModel>> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots
                .entry(format!(
                    "{}|{}|{}",
                    file.alias,
                    file.sha256,
                    file.path.display()
                ))
                .or_default()
                .clone()
        };
        slot.get_or_init(|| self.engine.load(file)).clone()
    }
}

/// Index of the largest value; the lowest index wins ties. NaN is never largest.
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best
}

/// Check a logit row; the position of the first non-finite value, if any.
pub(crate) fn first_non_finite(row: &[f32]) -> Option<usize> {
    // Fast path: a vectorisable check of the whole row first.
    if row.iter().all(|v| v.is_finite()) {
        return None;
    }
    row.iter().position(|v| !v.is_finite())
}

/// Byte offsets of pieces in `text`: a piece gets `Some(offset)` when it
/// occurs exactly at the running cursor.
pub(crate) fn piece_offsets(text: &[u8], pieces: &[Vec<u8>]) -> Vec<Option<usize>> {
    let mut cursor = 0usize;
    pieces
        .iter()
        .map(|p| {
            if p.is_empty() {
                return None;
            }
            if text.get(cursor..).is_some_and(|rest| rest.starts_with(p)) {
                let at = cursor;
                cursor += p.len();
                Some(at)
            } else if p.first() == Some(&b' ')
                && cursor == 0
                && text.starts_with(&p[1..])
                && p.len() > 1
            {
                // SentencePiece adds a space before the first word.
                cursor += p.len() - 1;
                Some(0)
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
    }

    #[test]
    fn offsets_follow_the_pieces() {
        let pieces = vec![b"".to_vec(), b"3".to_vec(), b".".to_vec(), b"14".to_vec()];
        assert_eq!(
            piece_offsets(b"3.14", &pieces),
            vec![None, Some(0), Some(1), Some(2)]
        );
        let sp = vec![b" Hello".to_vec(), b" world".to_vec()];
        assert_eq!(piece_offsets(b"Hello world", &sp), vec![Some(0), Some(5)]);
    }
}
