//! `quantgate init`: a release repository for a folder of GGUF files — the
//! standard release gates as cases, the corpus and task file they read, a
//! `Cargo.toml` and `tests/gate.rs` so that `cargo test` gates the release,
//! a nextest config and a README that says how to review goldens and
//! publish the report. `quantgate run` in that folder then gives the
//! verdicts and the report with no hand edit.
//!
//! Contract: nothing is overwritten without `--force`, and goldens are never
//! written (the first run records them, as for any case); every file is
//! written whole or not at all.

use super::args::InitArgs;
use super::Conclusion;
use quantgate::core::fsutil::{sha256_bytes, write_atomic};
use quantgate::core::Error;
use quantgate::models::local;
use std::path::{Path, PathBuf};

/// WikiText-2 test, the default corpus (llama-perplexity's usual one).
pub(crate) const WIKITEXT: &[u8] = include_bytes!("../../suites/data/wikitext-2-test.txt");
/// 64 computed multiple-choice questions in llama-perplexity's binary
/// `--multiple-choice` format (`multiple_choice::computed_tasks(64, 2026)`).
const MC_TASKS: &[u8] = include_bytes!("../../suites/data/mc-computed.bin");
/// The CI workflow (`__INSTALL__`: the step that installs quantgate;
/// `__REVIEW_STEPS__`: [`REVIEW_STEPS`]).
const WORKFLOW: &str = include_str!("release-gates.yml");
/// The steps that review a pull request's goldens (`quantgate diff`, the
/// summary, one updated comment), `__QUANTGATE__` the binary: the same in
/// the workflow `init` writes and in quantgate's own
/// `.github/workflows/review.yml` (a test compares them).
pub const REVIEW_STEPS: &str = include_str!("review-steps.yml");

/// Write the release repository `a` describes.
pub fn run(a: InitArgs) -> Result<Conclusion, Error> {
    let cwd = std::env::current_dir().map_err(|e| Error::input(format!("working folder: {e}")))?;
    let mut files: Vec<PathBuf> = Vec::new();
    for m in &a.models {
        // As `expand` gives them (the folder resolved, a link kept by its
        // own name): the form the cases' `path:` names expand to.
        for f in local::expand(m, &cwd).map_err(|e| e.context("--model"))? {
            if !files.contains(&f) {
                files.push(f);
            }
        }
    }
    let size = |f: &Path| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
    let reference = match &a.reference {
        Some(r) => match local::expand(r, &cwd).map_err(|e| e.context("--reference"))?[..] {
            [ref one] => one.clone(),
            ref many => {
                return Err(Error::input(format!(
                    "--reference {r}: names {} files; name one",
                    many.len()
                )))
            }
        },
        None => {
            let largest = files
                .iter()
                .max_by_key(|f| size(f))
                .cloned()
                .ok_or_else(|| Error::input("--model: no file"))?;
            eprintln!(
                "quantgate: the reference is the largest file, {} (--reference names another)",
                largest.display()
            );
            largest
        }
    };
    let candidates: Vec<&PathBuf> = files.iter().filter(|f| **f != reference).collect();
    // A copy of the reference under another name would compare the
    // reference with itself: every gate passes vacuously.
    let reference_bytes = size(&reference);
    let mut reference_sha: Option<String> = None;
    for c in &candidates {
        if size(c) != reference_bytes {
            continue;
        }
        let sha = |f: &Path| {
            quantgate::core::fsutil::sha256_file(f, |_| {})
                .map(|(s, _)| s)
                .map_err(|e| e.context("--model"))
        };
        if reference_sha.is_none() {
            reference_sha = Some(sha(&reference)?);
        }
        if reference_sha.as_deref() == Some(sha(c)?.as_str()) {
            return Err(Error::input(format!(
                "--model {}: the same bytes as the reference {} (sha256 {}): a model compared \
                 with itself passes every gate vacuously; leave the copy out, or name another \
                 reference",
                c.display(),
                reference.display(),
                reference_sha.as_deref().unwrap_or("")
            )));
        }
    }
    if candidates.is_empty() {
        return Err(Error::input(format!(
            "--model: no file besides the reference {}: name the quants to release",
            reference.display()
        )));
    }
    let dependency = Dependency::of(a.dependency.as_deref())?;
    if let Some(spec) = &a.hub {
        quantgate::models::hub::HubFile::of_spec(spec, "file.gguf")?;
    }
    std::fs::create_dir_all(&a.dir)
        .map_err(|e| Error::input(format!("{}: {e}", a.dir.display())))?;
    let dir = canonical(&a.dir)?;
    // Model files as the cases name them: relative to `suites/release/`
    // when inside the folder (the repository moves with them), else as they are.
    let named = |f: &Path| match f.strip_prefix(&dir) {
        Ok(rel) => format!("path:../../{}", rel.display()),
        Err(_) => format!("path:{}", f.display()),
    };
    let models: Vec<String> = candidates.iter().map(|f| named(f)).collect();
    let reference_named = named(&reference);
    let (text_name, text) = match &a.text {
        Some(t) => (
            t.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| Error::input(format!("--text {}: not a file", t.display())))?,
            std::fs::read(t).map_err(|e| Error::input(format!("--text {}: {e}", t.display())))?,
        ),
        None => ("wikitext-2-test.txt".to_string(), WIKITEXT.to_vec()),
    };
    match std::str::from_utf8(&text) {
        Err(_) => return Err(Error::input(format!("--text {text_name}: not UTF-8 text"))),
        Ok(t) if t.trim().is_empty() => {
            return Err(Error::input(format!(
                "--text {text_name}: empty (no text to score); give a corpus, or leave --text \
                 out for WikiText-2 test"
            )))
        }
        Ok(_) => {}
    }
    let text_sha = sha256_bytes(&text);
    let text_path = format!("suites/data/{text_name}");
    let release = quantgate::kinds::release::cases(
        &models,
        &reference_named,
        &text_name,
        &text_sha,
        &sha256_bytes(MC_TASKS),
    );
    let case_paths: Vec<String> = release
        .iter()
        .map(|(name, _)| format!("suites/release/{name}"))
        .collect();
    let mut writes: Vec<(&str, Vec<u8>)> =
        vec![("suites/models.toml", REGISTRY.as_bytes().to_vec())];
    writes.extend(
        case_paths
            .iter()
            .zip(release)
            .map(|(path, (_, body))| (path.as_str(), body.into_bytes())),
    );
    writes.extend([
        ("suites/data/mc-computed.bin", MC_TASKS.to_vec()),
        ("Cargo.toml", cargo_toml(&dir, &dependency).into()),
        ("src/lib.rs", LIB_RS.as_bytes().to_vec()),
        ("tests/gate.rs", GATE_RS.as_bytes().to_vec()),
        (".config/nextest.toml", NEXTEST.as_bytes().to_vec()),
        (
            ".github/workflows/release-gates.yml",
            workflow(&dependency, a.hub.is_some()).into(),
        ),
        // The GGUF files: tracked by Git LFS, or (published on the Hub)
        // never committed.
        if a.hub.is_some() {
            (".gitignore", GITIGNORE_HUB.as_bytes().to_vec())
        } else {
            (".gitattributes", GITATTRIBUTES_LFS.as_bytes().to_vec())
        },
        ("README.md", README.as_bytes().to_vec()),
        (&text_path, text),
    ]);
    let held: Vec<&str> = writes
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| dir.join(p).exists())
        .collect();
    if !held.is_empty() && !a.force {
        return Err(Error::input(format!(
            "{}: holds {} already; pass --force to replace what init writes (goldens are never touched)",
            dir.display(),
            held.join(", ")
        )));
    }
    for (p, body) in &writes {
        let path = dir.join(p);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::input(format!("{}: {e}", parent.display())))?;
        }
        write_atomic(&path, body)?;
    }
    // The files pinned now (sha256 and bytes, paths relative to the
    // repository), so the lock is committed with the cases.
    let mut pinned = files.clone();
    if !pinned.contains(&reference) {
        pinned.push(reference.clone());
    }
    let aliases = local::pin(&dir.join("suites/models.toml"), &[], &pinned, false)?;
    if let Some(spec) = &a.hub {
        local::publish(&dir.join("suites/models.toml"), &aliases, spec)?;
    }
    println!(
        "quantgate: wrote a release repository in {} for {} quant(s) of {}:",
        dir.display(),
        candidates.len(),
        reference.display()
    );
    for (p, _) in &writes {
        println!("  {p}");
    }
    println!("  suites/models.lock");
    if let Some(w) = dependency.warning() {
        eprintln!("{w}");
    }
    println!(
        "next: cd {} && quantgate run --report report   (then `cargo test` gates the same files)",
        dir.display()
    );
    Ok(Conclusion::Pass)
}

/// Where the written crate takes quantgate from (`init --dependency`).
#[derive(Debug, Clone, PartialEq)]
pub enum Dependency {
    /// quantgate's repository (its Cargo.toml's `repository`) at the commit
    /// this quantgate was built from.
    Git { url: String, rev: String },
    /// A version on crates.io.
    Version(String),
    /// This checkout, by its local path: builds only on this machine.
    Path(PathBuf),
    /// A TOML inline table's inside, as given (`git = "…", branch = "…"`).
    Table(String),
}

impl Dependency {
    /// The dependency `spec` names (`git`, `version`, `path`, or an inline
    /// table's inside); None: `git` where quantgate knows its repository
    /// and commit, else `path`.
    pub fn of(spec: Option<&str>) -> Result<Dependency, Error> {
        let repository = env!("CARGO_PKG_REPOSITORY");
        let rev = option_env!("QUANTGATE_GIT_REV");
        let git = || match (repository, rev) {
            ("", _) => Err("quantgate's Cargo.toml names no `repository`"),
            (_, None) => Err("this quantgate was not built from a git checkout (no commit to pin)"),
            (url, Some(rev)) => Ok(Dependency::Git {
                url: url.to_string(),
                rev: rev.to_string(),
            }),
        };
        let here = || Dependency::Path(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        match spec.map(str::trim) {
            None => Ok(git().unwrap_or_else(|_| here())),
            Some("git") => git().map_err(|why| {
                Error::input(format!(
                    "--dependency git: {why}; name the repository yourself \
                     (--dependency 'git = \"URL\", rev = \"COMMIT\"'), or pass --dependency path"
                ))
            }),
            Some("version") => Ok(Dependency::Version(env!("CARGO_PKG_VERSION").to_string())),
            Some("path") => Ok(here()),
            Some(t) if t.contains('=') => Ok(Dependency::Table(t.to_string())),
            Some(other) => Err(Error::input(format!(
                "--dependency {other}: expected git, version, path, or a TOML inline table's \
                 inside (git = \"URL\", rev = \"COMMIT\")"
            ))),
        }
    }

    /// The inside of the written `quantgate = { … }`.
    fn toml(&self) -> String {
        match self {
            Dependency::Git { url, rev } => format!("git = {url:?}, rev = {rev:?}"),
            Dependency::Version(v) => format!("version = \"={v}\""),
            Dependency::Path(p) => format!("path = {:?}", p.display().to_string()),
            Dependency::Table(t) => t.clone(),
        }
    }

    /// The workflow's command that installs the same quantgate.
    fn install(&self) -> String {
        match self {
            Dependency::Git { url, rev } => {
                format!("cargo install --locked quantgate --git {url} --rev {rev}")
            }
            Dependency::Version(v) => format!("cargo install --locked quantgate --version ={v}"),
            Dependency::Path(p) => format!(
                "cargo install --locked --path {:?}   # a local path: only a self-hosted runner on this machine has it",
                p.display().to_string()
            ),
            // `git = "URL", branch = "b"` → `--git URL --branch b`.
            Dependency::Table(d) => {
                let flags: Vec<String> = d
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| format!("--{} {}", k.trim(), v.trim().trim_matches('"')))
                    .collect();
                format!("cargo install --locked quantgate {}", flags.join(" "))
            }
        }
    }

    /// What to say about it on stderr: a warning that a path or an
    /// unpublished version will not build on GitHub.
    fn warning(&self) -> Option<String> {
        match self {
            Dependency::Path(p) => Some(format!(
                "quantgate: WARNING: Cargo.toml and .github/workflows/release-gates.yml take \
                 quantgate from a local path ({}): they build on this machine only, and the \
                 workflow fails on GitHub. Pass --dependency git (quantgate's repository at its \
                 commit) or --dependency 'git = \"URL\", rev = \"COMMIT\"' before you push",
                p.display()
            )),
            Dependency::Version(v) if !PUBLISHED => Some(format!(
                "quantgate: WARNING: quantgate {v} is not published on crates.io yet: \
                 `quantgate = \"={v}\"` will not resolve until it is"
            )),
            _ => None,
        }
    }
}

/// Whether this version of quantgate is on crates.io (its Cargo.toml says
/// `publish = false`).
const PUBLISHED: bool = false;

/// The CI workflow, installing quantgate from where the Cargo.toml takes it.
/// `.gitattributes`: GGUF files by Git LFS (GitHub refuses files over
/// 100 MiB in plain git).
const GITATTRIBUTES_LFS: &str = "*.gguf filter=lfs diff=lfs merge=lfs -text\n";
/// `.gitignore` with the files on the Hub: the lock pins them.
const GITIGNORE_HUB: &str =
    "# The GGUF files are published on the Hugging Face Hub and pinned in\n\
# suites/models.lock (commit and sha256); `quantgate models download` puts\n\
# them in place.\n*.gguf\n/target/\n";

/// The huggingface_hub release the workflow's download step installs
/// (scripts/fetch-huggingface-hub.sh pins the same one for the tests).
const HF_HUB_VERSION: &str = "0.36.0";

/// The workflow, installing quantgate from `dependency`, its jobs taking
/// the GGUF files from Git LFS or, with `hub`, from the Hub.
fn workflow(dependency: &Dependency, hub: bool) -> String {
    let models = |quantgate: &str| {
        if !hub {
            return String::new();
        }
        format!(
            "      # The GGUF files from the Hub at the commit the lock pins, each\n\
             \x20     # verified against its sha256 (the Hub's cache kept between runs).\n\
             \x20     - uses: actions/setup-python@v5\n\
             \x20       with:\n\
             \x20         python-version: \"3.12\"\n\
             \x20     - run: pip install huggingface_hub=={HF_HUB_VERSION}\n\
             \x20     - uses: actions/cache@v4\n\
             \x20       with:\n\
             \x20         path: ~/.cache/huggingface/hub\n\
             \x20         key: hf-models-${{{{ hashFiles('suites/models.lock') }}}}\n\
             \x20     - name: Models from the Hub, pinned by commit and sha256\n\
             \x20       env:\n\
             \x20         HF_TOKEN: ${{{{ secrets.HF_TOKEN }}}}\n\
             \x20       run: {quantgate} models download\n"
        )
    };
    let lfs = if hub {
        ""
    } else {
        "        with:\n          lfs: true\n"
    };
    WORKFLOW
        .replace(
            "__REVIEW_STEPS__\n",
            &REVIEW_STEPS.replace("__QUANTGATE__", "quantgate-build/bin/quantgate"),
        )
        .replace("__INSTALL__", &dependency.install())
        .replace("        __LFS__\n", lfs)
        .replace("      __MODELS_BUILD__\n", &models("quantgate"))
        .replace(
            "      __MODELS_GATES__\n",
            &models("quantgate-build/bin/quantgate"),
        )
}

/// `p` made absolute and free of `.`/`..`, the error naming it.
fn canonical(p: &Path) -> Result<PathBuf, Error> {
    p.canonicalize()
        .map_err(|e| Error::input(format!("{}: {e}", p.display())))
}

/// The written `Cargo.toml`: a crate whose only test gates the release.
fn cargo_toml(dir: &Path, dependency: &Dependency) -> String {
    let name: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let name = match name.trim_matches('-') {
        "" => "release".to_string(),
        n if n.starts_with(|c: char| c.is_ascii_digit()) => format!("release-{n}"),
        n => n.to_string(),
    };
    let dependency = dependency.toml();
    format!(
        "[package]\nname = \"{name}-gates\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n\
         [dev-dependencies]\nquantgate = {{ {dependency} }}\n\n\
         # `cargo test` runs every case under suites/ as a test (tests/gate.rs).\n\
         [[test]]\nname = \"gate\"\nharness = false\n\n\
         # llama.cpp is slow unoptimised: the tests build in release.\n\
         [profile.test]\nopt-level = 3\n\n[profile.dev]\nopt-level = 3\n"
    )
}

const REGISTRY: &str = "\
# Model registry. The release's files are named by path in the cases
# (`path:…`) and pinned by sha256 in models.lock (by `quantgate init`): a changed
# file then fails until `quantgate models pin` pins it again. Aliases for
# other files go here (see quantgate's book, \"Models\": docs/src/models.md).
";

const LIB_RS: &str = "\
//! The release gates of this folder's GGUF files: `cargo test` runs every
//! case under `suites/` on them and checks each outcome against its golden
//! under `goldens/` (`tests/gate.rs`).
";

const GATE_RS: &str = "\
//! `cargo test` gates the release: every case under suites/, goldens/.
quantgate::gate!();
";

const NEXTEST: &str = "\
# cargo nextest: each test is one case on one model; a test that shares a
# decode with others waits for it, so give slow models time.
[profile.default]
slow-timeout = { period = \"120s\", terminate-after = 30 }

# One partition of the CI workflow: every test runs, JUnit beside nextest's
# output (target/nextest/ci/junit.xml), the outcomes under QUANTGATE_OUT.
[profile.ci]
fail-fast = false
slow-timeout = { period = \"120s\" }

[profile.ci.junit]
path = \"junit.xml\"
";

const README: &str = "\
# Release gates

Written by `quantgate init`. The cases under `suites/release/` gate every quant
against the reference on the evidence a model card shows:

| case | measures | gate (edit the `[[gate]]` tables to change) |
|---|---|---|
| `delta_nll` | paired ΔNLL per window on the corpus, decided sequentially over up to 80 windows (each quant stops once its verdict is certain at alpha 0.05) | mean ≤ +0.05 nats/token |
| `kld` | KL(reference ‖ quant) per position, same top token, flips | mean ≤ 0.1, p99 ≤ 0.5 |
| `mc` | 64 computed multiple-choice questions, flips against the reference | ≤ 10 right→wrong |
| `speed` | prompt processing and generation t/s, against the reference | tg not slower |

```sh
quantgate run --report report   # the verdicts and report/report.{md,csv,html}
cargo test --release            # the same gates as tests, each outcome against its golden
```

The first `cargo test` writes each outcome as a pending golden under
`goldens/` (`.snap.new`, insta's format) and fails until they are reviewed:
`cargo insta review` (or `cargo insta accept`), then commit `goldens/`.
Afterwards a changed number fails its test with a diff, and the new outcome
is written beside the golden as `.snap.new` to accept or reject.
`report/report.md` is a model-card table as it is; publish it with the files.

## The GGUF files on GitHub

GitHub refuses files over 100 MiB. Either commit them with Git LFS
(`.gitattributes` tracks `*.gguf`; the workflow checks out with `lfs: true`),
or publish them on the Hugging Face Hub and pin them there:

```sh
quantgate models pin --hub ORG/NAME@COMMIT out/*.gguf   # or: quantgate init --hub ORG/NAME@COMMIT
quantgate models download                               # what CI runs: each file at that commit, sha256-checked
```

The lock (`suites/models.lock`) then holds each file's repository, commit and
sha256; a download that differs from it is refused (exit 2) and never written.
A private repository needs the secret `HF_TOKEN`.
";
