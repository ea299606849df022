//! Two facts about the build, given to the crate as environment variables:
//! - `QUANTGATE_GIT_REV`: the commit quantgate is built from (when built in
//!   a git checkout): what `quantgate init --dependency git` pins the
//!   written Cargo.toml and workflow to, so that a release repository builds
//!   the same quantgate on GitHub;
//! - `QUANTGATE_SOURCE_SHA256`: the sha256 of the library's source (every
//!   file under `src/`, `Cargo.toml`, this file; paths and bytes), the
//!   features it is built with, the target and the compiler: what the result
//!   cache keys its entries by, so that every executable built from the
//!   same source (`quantgate`, this repository's test harness, a release
//!   repository's `cargo test`) shares results and no other does.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let rev = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit()));
    if let Some(rev) = rev {
        println!("cargo:rustc-env=QUANTGATE_GIT_REV={rev}");
    }
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-changed=build.rs");
    println!(
        "cargo:rustc-env=QUANTGATE_SOURCE_SHA256={}",
        source_sha256()
    );
}

/// sha256 over the source's files (sorted by path: each path, a 0 byte, its
/// length as 8 bytes little-endian, its bytes), the enabled features
/// (`CARGO_FEATURE_*` names, sorted, `,`-joined), a 0 byte, the target, a 0
/// byte, and `rustc -vV`'s output.
fn source_sha256() -> String {
    let mut files = vec![PathBuf::from("Cargo.toml"), PathBuf::from("build.rs")];
    walk(Path::new("src"), &mut files);
    // By the path's text, so any language sorting strings recomputes it.
    files.sort_by_key(|p| p.to_string_lossy().into_owned());
    let mut h = Sha256::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        h.update(f.to_string_lossy().as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    let mut features: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("CARGO_FEATURE_"))
        .collect();
    features.sort();
    h.update(features.join(",").as_bytes());
    h.update([0]);
    h.update(std::env::var("TARGET").unwrap_or_default().as_bytes());
    h.update([0]);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    // Never an empty version: results of two compilers would share keys.
    let version = std::process::Command::new(&rustc)
        .arg("-vV")
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty())
        .unwrap_or_else(|| panic!("`{rustc} -vV` gave no version"))
        .stdout;
    h.update(&version);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every file under `dir`, recursively.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
}
