//! The `cargo test` harness (the suites binary) run as a user runs it: in its own checkout, under other engine settings.

use super::*;

/// The suites harness finds its checkout at run time: run with another
/// checkout's `CARGO_MANIFEST_DIR` (as cargo sets it when two checkouts share
/// one target directory), it lists that checkout's cases, not the ones of
/// the checkout it was compiled in.
#[test]
fn the_suites_binary_tests_the_checkout_it_runs_in() {
    let suites_bin = suites_bin();
    let other = other_checkout("checkout", "only_in_this_checkout", 1);
    let out = Command::new(&suites_bin)
        .args(["--list", "--format", "terse"])
        .env("CARGO_MANIFEST_DIR", &other)
        .current_dir(&other)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ppl/only_in_this_checkout::smollm2-q8_0: test"),
        "{stdout}"
    );
    assert!(!stdout.contains("ppl/delta_nll"), "{stdout}");
    let _ = std::fs::remove_dir_all(&other);
}

/// Another checkout in a temp dir: the registry, the corpus as `ppl/t.txt`,
/// and one case `ppl/NAME` on Q8_0 (n_ctx 64, `chunks` windows).
fn other_checkout(tag: &str, name: &str, chunks: usize) -> PathBuf {
    let other = fresh_dir(tag);
    let suites = other.join("suites");
    std::fs::create_dir_all(suites.join("ppl")).unwrap();
    std::fs::copy(
        repo().join("suites/models.toml"),
        suites.join("models.toml"),
    )
    .unwrap();
    std::fs::copy(
        repo().join("suites/data/wikitext-2-test.txt"),
        suites.join("ppl/t.txt"),
    )
    .unwrap();
    std::fs::write(
        suites.join(format!("ppl/{name}.toml")),
        format!(
            "kind = \"perplexity\"\nmodels = [\"smollm2-q8_0\"]\n[text]\npath = \"t.txt\"\nsha256 = \"{WIKI_SHA}\"\n\
             [window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = {chunks}\n"
        ),
    )
    .unwrap();
    other
}

/// The `suites` test binary built with this one: the newest beside it.
fn suites_bin() -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    std::fs::read_dir(&deps)
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("suites-") && !n.contains('.')
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .expect("the suites test binary beside this one")
        .path()
}

/// Engine settings are part of a golden's identity: a golden recorded with
/// flash attention off fails under `QUANTGATE_FLASH_ATTN=on` as "recorded
/// with other inputs", naming the settings line before and after; the run
/// itself uses flash attention (its settings line says so); a quantized V
/// cache without flash attention, or a bad value, fails every test naming
/// the variable before any model loads.
#[test]
fn a_golden_recorded_with_other_engine_settings_is_another_experiment() {
    let bin = suites_bin();
    let other = other_checkout("fa", "fa", 2);
    let run = |env: &[(&str, &str)]| {
        let mut c = Command::new(&bin);
        c.args(["--exact", "ppl/fa::smollm2-q8_0", "--test-threads", "1"])
            .env("CARGO_MANIFEST_DIR", &other)
            .env("QUANTGATE_RESULT_CACHE", "off")
            .env_remove("QUANTGATE_FLASH_ATTN")
            .env_remove("QUANTGATE_KV_TYPE")
            .env_remove("QUANTGATE_N_GPU_LAYERS")
            .env_remove("CI")
            .current_dir(&other);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, log) = run(&[("QUANTGATE_UPDATE", "always")]);
    assert!(ok, "{log}");
    let golden = other.join("goldens/ppl/fa/smollm2-q8_0.snap");
    let recorded = std::fs::read_to_string(&golden).unwrap();
    assert!(
        recorded.contains("settings: n_ctx=64 n_batch=64 n_ubatch=64 flash_attn=off kv=f16\n"),
        "{recorded}"
    );
    let (ok, log) = run(&[("QUANTGATE_FLASH_ATTN", "on"), ("QUANTGATE_UPDATE", "no")]);
    assert!(!ok, "{log}");
    assert!(log.contains("was recorded with other inputs"), "{log}");
    assert!(
        log.contains("settings: n_ctx=64 n_batch=64 n_ubatch=64 flash_attn=off kv=f16 → n_ctx=64 n_batch=64 n_ubatch=64 flash_attn=on kv=f16"),
        "{log}"
    );
    assert_eq!(
        std::fs::read_to_string(&golden).unwrap(),
        recorded,
        "update mode no writes nothing"
    );
    for (env, want) in [
        (vec![("QUANTGATE_KV_TYPE", "q8_0")], "needs flash attention"),
        (
            vec![("QUANTGATE_FLASH_ATTN", "yes")],
            "QUANTGATE_FLASH_ATTN: `yes` is not on or off",
        ),
        (
            vec![("QUANTGATE_N_GPU_LAYERS", "many")],
            "QUANTGATE_N_GPU_LAYERS: `many`",
        ),
    ] {
        let (ok, log) = run(&env);
        assert!(!ok && log.contains(want), "{env:?}: {log}");
    }
    // A quantized KV cache with flash attention runs, and is another experiment too.
    let (ok, log) = run(&[
        ("QUANTGATE_KV_TYPE", "q8_0"),
        ("QUANTGATE_FLASH_ATTN", "on"),
        ("QUANTGATE_UPDATE", "no"),
    ]);
    assert!(!ok && log.contains("flash_attn=on kv=q8_0"), "{log}");
    let _ = std::fs::remove_dir_all(&other);
}
