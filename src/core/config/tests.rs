//! The config's unit tests: defaults, each variable, bad values, keys,
//! the builder and what a worker is given.
use super::*;

fn with(vars: &[(&str, &str)]) -> Result<Config> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(
        &move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
        [None, None, None],
    )
}

/// Defaults from an empty environment; each variable read where it
/// belongs; an empty value is unset.
#[test]
fn defaults_and_each_variable() {
    let c = with(&[("HOME", "/h")]).unwrap();
    assert_eq!(c.cache, PathBuf::from("/h/.cache/quantgate"));
    assert_eq!(c.config_home, Some(PathBuf::from("/h/.config/quantgate")));
    assert_eq!(
        (c.update, c.result_cache, c.isolation),
        (UpdateMode::New, true, Isolation::Group)
    );
    assert!(c.out.is_none() && c.reference.is_none() && c.signing_key.is_none());
    let crate_root = with(&[("CARGO_MANIFEST_DIR", "/crate")]).unwrap();
    assert_eq!(crate_root.suites, PathBuf::from("/crate/suites"));
    assert_eq!(crate_root.goldens, PathBuf::from("/crate/goldens"));
    let here = env!("CARGO_MANIFEST_DIR");
    let moved = with(&[
        ("CARGO_MANIFEST_DIR", here),
        ("QUANTGATE_SUITES", "src"),
        ("QUANTGATE_GOLDENS", "tests/snapshots"),
    ])
    .unwrap();
    assert_eq!(moved.suites, PathBuf::from(here).join("src"));
    assert_eq!(moved.goldens, PathBuf::from(here).join("tests/snapshots"));
    let c = with(&[
        ("QUANTGATE_CACHE", "/c"),
        ("XDG_CACHE_HOME", "/x"),
        ("QUANTGATE_OUT", "/o"),
        ("QUANTGATE_ISOLATION", "off"),
        ("QUANTGATE_UPDATE", ""),
        ("CI", "1"),
    ])
    .unwrap();
    assert_eq!(c.cache, PathBuf::from("/c"));
    assert_eq!(c.out, Some(PathBuf::from("/o")));
    // Rows are never kept in the result cache.
    assert!(!c.result_cache);
    assert_eq!((c.isolation, c.update), (Isolation::Off, UpdateMode::No));
    assert_eq!(
        with(&[("XDG_CACHE_HOME", "/x")]).unwrap().cache,
        PathBuf::from("/x/quantgate")
    );
}

/// A signing key file that its group or others can read, or that is a
/// symlink, is refused naming the variable and the mode; a private one
/// is the key.
#[cfg(unix)]
#[test]
fn a_key_file_others_can_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("key");
    std::fs::write(&f, "0123456789abcdef0123456789abcdef\n").unwrap();
    let path = f.to_str().unwrap().to_string();
    for mode in [0o644, 0o640, 0o660, 0o606] {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = with(&[("QUANTGATE_SIGNING_KEY_FILE", &path)]).unwrap_err();
        assert_eq!(e.kind, crate::core::ErrorKind::Input);
        assert!(
            e.message.contains("QUANTGATE_SIGNING_KEY_FILE")
                && e.message.contains(&format!("mode {mode:04o}")),
            "{}",
            e.message
        );
    }
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let c = with(&[("QUANTGATE_SIGNING_KEY_FILE", &path)]).unwrap();
    assert!(c.signing_key.is_some());
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&f, &link).unwrap();
    let e = with(&[("QUANTGATE_SIGNING_KEY_FILE", link.to_str().unwrap())]).unwrap_err();
    assert!(e.message.contains("symlink"), "{}", e.message);
}

/// Every bad value is an input error naming its variable.
#[test]
fn a_bad_value_names_its_variable() {
    for (k, v) in [
        ("QUANTGATE_ISOLATION", "pod"),
        ("QUANTGATE_RESULT_CACHE", "maybe"),
        ("QUANTGATE_UPDATE", "sometimes"),
        ("QUANTGATE_REFERENCE_MISSING", "later"),
        ("QUANTGATE_REFERENCE_DIR", "/no/such/folder"),
        ("QUANTGATE_SIGNING_KEY_FILE", "/no/such/key"),
        ("QUANTGATE_SIGNING_KEY", "short"),
        ("QUANTGATE_FLASH_ATTN", "sometimes"),
        ("QUANTGATE_KV_TYPE", "f12"),
        ("QUANTGATE_N_GPU_LAYERS", "many"),
        ("QUANTGATE_CACHE", "/dev/null"),
        ("QUANTGATE_SUITES", "/no/such/folder"),
        ("QUANTGATE_GOLDENS", "/dev/null"),
        ("QUANTGATE_CONTEXT_POOL_MIB", "lots"),
        ("QUANTGATE_CONTEXT_POOL_MIB", "-1"),
    ] {
        let e = with(&[(k, v)]).unwrap_err();
        assert_eq!(e.kind, crate::core::ErrorKind::Input, "{k}");
        assert!(e.message.contains(k), "{k}={v}: {}", e.message);
    }
    let e = with(&[("QUANTGATE_UPDATE", "always"), ("CI", "true")]).unwrap_err();
    assert!(e.message.contains("CI is set"), "{}", e.message);
}

/// What a worker is given is the parent's config: every value read
/// back from [`Config::to_env`] equals the one written.
#[test]
fn a_workers_variables_give_the_parents_config() {
    let d = tempfile::tempdir().unwrap();
    let parent = with(&[
        ("HOME", "/h"),
        ("QUANTGATE_CACHE", "/c"),
        ("QUANTGATE_ISOLATION", "model"),
        ("QUANTGATE_RESULT_CACHE", "off"),
        ("QUANTGATE_UPDATE", "always"),
        ("QUANTGATE_PYTHON", "/usr/bin/python3.12"),
        ("QUANTGATE_LLAMA_LOG", "1"),
        ("QUANTGATE_FLASH_ATTN", "on"),
        ("QUANTGATE_KV_TYPE", "q8_0"),
        ("QUANTGATE_N_GPU_LAYERS", "7"),
        ("QUANTGATE_CONTEXT_POOL_MIB", "0"),
        (REFERENCE_DIR_ENV, d.path().to_str().unwrap()),
        (REFERENCE_MISSING_ENV, "compute"),
    ])
    .unwrap();
    let env: Vec<(String, String)> = parent
        .to_env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let worker = with(&pairs).unwrap();
    assert_eq!(worker.cache, parent.cache);
    assert_eq!(worker.isolation, parent.isolation);
    assert_eq!(worker.result_cache, parent.result_cache);
    assert_eq!(worker.update, parent.update);
    assert_eq!(worker.python, parent.python);
    assert_eq!(worker.llama_log, parent.llama_log);
    assert_eq!((worker.context_pool, parent.context_pool), (0, 0));
    assert_eq!(worker.engine, parent.engine);
    assert_eq!(worker.reference, parent.reference);
    assert_eq!(worker.out, parent.out);
    // And the defaults too.
    let plain = with(&[("HOME", "/h")]).unwrap();
    let env: Vec<(String, String)> = plain
        .to_env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let back = with(&pairs).unwrap();
    assert_eq!(
        (
            back.update,
            back.result_cache,
            back.isolation,
            back.llama_log,
            back.context_pool
        ),
        (
            plain.update,
            plain.result_cache,
            plain.isolation,
            plain.llama_log,
            DEFAULT_CONTEXT_POOL
        )
    );
    assert_eq!(back.engine, plain.engine);
}

/// The builder sets values over the environment's, and refuses what
/// the environment would refuse: a cache that is a file, an update
/// mode that writes under CI.
#[test]
fn the_builder_sets_values_and_checks_them() {
    let d = tempfile::tempdir().unwrap();
    let c = Config::builder()
        .root(d.path())
        .suites(d.path().join("s"))
        .goldens(d.path().join("g"))
        .cache(d.path().join("c"))
        .isolation(Isolation::Off)
        .result_cache(false)
        .engine(EngineOptions {
            flash_attn: true,
            ..EngineOptions::default()
        })
        .build()
        .unwrap();
    assert_eq!(c.suites, d.path().join("s"));
    assert_eq!(c.goldens, d.path().join("g"));
    assert_eq!(c.cache, d.path().join("c"));
    assert_eq!(c.isolation, Isolation::Off);
    assert!(!c.result_cache && c.engine.flash_attn);
    let file = d.path().join("f");
    std::fs::write(&file, "").unwrap();
    let e = Config::builder().cache(&file).build().unwrap_err();
    assert!(e.message.contains("not a directory"), "{}", e.message);
    let mut ci = ConfigBuilder {
        config: with(&[("CI", "true")]),
    };
    assert_eq!(ci.config.as_ref().unwrap().update, UpdateMode::No);
    ci = ci.update(UpdateMode::Always);
    let e = ci.build().unwrap_err();
    assert!(e.message.contains("CI is set"), "{}", e.message);
}
