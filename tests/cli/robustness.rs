//! Robustness at the borders: nothing is believed unless it was made under
//! this run's settings and sealed by this run's key.

use super::*;

/// `quantgate ARGS…` on `suites` with `env` set: exit code, stdout, stderr.
fn quantgate_with(suites: &Path, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_quantgate"));
    c.arg("--suites").arg(suites).args(args);
    for k in [
        "QUANTGATE_REFERENCE_DIR",
        "QUANTGATE_REFERENCE_MISSING",
        "QUANTGATE_SIGNING_KEY",
        "QUANTGATE_SIGNING_KEY_FILE",
        "QUANTGATE_FLASH_ATTN",
        "QUANTGATE_KV_TYPE",
        "QUANTGATE_N_GPU_LAYERS",
        "QUANTGATE_RESULT_CACHE",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    output(&mut c)
}

/// A result is served from the result cache only to a run under the
/// settings that made it: each setting that changes numbers, changed
/// alone (flash attention, by flag or variable; the KV cache type; GPU
/// layers; threads; the case's batch and context), makes the next run
/// compute afresh and record its numbers under the new settings; the same
/// settings again are served.
#[test]
fn a_cached_result_is_served_only_under_the_settings_that_made_it() {
    let root = suites("settings-key");
    let cache = root.join("cache");
    let cache = cache.to_str().unwrap();
    let json = root.join("out.json");
    let write_case = |extra: &str| {
        std::fs::write(
            root.join("ppl/k.toml"),
            case(128, "").replace("chunks = 2\n", &format!("chunks = 2\n{extra}")),
        )
        .unwrap();
    };
    write_case("");
    // (what changed, flags, variables, the settings field it shows in,
    // its value there, whether the cache must answer)
    type Step<'a> = (
        &'a str,
        &'a [&'a str],
        &'a [(&'a str, &'a str)],
        &'a str,
        serde_json::Value,
        bool,
    );
    let steps: &[Step] = &[
        ("defaults", &[], &[], "flash_attn", false.into(), false),
        ("defaults again", &[], &[], "flash_attn", false.into(), true),
        (
            "--flash-attn on",
            &["--flash-attn", "on"],
            &[],
            "flash_attn",
            true.into(),
            false,
        ),
        (
            "QUANTGATE_FLASH_ATTN=on",
            &[],
            &[("QUANTGATE_FLASH_ATTN", "on")],
            "flash_attn",
            true.into(),
            true,
        ),
        (
            "--kv-type q8_0",
            &["--flash-attn", "on", "--kv-type", "q8_0"],
            &[],
            "kv_type",
            "q8_0".into(),
            false,
        ),
        (
            "--n-gpu-layers 0",
            &["--n-gpu-layers", "0"],
            &[],
            "n_gpu_layers",
            0.into(),
            false,
        ),
        (
            "--threads 2",
            &["--threads", "2"],
            &[],
            "threads",
            2.into(),
            false,
        ),
        (
            "defaults once more",
            &[],
            &[],
            "flash_attn",
            false.into(),
            true,
        ),
    ];
    let run_step = |(what, flags, vars, field, value, cached): &Step| {
        let mut env = vec![("QUANTGATE_CACHE", cache)];
        env.extend_from_slice(vars);
        let threads = if flags.contains(&"--threads") {
            vec![]
        } else {
            vec!["--threads", "1"]
        };
        let args = [
            &["run"][..],
            &threads,
            flags,
            &["--json", json.to_str().unwrap(), "--force"],
        ]
        .concat();
        let (code, stdout, stderr) = quantgate_with(&root, &env, &args);
        assert_eq!(code, 0, "{what}: {stdout}\n{stderr}");
        let hit = stderr.contains("result from the result cache");
        assert_eq!(hit, *cached, "{what}: cache hit {hit}\n{stderr}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(
            v[0]["settings"][*field], *value,
            "{what}: {}",
            v[0]["settings"]
        );
        v[0]["metrics"]["ppl"].as_f64().unwrap()
    };
    let mut ppl = Vec::new();
    for s in steps {
        ppl.push(run_step(s));
    }
    // The same settings give the same numbers, cached or not.
    assert_eq!(ppl[0].to_bits(), ppl[1].to_bits());
    assert_eq!(ppl[2].to_bits(), ppl[3].to_bits());
    // The case's own batch and context are its bytes: each computes afresh.
    for (extra, field, value) in [
        ("n_batch = 64\n", "n_batch", 64),
        ("n_batch = 32\n", "n_batch", 32),
    ] {
        write_case(extra);
        run_step(&(extra, &[], &[], field, value.into(), false));
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Reference products that cross to a shard: built under a signing key,
/// each product edited and sealed again with sha256 is an error naming
/// the file (exit 2), never a number; built and read without a key, the
/// shard runs and names every shipped file it read as unauthenticated.
#[test]
fn a_shipped_reference_edited_and_sealed_again_is_refused_under_a_key() {
    let (suites, _link) = reference_suites("forged");
    let root = suites.parent().unwrap().to_path_buf();
    let key = "robustness-test-key-0123456789abcdef";
    let art = root.join("artifact");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let (a, build_cache) = (path(&art), path(&root.join("cache-build")));
    let (code, stdout, stderr) = quantgate_with(
        &suites,
        &[
            ("QUANTGATE_CACHE", &build_cache),
            ("QUANTGATE_SIGNING_KEY", key),
        ],
        &["reference", "build", "--out", &a],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let files: Vec<PathBuf> = std::fs::read_dir(&art)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    let shard = |dir: &str, cache: &str, key: Option<&str>| {
        let mut env = vec![("QUANTGATE_CACHE", cache), ("QUANTGATE_REFERENCE_DIR", dir)];
        if let Some(k) = key {
            env.push(("QUANTGATE_SIGNING_KEY", k));
        }
        quantgate_with(&suites, &env, &["run", "--threads", "1"])
    };
    let (code, stdout, stderr) = shard(&a, &path(&root.join("c0")), Some(key));
    assert_eq!(code, 0, "the genuine folder: {stdout}\n{stderr}");
    for (i, file) in files.iter().enumerate() {
        let good = std::fs::read(file).unwrap();
        let mut body = good[..good.len() - 32].to_vec();
        let at = body.len() - 40;
        body[at] ^= 0x04;
        std::fs::write(file, quantgate::core::fsutil::seal(body)).unwrap();
        let (code, stdout, stderr) = shard(&a, &path(&root.join(format!("c{}", i + 1))), Some(key));
        assert_eq!(code, 2, "{}: {stdout}\n{stderr}", file.display());
        assert!(stdout.contains(&file.display().to_string()), "{stdout}");
        assert!(stdout.contains("plain sha256 seal"), "{stdout}");
        std::fs::write(file, &good).unwrap();
    }
    // Without a key: built plain, read with a warning naming each file.
    let plain = root.join("plain");
    let (code, stdout, stderr) = quantgate_with(
        &suites,
        &[("QUANTGATE_CACHE", &build_cache)],
        &["reference", "build", "--out", &path(&plain)],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stderr.contains("no signing key is set"), "{stderr}");
    let (code, stdout, stderr) = shard(&path(&plain), &path(&root.join("c9")), None);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    for f in std::fs::read_dir(&plain)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
    {
        assert!(
            stderr.contains(&format!(
                "shipped reference {} is unauthenticated",
                f.display()
            )),
            "{}: {stderr}",
            f.display()
        );
    }
    // A keyed folder read without the key: refused, never a number.
    let (code, stdout, stderr) = shard(&a, &path(&root.join("c10")), None);
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&root);
}

/// `init` refuses a candidate with the reference's bytes under another
/// name and an empty `--text`; `run` refuses a case whose reference is
/// its candidate (by alias or by file): each a vacuous pass otherwise,
/// exit 2 naming what is wrong, nothing written.
#[test]
fn a_model_compared_with_itself_and_an_empty_text_are_refused() {
    let root = fresh_dir("self-compare");
    std::fs::create_dir_all(root.join("lm")).unwrap();
    std::fs::write(root.join("lm/m-f16.gguf"), common::gguf(2048)).unwrap();
    std::fs::write(root.join("lm/m-copy.gguf"), common::gguf(2048)).unwrap();
    std::fs::write(root.join("lm/m-q8_0.gguf"), common::gguf(1024)).unwrap();
    std::fs::write(root.join("empty.txt"), " \n").unwrap();
    let init = |args: &[&str]| {
        output(
            Command::new(env!("CARGO_BIN_EXE_quantgate"))
                .current_dir(&root)
                .arg("init")
                .args(args),
        )
    };
    let (code, _, stderr) = init(&["--model", "lm/*.gguf", "--reference", "lm/m-f16.gguf"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("m-copy.gguf") && stderr.contains("the same bytes as the reference"),
        "{stderr}"
    );
    let (code, _, stderr) = init(&[
        "--model",
        "lm/m-f16.gguf",
        "--model",
        "lm/m-q8_0.gguf",
        "--text",
        "empty.txt",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--text empty.txt: empty"), "{stderr}");
    assert!(!root.join("suites").exists(), "nothing written");
    // run: the reference as a candidate, by alias and by another alias of
    // the same pinned file.
    let suites = suites("self-run");
    let sha = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
    let reg = std::fs::read_to_string(suites.join("models.toml")).unwrap();
    std::fs::write(
        suites.join("models.toml"),
        format!("{reg}\n{}", reg.replace("[tiny]", "[twin]")),
    )
    .unwrap();
    for (name, models) in [("alias", "[\"tiny\"]"), ("file", "[\"twin\"]")] {
        std::fs::write(
            suites.join(format!("ppl/{name}.toml")),
            case(128, "").replace(
                "models = [\"tiny\"]\n",
                &format!("models = {models}\nreference = \"tiny\"\n"),
            ),
        )
        .unwrap();
    }
    let (code, stdout, stderr) = run(&suites, &[]);
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("reference `tiny` is the candidate `tiny` itself (the same alias)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "reference `tiny` is the candidate `twin` itself (the same file, sha256 {sha})"
        )),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&suites);
}

/// `--jobs 0` and `--threads 0` are usage errors (exit 2) naming the
/// flag, not a run that does something else.
#[test]
fn zero_jobs_or_threads_are_refused() {
    let root = suites("zero-jobs");
    std::fs::write(root.join("ppl/ok.toml"), case(128, "")).unwrap();
    for flag in ["--jobs", "--threads"] {
        let (code, stdout, stderr) = quantgate(&root, &["run", flag, "0"]);
        assert_eq!(code, 2, "{flag}: {stdout}\n{stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("give at least 1"),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// QUANTGATE_ISOLATION=test means one worker per test in `quantgate run`
/// too: two cases that would share one decode run apart, and give the
/// same numbers as when they share it.
#[test]
fn isolation_test_shares_no_decode_in_run() {
    let (suites, _link) = reference_suites("isolation-test");
    let root = suites.parent().unwrap().to_path_buf();
    let json = |n: &str| root.join(n).to_str().unwrap().to_string();
    let cache = json("cache");
    let (shared, apart) = (json("shared.json"), json("apart.json"));
    let common_env = [
        ("QUANTGATE_CACHE", cache.as_str()),
        ("QUANTGATE_RESULT_CACHE", "off"),
    ];
    let (code, stdout, stderr) = quantgate_with(
        &suites,
        &common_env,
        &["run", "--threads", "1", "--json", &shared],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stderr.contains("(one decode)"), "{stderr}");
    let env = [
        common_env[0],
        common_env[1],
        ("QUANTGATE_ISOLATION", "test"),
    ];
    let (code, stdout, stderr) =
        quantgate_with(&suites, &env, &["run", "--threads", "1", "--json", &apart]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(!stderr.contains("(one decode)"), "{stderr}");
    assert!(
        stderr.contains("running kld/k::cand\n") && stderr.contains("running ppl/d::cand\n"),
        "{stderr}"
    );
    assert_eq!(
        json_metrics(Path::new(&apart)),
        json_metrics(Path::new(&shared))
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A library caller under a bad variable gets an error naming it, never a
/// panic (`Config::load`, then `read_outcomes` under a bad signing key),
/// checked in a child process whose environment is bad.
#[test]
fn the_library_returns_an_error_on_a_bad_variable() {
    const CHILD: &str = "QG_TEST_BAD_VARIABLE_CHILD";
    if let Some(dir) = std::env::var_os(CHILD) {
        // A program reads its config first (the library reads no
        // environment of its own): the bad value is an error naming it.
        let r = std::panic::catch_unwind(|| {
            quantgate::Config::load()
                .and_then(|c| quantgate::read_outcomes(&c, &[PathBuf::from(dir)]))
        });
        let e = r.expect("no panic").expect_err("an error");
        assert!(e.message.contains("QUANTGATE_SIGNING_KEY"), "{}", e.message);
        return;
    }
    let dir = fresh_dir("bad-variable");
    std::fs::create_dir_all(&dir).unwrap();
    let (code, stdout, stderr) = output(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "robustness::the_library_returns_an_error_on_a_bad_variable",
            ])
            .env(CHILD, &dir)
            .env("QUANTGATE_SIGNING_KEY", "short"),
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
