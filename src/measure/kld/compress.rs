//! A reference row kept compactly ([`RefPosition`]): the top entries with
//! their exact logits, the exact tail mass, and the tail as a level per
//! vocabulary entry: [`LEVELS`] groups of companded probability, each with
//! its exact share of the mass. The `.qgref` file codec that stores these
//! (range coded) is `execute::qgref`; the KL math that reads them is the
//! parent module.

use super::*;

/// The reference distribution at one scored position.
#[derive(Debug, Clone, PartialEq)]
pub struct RefPosition {
    /// Largest logit of the row.
    pub max: f32,
    /// `ln Σ exp(l − max)` of the row.
    pub lse: f64,
    /// Kept entries, most probable first (ties: lower id first): id, logit.
    /// Their log-prob is `(logit − max) − lse` in f64, exactly as for the
    /// full row.
    pub entries: Vec<(u32, f32)>,
    /// Exact log-prob of the true next token.
    pub lp_true: f64,
    /// Exact probability mass of the entries not kept (0 when all are kept).
    pub tail_mass: f64,
    /// The entries not kept, one byte each (None: the tail is left out, as
    /// in an imported llama-perplexity row).
    pub tail: Option<Tail>,
    /// The log-probs are approximate (an imported 16-bit `.kld` row).
    pub approximate: bool,
}

/// The tail of a reference row: every id not kept, in [`LEVELS`] levels of
/// companded probability with each level's exact mass.
#[derive(Debug, Clone, PartialEq)]
pub struct Tail {
    /// Largest tail logit: level `g` holds the ids whose
    /// `u = exp(GAMMA·(l − hi)) = (p/p_hi)^γ` lies in `[g/L, (g+1)/L)`.
    pub hi: f32,
    /// Exact `Σ_tail p_j·(l_j − max)` (the tail's part of the entropy).
    pub mean_logit: f64,
    /// Exact `Σ_tail (p̃_j − p_j)·(l_j − max)`, p̃ the level probability of
    /// entry j ([`Tail::level_probs`]): removes the levels' rounding from
    /// the cross term, leaving `Σ (p̃_j − p_j)·(l_c,j − l_j)`, rounding times
    /// the candidate's perturbation, which sums to ~0 within each level.
    pub rounding: f64,
    /// Per level: its share of the tail mass (Σ p of its ids / tail mass),
    /// as stored (f32; a level with ids never 0).
    pub masses: Vec<f32>,
    /// Per vocabulary id: its level, or [`KEPT`] for a kept entry.
    pub codes: Vec<u8>,
    /// How many ids use each level (index 255: kept), derived from `codes`.
    pub counts: Vec<u32>,
}

/// Tail levels per row.
pub(crate) const LEVELS: usize = 96;

/// Companding exponent of the levels: `(p/p_hi)^γ`.
pub(crate) const GAMMA: f64 = 0.5;

/// The code of a kept entry in [`Tail::codes`].
pub(crate) const KEPT: u8 = 255;

impl Tail {
    /// A tail from its stored fields (counts derived).
    pub(crate) fn new(
        hi: f32,
        mean_logit: f64,
        rounding: f64,
        masses: Vec<f32>,
        codes: Vec<u8>,
    ) -> Self {
        let mut counts = vec![0u32; 256];
        for &c in &codes {
            counts[c as usize] += 1;
        }
        Tail {
            hi,
            mean_logit,
            rounding,
            masses,
            codes,
            counts,
        }
    }

    /// Per level: the probability p̃ of each of its ids and its log, for a
    /// tail of exact mass `tail_mass` (the levels' shares rescaled to sum
    /// to one); 0 and −∞ for a level without ids (index 255 never read).
    pub(crate) fn level_probs(&self, tail_mass: f64) -> ([f64; 256], [f64; 256]) {
        let (mut p, mut lp) = ([0.0f64; 256], [f64::NEG_INFINITY; 256]);
        let share: f64 = self
            .masses
            .iter()
            .zip(&self.counts)
            .filter(|(_, &n)| n > 0)
            .map(|(&m, _)| f64::from(m))
            .sum();
        if share <= 0.0 {
            return (p, lp);
        }
        for (g, (&m, &n)) in self.masses.iter().zip(&self.counts).enumerate() {
            if n > 0 {
                p[g] = tail_mass * (f64::from(m) / share) / f64::from(n);
                lp[g] = p[g].ln();
            }
        }
        (p, lp)
    }
}

/// The level of each tail id of `row` (kept ids: [`KEPT`]): `⌊L·u⌋` of
/// `u = exp(γ·(l − hi))`, at most `L − 1`; branch-free and vectorised like
/// the row reduction.
pub(crate) fn levels_of(row: &[f32], hi: f32, is_kept: &[bool]) -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { levels_avx2(row, hi, is_kept) };
    }
    levels_impl(row, hi, is_kept)
}

#[inline(always)]
pub(crate) fn levels_impl(row: &[f32], hi: f32, is_kept: &[bool]) -> Vec<u8> {
    let h = f64::from(hi);
    let top = (LEVELS - 1) as f64;
    let one = |l: f32, k: bool| -> u8 {
        let x = (f64::from(l) - h) * GAMMA;
        let u = exp_nonpos(if x > 0.0 { 0.0 } else { x });
        let g = (u * LEVELS as f64).floor().min(top) as u8;
        if k {
            KEPT
        } else {
            g
        }
    };
    row.iter().zip(is_kept).map(|(&l, &k)| one(l, k)).collect()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn levels_avx2(row: &[f32], hi: f32, is_kept: &[bool]) -> Vec<u8> {
    levels_impl(row, hi, is_kept)
}

impl RefPosition {
    /// Log-prob of a kept entry's logit.
    #[inline]
    pub(crate) fn lp(&self, logit: f32) -> f64 {
        (f64::from(logit) - f64::from(self.max)) - self.lse
    }

    /// The reference's argmax.
    pub(crate) fn argmax(&self) -> u32 {
        self.entries[0].0
    }

    /// Top-1 probability, as 1 − Σ(other probabilities) so that it stays
    /// exact near 1.
    pub(crate) fn p1(&self) -> f64 {
        let others: f64 = self.entries[1..]
            .iter()
            .map(|&(_, l)| exp_nonpos(self.lp(l).min(0.0)))
            .sum::<f64>()
            + self.tail_mass;
        if others < 0.5 {
            1.0 - others
        } else {
            exp_nonpos(self.lp(self.entries[0].1).min(0.0))
        }
    }
}

/// Compress a reference row: keep the most probable entries until the rest
/// holds ≤ `tail` of the mass (or `max_kept` entries are kept).
pub fn compress_row(
    row: &[f32],
    st: &RowStats,
    target: usize,
    tail: f64,
    max_kept: usize,
) -> RefPosition {
    let mut exps = Vec::new();
    crate::measure::row_stats_exps(row, &mut exps);
    compress_row_exps(row, st, &exps, target, tail, max_kept)
}

/// [`compress_row`] from the row's `exp(l − max)` terms
/// ([`crate::measure::row_stats_exps`]), which a shared decode computes once
/// for every consumer of the row: bitwise the same result.
pub(crate) fn compress_row_exps(
    row: &[f32],
    st: &RowStats,
    exps: &[f64],
    target: usize,
    tail: f64,
    max_kept: usize,
) -> RefPosition {
    let n = row.len();
    let k = max_kept.clamp(1, n);
    let idx = top_k(row, k);
    // Mass of everything, accumulated from the least probable kept entry
    // upward would lose the tail; sum the kept part and subtract from the
    // exact total of the row instead (Σ p = 1 up to rounding of 1e-16).
    let lp = |j: usize| st.logprob(row, j);
    let mut kept = Vec::with_capacity(k);
    let mut mass = 0.0f64;
    for &j in &idx {
        kept.push((j, row[j as usize]));
        mass += exp_nonpos(lp(j as usize).min(0.0));
        if 1.0 - mass <= tail {
            break;
        }
    }
    // The exact tail: sum the dropped entries themselves.
    let mut is_kept = vec![false; n];
    for &(j, _) in &kept {
        is_kept[j as usize] = true;
    }
    let mut tail_mass = 0.0f64;
    let mut mean_logit = 0.0f64;
    let mut hi = f32::NEG_INFINITY;
    let m = f64::from(st.max);
    // Branch-free over the row (kept ids are scattered): a kept entry adds
    // a signed zero, which leaves every sum bitwise as the tail's alone.
    for ((&v, &e), &k) in row.iter().zip(exps).zip(&is_kept) {
        let w = if k { 0.0 } else { 1.0 };
        let x = f64::from(v) - m;
        tail_mass += e * w;
        mean_logit += (e * x) * w;
        hi = if k { hi } else { hi.max(v) };
    }
    let z = st.log_sum_exp.exp();
    let tail_mass = tail_mass / z;
    let tail = (kept.len() < n).then(|| {
        let codes = levels_of(row, hi, &is_kept);
        let mut mass = [0.0f64; LEVELS];
        for (&c, &e) in codes.iter().zip(exps) {
            if c != KEPT {
                mass[c as usize] += e;
            }
        }
        let total: f64 = mass.iter().sum();
        let masses: Vec<f32> = mass
            .iter()
            .map(|&x| {
                let share = (x / total) as f32;
                // A level with ids keeps a mass (its share may underflow).
                if x > 0.0 {
                    share.max(f32::MIN_POSITIVE)
                } else {
                    share
                }
            })
            .collect();
        let mut t = Tail::new(hi, mean_logit / z, 0.0, masses, codes);
        let (p, _) = t.level_probs(tail_mass);
        for ((&v, &c), &e) in row.iter().zip(&t.codes).zip(exps) {
            let w = if c == KEPT { 0.0 } else { 1.0 };
            let x = f64::from(v) - m;
            t.rounding += ((p[c as usize] - e / z) * x) * w;
        }
        t
    });
    RefPosition {
        max: st.max,
        lse: st.log_sum_exp,
        entries: kept,
        lp_true: lp(target),
        tail_mass,
        tail,
        approximate: false,
    }
}

/// Order-preserving integer key of a finite logit (−0 is 0, as
/// `partial_cmp` has it): `key(a) < key(b)` exactly when `a < b`.
#[inline(always)]
pub(crate) fn order_key(v: f32) -> u32 {
    let b = if v == 0.0 { 0 } else { v.to_bits() };
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Bits of the key the first histogram pass of [`top_k`] buckets by.
pub(crate) const RADIX_BITS: u32 = 11;

/// The ids of the `k` largest logits, most probable first, ties by lower
/// id — no sort of the vocabulary: a histogram of the keys' top bits finds
/// the bucket the k-th largest falls in, one pass collects the ids above
/// it and the bucket's own, a selection among the bucket's finds the exact
/// threshold, and only the `k` kept ids are sorted (as packed integer keys).
pub(crate) fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let n = row.len();
    let shift = 32 - RADIX_BITS;
    let packed = |j: u32| (u64::from(order_key(row[j as usize])) << 32) | u64::from(!j);
    let mut sel: Vec<u64> = if k < n {
        let mut hist = vec![0u32; 1 << RADIX_BITS];
        for &v in row {
            hist[(order_key(v) >> shift) as usize] += 1;
        }
        // The bucket holding the k-th largest key, and how many lie above it.
        let (mut bucket, mut above) = (hist.len() - 1, 0usize);
        while above + (hist[bucket] as usize) < k {
            above += hist[bucket] as usize;
            bucket -= 1;
        }
        let mut sel = Vec::with_capacity(k);
        let mut edge: Vec<u64> = Vec::with_capacity(hist[bucket] as usize);
        for (j, &v) in row.iter().enumerate() {
            let key = order_key(v);
            let b = (key >> shift) as usize;
            if b > bucket {
                sel.push((u64::from(key) << 32) | u64::from(!(j as u32)));
            } else if b == bucket {
                edge.push((u64::from(key) << 32) | u64::from(!(j as u32)));
            }
        }
        // The largest of the bucket's, value first, then the lower id.
        let take = k - above;
        if take < edge.len() {
            edge.select_nth_unstable_by(take - 1, |a, b| b.cmp(a));
            edge.truncate(take);
        }
        sel.extend(edge);
        sel
    } else {
        (0..n as u32).map(packed).collect()
    };
    // Most probable first; equal logits: the lower id (its complement is larger).
    sel.sort_unstable_by(|a, b| b.cmp(a));
    sel.into_iter().map(|p| !(p as u32)).collect()
}
