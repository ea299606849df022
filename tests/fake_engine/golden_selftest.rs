//! Self-tests of the golden workflow's own output, on the fake engine: each
//! scenario's failure message is snapshot-tested with insta
//! (tests/snapshots/), and CI mode never touches a file under goldens/.

use crate::common;

/// `insta::assert_snapshot!` under the snapshot names and folder this file
/// had as a test binary of its own (`tests/snapshots/golden_selftest__*`).
macro_rules! assert_snapshot {
    ($name:literal, $value:expr) => {{
        let mut settings = insta::Settings::clone_current();
        settings.set_prepend_module_to_snapshot(false);
        settings.set_snapshot_path("../snapshots");
        settings.bind(|| insta::assert_snapshot!(concat!("golden_selftest__", $name), $value));
    }};
}

use quantgate::engine::fake::FakeEngine;
use quantgate::execute::RunContext;
use quantgate::golden::{self, update_mode_from, Goldens, UpdateMode};
use quantgate::harness::run_trial;
use quantgate::plan::plan;
use quantgate::plan::Planned;
use std::path::PathBuf;
use std::sync::Arc;

/// A minimal GGUF v3 header: the fake engine never reads it, the preflight does.
fn tiny_gguf() -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    v
}

struct Fixture {
    root: PathBuf,
    goldens: Goldens,
    runner: RunContext,
    planned: Vec<Planned>,
}

fn fixture(tag: &str, gate_max: f64) -> Fixture {
    let root = common::scratch(&format!("golden-{tag}"));
    std::fs::create_dir_all(root.join("suites/ppl")).unwrap();
    let gguf = tiny_gguf();
    std::fs::write(root.join("suites/m.gguf"), &gguf).unwrap();
    std::fs::write(
        root.join("suites/models.toml"),
        format!(
            "[tiny]\nsha256 = \"{}\"\npath = \"m.gguf\"\n",
            quantgate::core::fsutil::sha256_bytes(&gguf)
        ),
    )
    .unwrap();
    let text: String = (0..300)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    std::fs::write(root.join("suites/ppl/t.txt"), &text).unwrap();
    std::fs::write(
        root.join("suites/ppl/case.toml"),
        format!(
            "kind = \"perplexity\"\nmodels = [\"tiny\"]\n[text]\npath = \"t.txt\"\nsha256 = \"{}\"\n\
             [window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = 3\n[[gate]]\nmetric = \"ppl\"\nmax = {gate_max:?}\n",
            quantgate::core::fsutil::sha256_bytes(text.as_bytes())
        ),
    )
    .unwrap();
    let (registry, planned) = plan(&root.join("suites"), &[], &[]).unwrap();
    Fixture {
        goldens: Goldens::new(root.join("goldens")),
        runner: RunContext::new(
            &common::fixture_config(&root),
            registry,
            Arc::new(FakeEngine::new()),
            1,
        ),
        planned,
        root,
    }
}

impl Fixture {
    /// Ok, or the trial's whole failure message.
    fn run(&self, mode: UpdateMode) -> Result<(), String> {
        run_trial(&self.runner, &self.planned[0], &self.goldens, mode).map_err(|e| e.to_string())
    }
    fn golden(&self) -> PathBuf {
        self.goldens.path("ppl/case", "tiny")
    }
    fn pending(&self) -> PathBuf {
        PathBuf::from(format!("{}.new", self.golden().display()))
    }
    fn edit_golden(&self, f: impl Fn(&str) -> String) {
        let g = std::fs::read_to_string(self.golden()).unwrap();
        std::fs::write(self.golden(), f(&g)).unwrap();
    }
}

fn replace_metric(golden: &str, name: &str, f: impl Fn(f64) -> f64) -> String {
    golden
        .lines()
        .map(|l| match l.strip_prefix(&format!("  {name}: ")) {
            Some(v) => format!("  {name}: {:?}", f(v.parse().unwrap())),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn missing_golden_writes_pending_and_fails() {
    let fx = fixture("missing", 1e9);
    let msg = fx.run(UpdateMode::New).unwrap_err();
    assert!(fx.pending().exists() && !fx.golden().exists());
    assert_snapshot!("missing_golden", msg);
}

#[test]
fn missing_golden_under_no_writes_nothing() {
    let fx = fixture("missing-no", 1e9);
    let msg = fx.run(UpdateMode::No).unwrap_err();
    assert!(!fx.pending().exists() && !fx.golden().exists());
    assert_snapshot!("missing_golden_no", msg.replace(", CI is set", ""));
}

#[test]
fn pass_and_drift_within_tolerance_leave_the_golden_alone() {
    let fx = fixture("pass", 1e9);
    fx.run(UpdateMode::Always).unwrap();
    let recorded = std::fs::read_to_string(fx.golden()).unwrap();
    assert_snapshot!("recorded_golden", recorded);
    fx.run(UpdateMode::New).unwrap();
    // A drift of 1e-8 relative is within the default tolerance (rtol 1e-6).
    fx.edit_golden(|g| replace_metric(g, "nll_mean", |v| v * (1.0 + 1e-8)));
    let drifted = std::fs::read(fx.golden()).unwrap();
    fx.run(UpdateMode::New).unwrap();
    assert_eq!(
        std::fs::read(fx.golden()).unwrap(),
        drifted,
        "golden rewritten"
    );
    assert!(!fx.pending().exists());
}

#[test]
fn changed_value_fails_with_a_diff_and_the_accept_command() {
    let fx = fixture("changed", 1e9);
    fx.run(UpdateMode::Always).unwrap();
    fx.edit_golden(|g| replace_metric(g, "nll_mean", |v| v * 1.01));
    let before = std::fs::read(fx.golden()).unwrap();
    let msg = fx.run(UpdateMode::New).unwrap_err();
    assert_eq!(
        std::fs::read(fx.golden()).unwrap(),
        before,
        "the golden itself is never overwritten in `new` mode"
    );
    assert!(fx.pending().exists());
    assert_snapshot!("changed_value", msg);
    // Counts compare exactly.
    fx.run(UpdateMode::Always).unwrap();
    fx.edit_golden(|g| g.replace("  windows: 3.0", "  windows: 3.000000001"));
    assert_snapshot!("changed_count", fx.run(UpdateMode::No).unwrap_err());
}

#[test]
fn corrupt_golden_fails_naming_the_file_and_is_never_regenerated() {
    let fx = fixture("corrupt", 1e9);
    fx.run(UpdateMode::Always).unwrap();
    fx.edit_golden(|g| g.replace("  ppl: ", "  ppl: not-a-number "));
    let before = std::fs::read(fx.golden()).unwrap();
    let msg = fx.run(UpdateMode::Always).unwrap_err();
    assert_eq!(std::fs::read(fx.golden()).unwrap(), before);
    assert_snapshot!("corrupt_golden", msg);
}

#[test]
fn golden_of_other_inputs_is_its_own_failure() {
    let fx = fixture("inputs", 1e9);
    fx.run(UpdateMode::Always).unwrap();
    // Looser numbers, but recorded for another model file.
    fx.edit_golden(|g| {
        let g = replace_metric(g, "ppl", |v| v * 2.0);
        let at = g.find("model_sha256: ").unwrap() + "model_sha256: ".len();
        format!("{}{}{}", &g[..at], "0".repeat(64), &g[at + 64..])
    });
    let msg = fx.run(UpdateMode::No).unwrap_err();
    assert_snapshot!("other_inputs", msg);
}

#[test]
fn gate_violation_fails_even_when_updating() {
    let fx = fixture("gate", 2.0);
    let msg = fx.run(UpdateMode::Always).unwrap_err();
    assert!(
        fx.golden().exists(),
        "the golden records the failing verdict"
    );
    assert_snapshot!("gate_violation", msg);
}

#[test]
fn orphan_goldens_are_listed_with_the_removal_command() {
    let fx = fixture("orphan", 1e9);
    fx.run(UpdateMode::Always).unwrap();
    let stale = fx.goldens.path("ppl/case", "gone-model");
    let gone = fx.goldens.path("ppl/deleted", "tiny");
    for p in [&stale, &gone] {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::copy(fx.golden(), p).unwrap();
    }
    let expected = vec![("ppl/case".to_string(), "tiny".to_string())];
    let found = golden::orphans(&fx.goldens, &expected, &["ppl/case".to_string()]);
    assert_eq!(
        found,
        vec![stale.clone(), gone.clone()]
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
    assert_snapshot!("orphans", golden::orphans_message(&fx.goldens, &found));
}

#[test]
fn update_requested_under_ci_is_an_error() {
    let e = update_mode_from(Some("always"), None, true).unwrap_err();
    assert_snapshot!("update_under_ci", e.message);
    assert!(update_mode_from(None, Some("new"), true).is_err());
    assert_eq!(update_mode_from(None, None, true).unwrap(), UpdateMode::No);
    assert_eq!(
        update_mode_from(None, None, false).unwrap(),
        UpdateMode::New
    );
    assert_eq!(
        update_mode_from(None, Some("always"), false).unwrap(),
        UpdateMode::Always
    );
    assert!(update_mode_from(Some("sometimes"), None, false).is_err());
}

#[test]
fn ci_mode_never_modifies_goldens() {
    let fx = fixture("ci", 2.0);
    let ci = update_mode_from(None, None, true).unwrap();
    // Missing, then present-and-changed, then corrupt: nothing is written.
    let before = common::tree(&fx.root.join("goldens"));
    assert!(fx.run(ci).is_err());
    assert_eq!(common::tree(&fx.root.join("goldens")), before);
    fx.run(UpdateMode::Always).unwrap_err();
    fx.edit_golden(|g| replace_metric(g, "ppl", |v| v + 1.0));
    let before = common::tree(&fx.root.join("goldens"));
    assert!(fx.run(ci).is_err());
    fx.edit_golden(|g| g.replace("status:", "stat:"));
    let corrupt = common::tree(&fx.root.join("goldens"));
    assert!(fx.run(ci).is_err());
    assert_eq!(common::tree(&fx.root.join("goldens")), corrupt);
    assert_ne!(before, corrupt);
}

/// The committed goldens are read by insta's own reader, and insta's own
/// writer gives them back byte for byte: `cargo insta review`/`accept` work on
/// them and leave them as quantgate wrote them. Each is also read back by
/// quantgate's reader with the inputs insta saw.
#[test]
fn insta_reads_and_rewrites_every_golden_byte_for_byte() {
    let goldens = quantgate::harness::project_root().join("goldens");
    let out = common::scratch("insta-rewrite");
    let mut n = 0;
    for (path, bytes) in common::tree(&goldens) {
        if path.extension().is_none_or(|e| e != "snap") {
            continue;
        }
        let text = String::from_utf8(bytes).unwrap();
        let snap = insta::Snapshot::from_file(&path)
            .unwrap_or_else(|e| panic!("insta cannot read {}: {e}", path.display()));
        let again = out.join(format!("{n}.snap"));
        snap.save(&again).unwrap();
        let rewritten = std::fs::read_to_string(&again).unwrap();
        assert_eq!(
            rewritten,
            text,
            "insta rewrites {} differently",
            path.display()
        );
        let ours = golden::parse(&text).unwrap();
        assert_eq!(
            snap.contents().as_text().map(|t| t.to_string() + "\n"),
            Some(ours.body.clone()),
            "{}",
            path.display()
        );
        n += 1;
    }
    assert!(n > 50, "only {n} goldens found under {}", goldens.display());
    let _ = std::fs::remove_dir_all(&out);
}

/// Random single-byte edits of a golden are either refused (a diff, a parse
/// error, other inputs) or meaningless: whenever the check still passes, the
/// edited golden reads back with the same status, gates, texts, identity
/// inputs and metrics within the case's tolerance — never a different
/// verdict or number that goes unnoticed. (`QG_GOLDEN_EDITS=N` for a longer
/// run; 20,000 edits found no counterexample.)
#[test]
fn an_edited_golden_never_passes_with_a_different_meaning() {
    let fx = fixture("edits", 1e9);
    fx.run(UpdateMode::Always).unwrap();
    let original = std::fs::read(fx.golden()).unwrap();
    let before = golden::parse(&String::from_utf8(original.clone()).unwrap()).unwrap();
    let case = &fx.planned[0].case.as_ref().unwrap().case;
    let mut rng = quantgate::measure::SplitMix64(1201);
    let (mut refused, mut harmless) = (0, 0);
    let edits: usize = std::env::var("QG_GOLDEN_EDITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for _ in 0..edits {
        let mut bytes = original.clone();
        let at = rng.below(bytes.len() as u64) as usize;
        bytes[at] = b" 0123456789.-eE:abcxyz\n"[rng.below(23) as usize];
        std::fs::write(fx.golden(), &bytes).unwrap();
        if fx.run(UpdateMode::No).is_err() {
            refused += 1;
            continue;
        }
        harmless += 1;
        let text = String::from_utf8(bytes).expect("a passing golden is UTF-8");
        let after = golden::parse(&text).expect("a passing golden parses");
        assert_eq!(after.status, before.status, "byte {at}");
        assert_eq!(after.gates, before.gates, "byte {at}");
        assert_eq!(after.texts, before.texts, "byte {at}");
        for k in ["case_sha256", "model_sha256"] {
            assert_eq!(after.inputs.0.get(k), before.inputs.0.get(k), "byte {at}");
        }
        let diffs = golden::compare(&before, &after, case);
        assert!(
            diffs.is_empty(),
            "byte {at}: a passing edit changed a value: {diffs:?}\n{text}"
        );
    }
    assert!(refused > 100, "{refused} refused, {harmless} harmless");
    std::fs::write(fx.golden(), &original).unwrap();
    fx.run(UpdateMode::No).unwrap();
}
