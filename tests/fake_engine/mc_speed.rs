//! Multiple-choice and speed cases on the fake engine (no llama.cpp): the
//! scores, picks, accuracy and flips of a multiple-choice case against an
//! independent f64 computation from the fake models' logit formula, through
//! the engine's batched decode; the t/s, their spread and the ratio to the
//! reference of a speed case against the fake models' declared speeds; and
//! both in the ladder report, read from the kinds' declarations.

use crate::common;

use quantgate::core::{Outcome, Status};
use quantgate::engine::fake::{FakeEngine, FakeSpec, BOS};
use quantgate::engine::BenchTest;
use quantgate::execute::RunContext;
use quantgate::plan::plan;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The candidate favours the next byte (`last + 1`), the reference the one
/// after (`last + 2`), and each has its own speed.
fn engine() -> FakeEngine {
    FakeEngine::new()
        .with(
            "cand",
            FakeSpec {
                pp_tps: 1000.0,
                tg_tps: 100.0,
                ..FakeSpec::default()
            },
        )
        .with(
            "ref",
            FakeSpec {
                step: 2,
                confidence: 5.0,
                pp_tps: 500.0,
                tg_tps: 80.0,
                ..FakeSpec::default()
            },
        )
}

/// (question, choices, the correct choice).
const TASKS: &[(&str, [&str; 3], usize)] = &[
    // The candidate's continuation is right: it is right, the reference not.
    ("abc", ["def", "xyz", "ace"], 0),
    ("klm", ["qrs", "nop", "mop"], 1),
    // The reference's (every other byte) is right.
    ("abc", ["def", "egi", "zzz"], 1),
    ("pqr", ["tvx", "stu", "aaa"], 0),
    // Neither: both wrong.
    ("uvw", ["xyz", "wyz", "hhh"], 2),
    ("ghi", ["jkl", "ikm", "bbb"], 2),
];

fn jsonl() -> String {
    TASKS
        .iter()
        .map(|(q, c, a)| {
            format!(
                "{}\n",
                serde_json::json!({"question": q, "choices": c, "answer": a})
            )
        })
        .collect()
}

fn root(tag: &str, case: &str, files: &[(&str, &str)]) -> PathBuf {
    let root = common::fake_root(tag, &[("cand", 100), ("ref", 101)]);
    for (name, body) in files {
        std::fs::write(root.join("suites").join(name), body).unwrap();
    }
    std::fs::write(root.join("suites/case.toml"), case).unwrap();
    root
}

fn run(root: &Path) -> Outcome {
    let (registry, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
    assert_eq!(planned.len(), 1);
    let cx = RunContext::new(registry, Arc::new(engine()), 1);
    quantgate::judge::trial(&cx, &planned[0], &root.join("goldens"))
}

/// A choice's score as llama-perplexity defines it, in f64 from the fake
/// logit formula: the mean log-probability of the choice's own tokens
/// (after what all choices share), BOS + the bytes of `question choice`.
fn score(spec: &FakeSpec, question: &str, choices: &[&str]) -> Vec<f64> {
    let seqs: Vec<Vec<i32>> = choices
        .iter()
        .map(|c| {
            std::iter::once(BOS)
                .chain(format!("{question} {c}").bytes().map(i32::from))
                .collect()
        })
        .collect();
    let prefix = (0..seqs[0].len())
        .take_while(|&k| seqs.iter().all(|s| s.get(k) == seqs[0].get(k)))
        .count();
    seqs.iter()
        .map(|s| {
            let lps: Vec<f64> = (prefix..s.len())
                .map(|j| {
                    let row: Vec<f64> = spec
                        .logits(s[j - 1], j - 1)
                        .iter()
                        .map(|&x| f64::from(x))
                        .collect();
                    let max = row.iter().copied().fold(f64::MIN, f64::max);
                    let z: f64 = row.iter().map(|x| (x - max).exp()).sum();
                    row[s[j] as usize] - max - z.ln()
                })
                .collect();
            lps.iter().sum::<f64>() / lps.len() as f64
        })
        .collect()
}

/// The first highest score, as the tool picks.
fn pick(scores: &[f64]) -> usize {
    (0..scores.len()).fold(0, |b, i| if scores[i] > scores[b] { i } else { b })
}

/// A multiple-choice case decodes its tasks in the tool's batches through
/// the fake engine; its accuracy and flips equal an independent f64
/// scoring of every choice on both models.
#[test]
fn multiple_choice_scores_picks_and_flips_match_an_independent_scoring() {
    let tasks = jsonl();
    let case = format!(
        "kind = \"multiple_choice\"\nmodels = [\"cand\"]\nreference = \"ref\"\nformat = \"jsonl\"\nn_ctx = 64\n\
         [tasks_file]\npath = \"tasks.jsonl\"\nsha256 = \"{}\"\n\
         [[gate]]\nmetric = \"accuracy\"\nmin = 0.5\n",
        quantgate::core::fsutil::sha256_bytes(tasks.as_bytes())
    );
    let root = root("mc", &case, &[("tasks.jsonl", &tasks)]);
    let o = run(&root);
    assert_eq!(o.status, Status::Fail, "{:?}", o.error);
    let e = engine();
    let (cand, refr) = (&e.specs["cand"], &e.specs["ref"]);
    let mut expect = [0usize; 4]; // correct, ref correct, right→wrong, wrong→right
    for (q, c, a) in TASKS {
        let (pc, pr) = (pick(&score(cand, q, c)), pick(&score(refr, q, c)));
        let (rc, rr) = (pc == *a, pr == *a);
        expect[0] += usize::from(rc);
        expect[1] += usize::from(rr);
        expect[2] += usize::from(rr && !rc);
        expect[3] += usize::from(!rr && rc);
    }
    // The tasks were built so that every case occurs.
    assert_eq!(expect, [2, 2, 2, 2], "the fixture's own design");
    let m = |k: &str| o.metrics[k];
    assert_eq!(m("tasks"), TASKS.len() as f64);
    assert_eq!(m("correct"), expect[0] as f64);
    assert_eq!(m("ref_correct"), expect[1] as f64);
    assert_eq!(m("flips_right_to_wrong"), expect[2] as f64);
    assert_eq!(m("flips_wrong_to_right"), expect[3] as f64);
    assert!((m("accuracy") - expect[0] as f64 / TASKS.len() as f64).abs() < 1e-12);
    // The ladder report shows the case as the kind declares it: accuracy
    // with its Wilson interval, flips both ways, McNemar's p.
    let facts = |_: &str| quantgate::report::ladder::ModelFacts::default();
    let views = quantgate::report::ladder::views(
        std::slice::from_ref(&o),
        &quantgate::kinds::presentations(),
        &facts,
    );
    let md = quantgate::report::ladder::markdown(&views);
    let row = md.lines().find(|l| l.starts_with("| cand ")).unwrap();
    let acc = format!(
        "{:.1}% [{:.1}, {:.1}]",
        m("accuracy") * 100.0,
        m("accuracy_wilson95_lo") * 100.0,
        m("accuracy_wilson95_hi") * 100.0
    );
    assert!(row.contains(&acc) && row.contains("| 2 / 2 |"), "{row}");
    assert!(row.contains(&format!("| {:.3} |", m("mcnemar_p"))), "{row}");
    // 2 of 6 < 0.5: the gate fails, and says so.
    assert!(
        o.failure_message()
            .is_some_and(|f| f.contains("accuracy = 0.3333333333333333")),
        "{:?}",
        o.failure_message()
    );
}

/// A speed case measures the candidate and the reference in rounds through
/// the engine's bench; t/s, their sd (Bessel) and the ratio to the
/// reference equal what the fake models' declared speeds give, and the
/// ladder report shows them beside the model's quality row.
#[test]
fn speed_metrics_match_the_declared_speeds_and_join_the_report() {
    let case = "kind = \"speed\"\nmodels = [\"cand\"]\nreference = \"ref\"\npp = 64\ntg = 8\n\
                repetitions = 3\nrounds = 2\n[[gate]]\nmetric = \"tg_ratio_vs_ref\"\nmin = 1.0\n";
    let root = root("speed", case, &[]);
    let o = run(&root);
    assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    let e = engine();
    for (name, test, c_tps, r_tps) in [
        ("pp", BenchTest::Prompt(64), 1000.0, 500.0),
        ("tg", BenchTest::Generate(8), 100.0, 80.0),
    ] {
        let n = match test {
            BenchTest::Prompt(n) | BenchTest::Generate(n) => n as f64,
        };
        let per_rep: Vec<f64> = (0..3)
            .map(|r| n / e.specs["cand"].bench_time(test, r).as_secs_f64())
            .collect();
        // Two identical rounds.
        let all: Vec<f64> = per_rep.iter().chain(&per_rep).copied().collect();
        let mean = all.iter().sum::<f64>() / 6.0;
        let sd = (all.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 5.0).sqrt();
        let m = |k: &str| o.metrics[&format!("{name}_{k}")];
        assert!((m("tps_mean") - mean).abs() < 1e-9 * mean, "{name}");
        assert!((m("tps_sd") - sd).abs() < 1e-9 * mean, "{name}");
        // Each round's ratio is the declared ratio: the interval is a point.
        let ratio = c_tps / r_tps;
        for k in [
            "ratio_vs_ref",
            "ratio_vs_ref_ci95_lo",
            "ratio_vs_ref_ci95_hi",
        ] {
            assert!((m(k) - ratio).abs() < 1e-9, "{name}_{k} = {}", m(k));
        }
    }
    // Beside a kld or perplexity view's row of the same model, as the
    // speed kind declares: a quality outcome of `cand` against `ref`.
    let mut quality = Outcome::new("ppl/x", "cand", o.build.clone());
    quality.kind = "perplexity".into();
    quality.status = Status::Pass;
    quality.reference = Some("ref".into());
    quality.metrics.insert("ppl".into(), 12.5);
    quality.metrics.insert("ppl_se".into(), 0.25);
    let facts = |_: &str| quantgate::report::ladder::ModelFacts::default();
    let catalog = quantgate::kinds::presentations();
    let views = quantgate::report::ladder::views(&[quality, o.clone()], &catalog, &facts);
    assert_eq!(views.len(), 1);
    let md = quantgate::report::ladder::markdown(&views);
    let row = md.lines().find(|l| l.starts_with("| cand ")).unwrap();
    let pp = format!(
        "{:.1} ± {:.1}",
        o.metrics["pp_tps_mean"], o.metrics["pp_tps_sd"]
    );
    assert!(
        row.contains("12.5000 ± 0.2500") && row.contains(&pp),
        "{row}"
    );
    let csv = quantgate::report::ladder::csv(&views);
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let line: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let at = head.iter().position(|h| *h == "tg_ratio_vs_ref").unwrap();
    assert_eq!(line[at], format!("{}", o.metrics["tg_ratio_vs_ref"]));
}
