//! Judge stage: gates → verdicts.
//!
//! Contract: every gate is evaluated and every violation listed; a missing
//! or NaN metric is a violation, never a pass.

use crate::case::Gate;
use serde::Serialize;
use std::collections::BTreeMap;

/// One gate's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateResult {
    /// Metric name.
    pub metric: String,
    /// `max` or `min`.
    pub bound: &'static str,
    /// The threshold.
    pub threshold: f64,
    /// The measured value (None when missing).
    pub observed: Option<f64>,
    /// Whether it held.
    pub passed: bool,
}

impl GateResult {
    /// One line for a failure message.
    pub fn describe(&self) -> String {
        let op = if self.bound == "max" { "≤" } else { "≥" };
        match self.observed {
            None => format!(
                "{}: missing, gate needs {} {op} {}",
                self.metric, self.metric, self.threshold
            ),
            Some(v) => format!(
                "{} = {v} violates {} {op} {} ({} {})",
                self.metric, self.metric, self.threshold, self.bound, self.threshold
            ),
        }
    }
}

/// Evaluate `gates` on `metrics`.
pub fn judge(gates: &[Gate], metrics: &BTreeMap<String, f64>) -> Vec<GateResult> {
    let mut out = Vec::new();
    for g in gates {
        let observed = metrics.get(&g.metric).copied();
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
                metric: g.metric.clone(),
                bound,
                threshold,
                observed,
                passed,
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
        }
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
            &m,
        );
        assert!(r.iter().all(|g| !g.passed), "{r:?}");
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn bounds_are_inclusive_and_all_listed() {
        let m = BTreeMap::from([("ppl".to_string(), 10.0)]);
        let r = judge(&[gate("ppl", Some(10.0), Some(11.0))], &m);
        assert!(r[0].passed);
        assert!(!r[1].passed);
        assert_eq!(r[1].describe(), "ppl = 10 violates ppl ≥ 11 (min 11)");
    }
}
