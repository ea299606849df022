//! Judge stage: gates → verdicts.
//!
//! Contract: every gate is evaluated and every violation listed; a missing
//! or NaN metric is a violation, never a pass.

use crate::core::case::Gate;
use crate::core::GateResult;
use std::collections::BTreeMap;

/// Evaluate the `gates` that apply to model `alias` on `metrics`.
pub(crate) fn judge(
    gates: &[Gate],
    alias: &str,
    metrics: &BTreeMap<String, f64>,
) -> Vec<GateResult> {
    let mut out = Vec::new();
    for g in gates.iter().filter(|g| g.applies_to(alias)) {
        let observed = metrics.get(&g.read).copied();
        let label = match &g.on {
            Some(on) => format!("{}.{on}", g.metric),
            None => g.metric.clone(),
        };
        // The interval the kind declared for the metric, when it has one.
        let interval = g.interval.as_ref().and_then(|iv| {
            let n = iv.windows.as_ref().and_then(|w| metrics.get(w));
            Some((
                *metrics.get(&iv.lo)?,
                *metrics.get(&iv.hi)?,
                n.map_or(0, |w| *w as usize),
            ))
        });
        for (bound, threshold) in [("max", g.max), ("min", g.min)] {
            let Some(threshold) = threshold else { continue };
            // NaN compares false both ways, so it fails either bound.
            let passed = observed.is_some_and(|v| {
                if bound == "max" {
                    v <= threshold
                } else {
                    v >= threshold
                }
            });
            out.push(GateResult {
                metric: label.clone(),
                bound: bound.to_string(),
                threshold,
                observed,
                passed,
                interval,
                sequence: g
                    .interval
                    .as_ref()
                    .filter(|iv| iv.name == "seq")
                    .and_then(|iv| iv.windows.clone()),
                level: g.level,
                title: g.title(bound, threshold),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(metric: &str, max: Option<f64>, min: Option<f64>) -> Gate {
        Gate {
            metric: metric.into(),
            max,
            min,
            on: None,
            read: metric.into(),
            interval: None,
            level: Default::default(),
            models: Vec::new(),
            about: None,
        }
    }

    /// ΔNLL's declared 95% interval, over `windows`.
    fn ci95() -> Option<crate::core::case::Interval> {
        Some(crate::core::case::Interval {
            name: "ci95".into(),
            lo: "delta_nll_ci95_lo".into(),
            hi: "delta_nll_ci95_hi".into(),
            windows: Some("windows".into()),
        })
    }

    /// A gate in a reader's words: the kind's name and unit for its
    /// metric, the bound an `on` selects, a sequential gate said as such;
    /// a metric the kind names no other way by its own name.
    #[test]
    fn a_gate_is_titled_in_the_kinds_words() {
        let about = Some(("ΔNLL", Some("nats/token")));
        let with = |on: Option<&str>| Gate {
            on: on.map(String::from),
            about,
            ..gate("delta_nll_mean", Some(0.05), None)
        };
        assert_eq!(with(None).title("max", 0.05), "ΔNLL ≤ 0.05 nats/token");
        assert_eq!(
            with(Some("ci95_hi")).title("max", 0.05),
            "ΔNLL, 95% CI upper bound ≤ 0.05 nats/token"
        );
        assert_eq!(
            with(Some("seq_hi")).title("max", 0.05),
            "ΔNLL ≤ 0.05 nats/token (decided sequentially)"
        );
        let same_top = Gate {
            on: Some("wilson95_lo".into()),
            about: Some(("same top token", None)),
            ..gate("same_top", None, Some(0.9))
        };
        assert_eq!(
            same_top.title("min", 0.9),
            "same top token, Wilson 95% lower bound ≥ 0.9"
        );
        assert_eq!(
            gate("x_rate", Some(1.0), None).title("max", 1.0),
            "x_rate ≤ 1"
        );
        let r = judge(
            &[with(None)],
            "m",
            &BTreeMap::from([("delta_nll_mean".into(), 0.01)]),
        );
        assert_eq!(r[0].title, "ΔNLL ≤ 0.05 nats/token");
        assert_eq!(r[0].rule(), r[0].title);
    }

    #[test]
    fn nan_and_missing_never_pass() {
        let m = BTreeMap::from([("ppl".to_string(), f64::NAN)]);
        let r = judge(
            &[
                gate("ppl", Some(10.0), None),
                gate("ppl", None, Some(0.0)),
                gate("nll_mean", Some(1.0), None),
            ],
            "m",
            &m,
        );
        assert!(r.iter().all(|g| !g.passed), "{r:?}");
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn a_paired_gate_names_its_interval() {
        let m = BTreeMap::from([
            ("delta_nll_mean".to_string(), 0.25),
            ("delta_nll_ci95_lo".to_string(), 0.2),
            ("delta_nll_ci95_hi".to_string(), 0.3),
            ("windows".to_string(), 16.0),
        ]);
        let g = Gate {
            interval: ci95(),
            ..gate("delta_nll_mean", Some(0.05), None)
        };
        let r = judge(&[g], "m", &m);
        assert_eq!(
            r[0].describe(),
            "delta_nll_mean = 0.25 (95% CI 0.200000 … 0.300000 over 16 windows) violates delta_nll_mean ≤ 0.05 (max 0.05)"
        );
    }

    #[test]
    fn on_selects_the_interval_bound() {
        let m = BTreeMap::from([
            ("delta_nll_mean".to_string(), 0.01),
            ("delta_nll_ci95_hi".to_string(), 0.07),
            ("delta_nll_ci95_lo".to_string(), -0.05),
            ("windows".to_string(), 16.0),
        ]);
        let g = Gate {
            metric: "delta_nll_mean".into(),
            max: Some(0.05),
            min: None,
            on: Some("ci95_hi".into()),
            read: "delta_nll_ci95_hi".into(),
            interval: ci95(),
            level: Default::default(),
            models: Vec::new(),
            about: None,
        };
        let r = judge(&[g], "m", &m);
        assert!(!r[0].passed);
        assert_eq!(r[0].observed, Some(0.07));
        assert!(
            r[0].describe().starts_with("delta_nll_mean.ci95_hi = 0.07"),
            "{}",
            r[0].describe()
        );
    }

    #[test]
    fn bounds_are_inclusive_and_all_listed() {
        let m = BTreeMap::from([("ppl".to_string(), 10.0)]);
        let r = judge(&[gate("ppl", Some(10.0), Some(11.0))], "m", &m);
        assert!(r[0].passed);
        assert!(!r[1].passed);
        assert_eq!(r[1].describe(), "ppl = 10 violates ppl ≥ 11 (min 11)");
    }

    /// A gate with `models` applies to the aliases its globs match only;
    /// a warn gate is evaluated as any other and says its level.
    #[test]
    fn a_gate_applies_to_its_models_and_keeps_its_level() {
        let m = BTreeMap::from([("kld_mean".to_string(), 0.2)]);
        let strict = gate("kld_mean", Some(0.1), None);
        let loose = Gate {
            models: vec!["*q2_k*".into(), "*Q2_K*".into()],
            level: crate::core::case::Level::Warn,
            ..gate("kld_mean", Some(0.15), None)
        };
        let strict = Gate {
            models: vec!["*q8_0".into()],
            ..strict
        };
        let r = judge(&[strict.clone(), loose.clone()], "smollm2-q2_k", &m);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].threshold, 0.15);
        assert!(!r[0].passed);
        assert_eq!(r[0].level, crate::core::case::Level::Warn);
        let r = judge(&[strict, loose], "smollm2-q8_0", &m);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!((r[0].threshold, r[0].level), (0.1, Default::default()));
        // `!` leaves models out.
        let but_q2 = Gate {
            models: vec!["!*q2_k".into()],
            ..gate("kld_mean", Some(0.1), None)
        };
        assert!(judge(std::slice::from_ref(&but_q2), "smollm2-q2_k", &m).is_empty());
        assert_eq!(judge(&[but_q2], "smollm2-q4_k_m", &m).len(), 1);
        // A gate naming no model applies to every one.
        assert_eq!(
            judge(&[gate("kld_mean", Some(1.0), None)], "x", &m).len(),
            1
        );
    }
}
