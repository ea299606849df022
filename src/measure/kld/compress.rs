//! A reference row kept compactly ([`RefPosition`]): the top entries with
//! their exact logits, the exact tail mass, and the tail as one byte per
//! vocabulary entry on 255 companded levels. The `.qgref` file codec that
//! stores these is `execute::qgref`; the KL math that reads them is the
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

/// The tail of a reference row at one byte per vocabulary entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Tail {
    /// Smallest tail logit (level 0).
    pub lo: f32,
    /// Largest tail logit (level 254).
    pub hi: f32,
    /// Exact `Σ_tail p_j·(l_j − max)` (the tail's part of the entropy).
    pub mean_logit: f64,
    /// Exact `Σ_tail (p̃_j − p_j)·(l_j − max)`, p̃ the levels' (rescaled)
    /// probability of entry j: removes the levels' rounding from the cross
    /// term, leaving `Σ (p̃_j − p_j)·(l_c,j − l_j)`, rounding times the
    /// candidate's perturbation.
    pub rounding: f64,
    /// Per vocabulary id: level 0..=254, or [`KEPT`] for a kept entry.
    pub codes: Vec<u8>,
    /// How many ids use each level (index 255: kept), derived from `codes`.
    pub counts: Vec<u32>,
}

/// Companding scale of the tail levels (nats).
pub(crate) const COMPAND: f64 = 3.0;

/// The code of a kept entry in [`Tail::codes`].
pub const KEPT: u8 = 255;

impl Tail {
    /// The logit of level `c`: levels evenly spaced in `u = e^{(l − hi)/3}`
    /// between lo and hi, so their density follows p^(1/3), the spacing that
    /// minimises the probability-weighted squared rounding error.
    pub fn level(&self, c: u8) -> f32 {
        if self.hi <= self.lo {
            return self.hi;
        }
        let u_lo = ((f64::from(self.lo) - f64::from(self.hi)) / COMPAND).exp();
        let u = u_lo + (1.0 - u_lo) * f64::from(c.min(254)) / 254.0;
        (f64::from(self.hi) + COMPAND * u.ln()) as f32
    }

    /// The level nearest to logit `l`.
    pub fn encode(lo: f32, hi: f32, l: f32) -> u8 {
        if hi <= lo {
            return 254;
        }
        let e = Encoder::new(lo, hi);
        let u = ((f64::from(l) - f64::from(hi)) / COMPAND).exp();
        e.pick(l, u)
    }
}

impl Tail {
    /// A tail from its stored fields (counts derived).
    pub fn new(lo: f32, hi: f32, mean_logit: f64, rounding: f64, codes: Vec<u8>) -> Self {
        let mut counts = vec![0u32; 256];
        for &c in &codes {
            counts[c as usize] += 1;
        }
        Tail {
            lo,
            hi,
            mean_logit,
            rounding,
            codes,
            counts,
        }
    }
}

impl RefPosition {
    /// Log-prob of a kept entry's logit.
    #[inline]
    pub fn lp(&self, logit: f32) -> f64 {
        (f64::from(logit) - f64::from(self.max)) - self.lse
    }

    /// The reference's argmax.
    pub fn argmax(&self) -> u32 {
        self.entries[0].0
    }

    /// Top-1 probability, as 1 − Σ(other probabilities) so that it stays
    /// exact near 1.
    pub fn p1(&self) -> f64 {
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
pub fn compress_row_exps(
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
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    let m = f64::from(st.max);
    // Branch-free over the row (kept ids are scattered): a kept entry adds
    // a signed zero, which leaves every sum bitwise as the tail's alone.
    for ((&v, &e), &k) in row.iter().zip(exps).zip(&is_kept) {
        let w = if k { 0.0 } else { 1.0 };
        let x = f64::from(v) - m;
        tail_mass += e * w;
        mean_logit += (e * x) * w;
        lo = if k { lo } else { lo.min(v) };
        hi = if k { hi } else { hi.max(v) };
    }
    let z = st.log_sum_exp.exp();
    let tail_mass = tail_mass / z;
    let tail = (kept.len() < n).then(|| {
        let codes = Encoder::new(lo, hi).codes(row, &is_kept);
        let mut t = Tail::new(lo, hi, mean_logit / z, 0.0, codes);
        let mut levels = Levels::of(st.max, st.log_sum_exp, tail_mass, &t);
        levels.p[KEPT as usize] = 0.0;
        t.rounding = 0.0;
        for ((&v, &c), &e) in row.iter().zip(&t.codes).zip(exps) {
            let w = if c == KEPT { 0.0 } else { 1.0 };
            let x = f64::from(v) - m;
            t.rounding += ((levels.p[c as usize] - e / z) * x) * w;
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

/// [`Tail::encode`] for one row's tail range: the 255 level logits and the
/// companding constant computed once, the per-entry companding with the
/// branch-free [`exp_nonpos`] (vectorised like the row reduction), then the
/// nearest of the neighbouring levels from the table — the same levels as
/// [`Tail::encode`] picks.
pub(crate) struct Encoder {
    lo: f32,
    hi: f32,
    u_lo: f64,
    /// The level logits at 1..=255; 0 and 256 are sentinels no logit is
    /// nearer to than to a level.
    levels: [f32; 257],
}

impl Encoder {
    fn new(lo: f32, hi: f32) -> Encoder {
        let t = Tail {
            lo,
            hi,
            mean_logit: 0.0,
            rounding: 0.0,
            codes: Vec::new(),
            counts: Vec::new(),
        };
        let mut levels = [f32::INFINITY; 257];
        for c in 0..255usize {
            levels[c + 1] = t.level(c as u8);
        }
        Encoder {
            lo,
            hi,
            u_lo: ((f64::from(lo) - f64::from(hi)) / COMPAND).exp(),
            levels,
        }
    }

    /// The level of logit `l` (≤ hi) from its companded value `u`: the
    /// rounding of `u` to the evenly spaced levels, then the nearest of it
    /// and its neighbours in logit space (ties: it, then the one below).
    #[inline(always)]
    fn pick(&self, l: f32, u: f64) -> u8 {
        let c = ((u - self.u_lo) / (1.0 - self.u_lo) * 254.0).round() as i32;
        self.nearest(l, c)
    }

    /// The nearest level to `l` among `c − 1`, `c`, `c + 1` (`c` clamped
    /// to the levels), ties kept by `c`, then `c − 1`.
    #[inline(always)]
    fn nearest(&self, l: f32, c: i32) -> u8 {
        let c = c.clamp(0, 254) as usize + 1;
        let (dm, d0, dp) = (
            (self.levels[c - 1] - l).abs(),
            (self.levels[c] - l).abs(),
            (self.levels[c + 1] - l).abs(),
        );
        // Branch-free selects: which neighbour wins is data, not control.
        let down = usize::from(dm < d0);
        let (best, d) = (c - down, if dm < d0 { dm } else { d0 });
        let up = usize::from(dp < d);
        (best + up * (c + 1 - best) - 1) as u8
    }

    /// The codes of a row: [`KEPT`] for kept ids, else the tail level.
    fn codes(&self, row: &[f32], is_kept: &[bool]) -> Vec<u8> {
        if self.hi <= self.lo {
            return is_kept
                .iter()
                .map(|&k| if k { KEPT } else { 254 })
                .collect();
        }
        let mut c = vec![0f64; row.len()];
        compand(row, self.hi, self.u_lo, &mut c);
        row.iter()
            .zip(&c)
            .zip(is_kept)
            .map(|((&l, &c), &k)| {
                let code = self.nearest(l, c as i32);
                if k {
                    KEPT
                } else {
                    code
                }
            })
            .collect()
    }
}

/// `c[j]`: the level `u[j] = exp((row[j] − hi)/3)` rounds to among 255
/// evenly spaced between `u_lo` and 1 (kept ids above `hi` clamp to 1).
pub(crate) fn compand(row: &[f32], hi: f32, u_lo: f64, c: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { compand_avx2(row, hi, u_lo, c) };
    }
    compand_impl(row, hi, u_lo, c)
}

#[inline(always)]
pub(crate) fn compand_impl(row: &[f32], hi: f32, u_lo: f64, c: &mut [f64]) {
    let h = f64::from(hi);
    let scale = 254.0 / (1.0 - u_lo);
    let one = |l: f32| {
        let x = (f64::from(l) - h) * (1.0 / COMPAND);
        let u = exp_nonpos(if x > 0.0 { 0.0 } else { x });
        // u ≥ u_lo: rounded half up; where this and `Tail::encode`'s
        // rounding differ by one, `nearest` looks at both neighbours.
        ((u - u_lo) * scale + 0.5).floor()
    };
    const L: usize = 8;
    let mut out = c.chunks_exact_mut(L);
    let mut inp = row.chunks_exact(L);
    for (o, i) in (&mut out).zip(&mut inp) {
        for k in 0..L {
            o[k] = one(i[k]);
        }
    }
    for (o, &l) in out.into_remainder().iter_mut().zip(inp.remainder()) {
        *o = one(l);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn compand_avx2(row: &[f32], hi: f32, u_lo: f64, c: &mut [f64]) {
    compand_impl(row, hi, u_lo, c)
}
