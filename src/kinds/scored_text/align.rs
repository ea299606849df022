//! Like with like across a ladder: a sequential case stops each model at
//! its own window, so each row's PPL would be over other windows (a quant
//! that stopped early on easy windows looks better than one that went on).
//! [`same_windows`] gives every row of a case its PPL (and the reference's)
//! over the windows every row decoded; the gate's verdict and its ΔNLL stay
//! each row's own.

use crate::core::Outcome;
use crate::measure::perplexity::perplexity_metrics;
use crate::measure::WindowNll;
use std::collections::{BTreeMap, BTreeSet};

/// The per-window series a paired outcome carries (`suffix` `""`: the
/// candidate's, `_ref`: its reference's), in window order (a sequential
/// case's windows used sorted, as [`super::in_window_order`] keeps its
/// scores; `window_order` says the order they were visited in): NLL sum,
/// NLL² sum and scored tokens of each window.
pub(crate) fn window_series(windows: &[WindowNll], suffix: &str) -> BTreeMap<String, Vec<f64>> {
    let of = |f: &dyn Fn(&WindowNll) -> f64| windows.iter().map(f).collect::<Vec<f64>>();
    BTreeMap::from([
        (format!("window_nll_sum{suffix}"), of(&|w| w.nll_sum)),
        (format!("window_nll_sq_sum{suffix}"), of(&|w| w.nll_sq_sum)),
        (format!("window_tokens{suffix}"), of(&|w| w.count as f64)),
    ])
}

/// An outcome's windows by window index, from its series: the indices
/// (the windows a sequential case visited, `window_order`, sorted, since
/// its series are in window order; else 0, 1, …) with each one's NLL sums
/// and tokens (`suffix` as [`window_series`]). None when the series are
/// missing or disagree in length, or a window repeats.
fn windows_of(o: &Outcome, suffix: &str) -> Option<BTreeMap<usize, WindowNll>> {
    let get = |k: &str| o.series.get(&format!("{k}{suffix}"));
    let (sum, sq, tokens) = (
        get("window_nll_sum")?,
        get("window_nll_sq_sum")?,
        get("window_tokens")?,
    );
    let n = sum.len();
    if sq.len() != n || tokens.len() != n {
        return None;
    }
    let ids: Vec<usize> = match o.series.get("window_order") {
        Some(order) if order.len() == n => {
            let mut ids: Vec<usize> = order.iter().map(|w| *w as usize).collect();
            ids.sort_unstable();
            ids
        }
        Some(_) => return None,
        None => (0..n).collect(),
    };
    let mut by_id = BTreeMap::new();
    for (i, id) in ids.into_iter().enumerate() {
        let w = WindowNll {
            nll_sum: sum[i],
            nll_sq_sum: sq[i],
            count: tokens[i] as usize,
            top1: 0,
        };
        if by_id.insert(id, w).is_some() {
            return None;
        }
    }
    Some(by_id)
}

/// Every outcome of one case (a view's rows) given its PPL, PPL's ± and
/// the reference's PPL over the windows every row decoded, when the rows
/// decoded different windows (a sequential case): `ppl_windows` says how
/// many. A row whose series cannot say (an outcome of an older build)
/// shows no PPL rather than one over other windows. None when every row
/// decoded the same windows (nothing changed); else the sentence the
/// view says it with.
pub(crate) fn same_windows(outcomes: &mut [Outcome]) -> Option<String> {
    let sets: Vec<Option<BTreeMap<usize, WindowNll>>> =
        outcomes.iter().map(|o| windows_of(o, "")).collect();
    let ids: Vec<BTreeSet<usize>> = sets
        .iter()
        .flatten()
        .map(|s| s.keys().copied().collect())
        .collect();
    let mixed = ids.windows(2).any(|w| w[0] != w[1])
        || (sets.iter().any(Option::is_none)
            && outcomes
                .iter()
                .any(|o| o.metrics.contains_key("windows_total")));
    if !mixed {
        return None;
    }
    let common: BTreeSet<usize> = ids
        .iter()
        .skip(1)
        .fold(ids.first().cloned().unwrap_or_default(), |a, b| {
            a.intersection(b).copied().collect()
        });
    let case = outcomes.first().map(|o| o.case.clone()).unwrap_or_default();
    let total = outcomes
        .iter()
        .filter_map(|o| o.metrics.get("windows_total"))
        .fold(0.0f64, |a, b| a.max(*b));
    for (o, set) in outcomes.iter_mut().zip(&sets) {
        for k in ["ppl", "ppl_se", "ppl_ref"] {
            o.metrics.remove(k);
        }
        let Some(set) = set else { continue };
        if common.is_empty() {
            continue;
        }
        let pick = |s: &BTreeMap<usize, WindowNll>| -> Vec<WindowNll> {
            common.iter().filter_map(|w| s.get(w).cloned()).collect()
        };
        let m = perplexity_metrics(&pick(set));
        o.metrics.insert("ppl".into(), m["ppl"]);
        o.metrics.insert("ppl_se".into(), m["ppl_se"]);
        o.metrics.insert("ppl_windows".into(), common.len() as f64);
        if let Some(r) = windows_of(o, "_ref") {
            let picked = pick(&r);
            if picked.len() == common.len() {
                o.metrics
                    .insert("ppl_ref".into(), perplexity_metrics(&picked)["ppl"]);
            }
        }
    }
    Some(format!(
        "{case}: each row stopped at its own window (sequential); PPL ± se is over the {} \
         windows every row decoded{}, so the rows compare like with like. ΔNLL, its interval \
         and the gate are each row's own (windows used).",
        common.len(),
        if total > 0.0 {
            format!(" (of {total})")
        } else {
            String::new()
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(nll: &[f64]) -> Vec<WindowNll> {
        nll.iter()
            .map(|&x| WindowNll {
                nll_sum: x * 4.0,
                nll_sq_sum: x * x * 4.0 + 1.0,
                count: 4,
                top1: 0,
            })
            .collect()
    }

    /// `nll` and `nll_ref` in visiting order (`order`), kept as a
    /// sequential case keeps them: in window order.
    fn outcome(model: &str, order: Option<&[usize]>, nll: &[f64], nll_ref: &[f64]) -> Outcome {
        let build = crate::engine::Engine::build(&crate::engine::fake::FakeEngine::new());
        let mut o = Outcome::new("ppl/s", model, build);
        let sorted = |x: &[f64]| -> Vec<f64> {
            let Some(order) = order else {
                return x.to_vec();
            };
            let mut by: Vec<(usize, f64)> = order.iter().copied().zip(x.iter().copied()).collect();
            by.sort_by_key(|p| p.0);
            by.into_iter().map(|p| p.1).collect()
        };
        let (nll, nll_ref) = (&sorted(nll)[..], &sorted(nll_ref)[..]);
        let w = windows(nll);
        o.metrics = perplexity_metrics(&w);
        o.metrics.insert("windows_total".into(), 6.0);
        o.series.extend(window_series(&w, ""));
        o.series.extend(window_series(&windows(nll_ref), "_ref"));
        if let Some(order) = order {
            o.series.insert(
                "window_order".into(),
                order.iter().map(|&w| w as f64).collect(),
            );
        }
        o
    }

    /// Two models stopped at different windows of one visiting order:
    /// both rows show PPL over the windows both decoded, computed from
    /// those windows alone (and the reference's too).
    #[test]
    fn rows_that_stopped_apart_show_ppl_on_the_same_windows() {
        // Visit order 3, 0, 5, 1, 4, 2; `a` stopped after 2 windows, `b` after 5.
        let order = [3, 0, 5, 1, 4, 2];
        let nll_a = [2.0, 3.0];
        let nll_b = [2.5, 3.5, 1.0, 1.0, 1.0];
        let r = [2.2, 3.1, 9.0, 9.0, 9.0];
        let mut os = vec![
            outcome("a", Some(&order[..2]), &nll_a, &r[..2]),
            outcome("b", Some(&order[..5]), &nll_b, &r),
        ];
        assert!(
            os[1].metrics["ppl"] < os[0].metrics["ppl"],
            "b looks better"
        );
        let note = same_windows(&mut os).unwrap();
        assert!(
            note.contains("over the 2 windows") && note.contains("(of 6)"),
            "{note}"
        );
        // By hand: the mean NLL over windows 3 and 0 of each.
        let ppl = |x: &[f64]| (x.iter().sum::<f64>() / x.len() as f64).exp();
        assert!((os[0].metrics["ppl"] - ppl(&[2.0, 3.0])).abs() < 1e-12);
        assert!((os[1].metrics["ppl"] - ppl(&[2.5, 3.5])).abs() < 1e-12);
        assert!((os[1].metrics["ppl_ref"] - ppl(&[2.2, 3.1])).abs() < 1e-12);
        assert_eq!(os[0].metrics["ppl_ref"], os[1].metrics["ppl_ref"]);
        assert!(
            os[1].metrics["ppl"] > os[0].metrics["ppl"],
            "on the same windows, b is worse"
        );
        assert_eq!(os[1].metrics["ppl_windows"], 2.0);
        // Its ± is llama-perplexity's over those windows' tokens.
        let m = perplexity_metrics(&windows(&[2.5, 3.5]));
        assert_eq!(os[1].metrics["ppl_se"], m["ppl_se"]);
    }

    /// Rows over the same windows are left as measured; a row that cannot
    /// say which windows it decoded shows no PPL when the others differ.
    #[test]
    fn same_windows_are_left_alone_and_an_unknown_row_shows_none() {
        let mut same = vec![
            outcome("a", None, &[2.0, 3.0], &[2.0, 3.0]),
            outcome("b", None, &[2.5, 3.5], &[2.0, 3.0]),
        ];
        let before = same.clone();
        assert!(same_windows(&mut same).is_none());
        assert_eq!(same[0].metrics, before[0].metrics);
        let mut old = outcome("c", Some(&[3, 0, 5]), &[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0]);
        old.series.clear();
        let mut os = vec![outcome("a", Some(&[3, 0]), &[2.0, 3.0], &[2.0, 3.0]), old];
        assert!(same_windows(&mut os).is_some());
        assert!(!os[1].metrics.contains_key("ppl"));
        assert!(os[0].metrics.contains_key("ppl"));
    }
}
