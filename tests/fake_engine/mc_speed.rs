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
    let cx = RunContext::new(
        &common::fixture_config(root),
        registry,
        Arc::new(engine()),
        1,
    );
    quantgate::schedule::trial(&cx, &planned[0], &root.join("goldens"))
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
    // The model's rows: the card's main table, its gates, its details.
    let row = md
        .lines()
        .filter(|l| l.starts_with("| cand "))
        .collect::<Vec<_>>()
        .join("\n");
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
    // Speed shows as the mean with its 95% Student-t interval over the six
    // repetitions: t(0.975, 5) = 2.570582 from the printed tables.
    let (mean, sd) = (o.metrics["pp_tps_mean"], o.metrics["pp_tps_sd"]);
    let half = 2.570_581_835_6 * sd / 6f64.sqrt();
    let pp = format!("{mean:.1} [{:.1}, {:.1}]", mean - half, mean + half);
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

/// A speed case's candidates in one group are measured together: each
/// round measures every candidate and the reference once, in an order
/// rotated by one each round (k + 1 measurements a round, not 2k), and
/// each candidate's metrics are those it has measured alone against the
/// reference; with one candidate the order is the one-by-one order (the
/// candidate first in even rounds, the reference first in odd ones).
#[test]
fn a_speed_cases_candidates_are_measured_together_with_one_reference_a_round() {
    let case = |models: &str| {
        format!(
            "kind = \"speed\"\nmodels = [{models}]\nreference = \"ref\"\npp = 64\ntg = 8\n\
             repetitions = 3\nrounds = 3\n[[gate]]\nmetric = \"tg_ratio_vs_ref\"\nmin = 1.0\n"
        )
    };
    let run_all = |tag: &str, models: &str| {
        let root = common::fake_root(tag, &[("cand", 100), ("cand2", 102), ("ref", 101)]);
        std::fs::write(root.join("suites/case.toml"), case(models)).unwrap();
        let (registry, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
        let e = engine().with(
            "cand2",
            FakeSpec {
                pp_tps: 250.0,
                tg_tps: 40.0,
                ..FakeSpec::default()
            },
        );
        let benches = e.benches.clone();
        let cx = Arc::new(RunContext::new(
            &common::fixture_config(&root),
            registry,
            Arc::new(e),
            1,
        ));
        let (outcomes, _) = quantgate::schedule::Schedule::here(&cx, &planned).run(
            &planned,
            1,
            &Default::default(),
            &root.join("goldens"),
            &mut |_, _| {},
            &mut |_, _, _| {},
        );
        let calls = benches.lock().unwrap().clone();
        let _ = std::fs::remove_dir_all(&root);
        (outcomes, calls)
    };
    let (together, calls) = run_all("speed-together", "\"cand\", \"cand2\"");
    // pp's three rounds, then tg's: rotated by one each round.
    let round = [
        ["cand", "cand2", "ref"],
        ["cand2", "ref", "cand"],
        ["ref", "cand", "cand2"],
    ];
    let want: Vec<&str> = (0..2)
        .flat_map(|_| round.iter().flatten().copied())
        .collect();
    assert_eq!(calls, want);
    let (alone, calls) = run_all("speed-alone", "\"cand\"");
    let pair = [["cand", "ref"], ["ref", "cand"], ["cand", "ref"]];
    let want: Vec<&str> = (0..2)
        .flat_map(|_| pair.iter().flatten().copied())
        .collect();
    assert_eq!(calls, want);
    let (alone2, _) = run_all("speed-alone2", "\"cand2\"");
    assert_eq!(together.len(), 2);
    for (o, by_itself) in together.iter().zip([&alone[0], &alone2[0]]) {
        assert_eq!(o.model, by_itself.model);
        assert_eq!(o.status, by_itself.status, "{}: {:?}", o.model, o.error);
        assert_eq!(common::bits(o), common::bits(by_itself), "{}", o.model);
        assert_eq!(o.timings.shared_with, 1, "{}", o.model);
    }
    // The fake speeds: cand is faster than ref, cand2 slower.
    assert_eq!(together[0].status, Status::Pass);
    assert_eq!(together[1].status, Status::Fail);
}

/// A sequential multiple-choice case (`[decide]`) visits its tasks in the
/// seeded order and stops once accuracy and agreement are decided: the
/// stop replayed from an independent scoring of every task, the metrics
/// over the tasks used, the reference's batches decoded once (kept for
/// the next run) and, with a threshold at the exact accuracy, every
/// metric of the fixed-N case at N.
#[test]
fn a_sequential_multiple_choice_case_stops_early_and_at_n_is_the_fixed_n_case() {
    use quantgate::measure::sequential::{decided, permutation, MeanSequence};
    use std::sync::atomic::Ordering;
    const N: usize = 80;
    let e = engine();
    let (cand, refr) = (&e.specs["cand"], &e.specs["ref"]);
    // 80 tasks; the answer is the candidate's pick but for every tenth.
    let mut lines = String::new();
    let (mut right, mut same) = (Vec::new(), Vec::new());
    for i in 0..N {
        let b = |k: usize| char::from(b'a' + ((i * 7 + k * 3 + i / 5) % 26) as u8);
        let q: String = (0..3).map(b).collect();
        let c: Vec<String> = (0..3)
            .map(|j| (0..3).map(|k| b(3 + j * 4 + k * (j + 1))).collect())
            .collect();
        let cs: Vec<&str> = c.iter().map(String::as_str).collect();
        let (pc, pr) = (pick(&score(cand, &q, &cs)), pick(&score(refr, &q, &cs)));
        let answer = if i % 10 == 0 { (pc + 1) % 3 } else { pc };
        right.push(f64::from(u8::from(pc == answer)));
        same.push(f64::from(u8::from(pc == pr)));
        lines.push_str(&format!(
            "{}\n",
            serde_json::json!({"question": q, "choices": cs, "answer": answer})
        ));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let agree = mean(&same);
    assert!(agree > 0.3, "the fixture's own design: agreement {agree}");
    let sha = quantgate::core::fsutil::sha256_bytes(lines.as_bytes());
    let case = |gates: &str, decide: bool| {
        format!(
            "kind = \"multiple_choice\"\nmodels = [\"cand\"]\nreference = \"ref\"\nformat = \"jsonl\"\n\
             n_ctx = 64\n[tasks_file]\npath = \"tasks.jsonl\"\nsha256 = \"{sha}\"\n{gates}{}",
            if decide {
                "[decide]\nsequential = true\nseed = 5\n[decide.bounds]\naccuracy = [0, 1]\n\
                 agreement = [0, 1]\n"
            } else {
                ""
            }
        )
    };
    let (c_acc, c_agree) = (0.6, agree / 2.0);
    let gates = format!(
        "[[gate]]\nmetric = \"accuracy\"\nmin = {c_acc}\n[[gate]]\nmetric = \"agreement\"\nmin = {c_agree}\n"
    );
    let root = root("mc-seq", &case(&gates, true), &[("tasks.jsonl", &lines)]);
    let run_in = |root: &Path| {
        let e = engine();
        let calls = e.decodes.clone();
        let (registry, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
        let mut cx = RunContext::new(&common::fixture_config(root), registry, Arc::new(e), 1);
        cx.references.dir = root.join("cache");
        let o = quantgate::schedule::trial(&cx, &planned[0], &root.join("goldens"));
        (o, calls.load(Ordering::SeqCst))
    };
    let (o, calls) = run_in(&root);
    assert!(o.error.is_none(), "{:?}", o.error);
    assert_eq!(o.status, Status::Pass, "{:?}", o.texts);
    // Replayed from the independent scoring in the seeded order.
    let order = permutation(N, 5);
    let mut seqs = [
        (MeanSequence::new(N, (0.0, 1.0), 0.05), &right, c_acc),
        (MeanSequence::new(N, (0.0, 1.0), 0.05), &same, c_agree),
    ];
    let mut run = [(f64::NEG_INFINITY, f64::INFINITY); 2];
    let mut stop = [None; 2];
    for (j, &t) in order.iter().enumerate() {
        for (k, (s, v, c)) in seqs.iter_mut().enumerate() {
            s.push(v[t]).unwrap();
            let (lo, hi) = s.bounds();
            run[k] = (run[k].0.max(lo), run[k].1.min(hi));
            if stop[k].is_none() {
                stop[k] = decided(None, Some(*c), run[k]).map(|p| (p, j + 1));
            }
        }
        if stop.iter().all(Option::is_some) {
            break;
        }
    }
    let at = stop.iter().map(|s| s.unwrap().1).max().unwrap();
    assert!(at < N / 2, "decided after {at} of {N} tasks");
    assert_eq!(o.metrics["tasks"], at as f64, "{:?}", o.texts);
    assert_eq!(o.metrics["tasks_total"], N as f64);
    assert_eq!(o.metrics["accuracy_seq_lo"], run[0].0);
    assert_eq!(o.metrics["agreement_seq_lo"], run[1].0);
    assert_eq!(
        o.series["task_order"],
        order[..at].iter().map(|t| *t as f64).collect::<Vec<_>>()
    );
    let used = &order[..at];
    let correct: f64 = used.iter().map(|&t| right[t]).sum();
    assert_eq!(o.metrics["correct"], correct);
    assert_eq!(
        o.metrics["agreement"],
        used.iter().map(|&t| same[t]).sum::<f64>() / at as f64
    );
    let d = &o.texts["decided"];
    assert!(
        d.contains(&format!("{at} of {N} tasks"))
            && d.contains(&format!("gate[0] accuracy >= {c_acc}: pass at task")),
        "{d}"
    );
    // One task per batch (3 choices of 4 sequences): a decode per visit of
    // two tasks, on the candidate and on the reference.
    let visits = at.div_ceil(2);
    assert_eq!(calls, 2 * visits);
    // Again: the reference's batches are kept, only the candidate decodes;
    // the same numbers.
    let (again, calls) = run_in(&root);
    assert_eq!(again.metrics, o.metrics);
    assert_eq!(calls, visits);

    // At N (accuracy's threshold at its exact value, 0.9): the fixed-N case.
    let exact = mean(&right);
    assert_eq!(exact, 0.9);
    let gate = format!("[[gate]]\nmetric = \"accuracy\"\nmin = {exact}\n");
    std::fs::write(root.join("suites/case.toml"), case(&gate, false)).unwrap();
    let (fixed, _) = run_in(&root);
    let at_n = case(&gate, true).replace("\nagreement = [0, 1]\n", "\n");
    std::fs::write(root.join("suites/case.toml"), at_n).unwrap();
    let (o, _) = run_in(&root);
    assert!(o.error.is_none(), "{:?}", o.error);
    assert_eq!(o.metrics["tasks"], N as f64, "{:?}", o.texts);
    assert_eq!(o.status, fixed.status);
    for (k, v) in &fixed.metrics {
        assert_eq!(o.metrics[k].to_bits(), v.to_bits(), "{k}");
    }
    assert_eq!(
        o.rows.as_ref().unwrap().columns,
        fixed.rows.as_ref().unwrap().columns
    );
    assert!(o.texts["decided"].contains("decided at N = 80 on the exact mean"));
}
