//! Runtimes: the llama.cpp quantgate links (`linked`), and external
//! llama-perplexity-compatible binaries (another llama.cpp version, a fork,
//! a build with other flags) named in `<suites>/runtimes.toml`, each pinned
//! by its sha256 or made by a build recipe, so that "did this build change
//! my model's numbers" is a case and a command.
//!
//! An external runtime is driven through its own `--kl-divergence-base`
//! files: given a model, the case's text and llama-perplexity's windows, it
//! writes every scored position's log-probs ([`basefile`]); the linked
//! runtime writes the same file from its own logits, encoded exactly as the
//! tool encodes them. Two runtimes are then compared row by row on the
//! same encoding ([`crate::measure::drift`]).
//!
//! Contract: an external binary is used only after its sha256 equals its
//! pin (the one in `runtimes.toml`, or, for a binary a build recipe made,
//! the one its build recorded) and its `--help` names
//! `--kl-divergence-base`; otherwise an input error names the runtime, its
//! path and both hashes. Its `--version` is recorded with every result.
//! A base file is believed only after [`basefile::Reader`] checked it.

pub mod basefile;

use crate::core::error::{Error, Result};
use crate::core::parse::parse_toml;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The name of the llama.cpp quantgate links.
pub const LINKED: &str = "linked";

/// An entry of `runtimes.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    #[serde(default)]
    description: String,
    /// A binary, relative to the file (or absolute).
    path: Option<String>,
    /// Its sha256 (with `path`).
    sha256: Option<String>,
    /// A command that builds the binary and prints its path (relative to
    /// the file), instead of `path`.
    build: Option<Vec<String>>,
    /// The build command's environment.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// More arguments for every run (`-ngl 99` for a GPU build).
    #[serde(default)]
    args: Vec<String>,
}

/// Where a declared runtime's binary comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A binary pinned by sha256.
    Path {
        /// The binary.
        path: PathBuf,
        /// Its pinned sha256.
        sha256: String,
    },
    /// A build recipe: a command (run in the file's folder) that builds
    /// the binary, once, and prints its path.
    Build {
        /// The command and its arguments.
        command: Vec<String>,
        /// Its environment.
        env: BTreeMap<String, String>,
        /// Where it runs.
        dir: PathBuf,
    },
}

/// A runtime as `runtimes.toml` declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Declared {
    /// Its name.
    pub name: String,
    /// What it is, for a reader.
    pub description: String,
    /// Its binary.
    pub source: Source,
    /// More arguments for every run.
    pub args: Vec<String>,
    /// `runtimes.toml: [name]`, for messages.
    pub at: String,
}

/// The runtimes a suites folder declares (`runtimes.toml`; none when the
/// file is absent): `linked` is always there besides them.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    /// The file.
    pub file: PathBuf,
    /// By name.
    pub entries: BTreeMap<String, Declared>,
}

impl Registry {
    /// `<suites>/runtimes.toml`, every entry checked: a name of letters,
    /// digits, `-`, `_`, `.` (not `linked`), exactly one of `path` (with a
    /// 64-hex `sha256`) and `build`. Every problem is reported, each naming
    /// the file and the entry.
    pub fn load(suites: &Path) -> Result<Registry> {
        let file = suites.join("runtimes.toml");
        let mut reg = Registry {
            file: file.clone(),
            entries: BTreeMap::new(),
        };
        if !file.is_file() {
            return Ok(reg);
        }
        let src = std::fs::read_to_string(&file)
            .map_err(|e| Error::input(format!("{}: {e}", file.display())))?;
        let raw: BTreeMap<String, Entry> = parse_toml(&file, &src)?;
        // Absolute: a build command runs in this folder, and a relative
        // program path would be read from the folder it runs in.
        let dir = std::path::absolute(file.parent().unwrap_or(Path::new(".")))
            .map_err(|e| Error::input(format!("{}: {e}", file.display())))?;
        let mut errors = Vec::new();
        for (name, e) in raw {
            let at = format!("{}: [{name}]", file.display());
            let ok_name = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !ok_name || name == LINKED {
                errors.push(Error::input(format!(
                    "{at}: a runtime's name is letters, digits, `-`, `_` and `.`, and not `{LINKED}` \
                     (the llama.cpp quantgate links)"
                )));
                continue;
            }
            let source = match (&e.path, &e.sha256, &e.build) {
                (Some(p), Some(sha), None) => {
                    if !crate::core::fsutil::is_hex(sha, 64) {
                        errors.push(Error::input(format!(
                            "{at}.sha256: `{sha}` is not a sha256 (64 lower-case hex digits)"
                        )));
                        continue;
                    }
                    Source::Path {
                        path: dir.join(p),
                        sha256: sha.clone(),
                    }
                }
                (Some(_), None, None) => {
                    errors.push(Error::input(format!(
                        "{at}: `path` needs its `sha256` (sha256sum of the binary): a runtime is \
                         used only as pinned"
                    )));
                    continue;
                }
                (None, None, Some(cmd)) if !cmd.is_empty() => Source::Build {
                    command: cmd.clone(),
                    env: e.env.clone(),
                    dir: dir.clone(),
                },
                _ => {
                    errors.push(Error::input(format!(
                        "{at}: give `path` and `sha256` (a binary), or `build` (a command that \
                         builds it and prints its path)"
                    )));
                    continue;
                }
            };
            reg.entries.insert(
                name.clone(),
                Declared {
                    name,
                    description: e.description,
                    source,
                    args: e.args,
                    at,
                },
            );
        }
        if errors.is_empty() {
            Ok(reg)
        } else {
            Err(crate::core::error::join(errors))
        }
    }

    /// Runtime `name`: `linked`, or one declared here; an input error naming
    /// the file and the names there are otherwise.
    pub(crate) fn get(&self, name: &str) -> Result<Option<&Declared>> {
        if name == LINKED {
            return Ok(None);
        }
        self.entries.get(name).map(Some).ok_or_else(|| {
            let mut known = vec![LINKED.to_string()];
            known.extend(self.entries.keys().cloned());
            Error::input(format!(
                "runtime `{name}` is not declared in {} (runtimes: {})",
                self.file.display(),
                known.join(", ")
            ))
        })
    }
}

/// How the runtime whose `--help` is `help` takes flash attention off: by
/// its `--flash-attn` line (`-fa, --flash-attn [on|off|auto]` takes a value;
/// an older `-fa, --flash-attn` alone is a switch, off unless given). Other
/// options' `[on|off|auto]` (`--log-colors`) say nothing about it.
fn flash_attn_of(help: &str) -> FlashAttn {
    let takes_value = help
        .lines()
        .filter(|l| l.contains("--flash-attn"))
        .any(|l| l.contains("on|off"));
    if takes_value {
        FlashAttn::Value
    } else {
        FlashAttn::Switch
    }
}

/// How an external runtime takes flash attention off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashAttn {
    /// `-fa on|off|auto` (llama.cpp from mid-2025; `auto` is on for a CPU):
    /// pass `-fa off`.
    Value,
    /// `-fa` is a switch, off unless given: pass nothing.
    Switch,
}

/// An external runtime, verified and ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct External {
    /// Its name.
    pub name: String,
    /// The binary.
    pub path: PathBuf,
    /// Its sha256, as verified.
    pub sha256: String,
    /// What its `--version` says (one line).
    pub version: String,
    /// How it takes flash attention off.
    pub flash_attn: FlashAttn,
    /// More arguments for every run.
    pub args: Vec<String>,
}

impl External {
    /// `name sha256 (version)`: what a result records and its cache key holds.
    pub(crate) fn identity(&self) -> String {
        format!("{} sha256 {} ({})", self.name, self.sha256, self.version)
    }
}

/// `cmd` run with `args`: its exit status, stdout and stderr.
fn run(cmd: &Path, args: &[&str]) -> std::io::Result<(bool, String, String)> {
    let out = Command::new(cmd).args(args).output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

impl Declared {
    /// The binary, built first when a recipe makes it; its sha256 checked
    /// against the pin; its `--help` and `--version` read. Every refusal is
    /// an input error naming the runtime and the binary.
    pub(crate) fn resolve(&self) -> Result<External> {
        let (path, pinned) = match &self.source {
            Source::Path { path, sha256 } => (path.clone(), Some(sha256.clone())),
            Source::Build { command, env, dir } => (self.build(command, env, dir)?, None),
        };
        let at = &self.at;
        if !path.is_file() {
            return Err(Error::input(format!(
                "{at}: {}: no such file",
                path.display()
            )));
        }
        let (sha, _) =
            crate::core::fsutil::sha256_file(&path, |_| {}).map_err(|e| e.context(at.clone()))?;
        if let Some(pin) = pinned.filter(|p| *p != sha) {
            return Err(Error::input(format!(
                "{at}: {} has sha256 {sha}, the pin is {pin}: a runtime is used only as pinned \
                 (a new build? pin it again)",
                path.display()
            )));
        }
        let help = run(&path, &["--help"])
            .map_err(|e| Error::input(format!("{at}: {}: cannot run it: {e}", path.display())))?;
        let text = format!("{}{}", help.1, help.2);
        if !text.contains("--kl-divergence-base") {
            return Err(Error::input(format!(
                "{at}: {} is not llama-perplexity-compatible: its --help names no \
                 --kl-divergence-base (a runtime is a llama-perplexity binary of llama.cpp or a fork)",
                path.display()
            )));
        }
        let flash_attn = flash_attn_of(&text);
        let version = run(&path, &["--version"])
            .map(|(_, o, e)| {
                format!("{o}{e}")
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        Ok(External {
            name: self.name.clone(),
            path,
            sha256: sha,
            version: if version.is_empty() {
                "no --version".into()
            } else {
                version
            },
            flash_attn,
            args: self.args.clone(),
        })
    }

    /// Run the build recipe (idempotent: a built binary is reused by the
    /// recipe, which says on stderr when it builds); the path it printed
    /// last.
    fn build(
        &self,
        command: &[String],
        env: &BTreeMap<String, String>,
        dir: &Path,
    ) -> Result<PathBuf> {
        let at = &self.at;
        let program = if command[0].contains('/') {
            dir.join(&command[0])
        } else {
            PathBuf::from(&command[0])
        };
        let out = Command::new(&program)
            .args(&command[1..])
            .envs(env)
            .current_dir(dir)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| {
                Error::input(format!("{at}.build: cannot run {}: {e}", program.display()))
            })?;
        if !out.status.success() {
            return Err(Error::input(format!(
                "{at}.build: `{}` failed ({})",
                command.join(" "),
                out.status
            )));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().map(str::trim).rfind(|l| !l.is_empty());
        let p = last.ok_or_else(|| {
            Error::input(format!(
                "{at}.build: `{}` printed no path",
                command.join(" ")
            ))
        })?;
        Ok(dir.join(p))
    }
}

/// What a base file is of: a model, a text and llama-perplexity's windows.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    /// The model file (the first part of a split one).
    pub model: &'a Path,
    /// The text.
    pub text: &'a Path,
    /// Window length.
    pub n_ctx: u32,
    /// Windows.
    pub chunks: usize,
    /// Batch (= micro-batch).
    pub n_batch: u32,
    /// Threads.
    pub threads: u32,
}

impl External {
    /// Run the binary on `job`, writing its base file to `out`; a failure
    /// is an engine error with the last lines it printed.
    pub(crate) fn base_file(&self, job: &Job, out: &Path) -> Result<()> {
        let mut cmd = Command::new(&self.path);
        cmd.arg("-m")
            .arg(job.model)
            .arg("-f")
            .arg(job.text)
            .args(["-c", &job.n_ctx.to_string()])
            .args(["--chunks", &job.chunks.to_string()])
            .args(["-b", &job.n_batch.to_string()])
            .args(["-ub", &job.n_batch.to_string()])
            .args(["-t", &job.threads.to_string()])
            .arg("--kl-divergence-base")
            .arg(out);
        if self.flash_attn == FlashAttn::Value {
            cmd.args(["-fa", "off"]);
        }
        cmd.args(&self.args);
        let o = cmd
            .output()
            .map_err(|e| Error::engine(format!("runtime `{}`: {e}", self.name)))?;
        if !o.status.success() || !out.is_file() {
            let err = String::from_utf8_lossy(&o.stderr);
            let tail: Vec<&str> = err.lines().rev().take(6).collect();
            return Err(Error::engine(format!(
                "runtime `{}` ({}) on {}: {}; it said: {}",
                self.name,
                self.path.display(),
                job.model.display(),
                o.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )));
        }
        Ok(())
    }
}

/// The linked engine's base file of `plan` on `model` under `settings`,
/// written to `out` row by row as llama-perplexity writes its own
/// ([`basefile::encode`]); the head's tokens are the plan's (each chunk's
/// first is the BOS the pass put there).
pub fn linked_base_file(
    model: &dyn crate::engine::LoadedModel,
    settings: &crate::core::Settings,
    plan: &crate::execute::windows::ScoringPlan,
    out: &Path,
) -> Result<()> {
    let info = model.info();
    let head = basefile::Head {
        n_ctx: plan.n_ctx as usize,
        n_vocab: info.n_vocab,
        n_chunk: plan.windows.len(),
        tokens: plan
            .windows
            .iter()
            .flat_map(|w| w.window.tokens.iter().copied())
            .collect(),
    };
    if plan.windows.iter().any(|w| {
        w.window.tokens.len() != head.n_ctx
            || w.first_scored != head.n_ctx / 2
            || w.targets.len() != head.per_chunk()
    }) {
        return Err(Error::input(
            "a runtime's base file holds llama-perplexity's default windows (n_ctx tokens, the \
             second half scored): the case's windows are not those",
        ));
    }
    let mut w = basefile::Writer::create(out, &head).map_err(|e| Error::io(out, e))?;
    let mut row = basefile::OwnedRow {
        scale: 0.0,
        min: 0.0,
        q: Vec::with_capacity(info.n_vocab),
    };
    let windows: Vec<crate::engine::Window> =
        plan.windows.iter().map(|w| w.window.clone()).collect();
    model.score(settings, &windows, &mut |wi, pos, logits| {
        let pw = &plan.windows[wi];
        if pos >= pw.first_scored && pos < pw.first_scored + pw.targets.len() {
            basefile::encode(logits, &mut row);
            w.row(&row).map_err(|e| Error::io(out, e))?;
        }
        Ok(())
    })?;
    w.finish().map_err(|e| Error::io(out, e))
}

/// Compare base files `a` (runtime A) and `b` (runtime B) on `plan`: both
/// checked (length, dimensions, the plan's windows and tokens: a chunk's
/// first token is the BOS a pass puts there, not compared), then every row
/// pair measured ([`crate::measure::drift::Drift`]). Errors name the file.
pub(crate) fn compare(
    a: &Path,
    b: &Path,
    plan: &crate::execute::windows::ScoringPlan,
) -> Result<crate::measure::drift::Drift> {
    let open = |p: &Path| -> Result<basefile::Reader> {
        let r =
            basefile::Reader::open(p).map_err(|e| Error::input(format!("{}: {e}", p.display())))?;
        let h = &r.head;
        if h.n_ctx != plan.n_ctx as usize || h.n_chunk != plan.windows.len() {
            return Err(Error::input(format!(
                "{}: n_ctx {}, {} chunks; the case scores {} chunks of {}",
                p.display(),
                h.n_ctx,
                h.n_chunk,
                plan.windows.len(),
                plan.n_ctx
            )));
        }
        for (w, pw) in plan.windows.iter().enumerate() {
            let file = &h.tokens[w * h.n_ctx..(w + 1) * h.n_ctx];
            if let Some(i) = (1..h.n_ctx).find(|&i| file[i] != pw.window.tokens[i]) {
                return Err(Error::input(format!(
                    "{}: chunk {w}, position {i}: token {} where the case has {}: the runtime \
                     tokenized the text otherwise",
                    p.display(),
                    file[i],
                    pw.window.tokens[i]
                )));
            }
        }
        Ok(r)
    };
    let (mut ra, mut rb) = (open(a)?, open(b)?);
    if ra.head.n_vocab != rb.head.n_vocab {
        return Err(Error::input(format!(
            "{} and {}: vocabularies of {} and {} entries",
            a.display(),
            b.display(),
            ra.head.n_vocab,
            rb.head.n_vocab
        )));
    }
    let mut drift = crate::measure::drift::Drift::new();
    let empty = || basefile::OwnedRow {
        scale: 0.0,
        min: 0.0,
        q: Vec::new(),
    };
    let (mut xa, mut xb) = (empty(), empty());
    for (w, pw) in plan.windows.iter().enumerate() {
        for &t in &pw.targets {
            let more_a = ra
                .next_row(&mut xa)
                .map_err(|e| Error::input(format!("{}: {e}", a.display())))?;
            let more_b = rb
                .next_row(&mut xb)
                .map_err(|e| Error::input(format!("{}: {e}", b.display())))?;
            if !(more_a && more_b) {
                return Err(Error::input("a base file ends before the case's windows"));
            }
            drift.push(w, xa.view(), xb.view(), t as usize)?;
        }
    }
    Ok(drift)
}

#[cfg(test)]
mod tests {
    use super::{flash_attn_of, FlashAttn};

    /// The two `--help` texts of llama.cpp builds here: the linked
    /// sources' (a value) and llama-cpp-python 0.3.16's (a switch), whose
    /// `--log-colors [on|off|auto]` must not be read as flash attention's.
    #[test]
    fn flash_attention_is_read_from_its_own_help_line() {
        let new = "-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')\n\
                   --log-colors [on|off|auto]              Set colored logging";
        let old =
            "-fa,   --flash-attn                     enable Flash Attention (default: disabled)\n\
                   --log-colors [on|off|auto]              Set colored logging";
        assert_eq!(flash_attn_of(new), FlashAttn::Value);
        assert_eq!(flash_attn_of(old), FlashAttn::Switch);
        assert_eq!(
            flash_attn_of("--log-colors [on|off|auto]"),
            FlashAttn::Switch
        );
    }
}
