//! Measure stage: pure functions from logit rows and observations to metrics.
//! No I/O, no printing.
//!
//! Contract: all arithmetic in f64 from the f32 logits (DESIGN.md,
//! Definitions): `lp_i = l_i − (m + ln Σ_j exp(l_j − m))`. The sum of
//! exponentials uses a vectorisable f64 `exp` (accurate to a few ulp), since
//! a libm call per vocabulary entry would cost as much as the forward pass.

pub(crate) mod drift;
pub mod forecast;

pub mod kld;

pub(crate) mod perplexity;
pub use perplexity::{paired_metrics, perplexity_metrics};

pub mod sequential;

pub(crate) mod stats;
pub use stats::*;

/// What one logit row reduces to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowStats {
    /// Largest logit.
    pub max: f32,
    /// Lowest index holding the largest logit.
    pub argmax: usize,
    /// `ln Σ_j exp(l_j − max)` (≥ 0).
    pub log_sum_exp: f64,
}

impl RowStats {
    /// Log-probability of token `j`.
    pub fn logprob(&self, row: &[f32], j: usize) -> f64 {
        (f64::from(row[j]) - f64::from(self.max)) - self.log_sum_exp
    }
}

const LANES: usize = 8;

/// `exp(x)` for `x ≤ 0`, in f64, branch-free so loops over it vectorise
/// (plain multiply-adds: `mul_add` without FMA hardware is a libm call).
/// Values below −700 give ~1e-304 instead of smaller; against a sum ≥ 1 that
/// is far below f64 resolution.
#[inline(always)]
pub(crate) fn exp_nonpos(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // fdlibm's split of ln 2: the high part has 21 trailing zero bits.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const SHIFT: f64 = 6_755_399_441_055_744.0; // 1.5 · 2^52: rounds to an integer
    let x = if x < -700.0 { -700.0 } else { x };
    let t = x * LOG2E + SHIFT;
    let n = t - SHIFT;
    // LN2_HI has trailing zero bits, so n · LN2_HI is exact.
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor series to degree 12 on |r| ≤ ln2/2: truncation < 2e-16.
    let mut p = 1.0 / 479_001_600.0;
    p = p * r + 1.0 / 39_916_800.0;
    p = p * r + 1.0 / 3_628_800.0;
    p = p * r + 1.0 / 362_880.0;
    p = p * r + 1.0 / 40_320.0;
    p = p * r + 1.0 / 5_040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // 2^n from the integer in t's low mantissa bits.
    let bits = (t.to_bits().wrapping_add(1023)) << 52;
    p * f64::from_bits(bits)
}

/// Max, argmax and log-sum-exp of a row of finite logits.
pub fn row_stats(row: &[f32]) -> RowStats {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { row_stats_avx2(row) };
    }
    row_stats_portable(row)
}

/// [`row_stats`], also writing `exps[j] = exp(row[j] − max)` (the terms of
/// its sum, bitwise the same result) for callers that need them again.
pub fn row_stats_exps(row: &[f32], exps: &mut Vec<f64>) -> RowStats {
    exps.resize(row.len(), 0.0);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { row_stats_exps_avx2(row, exps) };
    }
    row_stats_generic::<true>(row, exps)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_stats_exps_avx2(row: &[f32], exps: &mut [f64]) -> RowStats {
    row_stats_generic::<true>(row, exps)
}

/// The same operations in the same order as [`row_stats_portable`], compiled
/// for 4-wide vectors. Rust never fuses a·b+c on its own, so the results are
/// bitwise identical; only the speed differs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_stats_avx2(row: &[f32]) -> RowStats {
    row_stats_impl(row)
}

/// Row statistics without CPU-specific code.
pub(crate) fn row_stats_portable(row: &[f32]) -> RowStats {
    row_stats_impl(row)
}

#[inline(always)]
fn row_stats_impl(row: &[f32]) -> RowStats {
    row_stats_generic::<false>(row, &mut [])
}

#[inline(always)]
fn row_stats_generic<const STORE: bool>(row: &[f32], exps: &mut [f64]) -> RowStats {
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            lane_max[k] = if c[k] > lane_max[k] {
                c[k]
            } else {
                lane_max[k]
            };
        }
    }
    let mut max = lane_max.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &v in tail {
        if v > max {
            max = v;
        }
    }
    let argmax = row.iter().position(|&v| v == max).unwrap_or(0);
    let m = f64::from(max);
    let mut acc = [0.0f64; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    let n = row.len() - tail.len();
    if STORE {
        for (c, o) in chunks.zip(exps[..n].chunks_exact_mut(LANES)) {
            for k in 0..LANES {
                let e = exp_nonpos(f64::from(c[k]) - m);
                o[k] = e;
                acc[k] += e;
            }
        }
    } else {
        for c in chunks {
            for k in 0..LANES {
                acc[k] += exp_nonpos(f64::from(c[k]) - m);
            }
        }
    }
    let mut sum: f64 = acc.iter().sum();
    for (i, &v) in tail.iter().enumerate() {
        let e = exp_nonpos(f64::from(v) - m);
        if STORE {
            exps[n + i] = e;
        }
        sum += e;
    }
    RowStats {
        max,
        argmax,
        log_sum_exp: sum.ln(),
    }
}

/// Per-window sums of a teacher-forced pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowNll {
    /// Σ NLL over scored positions.
    pub nll_sum: f64,
    /// Σ NLL².
    pub nll_sq_sum: f64,
    /// Scored positions.
    pub count: usize,
    /// Positions whose argmax is the true next token.
    pub top1: usize,
}

impl WindowNll {
    /// Add one scored position.
    pub(crate) fn add(&mut self, nll: f64, top1: bool) {
        self.nll_sum += nll;
        self.nll_sq_sum += nll * nll;
        self.count += 1;
        self.top1 += usize::from(top1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm_to_a_few_ulp() {
        let mut x = 0.0f64;
        while x > -745.0 {
            let (a, b) = (exp_nonpos(x), x.exp());
            if x >= -700.0 {
                assert!(((a - b) / b).abs() < 4e-16, "x={x}: {a} vs {b}");
            } else {
                assert!(a < 1e-303);
            }
            x -= 0.0137;
        }
        assert_eq!(exp_nonpos(0.0), 1.0);
    }

    #[test]
    fn dispatched_and_portable_paths_agree_bitwise() {
        let row: Vec<f32> = (0..49_157)
            .map(|i| ((i * 7919) % 10_007) as f32 * 0.003 - 15.0)
            .collect();
        let (a, b) = (row_stats(&row), row_stats_portable(&row));
        assert_eq!(a.max.to_bits(), b.max.to_bits());
        assert_eq!(a.argmax, b.argmax);
        assert_eq!(a.log_sum_exp.to_bits(), b.log_sum_exp.to_bits());
    }

    #[test]
    fn argmax_takes_the_first_of_equal_maxima() {
        let st = row_stats(&[1.0, 5.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0]);
        assert_eq!(st.argmax, 1);
    }

    #[test]
    fn t_interval_by_hand() {
        // Student t, 4 df, 97.5%: 2.7764451051977987 (tables).
        let xs = [1.0, 2.0, 3.0, 4.0, 5.0];
        let (m, lo, hi) = t_interval95(&xs);
        let half = 2.776_445_105_197_798_7 * (2.5f64 / 5.0).sqrt();
        assert_eq!(m, 3.0);
        assert!(
            (lo - (3.0 - half)).abs() < 1e-9 && (hi - (3.0 + half)).abs() < 1e-9,
            "{lo} {hi}"
        );
        assert!(t_interval95(&[1.0]).1.is_nan());
    }

    #[test]
    fn bootstrap_is_seeded_and_brackets_the_mean() {
        let xs: Vec<f64> = (0..40)
            .map(|i| ((i * 37) % 11) as f64 * 0.01 - 0.03)
            .collect();
        let mean = xs.iter().sum::<f64>() / 40.0;
        let a = block_bootstrap95(&xs, 0, 2000, 7);
        assert_eq!(a, block_bootstrap95(&xs, 0, 2000, 7));
        assert_ne!(a, block_bootstrap95(&xs, 0, 2000, 8));
        assert!(a.0 < mean && mean < a.1, "{a:?} vs {mean}");
        // A constant series has a zero-width interval.
        assert_eq!(block_bootstrap95(&[0.5; 10], 3, 200, 1), (0.5, 0.5));
        // Too few windows: no interval rather than a degenerate one.
        assert!(block_bootstrap95(&[0.1, 0.2, 0.3], 0, 200, 1).0.is_nan());
    }

    #[test]
    fn splitmix_matches_its_reference_output() {
        // First outputs for seed 1234567 from the reference C implementation.
        let mut r = SplitMix64(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn quantile_type7() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.5);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert!((quantile(&v, 0.975) - 3.925).abs() < 1e-12);
    }
}
