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

mod files;
pub use files::*;
mod decode;
mod model;
mod pool;

/// The pinned crate versions (checked against Cargo.lock by a test).
pub const LLAMA_CPP_2_VERSION: &str = "0.1.160";

/// The pinned sys crate version, which carries the llama.cpp sources.
pub const LLAMA_CPP_SYS_2_VERSION: &str = "0.1.161";

static BACKEND: OnceLock<Result<LlamaBackend>> = OnceLock::new();

static CONTEXT_LOCK: Mutex<()> = Mutex::new(());

/// At most two malloc arenas for the process (glibc). Decode lanes are
/// threads started per pair of windows, and glibc hands a new thread an
/// arena of its own; the vocabulary rows the lanes free there stay as
/// fragments, so a process's peak grew with the windows it decoded: a kld
/// trial run alone (SmolLM2, 2 threads) peaked 1.03–1.07× higher at 32
/// chunks than at 4, and 1.002× with two arenas, in the same time (the
/// book, performance). Two serve the two lanes; llama.cpp's own threads
/// hardly allocate.
fn few_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a limit glibc reads when it makes an arena.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// The process's llama.cpp backend, initialised by its first user: with
/// llama.cpp's own log kept when `log` (the first engine's setting holds
/// for the process, as llama.cpp's log is process-wide).
fn backend(log: bool) -> Result<&'static LlamaBackend> {
    BACKEND
        .get_or_init(|| {
            few_arenas();
            let mut b = LlamaBackend::init().map_err(|e| {
                Error::engine(format!("llama.cpp backend failed to initialise: {e}"))
            })?;
            // llama.cpp prints ~1,100 lines per load; QUANTGATE_LLAMA_LOG=1 keeps them.
            if !log {
                b.void_logs();
            }
            Ok(b)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The llama.cpp engine, with its options (GPU layers, KV cache type,
/// flash attention) and whether llama.cpp's own log is kept.
#[derive(Debug, Clone)]
pub struct LlamaEngine {
    drafts: bool,
    options: crate::core::EngineOptions,
    log: bool,
    /// Its models' llama.cpp contexts, kept across calls (`pool.rs`).
    contexts: Arc<pool::Contexts>,
}

impl Default for LlamaEngine {
    fn default() -> Self {
        LlamaEngine {
            drafts: false,
            options: crate::core::EngineOptions::default(),
            log: false,
            contexts: pool::Contexts::new(crate::core::config::DEFAULT_CONTEXT_POOL),
        }
    }
}

impl LlamaEngine {
    /// The engine with default options (initialises the backend on first
    /// use).
    pub fn new() -> Self {
        LlamaEngine {
            drafts: true,
            ..LlamaEngine::default()
        }
    }

    /// The engine with `config`'s options and log setting.
    pub fn for_config(config: &crate::core::config::Config) -> Self {
        LlamaEngine {
            drafts: true,
            options: config.engine.clone(),
            log: config.llama_log,
            contexts: pool::Contexts::new(config.context_pool),
        }
    }

    /// The engine without drafted invariant generation: every pass of
    /// [`Decoding::Invariant`] picks one token (the slower way to the same
    /// tokens, kept to measure and test the drafted one against).
    pub fn without_drafts() -> Self {
        LlamaEngine::default()
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
pub(crate) fn ggml_version() -> String {
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
    fn options(&self) -> crate::core::EngineOptions {
        self.options.clone()
    }

    fn load(&self, file: &ModelFile) -> Result<Arc<dyn LoadedModel>> {
        let backend = backend(self.log)?;
        let path = file
            .path
            .to_str()
            .ok_or_else(|| file.error("path is not UTF-8"))?;
        // Layers on the GPU: as asked, else every layer on a GPU build and
        // none on a CPU build (the build's backend is in every key).
        let o = &self.options;
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
            idle: pool::Idle::new(&self.contexts),
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
        backend(self.log)?;
        let _cores = crate::engine::cores::hold(threads as usize);
        quantize(src, dst, quant, threads)
    }

    /// ggml's backend devices as registered for this build: `name
    /// (description, total bytes)` each, `; `-separated.
    fn devices(&self) -> String {
        if backend(self.log).is_err() {
            return String::new();
        }
        llama_cpp_2::list_llama_ggml_backend_devices()
            .iter()
            .map(|d| format!("{} ({}, {} B)", d.name, d.description, d.memory_total))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

struct Loaded {
    /// Contexts kept across calls (before `model`: freed first).
    idle: pool::Idle,
    model: LlamaModel,
    info: ModelInfo,
    /// Invariant generation checks drafted tokens (see `generate`).
    drafts: bool,
}
