//! The narrow run context a kind runs on: the registry (to make a model
//! available and verified), the loaded-model pool, the llama.cpp threads and
//! the reference store. Used by every kind, by the trial driver and the CLI.
//!
//! Contract: loading a model always goes through the registry's sha256 and
//! GGUF preflight; [`RunContext::verify_inputs`] re-checks every pinned file
//! of a case (whatever its kind) and its model files without running
//! anything — what a cached result relies on.

use crate::core::config::Config;
use crate::core::error::Result;
use crate::core::{Case, EngineOptions, Location};
use crate::engine::{BosPolicy, Engine, LoadedModel, ModelPool, TokenId};
use crate::execute::reference::{same_tokenizer, ReferenceStore, Vocab};
use crate::models::{ensure, Registry, Verified};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

type TokenSlot = Arc<OnceLock<Result<Arc<Vec<TokenId>>>>>;

/// Everything a kind needs to run: models, threads, the reference store.
pub struct RunContext {
    config: Config,
    options: EngineOptions,
    registry: Registry,
    pool: ModelPool,
    /// llama.cpp threads per trial.
    pub threads: u32,
    /// Reference rows and scores, shared by every candidate.
    pub references: ReferenceStore,
    /// Per loaded model file (sha256): its GGUF tokenizer definition's hash.
    tokenizers: Mutex<HashMap<String, String>>,
    /// Token ids per (tokenizer, text, BOS): a text is tokenized once per
    /// process for every model that shares a tokenizer.
    token_ids: Mutex<HashMap<String, TokenSlot>>,
}

impl RunContext {
    /// A context over `engine` under `config`: reference caches under
    /// `<cache>/reference`, the shipped folder and keys it names.
    pub fn new(config: &Config, registry: Registry, engine: Arc<dyn Engine>, threads: u32) -> Self {
        RunContext {
            config: config.clone(),
            options: engine.options(),
            registry,
            pool: ModelPool::new(engine),
            threads: threads.max(1),
            references: ReferenceStore::new(config.cache.join("reference"), config),
            tokenizers: Mutex::new(HashMap::new()),
            token_ids: Mutex::new(HashMap::new()),
        }
    }

    /// The config this context runs under.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The engine's options: what every [`crate::core::Settings`] of this
    /// run carries ([`crate::core::Settings::with_options`]).
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The engine.
    pub(crate) fn engine(&self) -> &Arc<dyn Engine> {
        self.pool.engine()
    }

    /// The engine build's one-line label (cache keys, golden headers).
    pub(crate) fn build_label(&self) -> String {
        self.pool.engine().build().label()
    }

    /// What keys the products of model `alias` (scores, reference rows)
    /// besides its file: the build, and whatever else the engine says
    /// decides its numbers.
    pub(crate) fn identity_of(&self, alias: &str) -> String {
        self.pool.engine().model_identity(alias)
    }

    /// The machine speed is measured on here ([`crate::core::machine`]) and
    /// the engine's devices, as one line; None when the CPU cannot be read.
    pub(crate) fn machine(&self) -> Option<String> {
        static HERE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let here = HERE.get_or_init(crate::core::machine::describe).clone()?;
        Some(format!("{here} | devices {}", self.engine().devices()))
    }

    /// Make a model available and verified (fetch/derive as needed).
    pub(crate) fn prepare(&self, alias: &str) -> Result<Verified> {
        let engine = self.pool.engine().clone();
        let threads = self.threads;
        let quantize =
            move |src: &Path, dst: &Path, quant: &str| engine.quantize(src, dst, quant, threads);
        ensure(
            &self.config,
            &self.registry,
            alias,
            &self.build_label(),
            &quantize,
        )
    }

    /// A verified, loaded model (once per process per file).
    pub fn load(&self, alias: &str) -> Result<(Verified, Arc<dyn LoadedModel>)> {
        let v = self.prepare(alias)?;
        let m = self.pool.get(&v.file)?;
        self.tokenizers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(v.file.sha256.clone(), v.header.tokenizer_sha256.clone());
        Ok((v, m))
    }

    /// The token ids of `text` under `model`'s tokenizer with BOS as `bos`
    /// says: tokenized once per process for every model whose tokenizer is
    /// the same — the same engine fingerprint (every piece, the special
    /// ids) and the same GGUF tokenizer definition (vocabulary, merges,
    /// pre-tokenizer; [`crate::models::gguf::GgufHeader::tokenizer_sha256`]).
    /// A model not loaded through [`RunContext::load`] shares with nobody.
    pub(crate) fn token_ids(
        &self,
        model: &dyn LoadedModel,
        text: &str,
        bos: BosPolicy,
    ) -> Result<Arc<Vec<TokenId>>> {
        let info = model.info();
        let definition = self
            .tokenizers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&info.file.sha256)
            .cloned()
            .unwrap_or_else(|| format!("file {}", info.file.sha256));
        let add = match bos {
            BosPolicy::Model => info.add_bos,
            BosPolicy::Always => true,
            BosPolicy::Never => false,
        };
        let key = format!(
            "{}|{definition}|{}|{bos:?}|{add}",
            info.tokenizer_fingerprint,
            crate::core::fsutil::sha256_bytes(text.as_bytes())
        );
        let slot = {
            let mut m = self.token_ids.lock().unwrap_or_else(|p| p.into_inner());
            m.entry(key).or_default().clone()
        };
        slot.get_or_init(|| {
            Ok(Arc::new(
                model.tokenize(text, bos)?.iter().map(|t| t.id).collect(),
            ))
        })
        .clone()
    }

    /// The reference model of a case (`at` is where the case names it),
    /// loaded and checked against the candidate's tokenizer; refused on a
    /// shard that ships its references
    /// ([`ReferenceStore::may_load_reference`]).
    pub(crate) fn load_reference(
        &self,
        (alias, at): (&str, &Location),
        candidate: Vocab,
    ) -> Result<(Verified, Arc<dyn LoadedModel>)> {
        self.references
            .may_load_reference(alias)
            .map_err(|e| e.context(at))?;
        let (verified, model) = self
            .load(alias)
            .map_err(|e| e.context(format!("{at}: reference")))?;
        same_tokenizer(at, "reference", Vocab::of(model.info()), candidate)?;
        Ok((verified, model))
    }

    /// The sha256 a model is pinned to in the registry, or (unpinned) that
    /// of its verified file.
    pub(crate) fn pinned_sha256(&self, alias: &str) -> Result<String> {
        match &self.registry.entry(alias)?.sha256 {
            Some(s) => Ok(s.clone()),
            None => Ok(self.prepare(alias)?.file.sha256),
        }
    }

    /// Check every input of `case` on `model` still matches its pin (the
    /// case's pinned files, the model and reference files) without running
    /// anything.
    pub(crate) fn verify_inputs(&self, case: &Case, model: &str) -> Result<()> {
        for pin in &case.pins {
            pin.read_bytes()?;
        }
        self.prepare(model)?;
        if let Some((r, _)) = &case.reference {
            self.prepare(r)?;
        }
        Ok(())
    }
}

/// The cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads per trial so that test threads × llama threads ≤ cores.
pub fn threads_per_trial(concurrent: usize) -> u32 {
    (cores() / concurrent.max(1)).max(1) as u32
}
