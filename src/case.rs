//! Parse stage: one case file → a typed [`Case`].
//!
//! Contract: unknown keys, wrong types, missing keys and non-finite numbers
//! are errors naming `path:line:col: key`; a gate on a metric the case kind
//! does not produce is a parse-time error; nothing here touches a model.

use crate::engine::BosPolicy;
use crate::error::{Error, Result};
use crate::fsutil::{line_col, sha256_bytes};
use crate::parse::{nearest, parse_toml};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Case kinds.
pub const KINDS: &[&str] = &["perplexity", "kld", "recite", "teacher_forcing"];

/// Metrics of every perplexity case.
pub const PPL_METRICS: &[&str] = &[
    "nll_mean",
    "ppl",
    "ppl_se",
    "tokens_scored",
    "top1_matches",
    "windows",
];

/// Metrics a perplexity case adds when it names a reference.
pub const PAIRED_METRICS: &[&str] = &[
    "delta_nll_mean",
    "delta_nll_ci95_lo",
    "delta_nll_ci95_hi",
    "delta_nll_boot95_lo",
    "delta_nll_boot95_hi",
    "windows_better",
    "ppl_ref",
    "nll_mean_ref",
    "top1_matches_ref",
    "ln_ppl_ratio",
    "ln_ppl_ratio_se",
    "ppl_ratio",
    "ppl_ratio_se",
    "nll_token_corr",
];

/// A parsed case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Test name stem: path under the suites root, `/`-separated, no `.toml`.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// sha256 of the file's bytes.
    pub content_sha256: String,
    /// Free text.
    pub description: String,
    /// Model aliases to run on, with their position in the file.
    pub models: Vec<(String, Location)>,
    /// What to do.
    pub spec: Spec,
    /// Gates.
    pub gates: Vec<Gate>,
    /// Golden comparison tolerances by metric (`default` for the rest).
    pub tolerances: BTreeMap<String, Tolerance>,
    /// A preregistered decision rule (`prereg = "…"`, relative to the case file).
    pub prereg: Option<(PathBuf, Location)>,
}

/// A float matches its golden when `|a − b| ≤ atol + rtol·|b|`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Absolute part.
    #[serde(default = "default_atol")]
    pub atol: f64,
    /// Relative part.
    #[serde(default = "default_rtol")]
    pub rtol: f64,
}

fn default_atol() -> f64 {
    Tolerance::DEFAULT.atol
}

fn default_rtol() -> f64 {
    Tolerance::DEFAULT.rtol
}

impl Tolerance {
    /// Defaults: logits are bitwise reproducible for one build, so only
    /// summation noise is tolerated.
    pub const DEFAULT: Tolerance = Tolerance {
        atol: 1e-9,
        rtol: 1e-6,
    };
}

impl Case {
    /// The tolerance for `metric`.
    pub fn tolerance(&self, metric: &str) -> Tolerance {
        self.tolerances
            .get(metric)
            .or_else(|| self.tolerances.get("default"))
            .copied()
            .unwrap_or(Tolerance::DEFAULT)
    }

    /// The metrics this case produces.
    pub fn metrics(&self) -> Vec<String> {
        match &self.spec {
            Spec::Perplexity(p) => metrics_for(
                p.reference.is_some() || p.reference_record.is_some(),
                self.prereg.is_some(),
                p.kld.as_ref().map(|k| k.bins.len()),
            ),
            Spec::Recite(_) => crate::digitcase::RECITE_METRICS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            Spec::TeacherForcing(t) => t.metrics(),
        }
    }
}

fn metrics_for(paired: bool, prereg: bool, kld_edges: Option<usize>) -> Vec<String> {
    let mut m: Vec<String> = PPL_METRICS.iter().map(|s| s.to_string()).collect();
    if paired {
        m.extend(PAIRED_METRICS.iter().map(|s| s.to_string()));
    }
    if prereg {
        m.extend(crate::prereg::PREREG_METRICS.iter().map(|s| s.to_string()));
    }
    if let Some(n) = kld_edges {
        m.extend(crate::kld::metric_names(n));
    }
    m
}

/// `path:line:col` of a value, for messages after parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location(pub String);

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kind-specific part of a case.
#[derive(Debug, Clone)]
pub enum Spec {
    /// Teacher-forced scoring of a text or token-id file over windows.
    Perplexity(Perplexity),
    /// Greedy recitation from a prompt (seed 000).
    Recite(crate::digitcase::Recite),
    /// Teacher forcing of expected digits after a prompt, digit by digit.
    TeacherForcing(crate::digitcase::TeacherForcing),
}

impl Spec {
    /// The perplexity spec, if this is one.
    pub fn perplexity(&self) -> Option<&Perplexity> {
        match self {
            Spec::Perplexity(p) => Some(p),
            _ => None,
        }
    }

    /// The reference model alias, if any.
    pub fn reference(&self) -> Option<&(String, Location)> {
        match self {
            Spec::Perplexity(p) => p.reference.as_ref(),
            Spec::TeacherForcing(t) => t.reference.as_ref(),
            Spec::Recite(_) => None,
        }
    }
}

/// What is scored.
#[derive(Debug, Clone)]
pub enum Source {
    /// A text, tokenized by the model.
    Text {
        /// The file.
        path: PathBuf,
        /// BOS policy for tokenizing.
        bos: BosPolicy,
    },
    /// Token ids, whitespace-separated decimal integers; never retokenized,
    /// no synthetic BOS.
    TokenIds {
        /// The file.
        path: PathBuf,
    },
}

impl Source {
    /// The case table that names it.
    pub fn table(&self) -> &'static str {
        match self {
            Source::Text { .. } => "text",
            Source::TokenIds { .. } => "tokens",
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            Source::Text { path, .. } | Source::TokenIds { path } => path,
        }
    }
}

/// How a token stream is cut into windows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Windowing {
    /// `llama-perplexity` default: chunks of n_ctx, first token → BOS when
    /// the model adds one, the second half of each chunk scored.
    LlamaPerplexity {
        /// Chunk length.
        n_ctx: u32,
        /// At most this many chunks.
        chunks: Option<usize>,
        /// Chunks to leave out at the start (held-out text: the tool's
        /// chunks `skip..skip + chunks`); 0 is the tool itself.
        skip: usize,
    },
    /// `llama-perplexity --ppl-stride`: chunks every `stride` tokens, each as
    /// long as the tool's context, the last `stride` positions of each scored.
    /// The tool enlarges `-c` by stride/2 and llama.cpp then pads the context
    /// to a multiple of 256; the tool's chunk is that padded length.
    Strided {
        /// `-c` as given (before the tool's enlargement by stride/2).
        n_ctx: u32,
        /// `--ppl-stride`.
        stride: u32,
        /// At most this many chunks.
        chunks: Option<usize>,
    },
    /// Independent contexts of `length` input tokens at `starts`, scoring the
    /// actual next id at every position (seed 002).
    Resets {
        /// Input tokens per window.
        length: u32,
        /// Start offsets.
        starts: Vec<usize>,
    },
}

impl Windowing {
    /// The mode's name as the case writes it.
    pub fn mode(&self) -> &'static str {
        match self {
            Windowing::LlamaPerplexity { .. } => "llama-perplexity",
            Windowing::Strided { .. } => "strided",
            Windowing::Resets { .. } => "resets",
        }
    }

    /// Context length the engine needs.
    pub fn context(&self) -> u32 {
        match self {
            Windowing::LlamaPerplexity { n_ctx, .. } => *n_ctx,
            Windowing::Strided { n_ctx, stride, .. } => (n_ctx + stride / 2).div_ceil(256) * 256,
            Windowing::Resets { length, .. } => *length,
        }
    }
}

/// A perplexity case.
#[derive(Debug, Clone)]
pub struct Perplexity {
    /// What is scored.
    pub source: Source,
    /// Its pinned sha256.
    pub sha256: String,
    /// Where the pin is written.
    pub sha256_at: Location,
    /// Windowing.
    pub windowing: Windowing,
    /// Where the windowing is written (`window.mode`).
    pub window_at: Location,
    /// Batch size (`n_batch = n_ubatch`).
    pub n_batch: u32,
    /// Reference model alias for paired comparisons.
    pub reference: Option<(String, Location)>,
    /// A reference record (JSONL) standing in for the reference model.
    pub reference_record: Option<RecordRef>,
    /// Bootstrap settings.
    pub bootstrap: Bootstrap,
    /// KL divergence against the reference (`kind = "kld"`).
    pub kld: Option<KldSpec>,
}

/// What a `kind = "kld"` case adds.
#[derive(Debug, Clone, PartialEq)]
pub struct KldSpec {
    /// Reference top-1 probability bin edges, increasing, in (0, 1).
    pub bins: Vec<f64>,
    /// Tail mass a stored reference row may leave out.
    pub tail: f64,
    /// Cap on stored entries per reference row.
    pub max_kept: usize,
    /// A llama-perplexity `--kl-divergence-base` file as the reference.
    pub import: Option<RecordRef>,
}

/// A pinned reference record file.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordRef {
    /// The file.
    pub path: PathBuf,
    /// Its pinned sha256.
    pub sha256: String,
    /// Where the pin is written.
    pub at: Location,
}

/// Moving-block bootstrap settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bootstrap {
    /// Seed of the documented generator (SplitMix64).
    pub seed: u64,
    /// Number of resamples.
    pub resamples: usize,
    /// Block length in windows (0: ⌈n^(1/3)⌉).
    pub block: usize,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap {
            seed: 20_251_130,
            resamples: 2000,
            block: 0,
        }
    }
}

/// A gate: the metric must be ≤ max and ≥ min.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// Metric name.
    pub metric: String,
    /// Upper bound.
    pub max: Option<f64>,
    /// Lower bound.
    pub min: Option<f64>,
    /// Gate a bound of the metric's interval instead of its value
    /// (`ci95_hi`, `ci95_lo`, `boot95_hi`, `boot95_lo`).
    pub on: Option<String>,
}

/// Interval bounds a gate can select with `on`.
pub const GATE_ON: &[&str] = &[
    "ci95_lo",
    "ci95_hi",
    "boot95_lo",
    "boot95_hi",
    "wilson95_lo",
    "wilson95_hi",
];

impl Gate {
    /// The metric whose value is gated: `metric`, or with `on = "ci95_hi"`
    /// the interval bound `<metric less _mean>_ci95_hi`.
    pub fn gated_metric(&self) -> String {
        match &self.on {
            None => self.metric.clone(),
            Some(on) => format!(
                "{}_{on}",
                self.metric.strip_suffix("_mean").unwrap_or(&self.metric)
            ),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PerplexityFile {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    description: String,
    models: Spanned<Vec<Spanned<String>>>,
    reference: Option<Spanned<String>>,
    reference_record: Option<TokensFile>,
    reference_kld: Option<TokensFile>,
    kld: Option<Spanned<KldFile>>,
    prereg: Option<Spanned<String>>,
    text: Option<TextFile>,
    tokens: Option<TokensFile>,
    window: Spanned<WindowFile>,
    bootstrap: Option<BootstrapFile>,
    #[serde(default)]
    gate: Vec<GateFile>,
    #[serde(default)]
    tolerance: BTreeMap<String, Spanned<Tolerance>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextFile {
    path: Spanned<String>,
    sha256: Spanned<String>,
    #[serde(default)]
    bos: Option<BosPolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    path: Spanned<String>,
    sha256: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowFile {
    mode: Spanned<String>,
    n_ctx: Option<Spanned<u32>>,
    chunks: Option<Spanned<usize>>,
    skip: Option<Spanned<usize>>,
    stride: Option<Spanned<u32>>,
    length: Option<Spanned<u32>>,
    starts: Option<Spanned<Vec<usize>>>,
    n_batch: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KldFile {
    bins: Option<Spanned<Vec<f64>>>,
    tail: Option<Spanned<f64>>,
    max_kept: Option<Spanned<usize>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BootstrapFile {
    seed: Option<u64>,
    resamples: Option<Spanned<usize>>,
    block: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GateFile {
    metric: Spanned<String>,
    max: Option<f64>,
    min: Option<f64>,
    on: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct KindOnly {
    kind: Option<Spanned<String>>,
}

const MODES: &[&str] = &["llama-perplexity", "strided", "resets"];

/// Parse the case at `path`; `name` is its test-name stem.
pub fn parse_case(path: &Path, name: &str) -> Result<Case> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::input(format!("{}: {e}", path.display())))?;
    let src = String::from_utf8(bytes.clone())
        .map_err(|e| Error::input(format!("{}: not UTF-8: {e}", path.display())))?;
    let at = |offset: usize| {
        let (l, c) = line_col(&src, offset);
        Location(format!("{}:{l}:{c}", path.display()))
    };
    // `kind` picks the schema; read it leniently first.
    let kind = toml::from_str::<KindOnly>(&src).ok().and_then(|k| k.kind);
    let Some(kind) = kind else {
        // Let the full parser report syntax errors first.
        parse_toml::<toml::Table>(path, &src)?;
        return Err(Error::input(format!(
            "{}: missing key `kind` (one of {})",
            path.display(),
            KINDS.join(", ")
        )));
    };
    if !KINDS.contains(&kind.get_ref().as_str()) {
        return Err(Error::input(format!(
            "{}: kind: `{}` is not one of {}",
            at(kind.span().start),
            kind.get_ref(),
            KINDS.join(", ")
        )));
    }
    if matches!(kind.get_ref().as_str(), "recite" | "teacher_forcing") {
        return crate::digitcase::parse(path, name, &src, kind.get_ref(), sha256_bytes(&bytes));
    }
    let f: PerplexityFile = parse_toml(path, &src)?;
    let mut errors = Vec::new();
    let mut err = |loc: Location, msg: String| errors.push(Error::input(format!("{loc}: {msg}")));
    let base = path.parent().unwrap_or(Path::new("."));
    if f.models.get_ref().is_empty() {
        err(
            at(f.models.span().start),
            "models: list at least one model alias".into(),
        );
    }
    let (source, sha) = match (&f.text, &f.tokens) {
        (Some(t), None) => (
            Source::Text {
                path: base.join(t.path.get_ref()),
                bos: t.bos.unwrap_or(BosPolicy::Model),
            },
            ("text", &t.sha256),
        ),
        (None, Some(t)) => (
            Source::TokenIds {
                path: base.join(t.path.get_ref()),
            },
            ("tokens", &t.sha256),
        ),
        _ => {
            return Err(Error::input(format!(
                "{}: give exactly one of [text] (a text to tokenize) or [tokens] (a token-id file)",
                path.display()
            )))
        }
    };
    let (table, sha) = sha;
    if let Some(msg) = bad_sha(table, sha.get_ref()) {
        err(at(sha.span().start), msg);
    }
    let w = f.window.get_ref();
    let mode = w.mode.get_ref().as_str();
    // Which keys each mode takes.
    let allowed: &[&str] = match mode {
        "llama-perplexity" => &["n_ctx", "chunks", "skip", "n_batch"],
        "strided" => &["n_ctx", "stride", "chunks", "n_batch"],
        "resets" => &["length", "starts", "n_batch"],
        _ => {
            err(
                at(w.mode.span().start),
                format!("window.mode: `{mode}` is not one of {}", MODES.join(", ")),
            );
            &[]
        }
    };
    let present: [(&str, Option<usize>); 7] = [
        ("n_ctx", w.n_ctx.as_ref().map(|v| v.span().start)),
        ("skip", w.skip.as_ref().map(|v| v.span().start)),
        ("chunks", w.chunks.as_ref().map(|v| v.span().start)),
        ("stride", w.stride.as_ref().map(|v| v.span().start)),
        ("length", w.length.as_ref().map(|v| v.span().start)),
        ("starts", w.starts.as_ref().map(|v| v.span().start)),
        ("n_batch", w.n_batch.as_ref().map(|v| v.span().start)),
    ];
    if MODES.contains(&mode) {
        for (key, pos) in present {
            if let Some(pos) = pos {
                if !allowed.contains(&key) {
                    err(
                        at(pos),
                        format!(
                            "window.{key}: not used by mode = \"{mode}\" (it takes {})",
                            allowed.join(", ")
                        ),
                    );
                }
            }
        }
        if mode == "resets" && source_is_text(&source) {
            err(
                at(w.mode.span().start),
                "window.mode: `resets` scores a pinned token-id file: use [tokens], not [text]"
                    .into(),
            );
        }
    }
    let mode_at = at(w.mode.span().start);
    let need = |v: &Option<Spanned<u32>>, key: &str, errs: &mut Vec<(Location, String)>| -> u32 {
        match v {
            Some(v) => *v.get_ref(),
            None => {
                errs.push((
                    mode_at.clone(),
                    format!("window: mode = \"{mode}\" needs `{key}`"),
                ));
                0
            }
        }
    };
    let mut later: Vec<(Location, String)> = Vec::new();
    let chunks = w.chunks.as_ref().map(|c| *c.get_ref());
    if let Some(c) = &w.chunks {
        if *c.get_ref() == 0 {
            later.push((
                at(c.span().start),
                "window.chunks: must be ≥ 1 (zero windows)".into(),
            ));
        }
    }
    let windowing = match mode {
        "strided" => {
            let n_ctx = need(&w.n_ctx, "n_ctx", &mut later);
            let stride = need(&w.stride, "stride", &mut later);
            if let Some(s) = &w.stride {
                // The first scored row is context − stride − 1, and llama-perplexity
                // refuses a stride beyond the context it was given.
                if stride == 0 || stride > n_ctx {
                    later.push((
                        at(s.span().start),
                        format!("window.stride: {stride} must be between 1 and n_ctx ({n_ctx})"),
                    ));
                }
            }
            Windowing::Strided {
                n_ctx,
                stride,
                chunks,
            }
        }
        "resets" => {
            let length = need(&w.length, "length", &mut later);
            let starts = match &w.starts {
                Some(s) if s.get_ref().is_empty() => {
                    later.push((
                        at(s.span().start),
                        "window.starts: list at least one start (zero windows)".into(),
                    ));
                    Vec::new()
                }
                Some(s) => s.get_ref().clone(),
                None => {
                    later.push((
                        mode_at.clone(),
                        "window: mode = \"resets\" needs `starts`".into(),
                    ));
                    Vec::new()
                }
            };
            if length < 2 && w.length.is_some() {
                later.push((
                    mode_at.clone(),
                    format!("window.length: {length} must be ≥ 2"),
                ));
            }
            Windowing::Resets { length, starts }
        }
        _ => Windowing::LlamaPerplexity {
            n_ctx: need(&w.n_ctx, "n_ctx", &mut later),
            chunks,
            skip: w.skip.as_ref().map_or(0, |s| *s.get_ref()),
        },
    };
    if let Windowing::LlamaPerplexity { n_ctx, .. } | Windowing::Strided { n_ctx, .. } = &windowing
    {
        if let Some(v) = &w.n_ctx {
            if *n_ctx < 8 || !n_ctx.is_multiple_of(2) {
                later.push((
                    at(v.span().start),
                    format!("window.n_ctx: {n_ctx} must be an even number ≥ 8"),
                ));
            }
        }
    }
    let context = windowing.context();
    // llama-perplexity: n_batch = min(-b, -c), before the strided enlargement.
    let batch_cap = match &windowing {
        Windowing::Strided { n_ctx, .. } => *n_ctx,
        _ => context,
    };
    let n_batch = w
        .n_batch
        .as_ref()
        .map_or(512.min(batch_cap.max(1)), |b| *b.get_ref());
    if let Some(b) = &w.n_batch {
        if n_batch == 0 || n_batch > context {
            later.push((
                at(b.span().start),
                format!("window.n_batch: {n_batch} must be between 1 and the context ({context})"),
            ));
        }
    }
    for (loc, msg) in later {
        err(loc, msg);
    }
    let mut bootstrap = Bootstrap::default();
    if let Some(b) = &f.bootstrap {
        if let Some(s) = b.seed {
            bootstrap.seed = s;
        }
        if let Some(r) = &b.resamples {
            if *r.get_ref() < 100 {
                err(
                    at(r.span().start),
                    format!("bootstrap.resamples: {} is too few (≥ 100)", r.get_ref()),
                );
            }
            bootstrap.resamples = *r.get_ref();
        }
        if let Some(k) = b.block {
            bootstrap.block = k;
        }
    }
    if let Some(r) = &f.reference_record {
        if let Some(msg) = bad_sha("reference_record", r.sha256.get_ref()) {
            err(at(r.sha256.span().start), msg);
        }
        if let Some(m) = &f.reference {
            err(
                at(m.span().start),
                "reference: give a reference model or a reference_record, not both".into(),
            );
        }
    }
    let is_kld = kind.get_ref() == "kld";
    let mut kld = None;
    if is_kld {
        let mut spec = KldSpec {
            bins: crate::kld::DEFAULT_BINS.to_vec(),
            tail: crate::kld::DEFAULT_TAIL,
            max_kept: crate::kld::DEFAULT_MAX_KEPT,
            import: None,
        };
        if let Some(k) = &f.kld {
            let k = k.get_ref();
            if let Some(b) = &k.bins {
                let v = b.get_ref();
                let ok = !v.is_empty()
                    && v.iter().all(|x| *x > 0.0 && *x < 1.0)
                    && v.windows(2).all(|w| w[0] < w[1]);
                if !ok {
                    err(
                        at(b.span().start),
                        format!(
                            "kld.bins: {v:?} must be increasing numbers strictly between 0 and 1"
                        ),
                    );
                }
                spec.bins = v.clone();
            }
            if let Some(t) = &k.tail {
                if !(0.0..=1e-3).contains(t.get_ref()) {
                    err(
                        at(t.span().start),
                        format!("kld.tail: {} must be in [0, 0.001]", t.get_ref()),
                    );
                }
                spec.tail = *t.get_ref();
            }
            if let Some(m) = &k.max_kept {
                if *m.get_ref() == 0 {
                    err(at(m.span().start), "kld.max_kept: must be ≥ 1".into());
                }
                spec.max_kept = *m.get_ref();
            }
        }
        if let Some(r) = &f.reference_kld {
            if let Some(msg) = bad_sha("reference_kld", r.sha256.get_ref()) {
                err(at(r.sha256.span().start), msg);
            }
            if f.reference.is_some() {
                err(
                    at(r.sha256.span().start),
                    "reference_kld: give a reference model or a reference_kld file, not both"
                        .into(),
                );
            }
            if !matches!(windowing, Windowing::LlamaPerplexity { skip: 0, .. }) {
                err(
                    mode_at.clone(),
                    "reference_kld: a llama-perplexity base file holds its default windows: \
                     use window.mode = \"llama-perplexity\" without skip"
                        .into(),
                );
            }
            spec.import = Some(RecordRef {
                path: base.join(r.path.get_ref()),
                sha256: r.sha256.get_ref().clone(),
                at: at(r.sha256.span().start),
            });
        } else if f.reference.is_none() {
            err(
                at(f.models.span().start),
                "kind = \"kld\" needs `reference` (a model) or [reference_kld] (a llama-perplexity base file)".into(),
            );
        }
        if let Some(r) = &f.reference_record {
            err(
                at(r.sha256.span().start),
                "reference_record: holds only the true token's log-prob; a kld case needs `reference` or [reference_kld]".into(),
            );
        }
        kld = Some(spec);
    } else {
        if let Some(k) = &f.kld {
            err(
                at(k.span().start),
                "[kld]: only a kind = \"kld\" case takes it".into(),
            );
        }
        if let Some(r) = &f.reference_kld {
            err(
                at(r.sha256.span().start),
                "[reference_kld]: only a kind = \"kld\" case takes it".into(),
            );
        }
    }
    let metrics = metrics_for(
        f.reference.is_some() || f.reference_record.is_some(),
        f.prereg.is_some(),
        kld.as_ref().map(|k: &KldSpec| k.bins.len()),
    );
    let metrics: Vec<&str> = metrics.iter().map(String::as_str).collect();
    if f.prereg.is_some() && f.reference.is_none() {
        err(
            at(f.prereg.as_ref().map_or(0, |p| p.span().start)),
            "prereg: a preregistered comparison needs `reference` (its baseline model)".into(),
        );
    }
    let (gates, tolerances) = gates_and_tolerances(
        &f.gate,
        &f.tolerance,
        &metrics,
        kind.get_ref(),
        &at,
        &mut err,
    );
    if !errors.is_empty() {
        return Err(crate::error::join(errors));
    }
    Ok(Case {
        prereg: f
            .prereg
            .as_ref()
            .map(|p| (base.join(p.get_ref()), at(p.span().start))),
        name: name.to_string(),
        path: path.to_path_buf(),
        content_sha256: sha256_bytes(&bytes),
        description: f.description,
        models: f
            .models
            .get_ref()
            .iter()
            .map(|m| (m.get_ref().clone(), at(m.span().start)))
            .collect(),
        spec: Spec::Perplexity(Perplexity {
            source,
            sha256: sha.get_ref().clone(),
            sha256_at: at(sha.span().start),
            windowing,
            window_at: mode_at,
            n_batch,
            reference: f
                .reference
                .map(|r| (r.get_ref().clone(), at(r.span().start))),
            reference_record: f.reference_record.map(|r| RecordRef {
                path: base.join(r.path.get_ref()),
                sha256: r.sha256.get_ref().clone(),
                at: at(r.sha256.span().start),
            }),
            bootstrap,
            kld,
        }),
        gates,
        tolerances,
    })
}

/// Gates and tolerances of a case whose kind produces `metrics`; problems
/// go to `err` with their positions.
pub(crate) fn gates_and_tolerances(
    gate_files: &[GateFile],
    tolerance: &BTreeMap<String, Spanned<Tolerance>>,
    metrics: &[&str],
    kind: &str,
    at: &dyn Fn(usize) -> Location,
    err: &mut dyn FnMut(Location, String),
) -> (Vec<Gate>, BTreeMap<String, Tolerance>) {
    let mut gates = Vec::new();
    for (i, g) in gate_files.iter().enumerate() {
        let m = g.metric.get_ref();
        if !metrics.contains(&m.as_str()) {
            let hint = nearest(m, metrics.iter().copied())
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            let why = if PAIRED_METRICS.contains(&m.as_str()) {
                " without a `reference` or `reference_record`".to_string()
            } else {
                String::new()
            };
            err(
                at(g.metric.span().start),
                format!(
                    "gate[{i}].metric: `{m}` is not a metric of a {} case{why}{hint}; metrics: {}",
                    kind,
                    metrics.join(", ")
                ),
            );
        }
        if g.max.is_none() && g.min.is_none() {
            err(
                at(g.metric.span().start),
                format!("gate[{i}]: give `max`, `min` or both"),
            );
        }
        let gate = Gate {
            metric: m.clone(),
            max: g.max,
            min: g.min,
            on: g.on.as_ref().map(|o| o.get_ref().clone()),
        };
        if let Some(on) = &g.on {
            let gated = gate.gated_metric();
            if !GATE_ON.contains(&on.get_ref().as_str()) {
                err(
                    at(on.span().start),
                    format!(
                        "gate[{i}].on: `{}` is not one of {}",
                        on.get_ref(),
                        GATE_ON.join(", ")
                    ),
                );
            } else if metrics.contains(&m.as_str()) && !metrics.contains(&gated.as_str()) {
                err(
                    at(on.span().start),
                    format!("gate[{i}].on: `{m}` has no `{}` bound (`{gated}` is not a metric of this case)", on.get_ref()),
                );
            }
        }
        gates.push(gate);
    }
    let mut tolerances = BTreeMap::new();
    for (k, t) in tolerance {
        let v = t.get_ref();
        if k != "default" && !metrics.contains(&k.as_str()) {
            err(
                at(t.span().start),
                format!(
                    "tolerance.{k}: `{k}` is not a metric of this case; metrics: default, {}",
                    metrics.join(", ")
                ),
            );
        }
        if v.atol < 0.0 || v.rtol < 0.0 {
            err(
                at(t.span().start),
                format!("tolerance.{k}: atol and rtol must be ≥ 0"),
            );
        }
        tolerances.insert(k.clone(), *v);
    }
    (gates, tolerances)
}

/// Why `sha` is not a sha256 pin, if it is not.
fn bad_sha(table: &str, sha: &str) -> Option<String> {
    let ok = sha.len() == 64
        && sha
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (!ok).then(|| format!("{table}.sha256: `{sha}` is not 64 lower-case hex digits"))
}

fn source_is_text(s: &Source) -> bool {
    matches!(s, Source::Text { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("qg-case-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    const GOOD: &str = r#"kind = "perplexity"
models = ["a"]
[text]
path = "t.txt"
sha256 = "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"
[window]
mode = "llama-perplexity"
n_ctx = 64
chunks = 2
[[gate]]
metric = "ppl"
max = 10.0
"#;

    #[test]
    fn a_good_case_parses() {
        let p = write("good.toml", GOOD);
        let c = parse_case(&p, "x/good").unwrap();
        assert_eq!(c.models[0].0, "a");
        assert_eq!(
            c.gates,
            vec![Gate {
                metric: "ppl".into(),
                max: Some(10.0),
                min: None,
                on: None
            }]
        );
        let pp = c.spec.perplexity().unwrap();
        assert_eq!(
            pp.windowing,
            Windowing::LlamaPerplexity {
                n_ctx: 64,
                chunks: Some(2),
                skip: 0,
            }
        );
        assert_eq!(pp.n_batch, 64);
    }

    #[test]
    fn gate_on_unknown_metric_is_a_parse_error() {
        let p = write(
            "badgate.toml",
            &GOOD.replace("metric = \"ppl\"", "metric = \"pll\""),
        );
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(e.contains(":11:10: gate[0].metric: `pll` is not a metric of a perplexity case (did you mean `ppl`?)"), "{e}");
    }

    #[test]
    fn gate_on_selects_existing_bounds_only() {
        let paired = GOOD.replace("models = [\"a\"]", "models = [\"a\"]\nreference = \"b\"");
        let ok = paired.replace(
            "metric = \"ppl\"",
            "metric = \"delta_nll_mean\"\non = \"ci95_hi\"",
        );
        let c = parse_case(&write("on.toml", &ok), "x").unwrap();
        assert_eq!(c.gates[0].gated_metric(), "delta_nll_ci95_hi");
        let bad = paired.replace(
            "metric = \"ppl\"",
            "metric = \"delta_nll_mean\"\non = \"ci99_hi\"",
        );
        let e = parse_case(&write("on-bad.toml", &bad), "x")
            .unwrap_err()
            .message;
        assert!(
            e.contains(
                "gate[0].on: `ci99_hi` is not one of ci95_lo, ci95_hi, boot95_lo, boot95_hi"
            ),
            "{e}"
        );
        let none = GOOD.replace("metric = \"ppl\"", "metric = \"ppl\"\non = \"ci95_hi\"");
        let e = parse_case(&write("on-none.toml", &none), "x")
            .unwrap_err()
            .message;
        assert!(
            e.contains("gate[0].on: `ppl` has no `ci95_hi` bound"),
            "{e}"
        );
    }

    #[test]
    fn unknown_kind_and_missing_kind() {
        let p = write("kind.toml", &GOOD.replace("perplexity\"", "perplex\""));
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(
            e.contains(":1:8: kind: `perplex` is not one of perplexity"),
            "{e}"
        );
        let p = write("nokind.toml", &GOOD.replace("kind = \"perplexity\"\n", ""));
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(e.contains("missing key `kind`"), "{e}");
    }

    #[test]
    fn nan_threshold_and_bad_pin_are_reported_with_positions() {
        let p = write("nan.toml", &GOOD.replace("max = 10.0", "max = nan"));
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(
            e.contains(":12:7: gate[0].max: `nan` is not a finite number"),
            "{e}"
        );
        let p = write("pin.toml", &GOOD.replace("d790b833", "D790B833"));
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(e.contains(":5:10: text.sha256:"), "{e}");
    }
}
