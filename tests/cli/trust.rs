//! Nothing edited, corrupt or measured elsewhere is believed: outcomes, cache entries, speed results, kept scores.

use super::*;

/// A failing case's outcome never becomes a pass by an edit.
/// Keyless: `merge` and `report --json` compute the paired metrics again
/// from the outcome's own per-window series and refuse one that disagrees
/// (delta_nll_mean −0.9 merged into a pass before), and judge every status
/// again (an edited `"status": "pass"` was reported as a pass). With a
/// signing key: every outcome carries a MAC; an edit, even one that keeps
/// the series consistent, or an unsigned file, is refused naming the file.
/// The result cache: an entry edited and sealed again (its trailing sha256
/// recomputed, as anyone can) is not used; the trial runs and fails.
#[test]
fn an_edited_outcome_or_cache_entry_never_becomes_a_pass() {
    let root = suites("forged");
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let f16 = reg.entry("smollm2-f16").unwrap().sha256.clone().unwrap();
    let registry = std::fs::read_to_string(root.join("models.toml")).unwrap();
    std::fs::write(
        root.join("models.toml"),
        format!(
            "{registry}\n[ref]\nsha256 = \"{f16}\"\npath = \"{}\"\n",
            registry_file("smollm2-f16").display()
        ),
    )
    .unwrap();
    // Q4_1 against F16: ΔNLL > 0, so a gate of ≤ −0.5 fails.
    let gate = "reference = \"ref\"\n[[gate]]\nmetric = \"delta_nll_mean\"\nmax = -0.5\n";
    let text = case(128, "").replace("chunks = 2", "chunks = 4");
    let (head, tail) = text.split_once("[text]").unwrap();
    std::fs::write(
        root.join("ppl/paired.toml"),
        format!("{head}{gate}[text]{tail}"),
    )
    .unwrap();
    let cache = root.join("cache");
    let cmd = |key: Option<&str>, args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_quantgate"));
        c.arg("--suites").arg(&root).args(args);
        c.env("QUANTGATE_CACHE", &cache)
            .env("XDG_CONFIG_HOME", root.join("config"))
            .env_remove("QUANTGATE_SIGNING_KEY_FILE");
        match key {
            Some(k) => c.env("QUANTGATE_SIGNING_KEY", k),
            None => c.env_remove("QUANTGATE_SIGNING_KEY"),
        };
        let out = c.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let path = |name: &str| root.join(name).to_str().unwrap().to_string();
    let (code, log) = cmd(
        None,
        &[
            "run",
            "--threads",
            "1",
            "ppl/paired.toml",
            "--json",
            &path("a.json"),
        ],
    );
    assert_eq!(code, 1, "the honest run fails its gate:\n{log}");
    let honest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("a.json")).unwrap()).unwrap();
    assert!(honest[0].get("mac").is_none(), "no key, no MAC");
    let mean = honest[0]["metrics"]["delta_nll_mean"].as_f64().unwrap();
    assert!(mean > 0.0, "{mean}");
    let write = |name: &str, v: &serde_json::Value| {
        std::fs::write(root.join(name), serde_json::to_string_pretty(v).unwrap()).unwrap();
    };
    let sel = ["--case", "ppl/paired.toml"];
    // Keyless, the headline edited: refused by merge and by report --json.
    let mut forged = honest.clone();
    forged[0]["metrics"]["delta_nll_mean"] = (-0.9).into();
    forged[0]["status"] = "pass".into();
    write("forged.json", &forged);
    let (code, log) = cmd(None, &[&["merge", &path("forged.json")], &sel[..]].concat());
    assert_eq!(code, 2, "{log}");
    assert!(
        log.contains("forged.json") && log.contains("delta_nll_mean = -0.9 but its 4 windows give"),
        "{log}"
    );
    let (code, log) = cmd(
        None,
        &[
            "report",
            "--json",
            &path("forged.json"),
            "--out",
            &path("r1"),
        ],
    );
    assert_eq!(code, 2, "{log}");
    assert!(log.contains("disagree with its own per-window"), "{log}");
    // Keyless, only the status edited: judged again, it fails.
    let mut status_only = honest.clone();
    status_only[0]["status"] = "pass".into();
    write("status.json", &status_only);
    let (code, log) = cmd(None, &[&["merge", &path("status.json")], &sel[..]].concat());
    assert_eq!(code, 1, "{log}");
    let (code, log) = cmd(
        None,
        &[
            "report",
            "--json",
            &path("status.json"),
            "--out",
            &path("r2"),
        ],
    );
    assert_eq!(code, 0, "{log}");
    let md = std::fs::read_to_string(root.join("r2/report.md")).unwrap();
    assert!(
        md.contains("**FAIL**") && !md.contains("pass (1 gates)"),
        "{md}"
    );
    // With a key: signed outcomes; a consistent forgery (series and all
    // metrics rewritten, which a keyless merge cannot tell) is refused.
    let key = "0123456789abcdef0123456789abcdef";
    let (code, log) = cmd(
        Some(key),
        &[
            "run",
            "--threads",
            "1",
            "ppl/paired.toml",
            "--json",
            &path("signed.json"),
            "--no-cache",
        ],
    );
    assert_eq!(code, 1, "{log}");
    let signed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("signed.json")).unwrap()).unwrap();
    assert!(signed[0]["mac"]
        .as_str()
        .unwrap()
        .starts_with("hmac-sha256:"));
    let (code, log) = cmd(
        Some(key),
        &[&["merge", &path("signed.json")], &sel[..]].concat(),
    );
    assert_eq!(
        code, 1,
        "the signed, honest outcome merges (and fails):\n{log}"
    );
    let mut consistent = signed.clone();
    let shifted: Vec<f64> = signed[0]["series"]["delta_nll_per_window"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() - 10.0)
        .collect();
    consistent[0]["series"]["delta_nll_per_window"] = serde_json::json!(shifted);
    for m in ["delta_nll_mean", "delta_nll_ci95_lo", "delta_nll_ci95_hi"] {
        let v = signed[0]["metrics"][m].as_f64().unwrap() - 10.0;
        consistent[0]["metrics"][m] = v.into();
    }
    write("consistent.json", &consistent);
    let (code, log) = cmd(
        Some(key),
        &[&["merge", &path("consistent.json")], &sel[..]].concat(),
    );
    assert_eq!(code, 2, "{log}");
    assert!(
        log.contains("consistent.json: item 0: its MAC does not verify"),
        "{log}"
    );
    let (code, log) = cmd(Some(key), &[&["merge", &path("a.json")], &sel[..]].concat());
    assert_eq!(code, 2, "{log}");
    assert!(log.contains("a.json: item 0: carries no MAC"), "{log}");
    let (code, log) = cmd(Some("short"), &["models"]);
    assert_eq!(code, 2, "{log}");
    assert!(
        log.contains("QUANTGATE_SIGNING_KEY: a signing key of 5 bytes is too short"),
        "{log}"
    );
    // The result cache: the keyless run above recorded the trial; its
    // entry forged and sealed again is not taken.
    let results: Vec<PathBuf> = std::fs::read_dir(cache.join("results"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "qgresult"))
        .collect();
    assert_eq!(results.len(), 1, "{results:?}");
    let (code, log) = cmd(None, &["run", "--threads", "1", "ppl/paired.toml"]);
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("result from the result cache"), "{log}");
    let sealed = std::fs::read(&results[0]).unwrap();
    let body = String::from_utf8(sealed[..sealed.len() - 32].to_vec()).unwrap();
    let mut entry: serde_json::Value = serde_json::from_str(&body).unwrap();
    entry["metrics"]["delta_nll_mean"] = (-0.9).into();
    let mut reseal = serde_json::to_vec(&entry).unwrap();
    use sha2::Digest;
    let digest = sha2::Sha256::digest(&reseal);
    reseal.extend_from_slice(&digest);
    std::fs::write(&results[0], &reseal).unwrap();
    let (code, log) = cmd(None, &["run", "--threads", "1", "ppl/paired.toml"]);
    assert_eq!(code, 1, "a forged entry must not pass:\n{log}");
    assert!(
        !log.contains("result from the result cache")
            && log.contains("is unusable (its MAC does not verify"),
        "{log}"
    );
    // `report` from the cache matches the reference by content: the run
    // above recorded the trial again; `ref` pinned to another file (as
    // `models pin` does after a file is replaced) is another reference,
    // and its old result is not reported (it was, matched by alias).
    let (code, log) = cmd(None, &["report", "ppl/paired.toml", "--out", &path("r3")]);
    assert_eq!(code, 0, "the recorded result is reported:\n{log}");
    let q8 = reg.entry("smollm2-q8_0").unwrap().sha256.clone().unwrap();
    std::fs::write(
        root.join("models.toml"),
        format!(
            "{registry}\n[ref]\nsha256 = \"{q8}\"\npath = \"{}\"\n",
            registry_file("smollm2-q8_0").display()
        ),
    )
    .unwrap();
    let (code, log) = cmd(None, &["report", "ppl/paired.toml", "--out", &path("r4")]);
    assert_eq!(code, 2, "{log}");
    assert!(
        log.contains("no verified result in the result cache"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A speed result is measured once per machine: an unchanged rerun takes it
/// from the result cache (the numbers bit for bit, the machine named in
/// `--json`), `--no-cache` measures again, and the same run on fewer CPUs
/// (`taskset -c 0`: another machine as far as speed goes) is not answered
/// from the cache either.
#[test]
fn a_speed_result_is_given_again_only_on_the_machine_that_measured_it() {
    let root = suites("speed-cache");
    std::fs::create_dir_all(root.join("speed")).unwrap();
    std::fs::write(
        root.join("speed/s.toml"),
        "kind = \"speed\"\nmodels = [\"tiny\"]\npp = 16\ntg = 4\nrepetitions = 2\nrounds = 1\n",
    )
    .unwrap();
    let cache = root.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let run_once = |tag: &str, pin_cpu: bool, extra: &[&str]| {
        let json = root.join(format!("{tag}.json"));
        let mut c = if pin_cpu {
            let mut c = Command::new("taskset");
            c.args(["-c", "0", env!("CARGO_BIN_EXE_quantgate")]);
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_quantgate"))
        };
        c.arg("--suites")
            .arg(&root)
            .args(["run", "--threads", "1", "--json", json.to_str().unwrap()])
            .args(extra)
            .env("QUANTGATE_CACHE", &cache)
            .env_remove("QUANTGATE_RESULT_CACHE");
        let out = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{tag}: {stderr}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let cached = stderr.contains("speed/s::tiny: result from the result cache");
        (cached, v[0].clone())
    };
    let (cached, first) = run_once("first", false, &[]);
    assert!(!cached, "nothing was cached yet");
    let machine = first["machine"].as_str().unwrap().to_string();
    assert!(
        machine.starts_with("cpu ") && machine.contains(" cpus | ") && machine.contains("| host "),
        "{machine}"
    );
    assert!(first["metrics"]["tg_tps_mean"].as_f64().unwrap() > 0.0);
    let (cached, again) = run_once("again", false, &[]);
    assert!(cached, "an unchanged rerun measures again");
    assert_eq!(again["metrics"], first["metrics"]);
    assert_eq!(again["machine"], first["machine"]);
    let (cached, forced) = run_once("forced", false, &["--no-cache"]);
    assert!(!cached, "--no-cache took the cached result");
    assert_eq!(forced["machine"], first["machine"]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores > 1 {
        let (cached, pinned) = run_once("one-cpu", true, &[]);
        assert!(
            !cached,
            "a result measured on {cores} CPUs was given on one"
        );
        assert!(pinned["machine"].as_str().unwrap().contains("| 1 cpus |"));
    } else {
        eprintln!("one CPU here: the other-machine half of this test needs two");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A multiple-choice case's scores are kept in the reference store, the
/// reference's as the candidate's: a rerun (`--no-cache`, so not from the
/// result cache) with the reference model's file gone still runs, on the
/// kept scores, and gives bitwise the metrics it gave; with those kept
/// scores corrupted it is an error that names the unusable cache and the
/// missing file, never a result; with the file back it scores again and
/// gives the same metrics.
#[test]
fn multiple_choice_scores_are_kept_and_never_read_back_corrupt() {
    let (suites, link) = reference_suites("mc-kept");
    let root = suites.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(suites.join("mc")).unwrap();
    std::fs::copy(
        repo().join("suites/data/mc-computed.bin"),
        suites.join("mc/tasks.bin"),
    )
    .unwrap();
    let sha = quantgate::core::fsutil::sha256_file(&suites.join("mc/tasks.bin"), |_| {})
        .unwrap()
        .0;
    std::fs::write(
        suites.join("mc/m.toml"),
        format!(
            "kind = \"multiple_choice\"\nmodels = [\"cand\"]\nreference = \"ref\"\nn_ctx = 512\ntasks = 12\n\
             [tasks_file]\npath = \"tasks.bin\"\nsha256 = \"{sha}\"\n"
        ),
    )
    .unwrap();
    let cache = root.join("cache");
    let go = |tag: &str| {
        let json = root.join(format!("{tag}.json"));
        let (code, stdout, stderr) = quantgate_env(
            &suites,
            &[("QUANTGATE_CACHE", &cache)],
            &[
                "run",
                "mc",
                "--threads",
                "1",
                "--no-cache",
                "--json",
                json.to_str().unwrap(),
            ],
        );
        (code, format!("{stdout}\n{stderr}"), json)
    };
    let (code, log, json) = go("first");
    assert_eq!(code, 0, "{log}");
    let first = json_metrics(&json);
    assert_eq!(first[0].1["tasks"].as_f64(), Some(12.0), "{log}");
    let kept: Vec<PathBuf> = std::fs::read_dir(cache.join("reference"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "qgmc"))
        .collect();
    assert_eq!(kept.len(), 2, "the candidate's and the reference's scores");
    // The reference's file gone: the kept scores answer.
    let target = std::fs::read_link(&link).unwrap();
    std::fs::remove_file(&link).unwrap();
    let (code, log, json) = go("kept");
    assert_eq!(code, 0, "{log}");
    assert_eq!(json_metrics(&json), first, "read back bitwise");
    // Corrupt: computed again, which needs the missing file: an error.
    for p in &kept {
        let mut bytes = std::fs::read(p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        std::fs::write(p, bytes).unwrap();
    }
    let (code, log, _) = go("corrupt");
    assert_eq!(code, 2, "{log}");
    assert!(log.contains("is unusable"), "{log}");
    assert!(log.contains("ref.gguf"), "{log}");
    std::os::unix::fs::symlink(target, &link).unwrap();
    let (code, log, json) = go("again");
    assert_eq!(code, 0, "{log}");
    assert_eq!(json_metrics(&json), first, "scored again: the same");
    let _ = std::fs::remove_dir_all(&root);
}
