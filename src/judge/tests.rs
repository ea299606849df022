use super::*;
use crate::core::ErrorKind;
use crate::core::{Outcome, Status};
use crate::schedule::trial;

use crate::engine::fake::{FakeEngine, FakeSpec};
use crate::execute::RunContext;
use crate::plan::plan;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A suites tree with two tiny GGUF "models" and one perplexity case.
fn suite(tag: &str, case_extra: &str) -> PathBuf {
    let root = crate::core::scratch::scratch(&format!("runner-{tag}"));
    std::fs::create_dir_all(root.join("ppl")).unwrap();
    let gguf = crate::models::gguf::tests::tiny_header();
    std::fs::write(root.join("m.gguf"), &gguf).unwrap();
    let sha = crate::core::fsutil::sha256_bytes(&gguf);
    // `sharp` is a file of its own: a case compares it with `good`, and a
    // model is never compared with its own file.
    let sharp: Vec<u8> = gguf.iter().copied().chain(*b"sharp").collect();
    std::fs::write(root.join("s.gguf"), &sharp).unwrap();
    let ssha = crate::core::fsutil::sha256_bytes(&sharp);
    std::fs::write(
        root.join("models.toml"),
        format!(
            "[good]\nsha256 = \"{sha}\"\nbytes = {}\npath = \"m.gguf\"\n\n[sharp]\nsha256 = \"{ssha}\"\npath = \"s.gguf\"\n",
            gguf.len()
        ),
    )
    .unwrap();
    let text: String = (0..300)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    std::fs::write(root.join("ppl/t.txt"), &text).unwrap();
    let tsha = crate::core::fsutil::sha256_bytes(text.as_bytes());
    std::fs::write(
        root.join("ppl/case.toml"),
        format!(
            "kind = \"perplexity\"\nmodels = [\"good\", \"sharp\"]\n[text]\npath = \"t.txt\"\nsha256 = \"{tsha}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = 3\n{case_extra}"
        ),
    )
    .unwrap();
    root
}

/// Independent reference: llama-perplexity's windows and a naive
/// log-softmax over the fake engine's logit formula.
fn reference_nll(spec: &FakeSpec, text: &[u8], n_ctx: usize, chunks: usize) -> (f64, usize) {
    let mut toks = vec![crate::engine::fake::BOS];
    toks.extend(text.iter().map(|&b| i32::from(b)));
    let (mut sum, mut n) = (0.0, 0);
    for c in 0..chunks.min(toks.len() / n_ctx) {
        let start = c * n_ctx;
        for pos in n_ctx / 2..n_ctx - 1 {
            let input = if pos == 0 {
                crate::engine::fake::BOS
            } else {
                toks[start + pos]
            };
            let row: Vec<f64> = spec.logits(input, pos).into_iter().map(f64::from).collect();
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
            sum += lse - row[toks[start + pos + 1] as usize];
            n += 1;
        }
    }
    (sum / n as f64, n)
}

fn run_all(root: &Path, engine: FakeEngine) -> Vec<Outcome> {
    let (registry, planned) = plan(root, &[], &[]).unwrap();
    // The suite's own cache (as tests/common's fixture_cache): no product
    // of a fake engine in the user's.
    let config = crate::core::config::Config::builder()
        .cache(root.join("qgcache"))
        .build()
        .unwrap();
    let cx = RunContext::new(&config, registry, Arc::new(engine), 1);
    planned
        .iter()
        .map(|p| trial(&cx, p, &root.join("goldens")))
        .collect()
}

/// Shards merged: every planned test once, gates judged again; a
/// missing, doubled, foreign or inconsistent outcome is refused by name.
#[test]
fn shards_merge_into_the_unsharded_run_or_are_refused() {
    let root = suite("merge", "[[gate]]\nmetric = \"ppl\"\nmax = 1e9\n");
    let (_, planned) = plan(&root, &[], &[]).unwrap();
    let out = run_all(&root, FakeEngine::new());
    assert!(out.iter().all(|o| o.status == Status::Pass), "{out:?}");
    let dirs: Vec<PathBuf> = (0..2).map(|k| root.join(format!("shard{k}"))).collect();
    for (o, d) in out.iter().zip(&dirs) {
        crate::report::write_outcome_json(d, o, None).unwrap();
    }
    let pinned = |_: &str| None;
    let merge_of = |sources: &[PathBuf]| {
        merge::merge(
            &planned,
            merge::read_outcomes(sources, None).unwrap(),
            &pinned,
        )
    };
    let merged = merge_of(&dirs).unwrap();
    assert_eq!(merged.len(), 2);
    for (m, o) in merged.iter().zip(&out) {
        assert_eq!((&m.case, &m.model, m.status), (&o.case, &o.model, o.status));
        assert_eq!(m.metrics, o.metrics);
        assert_eq!(m.gates, o.gates);
        assert!(!m.headline.is_empty(), "judged again: the table's metrics");
        // Keyless: every row says it is unauthenticated, in the table too.
        let why = m.unauthenticated.as_deref().expect("unauthenticated");
        assert!(why.contains("carries no MAC"), "{why}");
        assert!(m.notes.iter().any(|n| n.starts_with("unauthenticated: ")));
        assert!(crate::report::table(std::slice::from_ref(m)).contains("unauthenticated"));
    }
    // A shard whose outcome records no model sha256, where the registry
    // pins one: refused, never taken as the pinned file.
    let mut unrecorded = out[1].clone();
    unrecorded.model_sha256 = None;
    let blank = root.join("blank");
    crate::report::write_outcome_json(&blank, &unrecorded, None).unwrap();
    let found = merge::read_outcomes(&[dirs[0].clone(), blank], None).unwrap();
    let pin = |m: &str| (m == planned[1].model).then(|| "2".repeat(64));
    let e = merge::merge(&planned, found, &pin).unwrap_err();
    assert!(
        e.message.contains("ran another file of") && e.message.contains("not recorded"),
        "{}",
        e.message
    );
    // One shard gone: the missing test named.
    let e = merge_of(&dirs[..1]).unwrap_err();
    assert!(
        e.message.contains("1 of 2 planned tests have no outcome"),
        "{}",
        e.message
    );
    assert!(e.message.contains(&planned[1].name), "{}", e.message);
    assert_eq!(e.kind, ErrorKind::Input);
    // A shard counted twice.
    let twice = [dirs[0].clone(), dirs[1].clone(), dirs[0].clone()];
    let e = merge_of(&twice).unwrap_err();
    assert!(
        e.message
            .contains(&format!("{} ran 2 times", planned[0].name)),
        "{}",
        e.message
    );
    // A shard's outcome edited to pass with a violated gate: judged
    // again, it fails.
    let mut bad = out[1].clone();
    bad.metrics.insert("ppl".into(), 2e9);
    let edited = root.join("edited");
    crate::report::write_outcome_json(&edited, &bad, None).unwrap();
    let m = merge_of(&[dirs[0].clone(), edited.clone()]).unwrap();
    assert_eq!(m[1].status, Status::Fail);
    assert!(!m[1].gates[0].passed);
    // NaN never passes either (serde writes it as null: not an outcome).
    let mut nan = out[1].clone();
    nan.metrics.insert("ppl".into(), f64::NAN);
    crate::report::write_outcome_json(&edited, &nan, None).unwrap();
    match merge::read_outcomes(&[dirs[0].clone(), edited.clone()], None) {
        Err(e) => assert!(e.message.contains("edited"), "{}", e.message),
        Ok(found) => {
            let m = merge::merge(&planned, found, &pinned).unwrap();
            assert_ne!(m[1].status, Status::Pass, "{:?}", m[1]);
        }
    }
    // Another case version, another model file, another build, other
    // settings, a test the selection does not plan: each named.
    let mut other = out[1].clone();
    other.case_sha256 = Some("0".repeat(64));
    other.model_sha256 = Some("1".repeat(64));
    other.build.ggml = "another ggml".into();
    if let Some(s) = other.settings.as_mut() {
        s.n_ctx += 1;
    }
    crate::report::write_outcome_json(&edited, &other, None).unwrap();
    let mut foreign = out[1].clone();
    foreign.model = "nobody".into();
    crate::report::write_outcome_json(&edited, &foreign, None).unwrap();
    let found = merge::read_outcomes(&[dirs[0].clone(), edited.clone()], None).unwrap();
    let pin = |m: &str| (m == planned[1].model).then(|| "2".repeat(64));
    let e = merge::merge(&planned, found, &pin).unwrap_err();
    for want in [
        "ran another version of",
        "ran another file of",
        "the shards ran 2 builds",
        "ran under 2 settings",
        "is not a test of this selection",
    ] {
        assert!(e.message.contains(want), "{want}: {}", e.message);
    }
    // A file that is not an outcome is an error naming it.
    std::fs::write(edited.join("junk.json"), "{\"case\": 3}").unwrap();
    let e = merge::read_outcomes(std::slice::from_ref(&edited), None).unwrap_err();
    assert!(e.message.contains("junk.json"), "{}", e.message);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn fake_engine_through_every_stage() {
    let sharp = FakeSpec {
        confidence: 9.0,
        ..FakeSpec::default()
    };
    let root = suite("stages", "[[gate]]\nmetric = \"ppl\"\nmax = 1e9\n");
    let out = run_all(&root, FakeEngine::new().with("sharp", sharp.clone()));
    assert_eq!(out.len(), 2);
    let text = std::fs::read(root.join("ppl/t.txt")).unwrap();
    for (o, spec) in out.iter().zip([FakeSpec::default(), sharp]) {
        assert_eq!(o.status, Status::Pass, "{o:?}");
        let (want, n) = reference_nll(&spec, &text, 64, 3);
        assert_eq!(o.metrics["tokens_scored"], n as f64);
        assert_eq!(o.metrics["windows"], 3.0);
        assert!(
            (o.metrics["nll_mean"] - want).abs() < 1e-12,
            "{} vs {want}",
            o.metrics["nll_mean"]
        );
        assert!((o.metrics["ppl"] - want.exp()).abs() < 1e-9);
    }
}

/// Per-window mean NLLs and per-token NLLs, recomputed independently.
fn reference_windows(
    spec: &FakeSpec,
    text: &[u8],
    n_ctx: usize,
    chunks: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut toks = vec![crate::engine::fake::BOS];
    toks.extend(text.iter().map(|&b| i32::from(b)));
    let (mut means, mut all) = (Vec::new(), Vec::new());
    for c in 0..chunks {
        let start = c * n_ctx;
        let mut v = Vec::new();
        for pos in n_ctx / 2..n_ctx - 1 {
            let row: Vec<f64> = spec
                .logits(toks[start + pos], pos)
                .into_iter()
                .map(f64::from)
                .collect();
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
            v.push(lse - row[toks[start + pos + 1] as usize]);
        }
        means.push(v.iter().sum::<f64>() / v.len() as f64);
        all.extend(v);
    }
    (means, all)
}

/// The test suite with `sharp` as the candidate and `good` as its reference.
fn paired_suite(tag: &str, extra: &str) -> PathBuf {
    let root = suite(tag, extra);
    let case = std::fs::read_to_string(root.join("ppl/case.toml")).unwrap();
    let case = case.replace(
        "models = [\"good\", \"sharp\"]",
        "models = [\"sharp\"]\nreference = \"good\"",
    );
    std::fs::write(root.join("ppl/case.toml"), case).unwrap();
    root
}

#[test]
fn paired_delta_nll_against_a_reference_is_recomputed_independently() {
    let root = paired_suite(
        "paired",
        "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = 0.05\n",
    );
    let sharp = FakeSpec {
        confidence: 6.0,
        ..FakeSpec::default()
    };
    let out = run_all(&root, FakeEngine::new().with("sharp", sharp.clone()));
    let o = &out[0];
    assert!(o.error.is_none(), "{o:?}");
    let text = std::fs::read(root.join("ppl/t.txt")).unwrap();
    let (cm, ct) = reference_windows(&sharp, &text, 64, 3);
    let (rm, rt) = reference_windows(&FakeSpec::default(), &text, 64, 3);
    let d: Vec<f64> = cm.iter().zip(&rm).map(|(a, b)| a - b).collect();
    let mean = d.iter().sum::<f64>() / 3.0;
    let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
    use statrs::distribution::ContinuousCDF;
    let t = statrs::distribution::StudentsT::new(0.0, 1.0, 2.0)
        .unwrap()
        .inverse_cdf(0.975);
    let close = |name: &str, want: f64| {
        let got = o.metrics[name];
        assert!(
            (got - want).abs() < 1e-9 * want.abs().max(1.0),
            "{name}: {got} vs {want}"
        );
    };
    close("delta_nll_mean", mean);
    close("delta_nll_ci95_lo", mean - t * sd / 3f64.sqrt());
    close("delta_nll_ci95_hi", mean + t * sd / 3f64.sqrt());
    close(
        "windows_better",
        d.iter().filter(|x| **x < 0.0).count() as f64,
    );
    close("ppl_ref", (rt.iter().sum::<f64>() / rt.len() as f64).exp());
    // llama-perplexity's token-level figures from the per-token NLLs.
    let n = ct.len() as f64;
    let (fa, fb) = (ct.iter().sum::<f64>() / n, rt.iter().sum::<f64>() / n);
    let va = ct.iter().map(|x| (x - fa).powi(2)).sum::<f64>() / n / (n - 1.0);
    let vb = rt.iter().map(|x| (x - fb).powi(2)).sum::<f64>() / n / (n - 1.0);
    let cov = ct
        .iter()
        .zip(&rt)
        .map(|(a, b)| (a - fa) * (b - fb))
        .sum::<f64>()
        / n
        / (n - 1.0);
    close("ln_ppl_ratio", fa - fb);
    close("ln_ppl_ratio_se", (va + vb - 2.0 * cov).sqrt());
    close("ppl_ratio", (fa - fb).exp());
    close("nll_token_corr", cov / (va.sqrt() * vb.sqrt()));
    let (lo, hi) = (
        o.metrics.get("delta_nll_boot95_lo"),
        o.metrics.get("delta_nll_boot95_hi"),
    );
    // Three windows are too few for a block bootstrap: no interval at all.
    assert!(lo.is_none() && hi.is_none(), "{lo:?} {hi:?}");
    // Confidence on the wrong next byte costs: the candidate is worse.
    assert!(mean > 0.0);
    assert_eq!(
        o.status,
        if mean <= 0.05 {
            Status::Pass
        } else {
            Status::Fail
        }
    );
}

#[test]
fn reference_with_another_tokenizer_is_refused() {
    let root = paired_suite("tok", "");
    let other = FakeSpec {
        tokenizer: "another-base-model",
        ..FakeSpec::default()
    };
    let out = run_all(&root, FakeEngine::new().with("good", other));
    let e = out[0].error.as_deref().unwrap();
    assert!(
        e.contains("case.toml:3:13: reference: `good` and `sharp` have different tokenizers"),
        "{e}"
    );
    assert!(out[0].input_error);
}

#[test]
fn gate_violation_fails_with_observed_and_threshold() {
    let root = suite(
        "gate",
        "[[gate]]\nmetric = \"ppl\"\nmax = 1.5\n[[gate]]\nmetric = \"windows\"\nmin = 3\n",
    );
    let out = run_all(&root, FakeEngine::new());
    let o = &out[0];
    assert_eq!(o.status, Status::Fail);
    let msg = o.failure_message().unwrap();
    assert!(
        msg.starts_with("ppl/case::good: gate violated\n  ppl = "),
        "{msg}"
    );
    assert!(msg.contains("violates ppl ≤ 1.5 (max 1.5)"), "{msg}");
    assert!(!msg.contains("windows"), "{msg}");
}

#[test]
fn nan_logits_and_decode_errors_are_errors_not_numbers() {
    let root = suite("faults", "[[gate]]\nmetric = \"ppl\"\nmax = 1e9\n");
    let engine = FakeEngine::new()
        .with(
            "good",
            FakeSpec {
                nan_at: Some((1, 40)),
                ..FakeSpec::default()
            },
        )
        .with(
            "sharp",
            FakeSpec {
                decode_error_in: Some(2),
                ..FakeSpec::default()
            },
        );
    let out = run_all(&root, engine);
    assert!(
        out.iter()
            .all(|o| o.status == Status::Error && o.metrics.is_empty()),
        "{out:?}"
    );
    let e0 = out[0].error.as_deref().unwrap();
    assert!(
        e0.contains("model `good`") && e0.contains("m.gguf") && e0.contains("sha256 "),
        "{e0}"
    );
    assert!(
        e0.contains("non-finite logit NaN for token 7 at position 40"),
        "{e0}"
    );
    let e1 = out[1].error.as_deref().unwrap();
    assert!(e1.contains("llama_decode failed (1) in window 2"), "{e1}");
}

#[test]
fn n_ctx_beyond_training_and_text_pin_mismatch_name_the_case() {
    let root = suite("ctx", "");
    let small = FakeSpec {
        n_ctx_train: 32,
        ..FakeSpec::default()
    };
    let out = run_all(&root, FakeEngine::new().with("good", small));
    let e = out[0].error.as_deref().unwrap();
    assert!(e.contains("case.toml:7:8: window: context 64 is larger than the training context 32 of model `good`"), "{e}");
    assert!(out[0].input_error);
    std::fs::write(root.join("ppl/t.txt"), "changed").unwrap();
    let out = run_all(&root, FakeEngine::new());
    let e = out[1].error.as_deref().unwrap();
    assert!(
        e.contains("case.toml:5:10: text.sha256:") && e.contains("does not match its pin"),
        "{e}"
    );
}

#[test]
fn broken_case_fails_alone_and_unknown_alias_names_the_case() {
    let root = suite("broken", "");
    std::fs::write(root.join("ppl/bad.toml"), "kind = \"perplexity\"\nmodels = [\"nosuch\"]\n[text]\npath = \"t.txt\"\nsha256 = \"x\"\npromt = 1\n").unwrap();
    std::fs::write(
        root.join("ppl/alias.toml"),
        std::fs::read_to_string(root.join("ppl/case.toml"))
            .unwrap()
            .replace("\"sharp\"", "\"shrap\""),
    )
    .unwrap();
    let (_, planned) = plan(&root, &[], &[]).unwrap();
    let names: Vec<_> = planned.iter().map(|p| p.name.as_str()).collect();
    assert!(
        names.contains(&"ppl/bad") && names.contains(&"ppl/case::good"),
        "{names:?}"
    );
    let bad = planned.iter().find(|p| p.name == "ppl/bad").unwrap();
    let e = bad.case.as_ref().unwrap_err();
    assert!(
        e.message
            .contains("suites/ppl/bad.toml:6:1: text.promt: unknown key `promt`"),
        "{}",
        e.message
    );
    let alias = planned
        .iter()
        .find(|p| p.name == "ppl/alias::shrap")
        .unwrap();
    let e = alias.case.as_ref().unwrap_err();
    assert!(
        e.message
            .contains("alias.toml:2:19: models: model alias `shrap` is not in"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("(did you mean `sharp`?)"),
        "{}",
        e.message
    );
}

#[test]
fn registry_problems_are_input_errors() {
    let root = suite("registry", "");
    let good = std::fs::read_to_string(root.join("models.toml")).unwrap();
    std::fs::write(
        root.join("models.toml"),
        good.replace("path = \"m.gguf\"\n\n", "path = \"missing.gguf\"\n\n"),
    )
    .unwrap();
    let out = run_all(&root, FakeEngine::new());
    let e = out[0].error.as_deref().unwrap_or_else(|| panic!("{out:?}"));
    assert!(
        e.contains("model `good`: file") && e.contains("missing.gguf does not exist"),
        "{e}"
    );
    // A directory, or a symlink loop, where the file should be: said as it is.
    std::fs::create_dir_all(root.join("adir")).unwrap();
    std::fs::write(
        root.join("models.toml"),
        good.replace("path = \"m.gguf\"\n\n", "path = \"adir\"\n\n"),
    )
    .unwrap();
    let out = run_all(&root, FakeEngine::new());
    let e = out[0].error.as_deref().unwrap();
    assert!(
        e.contains("model `good`") && e.contains("adir is a directory"),
        "{e}"
    );
    assert!(out[0].input_error);
    std::os::unix::fs::symlink(root.join("loop"), root.join("loop")).unwrap();
    std::fs::write(
        root.join("models.toml"),
        good.replace("path = \"m.gguf\"\n\n", "path = \"loop\"\n\n"),
    )
    .unwrap();
    let out = run_all(&root, FakeEngine::new());
    let e = out[0].error.as_deref().unwrap();
    assert!(
        e.contains("model `good`") && e.contains("loop") && !e.contains("does not exist"),
        "{e}"
    );
    // Wrong sha256: expected, actual and size are shown.
    let wrong = format!("0{}", &crate::core::fsutil::sha256_bytes(b"other")[1..]);
    std::fs::write(
        root.join("models.toml"),
        format!("[good]\nsha256 = \"{wrong}\"\npath = \"m.gguf\"\n[sharp]\nsha256 = \"{wrong}\"\npath = \"m.gguf\"\n"),
    )
    .unwrap();
    let out = run_all(&root, FakeEngine::new());
    let e = out[0].error.as_deref().unwrap();
    assert!(
        e.contains("sha256 mismatch")
            && e.contains("expected 0")
            && e.contains("actual   ")
            && e.contains("bytes)"),
        "{e}"
    );
    // A truncated GGUF pinned by its own sha256 is stopped by the preflight.
    let t = &crate::models::gguf::tests::tiny_header()[..30];
    std::fs::write(root.join("m.gguf"), t).unwrap();
    std::fs::write(root.join("models.toml"), format!("[good]\nsha256 = \"{}\"\npath = \"m.gguf\"\n[sharp]\nsha256 = \"{}\"\npath = \"m.gguf\"\n", crate::core::fsutil::sha256_bytes(t), crate::core::fsutil::sha256_bytes(t))).unwrap();
    let out = run_all(&root, FakeEngine::new());
    let e = out[0].error.as_deref().unwrap();
    assert!(
        e.contains("not a usable GGUF file") && e.contains("m.gguf"),
        "{e}"
    );
    assert!(out[0].input_error);
}
