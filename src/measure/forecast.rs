//! Sampling forecast (seed 000, "The same records forecast sampled
//! answers"): the chance a sampler picks the true token at a position, from
//! the full logit row, after the sampler's trimming and renormalising.
//!
//! Contract: the chain is llama.cpp's default order: top-k, top-p, min-p,
//! temperature, then a draw from the softmax of what is left. top-p and
//! min-p see the untempered distribution (they come before temperature);
//! ties at a cut keep the lower id first, as a stable sort does. f64 math
//! from the f32 logits; pure functions.

use crate::core::Sampler;

/// The candidates the sampler can draw after trimming, with their
/// probabilities (renormalised, tempered), most likely first.
pub(crate) fn kept(row: &[f32], s: &Sampler) -> Vec<(usize, f64)> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    let order = |a: &usize, b: &usize| {
        row[*b]
            .partial_cmp(&row[*a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(b))
    };
    let k = if s.top_k > 0 {
        (s.top_k as usize).min(row.len())
    } else {
        row.len()
    };
    if k < row.len() {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    let max = f64::from(row[idx[0]]);
    if s.top_p < 1.0 {
        // Softmax over what top-k left; the shortest prefix reaching top_p,
        // the crossing token included (llama_sampler_top_p_apply).
        let e: Vec<f64> = idx
            .iter()
            .map(|&j| (f64::from(row[j]) - max).exp())
            .collect();
        let z: f64 = e.iter().sum();
        let mut cum = 0.0;
        let mut keep = idx.len();
        for (i, x) in e.iter().enumerate() {
            cum += x / z;
            if cum >= f64::from(s.top_p) {
                keep = i + 1;
                break;
            }
        }
        idx.truncate(keep.max(1));
    }
    if s.min_p > 0.0 {
        // p_j ≥ min_p · p_max  ⇔  l_j ≥ l_max + ln(min_p).
        let cut = max + f64::from(s.min_p).ln();
        idx.retain(|&j| f64::from(row[j]) >= cut);
    }
    let t = f64::from(s.temperature);
    let e: Vec<f64> = idx
        .iter()
        .map(|&j| ((f64::from(row[j]) - max) / t).exp())
        .collect();
    let z: f64 = e.iter().sum();
    idx.into_iter().zip(e).map(|(j, x)| (j, x / z)).collect()
}

/// The chance the sampler draws `target` from `row`.
pub fn p_pick(row: &[f32], s: &Sampler, target: usize) -> f64 {
    kept(row, s)
        .iter()
        .find(|(j, _)| *j == target)
        .map_or(0.0, |(_, p)| *p)
}

/// The forecast survival curve: `S[k]` = the chance the first `k` units are
/// all drawn right (`S[0] = 1`), for per-position chances `q`.
pub(crate) fn survival(q: &[f64]) -> Vec<f64> {
    let mut s = Vec::with_capacity(q.len() + 1);
    let mut acc = 1.0f64;
    s.push(acc);
    for &x in q {
        acc *= x;
        s.push(acc);
    }
    s
}

/// Expected number of units right before the first wrong one:
/// `Σ_{k≥1} S[k]`.
pub fn expected_reach(q: &[f64]) -> f64 {
    survival(q)[1..].iter().sum()
}

/// Draw from `kept` with a uniform `u` in [0, 1) (the fake engine's sampler).
pub(crate) fn draw(kept: &[(usize, f64)], u: f64) -> usize {
    let mut cum = 0.0;
    for &(j, p) in kept {
        cum += p;
        if u < cum {
            return j;
        }
    }
    kept.last().map_or(0, |k| k.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> Sampler {
        Sampler {
            temperature,
            top_k,
            top_p,
            min_p,
        }
    }

    #[test]
    fn plain_temperature_is_the_tempered_softmax() {
        let row = [1.0f32, 2.0, 0.5, -1.0];
        for t in [0.5f32, 1.0, 1.7] {
            let z: f64 = row
                .iter()
                .map(|&l| (f64::from(l) / f64::from(t)).exp())
                .sum();
            for (j, &l) in row.iter().enumerate() {
                let want = (f64::from(l) / f64::from(t)).exp() / z;
                assert!((p_pick(&row, &s(t, 0, 1.0, 0.0), j) - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn trimming_follows_llama_cpp_order() {
        // probabilities at T=1: ~0.6439, 0.2369, 0.0871, 0.0321
        let row = [3.0f32, 2.0, 1.0, 0.0];
        // top-k 2: the third token is gone, the rest renormalised.
        assert_eq!(p_pick(&row, &s(1.0, 2, 1.0, 0.0), 2), 0.0);
        let p0 = p_pick(&row, &s(1.0, 2, 1.0, 0.0), 0);
        assert!((p0 - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-12);
        // top-p 0.8: 0.644 < 0.8 ≤ 0.644 + 0.237, so two are kept.
        assert_eq!(kept(&row, &s(1.0, 0, 0.8, 0.0)).len(), 2);
        // top-p sees the untempered distribution: a high temperature does
        // not change what is kept.
        assert_eq!(kept(&row, &s(5.0, 0, 0.8, 0.0)).len(), 2);
        // min-p 0.1: p_j ≥ 0.0644 keeps three.
        assert_eq!(kept(&row, &s(1.0, 0, 1.0, 0.1)).len(), 3);
        // The chances of what is kept add up to one.
        let k = kept(&row, &s(0.7, 3, 0.99, 0.05));
        assert!((k.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn survival_and_reach() {
        let q = [0.5, 0.5, 1.0, 0.0, 1.0];
        assert_eq!(survival(&q), vec![1.0, 0.5, 0.25, 0.25, 0.0, 0.0]);
        assert!((expected_reach(&q) - 1.0).abs() < 1e-15);
        // Always right: reach is the length.
        assert_eq!(expected_reach(&[1.0; 7]), 7.0);
    }
}
