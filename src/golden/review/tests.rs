use super::*;
use std::sync::Arc;

/// This repository's `ppl/delta_nll` case, its declarations only.
fn delta_nll_case() -> Arc<Case> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("suites/ppl/delta_nll.toml");
    crate::plan::parse::parse_case_with(
        &file,
        Path::new("suites/ppl/delta_nll.toml"),
        "ppl/delta_nll",
        &declarations_only(),
    )
    .unwrap()
    .case
}

fn declarations_only() -> crate::plan::parse::Overrides {
    crate::plan::parse::Overrides {
        models: Some(vec!["m".into()]),
        reference: Some("r".into()),
    }
}

/// The real golden of `ppl/delta_nll` on Q8_0, its text.
fn golden_text() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join("goldens/ppl/delta_nll/smollm2-q8_0.snap")).unwrap()
}

/// A side holding `text` as the golden of `case::model`.
fn side(tests: &[(&str, &str, &str)]) -> Side {
    let mut s = Side::default();
    for (case, model, text) in tests {
        s.goldens
            .insert((case.to_string(), model.to_string()), parse(text).unwrap());
    }
    s
}

/// `text` with metric `name` set to `v`.
fn with_metric(text: &str, name: &str, v: f64) -> String {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("{name}"));
    text.replacen(line, &format!("  {name}: {v:?}"), 1)
}

fn metric(text: &str, name: &str) -> f64 {
    parse(text).unwrap().metrics[name]
}

fn the(r: &Review, item: &Item) -> Change {
    r.changes
        .iter()
        .find(|c| &c.item == item)
        .unwrap_or_else(|| panic!("{item:?}: {r:?}"))
        .clone()
}

/// A float is within noise inside its golden test's tolerance, and beyond
/// it has moved, by how much beyond; a count moves at any change; NaN is
/// within noise of nothing.
#[test]
fn floats_move_beyond_their_tolerance_and_counts_at_any_change() {
    let case = delta_nll_case();
    let declared = |n: &str| (n == "ppl/delta_nll").then(|| case.clone());
    let old = golden_text();
    let ppl = metric(&old, "ppl");
    let t = ("ppl/delta_nll", "smollm2-q8_0");
    for (v, class) in [
        (ppl, Class::Unchanged),
        (ppl * (1.0 + 1e-7), Class::WithinNoise),
        (ppl * 1.01, Class::Moved),
        (f64::NAN, Class::Moved),
    ] {
        let new = with_metric(&old, "ppl", v);
        let r = review(
            &side(&[(t.0, t.1, &old)]),
            &side(&[(t.0, t.1, &new)]),
            &declared,
        );
        let c = the(&r, &Item::Metric("ppl".into()));
        assert_eq!(c.class, class, "{v}: {c:?}");
        assert_eq!(c.label.as_deref(), Some("PPL"));
        if class == Class::Moved && v.is_finite() {
            // The case's default tolerance: atol 1e-9 + rtol 1e-6·|old|.
            let allowed = 1e-9 + 1e-6 * ppl;
            assert!((c.excess - (v - ppl).abs() / allowed).abs() < 1e-6 * c.excess);
            assert!(r.fails(FailOn::Moved) && !r.fails(FailOn::Flipped));
        }
    }
    let new = with_metric(&old, "windows_better", 5.0);
    let r = review(
        &side(&[(t.0, t.1, &old)]),
        &side(&[(t.0, t.1, &new)]),
        &declared,
    );
    let c = the(&r, &Item::Metric("windows_better".into()));
    assert_eq!((c.class, c.noise), (Class::Moved, Some(Noise::Exact)));
}

/// ΔNLL beyond its tolerance but inside the old golden's paired 95% CI is
/// within noise, and so is a bound of that interval that moved by less
/// than half its width; beyond the interval it has moved.
#[test]
fn a_paired_interval_is_the_noise_of_its_metric() {
    let case = delta_nll_case();
    let declared = |n: &str| (n == "ppl/delta_nll").then(|| case.clone());
    let old = golden_text();
    let (lo, hi) = (
        metric(&old, "delta_nll_ci95_lo"),
        metric(&old, "delta_nll_ci95_hi"),
    );
    let t = ("ppl/delta_nll", "smollm2-q8_0");
    let inside = with_metric(&old, "delta_nll_mean", (lo + hi) / 2.0 + (hi - lo) / 4.0);
    let inside = with_metric(&inside, "delta_nll_ci95_hi", hi + (hi - lo) / 4.0);
    let r = review(
        &side(&[(t.0, t.1, &old)]),
        &side(&[(t.0, t.1, &inside)]),
        &declared,
    );
    let mean = the(&r, &Item::Metric("delta_nll_mean".into()));
    assert_eq!(mean.class, Class::WithinNoise, "{mean:?}");
    assert!(matches!(mean.noise, Some(Noise::Interval { ref name, .. }) if name == "ci95"));
    let bound = the(&r, &Item::Metric("delta_nll_ci95_hi".into()));
    assert_eq!(bound.class, Class::WithinNoise, "{bound:?}");
    assert!(matches!(bound.noise, Some(Noise::HalfWidth { ref of, .. }) if of == "delta_nll_mean"));
    assert!(!r.fails(FailOn::Moved));
    let outside = with_metric(&old, "delta_nll_mean", hi + 1e-3);
    let r = review(
        &side(&[(t.0, t.1, &old)]),
        &side(&[(t.0, t.1, &outside)]),
        &declared,
    );
    assert_eq!(
        the(&r, &Item::Metric("delta_nll_mean".into())).class,
        Class::Moved
    );
}

/// A gate whose verdict changed, and the status with it, flipped; a test
/// on one side only is added or removed; the worst comes first, and the
/// summary counts every class.
#[test]
fn gates_flip_tests_come_and_go_worst_first() {
    let case = delta_nll_case();
    let declared = |n: &str| (n == "ppl/delta_nll").then(|| case.clone());
    let old = golden_text();
    let failed = old
        .replace("status: pass", "status: fail")
        .replace("delta_nll_mean ≤ 0.05: pass", "delta_nll_mean ≤ 0.05: fail");
    let moved = with_metric(&old, "ppl", 30.0);
    let r = review(
        &side(&[
            ("ppl/delta_nll", "q8", &old),
            ("ppl/delta_nll", "q6", &old),
            ("ppl/delta_nll", "gone", &old),
        ]),
        &side(&[
            ("ppl/delta_nll", "q8", &failed),
            ("ppl/delta_nll", "q6", &moved),
            ("ppl/delta_nll", "new", &old),
        ]),
        &declared,
    );
    let classes: Vec<Class> = r
        .changes
        .iter()
        .map(|c| c.class)
        .filter(|c| *c != Class::Unchanged)
        .collect();
    assert_eq!(
        classes,
        [
            Class::Flipped,
            Class::Flipped,
            Class::Moved,
            Class::Removed,
            Class::Added
        ]
    );
    assert_eq!(r.changes[0].model, "q8");
    assert!(r.fails(FailOn::Flipped));
    assert!(r
        .summary()
        .starts_with("4 models × 1 case: 2 flipped, 1 moved, 0 within noise, 1 added, 1 removed"));
}

/// A case that neither side can read is compared with the default
/// tolerance, every metric a float, and said.
#[test]
fn an_unreadable_case_falls_back_to_the_default_tolerance_and_is_said() {
    let old = golden_text();
    let new = with_metric(&old, "windows_better", 5.0);
    let r = review(
        &side(&[("gone/case", "m", &old)]),
        &side(&[("gone/case", "m", &new)]),
        &|_| None,
    );
    assert_eq!(r.undeclared, ["gone/case"]);
    let c = the(&r, &Item::Metric("windows_better".into()));
    assert_eq!(c.class, Class::Moved);
    assert!(matches!(c.noise, Some(Noise::Tolerance { .. })));
    let md = render::markdown(
        &r,
        &render::Context {
            base: "a",
            head: "b",
            unexplained: &[],
        },
    );
    assert!(md.contains("`gone/case` could not be read"), "{md}");
}
