//! The command line's flags and subcommands, as clap parses them.
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "quantgate",
    version,
    long_version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (source sha256 ",
        env!("QUANTGATE_SOURCE_SHA256"),
        ")"
    ),
    about = "Evaluate GGUF models and their quants against gates and goldens"
)]
pub struct Cli {
    /// The suites directory (holds models.toml and the cases); default:
    /// `QUANTGATE_SUITES` when set, else `suites` (in the working directory).
    #[arg(long, global = true)]
    pub suites: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Write a release repository for a folder of GGUF files: suites/ with
    /// the standard release gates (ΔNLL, KLD, multiple choice, speed against
    /// the reference), the corpus, Cargo.toml and tests/gate.rs for `cargo
    /// test`, a nextest config and a README. Refuses to overwrite unless
    /// --force; never writes goldens.
    Init(InitArgs),
    /// Run cases (all by default) and print a table. Exit 0: all pass; 1: a case failed; 2: unusable input.
    Run(RunArgs),
    /// List registry models with status, bytes and sha256; `models fetch` fetches/derives them.
    Models(ModelsArgs),
    /// Reference records: a reference model's scores, exported once.
    Reference(ReferenceArgs),
    /// Preregistered decision rules: seal, verify, report.
    Prereg(PreregArgs),
    /// What GGUF files are: bytes, parameters, bits per weight, tensor types,
    /// architecture, context, vocabulary, tokenizer, quantization provenance.
    Inspect(InspectArgs),
    /// The ladder report (report.md, report.csv, report.html): from `--json`
    /// files of `quantgate run`, else from the result cache (the newest
    /// result of each selected case × model, e.g. after `cargo test`).
    Report(ReportArgs),
    /// Merge the outcomes of shards (folders a `QUANTGATE_OUT=DIR` run under
    /// nextest wrote, or `--json` files) into one run: every selected test
    /// exactly once, one build, one settings line per case, gates judged
    /// again; then the table, `--json` and `--report` as `run` writes them.
    /// Exit 0: all pass; 1: a test failed; 2: the shards do not make one run.
    Merge(MergeArgs),
    /// Print the token ids of a text file, one per line (to pin as a `[tokens]` file).
    Tokenize(TokenizeArgs),
    /// Compare two sets of goldens for a reviewer: each case × model ×
    /// metric unchanged, within noise (its declared tolerance, or its old
    /// paired interval), moved, flipped (a gate's verdict), added or
    /// removed, worst first. BASE and HEAD are git revisions (HEAD: the
    /// working tree; BASE: the merge-base with origin/main), two goldens
    /// folders, or two `--json` files. Exit 0: nothing beyond noise; 1: a
    /// gate flipped or a metric moved (see --fail-on); 2: unusable input.
    Diff(DiffArgs),
    /// Each model through two runtimes (`linked`, the llama.cpp quantgate
    /// links, or a llama-perplexity binary of `<suites>/runtimes.toml`)
    /// over the same windows: ΔNLL (B − A) with its 95% interval, KLD(B‖A)
    /// mean, p99 and max, same top, PPL each, the floor (A run twice;
    /// each runtime against itself at another thread count) beside every figure. Exit 0:
    /// within the build-upgrade gates; 1: beyond them; 2: unusable input.
    Drift(DriftArgs),
    /// The runtimes `<suites>/runtimes.toml` declares (and `linked`), each
    /// verified: its sha256 against its pin, its `--help`, its `--version`.
    Runtimes(RuntimesArgs),
}

/// Which cases run on which models.
#[derive(clap::Args)]
pub struct Select {
    /// Case files, directories or globs (relative to the suites directory).
    pub patterns: Vec<String>,
    /// Only these model aliases; or GGUF files (paths, globs, a split
    /// file by its first part), pinned in `<suites>/models.lock`, which
    /// every selected case then runs on instead of its own models.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// The reference (an alias or a GGUF file) of every selected case
    /// that names one, instead of its own.
    #[arg(long)]
    pub reference: Option<String>,
}

#[derive(Subcommand)]
pub enum ReferenceAction {
    /// Score a perplexity case on its reference model and write the record (JSONL):
    /// per target the log-prob of the true token and the top-1 id.
    Export {
        /// The case file.
        case: PathBuf,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
        /// Model to record (default: the case's `reference`).
        #[arg(long)]
        model: Option<String>,
    },
    /// Build the reference products (`.qgref` rows for KL, `.qgscores` for
    /// paired ΔNLL) of the selected cases once, into DIR: shards then read
    /// them with QUANTGATE_REFERENCE_DIR=DIR and never load the reference model.
    Build {
        /// Which cases and models, as `run` selects them.
        #[command(flatten)]
        select: Select,
        /// The folder to write (created; products already in it are kept).
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum PreregAction {
    /// Append the sha256 of FILE's exact bytes to its directory's LEDGER (chained).
    Seal {
        /// The prereg file.
        file: PathBuf,
    },
    /// Check every prereg, the ledger chain and the git history; runs no model.
    Verify,
    /// Every sealed comparison with its outcome (from the goldens), wins and losses together.
    Report,
}

#[derive(Subcommand)]
pub enum ModelsAction {
    /// Fetch or derive models (all by default) and verify them.
    Fetch {
        /// Aliases.
        aliases: Vec<String>,
    },
    /// Pin local GGUF files (paths or globs) in `<suites>/models.lock`, or
    /// pin every entry of the lock again: the only way a pinned file's
    /// new bytes are accepted.
    Pin {
        /// Files or globs (default: every file the lock pins).
        paths: Vec<String>,
        /// Where the files are published on the Hugging Face Hub:
        /// `ORG/NAME@COMMIT` (each file by its own name there). The lock
        /// then pins the revision with the sha256, and `models download`
        /// puts the files in place on a machine that lacks them.
        #[arg(long, value_name = "ORG/NAME@COMMIT")]
        hub: Option<String>,
    },
    /// Put the lock's files that are published on the Hub (`models pin
    /// --hub`) in place: each missing file downloaded at its pinned commit
    /// by the Hub's own client (Python's huggingface_hub) and verified
    /// against the lock's bytes and sha256 before it is written; a file in
    /// place verified. Exit 2 when a file differs from the lock.
    Download {
        /// Aliases (default: every lock entry with a Hub source).
        aliases: Vec<String>,
    },
}

/// The flags of `quantgate run`.
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub select: Select,
    /// Write one JSON object per case × model to FILE.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write per-position rows (kld cases) as DIR/<case>/<model>.parquet.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print per-model stage timings.
    #[arg(long)]
    pub timings: bool,
    /// llama.cpp threads of each job (default: the cores, shared by the jobs).
    #[arg(long)]
    pub threads: Option<u32>,
    /// Groups of cases (one decode each) run at once (default 1; at least 1).
    #[arg(long, default_value_t = 1, value_parser = at_least_one::<usize>)]
    pub jobs: usize,
    /// The goldens directory a preregistered case's history is checked
    /// against (default: `goldens` beside the suites directory).
    #[arg(long)]
    pub goldens: Option<PathBuf>,
    /// Accept a selection of no case × model (otherwise an error: a
    /// mistyped filter must not pass).
    #[arg(long)]
    pub allow_empty: bool,
    /// Run every case × model again instead of taking unchanged ones from
    /// the result cache (nor recording them there).
    #[arg(long)]
    pub no_cache: bool,
    /// Layers to offload to the GPU: a number or `all` (default: all on
    /// a GPU build, none on CPU; env QUANTGATE_N_GPU_LAYERS).
    #[arg(long)]
    pub n_gpu_layers: Option<String>,
    /// KV cache type: f16 (default), f32, bf16, q8_0, q4_0, q4_1,
    /// iq4_nl, q5_0, q5_1 (quantized ones need --flash-attn on; env
    /// QUANTGATE_KV_TYPE).
    #[arg(long)]
    pub kv_type: Option<String>,
    /// Flash attention: off (default) or on (env QUANTGATE_FLASH_ATTN).
    #[arg(long)]
    pub flash_attn: Option<String>,
    /// Also write the ladder report (report.md, report.csv, report.html) to DIR.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The Hugging Face Hub id of the model the files quantize
    /// (`ORG/NAME`): the report's model card names it as `base_model`.
    #[arg(long, value_name = "ORG/NAME")]
    pub base_model: Option<String>,
    /// Replace a report that DIR of --report holds already.
    #[arg(long)]
    pub force: bool,
}

/// The flags of `quantgate models`.
#[derive(clap::Args)]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub action: Option<ModelsAction>,
}

/// The flags of `quantgate reference`.
#[derive(clap::Args)]
pub struct ReferenceArgs {
    #[command(subcommand)]
    pub action: ReferenceAction,
}

/// The flags of `quantgate prereg`.
#[derive(clap::Args)]
pub struct PreregArgs {
    #[command(subcommand)]
    pub action: PreregAction,
    /// The prereg directory (holds the files and LEDGER).
    #[arg(long, global = true, default_value = "prereg")]
    pub dir: PathBuf,
    /// The goldens directory.
    #[arg(long, global = true, default_value = "goldens")]
    pub goldens: PathBuf,
}

/// The flags of `quantgate inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// GGUF files (a split file by any of its parts) or registry aliases.
    #[arg(required = true)]
    pub targets: Vec<String>,
    /// Print a JSON array, one object per target.
    #[arg(long)]
    pub json: bool,
}

/// The flags of `quantgate init`.
#[derive(clap::Args)]
pub struct InitArgs {
    /// The folder to write (made if missing).
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// The GGUF files to release (paths or globs, relative to the working
    /// directory): the reference and its quants.
    #[arg(long = "model", required = true)]
    pub models: Vec<String>,
    /// The reference file (default: the largest of the --model files).
    #[arg(long)]
    pub reference: Option<String>,
    /// The corpus for ΔNLL and KLD (default: WikiText-2 test, shipped with
    /// quantgate); copied into suites/data and pinned by sha256.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Replace the files init writes (goldens are never touched).
    #[arg(long)]
    pub force: bool,
    /// Where the written Cargo.toml and workflow take quantgate from:
    /// `git` (quantgate's repository at the commit this one was built
    /// from), `version` (crates.io), `path` (this checkout: this machine
    /// only, said loudly), or a TOML inline table's inside
    /// (`git = "https://…", rev = "…"`). Default: `git` where quantgate
    /// knows its repository, else `path`.
    #[arg(long, value_name = "git|version|path|TABLE")]
    pub dependency: Option<String>,
    /// Where the GGUF files are published on the Hugging Face Hub,
    /// `ORG/NAME@COMMIT`: the lock pins that commit with each file's
    /// sha256, and the workflow downloads the files from there (cached)
    /// instead of taking them from the repository by Git LFS.
    #[arg(long, value_name = "ORG/NAME@COMMIT")]
    pub hub: Option<String>,
}

/// The flags of `quantgate report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Which cases and models (with the result cache), as `run` selects them.
    #[command(flatten)]
    pub select: Select,
    /// `--json` files of `quantgate run` to report on.
    #[arg(long)]
    pub json: Vec<PathBuf>,
    /// Where to write the report.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    /// The Hugging Face Hub id of the model the files quantize
    /// (`ORG/NAME`): the report's model card names it as `base_model`.
    #[arg(long, value_name = "ORG/NAME")]
    pub base_model: Option<String>,
    /// Accept a selection of no case × model (otherwise an error).
    #[arg(long)]
    pub allow_empty: bool,
    /// Replace a report that --out holds already.
    #[arg(long)]
    pub force: bool,
}

/// The flags of `quantgate merge`.
#[derive(clap::Args)]
pub struct MergeArgs {
    /// Shard output folders (walked for `*.json`) or `--json` files.
    #[arg(required = true)]
    pub sources: Vec<PathBuf>,
    /// The cases the shards ran (files, directories or globs, as `run`
    /// takes them; default: every case).
    #[arg(long = "case")]
    pub cases: Vec<String>,
    /// Only these model aliases (or files), as `run --model`.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// The reference of every selected case, as `run --reference`.
    #[arg(long)]
    pub reference: Option<String>,
    /// Write the merged outcomes (one JSON array, as `run --json`).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write the ladder report to DIR.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The Hugging Face Hub id of the model the files quantize
    /// (`ORG/NAME`): the report's model card names it as `base_model`.
    #[arg(long, value_name = "ORG/NAME")]
    pub base_model: Option<String>,
    /// Accept a selection of no case × model (otherwise an error).
    #[arg(long)]
    pub allow_empty: bool,
    /// Replace a report that --report holds already.
    #[arg(long)]
    pub force: bool,
}

/// The flags of `quantgate tokenize`.
#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// The text file.
    pub file: PathBuf,
    /// Model whose tokenizer to use.
    #[arg(long)]
    pub model: String,
    /// BOS policy: model, always, never.
    #[arg(long, default_value = "never")]
    pub bos: String,
    /// At most this many ids.
    #[arg(long)]
    pub limit: Option<usize>,
}

/// A whole number of at least 1 (`--jobs`): 0 would run nothing, or
/// mean something other than what was typed (`--threads 0` is refused
/// where the threads are chosen).
fn at_least_one<T: std::str::FromStr + PartialOrd + From<u8>>(v: &str) -> Result<T, String> {
    match v.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        Ok(_) => Err(format!("`{v}` is less than 1; give at least 1")),
        Err(_) => Err(format!("`{v}` is not a whole number")),
    }
}

#[derive(clap::Args)]
pub struct DiffArgs {
    /// The old side: a git revision (default: the merge-base of HEAD with
    /// origin/main), a folder of goldens, or a `--json` file of `quantgate run`.
    pub base: Option<String>,
    /// The new side, of the same sort as BASE (default, after a revision:
    /// the working tree).
    pub head: Option<String>,
    /// `text`, `markdown` (a pull request comment: the summary, what moved
    /// or flipped, the rest folded) or `json` (every change).
    #[arg(long, default_value = "text", value_parser = ["text", "markdown", "json"])]
    pub format: String,
    /// When to exit 1: `moved` (a gate flipped or a metric moved beyond
    /// noise) or `flipped` (a gate flipped).
    #[arg(long, default_value = "moved", value_parser = ["moved", "flipped"])]
    pub fail_on: String,
    /// The goldens folder, in the repository (default: `goldens` beside
    /// the suites folder).
    #[arg(long)]
    pub goldens: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct DriftArgs {
    /// Runtime A (the baseline), then runtime B: `linked` or a name of
    /// `<suites>/runtimes.toml`.
    #[arg(long = "runtime", required = true)]
    pub runtimes: Vec<String>,
    /// The models: aliases, or GGUF files (paths or globs, pinned in
    /// `<suites>/models.lock`).
    #[arg(long = "model", required = true)]
    pub models: Vec<String>,
    /// The text (default: WikiText-2 test, shipped with quantgate).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Window length (llama-perplexity's `-c`).
    #[arg(long, default_value_t = 512)]
    pub n_ctx: u32,
    /// Windows (llama-perplexity's `--chunks`).
    #[arg(long, default_value_t = 16)]
    pub chunks: usize,
    /// Threads of every run (the floor runs each runtime again with 1, or
    /// 2 when this is 1).
    #[arg(long)]
    pub threads: Option<u32>,
    /// Also write every figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct RuntimesArgs {
    /// The runtimes to verify (default: every one).
    pub names: Vec<String>,
}
