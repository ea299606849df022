//! `quantgate run`: exit codes (0 pass, 1 a case failed, 2 unusable input), messages that name the file and key, and the `--json` objects.

use super::*;

#[test]
fn passing_run_writes_json_and_exits_zero() {
    let root = suites("pass");
    std::fs::write(
        root.join("ppl/ok.toml"),
        case(128, "[[gate]]\nmetric = \"ppl\"\nmax = 1000\n"),
    )
    .unwrap();
    let json = root.join("out.json");
    let (code, stdout, stderr) = run(&root, &["--json", json.to_str().unwrap(), "--timings"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ppl/ok::tiny") && stdout.contains("pass"),
        "{stdout}"
    );
    assert!(stdout.contains("measure%"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let o = &v[0];
    assert_eq!(o["case"], "ppl/ok");
    assert_eq!(o["model"], "tiny");
    assert_eq!(o["status"], "pass");
    assert_eq!(o["metrics"]["windows"], 2.0);
    assert_eq!(o["metrics"]["tokens_scored"], 2.0 * 63.0);
    assert!(o["metrics"]["ppl"].as_f64().unwrap() > 1.0);
    assert_eq!(o["gates"][0]["metric"], "ppl");
    assert_eq!(o["gates"][0]["passed"], true);
    assert_eq!(o["settings"]["n_batch"], 128);
    assert_eq!(o["settings"]["flash_attn"], false);
    assert_eq!(o["build"]["llama_cpp_sys_2"], "0.1.161");
}

#[test]
fn gate_violation_exits_one_with_the_numbers() {
    let root = suites("gate");
    std::fs::write(
        root.join("ppl/strict.toml"),
        case(128, "[[gate]]\nmetric = \"ppl\"\nmax = 1.5\n"),
    )
    .unwrap();
    let (code, stdout, _) = run(&root, &[]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("FAIL") && stdout.contains("violates ppl ≤ 1.5 (max 1.5)"),
        "{stdout}"
    );
}

#[test]
fn n_ctx_beyond_training_context_is_unusable_input() {
    let root = suites("ctx");
    std::fs::write(root.join("ppl/big.toml"), case(16384, "")).unwrap();
    let (code, stdout, _) = run(&root, &[]);
    assert_eq!(code, 2, "{stdout}");
    assert!(stdout.contains("big.toml:7:8: window: context 16384 is larger than the training context 8192 of model `tiny`"), "{stdout}");
}

/// Each bad input: (what, file body or registry edit, expected message part).
#[test]
fn bad_inputs_exit_two_and_name_file_and_key() {
    let good = case(128, "");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "malformed",
            "kind = \"perplexity\"\nmodels = [\"tiny\"\n".into(),
            "malformed.toml:2:",
        ),
        (
            "unknown",
            good.replace("chunks = 2", "chunks = 2\nn_ctxx = 3"),
            "unknown.toml:10:1: window.n_ctxx: unknown key `n_ctxx` (did you mean `n_ctx`?)",
        ),
        (
            "missing",
            good.replace("mode = \"llama-perplexity\"\n", ""),
            "missing.toml:6:1: window: missing key `mode`",
        ),
        (
            "nan",
            good.clone() + "[[gate]]\nmetric = \"ppl\"\nmax = nan\n",
            "nan.toml:12:7: gate[0].max: `nan` is not a finite number",
        ),
        (
            "inf",
            good.clone() + "[[gate]]\nmetric = \"ppl\"\nmin = -inf\n",
            "inf.toml:12:7: gate[0].min: `-inf` is not a finite number",
        ),
        (
            "alias",
            good.replace("[\"tiny\"]", "[\"tinny\"]"),
            "alias.toml:2:11: models: model alias `tinny` is not in",
        ),
        (
            "textpin",
            good.replace("d790b833", "0790b833"),
            "textpin.toml:5:10: text.sha256:",
        ),
        (
            "duplicate",
            good.replace("chunks = 2", "chunks = 2\nchunks = 3"),
            "duplicate.toml:10:1:",
        ),
        (
            "wrongtype",
            good.replace("chunks = 2", "chunks = \"two\""),
            "wrongtype.toml:9:10: window.chunks: invalid type",
        ),
    ];
    for (name, body, want) in cases {
        let root = suites(name);
        std::fs::write(root.join(format!("ppl/{name}.toml")), &body).unwrap();
        std::fs::write(root.join("ppl/fine.toml"), case(128, "")).unwrap();
        let (code, stdout, stderr) = run(&root, &[]);
        assert_eq!(code, 2, "{name}: {stdout}\n{stderr}");
        assert!(
            stdout.contains(want),
            "{name}: expected {want:?} in\n{stdout}"
        );
        // The good case beside it still ran.
        assert!(
            stdout.contains("ppl/fine::tiny") && stdout.contains("pass"),
            "{name}: {stdout}"
        );
    }
}

#[test]
fn registry_and_model_file_problems_exit_two() {
    let fixture = fixture_path();
    // sha256 mismatch: a copy of the first 1 MiB of the model pinned by the real hash.
    let root = suites("sha");
    let part = root.join("part.gguf");
    std::fs::write(&part, &std::fs::read(&fixture).unwrap()[..1 << 20]).unwrap();
    std::fs::write(root.join("ppl/c.toml"), case(128, "")).unwrap();
    let reg = std::fs::read_to_string(root.join("models.toml")).unwrap();
    std::fs::write(
        root.join("models.toml"),
        reg.replace(&fixture.display().to_string(), "part.gguf"),
    )
    .unwrap();
    let (code, stdout, _) = run(&root, &[]);
    assert_eq!(code, 2, "{stdout}");
    assert!(stdout.contains("model `tiny`: sha256 mismatch"), "{stdout}");
    // Truncated GGUF pinned by its own hash: the preflight stops it.
    let sha = quantgate::core::fsutil::sha256_file(&part, |_| {})
        .unwrap()
        .0;
    std::fs::write(
        root.join("models.toml"),
        format!("[tiny]\nsha256 = \"{sha}\"\npath = \"part.gguf\"\n"),
    )
    .unwrap();
    let (code, stdout, _) = run(&root, &[]);
    assert_eq!(code, 2, "{stdout}");
    assert!(
        stdout.contains("part.gguf: not a usable GGUF file"),
        "{stdout}"
    );
    // Missing file.
    std::fs::remove_file(&part).unwrap();
    let (code, stdout, _) = run(&root, &[]);
    assert_eq!(code, 2, "{stdout}");
    assert!(stdout.contains("part.gguf does not exist"), "{stdout}");
    // A registry that does not parse fails the whole run, naming the file.
    std::fs::write(root.join("models.toml"), "[tiny]\nsha = 1\n").unwrap();
    let (code, _, stderr) = run(&root, &[]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("models.toml:2:1: tiny.sha: unknown key `sha`"),
        "{stderr}"
    );
}

#[test]
fn glob_matching_nothing_exits_two() {
    let root = suites("glob");
    std::fs::write(root.join("ppl/c.toml"), case(128, "")).unwrap();
    let (code, _, stderr) = run(&root, &["nothing/*.toml"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("no test cases found: scanned")
            && stderr.contains("with pattern 'nothing/*.toml'"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&root, &["--model", "nosuch"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("model alias `nosuch` is not in"),
        "{stderr}"
    );
}

fn ids_case(ids_sha: &str, window: &str) -> String {
    format!(
        "kind = \"perplexity\"\nmodels = [\"tiny\"]\n[tokens]\npath = \"ids.txt\"\nsha256 = \"{ids_sha}\"\n[window]\n{window}\n"
    )
}

#[test]
fn token_id_and_window_problems_exit_two_naming_file_and_value() {
    let resets = "mode = \"resets\"\nlength = 8\nstarts = [0, 8]";
    let cases: Vec<(&str, &str, String, &str)> = vec![
        (
            "vocab",
            "1 2 3\n4 49152 5\n",
            resets.into(),
            "ids.txt:2:3: token id 49152 is not below the vocabulary size 49152 of model `tiny`",
        ),
        (
            "nonint",
            "1 2 3\n4 five 6\n",
            resets.into(),
            "ids.txt:2:3: `five` is not a token id",
        ),
        (
            "short",
            "1 2 3 4 5 6 7 8 9 10 11 12\n",
            resets.into(),
            "the window at start 8 needs ids 8..=16, so at least 17 ids; the file has 12",
        ),
        (
            "zero",
            "1 2 3\n",
            "mode = \"resets\"\nlength = 8\nstarts = []".into(),
            "window.starts: list at least one start (zero windows)",
        ),
        (
            "stride",
            "1 2 3\n",
            "mode = \"strided\"\nn_ctx = 64\nstride = 128".into(),
            "window.stride: 128 must be between 1 and n_ctx (64)",
        ),
        (
            "chunks",
            "1 2 3\n",
            "mode = \"llama-perplexity\"\nn_ctx = 64\nchunks = 0".into(),
            "window.chunks: must be ≥ 1 (zero windows)",
        ),
        (
            "modekey",
            "1 2 3\n",
            "mode = \"resets\"\nlength = 8\nstarts = [0]\nstride = 4".into(),
            "window.stride: not used by mode = \"resets\"",
        ),
    ];
    for (name, ids, window, want) in cases {
        let root = suites(name);
        std::fs::write(root.join("ppl/ids.txt"), ids).unwrap();
        let sha = quantgate::core::fsutil::sha256_bytes(ids.as_bytes());
        std::fs::write(
            root.join(format!("ppl/{name}.toml")),
            ids_case(&sha, &window),
        )
        .unwrap();
        let (code, stdout, stderr) = run(&root, &[]);
        assert_eq!(code, 2, "{name}: {stdout}\n{stderr}");
        assert!(
            stdout.contains(want),
            "{name}: expected {want:?} in\n{stdout}"
        );
    }
}

#[test]
fn a_record_for_other_tokens_is_refused() {
    let root = suites("record");
    let ids: String = (1..=40).map(|i| format!("{}\n", 100 + i)).collect();
    std::fs::write(root.join("ppl/ids.txt"), &ids).unwrap();
    let sha = quantgate::core::fsutil::sha256_bytes(ids.as_bytes());
    let case = ids_case(&sha, "mode = \"resets\"\nlength = 8\nstarts = [0, 8]");
    std::fs::write(root.join("ppl/c.toml"), &case).unwrap();
    // Export a record, then change the windows: the record no longer fits.
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .arg("--suites")
        .arg(&root)
        .args(["reference", "export"])
        .arg(root.join("ppl/c.toml"))
        .args(["--model", "tiny", "--out"])
        .arg(root.join("ppl/rec.jsonl"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = std::fs::read(root.join("ppl/rec.jsonl")).unwrap();
    assert_eq!(String::from_utf8_lossy(&rec).lines().count(), 1 + 16);
    let rsha = quantgate::core::fsutil::sha256_bytes(&rec);
    let with_record = |starts: &str| {
        ids_case(
            &sha,
            &format!("mode = \"resets\"\nlength = 8\nstarts = {starts}"),
        ) + &format!("[reference_record]\npath = \"rec.jsonl\"\nsha256 = \"{rsha}\"\n")
    };
    std::fs::write(root.join("ppl/c.toml"), with_record("[0, 8]")).unwrap();
    let (code, stdout, _) = run(&root, &[]);
    assert_eq!(code, 0, "{stdout}");
    // The table: the case's header names the columns, the row holds the values.
    let head: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("ppl/c ") && l.contains("delta_nll_mean"))
        .unwrap_or_else(|| panic!("{stdout}"))
        .split_whitespace()
        .collect();
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("ppl/c::"))
        .unwrap()
        .split_whitespace()
        .collect();
    let at = head.iter().position(|h| *h == "delta_nll_mean").unwrap();
    assert_eq!(row[at], "0", "{stdout}");
    std::fs::write(root.join("ppl/c.toml"), with_record("[0, 16]")).unwrap();
    let (code, stdout, _) = run(&root, &[]);
    assert_eq!(code, 2, "{stdout}");
    assert!(
        stdout.contains("rec.jsonl:1: the record scores token stream"),
        "{stdout}"
    );
}

/// One hostile GGUF among `--model './mix/*.gguf'` (README's form, `./`
/// and all) fails only its own tests: a norm epsilon of −1 (which llama.cpp
/// asserts on) is an input error naming the key, found by the preflight
/// before llama.cpp sees it; an expert count llama.cpp aborts on
/// (GGML_ASSERT, SIGABRT: the preflight does not check it) kills only its
/// worker process, and its test says so with llama.cpp's last words. The
/// good model's verdict, the table and `--json` are all still written.
/// Before: exit 134, no table, no `--json`, every verdict lost.
#[test]
fn a_hostile_gguf_in_a_model_glob_fails_only_its_own_tests() {
    use common::gguf_edit;
    let root = suites("hostile");
    std::fs::write(root.join("ppl/ok.toml"), case(128, "")).unwrap();
    let mix = root.join("mix");
    std::fs::create_dir_all(&mix).unwrap();
    let good = std::fs::read(fixture_path()).unwrap();
    std::fs::write(mix.join("a-good.gguf"), &good).unwrap();
    let mut eps = good.clone();
    gguf_edit::set_f32(&mut eps, "llama.attention.layer_norm_rms_epsilon", -1.0);
    std::fs::write(mix.join("b-eps.gguf"), &eps).unwrap();
    let moe = gguf_edit::with_u32(&good, "llama.expert_used_count", 1);
    std::fs::write(mix.join("c-moe.gguf"), &moe).unwrap();
    drop((good, eps, moe));
    let json = root.join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .current_dir(&root)
        .args(["--suites", "."])
        .args([
            "run",
            "--threads",
            "1",
            "ppl/ok.toml",
            "--model",
            "./mix/*.gguf",
        ])
        .arg("--json")
        .arg(&json)
        .env_remove("QUANTGATE_ISOLATION")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // An input error among the outcomes: exit 2 (not 134).
    assert_eq!(
        out.status.code(),
        Some(2),
        "{stdout}
{stderr}"
    );
    let outcomes: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let by_model = |m: &str| {
        outcomes
            .iter()
            .find(|o| o["model"] == m)
            .unwrap_or_else(|| panic!("no outcome for {m}: {outcomes:?}"))
    };
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert_eq!(by_model("a-good")["status"], "pass", "{stderr}");
    assert!(by_model("a-good")["metrics"]["ppl"].as_f64().unwrap() > 1.0);
    let eps = by_model("b-eps");
    assert_eq!(eps["status"], "error");
    let why = eps["error"].as_str().unwrap();
    assert!(
        why.contains("`llama.attention.layer_norm_rms_epsilon` = -1") && why.contains("b-eps.gguf"),
        "{why}"
    );
    let moe = by_model("c-moe");
    assert_eq!(moe["status"], "error");
    let why = moe["error"].as_str().unwrap();
    assert!(
        why.contains("the worker process for model `c-moe`")
            && why.contains("c-moe.gguf")
            && why.contains("killed by signal 6 (SIGABRT)")
            && why.contains("`ppl/ok::c-moe`")
            && why.contains("GGML_ASSERT"),
        "{why}"
    );
    // The table names all three.
    for m in ["a-good", "b-eps", "c-moe"] {
        assert!(stdout.contains(m), "{m} missing from the table:\n{stdout}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Input the hostile-input sweep found taken, each refused before any model
/// loads, exit 2, naming the flag, variable, file or key: `--threads 0`
/// (became 1), a `QUANTGATE_CACHE` that is a file (every trial errored,
/// exit 1), a `models.lock` that is a folder or garbage (exit 1), a case
/// file named `k::one` (reported as case `k`), a model listed twice (ran
/// twice), random bytes named as a model (pinned into `models.lock`
/// first), an unknown `QUANTGATE_ISOLATION`, an unwritable `--json`.
#[test]
fn weak_inputs_are_refused_before_running_naming_what_is_wrong() {
    let root = suites("weak");
    std::fs::write(root.join("ppl/ok.toml"), case(128, "")).unwrap();
    let refused = |envs: &[(&str, &str)], args: &[&str], says: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_quantgate"));
        c.arg("--suites").arg(&root).args(args);
        for (k, v) in envs {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let at = err.find(says);
        assert!(at.is_some(), "{args:?}: wanted `{says}` in:\n{err}");
        assert!(
            at < Some(err.find("quantgate: running").unwrap_or(usize::MAX)),
            "said only after running: {err}"
        );
    };
    refused(
        &[],
        &["run", "--threads", "0"],
        "--threads 0: give at least 1",
    );
    let file = root.join("ppl/ok.toml");
    refused(
        &[("QUANTGATE_CACHE", file.to_str().unwrap())],
        &["run", "ppl/ok.toml"],
        "QUANTGATE_CACHE=",
    );
    refused(
        &[("QUANTGATE_ISOLATION", "sometimes")],
        &["run", "ppl/ok.toml"],
        "QUANTGATE_ISOLATION: `sometimes` is not one of off, model, group, test",
    );
    refused(
        &[],
        &[
            "run",
            "ppl/ok.toml",
            "--json",
            file.join("a.json").to_str().unwrap(),
        ],
        "is not a directory",
    );
    // Random bytes named as a model: refused, and never pinned.
    let junk = root.join("junk.gguf");
    std::fs::write(&junk, [7u8; 4096]).unwrap();
    refused(
        &[],
        &["run", "ppl/ok.toml", "--model", junk.to_str().unwrap()],
        "junk.gguf",
    );
    assert!(
        std::fs::read_to_string(root.join("models.lock")).map_or(true, |l| !l.contains("junk")),
        "random bytes were pinned"
    );
    // A model listed twice in a case; a case file named with `::`.
    std::fs::write(
        root.join("ppl/twice.toml"),
        case(128, "").replace("models = [\"tiny\"]", "models = [\"tiny\", \"tiny\"]"),
    )
    .unwrap();
    refused(
        &[],
        &["run", "ppl/twice.toml"],
        "models: `tiny` is listed twice",
    );
    std::fs::remove_file(root.join("ppl/twice.toml")).unwrap();
    std::fs::write(root.join("ppl/k::one.toml"), case(128, "")).unwrap();
    refused(&[], &["run", "ppl/k::one.toml"], "cannot hold `::`");
    std::fs::remove_file(root.join("ppl/k::one.toml")).unwrap();
    // Multiple choice: more tasks asked for than the file holds (the
    // file's 8 ran silently).
    let mc = quantgate::kinds::multiple_choice::write_binary(
        &quantgate::kinds::multiple_choice::computed_tasks(8, 7),
    );
    std::fs::write(root.join("ppl/mc.bin"), &mc).unwrap();
    std::fs::write(
        root.join("ppl/mc.toml"),
        format!(
            "kind = \"multiple_choice\"\nmodels = [\"tiny\"]\ntasks = 100000\n[tasks_file]\npath = \"mc.bin\"\nsha256 = \"{}\"\n",
            quantgate::core::fsutil::sha256_bytes(&mc)
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = run(&root, &["ppl/mc.toml"]);
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("tasks = 100000, but") && stdout.contains("holds 8 tasks"),
        "{stdout}\n{stderr}"
    );
    std::fs::remove_file(root.join("ppl/mc.toml")).unwrap();
    // A model that is its own only candidate's reference: refused (it
    // was a warning and a vacuous pass), exit 2 naming the reference.
    std::fs::write(
        root.join("ppl/self.toml"),
        case(128, "").replace(
            "models = [\"tiny\"]",
            "models = [\"tiny\"]\nreference = \"tiny\"",
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = run(&root, &["ppl/self.toml"]);
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("self.toml:3:13: reference `tiny` is the candidate `tiny` itself"),
        "{stdout}"
    );
    std::fs::remove_file(root.join("ppl/self.toml")).unwrap();
    // A split file whose parts 2 and 3 swapped names: an input error
    // naming `split.no` (llama.cpp said "null result from llama cpp").
    let split = root.join("split");
    std::fs::create_dir_all(&split).unwrap();
    let parts = quantgate::engine::llama::split_gguf(&fixture_path(), &split, "mine", 3).unwrap();
    let swap = split.join("swap.tmp");
    std::fs::rename(&parts[1], &swap).unwrap();
    std::fs::rename(&parts[2], &parts[1]).unwrap();
    std::fs::rename(&swap, &parts[2]).unwrap();
    let (code, stdout, stderr) = run(
        &root,
        &["ppl/ok.toml", "--model", parts[0].to_str().unwrap()],
    );
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("`split.no` = 2, but it is part 2 of 3"),
        "{stdout}\n{stderr}"
    );
    // models.lock as a folder, then as garbage.
    let lock = root.join("models.lock");
    let _ = std::fs::remove_file(&lock);
    std::fs::create_dir_all(&lock).unwrap();
    refused(&[], &["models"], "models.lock");
    std::fs::remove_dir(&lock).unwrap();
    std::fs::write(&lock, "\u{0}\u{1} not toml [[[").unwrap();
    refused(&[], &["models"], "models.lock");
    let _ = std::fs::remove_dir_all(&root);
}

/// A filter that selects no case × model is an error, not a green run; bad
/// output paths are refused before any model loads, naming the flag.
#[test]
fn empty_selections_and_bad_output_paths_exit_two_before_running() {
    let root = suites("empty");
    std::fs::write(root.join("ppl/ok.toml"), case(128, "")).unwrap();
    // `tiny` is the case's model; `smollm2-q8_0` is registered here but not listed by it.
    let reg = std::fs::read_to_string(root.join("models.toml")).unwrap();
    std::fs::write(
        root.join("models.toml"),
        format!(
            "{reg}\n[other]\nsha256 = \"{}\"\npath = \"nowhere.gguf\"\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = run(&root, &["ppl/ok.toml", "--model", "other"]);
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("nothing to run: ppl/ok.toml with --model other selects no case × model"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&root, &["ppl/ok.toml", "--model", "other", "--allow-empty"]);
    assert_eq!(code, 0, "{stderr}");
    // merge and report: the same selection is the same error (they said
    // "0 passed, 0 failed" and wrote an empty report, exit 0).
    let empty = root.join("no-shards");
    std::fs::create_dir_all(&empty).unwrap();
    let sel = ["--case", "ppl/ok.toml", "--model", "other"];
    let (code, _, stderr) = quantgate(
        &root,
        &[&["merge", empty.to_str().unwrap()], &sel[..]].concat(),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("nothing to merge: ppl/ok.toml with --model other selects no case × model"),
        "{stderr}"
    );
    let (code, _, stderr) = quantgate(
        &root,
        &[
            &["merge", empty.to_str().unwrap()],
            &sel[..],
            &["--allow-empty"],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{stderr}");
    let report_dir = root.join("report");
    let (code, _, stderr) = quantgate(
        &root,
        &[
            "report",
            "ppl/ok.toml",
            "--model",
            "other",
            "--out",
            report_dir.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("nothing to report: ppl/ok.toml with --model other"),
        "{stderr}"
    );
    assert!(!report_dir.exists(), "an empty report was written");
    let empty_json = root.join("empty.json");
    std::fs::write(&empty_json, "[]").unwrap();
    let (code, _, stderr) = quantgate(
        &root,
        &[
            "report",
            "--json",
            empty_json.to_str().unwrap(),
            "--out",
            report_dir.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("hold no outcome"), "{stderr}");
    let (code, _, stderr) = run(&root, &["--json", root.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--json") && stderr.contains("is a directory"),
        "{stderr}"
    );
    assert!(!stderr.contains("running"), "ran before refusing: {stderr}");
    let file = root.join("ppl/ok.toml");
    let (code, _, stderr) = run(&root, &["--out", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--out") && stderr.contains("not a directory"),
        "{stderr}"
    );
}

/// The preflight accounts for every byte of the real fixtures' tensor data
/// (so its per-type sizes are ggml's), and a fixture cut short — its true
/// sha256 pinned — is stopped by it, naming a tensor, before llama.cpp.
#[test]
fn the_preflight_checks_every_tensor_lies_within_the_file() {
    for alias in [
        "smollm2-q4_1",
        "smollm2-f16",
        "smollm2-q4_k_m",
        "smollm2-q2_k",
    ] {
        let v = common::registry_model(alias);
        let h = quantgate::models::gguf::preflight(&v.file.path).unwrap();
        assert_eq!(
            h.data_end, v.bytes,
            "{alias}: tensor data ends before the file does"
        );
    }
    let full = std::fs::read(fixture_path()).unwrap();
    let root = suites("truncated");
    let cut = &full[..full.len() * 6 / 10];
    std::fs::write(root.join("cut.gguf"), cut).unwrap();
    let e = quantgate::models::gguf::preflight(&root.join("cut.gguf")).unwrap_err();
    assert!(
        e.message
            .contains("cut.gguf: not a usable GGUF file: tensor #")
            && e.message.contains("beyond the end of the file"),
        "{}",
        e.message
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// `--threads` beyond the cores is capped, with a warning that says so.
#[test]
fn threads_beyond_the_cores_are_capped_with_a_warning() {
    let root = suites("threads");
    std::fs::write(root.join("ppl/ok.toml"), case(128, "")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .arg("--suites")
        .arg(&root)
        .args(["run", "--threads", "999"])
        .output()
        .unwrap();
    let (code, stdout, stderr) = (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("--threads 999 is more than the") && stderr.contains("cores here"),
        "{stderr}"
    );
}

/// A path pattern names the case under the suites root, even where the same
/// relative path exists in the working directory.
#[test]
fn a_path_pattern_resolves_under_the_suites_root_first() {
    let root = suites("precedence");
    std::fs::write(root.join("ppl/ok.toml"), case(128, "")).unwrap();
    // A look-alike in the working directory that does not even parse.
    let cwd = common::scratch("cli-precedence-cwd");
    std::fs::create_dir_all(cwd.join("ppl")).unwrap();
    std::fs::write(cwd.join("ppl/ok.toml"), "not a case").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .current_dir(&cwd)
        .arg("--suites")
        .arg(&root)
        .args(["run", "--threads", "1", "ppl/ok.toml"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ppl/ok::tiny") && stdout.contains("pass"),
        "{stdout}"
    );
}

/// A case can name local files itself (`models = ["path:…"]`, relative to
/// the case file, globs allowed): they are pinned beside the registry on
/// the first plan, listed by `quantgate models`, and a pattern that matches
/// nothing is an error at the case's line and column.
#[test]
fn a_case_names_local_files_by_path() {
    let root = fresh_dir("pathcase");
    let suites = root.join("suites");
    std::fs::create_dir_all(suites.join("ppl")).unwrap();
    std::fs::create_dir_all(root.join("mine")).unwrap();
    std::fs::write(suites.join("models.toml"), "").unwrap();
    std::fs::copy(fixture_path(), root.join("mine/tiny q4_1.gguf")).unwrap();
    std::fs::copy(
        repo().join("suites/data/wikitext-2-test.txt"),
        suites.join("ppl/wiki.txt"),
    )
    .unwrap();
    std::fs::write(
        suites.join("ppl/mine.toml"),
        case(64, "").replace(
            "models = [\"tiny\"]",
            "models = [\"path:../../mine/*.gguf\"]",
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = run(&suites, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("ppl/mine::tiny-q4_1"), "{stdout}");
    let lock = quantgate::models::local::Lock::load(&suites.join("models.lock")).unwrap();
    assert_eq!(
        lock.entries["tiny-q4_1"].sha256,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    let (code, stdout, _) = quantgate(&suites, &["models"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("tiny-q4_1") && stdout.contains("pinned in models.lock"),
        "{stdout}"
    );
    std::fs::write(
        suites.join("ppl/mine.toml"),
        case(64, "").replace(
            "models = [\"tiny\"]",
            "models = [\"path:../../mine/*.bin\"]",
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = run(&suites, &[]);
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("suites/ppl/mine.toml:2:11: models:") && stdout.contains("matches no file"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A run whose executable is rebuilt or removed while it runs (a `cargo
/// build` during a long `cargo test`) still starts its workers: a worker is
/// the running build itself (`/proc/self/exe`), not whatever the path holds
/// now. Before, every worker failed to start ("No such file or directory").
#[cfg(target_os = "linux")]
#[test]
fn workers_start_from_the_running_build_when_its_file_is_gone() {
    let root = suites("exe-gone");
    std::fs::write(
        root.join("ppl/ok.toml"),
        case(128, "[[gate]]\nmetric = \"ppl\"\nmax = 1000\n"),
    )
    .unwrap();
    let bin = fresh_dir("exe-gone-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("quantgate");
    std::fs::copy(env!("CARGO_BIN_EXE_quantgate"), &exe).unwrap();
    let child = Command::new(&exe)
        .arg("--suites")
        .arg(&root)
        .args(["run", "--threads", "1"])
        .env("QUANTGATE_ISOLATION", "group")
        .env("QUANTGATE_RESULT_CACHE", "off")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // spawn returns once the child has exec'd; its workers start after it
    // has planned and hashed the model, long after the file is gone.
    std::fs::remove_file(&exe).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ppl/ok::tiny") && stdout.contains("pass"),
        "{stdout}"
    );
    assert!(!stdout.contains("starting the worker"), "{stdout}");
}

/// One source for the suites folder: `--suites`, else `QUANTGATE_SUITES`
/// (the variable `gate!()` reads), else `suites` in the working directory.
/// Before, the command line ignored the variable.
#[test]
fn the_suites_folder_is_the_flag_else_the_variable() {
    let root = suites("suites-var");
    std::fs::write(
        root.join("ppl/ok.toml"),
        case(128, "[[gate]]\nmetric = \"ppl\"\nmax = 1000\n"),
    )
    .unwrap();
    let elsewhere = fresh_dir("suites-var-cwd");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let bin = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_quantgate"));
        c.current_dir(&elsewhere);
        c
    };
    // The variable alone names the folder.
    let (code, stdout, stderr) = output(
        bin()
            .args(["run", "--threads", "1"])
            .env("QUANTGATE_SUITES", &root),
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("ppl/ok::tiny"), "{stdout}");
    // The flag wins over the variable (here a folder with no cases).
    let (code, stdout, stderr) = output(
        bin()
            .arg("--suites")
            .arg(&root)
            .args(["run", "--threads", "1"])
            .env("QUANTGATE_SUITES", &elsewhere),
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("ppl/ok::tiny"), "{stdout}");
    // Neither: `suites` in the working directory, which holds none here.
    let (code, _, stderr) = output(
        bin()
            .args(["run", "--threads", "1"])
            .env_remove("QUANTGATE_SUITES"),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("suites"), "{stderr}");
    // A variable naming no folder is refused, named.
    let (code, _, stderr) = output(
        bin()
            .args(["run", "--threads", "1"])
            .env("QUANTGATE_SUITES", elsewhere.join("nothing")),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("QUANTGATE_SUITES"), "{stderr}");
}

/// On a terminal, one board draws the run: an overall bar (tests done of
/// all, with an ETA, and what runs) and the bars of the decodes in flight,
/// the workers' sent to it on their stdout rather than drawn over each
/// other; the per-group lines of a log are not printed there. Off a
/// terminal the lines stay and nothing is drawn. (util-linux's `script`
/// gives the run a pseudo-terminal.)
#[test]
fn a_run_on_a_terminal_draws_one_board_with_the_workers_bars() {
    let root = suites("board");
    // Long enough that a worker's decode bar is drawn (a board draws at
    // most 20 times a second), and decoded: a cache of its own, as the
    // scores of these windows, kept by another run, are not decoded again.
    for (name, n_ctx) in [("a", 256), ("b", 128)] {
        std::fs::write(
            root.join(format!("ppl/{name}.toml")),
            case(n_ctx, "[[gate]]\nmetric = \"ppl\"\nmax = 1000\n")
                .replace("chunks = 2", "chunks = 6"),
        )
        .unwrap();
    }
    let log = root.join("pty.log");
    let cmd = format!(
        "{} --suites {} run --threads 2 --no-cache",
        env!("CARGO_BIN_EXE_quantgate"),
        root.display()
    );
    let out = Command::new("script")
        .args(["-qec", &cmd])
        .arg(&log)
        .env("COLUMNS", "160")
        .env("QUANTGATE_CACHE", root.join("cache"))
        .output()
        .expect("script (util-linux)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let drawn = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    assert!(drawn.contains("/2 tests"), "no overall bar: {drawn}");
    assert!(drawn.contains("running ppl/"), "{drawn}");
    // A worker's decode bar, drawn by the parent's board.
    assert!(drawn.contains("decode tiny"), "{drawn}");
    assert!(!drawn.contains("quantgate: running"), "{drawn}");
    assert!(
        drawn.contains("ppl/a::tiny") && drawn.contains("ppl/b::tiny"),
        "{drawn}"
    );
    // Off a terminal: the lines, no bar.
    let (code, _, stderr) = run(&root, &["ppl/b", "--no-cache"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("quantgate: running ppl/b::tiny"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("tests") && !stderr.contains('\x1b'),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
