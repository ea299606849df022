//! Drift between two runtimes (two llama.cpp builds, or a build and a
//! fork) on one model and identical tokens, from the rows each wrote in
//! llama-perplexity's `--kl-divergence-base` encoding: a row is a scale, a
//! minimum log-prob and a u16 per vocabulary entry, log-prob = scale·q +
//! min, as llama-perplexity decodes it.
//!
//! Contract: both sides are held to the same encoding, so two runtimes
//! that computed the same logits give byte-equal rows and every figure 0.
//! Per position: KL(B‖A) = Σ p_B (lp_B − lp_A) over the entries of B above
//! llama-perplexity's −16 floor (its own KLD sum), each row normalized over
//! its entries above the floor, KL(A‖B) the same way round, whether the top entries agree, and each side's NLL of the true
//! token (llama-perplexity's `nll_base`). Per window: ΔNLL = mean NLL_B −
//! mean NLL_A, its mean over windows with the Student-t 95% interval.
//! Pure: no I/O.

use crate::core::error::Malformed;
use crate::measure::stats::{quantile, t_interval95, wilson95};
use std::collections::BTreeMap;

/// One position's row, as a base file holds it.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    /// Log-prob step.
    pub scale: f32,
    /// Log-prob of a 0.
    pub min: f32,
    /// One value per vocabulary entry.
    pub q: &'a [u16],
}

impl Row<'_> {
    /// Entry `i`'s log-prob, as llama-perplexity decodes it (f32).
    pub(crate) fn log_prob(&self, i: usize) -> f32 {
        self.scale * f32::from(self.q[i]) + self.min
    }

    /// The first entry of the highest value.
    fn top(&self) -> usize {
        let mut best = 0;
        for (i, &v) in self.q.iter().enumerate() {
            if v > self.q[best] {
                best = i;
            }
        }
        best
    }

    fn same_bits(&self, other: &Row) -> bool {
        self.scale.to_bits() == other.scale.to_bits()
            && self.min.to_bits() == other.min.to_bits()
            && self.q == other.q
    }
}

/// ln Σ exp(lp) over a row's entries above llama-perplexity's −16 floor
/// (f64): what its decoded log-probs are normalized by.
fn log_norm(r: &Row) -> f64 {
    let mut sum = 0.0;
    for i in 0..r.q.len() {
        let lp = r.log_prob(i);
        if lp > -16.0 {
            sum += f64::from(lp).exp();
        }
    }
    sum.ln()
}

/// KL(p‖q) = Σ p (lp_p − lp_q) over p's entries above −16, each row's
/// log-probs normalized over its entries above −16 first (a row decoded
/// from u16 sums to 1 only within its rounding; normalized, the KL of two
/// rows is never negative).
fn kl(p: &Row, q: &Row) -> f64 {
    let (np, nq) = (log_norm(p), log_norm(q));
    let mut sum = 0.0;
    for i in 0..p.q.len() {
        let lp = p.log_prob(i);
        if lp > -16.0 {
            let a = f64::from(lp) - np;
            sum += a.exp() * (a - (f64::from(q.log_prob(i)) - nq));
        }
    }
    sum
}

/// The drift of runtime B against runtime A, position by position.
#[derive(Debug, Clone, Default)]
pub(crate) struct Drift {
    /// Per window: (NLL_A sum, NLL_B sum, positions).
    windows: Vec<(f64, f64, usize)>,
    /// KL(B‖A) per position.
    kl: Vec<f64>,
    /// Σ KL(A‖B).
    kl_rev: f64,
    /// Positions whose top entries agree.
    same_top: usize,
    /// Positions whose rows are byte-equal.
    identical: usize,
}

impl Drift {
    /// Nothing yet.
    pub(crate) fn new() -> Self {
        Drift::default()
    }

    /// One position of window `w` (windows in order, from 0): A's and B's
    /// rows, and the true next token. Rows of another length are an error.
    pub(crate) fn push(
        &mut self,
        w: usize,
        a: Row,
        b: Row,
        target: usize,
    ) -> Result<(), Malformed> {
        if a.q.len() != b.q.len() || target >= a.q.len() {
            return Err(format!(
                "window {w}: rows of {} and {} entries, target {target}",
                a.q.len(),
                b.q.len()
            )
            .into());
        }
        while self.windows.len() <= w {
            self.windows.push((0.0, 0.0, 0));
        }
        let nll_a = -f64::from(a.log_prob(target));
        let nll_b = -f64::from(b.log_prob(target));
        let cell = &mut self.windows[w];
        cell.0 += nll_a;
        cell.1 += nll_b;
        cell.2 += 1;
        if a.same_bits(&b) {
            self.identical += 1;
            self.same_top += 1;
            self.kl.push(0.0);
            return Ok(());
        }
        self.kl.push(kl(&b, &a));
        self.kl_rev += kl(&a, &b);
        self.same_top += usize::from(a.top() == b.top());
        Ok(())
    }

    /// ΔNLL (B − A) of each window with a position, in window order.
    pub(crate) fn per_window(&self) -> Vec<f64> {
        self.windows
            .iter()
            .filter(|w| w.2 > 0)
            .map(|w| (w.1 - w.0) / w.2 as f64)
            .collect()
    }

    /// Whether every row was byte-equal.
    pub(crate) fn identical(&self) -> bool {
        self.identical == self.kl.len()
    }

    /// The figures: `windows`, `positions`, `rows_identical`,
    /// `bit_identical` (1 when every row is byte-equal), `nll_mean_a`,
    /// `nll_mean_b`, `ppl_a`, `ppl_b`, `delta_nll_mean` (B − A) with
    /// `delta_nll_ci95_lo`/`_hi` over windows, `kld_mean`, `kld_p99`,
    /// `kld_max` (KL(B‖A)), `kld_rev_mean`, `same_top` with its Wilson
    /// interval. Empty when no position was seen.
    pub(crate) fn metrics(&self) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        let n = self.kl.len();
        if n == 0 {
            return m;
        }
        let mut put = |k: &str, v: f64| {
            m.insert(k.to_string(), v);
        };
        let windows: Vec<&(f64, f64, usize)> = self.windows.iter().filter(|w| w.2 > 0).collect();
        put("windows", windows.len() as f64);
        put("positions", n as f64);
        put("rows_identical", self.identical as f64);
        put("bit_identical", f64::from(u8::from(self.identical())));
        let (sum_a, sum_b) = windows
            .iter()
            .fold((0.0, 0.0), |(a, b), w| (a + w.0, b + w.1));
        let (nll_a, nll_b) = (sum_a / n as f64, sum_b / n as f64);
        put("nll_mean_a", nll_a);
        put("nll_mean_b", nll_b);
        put("ppl_a", nll_a.exp());
        put("ppl_b", nll_b.exp());
        let (mean, lo, hi) = t_interval95(&self.per_window());
        put("delta_nll_mean", mean);
        put("delta_nll_ci95_lo", lo);
        put("delta_nll_ci95_hi", hi);
        let mut sorted = self.kl.clone();
        sorted.sort_by(f64::total_cmp);
        put("kld_mean", self.kl.iter().sum::<f64>() / n as f64);
        put("kld_p99", quantile(&sorted, 0.99));
        put("kld_max", sorted[n - 1]);
        put("kld_rev_mean", self.kl_rev / n as f64);
        put("same_top", self.same_top as f64 / n as f64);
        let (wlo, whi) = wilson95(self.same_top, n);
        put("same_top_wilson95_lo", wlo);
        put("same_top_wilson95_hi", whi);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(scale: f32, min: f32, q: &[u16]) -> Row<'_> {
        Row { scale, min, q }
    }

    /// Byte-equal rows give 0 everywhere and say so; rows that differ give
    /// KL both ways (against an independent sum), the top entries'
    /// agreement and the NLL of each side, window by window.
    #[test]
    fn drift_is_zero_on_equal_rows_and_measured_on_others() {
        let (q1, q2) = ([60000u16, 30000, 0], [59000u16, 31000, 0]);
        let (s, m) = (16.0 / 65535.0, -16.2f32);
        let mut d = Drift::new();
        d.push(0, row(s, m, &q1), row(s, m, &q1), 0).unwrap();
        d.push(1, row(s, m, &q1), row(s, m, &q1), 1).unwrap();
        let e = d.metrics();
        assert_eq!(e["bit_identical"], 1.0);
        assert_eq!(
            (e["kld_max"], e["delta_nll_mean"], e["same_top"]),
            (0.0, 0.0, 1.0)
        );
        assert_eq!(e["ppl_a"], e["ppl_b"]);
        let mut d = Drift::new();
        d.push(0, row(s, m, &q1), row(s, m, &q2), 0).unwrap();
        d.push(1, row(s, m, &[1, 60000, 0]), row(s, m, &[60000, 1, 0]), 1)
            .unwrap();
        let e = d.metrics();
        assert_eq!(e["bit_identical"], 0.0);
        assert_eq!(e["same_top"], 0.5);
        // An independent computation of the first position's KL(B‖A): each
        // row's entries above −16, normalized.
        let lp = |q: u16| f64::from(s * f32::from(q) + m);
        let norm = |qs: &[u16]| {
            qs.iter()
                .map(|&q| lp(q))
                .filter(|v| *v > -16.0)
                .map(f64::exp)
                .sum::<f64>()
                .ln()
        };
        let (na, nb) = (norm(&q1), norm(&q2));
        let want: f64 = q1
            .iter()
            .zip(&q2)
            .filter(|(_, b)| lp(**b) > -16.0)
            .map(|(a, b)| (lp(*b) - nb).exp() * ((lp(*b) - nb) - (lp(*a) - na)))
            .sum();
        assert!(want > 0.0);
        assert!((d.kl[0] - want).abs() < 1e-12, "{} {want}", d.kl[0]);
        // ΔNLL per window: B's NLL of the target less A's.
        let d0 = -lp(q2[0]) + lp(q1[0]);
        let d1 = -lp(1) + lp(60000);
        assert!((e["delta_nll_mean"] - (d0 + d1) / 2.0).abs() < 1e-12);
        assert!(Drift::new()
            .push(0, row(s, m, &q1), row(s, m, &[1, 2]), 0)
            .is_err());
    }
}
