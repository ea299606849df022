//! One `Config`: everything a run takes from outside the case files — the
//! folders (suites, goldens, cache, per-trial output), the engine options,
//! the golden update mode, the result cache, crash isolation, a shipped
//! reference folder, the signing key — read once at the edge (the CLI, the
//! `cargo test` harness, a worker process) from flags and the environment.
//!
//! Contract: this module is the only reader of quantgate's environment
//! variables (besides a worker's own protocol); every bad value is an
//! input error naming the variable (or the flag), never a panic, checked
//! before anything runs. The edge installs the config ([`Config::install`]);
//! library code reads [`Config::current`].
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
//! | `CI`, `NEXTEST` | unset | set by CI and by nextest |

use crate::core::auth::{Key, KEY_ENV, KEY_FILE_ENV};
use crate::core::error::{Error, Result};
use crate::core::settings::EngineOptions;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Set by a parent whose stderr is a terminal, for its worker processes.
pub const TERMINAL_ENV: &str = "QUANTGATE_PROGRESS_TERMINAL";

impl EngineOptions {
    /// This process's options: its config's ([`Config`]).
    pub fn current() -> &'static EngineOptions {
        &Config::current().engine
    }
}

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
pub const REFERENCE_DIR_ENV: &str = "QUANTGATE_REFERENCE_DIR";

/// The environment variable saying what a missing shipped product does.
pub const REFERENCE_MISSING_ENV: &str = "QUANTGATE_REFERENCE_MISSING";

/// Everything a run takes from outside the case files.
#[derive(Debug, Clone)]
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
    /// The parent process that passes this one's stderr on draws on a
    /// terminal (progress bars are drawn for it).
    pub parent_terminal: bool,
    /// Running under CI: goldens are never written.
    pub ci: bool,
    /// Running under nextest (a process per test: no workers).
    pub nextest: bool,
}

static CURRENT: OnceLock<Config> = OnceLock::new();

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
        if cache.exists() && !cache.is_dir() {
            return Err(Error::input(format!(
                "{cache_from}{}: exists and is not a directory",
                cache.display()
            )));
        }
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
        let config_home = get("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| home.map(|h| h.join(".config")))
            .map(|b| b.join("quantgate"));
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
            parent_terminal: get(TERMINAL_ENV).is_some(),
            ci,
            nextest: get("NEXTEST").is_some(),
        })
    }

    /// The defaults, with nothing from the environment but `HOME` (where the
    /// cache folder is) and `CARGO_MANIFEST_DIR` (the crate): what the
    /// harness plans under to name every test that a bad value then fails.
    pub fn bare() -> Result<Config> {
        Config::from_lookup(
            &|k| env_var(k).filter(|_| k == "HOME" || k == "CARGO_MANIFEST_DIR"),
            [None; 3],
        )
    }

    /// Fix this process's config, before anything runs; an error when
    /// another was fixed already.
    pub fn install(self) -> Result<&'static Config> {
        let now = CURRENT.get_or_init(|| self.clone());
        if now.cache != self.cache
            || now.out != self.out
            || now.update != self.update
            || now.engine != self.engine
        {
            return Err(Error::input(format!(
                "the configuration is fixed already ({now:?})"
            )));
        }
        Ok(now)
    }

    /// This process's config: the one installed, else the environment's,
    /// or the error that names its first bad variable (never a panic:
    /// what the public library calls that read the environment use).
    pub fn try_current() -> Result<&'static Config> {
        if let Some(c) = CURRENT.get() {
            return Ok(c);
        }
        let c = Config::from_env([None, None, None])?;
        Ok(CURRENT.get_or_init(|| c))
    }

    /// This process's config: the one installed, else the environment's.
    /// The CLI, the harness and workers install a checked one before
    /// anything runs; a library caller that did not, under a bad value,
    /// stops here with the value's variable named.
    pub fn current() -> &'static Config {
        CURRENT.get_or_init(|| {
            Config::from_env([None, None, None])
                .unwrap_or_else(|e| panic!("quantgate configuration: {}", e.message))
        })
    }
}

/// The crate under test ([`Config::root`]) as `var` gives it:
/// `CARGO_MANIFEST_DIR`, else the working directory.
fn crate_root(var: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    var("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_default())
}

/// [`Config::root`] of this process, read alone (no other variable).
pub fn project_root() -> PathBuf {
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
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Config> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(
            &move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            [None, None, None],
        )
    }

    /// Defaults from an empty environment; each variable read where it
    /// belongs; an empty value is unset.
    #[test]
    fn defaults_and_each_variable() {
        let c = with(&[("HOME", "/h")]).unwrap();
        assert_eq!(c.cache, PathBuf::from("/h/.cache/quantgate"));
        assert_eq!(c.config_home, Some(PathBuf::from("/h/.config/quantgate")));
        assert_eq!(
            (c.update, c.result_cache, c.isolation),
            (UpdateMode::New, true, Isolation::Group)
        );
        assert!(c.out.is_none() && c.reference.is_none() && c.signing_key.is_none());
        let crate_root = with(&[("CARGO_MANIFEST_DIR", "/crate")]).unwrap();
        assert_eq!(crate_root.suites, PathBuf::from("/crate/suites"));
        assert_eq!(crate_root.goldens, PathBuf::from("/crate/goldens"));
        let here = env!("CARGO_MANIFEST_DIR");
        let moved = with(&[
            ("CARGO_MANIFEST_DIR", here),
            ("QUANTGATE_SUITES", "src"),
            ("QUANTGATE_GOLDENS", "tests/snapshots"),
        ])
        .unwrap();
        assert_eq!(moved.suites, PathBuf::from(here).join("src"));
        assert_eq!(moved.goldens, PathBuf::from(here).join("tests/snapshots"));
        let c = with(&[
            ("QUANTGATE_CACHE", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("QUANTGATE_OUT", "/o"),
            ("QUANTGATE_ISOLATION", "off"),
            ("QUANTGATE_UPDATE", ""),
            ("CI", "1"),
        ])
        .unwrap();
        assert_eq!(c.cache, PathBuf::from("/c"));
        assert_eq!(c.out, Some(PathBuf::from("/o")));
        // Rows are never kept in the result cache.
        assert!(!c.result_cache);
        assert_eq!((c.isolation, c.update), (Isolation::Off, UpdateMode::No));
        assert_eq!(
            with(&[("XDG_CACHE_HOME", "/x")]).unwrap().cache,
            PathBuf::from("/x/quantgate")
        );
    }

    /// A signing key file that its group or others can read, or that is a
    /// symlink, is refused naming the variable and the mode; a private one
    /// is the key.
    #[cfg(unix)]
    #[test]
    fn a_key_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("key");
        std::fs::write(&f, "0123456789abcdef0123456789abcdef\n").unwrap();
        let path = f.to_str().unwrap().to_string();
        for mode in [0o644, 0o640, 0o660, 0o606] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = with(&[("QUANTGATE_SIGNING_KEY_FILE", &path)]).unwrap_err();
            assert_eq!(e.kind, crate::core::ErrorKind::Input);
            assert!(
                e.message.contains("QUANTGATE_SIGNING_KEY_FILE")
                    && e.message.contains(&format!("mode {mode:04o}")),
                "{}",
                e.message
            );
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = with(&[("QUANTGATE_SIGNING_KEY_FILE", &path)]).unwrap();
        assert!(c.signing_key.is_some());
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = with(&[("QUANTGATE_SIGNING_KEY_FILE", link.to_str().unwrap())]).unwrap_err();
        assert!(e.message.contains("symlink"), "{}", e.message);
    }

    /// Every bad value is an input error naming its variable.
    #[test]
    fn a_bad_value_names_its_variable() {
        for (k, v) in [
            ("QUANTGATE_ISOLATION", "pod"),
            ("QUANTGATE_RESULT_CACHE", "maybe"),
            ("QUANTGATE_UPDATE", "sometimes"),
            ("QUANTGATE_REFERENCE_MISSING", "later"),
            ("QUANTGATE_REFERENCE_DIR", "/no/such/folder"),
            ("QUANTGATE_SIGNING_KEY_FILE", "/no/such/key"),
            ("QUANTGATE_SIGNING_KEY", "short"),
            ("QUANTGATE_FLASH_ATTN", "sometimes"),
            ("QUANTGATE_KV_TYPE", "f12"),
            ("QUANTGATE_N_GPU_LAYERS", "many"),
            ("QUANTGATE_CACHE", "/dev/null"),
            ("QUANTGATE_SUITES", "/no/such/folder"),
            ("QUANTGATE_GOLDENS", "/dev/null"),
        ] {
            let e = with(&[(k, v)]).unwrap_err();
            assert_eq!(e.kind, crate::core::ErrorKind::Input, "{k}");
            assert!(e.message.contains(k), "{k}={v}: {}", e.message);
        }
        let e = with(&[("QUANTGATE_UPDATE", "always"), ("CI", "true")]).unwrap_err();
        assert!(e.message.contains("CI is set"), "{}", e.message);
    }
}
