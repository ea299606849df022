//! Runtimes on the command line: `quantgate runtimes` verifies every
//! declared runtime, and `quantgate drift` refuses one that is not as
//! pinned before any model loads.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// A script answering as llama-perplexity's `--help` does (or not), in
/// `dir`; its sha256.
fn script(dir: &Path, name: &str, help: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\necho '{help}'\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    quantgate::core::fsutil::sha256_file(&p, |_| {}).unwrap().0
}

/// A runtime whose binary is not its pin is refused (exit 2) naming the
/// runtime, the file and both hashes; one that is not llama-perplexity is
/// refused saying so; one not declared is named with the ones that are;
/// a good one is listed with its sha256 and version. `quantgate drift`
/// refuses a bad runtime before any model loads.
#[test]
fn runtimes_are_verified_before_use() {
    let root = suites("runtimes");
    let ok = script(&root, "ok.sh", "usage: --kl-divergence-base FNAME");
    script(&root, "hello.sh", "hello");
    let hello = quantgate::core::fsutil::sha256_file(&root.join("hello.sh"), |_| {})
        .unwrap()
        .0;
    let zero = "0".repeat(64);
    std::fs::write(
        root.join("runtimes.toml"),
        format!(
            "[good]\npath = \"ok.sh\"\nsha256 = \"{ok}\"\n\
             [moved]\npath = \"ok.sh\"\nsha256 = \"{zero}\"\n\
             [hello]\npath = \"hello.sh\"\nsha256 = \"{hello}\"\n"
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = quantgate(&root, &["runtimes", "good", "linked"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(
            "good         ok  {}",
            root.join("ok.sh").display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&ok) && stdout.contains("linked       ok  linked: llama.cpp"),
        "{stdout}"
    );
    let (code, _, stderr) = quantgate(&root, &["runtimes", "moved"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("[moved]")
            && stderr.contains(&format!("has sha256 {ok}, the pin is {zero}")),
        "{stderr}"
    );
    let (code, _, stderr) = quantgate(&root, &["runtimes", "hello"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("hello.sh is not llama-perplexity-compatible"),
        "{stderr}"
    );
    let (code, _, stderr) = quantgate(&root, &["runtimes", "nope"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("runtime `nope` is not declared")
            && stderr.contains("linked, good, hello, moved"),
        "{stderr}"
    );
    // Every runtime: the bad ones said, exit 2.
    let (code, stdout, stderr) = quantgate(&root, &["runtimes"]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stdout.contains("good ") && stderr.contains("[moved]"),
        "{stdout}{stderr}"
    );
    // drift: refused before any model loads (no model `nothing` either).
    let (code, _, stderr) = quantgate(
        &root,
        &[
            "drift",
            "--runtime",
            "linked",
            "--runtime",
            "moved",
            "--model",
            "nothing",
        ],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("[moved]"), "{stderr}");
    // A bad entry of the file: named with the entry.
    std::fs::write(
        root.join("runtimes.toml"),
        "[x]\npath = \"ok.sh\"\n[linked]\nbuild = [\"b\"]\n",
    )
    .unwrap();
    let (code, _, stderr) = quantgate(&root, &["runtimes"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("[x]: `path` needs its `sha256`")
            && stderr.contains("[linked]: a runtime's name"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
