//! Every interval and test the metrics use, in one place: quantiles,
//! Student t and block-bootstrap intervals, mean ± SE, Wilson intervals,
//! McNemar's exact test and the median.

/// SplitMix64 (Steele, Lea, Flood 2014): the documented generator behind
/// seeded bootstraps, so a seed gives the same interval everywhere.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform integer in 0..n (n ≥ 1), by rejection: no modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let v = self.next_u64();
            if v < zone {
                return v % n;
            }
        }
    }
}

/// Sample quantile with linear interpolation between order statistics
/// (Hyndman–Fan type 7, the default of R and numpy). `sorted` is ascending.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let h = (sorted.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// The 95% Student-t interval of a mean from its summary: `mean` and the
/// sample standard deviation `sd` of `n` values (NaN bounds with fewer
/// than 2).
pub(crate) fn t_interval95_of(mean: f64, sd: f64, n: usize) -> (f64, f64) {
    if n < 2 || !sd.is_finite() {
        return (f64::NAN, f64::NAN);
    }
    let t = statrs::distribution::ContinuousCDF::inverse_cdf(
        &statrs::distribution::StudentsT::new(0.0, 1.0, n as f64 - 1.0).expect("df ≥ 1"),
        0.975,
    );
    let half = t * sd / (n as f64).sqrt();
    (mean - half, mean + half)
}

/// Mean and 95% Student-t interval of `xs` (NaN bounds with fewer than 2).
pub(crate) fn t_interval95(xs: &[f64]) -> (f64, f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, f64::NAN, f64::NAN);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    let t = statrs::distribution::ContinuousCDF::inverse_cdf(
        &statrs::distribution::StudentsT::new(0.0, 1.0, n - 1.0).expect("df ≥ 1"),
        0.975,
    );
    let half = t * (var / n).sqrt();
    (mean, mean - half, mean + half)
}

/// 95% percentile interval of the mean of `xs` by a moving-block bootstrap:
/// blocks of `block` consecutive values (0: ⌈n^(1/3)⌉) start anywhere in
/// 0..=n−block, are drawn with replacement and concatenated to length n.
/// Fewer than 4 windows give NaN: every resample would be nearly the series
/// itself, an interval of no width that means nothing.
pub(crate) fn block_bootstrap95(
    xs: &[f64],
    block: usize,
    resamples: usize,
    seed: u64,
) -> (f64, f64) {
    let n = xs.len();
    if n < 4 || resamples == 0 {
        return (f64::NAN, f64::NAN);
    }
    let b = if block == 0 {
        (n as f64).cbrt().ceil() as usize
    } else {
        block
    }
    .clamp(1, n / 2);
    let starts = (n - b + 1) as u64;
    let mut rng = SplitMix64(seed);
    let mut means = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let mut sum = 0.0;
        let mut taken = 0;
        while taken < n {
            let s = rng.below(starts) as usize;
            for x in &xs[s..s + b.min(n - taken)] {
                sum += x;
            }
            taken += b.min(n - taken);
        }
        means.push(sum / n as f64);
    }
    means.sort_by(f64::total_cmp);
    (quantile(&means, 0.025), quantile(&means, 0.975))
}

/// llama-perplexity's `mean_and_uncertainty`: mean and standard error from
/// sums, the error 0 unless the variance is positive and count > 10.
pub(crate) fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let c = count as f64;
    let f = sum / c;
    let df = sum2 / c - f * f;
    (
        f,
        if df > 0.0 && count > 10 {
            (df / (c - 1.0)).sqrt()
        } else {
            0.0
        },
    )
}

/// llama-perplexity's `covariance` of the means (0 below 10 values).
pub(crate) fn covariance(suma: f64, sumb: f64, sumab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let c = count as f64;
    (sumab / c - (suma / c) * (sumb / c)) / (c - 1.0)
}

/// Wilson score interval for k of n at 95% (NaN when n = 0).
pub(crate) fn wilson95(k: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let z = 1.959_963_984_540_054_f64;
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z * ((p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt()) / (1.0 + z2 / n);
    let lo = if k == 0.0 {
        0.0
    } else {
        (centre - half).max(0.0)
    };
    let hi = if k == n {
        1.0
    } else {
        (centre + half).min(1.0)
    };
    (lo, hi)
}

/// llama-perplexity's `mean_and_uncertainty` of the values (NaN when there
/// are none).
pub(crate) fn mean_se(xs: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = xs.clone().count();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let (s, s2) = xs.fold((0.0, 0.0), |(a, b), x| (a + x, b + x * x));
    crate::measure::mean_and_uncertainty(s, s2, n)
}

/// McNemar's exact test: the two-sided binomial p-value of `b` against `c`
/// discordant pairs.
pub(crate) fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // Σ_{i ≤ k} C(n, i) / 2^n, in logs.
    let ln_c = |i: u64| {
        statrs::function::gamma::ln_gamma(n as f64 + 1.0)
            - statrs::function::gamma::ln_gamma(i as f64 + 1.0)
            - statrs::function::gamma::ln_gamma((n - i) as f64 + 1.0)
    };
    let tail: f64 = (0..=k)
        .map(|i| (ln_c(i) - n as f64 * std::f64::consts::LN_2).exp())
        .sum();
    (2.0 * tail).min(1.0)
}

/// The median (NaN of none).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interval from a summary (mean, sd, n) is the one from the
    /// values themselves.
    #[test]
    fn an_interval_from_a_summary_equals_the_one_from_the_values() {
        let xs = [81.0, 95.5, 62.0, 101.25, 77.0];
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let sd = (xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)).sqrt();
        let (_, lo, hi) = t_interval95(&xs);
        let (lo2, hi2) = t_interval95_of(mean, sd, xs.len());
        assert!(
            (lo - lo2).abs() < 1e-9 && (hi - hi2).abs() < 1e-9,
            "{lo} {lo2} {hi} {hi2}"
        );
        assert!(t_interval95_of(mean, sd, 1).0.is_nan());
    }
}
