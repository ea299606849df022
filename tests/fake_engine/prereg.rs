//! Preregistered decision rules on the fake engine: sealing, every tamper
//! case, bad preregs, window counts, rule boundaries, git ordering (in a
//! temporary repository) and the report. Each failure must name the file.

use crate::common;

use quantgate::core::Outcome;
use quantgate::core::Status;
use quantgate::core::Verdict;
use quantgate::engine::fake::{FakeEngine, FakeSpec};
use quantgate::execute::RunContext;
use quantgate::golden::{Goldens, UpdateMode};
use quantgate::harness::run_trial;
use quantgate::judge::prereg::{self, read_ledger, verify_all, NoDecision};
use quantgate::plan::plan;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const RULE: &str = "rule = { win = \"ci95_hi < 0\", loss = \"ci95_lo > 0\" }\n";

fn prereg_text(name: &str, cand: &str, base: &str, windows: usize, prediction: &str) -> String {
    format!(
        "compare = {{ candidate = \"{cand}\", baseline = \"{base}\" }}\n\
         size_rule = \"candidate-not-larger\"\ncase = \"{name}\"\nmetric = \"delta_nll_mean\"\n\
         windows = {windows}\n{RULE}prediction = {prediction}\nnote = \"test\"\n"
    )
}

struct Fx {
    root: PathBuf,
}

impl Fx {
    /// suites/ with models `worse` (smaller file), `better`, `huge` (larger);
    /// a case `NAME` per (name, candidate, baseline, chunks).
    fn new(tag: &str, cases: &[(&str, &str, &str, usize)]) -> Fx {
        let root = common::fake_root(
            &format!("prereg-{tag}"),
            &[("worse", 100), ("better", 200), ("huge", 300)],
        );
        std::fs::create_dir_all(root.join("prereg")).unwrap();
        // 200 bytes: three chunks of 64.
        let text: String = (0..200)
            .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
            .collect();
        std::fs::write(root.join("suites/t.txt"), &text).unwrap();
        let sha = quantgate::core::fsutil::sha256_bytes(text.as_bytes());
        for (name, cand, base, chunks) in cases {
            std::fs::write(
                root.join(format!("suites/{name}.toml")),
                format!(
                    "kind = \"perplexity\"\nmodels = [\"{cand}\"]\nreference = \"{base}\"\n\
                     prereg = \"../prereg/{name}.toml\"\n[text]\npath = \"t.txt\"\nsha256 = \"{sha}\"\n\
                     [window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = {chunks}\n"
                ),
            )
            .unwrap();
        }
        Fx { root }
    }

    fn write_prereg(&self, name: &str, body: &str) -> PathBuf {
        let p = self.root.join(format!("prereg/{name}.toml"));
        std::fs::write(&p, body).unwrap();
        p
    }

    fn engine() -> FakeEngine {
        FakeEngine::new()
            .with(
                "worse",
                FakeSpec {
                    confidence: 6.0,
                    ..FakeSpec::default()
                },
            )
            .with("better", FakeSpec::default())
            .with("huge", FakeSpec::default())
    }

    fn run(&self, name: &str) -> Outcome {
        let (registry, planned) =
            plan(&self.root.join("suites"), &[format!("{name}.toml")], &[]).unwrap();
        let runner = RunContext::new(
            &common::fixture_config(&self.root),
            registry,
            Arc::new(Self::engine()),
            1,
        );
        quantgate::schedule::trial(&runner, &planned[0], &self.root.join("goldens"))
    }

    fn goldens(&self) -> Goldens {
        Goldens::new(self.root.join("goldens"))
    }

    fn record_golden(&self, name: &str) {
        let (registry, planned) =
            plan(&self.root.join("suites"), &[format!("{name}.toml")], &[]).unwrap();
        let runner = RunContext::new(
            &common::fixture_config(&self.root),
            registry,
            Arc::new(Self::engine()),
            1,
        );
        run_trial(&runner, &planned[0], &self.goldens(), UpdateMode::Always).unwrap();
    }

    fn verify(&self) -> (Vec<prereg::Checked>, Vec<String>) {
        verify_all(
            &self.root.join("prereg"),
            &self.root.join("suites"),
            &self.root.join("goldens"),
        )
        .unwrap()
    }

    fn problems(&self) -> String {
        let (checked, unsealed) = self.verify();
        let mut v = unsealed;
        for c in checked {
            v.extend(c.problems);
        }
        v.join("\n")
    }

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args([
                "-c",
                "commit.gpgsign=false",
                "-c",
                "init.defaultBranch=main",
            ])
            .arg("-C")
            .arg(&self.root)
            .args(args)
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn seal(p: &Path) -> prereg::LedgerLine {
    prereg::seal(p, 1_764_500_000).unwrap()
}

fn err(o: &Outcome) -> String {
    assert_eq!(o.status, Status::Error, "expected an error, got {o:?}");
    o.error.clone().unwrap_or_default()
}

#[test]
fn an_unsealed_prereg_fails_and_a_sealed_one_records_its_decision() {
    let fx = Fx::new("decide", &[("cmp", "worse", "better", 3)]);
    let p = fx.write_prereg(
        "cmp",
        &prereg_text(
            "cmp",
            "worse",
            "better",
            3,
            "{ value = 0.5, low = 0.0, high = 5.0 }",
        ),
    );
    let e = err(&fx.run("cmp"));
    assert!(e.contains("not sealed") && e.contains("cmp.toml"), "{e}");
    let line = seal(&p);
    assert_eq!(line.time, "2025-11-30T10:53:20Z");
    let o = fx.run("cmp");
    assert_eq!(o.status, Status::Pass, "{o:?}");
    let d = o.prereg.as_ref().unwrap();
    // Independent evaluation of the rule on the measured interval.
    let (lo, hi) = (
        o.metrics["delta_nll_ci95_lo"],
        o.metrics["delta_nll_ci95_hi"],
    );
    assert!(lo > 0.0, "the overconfident fake model must lose: {lo}");
    let expect = if hi < 0.0 {
        Verdict::Win
    } else if lo > 0.0 {
        Verdict::Loss
    } else {
        Verdict::Tie
    };
    assert_eq!(d.outcome, expect);
    assert_eq!(o.metrics["prereg_outcome"], -1.0);
    let v = o.metrics["delta_nll_mean"];
    assert_eq!(d.prediction_hit, (0.0..=5.0).contains(&v));
    assert_eq!(o.metrics["prereg_prediction_hit"], 1.0);
    assert_eq!(d.prereg_sha256, line.sha256);
    assert_eq!(d.sealed_at, line.time);
    let json = serde_json::to_value(&o).unwrap();
    assert_eq!(json["prereg"]["outcome"], "loss");
    assert_eq!(json["prereg"]["prediction_hit"], true);
    // The golden records the prereg's identity and the decision.
    fx.record_golden("cmp");
    let g = std::fs::read_to_string(fx.goldens().path("cmp", "worse")).unwrap();
    assert!(
        g.contains(&format!("prereg_sha256: {}", line.sha256)),
        "{g}"
    );
    assert!(g.contains("prereg: loss; prediction hit"), "{g}");
    // A case may gate on the outcome: a loss then fails the test.
    let case = fx.root.join("suites/cmp.toml");
    let mut body = std::fs::read_to_string(&case).unwrap();
    body.push_str("[[gate]]\nmetric = \"prereg_outcome\"\nmin = 0\n");
    std::fs::write(&case, body).unwrap();
    let o = fx.run("cmp");
    assert_eq!(o.status, Status::Fail);
    assert!(o.failure_message().unwrap().contains("prereg_outcome"));
}

#[test]
fn every_tamper_is_detected_and_names_the_file() {
    let fx = Fx::new(
        "tamper",
        &[("a", "worse", "better", 3), ("b", "worse", "better", 3)],
    );
    let pa = fx.write_prereg(
        "a",
        &prereg_text(
            "a",
            "worse",
            "better",
            3,
            "{ value = 0.1, low = 0.0, high = 1.0 }",
        ),
    );
    let pb = fx.write_prereg(
        "b",
        &prereg_text(
            "b",
            "worse",
            "better",
            3,
            "{ value = 0.2, low = 0.0, high = 1.0 }",
        ),
    );
    seal(&pa);
    seal(&pb);
    assert_eq!(fx.problems(), "");
    assert_eq!(fx.run("a").status, Status::Pass);

    // Sealing again, or sealing an edited file under the same path: refused.
    let e = prereg::seal(&pa, 0).unwrap_err().message;
    assert!(e.contains("already sealed"), "{e}");
    let original = std::fs::read(&pa).unwrap();
    let text = String::from_utf8(original.clone()).unwrap();
    let edits: [(&str, Vec<u8>); 3] = [
        (
            "content",
            text.replace("value = 0.1", "value = 0.2").into_bytes(),
        ),
        ("whitespace", format!("{text} ").into_bytes()),
        ("line endings", text.replace('\n', "\r\n").into_bytes()),
    ];
    for (what, bytes) in edits {
        std::fs::write(&pa, &bytes).unwrap();
        let p = fx.problems();
        assert!(
            p.contains("a.toml: changed after sealing") && p.contains("LEDGER:1"),
            "{what}: {p}"
        );
        let e = err(&fx.run("a"));
        assert!(e.contains("changed after sealing"), "{what}: {e}");
        let e = prereg::seal(&pa, 0).unwrap_err().message;
        assert!(e.contains("sealed with other bytes"), "{what}: {e}");
        std::fs::write(&pa, &original).unwrap();
    }
    assert_eq!(fx.problems(), "");

    let ledger = fx.root.join("prereg/LEDGER");
    let good = std::fs::read_to_string(&ledger).unwrap();
    let lines: Vec<&str> = good.lines().collect();
    // Line 1 edited (its time): line 2's chain hash no longer matches.
    let edited = good.replacen("2025-11-30T10:53:20Z", "2025-11-29T10:53:20Z", 1);
    std::fs::write(&ledger, edited).unwrap();
    let e = read_ledger(&ledger).unwrap_err().message;
    assert!(e.contains("LEDGER:2: chain broken"), "{e}");
    let e = err(&fx.run("b"));
    assert!(e.contains("LEDGER:2: chain broken"), "{e}");
    // Line 1 deleted: line 2 no longer chains to the start.
    std::fs::write(&ledger, format!("{}\n", lines[1])).unwrap();
    let e = read_ledger(&ledger).unwrap_err().message;
    assert!(e.contains("LEDGER:1: chain broken"), "{e}");
    // The last line deleted: its prereg is unsealed.
    std::fs::write(&ledger, format!("{}\n", lines[0])).unwrap();
    let p = fx.problems();
    assert!(p.contains("b.toml: not sealed"), "{p}");
    let e = err(&fx.run("b"));
    assert!(e.contains("b.toml: not sealed"), "{e}");
    // A sealed file deleted.
    std::fs::write(&ledger, &good).unwrap();
    std::fs::remove_file(&pb).unwrap();
    let p = fx.problems();
    assert!(p.contains("sealed file prereg/b.toml is missing"), "{p}");
}

#[test]
fn bad_preregs_fail_with_the_file_and_key() {
    let fx = Fx::new(
        "bad",
        &[
            ("alias", "worse", "better", 3),
            ("metric", "worse", "better", 3),
            ("size", "huge", "better", 3),
            ("count", "worse", "better", 3),
        ],
    );
    let pred = "{ value = 0.1, low = 0.0, high = 1.0 }";
    let cases: [(&str, String, &str); 6] = [
        (
            "alias",
            prereg_text("alias", "wrose", "better", 3, pred),
            "model alias `wrose` is not in",
        ),
        (
            "nocase",
            prereg_text("missing", "worse", "better", 3, pred),
            "`missing` is not a case",
        ),
        (
            "metric",
            prereg_text("metric", "worse", "better", 3, pred).replace("delta_nll_mean", "kld_mean"),
            "`kld_mean` is not a metric of case `metric`",
        ),
        (
            "size",
            prereg_text("size", "huge", "better", 3, pred),
            "candidate `huge` has 300 bytes, more than baseline `better` (200 bytes)",
        ),
        (
            "count",
            prereg_text("count", "worse", "better", 5, pred),
            "windows: 5 preregistered, but case `count` declares 3 windows",
        ),
        (
            "swapped",
            prereg_text("alias", "worse", "better", 3, pred),
            "prereg: names",
        ),
    ];
    for (name, body, want) in &cases {
        let p = fx.write_prereg(name, body);
        seal(&p);
        let problems = fx.problems();
        assert!(
            problems.contains(want) && problems.contains(&format!("{name}.toml")),
            "{name}: want `{want}` in:\n{problems}"
        );
    }
    // Run time says the same before any model runs.
    let e = err(&fx.run("size"));
    assert!(e.contains("more than baseline"), "{e}");
    // Schema errors: at parse (and so at sealing), with the position.
    for (body, want) in [
        (
            prereg_text("x", "worse", "better", 3, pred).replace("ci95_hi < 0", "p99 < 0"),
            "rule.win: `p99 < 0`: `p99` is not one of",
        ),
        (
            prereg_text(
                "x",
                "worse",
                "better",
                3,
                "{ value = 2.0, low = 0.0, high = 1.0 }",
            ),
            "prediction: need low ≤ value ≤ high",
        ),
        (
            prereg_text("x", "worse", "better", 3, pred).replace("candidate-not-larger", "smaller"),
            "size_rule: `smaller` is not one of",
        ),
        (
            prereg_text("x", "worse", "better", 3, pred) + "extra = 1\n",
            "extra: unknown key `extra`",
        ),
    ] {
        let p = fx.write_prereg("schema", &body);
        let e = prereg::seal(&p, 0).unwrap_err().message;
        assert!(
            e.contains(want) && e.contains("schema.toml:"),
            "{want}: {e}"
        );
    }
}

#[test]
fn the_evaluated_window_count_must_be_the_preregistered_one() {
    // The case asks for 4 chunks; the text holds 3.
    let fx = Fx::new("windows", &[("w", "worse", "better", 4)]);
    let p = fx.write_prereg(
        "w",
        &prereg_text(
            "w",
            "worse",
            "better",
            4,
            "{ value = 0.1, low = 0.0, high = 1.0 }",
        ),
    );
    seal(&p);
    let e = err(&fx.run("w"));
    assert!(
        e.contains("w.toml: windows: 4 preregistered, 3 evaluated"),
        "{e}"
    );
}

#[test]
fn the_rule_at_its_boundaries() {
    let fx = Fx::new("rule", &[]);
    let p = fx.write_prereg(
        "r",
        &prereg_text(
            "r",
            "worse",
            "better",
            3,
            "{ value = 0.0, low = -0.01, high = 0.01 }",
        ),
    );
    let pr = prereg::parse(&p).unwrap();
    let m = |v: f64, lo: f64, hi: f64| -> BTreeMap<String, f64> {
        [
            ("delta_nll_mean", v),
            ("delta_nll_ci95_lo", lo),
            ("delta_nll_ci95_hi", hi),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    };
    let decide = |v, lo, hi| pr.decide(&m(v, lo, hi), "t");
    assert_eq!(decide(-0.02, -0.03, -1e-12).unwrap().outcome, Verdict::Win);
    assert_eq!(decide(-0.01, -0.02, 0.0).unwrap().outcome, Verdict::Tie);
    assert_eq!(decide(0.01, 0.0, 0.02).unwrap().outcome, Verdict::Tie);
    assert_eq!(decide(0.02, 1e-12, 0.03).unwrap().outcome, Verdict::Loss);
    assert!(decide(0.01, 0.0, 0.02).unwrap().prediction_hit);
    assert!(!decide(0.010_000_1, 0.0, 0.02).unwrap().prediction_hit);
    assert!(decide(-0.01, -0.02, 0.0).unwrap().prediction_hit);
    let e = decide(f64::NAN, 0.0, 0.1).unwrap_err();
    assert!(
        matches!(&e, NoDecision::NotFinite { value, .. } if value.is_nan()),
        "{e}"
    );
    assert!(e.to_string().contains("NaN"), "{e}");
    let e = pr.decide(&BTreeMap::new(), "t").unwrap_err();
    assert!(matches!(&e, NoDecision::NotMeasured { .. }), "{e}");
    assert!(e.to_string().contains("not measured"), "{e}");
    // An interval upside down satisfies both sides: an error, not a verdict.
    let e = decide(0.0, 0.1, -0.1).unwrap_err();
    assert!(matches!(&e, NoDecision::Ambiguous { .. }), "{e}");
    assert!(e.to_string().contains("ambiguous"), "{e}");
}

#[test]
fn git_history_must_show_the_rule_before_the_result() {
    if Command::new("git").arg("--version").output().is_err() {
        panic!("git is required for this test");
    }
    let fx = Fx::new(
        "git",
        &[("one", "worse", "better", 3), ("two", "worse", "better", 3)],
    );
    let pred = "{ value = 0.1, low = 0.0, high = 1.0 }";
    fx.git(&["init", "-q"]);
    let p1 = fx.write_prereg("one", &prereg_text("one", "worse", "better", 3, pred));
    fx.git(&["add", "-A"]);
    fx.git(&["commit", "-qm", "cases and prereg"]);
    let first = fx.git(&["rev-parse", "HEAD"]);
    seal(&p1);
    // Sealed but not committed.
    let e = err(&fx.run("one"));
    assert!(e.contains("is not committed"), "{e}");
    fx.git(&["add", "prereg/LEDGER"]);
    fx.git(&["commit", "-qm", "seal one"]);
    let seal_commit = fx.git(&["rev-parse", "HEAD"]);
    let ledger_one = std::fs::read(fx.root.join("prereg/LEDGER")).unwrap();
    assert_eq!(fx.run("one").status, Status::Pass);
    fx.record_golden("one");
    fx.git(&["add", "goldens"]);
    fx.git(&["commit", "-qm", "golden one"]);
    let (checked, _) = fx.verify();
    assert_eq!(checked[0].problems, Vec::<String>::new());
    assert_eq!(checked[0].commit.as_deref(), Some(seal_commit.as_str()));

    // A result committed before its rule was sealed.
    let p2 = fx.write_prereg("two", &prereg_text("two", "worse", "better", 3, pred));
    let golden_two = fx.goldens().path("two", "worse");
    std::fs::create_dir_all(golden_two.parent().unwrap()).unwrap();
    std::fs::copy(fx.goldens().path("one", "worse"), &golden_two).unwrap();
    fx.git(&["add", "-A"]);
    fx.git(&["commit", "-qm", "prereg two and its result"]);
    seal(&p2);
    fx.git(&["add", "prereg/LEDGER"]);
    fx.git(&["commit", "-qm", "seal two, after the result"]);
    let e = err(&fx.run("two"));
    assert!(e.contains("the result predates the rule"), "{e}");
    let p = fx.problems();
    assert!(p.contains("two.toml: the result predates the rule"), "{p}");

    // A seal committed only in history HEAD does not have.
    fx.git(&["checkout", "-q", "-b", "other", &first]);
    std::fs::write(fx.root.join("prereg/LEDGER"), &ledger_one).unwrap();
    let e = err(&fx.run("one"));
    assert!(e.contains("which is not an ancestor of HEAD"), "{e}");
}

#[test]
fn the_report_lists_wins_and_losses_together() {
    let fx = Fx::new(
        "report",
        &[
            ("lose", "worse", "better", 3),
            ("win", "better", "huge", 3),
            ("later", "worse", "better", 3),
        ],
    );
    let loss = fx.write_prereg(
        "lose",
        &prereg_text(
            "lose",
            "worse",
            "better",
            3,
            "{ value = 0.1, low = 0.0, high = 0.2 }",
        ),
    );
    // `better` vs the bigger `huge` with the same behaviour would tie; make
    // the rule one a tie satisfies as a win to see a win row.
    let win = fx.write_prereg(
        "win",
        &prereg_text(
            "win",
            "better",
            "huge",
            3,
            "{ value = 0.0, low = -0.1, high = 0.1 }",
        )
        .replace("ci95_hi < 0", "value <= 0"),
    );
    let later = fx.write_prereg(
        "later",
        &prereg_text(
            "later",
            "worse",
            "better",
            3,
            "{ value = 0.1, low = 0.0, high = 0.2 }",
        ),
    );
    for p in [&loss, &win, &later] {
        seal(p);
    }
    fx.record_golden("lose");
    fx.record_golden("win");
    let (text, ok) = quantgate::report::prereg::report(
        &fx.root.join("prereg"),
        &fx.root.join("suites"),
        &fx.root.join("goldens"),
    )
    .unwrap();
    assert!(ok, "{text}");
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("prereg/{name}.toml ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}"))
            .to_string()
    };
    assert!(row("lose").contains(" loss ") && row("lose").contains("worse vs better"));
    assert!(row("win").contains(" win "), "{}", row("win"));
    assert!(row("later").contains("not run"), "{}", row("later"));
    // Hits: the losing prediction was [0, 0.2].
    let g = quantgate::golden::parse(
        &std::fs::read_to_string(fx.goldens().path("lose", "worse")).unwrap(),
    )
    .unwrap();
    let v = g.metrics["delta_nll_mean"];
    let hit = if (0.0..=0.2).contains(&v) {
        "yes"
    } else {
        "no"
    };
    assert!(
        row("lose").contains(&format!(" {hit} ")),
        "{v}: {}",
        row("lose")
    );
    // A golden edited to another prereg sha: reported, and not ok.
    let gp = fx.goldens().path("win", "better");
    let gtext = std::fs::read_to_string(&gp).unwrap();
    let sha = prereg::parse(&win).unwrap().sha256;
    std::fs::write(&gp, gtext.replace(&sha, &"0".repeat(64))).unwrap();
    let (text, ok) = quantgate::report::prereg::report(
        &fx.root.join("prereg"),
        &fx.root.join("suites"),
        &fx.root.join("goldens"),
    )
    .unwrap();
    assert!(
        !ok && text.contains("recorded under prereg sha256"),
        "{text}"
    );
}

/// A preregistered comparison with a sealed sequential design: the rule
/// tests the sequence's bounds, the run stops once the rule is decided,
/// and a case whose design differs from the sealed one is refused.
#[test]
fn a_sealed_sequential_design_decides_early_and_must_match_its_case() {
    let fx = Fx::new("sequential", &[("seq", "worse", "better", 30)]);
    let text: String = (0..64 * 30 + 10)
        .map(|i| char::from(b'a' + ((i * 7 + i / 13) % 26) as u8))
        .collect();
    std::fs::write(fx.root.join("suites/t2.txt"), &text).unwrap();
    let case = |seed: u64| {
        std::fs::write(
            fx.root.join("suites/seq.toml"),
            format!(
                "kind = \"perplexity\"\nmodels = [\"worse\"]\nreference = \"better\"\n\
                 prereg = \"../prereg/seq.toml\"\n[text]\npath = \"t2.txt\"\nsha256 = \"{}\"\n\
                 [window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = 30\n\
                 [decide]\nsequential = true\nalpha = 0.05\nseed = {seed}\n\
                 [decide.bounds]\ndelta_nll_mean = [-5.0, 5.0]\n",
                quantgate::core::fsutil::sha256_bytes(text.as_bytes())
            ),
        )
        .unwrap();
    };
    case(3);
    let body = "compare = { candidate = \"worse\", baseline = \"better\" }\n\
         size_rule = \"candidate-not-larger\"\ncase = \"seq\"\nmetric = \"delta_nll_mean\"\n\
         windows = 30\nrule = { win = \"seq_hi < 0\", loss = \"seq_lo > 0\" }\n\
         prediction = { value = 0.5, low = 0.0, high = 5.0 }\nnote = \"test\"\n\
         decide = { alpha = 0.05, seed = 3, bounds = [-5.0, 5.0] }\n";
    let p = fx.write_prereg("seq", body);
    seal(&p);
    let o = fx.run("seq");
    assert_eq!(o.status, Status::Pass, "{o:?}");
    let d = o.prereg.as_ref().unwrap();
    assert_eq!(d.outcome, Verdict::Loss);
    let used = o.metrics["windows"];
    assert!(used < 30.0, "{used}");
    assert_eq!(o.metrics["windows_total"], 30.0);
    assert!(o.metrics["delta_nll_mean_seq_lo"] > 0.0);
    assert!(
        o.texts["decided"].contains(&format!(
            "the preregistered rule's threshold 0 on delta_nll_mean: above at window {used} of 30"
        )),
        "{:?}",
        o.texts
    );
    // The case's design must be the sealed one.
    case(4);
    let e = err(&fx.run("seq"));
    assert!(
        e.contains("decide: the sealed design is alpha 0.05, seed 3, bounds [-5, 5], but case `seq` declares alpha 0.05, seed 4"),
        "{e}"
    );
    // Sequence bounds need a sealed design; a design needs sequence bounds.
    let p2 = fx.write_prereg(
        "seq",
        &body.replace(
            "decide = { alpha = 0.05, seed = 3, bounds = [-5.0, 5.0] }\n",
            "",
        ),
    );
    let e = prereg::parse(&p2).unwrap_err().message;
    assert!(
        e.contains("seq_lo / seq_hi need a sealed sequential design"),
        "{e}"
    );
    let p3 = fx.write_prereg("seq", &body.replace("seq_hi < 0", "ci95_hi < 0"));
    let e = prereg::parse(&p3).unwrap_err().message;
    assert!(
        e.contains("a sequential design decides on its sequence's bounds"),
        "{e}"
    );
}
