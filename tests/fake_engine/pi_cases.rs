//! Recite and teacher-forcing cases (issue #3) on the fake engine: every
//! per-digit number against an independent f64 computation from the fake
//! models' logit formula; greedy first_error equal to first_flip; the
//! sampling forecast against many seeded samples; bad input (schema errors,
//! another vocabulary); golden texts; Parquet read back by the parquet
//! crate's own row reader. Real models: tests/real_engine/pi_real.rs.

use crate::common;

use quantgate::core::Outcome;
use quantgate::core::Status;
use quantgate::engine::fake::{FakeEngine, FakeSpec};
use quantgate::execute::RunContext;
use quantgate::plan::plan;
use quantgate::plan::Planned;
use std::path::PathBuf;
use std::sync::Arc;

const PROMPT: &str = "digits: 012";
/// The fake model writes 3456789 after "012" (next byte = last + 1); the
/// expected text departs from it at unit 4.
const EXPECTED: &str = "3456X89";

fn root(tag: &str, cases: &[(&str, &str)]) -> PathBuf {
    let root = common::fake_root(
        &format!("pi-{tag}"),
        &[("cand", 100), ("ref", 101), ("other", 102), ("soft", 103)],
    );
    for (name, body) in cases {
        std::fs::write(root.join("suites").join(name), body).unwrap();
    }
    root
}

fn engine() -> FakeEngine {
    FakeEngine::new()
        .with("ref", ref_spec())
        .with(
            "other",
            FakeSpec {
                tokenizer: "fake-other",
                ..FakeSpec::default()
            },
        )
        .with("soft", soft_spec())
}

fn ref_spec() -> FakeSpec {
    FakeSpec {
        confidence: 5.0,
        ..FakeSpec::default()
    }
}

/// An unsure model: sampling often leaves the sequence.
fn soft_spec() -> FakeSpec {
    FakeSpec {
        confidence: 3.0,
        ..FakeSpec::default()
    }
}

fn run(root: &std::path::Path) -> Vec<(Planned, Outcome)> {
    let (registry, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
    let mut r = RunContext::new(
        &common::fixture_config(root),
        registry,
        Arc::new(engine()),
        1,
    );
    r.references.dir = root.join("cache");
    planned
        .into_iter()
        .map(|p| {
            let o = quantgate::schedule::trial(&r, &p, std::path::Path::new("goldens"));
            (p, o)
        })
        .collect()
}

fn recite_case(models: &str) -> String {
    format!(
        "kind = \"recite\"\nmodels = [{models}]\nexpect = {{ literal = \"{EXPECTED}\" }}\n\
         tail = 2\n\n[[prompts]]\nname = \"a\"\ntext = \"{PROMPT}\"\n\n\
         [[prompts]]\nname = \"b\"\ntext = \"digits:\\n012\"\n"
    )
}

fn tf_case(models: &str, extra: &str) -> String {
    format!(
        "kind = \"teacher_forcing\"\nmodels = [{models}]\nprompt = \"{PROMPT}\"\n\
         expect = {{ literal = \"{EXPECTED}\" }}\n{extra}\n"
    )
}

#[test]
fn wordings_are_tests_and_first_error_equals_first_flip() {
    let root = root(
        "invariant",
        &[
            ("r.toml", &recite_case("\"cand\"")),
            ("tf.toml", &tf_case("\"cand\"", "reference = \"ref\"")),
        ],
    );
    let out = run(&root);
    let names: Vec<&str> = out.iter().map(|(p, _)| p.name.as_str()).collect();
    assert_eq!(names, ["r/a::cand", "r/b::cand", "tf::cand"]);
    let (_, a) = &out[0];
    assert_eq!(a.status, Status::Pass, "{:?}", a.error);
    assert_eq!(a.case, "r/a");
    let m = &a.metrics;
    assert_eq!(m["first_error"], 4.0);
    assert_eq!(m["digits_correct"], 4.0);
    assert_eq!(m["complete"], 0.0);
    assert_eq!(m["units_expected"], 7.0);
    // Departed at unit 4 (the 5th token), then `tail` = 2 more tokens.
    assert_eq!(m["tokens_generated"], 7.0);
    assert_eq!(a.texts["output"], "3456789");
    assert!(a.texts["stopped"].starts_with("departed"), "{:?}", a.texts);
    // The gap at the wrong pick: top logit minus the runner-up, by hand.
    let spec = FakeSpec::default();
    let prompt: Vec<i32> = std::iter::once(quantgate::engine::fake::BOS)
        .chain(PROMPT.bytes().map(i32::from))
        .collect();
    let pos = prompt.len() - 1 + 4;
    let r = spec.logits(i32::from(b'6'), pos);
    let mut sorted = r.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(m["error_gap"], f64::from(sorted[0] - sorted[1]));

    // Teacher forcing: every unit against the formula.
    let (_, tf) = &out[2];
    assert_eq!(tf.status, Status::Pass, "{:?}", tf.error);
    assert_eq!(tf.metrics["first_flip"], a.metrics["first_error"]);
    assert_eq!(tf.metrics["all_own_tokens"], 1.0);
    assert_eq!(tf.metrics["prompt_tokens_match"], 1.0);
    let rows = common::digit_rows(tf);
    let text: Vec<i32> = prompt
        .iter()
        .copied()
        .chain(EXPECTED.bytes().map(i32::from))
        .collect();
    let rspec = ref_spec();
    let mut kl_sum = 0.0;
    for (k, d) in rows.iter().enumerate() {
        let pos = prompt.len() - 1 + k;
        let target = text[pos + 1] as usize;
        let c = spec.logits(text[pos], pos);
        let lp = common::exact_log_softmax(&c);
        assert!((d.logprob - lp[target]).abs() < 1e-12, "unit {k}");
        let rank = c.iter().filter(|&&v| v > c[target]).count() as i64;
        assert_eq!(d.rank, rank, "unit {k}");
        let best_other = (0..c.len())
            .filter(|&j| j != target)
            .map(|j| lp[j])
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(
            (d.margin - (lp[target] - best_other)).abs() < 1e-9,
            "unit {k}"
        );
        let refrow = rspec.logits(text[pos], pos);
        let kl = common::exact_kl(&refrow, &c);
        assert!(
            (d.kl_vs_ref - kl).abs() < 1e-9,
            "unit {k}: {} vs {kl}",
            d.kl_vs_ref
        );
        kl_sum += kl;
        // Unit 4 is the departure; after the forced "X" the fake wants "Y".
        assert_eq!(d.rank > 0, k == 4 || k == 5, "unit {k}");
        assert_eq!(d.piece, &EXPECTED[k..k + 1]);
    }
    assert!((tf.metrics["kl_mean"] - kl_sum / 7.0).abs() < 1e-9);
    assert_eq!(tf.metrics["flips"], 2.0);
    assert!(tf.metrics["first_flip_margin"] < 0.0);
    // Reference percentiles: 0 for the least certain, 100 for the most.
    let mut p: Vec<f64> = rows.iter().map(|r| r.ref_odds_percentile).collect();
    p.sort_by(f64::total_cmp);
    assert_eq!((p[0], p[6]), (0.0, 100.0));
    assert!(
        tf.texts["least_certain_ref"].starts_with("4: "),
        "{:?}",
        tf.texts
    );

    // Parquet: one row per digit, read back with the crate's row reader.
    let dir = root.join("out");
    quantgate::report::write_parquet(&dir, tf).unwrap();
    let file = std::fs::File::open(quantgate::report::parquet_path(&dir, tf)).unwrap();
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(file).unwrap();
    let back: Vec<parquet::record::Row> =
        parquet::file::reader::FileReader::get_row_iter(&reader, None)
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
    assert_eq!(back.len(), 7);
    let svg =
        std::fs::read_to_string(quantgate::report::parquet_path(&dir, tf).with_extension("svg"))
            .unwrap();
    assert!(
        svg.contains("first flip: 4") && svg.contains("<polyline"),
        "{svg}"
    );
    for (unit, (r, d)) in back.iter().zip(rows).enumerate() {
        let cols: std::collections::HashMap<String, String> = r
            .get_column_iter()
            .map(|(n, f)| (n.clone(), f.to_string()))
            .collect();
        assert_eq!(cols["position"], unit.to_string());
        assert_eq!(cols["piece"], format!("{:?}", d.piece));
        assert_eq!(cols["logprob"].parse::<f64>().unwrap(), d.logprob);
        assert_eq!(cols["kl_vs_ref"].parse::<f64>().unwrap(), d.kl_vs_ref);
        assert_eq!(cols["rank"], d.rank.to_string());
        assert_eq!(cols["case"], "\"tf\"");
    }
}

#[test]
fn a_complete_recitation_and_words() {
    let root = root(
        "complete",
        &[
            (
                "done.toml",
                "kind = \"recite\"\nmodels = [\"cand\"]\nprompt = \"x: 01\"\n\
                 expect = { literal = \"2345\" }\nmax_tokens = 50\n",
            ),
            (
                "short.toml",
                "kind = \"recite\"\nmodels = [\"cand\"]\nprompt = \"x: 01\"\n\
                 expect = { literal = \"23456789\" }\nmax_tokens = 3\n",
            ),
        ],
    );
    let out = run(&root);
    let (_, done) = &out[0];
    assert_eq!(done.metrics["complete"], 1.0);
    assert_eq!(done.metrics["first_error"], 4.0);
    assert_eq!(done.metrics["tokens_generated"], 4.0);
    assert!(
        done.texts["stopped"].starts_with("complete"),
        "{:?}",
        done.texts
    );
    // max_tokens before the expected text ends: reported as a lower bound.
    let (_, short) = &out[1];
    assert_eq!(short.status, Status::Pass);
    assert_eq!(short.metrics["first_error"], 3.0);
    assert_eq!(short.metrics["max_tokens_reached"], 1.0);
    assert!(
        short.texts["stopped"].contains("lower bound"),
        "{:?}",
        short.texts
    );
}

#[test]
fn another_vocabulary_is_refused_before_scoring() {
    let root = root(
        "vocab",
        &[("tf.toml", &tf_case("\"other\"", "reference = \"ref\""))],
    );
    let out = run(&root);
    let (_, o) = &out[0];
    assert_eq!(o.status, Status::Error);
    let e = o.error.as_deref().unwrap();
    assert!(
        e.contains("different tokenizers") && e.contains("tf.toml"),
        "{e}"
    );
    assert!(o.rows.is_none() && o.metrics.is_empty());
}

#[test]
fn the_forecast_matches_seeded_samples() {
    // An unsure model: most samples leave the text early, some go far.
    let case = format!(
        "kind = \"teacher_forcing\"\nmodels = [\"soft\"]\nprompt = \"{PROMPT}\"\n\
         expect = {{ literal = \"3456789:;<=>?@ABCDEFG\" }}\n\n\
         [[sampler]]\nname = \"t08\"\ntemperature = 0.8\ntop_k = 20\ntop_p = 0.9\nmin_p = 0.02\n\
         samples = 3000\nseed = 7\n\n\
         [[sampler]]\nname = \"plain\"\ntemperature = 1.0\nsamples = 3000\nseed = 9\n"
    );
    let root = root("forecast", &[("tf.toml", &case)]);
    let out = run(&root);
    let (_, o) = &out[0];
    assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    // The forecast by hand: the chance of each true token under each sampler.
    let spec = soft_spec();
    let text: Vec<i32> = std::iter::once(quantgate::engine::fake::BOS)
        .chain(PROMPT.bytes().map(i32::from))
        .chain("3456789:;<=>?@ABCDEFG".bytes().map(i32::from))
        .collect();
    let p0 = PROMPT.len() + 1;
    for (name, s) in [
        (
            "t08",
            quantgate::core::Sampler {
                temperature: 0.8,
                top_k: 20,
                top_p: 0.9,
                min_p: 0.02,
            },
        ),
        (
            "plain",
            quantgate::core::Sampler {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
            },
        ),
    ] {
        let q: Vec<f64> = (0..21)
            .map(|k| {
                let pos = p0 - 1 + k;
                let r = spec.logits(text[pos], pos);
                quantgate::measure::forecast::p_pick(&r, &s, text[pos + 1] as usize)
            })
            .collect();
        let want: f64 = quantgate::measure::forecast::expected_reach(&q);
        let got = o.metrics[&format!("{name}_forecast_reach")];
        assert!((got - want).abs() < 1e-9, "{name}: {got} vs {want}");
        let mean = o.metrics[&format!("{name}_sampled_reach_mean")];
        let se = o.metrics[&format!("{name}_sampled_reach_se")];
        assert!(se > 0.0 && se < 1.0, "{name}: se {se}");
        assert!(
            (mean - want).abs() < 4.0 * se,
            "{name}: sampled {mean} ± {se}, forecast {want}"
        );
    }
    assert!(o.texts["sampling"].contains("P(≥1)"), "{:?}", o.texts);
}

#[test]
fn schema_errors_name_file_line_and_key() {
    let cases = [
        (
            "kind = \"recite\"\nmodels = [\"cand\"]\nprompt = \"x\"\nexpect = { literal = \"1\" }\nreference = \"ref\"\n",
            "5:13: reference: a kind = \"recite\" case does not take it",
        ),
        (
            "kind = \"recite\"\nmodels = [\"cand\"]\nprompt = \"x\"\nexpect = { source = \"tau\", count = 5 }\n",
            "expect.source: `tau` is not one of pi, e, sqrt2, random, seed000",
        ),
        (
            "kind = \"recite\"\nmodels = [\"cand\"]\nprompt = \"x\"\nexpect = { source = \"random\", count = 5 }\n",
            "expect: source = \"random\" needs `seed`",
        ),
        (
            "kind = \"recite\"\nmodels = [\"cand\"]\nprompt = \"x\"\nformat = \"words\"\nexpect = { literal = \"one  two\" }\n",
            "words are separated by single spaces",
        ),
        (
            "kind = \"teacher_forcing\"\nmodels = [\"cand\"]\nprompt = \"x\"\nexpect = { literal = \"1\" }\n\n[[sampler]]\nname = \"g\"\ntemperature = 0.0\n",
            "8:15: sampler.temperature: 0 must be in (0, 10]",
        ),
        (
            "kind = \"teacher_forcing\"\nmodels = [\"cand\"]\nprompt = \"x\"\nexpect = { literal = \"1\" }\n\n[[gate]]\nmetric = \"kl_mean\"\nmax = 1\n",
            "gate[0].metric: `kl_mean` is not a metric of a teacher_forcing case",
        ),
        (
            "kind = \"recite\"\nmodels = [\"cand\"]\nprompt = \"x\"\nexpect = { literal = \"1\" }\ndecoding = \"fast\"\n",
            "decoding: `fast` is not one of invariant, incremental",
        ),
        (
            "kind = \"recite\"\nmodels = [\"cand\"]\npromt = \"x\"\nexpect = { literal = \"1\" }\n",
            "unknown key `promt` (did you mean `prompt`?)",
        ),
    ];
    for (i, (body, want)) in cases.iter().enumerate() {
        let root = root(&format!("schema{i}"), &[("bad.toml", body)]);
        let (_, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
        let e = planned[0].case.as_ref().unwrap_err();
        assert!(
            e.message.contains(want) && e.message.contains("suites/bad.toml"),
            "case {i}: {}",
            e.message
        );
    }
}

#[test]
fn golden_texts_are_compared_exactly() {
    let root = root("golden", &[("r.toml", &recite_case("\"cand\""))]);
    let (registry, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
    let r = RunContext::new(
        &common::fixture_config(&root),
        registry,
        Arc::new(engine()),
        1,
    );
    let o = quantgate::schedule::trial(&r, &planned[0], std::path::Path::new("goldens"));
    let text = quantgate::golden::render(&o, "suites/r.toml");
    assert!(
        text.contains("texts:\n  decoding: invariant (min_rows 32)\n"),
        "{text}"
    );
    let parsed = quantgate::golden::parse(&text).unwrap();
    assert_eq!(parsed.texts, o.texts);
    let case = &planned[0].case.as_ref().unwrap().case;
    assert!(quantgate::golden::compare(&parsed, &parsed, case).is_empty());
    let mut changed = o.clone();
    changed.texts.insert("output".into(), "3456799".into());
    let now =
        quantgate::golden::parse(&quantgate::golden::render(&changed, "suites/r.toml")).unwrap();
    let diffs = quantgate::golden::compare(&parsed, &now, case);
    assert_eq!(
        diffs,
        ["output: \"3456789\" → \"3456799\" (texts compare exactly)"]
    );
}

/// A golden that names a metric its case's kind does not declare (a hand
/// edit gone wrong) says so, with the nearest declared name.
#[test]
fn a_golden_naming_an_undeclared_metric_says_which() {
    let root = root("golden-undeclared", &[("r.toml", &recite_case("\"cand\""))]);
    let (registry, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
    let r = RunContext::new(
        &common::fixture_config(&root),
        registry,
        Arc::new(engine()),
        1,
    );
    let o = quantgate::schedule::trial(&r, &planned[0], std::path::Path::new("goldens"));
    let case = &planned[0].case.as_ref().unwrap().case;
    let now = quantgate::golden::parse(&quantgate::golden::render(&o, "suites/r.toml")).unwrap();
    let mut edited = now.clone();
    let (name, v) = edited
        .metrics
        .pop_first()
        .expect("a recite case has metrics");
    let typo = format!("{name}x");
    edited.metrics.insert(typo.clone(), v);
    let diffs = quantgate::golden::compare(&edited, &now, case);
    assert!(
        diffs.contains(&format!(
            "{typo}: not a metric of a recite case (did you mean `{name}`?): the golden names a \
             metric its kind does not declare"
        )),
        "{diffs:?}"
    );
}
