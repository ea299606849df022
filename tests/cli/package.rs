//! The repository itself: one prerequisites list, a package that holds every file the source compiles in.

use super::*;

/// README's prerequisites line names exactly the packages `.ci/run`
/// installs: a newcomer who follows README has what CI has (chromium was
/// missing from README once, and only CI's own install hid it).
#[test]
fn prerequisites_are_one_list_in_readme_and_ci() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let line = readme
        .lines()
        .take(20)
        .find(|l| l.starts_with("Prerequisites"))
        .expect("README's first lines hold a `Prerequisites` line");
    let readme_list: std::collections::BTreeSet<&str> = line
        .split_once("apt-get install ")
        .expect("the prerequisites line says `apt-get install …`")
        .1
        .split('`')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    let ci_list: std::collections::BTreeSet<&str> = ci
        .lines()
        .find_map(|l| l.strip_prefix("prerequisites=\""))
        .expect(".ci/run sets prerequisites=\"…\"")
        .trim_end_matches('"')
        .split_whitespace()
        .collect();
    assert!(readme_list.contains("chromium"), "{line}");
    assert_eq!(
        readme_list, ci_list,
        "README.md's prerequisites and .ci/run's differ"
    );
}

/// `cargo package --list` works, and the package holds every file the
/// crate's source compiles in (`include_str!`, `include_bytes!`: the corpus
/// and tasks `init` writes, the workflow template): a git or path
/// dependency builds from what the package lists.
#[test]
fn the_package_lists_every_file_the_source_compiles_in() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let (code, stdout, stderr) = output(
        Command::new(cargo)
            .args(["package", "--list", "--allow-dirty", "--offline"])
            .current_dir(repo()),
    );
    assert_eq!(code, 0, "cargo package --list: {stderr}");
    let listed: std::collections::BTreeSet<&str> = stdout.lines().collect();
    for needed in ["Cargo.toml", "README.md", "src/lib.rs", "src/main.rs"] {
        assert!(listed.contains(needed), "{needed} not packaged");
    }
    let mut checked = 0;
    for e in walkdir::WalkDir::new(repo().join("src")) {
        let e = e.unwrap();
        if e.path().extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        for rel in included_files(&text) {
            let path = e.path().parent().unwrap().join(&rel);
            let path = std::fs::canonicalize(&path)
                .unwrap_or_else(|err| panic!("{}: {rel}: {err}", e.path().display()));
            let shown = path
                .strip_prefix(std::fs::canonicalize(repo()).unwrap())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            assert!(
                listed.contains(shown.as_str()),
                "{} compiles in {shown}, which cargo package leaves out",
                e.path().display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} included files found");
}

/// The paths of every `include_str!("…")` / `include_bytes!("…")` in a
/// source file.
fn included_files(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for mac in ["include_str!(\"", "include_bytes!(\""] {
        for (i, _) in text.match_indices(mac) {
            let rest = &text[i + mac.len()..];
            if let Some(end) = rest.find('"') {
                out.push(rest[..end].to_string());
            }
        }
    }
    out
}

#[test]
fn the_books_metrics_tables_are_the_kinds_declarations() {
    use quantgate::report::metrics_doc::{metrics_reference, BLESS};
    let made = metrics_reference(&repo().join("suites")).unwrap();
    let path = repo().join("docs/src/metrics.md");
    if std::env::var_os("QUANTGATE_BLESS_DOCS").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    for kind in quantgate::kinds::names() {
        assert!(
            made.contains(&format!("## `{kind}`")),
            "no section for {kind}"
        );
    }
    assert!(made.lines().filter(|l| l.starts_with("| `")).count() >= 40);
    assert!(
        kept == made,
        "{} is not what the kinds declare; rewrite it with `{BLESS}` and review the diff:\n{}",
        path.display(),
        similar::TextDiff::from_lines(&kept, &made).unified_diff()
    );
}

/// Every line of code (comments cut) of every `.rs` file under src/ for
/// which `hit(path relative to the repository, code)` holds, as
/// `path:line: text`.
fn src_lines_where(hit: impl Fn(&str, &str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for e in walkdir::WalkDir::new(repo().join("src")) {
        let e = e.unwrap();
        let rel = e
            .path()
            .strip_prefix(repo())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if !rel.ends_with(".rs") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        for (n, line) in text.lines().enumerate() {
            if hit(&rel, line.split("//").next().unwrap_or("")) {
                found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

/// One `Config` is built at the edge and passed down: no library code
/// reads the environment or a process-wide config.
#[test]
fn the_config_is_read_at_the_edge_and_passed_down() {
    // The environment is read by core/config/ alone, besides a worker's
    // own protocol (its alias, plan, parent and threads); nothing reads a
    // process-wide config.
    let protocol = [
        "src/core/config/mod.rs",
        "src/main.rs",
        "src/harness/mod.rs",
        "src/schedule/worker.rs",
        // Test support, compiled into tests only: names the folders a
        // failed test leaves.
        "src/core/scratch.rs",
    ];
    let found = src_lines_where(|rel, code| {
        let global = ["Config::current", "try_current", "EngineOptions::current"]
            .iter()
            .any(|g| code.contains(g));
        let env = ["env::var(", "env::var_os(", "env::vars("]
            .iter()
            .any(|g| code.contains(g));
        global || (env && !protocol.contains(&rel))
    });
    assert!(
        found.is_empty(),
        "library code reads the environment or a process-wide config (take a &Config):\n{}",
        found.join("\n")
    );
    // The worker protocol's reads, named: a new one is a new variable a
    // worker takes besides its config.
    let worker = std::fs::read_to_string(repo().join("src/schedule/worker.rs")).unwrap();
    assert_eq!(worker.matches("std::env::var(").count(), 3);
}

/// The library's errors are typed (the crate's `Error` with its kind, or
/// a `thiserror` type of the failure: `Malformed`, `SealError`, …), never a
/// bare `String` a caller can only print; the command line's own helpers
/// (clap's value parsers, git's output) may keep one.
#[test]
fn the_library_returns_typed_errors() {
    let found = src_lines_where(|rel, code| {
        !rel.starts_with("src/cli/") && code.contains("Result<") && code.contains(", String>")
    });
    assert!(
        found.is_empty(),
        "a library error as a String (give it a type, core/error.rs):\n{}",
        found.join("\n")
    );
}

/// The library says what it says through `core::progress` (a program that
/// embeds it can take its notes); only the edges write to stderr: the
/// command line, the harness, a worker's own failure, and the fake engine's
/// imitation of llama.cpp's last words before an abort.
#[test]
fn only_the_edges_write_to_stderr() {
    let edges = [
        "src/cli/",
        "src/harness/",
        "src/main.rs",
        "src/core/progress.rs",
        "src/engine/fake.rs",
        "src/schedule/worker.rs",
        // Test support, compiled into tests only: names the folders a
        // failed test leaves.
        "src/core/scratch.rs",
    ];
    let found = src_lines_where(|rel, code| {
        !edges.iter().any(|x| rel.starts_with(x))
            && (code.contains("eprintln!(") || code.contains("eprint!("))
    });
    assert!(
        found.is_empty(),
        "the library writes to stderr itself (use core::progress::say!):\n{}",
        found.join("\n")
    );
    let worker = std::fs::read_to_string(repo().join("src/schedule/worker.rs")).unwrap();
    assert_eq!(
        worker.matches("eprintln!(").count(),
        1,
        "a worker's own failure only"
    );
}

/// `quantgate --version` names the source sha256 the result cache keys its
/// entries by, and it is what an independent recomputation (Python's
/// hashlib over this checkout: every file under `src/`, `Cargo.toml`,
/// `build.rs`, the features, the target, `rustc -vV`, as build.rs
/// documents) gives: the key covers every line of the source, so a result
/// is never served to code that could compute it otherwise.
#[test]
fn the_version_names_the_source_sha256_results_are_keyed_by() {
    let (code, stdout, stderr) =
        output(Command::new(env!("CARGO_BIN_EXE_quantgate")).arg("--version"));
    assert_eq!(code, 0, "{stderr}");
    let named = stdout
        .split_once("(source sha256 ")
        .and_then(|(_, r)| r.split_once(')'))
        .unwrap_or_else(|| panic!("no source sha256: {stdout}"))
        .0
        .to_string();
    let mut features = vec!["CARGO_FEATURE_DEFAULT"];
    for (on, name) in [
        (cfg!(feature = "cuda"), "CARGO_FEATURE_CUDA"),
        (cfg!(feature = "metal"), "CARGO_FEATURE_METAL"),
        (cfg!(feature = "vulkan"), "CARGO_FEATURE_VULKAN"),
    ] {
        if on {
            features.push(name);
        }
    }
    let script = r#"
import hashlib, os, subprocess, sys
root, features = sys.argv[1], sys.argv[2]
os.chdir(root)
files = ["Cargo.toml", "build.rs"]
for d, _, names in os.walk("src"):
    files += [os.path.join(d, n) for n in names]
h = hashlib.sha256()
for f in sorted(files):
    data = open(f, "rb").read()
    h.update(f.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
version = subprocess.run(["rustc", "-vV"], capture_output=True, check=True).stdout
host = next(l.split(": ", 1)[1] for l in version.decode().splitlines() if l.startswith("host: "))
h.update(features.encode() + b"\0" + host.encode() + b"\0" + version)
print(h.hexdigest())
"#;
    let (code, recomputed, stderr) = output(
        Command::new("python3")
            .args(["-c", script])
            .arg(repo())
            .arg(features.join(",")),
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(named, recomputed.trim(), "quantgate --version: {stdout}");
}
