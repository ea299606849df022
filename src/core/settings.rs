//! Engine settings and the engine build: the facts that change numbers,
//! recorded with every result, golden and cache key. Shared by every stage.

use serde::Serialize;

/// Engine settings that change numbers; recorded with every result.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct Settings {
    /// CPU threads for decoding.
    pub threads: u32,
    /// Context length of the llama.cpp context.
    pub n_ctx: u32,
    /// Logical and physical batch (`n_batch = n_ubatch`).
    pub n_batch: u32,
    /// Flash attention; pinned off (`auto` turns it on for CPU).
    pub flash_attn: bool,
    /// KV cache element type.
    pub kv_type: String,
    /// Every `llama_decode` gets at least this many rows, rounded up to a
    /// multiple of 4 (padding after the last real token, removed from the
    /// cache at once); 0 = no padding. Logits depend on the micro-batch shape,
    /// so teacher forcing and [`Decoding::Invariant`] generation with the same
    /// value use the same kernels and agree bitwise.
    #[serde(default)]
    pub min_rows: u32,
}

impl Settings {
    /// Defaults: n_batch 512, flash attention off, f16 KV cache.
    pub fn new(n_ctx: u32, threads: u32) -> Self {
        Settings {
            threads,
            n_ctx,
            n_batch: 512.min(n_ctx.max(1)),
            flash_attn: false,
            kv_type: "f16".into(),
            min_rows: 0,
        }
    }

    /// The settings line of golden headers and cache keys.
    pub fn describe(&self) -> String {
        format!(
            "n_ctx={} n_batch={} n_ubatch={} flash_attn={} kv={}{}",
            self.n_ctx,
            self.n_batch,
            self.n_batch,
            if self.flash_attn { "on" } else { "off" },
            self.kv_type,
            if self.min_rows > 0 {
                format!(" min_rows={}", self.min_rows)
            } else {
                String::new()
            }
        )
    }

    /// The same settings without padding (token-at-a-time passes).
    pub fn unpadded(&self) -> Settings {
        Settings {
            min_rows: 0,
            ..self.clone()
        }
    }

    /// Rows of a pass that decodes `n` tokens: `n`, or with `min_rows` set,
    /// at least `min_rows`, rounded up to a multiple of 4 (the repacked CPU
    /// kernels take rows four at a time and the rest one by one).
    pub fn padded_rows(&self, n: usize) -> usize {
        if self.min_rows == 0 {
            n
        } else {
            n.max(self.min_rows as usize).next_multiple_of(4)
        }
    }
}

/// How greedy generation decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decoding {
    /// Every pass that picks a token has the kernel shape of teacher forcing
    /// with `Settings::min_rows`: the trailing `padded_rows(1)` tokens are
    /// re-decoded each step (padded while the text is shorter). Greedy
    /// output then equals the argmax of the teacher-forced rows, bitwise.
    Invariant,
    /// One new token per pass (llama.cpp's usual generation): other kernels
    /// than a many-row pass, so near-ties can flip.
    Incremental,
}

/// A sampler chain in llama.cpp's default order: top-k, top-p, min-p,
/// temperature, then a seeded draw.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Sampler {
    /// Temperature (> 0).
    pub temperature: f32,
    /// Keep the k most likely tokens (0: off).
    pub top_k: u32,
    /// Keep the smallest set holding this much probability (1: off).
    pub top_p: f32,
    /// Keep tokens at least this fraction as likely as the top one (0: off).
    pub min_p: f32,
}

/// The build that produced the numbers.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct EngineBuild {
    /// Engine name (`llama.cpp` or `fake`).
    pub engine: String,
    /// `llama-cpp-2` version.
    pub llama_cpp_2: String,
    /// `llama-cpp-sys-2` version.
    pub llama_cpp_sys_2: String,
    /// ggml version and commit.
    pub ggml: String,
    /// Compute backend (cpu, cuda, vulkan, metal).
    pub backend: String,
}

impl EngineBuild {
    /// One-line label, used in cache keys and golden headers.
    pub fn label(&self) -> String {
        format!(
            "{} llama-cpp-2 {} llama-cpp-sys-2 {} ggml {} {}",
            self.engine, self.llama_cpp_2, self.llama_cpp_sys_2, self.ggml, self.backend
        )
    }
}
