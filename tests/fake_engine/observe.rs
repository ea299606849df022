//! Plan by observation on the fake engine: cases that score the same
//! windows of a model form one group with one decode, the reference's work
//! folds into a reference-only group that runs first, and every outcome is
//! bitwise the one each trial gets when it runs alone.

use crate::common;
use quantgate::core::{Outcome, Status};
use quantgate::engine::fake::{FakeEngine, FakeSpec};
use quantgate::execute::RunContext;
use quantgate::plan::groups::groups;
use quantgate::plan::plan;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn engine() -> FakeEngine {
    FakeEngine::new()
        .with(
            "ref",
            FakeSpec {
                confidence: 9.0,
                ..FakeSpec::default()
            },
        )
        .with(
            "cand",
            FakeSpec {
                confidence: 2.5,
                ..FakeSpec::default()
            },
        )
}

/// ppl (cand, other; reference ref), kld (cand; reference ref) on the same
/// windows, ppl on fewer chunks (cand), and a recitation (cand).
fn fixture(tag: &str) -> PathBuf {
    let root = common::fake_root(tag, &[("ref", 100), ("cand", 101), ("other", 102)]);
    let text: String = (0..2000)
        .map(|i| char::from(b'a' + ((i * 7 + i / 13) % 26) as u8))
        .collect();
    std::fs::write(root.join("suites/t.txt"), &text).unwrap();
    let sha = quantgate::core::fsutil::sha256_bytes(text.as_bytes());
    let body = |chunks: usize| {
        format!(
            "[text]\npath = \"t.txt\"\nsha256 = \"{sha}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = {chunks}\n"
        )
    };
    let write = |name: &str, head: &str, chunks: usize| {
        std::fs::write(
            root.join(format!("suites/{name}.toml")),
            format!("{head}\n{}", body(chunks)),
        )
        .unwrap();
    };
    write(
        "ppl",
        "kind = \"perplexity\"\nmodels = [\"cand\", \"other\"]\nreference = \"ref\"",
        6,
    );
    write(
        "kld",
        "kind = \"kld\"\nmodels = [\"cand\"]\nreference = \"ref\"\n[kld]\nmax_kept = 16",
        6,
    );
    write("short", "kind = \"perplexity\"\nmodels = [\"cand\"]", 3);
    std::fs::write(
        root.join("suites/recite.toml"),
        "kind = \"recite\"\nmodels = [\"cand\"]\ntemplate = \"raw\"\nprompt = \"abc\"\nexpect = { literal = \"defgh\" }\n",
    )
    .unwrap();
    root
}

/// A context with its own reference store under `root`, and the count of
/// the windows the engine's teacher-forced decodes held (a decode in
/// step with a stored reference's reading is several calls, two windows
/// each: windows count what was decoded).
fn runner(root: &Path) -> (RunContext, Vec<quantgate::plan::Planned>, Arc<AtomicUsize>) {
    let (registry, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
    let e = engine();
    let decodes = e.windows.clone();
    let mut cx = RunContext::new(&common::fixture_config(root), registry, Arc::new(e), 1);
    cx.references.dir = root.join("cache");
    (cx, planned, decodes)
}

#[test]
fn one_group_per_model_and_observation_references_first() {
    let root = fixture("observe-groups");
    let (_, planned, _) = runner(&root);
    let all = vec![true; planned.len()];
    let gs = groups(&planned, &all, true);
    let names = |ix: &[usize]| -> Vec<String> {
        let mut v: Vec<String> = ix.iter().map(|&i| planned[i].name.clone()).collect();
        v.sort();
        v
    };
    // The reference-only group of `ref` comes first and provides for all
    // three trials that read it.
    assert!(gs[0].reference_only() && gs[0].model == "ref", "{gs:?}");
    assert_eq!(
        names(&gs[0].provides),
        ["kld::cand", "ppl::cand", "ppl::other"]
    );
    let shared = gs
        .iter()
        .find(|g| names(&g.trials) == ["kld::cand", "ppl::cand"])
        .expect("kld and ppl on cand: one group");
    assert!(shared.after.contains(&0));
    // Other windows, another model, a generation: groups of their own.
    for alone in ["short::cand", "ppl::other", "recite::cand"] {
        assert!(
            gs.iter().any(|g| names(&g.trials) == [alone]),
            "{alone}: {gs:?}"
        );
    }
    assert_eq!(gs.len(), 5);
    // Every selected trial in exactly one group; a filtered-out one in none.
    let mut some = all.clone();
    some[planned.iter().position(|p| p.name == "kld::cand").unwrap()] = false;
    let gs = groups(&planned, &some, true);
    let count: usize = gs.iter().map(|g| g.trials.len()).sum();
    assert_eq!(count, planned.len() - 1);
    assert!(gs
        .iter()
        .all(|g| !names(&g.trials).contains(&"kld::cand".to_string())
            && !names(&g.provides).contains(&"kld::cand".to_string())));
    // No sharing: a group per trial, no reference work planned.
    let gs = groups(&planned, &all, false);
    assert_eq!(gs.len(), planned.len());
    assert!(gs
        .iter()
        .all(|g| g.trials.len() == 1 && g.provides.is_empty()));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_shared_decode_gives_every_trial_its_outcome_alone_bitwise() {
    let root = fixture("observe-shared");
    // Alone: every trial in a fresh context and cache.
    let (_, planned, _) = runner(&root);
    let alone: Vec<Outcome> = planned
        .iter()
        .map(|p| {
            let _ = std::fs::remove_dir_all(root.join("cache"));
            let (cx, _, _) = runner(&root);
            quantgate::schedule::trial(&cx, p, Path::new("goldens"))
        })
        .collect();
    let _ = std::fs::remove_dir_all(root.join("cache"));
    let (cx, _, decodes) = runner(&root);
    let mut heard: Vec<(Vec<String>, usize)> = Vec::new();
    let (together, work) = quantgate::schedule::Schedule::here(&std::sync::Arc::new(cx), &planned)
        .run(
            &planned,
            1,
            &Default::default(),
            Path::new("goldens"),
            &mut |names, provides| {
                heard.push((names.iter().map(|n| n.to_string()).collect(), provides))
            },
            &mut |_, _, _| {},
        );
    assert_eq!(together.len(), alone.len());
    for (a, t) in alone.iter().zip(&together) {
        assert_eq!((&a.case, &a.model), (&t.case, &t.model));
        assert_eq!(a.status, Status::Pass, "{}: {:?}", a.case, a.error);
        assert_eq!(t.status, Status::Pass, "{}: {:?}", t.case, t.error);
        assert_eq!(common::bits(a), common::bits(t), "{}::{}", a.case, a.model);
        assert_eq!(a.texts, t.texts);
    }
    // The reference's work ran first, once: both products of `ref`.
    assert_eq!(heard[0], (vec![], 3));
    assert_eq!(work.len(), 1, "{work:?}");
    assert_eq!((work[0].0.as_str(), work[0].2), ("ref", 2));
    // kld and ppl on cand read one decode: ref, cand (both cases), other
    // — three observations of 6 windows, each window decoded once, for
    // five trials and two products; ppl on fewer chunks of cand, whose
    // group runs after that decode (the lighter one), reads the 3 windows
    // the kld case kept.
    let kld = together.iter().find(|o| o.case == "kld").unwrap();
    assert_eq!(kld.timings.shared_with, 1);
    assert_eq!(decodes.load(Ordering::Relaxed), 6 + 6 + 6);
    // A second run finds cand's and other's scores kept, and the kld
    // case's comparison of each window with the reference: nothing is
    // decoded, and the numbers are the same.
    let (cx, _, decodes) = runner(&root);
    let (again, work) = quantgate::schedule::Schedule::here(&std::sync::Arc::new(cx), &planned)
        .run(
            &planned,
            1,
            &Default::default(),
            Path::new("goldens"),
            &mut |_, _| {},
            &mut |_, _, _| {},
        );
    assert!(work.is_empty(), "{work:?}");
    for (a, t) in again.iter().zip(&together) {
        assert_eq!(common::bits(a), common::bits(t), "{}::{}", a.case, a.model);
    }
    assert_eq!(decodes.load(Ordering::Relaxed), 0);
    // Three jobs at once, fresh cache: the same outcomes and decodes, each
    // reading group started only after the reference work it reads.
    let _ = std::fs::remove_dir_all(root.join("cache"));
    let (cx, _, decodes) = runner(&root);
    let heard = std::sync::Mutex::new(Vec::new());
    let (parallel, work) = quantgate::schedule::Schedule::here(&std::sync::Arc::new(cx), &planned)
        .run(
            &planned,
            3,
            &Default::default(),
            Path::new("goldens"),
            &mut |names, provides| {
                heard.lock().unwrap().push((
                    names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                    provides,
                ))
            },
            &mut |_, _, _| {},
        );
    assert_eq!(work.len(), 1, "{work:?}");
    for (a, t) in parallel.iter().zip(&together) {
        assert_eq!((&a.case, &a.model), (&t.case, &t.model));
        assert_eq!(common::bits(a), common::bits(t), "{}::{}", a.case, a.model);
    }
    // The fewer chunks of cand decoded again only when their group ran
    // before the kld case's decode kept them (three at once: either).
    let n = decodes.load(Ordering::Relaxed);
    assert!(n == 6 + 6 + 6 || n == 6 + 6 + 3 + 6, "{n}");
    let heard = heard.into_inner().unwrap();
    let first_kld = heard
        .iter()
        .position(|(n, _)| n.iter().any(|n| n.starts_with("kld::")))
        .expect("the kld group ran");
    let reference = heard
        .iter()
        .position(|(_, p)| *p > 0)
        .expect("reference work ran");
    assert!(reference < first_kld, "{heard:?}");
    let _ = std::fs::remove_dir_all(&root);
}

/// The default suites, planned with no model loaded: groups start heaviest
/// first, so the speed group (its two quants measured together, with F16
/// once a round: 3 rounds) and a multiple-choice trial (the candidate's and the reference's
/// scores) start before every recitation (a few seconds each), which fill
/// the end of a run instead of one long trial running alone there.
#[test]
fn speed_and_multiple_choice_groups_start_before_recitations() {
    let root = quantgate::harness::project_root().join("suites");
    let (_, planned) = plan(&root, &[], &[]).unwrap();
    let all = vec![true; planned.len()];
    let gs = groups(&planned, &all, true);
    let kind = |g: &quantgate::plan::groups::Group| -> String {
        match g.trials.first() {
            Some(&i) => planned[i].case.as_ref().unwrap().case.kind.to_string(),
            None => "reference".into(),
        }
    };
    let at = |k: &str| -> Vec<usize> { (0..gs.len()).filter(|&g| kind(&gs[g]) == k).collect() };
    let (speed, mc, recite) = (at("speed"), at("multiple_choice"), at("recite"));
    assert_eq!(speed.len(), 1, "{speed:?}");
    assert_eq!(gs[speed[0]].trials.len(), 2, "one group for both quants");
    let names: Vec<String> = mc
        .iter()
        .map(|&g| {
            gs[g]
                .trials
                .iter()
                .map(|&i| {
                    format!(
                        "{}::{}",
                        planned[i].case.as_ref().unwrap().case.name,
                        planned[i].model
                    )
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    // Three fixed cases on two models, and two sequential cases, each one
    // group for all its models.
    assert_eq!(mc.len(), 8, "{mc:?} {names:?}");
    assert!(!recite.is_empty());
    let first_recitation = recite[0];
    for g in speed.iter().chain(&mc) {
        assert!(
            *g < first_recitation,
            "group {g} ({}, weight {}) starts after recitation group {first_recitation}",
            kind(&gs[*g]),
            gs[*g].weight
        );
    }
    let w = |g: usize| gs[g].weight;
    assert!(speed.iter().all(|&g| w(g) == 3 * 2 * 4 * (256 + 2 * 32)));
}
