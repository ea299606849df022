//! `quantgate diff`: golden changes classed for a reviewer, on this
//! repository's real goldens (two folders, two revisions, two `--json`
//! runs).

use super::*;

/// `dst` made a copy of the folder `src`.
fn copy_tree(src: &Path, dst: &Path) {
    for e in walkdir::WalkDir::new(src) {
        let e = e.unwrap();
        let to = dst.join(e.path().strip_prefix(src).unwrap());
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&to).unwrap();
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

/// `quantgate --suites SUITES diff ARGS…` in `dir`.
fn diff(dir: &Path, suites: &Path, args: &[&str]) -> (i32, String, String) {
    output(
        Command::new(env!("CARGO_BIN_EXE_quantgate"))
            .current_dir(dir)
            .arg("--suites")
            .arg(suites)
            .arg("diff")
            .args(args)
            .env_remove("QUANTGATE_SUITES"),
    )
}

/// Golden `rel`'s metric `name` under `dir` set to `f(old)`.
fn set_metric(dir: &Path, rel: &str, name: &str, f: impl Fn(f64) -> f64) -> f64 {
    let path = dir.join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("{rel}: {name}"))
        .to_string();
    let old: f64 = line.split_once(": ").unwrap().1.parse().unwrap();
    std::fs::write(
        &path,
        text.replacen(&line, &format!("  {name}: {:?}", f(old)), 1),
    )
    .unwrap();
    old
}

const Q8: &str = "ppl/delta_nll/smollm2-q8_0.snap";

/// Two folders of this repository's goldens, one changed step by step:
/// a metric within its tolerance is within noise (exit 0); beyond it,
/// moved (exit 1, or 0 with `--fail-on flipped`); a gate whose verdict
/// changed, flipped (exit 1 either way); a deleted golden is removed and a
/// new case's golden added. Each row names its case, model and metric (and
/// what the kind calls it); the Markdown holds the summary line, the table
/// of what moved or flipped and the rest folded; the JSON the same counts.
#[test]
fn golden_changes_are_classed_by_their_declared_noise() {
    let root = fresh_dir("diff");
    let (old, new) = (root.join("old"), root.join("new"));
    copy_tree(&repo().join("goldens"), &old);
    copy_tree(&repo().join("goldens"), &new);
    let suites = repo().join("suites");
    let run = |args: &[&str]| {
        let mut all = vec![old.to_str().unwrap(), new.to_str().unwrap()];
        all.extend(args);
        diff(&root, &suites, &all)
    };
    let (code, stdout, stderr) = run(&[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("0 flipped, 0 moved, 0 within noise, 0 added, 0 removed"),
        "{stdout}"
    );

    // Within the case's tolerance (rtol 1e-6): within noise.
    let ppl = set_metric(&new, Q8, "ppl", |v| v * (1.0 + 1e-7));
    let (code, stdout, _) = run(&[]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("0 moved, 1 within noise"), "{stdout}");
    assert!(
        stdout.contains("within noise  ppl/delta_nll::smollm2-q8_0  `ppl` (PPL)"),
        "{stdout}"
    );

    // Beyond it: moved, exit 1; `--fail-on flipped` lets it pass.
    set_metric(&new, Q8, "ppl", |_| ppl * 1.01);
    let (code, stdout, _) = run(&[]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("moved         ppl/delta_nll::smollm2-q8_0  `ppl` (PPL)"),
        "{stdout}"
    );
    assert_eq!(run(&["--fail-on", "flipped"]).0, 0);

    // A gate's verdict changed: flipped, first, and fails either way.
    let q8 = new.join(Q8);
    let text = std::fs::read_to_string(&q8).unwrap();
    std::fs::write(
        &q8,
        text.replace("status: pass", "status: fail")
            .replace("delta_nll_mean ≤ 0.05: pass", "delta_nll_mean ≤ 0.05: fail"),
    )
    .unwrap();
    let (code, stdout, _) = run(&["--fail-on", "flipped"]);
    assert_eq!(code, 1, "{stdout}");
    let first = stdout.lines().nth(1).unwrap();
    assert!(
        first.starts_with("flipped") && first.contains("ppl/delta_nll::smollm2-q8_0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("gate `delta_nll_mean ≤ 0.05`  pass → fail"),
        "{stdout}"
    );

    // A golden deleted, a new case's golden added.
    std::fs::remove_file(new.join("kld/wikitext2/smollm2-q8_0.snap")).unwrap();
    std::fs::create_dir_all(new.join("ppl/another")).unwrap();
    std::fs::copy(old.join(Q8), new.join("ppl/another/smollm2-q8_0.snap")).unwrap();
    let (code, stdout, _) = run(&[]);
    assert_eq!(code, 1);
    assert!(
        stdout.contains("removed       kld/wikitext2::smollm2-q8_0  the test  pass → –"),
        "{stdout}"
    );
    assert!(
        stdout.contains("added         ppl/another::smollm2-q8_0  the test  – → pass"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 flipped, 1 moved, 0 within noise, 1 added, 1 removed"),
        "{stdout}"
    );

    // The pull request comment: the summary line, the table worst first,
    // the folded rest.
    set_metric(&new, "ppl/delta_nll/smollm2-q6_k.snap", "ppl", |v| {
        v * (1.0 + 1e-7)
    });
    let (code, md, _) = run(&["--format", "markdown"]);
    assert_eq!(code, 1);
    assert!(
        md.contains("2 flipped, 1 moved, 1 within noise, 1 added, 1 removed"),
        "{md}"
    );
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
    assert!(
        rows[1].starts_with("| ✗ flipped | `ppl/delta_nll::smollm2-q8_0`"),
        "{md}"
    );
    assert!(
        md.contains("<details>\n<summary>1 within noise</summary>")
            && md.contains("| `ppl/delta_nll::smollm2-q6_k` | `ppl` (PPL) |"),
        "{md}"
    );
    // The same as data.
    let (_, json, _) = run(&["--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for (class, n) in [
        ("flipped", 2),
        ("moved", 1),
        ("within_noise", 1),
        ("added", 1),
        ("removed", 1),
    ] {
        assert_eq!(v["counts"][class], n, "{class}: {json}");
    }
    let moved = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["class"] == "moved")
        .unwrap();
    assert_eq!(moved["case"], "ppl/delta_nll");
    assert_eq!(moved["item"]["name"], "ppl");
    assert_eq!(moved["old"], ppl);
    // A golden that does not parse: exit 2, naming it and its line.
    std::fs::write(new.join(Q8), "---\nnot a golden\n").unwrap();
    let (code, _, stderr) = run(&[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("ppl/delta_nll/smollm2-q8_0.snap:2"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Revisions of a git repository holding this one's suites and goldens:
/// BASE..HEAD is compared, a changed golden that no commit message of the
/// range names is flagged and one that is named is not; the working tree
/// is HEAD by default, its uncommitted goldens flagged; with no BASE the
/// merge-base with origin/main is the base, and without origin/main, or
/// with a revision that does not exist, the command exits 2 saying so.
#[test]
fn revisions_are_compared_and_an_unexplained_golden_is_flagged() {
    let root = fresh_dir("diff-git");
    copy_tree(&repo().join("suites"), &root.join("suites"));
    copy_tree(&repo().join("goldens"), &root.join("goldens"));
    let git = |args: &[&str]| {
        let (code, out, err) = output(
            Command::new("git")
                .current_dir(&root)
                .args(args)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@example.com")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@example.com"),
        );
        assert_eq!(code, 0, "git {args:?}: {out}{err}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "suites and goldens"]);
    let suites = root.join("suites");
    let run = |args: &[&str]| diff(&root, &suites, args);

    // No BASE and no origin/main; a revision that does not exist.
    let (code, _, stderr) = run(&[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("origin/main"), "{stderr}");
    let (code, _, stderr) = run(&["no-such-rev", "HEAD"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("`no-such-rev` is not a revision"),
        "{stderr}"
    );

    // A golden moved in a commit whose message does not name it.
    set_metric(&root.join("goldens"), Q8, "ppl", |v| v * 1.01);
    git(&["commit", "-q", "-am", "A change"]);
    let (code, stdout, _) = run(&["HEAD~1", "HEAD"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("moved         ppl/delta_nll::smollm2-q8_0  `ppl` (PPL)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("unexplained: goldens/{Q8}: no commit message")),
        "{stdout}"
    );
    // One whose message names it.
    set_metric(&root.join("goldens"), Q8, "ppl", |v| v * 1.01);
    git(&[
        "commit",
        "-q",
        "-am",
        "Re-recorded goldens/ppl/delta_nll (the new build moves PPL)",
    ]);
    let (code, stdout, _) = run(&["HEAD~1", "HEAD"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(!stdout.contains("unexplained"), "{stdout}");

    // The working tree by default, its change not committed.
    let head = set_metric(&root.join("goldens"), Q8, "ppl", |v| v * (1.0 + 1e-7));
    let (code, stdout, _) = run(&["HEAD"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("→ the working tree"), "{stdout}");
    assert!(
        stdout.contains(&format!("unexplained: goldens/{Q8}: not committed")),
        "{stdout}"
    );
    set_metric(&root.join("goldens"), Q8, "ppl", |_| head);

    // With origin/main, no BASE is its merge-base with HEAD: the first
    // commit here. One message of the range names the golden: explained.
    git(&["update-ref", "refs/remotes/origin/main", "HEAD~2"]);
    let (code, md, _) = run(&["--format", "markdown"]);
    assert_eq!(code, 1, "{md}");
    assert!(md.contains("0 flipped, 1 moved"), "{md}");
    assert!(!md.contains("no explanation"), "{md}");
    let _ = std::fs::remove_dir_all(&root);
}

/// Two `--json` results of `quantgate run`: a run against itself is
/// unchanged (exit 0); the same case over more windows has moved.
#[test]
fn two_runs_json_results_are_compared() {
    let root = suites("diff-json");
    std::fs::write(root.join("ppl/a.toml"), case(128, "")).unwrap();
    let json = |name: &str| root.join(name).to_str().unwrap().to_string();
    let (code, _, stderr) = quantgate(&root, &["run", "--threads", "1", "--json", &json("a.json")]);
    assert_eq!(code, 0, "{stderr}");
    std::fs::write(
        root.join("ppl/a.toml"),
        case(128, "").replace("chunks = 2", "chunks = 3"),
    )
    .unwrap();
    let (code, _, stderr) = quantgate(&root, &["run", "--threads", "1", "--json", &json("b.json")]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = diff(&root, &root, &[&json("a.json"), &json("a.json")]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("1 model × 1 case: 0 flipped, 0 moved"),
        "{stdout}"
    );
    let (code, stdout, _) = diff(&root, &root, &[&json("a.json"), &json("b.json")]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("moved         ppl/a::tiny  `windows` (windows)  2 → 3"),
        "{stdout}"
    );
    // A folder against a file: exit 2, naming both.
    let (code, _, stderr) = diff(&root, &root, &[&json("a.json"), "HEAD"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("one side is a git revision"), "{stderr}");
    let _ = std::fs::remove_dir_all(&root);
}
