//! Engine settings and the engine build: the facts that change numbers,
//! recorded with every result, golden and cache key. Shared by every stage.

use crate::core::error::{Error, Result};
use serde::Serialize;

/// The engine options of a whole run, set by the command line
/// (`--n-gpu-layers`, `--kv-type`, `--flash-attn`) or the environment
/// (`QUANTGATE_N_GPU_LAYERS`, `QUANTGATE_KV_TYPE`, `QUANTGATE_FLASH_ATTN`,
/// as `cargo test` and its workers see it): what a model too big for the
/// defaults needs. Each is part of [`Settings`], so of every cache key and
/// golden's settings line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Layers offloaded to the GPU; `None`: the build's default (every
    /// layer on a GPU build, none on a CPU build; the build's backend is in
    /// every key).
    pub n_gpu_layers: Option<u32>,
    /// K and V cache element type (llama.cpp's `-ctk`/`-ctv` names).
    pub kv_type: String,
    /// Flash attention (off by default: `auto` turns it on for CPU, and it
    /// changes the numbers).
    pub flash_attn: bool,
}

/// The KV cache types llama.cpp accepts (`-ctk`, `-ctv`).
pub(crate) const KV_TYPES: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
];

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_gpu_layers: None,
            kv_type: "f16".into(),
            flash_attn: false,
        }
    }
}

impl EngineOptions {
    /// Options from the three values as given (`what` says where each came
    /// from, for messages): `n_gpu_layers` a number or `all`, `kv_type` one
    /// of [`KV_TYPES`], `flash_attn` `on` or `off`.
    pub fn parse(
        n_gpu_layers: Option<(&str, &str)>,
        kv_type: Option<(&str, &str)>,
        flash_attn: Option<(&str, &str)>,
    ) -> Result<EngineOptions> {
        let mut o = EngineOptions::default();
        if let Some((v, what)) = n_gpu_layers {
            o.n_gpu_layers = Some(match v {
                "all" => 999,
                v => v.parse().map_err(|_| {
                    Error::input(format!("{what}: `{v}` is not a number of layers or `all`"))
                })?,
            });
        }
        if let Some((v, what)) = kv_type {
            if !KV_TYPES.contains(&v) {
                return Err(Error::input(format!(
                    "{what}: `{v}` is not one of {}",
                    KV_TYPES.join(", ")
                )));
            }
            o.kv_type = v.to_string();
        }
        if let Some((v, what)) = flash_attn {
            o.flash_attn = match v {
                "on" => true,
                "off" => false,
                v => return Err(Error::input(format!("{what}: `{v}` is not on or off"))),
            };
        }
        if !["f32", "f16", "bf16"].contains(&o.kv_type.as_str()) && !o.flash_attn {
            return Err(Error::input(format!(
                "{}: a quantized V cache (`{}`) needs flash attention in llama.cpp; turn it on \
                 (--flash-attn on, QUANTGATE_FLASH_ATTN=on)",
                kv_type.map_or("kv type", |k| k.1),
                o.kv_type
            )));
        }
        Ok(o)
    }

    /// Options from the command line's `--n-gpu-layers`, `--kv-type` and
    /// `--flash-attn` (in that order; None: not given), each falling back
    /// to its variable as `var` gives it (`QUANTGATE_N_GPU_LAYERS`,
    /// `QUANTGATE_KV_TYPE`, `QUANTGATE_FLASH_ATTN`; the config reads them);
    /// messages name the flag or the variable.
    pub(crate) fn from_flags_or(
        flags: [Option<&str>; 3],
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<EngineOptions> {
        const NAMES: [(&str, &str); 3] = [
            ("--n-gpu-layers", "QUANTGATE_N_GPU_LAYERS"),
            ("--kv-type", "QUANTGATE_KV_TYPE"),
            ("--flash-attn", "QUANTGATE_FLASH_ATTN"),
        ];
        let var_of = var;
        let given: Vec<Option<(String, &str)>> = flags
            .iter()
            .zip(NAMES)
            .map(|(flag, (name, var))| {
                flag.map(|v| (v.to_string(), name))
                    .or_else(|| var_of(var).filter(|v| !v.is_empty()).map(|v| (v, var)))
            })
            .collect();
        let r = |i: usize| given[i].as_ref().map(|(v, k)| (v.as_str(), *k));
        EngineOptions::parse(r(0), r(1), r(2))
    }

    /// The environment that gives a child process these options (a worker
    /// runs under the options its parent was given, flags included).
    pub(crate) fn to_env(&self) -> [(&'static str, String); 3] {
        [
            (
                "QUANTGATE_N_GPU_LAYERS",
                self.n_gpu_layers.map_or(String::new(), |n| n.to_string()),
            ),
            ("QUANTGATE_KV_TYPE", self.kv_type.clone()),
            (
                "QUANTGATE_FLASH_ATTN",
                if self.flash_attn { "on" } else { "off" }.to_string(),
            ),
        ]
    }
}

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
    /// Layers offloaded to a GPU when asked for (see [`EngineOptions`]);
    /// absent: the build's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_gpu_layers: Option<u32>,
    /// Every `llama_decode` gets at least this many rows, rounded up to a
    /// multiple of 4 (padding after the last real token, removed from the
    /// cache at once); 0 = no padding. Logits depend on the micro-batch shape,
    /// so teacher forcing and [`Decoding::Invariant`] generation with the same
    /// value use the same kernels and agree bitwise.
    #[serde(default)]
    pub min_rows: u32,
    /// Physical batch when it differs from `n_batch` (0: equal).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_ubatch: u32,
    /// Sequences of one context (more than 1: a unified KV cache holding
    /// several sequences, as llama-perplexity's multiple-choice scoring has).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_seq: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Settings {
    /// n_batch 512 (at most n_ctx), no padding, and the default
    /// [`EngineOptions`] (flash attention off, f16 KV cache); a run's own
    /// come from its engine ([`Settings::with_options`],
    /// [`crate::execute::RunContext::settings`]).
    pub fn new(n_ctx: u32, threads: u32) -> Self {
        Settings::new_with(n_ctx, threads, &EngineOptions::default())
    }

    /// These settings under engine options `o`.
    pub(crate) fn with_options(self, o: &EngineOptions) -> Self {
        Settings {
            flash_attn: o.flash_attn,
            kv_type: o.kv_type.clone(),
            n_gpu_layers: o.n_gpu_layers,
            ..self
        }
    }

    fn new_with(n_ctx: u32, threads: u32, o: &EngineOptions) -> Self {
        Settings {
            threads,
            n_ctx,
            n_batch: 512.min(n_ctx.max(1)),
            flash_attn: o.flash_attn,
            kv_type: o.kv_type.clone(),
            n_gpu_layers: o.n_gpu_layers,
            min_rows: 0,
            n_ubatch: 0,
            n_seq: 0,
        }
    }

    /// The settings line of golden headers and cache keys.
    pub(crate) fn describe(&self) -> String {
        format!(
            "n_ctx={} n_batch={} n_ubatch={}{} flash_attn={} kv={}{}{}",
            self.n_ctx,
            self.n_batch,
            self.physical_batch(),
            if self.n_seq > 1 {
                format!(" n_seq={} kv_unified", self.n_seq)
            } else {
                String::new()
            },
            if self.flash_attn { "on" } else { "off" },
            self.kv_type,
            self.n_gpu_layers
                .map(|n| format!(" n_gpu_layers={n}"))
                .unwrap_or_default(),
            if self.min_rows > 0 {
                format!(" min_rows={}", self.min_rows)
            } else {
                String::new()
            }
        )
    }

    /// The physical batch (`n_ubatch`).
    pub(crate) fn physical_batch(&self) -> u32 {
        if self.n_ubatch == 0 {
            self.n_batch
        } else {
            self.n_ubatch
        }
    }

    /// The same settings without padding (token-at-a-time passes).
    pub(crate) fn unpadded(&self) -> Settings {
        Settings {
            min_rows: 0,
            ..self.clone()
        }
    }

    /// Rows of a pass that decodes `n` tokens: `n`, or with `min_rows` set,
    /// at least `min_rows`, rounded up to a multiple of 4 (the repacked CPU
    /// kernels take rows four at a time and the rest one by one).
    pub(crate) fn padded_rows(&self, n: usize) -> usize {
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
    /// with `Settings::min_rows`: `padded_rows(1)` rows ending at the last
    /// token drafted by cheap one-row passes (trailing tokens re-decoded,
    /// padded while the text is shorter), each confirmed draft a token
    /// picked. Greedy output then equals the argmax of the teacher-forced
    /// rows, bitwise.
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
