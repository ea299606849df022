//! KL divergence against a reference, position by position (seeds 003, 004).
//!
//! A reference position is stored compactly as [`RefPosition`]: the most
//! probable entries (up to 256) with their exact f32 logits (log-probs
//! recomputed in f64 exactly as for the full row), the exact log-prob of
//! the true token, the exact mass of the rest ("tail"), and the tail itself
//! as a level per vocabulary entry: [`LEVELS`] groups of companded
//! probability `⌊L·(p/p_hi)^γ⌋` (γ = 1/2: fine near the top, where the
//! probability is), each group with its exact share of the tail mass. The
//! candidate row is always complete. KL over the kept entries is exact;
//! over the tail, each id has its group's mean probability, and two exact
//! sums stored with the row cancel the groups' rounding to first order, so
//! what is left is the rounding times the candidate's perturbation within a
//! group (no `exp` per entry: a table of L values per row). Measured by
//! `cargo bench --bench kld` against the exact f64 KL: mean |error| ≤ 1/10
//! of llama-perplexity's own 16-bit rows' on every quant, at ≤ 1/4 of its
//! bytes once range coded (`execute::qgref`).
//!
//! Contract: pure functions, f64 arithmetic from f32 logits, no I/O. The
//! per-position values ([`PosKld`]) are summed up into named metrics by the
//! kld kind (`kinds/kld/metrics.rs`: llama-perplexity's final KLD block,
//! Wilson intervals, the confidence-binned flip rate).

use crate::measure::{exp_nonpos, RowStats};

mod compress;
pub use compress::*;

/// Default tail mass left out of a stored reference row.
pub const DEFAULT_TAIL: f64 = 1e-6;

/// Default cap on stored entries per row.
pub const DEFAULT_MAX_KEPT: usize = 256;

/// Default reference-confidence bin edges (seed 004).
pub const DEFAULT_BINS: &[f64] = &[0.5, 0.9, 0.99, 0.999];

/// What one scored position contributes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PosKld {
    /// KL(ref‖cand), nats.
    pub kl: f64,
    /// KL(cand‖ref), nats.
    pub kl_rev: f64,
    /// p_ref(true).
    pub p_ref: f64,
    /// p_cand(true).
    pub p_cand: f64,
    /// Reference top-1 probability.
    pub p1: f64,
    /// Reference argmax.
    pub ref_top: u32,
    /// Candidate argmax.
    pub cand_top: u32,
    /// The true token also occurs earlier in the window.
    pub copy: bool,
    /// The reference row is approximate (imported).
    pub approximate: bool,
}

impl PosKld {
    /// Δp = p_cand(true) − p_ref(true).
    pub(crate) fn dp(&self) -> f64 {
        self.p_cand - self.p_ref
    }

    /// Candidate argmax ≠ reference argmax.
    pub(crate) fn flip(&self) -> bool {
        self.cand_top != self.ref_top
    }
}

/// Compare a full candidate row with a reference position; `exps` are the
/// row's `exp(l − max)` terms ([`crate::measure::row_stats_exps`]).
pub fn compare(
    r: &RefPosition,
    row: &[f32],
    st: &RowStats,
    exps: &[f64],
    target: usize,
    copy: bool,
) -> PosKld {
    let mut kl = 0.0f64;
    let mut kl_rev = 0.0f64;
    for &(j, l) in &r.entries {
        let lr = r.lp(l);
        let lc = st.logprob(row, j as usize);
        let p = exp_nonpos(lr.min(0.0));
        let q = exp_nonpos(lc);
        kl += p * (lr - lc);
        kl_rev += q * (lc - lr);
    }
    if let (Some(tail), true) = (&r.tail, r.tail_mass > 0.0) {
        let (a, b) = tail_kl(r, tail, row, st, exps);
        kl += a;
        kl_rev += b;
    }
    PosKld {
        kl,
        kl_rev,
        p_ref: r.lp_true.exp(),
        p_cand: st.logprob(row, target).exp(),
        p1: r.p1(),
        ref_top: r.argmax(),
        cand_top: st.argmax as u32,
        copy,
        approximate: r.approximate,
    }
}

/// KL(ref‖cand) and KL(cand‖ref) over the tail entries. The reference's
/// tail probabilities are its levels' ([`Tail::level_probs`]: each level's
/// exact mass spread over its ids); the candidate's come from its full row.
/// Both sums are corrected by the rounding terms computed exactly when the
/// row was compressed (the forward one stored, the reverse one from the
/// level masses and the exact tail entropy).
fn tail_kl(r: &RefPosition, tail: &Tail, row: &[f32], st: &RowStats, exps: &[f64]) -> (f64, f64) {
    let t = r.tail_mass;
    let (p, lp) = tail.level_probs(t);
    let mc = f64::from(st.max);
    // Per level: Σ x and Σ e over the ids at that level, where
    // x = l_c,j − max_c and e = exp(x) (the candidate's unnormalised q).
    let mut sx = [0.0f64; 256];
    let mut se = [0.0f64; 256];
    let mut all_ex = 0.0f64;
    for ((&c, &l), &e) in tail.codes.iter().zip(row).zip(exps) {
        let c = c as usize;
        let x = f64::from(l) - mc;
        sx[c] += x;
        se[c] += e;
        all_ex += e * x;
    }
    let all_e = st.log_sum_exp.exp();
    // The kept ids' share of Σ e and Σ e·x, to leave the tail's (their
    // `e` is already in `exps`).
    let (mut kept_e, mut kept_ex) = (0.0f64, 0.0f64);
    for &(j, _) in &r.entries {
        let e = exps[j as usize];
        kept_e += e;
        kept_ex += e * (f64::from(row[j as usize]) - mc);
    }
    let q_mass = all_e - kept_e;
    let q_lq = all_ex - kept_ex;
    let (mut cross, mut q_lp, mut p_lp) = (0.0f64, 0.0f64, 0.0f64);
    for g in (0..LEVELS).filter(|&g| tail.counts[g] > 0) {
        cross += p[g] * sx[g]; // Σ p̃_j (l_c,j − max_c)
        q_lp += se[g] * lp[g];
        p_lp += p[g] * f64::from(tail.counts[g]) * lp[g]; // Σ p̃_j lp̃_j
    }
    let lse = st.log_sum_exp;
    // Σ p_j (l_c,j − max_c) = Σ p̃_j (…) − Σ (p̃_j − p_j)(l_j − max_r) − Σ (p̃_j − p_j)(e_j + const):
    // the middle term is stored exactly; the constant cancels (Σ p̃ = Σ p).
    let cross = cross - tail.rounding;
    let neg_entropy = tail.mean_logit - t * r.lse; // Σ p lp over the tail, exact
    let kl = neg_entropy - (cross - t * lse);
    // Σ q_j lp_j = Σ q_j lp̃_j − Σ q_j (lp̃_j − lp_j), and with q ≈ p·Q/T
    // within the tail the last sum is (Q/T)·Σ p_j (lp̃_j − lp_j), where
    // Σ p_j lp̃_j = Σ p̃_j lp̃_j (each level holds its exact mass).
    let q_lp = q_lp - q_mass / t * (p_lp - neg_entropy);
    let z = lse.exp();
    let kl_rev = (q_lq - q_mass * lse) / z - q_lp / z;
    (kl, kl_rev)
}

/// Whether the true token at scored position `pos` of a window also occurs
/// earlier in it (positions 1..=pos: position 0 may be a substituted BOS).
pub fn copy_flags(tokens: &[i32], first_scored: usize, targets: &[i32]) -> Vec<bool> {
    let mut seen = std::collections::HashSet::new();
    for &t in tokens.iter().take(first_scored + 1).skip(1) {
        seen.insert(t);
    }
    let mut out = Vec::with_capacity(targets.len());
    for &t in targets {
        out.push(seen.contains(&t));
        // The target of position first+k is the input at first+k+1.
        seen.insert(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::row_stats;
    use crate::measure::stats::wilson95;

    /// A plain implementation of the row compression: a full index sort
    /// key, select, and each tail entry's level and mass computed on the
    /// spot.
    fn compress_row_scalar(row: &[f32], target: usize, tail: f64, max_kept: usize) -> RefPosition {
        let st = row_stats(row);
        let n = row.len();
        let k = max_kept.clamp(1, n);
        let mut idx: Vec<u32> = (0..n as u32).collect();
        let order = |a: &u32, b: &u32| {
            row[*b as usize]
                .partial_cmp(&row[*a as usize])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(b))
        };
        if k < n {
            idx.select_nth_unstable_by(k - 1, order);
            idx.truncate(k);
        }
        idx.sort_unstable_by(order);
        let lp = |j: usize| st.logprob(row, j);
        let mut kept = Vec::new();
        let mut mass = 0.0f64;
        for &j in &idx {
            kept.push((j, row[j as usize]));
            mass += exp_nonpos(lp(j as usize).min(0.0));
            if 1.0 - mass <= tail {
                break;
            }
        }
        let mut is_kept = vec![false; n];
        for &(j, _) in &kept {
            is_kept[j as usize] = true;
        }
        let (mut tm, mut ml) = (0.0f64, 0.0f64);
        let mut hi = f32::NEG_INFINITY;
        let m = f64::from(st.max);
        for (j, &v) in row.iter().enumerate() {
            if !is_kept[j] {
                let x = f64::from(v) - m;
                let e = exp_nonpos(x);
                tm += e;
                ml += e * x;
                hi = hi.max(v);
            }
        }
        let z = st.log_sum_exp.exp();
        let tm = tm / z;
        // The level of a tail logit: ⌊L·(p/p_hi)^γ⌋, at most L − 1.
        let level = |l: f32| -> u8 {
            let u = exp_nonpos(((f64::from(l) - f64::from(hi)) * GAMMA).min(0.0));
            ((u * LEVELS as f64).floor() as usize).min(LEVELS - 1) as u8
        };
        let tail = (kept.len() < n).then(|| {
            let codes: Vec<u8> = row
                .iter()
                .zip(&is_kept)
                .map(|(&v, &k)| if k { KEPT } else { level(v) })
                .collect();
            let mut mass = vec![0.0f64; LEVELS];
            for (j, &c) in codes.iter().enumerate() {
                if c != KEPT {
                    mass[c as usize] += exp_nonpos(f64::from(row[j]) - m);
                }
            }
            let total: f64 = mass.iter().sum();
            let masses = mass
                .iter()
                .map(|&x| {
                    let s = (x / total) as f32;
                    if x > 0.0 {
                        s.max(f32::MIN_POSITIVE)
                    } else {
                        s
                    }
                })
                .collect();
            let mut t = Tail::new(hi, ml / z, 0.0, masses, codes);
            let (p, _) = t.level_probs(tm);
            t.rounding = row
                .iter()
                .zip(&t.codes)
                .map(|(&v, &c)| {
                    let x = f64::from(v) - m;
                    let w = if c == KEPT { 0.0 } else { 1.0 };
                    ((p[c as usize] - exp_nonpos(x) / z) * x) * w
                })
                .sum::<f64>();
            t
        });
        RefPosition {
            max: st.max,
            lse: st.log_sum_exp,
            entries: kept,
            lp_true: lp(target),
            tail_mass: tm,
            tail,
            approximate: false,
        }
    }

    /// The vectorised row compression is bitwise the scalar one: the same
    /// kept ids in the same order, the same levels, the same sums, on rows
    /// with ties, signed zeros, flat tails and a vocabulary's worth of
    /// spread-out logits.
    #[test]
    fn fast_compression_is_bitwise_the_scalar_one() {
        let mut rng = crate::measure::SplitMix64(3);
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for r in 0..40 {
            let n = [10, 258, 1000, 4099, 49_152][r % 5];
            let spread = [0.5f64, 4.0, 12.0, 30.0][r % 4];
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                    // A few repeated values make ties at the threshold.
                    if rng.below(7) == 0 {
                        (rng.below(5) as f32) * 0.5
                    } else {
                        ((u - 0.7) * spread) as f32
                    }
                })
                .collect();
            rows.push(row);
        }
        rows.push(vec![1.0; 300]); // flat: every tail entry the same
        rows.push(vec![-0.0, 0.0, 0.0, -0.0, 1.0, -1.0, 0.0, -0.0]);
        for (r, row) in rows.iter().enumerate() {
            for (tail, k) in [(1e-6, 2048), (0.0, 4), (1e-3, 64), (1e-6, 1)] {
                let fast = compress_row(row, &row_stats(row), 3, tail, k);
                let slow = compress_row_scalar(row, 3, tail, k);
                assert_eq!(fast.entries, slow.entries, "row {r} tail {tail} k {k}");
                assert_eq!(fast.tail_mass.to_bits(), slow.tail_mass.to_bits());
                match (&fast.tail, &slow.tail) {
                    (Some(a), Some(b)) => {
                        assert_eq!(a.codes, b.codes, "row {r} tail {tail} k {k}");
                        assert_eq!(a.hi, b.hi);
                        assert_eq!(a.masses, b.masses);
                        assert_eq!(a.mean_logit.to_bits(), b.mean_logit.to_bits());
                        assert_eq!(a.rounding.to_bits(), b.rounding.to_bits());
                    }
                    (None, None) => {}
                    _ => panic!("row {r}: one has a tail, the other not"),
                }
                assert_eq!(fast, slow);
            }
        }
    }

    #[test]
    fn p1_near_one_is_one_minus_the_rest() {
        let mut a = vec![-30.0f32; 1000];
        a[3] = 10.0;
        let st = row_stats(&a);
        let r = compress_row(&a, &st, 3, 0.0, 1000);
        let rest = 999.0 * (-40.0f64).exp();
        let expect = 1.0 - rest / (1.0 + rest);
        assert!((r.p1() - expect).abs() < 1e-18, "{} {expect}", r.p1());
        assert_eq!(r.argmax(), 3);
    }

    #[test]
    fn wilson_matches_known_values() {
        // 8 of 10: (0.4902, 0.9433) (Wilson 1927; e.g. R's prop.test without correction).
        let (lo, hi) = wilson95(8, 10);
        assert!(
            (lo - 0.4901625).abs() < 1e-6 && (hi - 0.9433178).abs() < 1e-6,
            "{lo} {hi}"
        );
        let (lo, hi) = wilson95(0, 50);
        assert_eq!(lo, 0.0);
        assert!((hi - 0.0713476).abs() < 1e-6, "{hi}");
        assert!(wilson95(0, 0).0.is_nan());
    }

    #[test]
    fn copy_flags_see_earlier_inputs_only() {
        // tokens: [BOS, 5, 6, 7, 5, 9]; first scored position 2 → targets 7, 5, 9.
        let f = copy_flags(&[1, 5, 6, 7, 5, 9], 2, &[7, 5, 9]);
        assert_eq!(f, vec![false, true, false]);
        // BOS at position 0 does not count.
        assert_eq!(copy_flags(&[1, 2, 3], 1, &[1]), vec![false]);
    }
}
