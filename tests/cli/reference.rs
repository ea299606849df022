//! `quantgate reference`: a reference built once, shipped, and shared by shards and concurrent runs.

use super::*;

/// `reference export --out` naming a directory is refused before the
/// reference model is scored, naming the flag.
#[test]
fn reference_export_to_a_directory_is_refused_first() {
    let root = suites("export-dir");
    std::fs::write(root.join("ppl/ok.toml"), case(128, "")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .arg("--suites")
        .arg(&root)
        .args(["reference", "export"])
        .arg(root.join("ppl/ok.toml"))
        .args(["--model", "tiny", "--out"])
        .arg(&root)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--out") && stderr.contains("is a directory"),
        "{stderr}"
    );
}

/// A reference built once (`quantgate reference build`) and shipped: a
/// shard with its own empty cache reads it from QUANTGATE_REFERENCE_DIR and
/// gives the numbers a run that scores the reference itself gives, with the
/// reference model's file gone (so it cannot have loaded it). An artifact
/// that lacks a product is an error naming it (exit 2), unless
/// QUANTGATE_REFERENCE_MISSING=compute; a bad value of either variable is
/// an error naming it before anything runs.
#[test]
fn a_reference_built_once_is_shipped_and_the_shard_never_needs_the_model() {
    let (suites, link) = reference_suites("shipped");
    let root = suites.parent().unwrap().to_path_buf();
    let art = root.join("artifact");
    let (code, stdout, stderr) = quantgate_env(
        &suites,
        &[("QUANTGATE_CACHE", &root.join("cache-build"))],
        &["reference", "build", "--out", art.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("2 reference product(s) built"), "{stdout}");
    let mut names: Vec<String> = std::fs::read_dir(&art)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.path().extension().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["qgref", "qgscores"]);
    // The unsharded numbers: a run that scores the reference itself.
    let whole = root.join("whole.json");
    let (code, stdout, stderr) = quantgate_env(
        &suites,
        &[("QUANTGATE_CACHE", &root.join("cache-whole"))],
        &["run", "--threads", "1", "--json", whole.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // The shard: the reference model's file is gone.
    std::fs::remove_file(&link).unwrap();
    let shard = root.join("shard.json");
    let (code, stdout, stderr) = quantgate_env(
        &suites,
        &[
            ("QUANTGATE_CACHE", &root.join("cache-shard")),
            ("QUANTGATE_REFERENCE_DIR", &art),
        ],
        &["run", "--threads", "1", "--json", shard.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(json_metrics(&shard), json_metrics(&whole));
    assert_eq!(json_metrics(&shard).len(), 2);
    // An artifact without the products: each test names its product.
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, stdout, stderr) = quantgate_env(
        &suites,
        &[
            ("QUANTGATE_CACHE", &root.join("cache-empty")),
            ("QUANTGATE_REFERENCE_DIR", &empty),
        ],
        &["run", "--threads", "1"],
    );
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert_eq!(
        stdout
            .matches("not in the shipped reference folder")
            .count(),
        2,
        "{stdout}"
    );
    assert!(
        stdout.contains(".qgref") && stdout.contains(".qgscores"),
        "{stdout}"
    );
    // With `compute` the shard scores the reference itself: here its file
    // is gone, so the error is the model's, never a result.
    let (code, stdout, stderr) = quantgate_env(
        &suites,
        &[
            ("QUANTGATE_CACHE", &root.join("cache-empty")),
            ("QUANTGATE_REFERENCE_DIR", &empty),
            ("QUANTGATE_REFERENCE_MISSING", Path::new("compute")),
        ],
        &["run", "--threads", "1"],
    );
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    assert!(
        !stdout.contains("not in the shipped reference folder"),
        "{stdout}"
    );
    assert!(stdout.contains("ref.gguf"), "{stdout}");
    for (var, value) in [
        ("QUANTGATE_REFERENCE_MISSING", Path::new("sometimes")),
        ("QUANTGATE_REFERENCE_DIR", &*root.join("no-such-folder")),
    ] {
        let (code, _, stderr) = quantgate_env(&suites, &[(var, value)], &["run"]);
        assert_eq!(code, 2, "{var}: {stderr}");
        assert!(stderr.contains(var), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Two processes starting at once on one cold cache build the reference
/// once: one of them does the reference work, the other waits on the
/// product's lock and reads what the first wrote; both give the same numbers.
#[test]
fn concurrent_runs_on_a_cold_cache_build_one_reference() {
    let (suites, _link) = reference_suites("concurrent");
    let root = suites.parent().unwrap().to_path_buf();
    let cache = root.join("cache");
    let spawn = |k: usize| {
        let json = root.join(format!("run{k}.json"));
        let child = Command::new(env!("CARGO_BIN_EXE_quantgate"))
            .arg("--suites")
            .arg(&suites)
            .args(["run", "kld", "--threads", "1", "--timings", "--json"])
            .arg(&json)
            .env("QUANTGATE_CACHE", &cache)
            .env_remove("QUANTGATE_REFERENCE_DIR")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        (child, json)
    };
    let runs = [spawn(0), spawn(1)];
    let mut built = 0;
    let mut metrics = Vec::new();
    for (child, json) in runs {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        built += stdout.matches("reference work on ref").count();
        metrics.push(json_metrics(&json));
    }
    assert_eq!(built, 1, "the reference was built {built} times");
    assert_eq!(metrics[0], metrics[1]);
    let qgref = std::fs::read_dir(cache.join("reference"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "qgref"))
        .count();
    assert_eq!(qgref, 1);
    let _ = std::fs::remove_dir_all(&root);
}
