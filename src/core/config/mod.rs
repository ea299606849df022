//! One `Config`: everything a run takes from outside the case files — the
//! folders (suites, goldens, cache, per-trial output), the engine options,
//! the golden update mode, the result cache, crash isolation, a shipped
//! reference folder, the signing key — read once at the edge (the CLI, the
//! `cargo test` harness, a worker process) from flags and the environment.
//!
//! Contract: this module is the only reader of quantgate's environment
//! variables (besides a worker's own protocol); every bad value is an
//! input error naming the variable (or the flag), never a panic, checked
//! before anything runs. The edge (the CLI, the harness, a worker,
//! [`crate::run_gate`]) builds one and passes it down as `&Config`; no
//! library code reads the environment or a process-wide config.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CARGO_MANIFEST_DIR` | the working directory | the crate root (cargo and nextest set it for tests) |
//! | `QUANTGATE_SUITES` | `<root>/suites` | the cases `gate!()` runs (relative to the root) |
//! | `QUANTGATE_GOLDENS` | `<root>/goldens` | their goldens (relative to the root) |
//! | `QUANTGATE_CACHE` | `$XDG_CACHE_HOME/quantgate`, `~/.cache/quantgate` | models, results, references, locks |
//! | `QUANTGATE_OUT` | none | per-trial Parquet rows and outcomes (a shard's) |
//! | `QUANTGATE_UPDATE` (or `INSTA_UPDATE`) | `auto` | goldens: `auto`, `new`, `always`, `no` |
//! | `QUANTGATE_RESULT_CACHE` | `on` | `off`: every trial runs |
//! | `QUANTGATE_ISOLATION` | `group` | `off`, `model`, `group`, `test` |
//! | `QUANTGATE_REFERENCE_DIR` | none | a shipped reference folder (read only) |
//! | `QUANTGATE_REFERENCE_MISSING` | `error` | `compute`: build what the folder lacks |
//! | `QUANTGATE_SIGNING_KEY` / `_FILE` | none | the key sealed decisions are signed with |
//! | `QUANTGATE_N_GPU_LAYERS`, `_KV_TYPE`, `_FLASH_ATTN` | build default, `f16`, `off` | engine options |
//! | `QUANTGATE_PYTHON` | `python3` | the Python that fetches fixture models |
//! | `QUANTGATE_LLAMA_LOG` | unset | keep llama.cpp's own log |
//! | `QUANTGATE_CONTEXT_POOL_MIB` | `1024` | idle llama.cpp contexts kept across calls, at most (MiB; 0: none) |
//! | `CI`, `NEXTEST` | unset | set by CI and by nextest |

use crate::core::auth::{Key, KEY_ENV, KEY_FILE_ENV};
use crate::core::error::{Error, Result};
use crate::core::settings::EngineOptions;
use std::path::PathBuf;

pub(crate) use crate::core::progress::TERMINAL_ENV;

/// The variable of [`Config::context_pool`].
pub(crate) const CONTEXT_POOL_ENV: &str = "QUANTGATE_CONTEXT_POOL_MIB";

/// [`Config::context_pool`] by default: 1 GiB.
pub(crate) const DEFAULT_CONTEXT_POOL: u64 = 1 << 30;

/// What to do with a changed or missing golden (insta's modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateMode {
    /// Write `.snap.new` beside the golden and fail.
    New,
    /// Overwrite the golden and pass (gates still fail).
    Always,
    /// Write nothing and fail.
    No,
}

/// How trials are spread over worker processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Everything in this process.
    Off,
    /// One worker per model, running that model's groups in turn.
    Model,
    /// One worker per group of tests that share a decode (idle workers of
    /// a model are reused).
    Group,
    /// One worker per test, nothing shared.
    Test,
}

/// A reference folder built elsewhere (`quantgate reference build`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipped {
    /// The folder (read only).
    pub dir: PathBuf,
    /// What to do about a product it lacks.
    pub missing: Missing,
}

/// What a store with a shipped folder does about a product the folder lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// An error naming the product and the case (the default).
    Error,
    /// Compute it here (loading the reference model), into the local cache.
    Compute,
}

/// The environment variable naming a shipped reference folder.
pub(crate) const REFERENCE_DIR_ENV: &str = "QUANTGATE_REFERENCE_DIR";

/// The environment variable saying what a missing shipped product does.
pub(crate) const REFERENCE_MISSING_ENV: &str = "QUANTGATE_REFERENCE_MISSING";

/// Everything a run takes from outside the case files. Built at the edge
/// ([`Config::load`], [`Config::for_command_line`], [`Config::builder`])
/// and passed down.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The crate under test (`CARGO_MANIFEST_DIR` at run time, as cargo and
    /// nextest set it for test binaries; else the working directory). Never
    /// a path compiled into a binary: two checkouts sharing one target
    /// folder each test their own files.
    pub root: PathBuf,
    /// The cases [`crate::gate!`] runs (`QUANTGATE_SUITES`, relative to
    /// `root`; default `<root>/suites`). Preregistered rules are named
    /// from the case files, relative to `root`.
    pub suites: PathBuf,
    /// Their goldens (`QUANTGATE_GOLDENS`, relative to `root`; default
    /// `<root>/goldens`).
    pub goldens: PathBuf,
    /// The cache folder: models, results, references, locks.
    pub cache: PathBuf,
    /// The variable the cache folder came from, for messages.
    pub cache_from: &'static str,
    /// Where each trial's Parquet rows and outcome go (a shard's output).
    pub out: Option<PathBuf>,
    /// Engine options.
    pub engine: EngineOptions,
    /// Golden update mode.
    pub update: UpdateMode,
    /// Whether completed trials are read from and written to the result
    /// cache (never with `out`: rows are not kept there).
    pub result_cache: bool,
    /// How groups are spread over worker processes.
    pub isolation: Isolation,
    /// A shipped reference folder.
    pub reference: Option<Shipped>,
    /// The signing key of sealed decisions and shared caches.
    pub signing_key: Option<Key>,
    /// Where this user's own keys live (`$XDG_CONFIG_HOME/quantgate`, else
    /// `~/.config/quantgate`).
    pub config_home: Option<PathBuf>,
    /// The Python that fetches fixture models.
    pub python: String,
    /// Keep llama.cpp's own log.
    pub llama_log: bool,
    /// The most bytes of idle llama.cpp contexts kept across decode calls
    /// (`QUANTGATE_CONTEXT_POOL_MIB`; default [`DEFAULT_CONTEXT_POOL`]).
    pub context_pool: u64,
    /// The parent process that passes this one's stderr on draws on a
    /// terminal (progress bars are drawn for it).
    pub parent_terminal: bool,
    /// The parent draws a board of every bar (`QUANTGATE_PROGRESS_TERMINAL=board`):
    /// this worker sends its bars there instead of drawing them.
    pub progress_board: bool,
    /// Running under CI: goldens are never written.
    pub ci: bool,
    /// Running under nextest (a process per test: no workers).
    pub nextest: bool,
}

impl Config {
    /// The config of this process's environment (every value checked; an
    /// input error naming the first bad variable).
    pub fn load() -> Result<Config> {
        Config::from_env([None, None, None])
    }

    /// The config of this process's environment, with the engine options
    /// the command line gives (`--n-gpu-layers`, `--kv-type`,
    /// `--flash-attn`; None: not given) over their variables.
    pub fn from_env(engine_flags: [Option<&str>; 3]) -> Result<Config> {
        Config::from_lookup(&env_var, engine_flags)
    }

    /// The command line's config: [`Config::from_env`] with the working
    /// directory as its root (a `CARGO_MANIFEST_DIR` it inherits from
    /// `cargo test` or `cargo run` names some crate, not where the user
    /// stands), and `suites`/`goldens` as given (`QUANTGATE_SUITES`,
    /// `QUANTGATE_GOLDENS`) or, unset, `suites` and `goldens` relative to
    /// it, as messages show them. A `--suites` flag overrides `suites`.
    pub fn for_command_line(engine_flags: [Option<&str>; 3]) -> Result<Config> {
        let var = |k: &str| match k {
            "CARGO_MANIFEST_DIR" => None,
            k => env_var(k),
        };
        let mut c = Config::from_lookup(&var, engine_flags)?;
        let unset = |k: &str| var(k).is_none_or(|v| v.is_empty());
        if unset("QUANTGATE_SUITES") {
            c.suites = PathBuf::from("suites");
        }
        if unset("QUANTGATE_GOLDENS") {
            c.goldens = PathBuf::from("goldens");
        }
        Ok(c)
    }

    /// The config `var` gives (a variable's value, None when unset; an
    /// empty value counts as unset): every value checked, an error naming
    /// the first bad one.
    pub fn from_lookup(
        var: &dyn Fn(&str) -> Option<String>,
        engine_flags: [Option<&str>; 3],
    ) -> Result<Config> {
        let get = |k: &str| var(k).filter(|v| !v.is_empty());
        let flag = |k: &str| get(k).is_some_and(|v| v != "false" && v != "0");
        let bad =
            |k: &str, v: &str, want: &str| Error::input(format!("{k}=`{v}` is not one of {want}"));
        let home = get("HOME").map(PathBuf::from);
        let root = crate_root(&get);
        let folder = |k: &str, default: &str| -> Result<PathBuf> {
            match get(k) {
                None => Ok(root.join(default)),
                Some(d) => {
                    let dir = root.join(d);
                    match dir.is_dir() {
                        true => Ok(dir),
                        false => Err(Error::input(format!(
                            "{k}={}: not a folder ({})",
                            dir.display(),
                            if dir.exists() {
                                "a file"
                            } else {
                                "no such path"
                            }
                        ))),
                    }
                }
            }
        };
        let suites = folder("QUANTGATE_SUITES", "suites")?;
        let goldens = folder("QUANTGATE_GOLDENS", "goldens")?;
        let (cache, cache_from) = match (get("QUANTGATE_CACHE"), get("XDG_CACHE_HOME")) {
            (Some(d), _) => (PathBuf::from(d), "QUANTGATE_CACHE="),
            (None, Some(d)) => (PathBuf::from(d).join("quantgate"), "the cache folder "),
            (None, None) => (
                home.clone()
                    .unwrap_or_else(|| PathBuf::from("."))
                    .join(".cache")
                    .join("quantgate"),
                "the cache folder ",
            ),
        };
        usable_cache(&cache, cache_from)?;
        let out = get("QUANTGATE_OUT").map(PathBuf::from);
        let ci = flag("CI");
        let update = update_mode_from(
            get("QUANTGATE_UPDATE").as_deref(),
            get("INSTA_UPDATE").as_deref(),
            ci,
        )?;
        let result_cache = match get("QUANTGATE_RESULT_CACHE").as_deref() {
            None | Some("on") => true,
            Some("off") => false,
            Some(v) => return Err(bad("QUANTGATE_RESULT_CACHE", v, "on, off")),
        };
        let context_pool = match get(CONTEXT_POOL_ENV) {
            None => DEFAULT_CONTEXT_POOL,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(mib) if mib <= 1 << 20 => mib << 20,
                _ => {
                    return Err(Error::input(format!(
                        "{CONTEXT_POOL_ENV}=`{v}` is not a whole number of MiB from 0 to 1048576"
                    )))
                }
            },
        };
        let isolation = match get("QUANTGATE_ISOLATION").as_deref() {
            None | Some("group") => Isolation::Group,
            Some("off") => Isolation::Off,
            Some("model") => Isolation::Model,
            Some("test") => Isolation::Test,
            Some(v) => {
                return Err(Error::input(format!(
                    "QUANTGATE_ISOLATION: `{v}` is not one of off, model, group, test"
                )))
            }
        };
        let missing = match get(REFERENCE_MISSING_ENV).as_deref() {
            None | Some("error") => Missing::Error,
            Some("compute") => Missing::Compute,
            Some(other) => {
                return Err(Error::input(format!(
                    "{REFERENCE_MISSING_ENV}=`{other}`: expected `error` or `compute`"
                )))
            }
        };
        let reference = match get(REFERENCE_DIR_ENV) {
            None => None,
            Some(d) => {
                let dir = PathBuf::from(d);
                if !dir.is_dir() {
                    return Err(Error::input(format!(
                        "{REFERENCE_DIR_ENV}={}: not a folder (build one with `quantgate reference build CASE --out DIR`)",
                        dir.display()
                    )));
                }
                Some(Shipped { dir, missing })
            }
        };
        let signing_key = match (get(KEY_ENV), get(KEY_FILE_ENV)) {
            (Some(_), Some(_)) => {
                return Err(Error::input(format!(
                    "{KEY_ENV} and {KEY_FILE_ENV} are both set; set one"
                )))
            }
            (Some(t), None) => Some(Key::new(t.trim().as_bytes().to_vec(), KEY_ENV)?),
            (None, Some(f)) => {
                let f = PathBuf::from(f);
                crate::core::auth::private_key_file(&f).map_err(|why| {
                    Error::input(format!("{KEY_FILE_ENV}={}: {why}", f.display()))
                })?;
                let bytes = std::fs::read(&f)
                    .map_err(|e| Error::input(format!("{KEY_FILE_ENV}={}: {e}", f.display())))?;
                let trimmed = String::from_utf8_lossy(&bytes).trim().as_bytes().to_vec();
                Some(Key::new(
                    trimmed,
                    &format!("{KEY_FILE_ENV}={}", f.display()),
                )?)
            }
            (None, None) => None,
        };
        let config_home = config_home_from(&get);
        let engine = EngineOptions::from_flags_or(engine_flags, &get)?;
        Ok(Config {
            root,
            suites,
            goldens,
            cache,
            cache_from,
            result_cache: result_cache && out.is_none(),
            out,
            engine,
            update,
            isolation,
            reference,
            signing_key,
            config_home,
            python: get("QUANTGATE_PYTHON").unwrap_or_else(|| "python3".into()),
            llama_log: get("QUANTGATE_LLAMA_LOG").is_some(),
            context_pool,
            parent_terminal: get(TERMINAL_ENV).is_some(),
            progress_board: get(TERMINAL_ENV).as_deref() == Some("board"),
            ci,
            nextest: get("NEXTEST").is_some(),
        })
    }

    /// The defaults, with nothing from the environment but `HOME` (where the
    /// cache folder is) and `CARGO_MANIFEST_DIR` (the crate): what the
    /// harness plans under to name every test that a bad value then fails.
    pub(crate) fn bare() -> Result<Config> {
        Config::from_lookup(
            &|k| env_var(k).filter(|_| k == "HOME" || k == "CARGO_MANIFEST_DIR"),
            [None; 3],
        )
    }

    /// A builder starting from this process's environment
    /// ([`Config::load`]): what a program embedding quantgate sets in code.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            config: Config::load(),
        }
    }

    /// The variables that give a worker process this config (besides its
    /// folders, which its selection names, and the signing key, which it
    /// inherits): set on every worker, so that a config built in code
    /// ([`Config::builder`]) holds in workers too.
    pub(crate) fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("QUANTGATE_CACHE", self.cache.display().to_string()),
            (
                "QUANTGATE_UPDATE",
                match self.update {
                    UpdateMode::New => "new",
                    UpdateMode::Always => "always",
                    UpdateMode::No => "no",
                }
                .to_string(),
            ),
            (
                "QUANTGATE_RESULT_CACHE",
                if self.result_cache { "on" } else { "off" }.to_string(),
            ),
            (
                "QUANTGATE_ISOLATION",
                match self.isolation {
                    Isolation::Off => "off",
                    Isolation::Model => "model",
                    Isolation::Group => "group",
                    Isolation::Test => "test",
                }
                .to_string(),
            ),
            ("QUANTGATE_PYTHON", self.python.clone()),
            (
                "QUANTGATE_LLAMA_LOG",
                if self.llama_log { "1" } else { "" }.to_string(),
            ),
            (CONTEXT_POOL_ENV, (self.context_pool >> 20).to_string()),
            (
                "QUANTGATE_OUT",
                self.out
                    .as_ref()
                    .map_or(String::new(), |o| o.display().to_string()),
            ),
        ];
        v.extend(self.engine.to_env());
        if let Some(r) = &self.reference {
            v.push((REFERENCE_DIR_ENV, r.dir.display().to_string()));
            v.push((
                REFERENCE_MISSING_ENV,
                match r.missing {
                    Missing::Error => "error",
                    Missing::Compute => "compute",
                }
                .to_string(),
            ));
        }
        v
    }

    /// The signing key of sealed decisions, shipped products and signed
    /// outcomes (`QUANTGATE_SIGNING_KEY`, `_FILE`): None when neither is set.
    pub fn signing_key(&self) -> Option<&Key> {
        self.signing_key.as_ref()
    }
}

/// [`Config::builder`]: the environment's config with values set in code
/// over it; [`ConfigBuilder::build`] gives the first error of the
/// environment, if any.
#[derive(Debug)]
pub struct ConfigBuilder {
    config: Result<Config>,
}

impl ConfigBuilder {
    fn set(mut self, f: impl FnOnce(&mut Config)) -> Self {
        if let Ok(c) = &mut self.config {
            f(c);
        }
        self
    }

    /// The crate root (suites, goldens and preregistered rules are named
    /// relative to it).
    pub fn root(self, dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        self.set(|c| c.root = dir)
    }

    /// The cases folder.
    pub fn suites(self, dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        self.set(|c| c.suites = dir)
    }

    /// The goldens folder.
    pub fn goldens(self, dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        self.set(|c| c.goldens = dir)
    }

    /// The cache folder (models, results, references, locks).
    pub fn cache(self, dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        self.set(|c| {
            c.cache = dir;
            c.cache_from = "the cache folder ";
        })
    }

    /// The engine options.
    pub fn engine(self, options: EngineOptions) -> Self {
        self.set(|c| c.engine = options)
    }

    /// The golden update mode.
    pub fn update(self, mode: UpdateMode) -> Self {
        self.set(|c| c.update = mode)
    }

    /// Whether the result cache is used.
    pub fn result_cache(self, on: bool) -> Self {
        self.set(|c| c.result_cache = on && c.out.is_none())
    }

    /// How groups are spread over worker processes.
    pub fn isolation(self, isolation: Isolation) -> Self {
        self.set(|c| c.isolation = isolation)
    }

    /// The config, or the environment's first bad value; an update mode
    /// that writes goldens under CI is refused here too.
    pub fn build(self) -> Result<Config> {
        let c = self.config?;
        if c.ci && c.update != UpdateMode::No {
            return Err(Error::input(
                "an update mode that writes goldens was set, but CI is set: goldens are never \
                 written under CI"
                    .to_string(),
            ));
        }
        usable_cache(&c.cache, c.cache_from)?;
        Ok(c)
    }
}

/// The crate under test ([`Config::root`]) as `var` gives it:
/// `CARGO_MANIFEST_DIR`, else the working directory.
fn crate_root(var: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    var("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_default())
}

/// The cache folder `cache` (named by `from` in messages) can be one: it
/// is a folder, or nothing is there yet.
fn usable_cache(cache: &std::path::Path, from: &str) -> Result<()> {
    if cache.exists() && !cache.is_dir() {
        return Err(Error::input(format!(
            "{from}{}: exists and is not a directory",
            cache.display()
        )));
    }
    Ok(())
}

/// This user's quantgate folder as `var` gives it:
/// `$XDG_CONFIG_HOME/quantgate`, else `~/.config/quantgate`.
fn config_home_from(var: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    var("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|b| b.join("quantgate"))
}

/// [`Config::config_home`] of this process, read alone: where this user's
/// own key lives, which tags quantgate's temp files in every process.
pub(crate) fn user_config_home() -> Option<PathBuf> {
    config_home_from(&|k| env_var(k).filter(|v| !v.is_empty()))
}

/// [`Config::root`] of this process, read alone (no other variable).
pub(crate) fn project_root() -> PathBuf {
    crate_root(&|k| env_var(k).filter(|v| !v.is_empty()))
}

/// A variable of this process's environment (lossy UTF-8).
fn env_var(k: &str) -> Option<String> {
    std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
}

/// The update mode from `QUANTGATE_UPDATE` (else `INSTA_UPDATE`), given
/// whether `CI` is set: `auto` (the default) is `new` locally and `no` under
/// CI; asking to write under CI is an error.
pub fn update_mode_from(
    quantgate: Option<&str>,
    insta: Option<&str>,
    ci: bool,
) -> Result<UpdateMode> {
    let (var, value) = match (quantgate, insta) {
        (Some(v), _) => ("QUANTGATE_UPDATE", v),
        (None, Some(v)) => ("INSTA_UPDATE", v),
        (None, None) => ("QUANTGATE_UPDATE", "auto"),
    };
    let mode = match value {
        "auto" | "" => return Ok(if ci { UpdateMode::No } else { UpdateMode::New }),
        "new" | "unseen" => UpdateMode::New,
        "always" | "force" => UpdateMode::Always,
        "no" => UpdateMode::No,
        other => {
            return Err(Error::input(format!(
                "{var}=`{other}` is not one of \"auto\", \"new\", \"always\", \"no\""
            )))
        }
    };
    if ci && mode != UpdateMode::No {
        return Err(Error::input(format!(
            "{var}={value} asks to update goldens, but CI is set: goldens are never written under CI; \
             update them locally and commit the reviewed files"
        )));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests;
