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
