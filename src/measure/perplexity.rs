//! Perplexity arithmetic, llama-perplexity's formulas: a model's PPL over
//! scored windows, and a candidate paired with its reference on identical
//! tokens (ΔNLL per window with its intervals; the token-level ratios and
//! correlation). Pure: no I/O.

use crate::measure::{
    block_bootstrap95, covariance, mean_and_uncertainty, t_interval95, WindowNll,
};
use std::collections::BTreeMap;

/// Metrics of a perplexity case, with llama-perplexity's formulas: PPL =
/// exp(mean NLL) over all scored tokens; `ppl_se` is its printed ± (token
/// standard error, tokens treated as independent).
pub fn perplexity_metrics(windows: &[WindowNll]) -> BTreeMap<String, f64> {
    let count: usize = windows.iter().map(|w| w.count).sum();
    let nll: f64 = windows.iter().map(|w| w.nll_sum).sum();
    let nll2: f64 = windows.iter().map(|w| w.nll_sq_sum).sum();
    let n = count as f64;
    let mean = if count > 0 { nll / n } else { f64::NAN };
    let ppl = mean.exp();
    let var = nll2 / n - mean * mean;
    let se = if count > 1 && var > 0.0 {
        (var / (n - 1.0)).sqrt() * ppl
    } else {
        f64::NAN
    };
    BTreeMap::from([
        ("nll_mean".to_string(), mean),
        ("ppl".to_string(), ppl),
        ("ppl_se".to_string(), se),
        ("tokens_scored".to_string(), n),
        (
            "top1_matches".to_string(),
            windows.iter().map(|w| w.top1).sum::<usize>() as f64,
        ),
        ("windows".to_string(), windows.len() as f64),
    ])
}

/// Candidate vs reference on identical tokens: per-window paired ΔNLL with a
/// Student-t and a block-bootstrap interval, and llama-perplexity's
/// token-level figures (`Mean ln(PPL(Q)/PPL(base))` ±, `PPL(Q)/PPL(base)` ±,
/// `Cor(ln(PPL(Q)), ln(PPL(base)))`) from the per-token NLLs.
pub fn paired_metrics(
    cand: &[WindowNll],
    reference: &[WindowNll],
    cand_nll: &[f64],
    ref_nll: &[f64],
    boot: (usize, usize, u64),
) -> BTreeMap<String, f64> {
    assert_eq!(cand.len(), reference.len(), "paired windows");
    assert_eq!(cand_nll.len(), ref_nll.len(), "paired tokens");
    let d: Vec<f64> = cand
        .iter()
        .zip(reference)
        .map(|(c, r)| c.nll_sum / c.count as f64 - r.nll_sum / r.count as f64)
        .collect();
    let (mean, lo, hi) = t_interval95(&d);
    let (blo, bhi) = block_bootstrap95(&d, boot.0, boot.1, boot.2);
    let n = cand_nll.len();
    let (s, s2) = (
        cand_nll.iter().sum::<f64>(),
        cand_nll.iter().map(|x| x * x).sum::<f64>(),
    );
    let (sb, sb2) = (
        ref_nll.iter().sum::<f64>(),
        ref_nll.iter().map(|x| x * x).sum::<f64>(),
    );
    let sab: f64 = cand_nll.iter().zip(ref_nll).map(|(a, b)| a * b).sum();
    let (f, sf) = mean_and_uncertainty(s, s2, n);
    let (fb, sfb) = mean_and_uncertainty(sb, sb2, n);
    let cov = covariance(s, sb, sab, n);
    let ln_ratio = f - fb;
    let ln_ratio_se = (sf * sf + sfb * sfb - 2.0 * cov).sqrt();
    let ref_base = perplexity_metrics(reference);
    let mut m = BTreeMap::from([
        ("delta_nll_mean".to_string(), mean),
        ("delta_nll_ci95_lo".to_string(), lo),
        ("delta_nll_ci95_hi".to_string(), hi),
        (
            "windows_better".to_string(),
            d.iter().filter(|x| **x < 0.0).count() as f64,
        ),
        ("ppl_ref".to_string(), ref_base["ppl"]),
        ("nll_mean_ref".to_string(), ref_base["nll_mean"]),
        ("top1_matches_ref".to_string(), ref_base["top1_matches"]),
        ("ln_ppl_ratio".to_string(), ln_ratio),
        ("ln_ppl_ratio_se".to_string(), ln_ratio_se),
        ("ppl_ratio".to_string(), ln_ratio.exp()),
        ("ppl_ratio_se".to_string(), ln_ratio.exp() * ln_ratio_se),
        ("nll_token_corr".to_string(), cov / (sf * sfb)),
    ]);
    // Undefined below 4 windows: absent (a gate on it fails as missing),
    // rather than a NaN that no golden could ever equal.
    if !blo.is_nan() {
        m.insert("delta_nll_boot95_lo".to_string(), blo);
        m.insert("delta_nll_boot95_hi".to_string(), bhi);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perplexity_metrics_follow_llama_perplexity() {
        let mut a = WindowNll::default();
        for v in [1.0, 2.0, 3.0] {
            a.add(v, false);
        }
        let mut b = WindowNll::default();
        b.add(4.0, true);
        let m = perplexity_metrics(&[a, b]);
        assert_eq!(m["nll_mean"], 2.5);
        assert_eq!(m["tokens_scored"], 4.0);
        assert!((m["ppl"] - 2.5f64.exp()).abs() < 1e-12);
        // sqrt((mean(x²) − mean²)/(n−1)) · ppl = sqrt((7.5 − 6.25)/3) · ppl
        assert!((m["ppl_se"] - (1.25f64 / 3.0).sqrt() * 2.5f64.exp()).abs() < 1e-12);
        assert!(perplexity_metrics(&[])["ppl"].is_nan());
    }
}
