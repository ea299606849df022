//! Anytime-valid decisions on the mean of a finite population of bounded
//! values visited in random order without replacement: betting confidence
//! sequences (Waudby-Smith & Ramdas, "Estimating means of bounded random
//! variables by betting", JRSS-B 2023, arXiv 2010.09686, §6 on sampling
//! without replacement).
//!
//! Contract: a [`MeanSequence`] over N values declared to lie in `[lo, hi]`
//! gives, after each value, a lower and an upper bound on the mean of all N
//! values. Each bound is a one-sided confidence sequence at level `alpha`:
//! whatever the population and however the run stops, the chance that the
//! lower (upper) bound is ever above (below) the true mean is at most
//! `alpha`. At n = N both bounds are the exact mean. The bounds are those
//! of the `confseq` package (`confseq.betting.betting_lower_cs` with
//! `N`, `alpha`, `breaks = 1000`, `trunc_scale`), on a grid of 1000 steps of
//! the declared range, with its adaptive Kelly bets (`lambda_aKelly` with
//! `N`) taken one-sided (never betting against the bound's direction); the
//! upper bound is the lower bound of the values reflected in the range.
//!
//! A gate `mean ≤ c` passes once the upper bound is ≤ c and fails once the
//! lower bound is > c (a gate `mean ≥ c` the mirror): only one of the two
//! wrong verdicts is possible for a given population, so each verdict is
//! wrong with probability at most `alpha` — and at n = N it is the fixed-N
//! verdict.

use super::SplitMix64;

/// Grid steps over the declared range (confseq's `breaks`).
pub const BREAKS: usize = 1000;

/// How far a bet may go toward ruin (confseq's `trunc_scale`): the stake is
/// at most this fraction of what would lose everything on the worst value.
/// Any value in (0, 1] keeps every bound valid; the Kelly bet on a gate's
/// threshold is usually far above this cap when the declared range is wide
/// next to the values' spread, so the cap sets the pace. Measured on the
/// fixture ladder's 80 recorded windows (ΔNLL ≤ 0.05, bounds [-0.5, 0.5],
/// 200 orders): 0.5 (confseq's default) decides Q8_0 in 42–45 windows and
/// Q2_K in 13–19; 0.9 in 31–32 and 9–14; 1.0 (which a value at the bound
/// itself would ruin) in 29–31 and 9–14.
pub const TRUNC_SCALE: f64 = 0.9;

/// A one-sided lower confidence sequence for the mean of `n_pop` values in
/// [0, 1], sampled without replacement.
#[derive(Debug, Clone)]
pub struct LowerSequence {
    n_pop: usize,
    alpha: f64,
    trunc: f64,
    /// Values seen.
    t: usize,
    /// Their sum.
    sum: f64,
    /// Σ (x_i − μ̂_i)², μ̂_i the regularised running mean after x_i.
    dev2: f64,
    /// Capital per grid point `k / BREAKS`.
    capital: Vec<f64>,
    /// Grid points not shown impossible: once a point's conditional mean
    /// leaves [0, 1] it stays out, and that mean rises with the point, so
    /// the points ruled out are a prefix and a suffix of the grid.
    possible: std::ops::Range<usize>,
}

impl LowerSequence {
    /// A sequence for `n_pop` values at level `alpha`.
    pub fn new(n_pop: usize, alpha: f64) -> Self {
        Self::with_trunc(n_pop, alpha, TRUNC_SCALE)
    }

    /// The same with another truncation of the bets.
    pub(crate) fn with_trunc(n_pop: usize, alpha: f64, trunc: f64) -> Self {
        // `push` relies on it (trunc/mu ≤ 1/mu).
        assert!(
            trunc > 0.0 && trunc <= 1.0,
            "trunc_scale {trunc} outside (0, 1]"
        );
        LowerSequence {
            n_pop,
            alpha,
            trunc,
            t: 0,
            sum: 0.0,
            dev2: 0.0,
            capital: vec![1.0; BREAKS + 1],
            possible: 0..BREAKS + 1,
        }
    }

    /// Values seen.
    pub(crate) fn n(&self) -> usize {
        self.t
    }

    /// Take the next value `x` in [0, 1] (the caller checks the range).
    pub fn push(&mut self, x: f64) {
        assert!(self.t < self.n_pop, "more values than the population holds");
        let n = self.n_pop as f64;
        // Step t (1-based) of confseq's arrays: everything below is from
        // values before this one (predictable).
        let t = (self.t + 1) as f64;
        let left = n - (t - 1.0);
        let mu_hat = (0.5 + self.sum) / t;
        let v = (0.25 + self.dev2) / t;
        let cond = (n * mu_hat - self.sum) / left;
        let sum = self.sum;
        // The conditional mean if the population's mean were grid point k;
        // it rises with k (each step rounds monotonically).
        let mu_at = |k: usize| (n * (k as f64 * (1.0 / BREAKS as f64)) - sum) / left;
        let inside = |k: usize| (0.0..=1.0).contains(&mu_at(k));
        // Once outside, always outside: the values seen already rule
        // those means out, from either end of the grid.
        let (mut start, mut end) = (self.possible.start, self.possible.end);
        while start < end && !inside(start) {
            start += 1;
        }
        while end > start && !inside(end - 1) {
            end -= 1;
        }
        self.possible = start..end;
        for (k, capital) in (start..end).zip(&mut self.capital[start..end]) {
            let mu = mu_at(k);
            let g = cond - mu;
            // confseq's bet, clamped to [-1/(1-mu), 1/mu], then to [0, ∞)
            // (one-sided: never bet on the mean being below m), then to
            // [-trunc/(1-mu), trunc/mu]. Once it is ≥ 0 the negative
            // bounds cannot bind, and trunc/mu ≤ 1/mu (trunc ≤ 1, and
            // division rounds monotonically), so two clamps give the very
            // same value with half the divisions (a NaN bet is 0 either
            // way: f64::max ignores NaN).
            let lambda = (g / (v + g * g)).max(0.0).min(self.trunc / mu);
            let d = x - mu;
            let factor = if lambda == f64::INFINITY && d == 0.0 {
                1.0
            } else {
                1.0 + lambda * d
            };
            let c = *capital * factor;
            *capital = if c.is_nan() { 0.0 } else { c };
        }
        self.sum += x;
        let mu_hat_now = (0.5 + self.sum) / (t + 1.0);
        self.dev2 += (x - mu_hat_now).powi(2);
        self.t += 1;
    }

    /// The lower bound now: the lowest grid point not rejected, one step
    /// down, and never below what the values seen alone imply (S / N).
    pub fn bound(&self) -> f64 {
        let threshold = 1.0 / self.alpha;
        let first = self
            .possible
            .clone()
            .find(|&k| self.capital[k] <= threshold);
        let l = match first {
            Some(k) => (k as f64 * (1.0 / BREAKS as f64) - 1.0 / BREAKS as f64).max(0.0),
            None => 0.0,
        };
        l.max(self.sum / self.n_pop as f64)
    }
}

/// Lower and upper confidence sequences for the mean of `n_pop` values
/// declared to lie in `[lo, hi]`.
#[derive(Debug, Clone)]
pub struct MeanSequence {
    lo: f64,
    hi: f64,
    lower: LowerSequence,
    upper: LowerSequence,
    sum: f64,
}

/// A value outside the declared bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutOfBounds {
    /// The value.
    pub value: f64,
    /// The declared bounds.
    pub bounds: (f64, f64),
}

impl MeanSequence {
    /// Sequences for `n_pop` values in `bounds` at level `alpha` each.
    pub fn new(n_pop: usize, bounds: (f64, f64), alpha: f64) -> Self {
        MeanSequence {
            lo: bounds.0,
            hi: bounds.1,
            lower: LowerSequence::new(n_pop, alpha),
            upper: LowerSequence::new(n_pop, alpha),
            sum: 0.0,
        }
    }

    /// Values seen.
    pub(crate) fn n(&self) -> usize {
        self.lower.n()
    }

    /// Take the next value; a value outside the bounds (or NaN) is refused
    /// and leaves the sequence as it was.
    pub fn push(&mut self, value: f64) -> Result<(), OutOfBounds> {
        if !(self.lo..=self.hi).contains(&value) {
            return Err(OutOfBounds {
                value,
                bounds: (self.lo, self.hi),
            });
        }
        let x = ((value - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0);
        self.lower.push(x);
        self.upper.push(1.0 - x);
        self.sum += value;
        Ok(())
    }

    /// (lower, upper) bound on the population mean now; at n = N both are
    /// the mean of the values.
    pub fn bounds(&self) -> (f64, f64) {
        if self.n() == self.lower.n_pop {
            let mean = self.sum / self.n() as f64;
            return (mean, mean);
        }
        let w = self.hi - self.lo;
        (
            self.lo + self.lower.bound() * w,
            self.lo + (1.0 - self.upper.bound()) * w,
        )
    }
}

/// What a gate says of a mean, given bounds on it: Some(pass) once the
/// threshold lies outside them, None while it is inside.
pub fn decided(max: Option<f64>, min: Option<f64>, (lo, hi): (f64, f64)) -> Option<bool> {
    match (max, min) {
        (Some(c), None) if hi <= c => Some(true),
        (Some(c), None) if lo > c => Some(false),
        (None, Some(c)) if lo >= c => Some(true),
        (None, Some(c)) if hi < c => Some(false),
        _ => None,
    }
}

/// A seeded random order of `0..n` (Fisher–Yates on SplitMix64, unbiased):
/// the same seed, the same order, on every machine.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64(seed);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_n_the_bounds_are_the_exact_mean() {
        let xs = [0.01, -0.02, 0.05, 0.0, 0.03];
        let mut s = MeanSequence::new(xs.len(), (-0.5, 0.5), 0.05);
        for x in xs {
            let (lo, hi) = s.bounds();
            assert!(lo <= hi);
            s.push(x).unwrap();
        }
        let mean = xs.iter().sum::<f64>() / 5.0;
        assert_eq!(s.bounds(), (mean, mean));
    }

    #[test]
    fn out_of_bounds_and_nan_are_refused() {
        let mut s = MeanSequence::new(4, (0.0, 1.0), 0.05);
        assert!(s.push(1.5).is_err());
        assert!(s.push(f64::NAN).is_err());
        assert_eq!(s.n(), 0);
        s.push(0.5).unwrap();
        assert_eq!(s.n(), 1);
    }

    #[test]
    fn bounds_tighten_around_a_constant_population() {
        let n = 400;
        let mut s = MeanSequence::new(n, (0.0, 1.0), 0.05);
        for _ in 0..200 {
            s.push(0.3).unwrap();
        }
        let (lo, hi) = s.bounds();
        assert!(lo < 0.3 && 0.3 < hi, "{lo} {hi}");
        assert!(hi - lo < 0.1, "{lo} {hi}");
        // A gate at 0.5 is decided long before N; one at 0.3 is not.
        assert_eq!(decided(Some(0.5), None, (lo, hi)), Some(true));
        assert_eq!(decided(None, Some(0.5), (lo, hi)), Some(false));
        assert_eq!(decided(Some(0.3), None, (lo, hi)), None);
    }

    #[test]
    fn permutations_are_seeded_and_complete() {
        let a = permutation(80, 7);
        assert_eq!(a, permutation(80, 7));
        assert_ne!(a, permutation(80, 8));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..80).collect::<Vec<_>>());
    }

    /// Ville's inequality, checked by simulation: over many random orders of
    /// a fixed skewed population, neither bound ever crosses the true mean
    /// in more than alpha of the runs (here far fewer).
    #[test]
    fn each_bound_misses_the_mean_in_at_most_alpha_of_orders() {
        let n = 60;
        let mut rng = SplitMix64(1);
        let pop: Vec<f64> = (0..n)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                // Heavy right tail within [0, 1].
                u.powi(6)
            })
            .collect();
        let mean = pop.iter().sum::<f64>() / n as f64;
        let runs = 400;
        let (mut low_miss, mut high_miss) = (0, 0);
        for r in 0..runs {
            let order = permutation(n, r);
            let mut s = MeanSequence::new(n, (0.0, 1.0), 0.1);
            let (mut lm, mut hm) = (false, false);
            for &i in &order {
                s.push(pop[i]).unwrap();
                let (lo, hi) = s.bounds();
                lm |= lo > mean + 1e-12;
                hm |= hi < mean - 1e-12;
            }
            low_miss += usize::from(lm);
            high_miss += usize::from(hm);
        }
        assert!(low_miss as f64 <= 0.1 * runs as f64, "{low_miss}");
        assert!(high_miss as f64 <= 0.1 * runs as f64, "{high_miss}");
    }
}
