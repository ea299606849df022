//! Sequential decisions of a scored text's gates (`[decide] sequential =
//! true`): the windows visited in the design's seeded order, the candidate
//! and its reference decoded one window at a time, each gated mean's
//! confidence sequence ([`crate::measure::sequential`]) updated after every
//! window, and the run stopped once every gate is decided.
//!
//! Contract: the same inputs and seed give the same order, the same stop
//! and the same numbers. The reference is decoded only for windows some
//! candidate still needs, each window once: kept in the reference store
//! window by window, so a later run (a quant added next month) reads the
//! windows decoded so far and decodes only the rest; a stored full
//! reference serves any prefix, and the whole is kept once every window
//! is. A candidate's windows are kept the same way. Each window is named by
//! the model file, settings, build and the window's own tokens
//! ([`super::kept`]), not by the case: the same model on the same window
//! is decoded once whichever case, run, process or executable asks again
//! (a kld case's decode keeps its windows too), and once between runs that
//! ask at the same moment (a window's decode holds
//! a lock of its own; the run that waited reads what the other kept). A
//! value outside its declared bounds is never clipped: the case then runs
//! to N and says why. At N the verdict is the fixed-N verdict: both bounds
//! are the exact mean.

use super::kept::{window_id, KeptWindow};
use super::*;
use crate::core::case::Decide;
use crate::execute::windows::score_plan;
use crate::measure::sequential::{decided, permutation, MeanSequence};

/// Window `w`'s part of scores over a whole plan.
pub fn window_of(scored: &Scored, plan: &ScoringPlan, w: usize) -> Scored {
    let from: usize = plan.windows[..w].iter().map(|p| p.targets.len()).sum();
    let to = from + plan.windows[w].targets.len();
    Scored {
        windows: vec![scored.windows[w]],
        token_nll: scored.token_nll[from..to].to_vec(),
        token_top1: scored.token_top1[from..to].to_vec(),
        token_argmax: scored.token_argmax[from..to].to_vec(),
        ..Scored::default()
    }
}

/// The mean NLL of a one-window score.
fn mean_nll(s: &Scored) -> f64 {
    s.windows[0].nll_sum / s.windows[0].count as f64
}

/// Scores of several windows, one after the other, as one [`Scored`].
fn concat(parts: &[Arc<Scored>]) -> Scored {
    let mut all = Scored::default();
    for p in parts {
        all.append(p);
    }
    all
}

/// One side of a sequential run (the reference, or a candidate), window by
/// window.
pub enum ModelWindows {
    /// Every window at hand (stored whole scores, a reference record).
    Full(Arc<Scored>),
    /// A model decoded window by window when first needed.
    Lazy(Box<LazyWindows>),
}

/// A model decoded window by window, each window kept in the store.
pub struct LazyWindows {
    /// What names each of its kept windows (model file, settings, build:
    /// [`super::kept::window_id`]), whatever plan asks for them.
    pub prefix: String,
    /// The model.
    pub model: Arc<dyn LoadedModel>,
    /// Its plan (a reference's: identical tokens to the candidate's).
    pub plan: Arc<ScoringPlan>,
    /// What keeps the whole in the store once every window is decoded.
    pub keep: std::sync::Mutex<Option<ScoresBuild>>,
}

/// Windows decoded in one call: the engine's two CPU lanes decode two at
/// once (`engine::llama`), so a sequential run visits its windows in pairs;
/// a stop at the first of a pair leaves the second decoded and unused.
pub const STEP: usize = 2;

/// `model`'s scores of windows `ws` of `plan`, one per window, in one call.
fn score_windows(
    cx: &RunContext,
    model: &Arc<dyn LoadedModel>,
    plan: &ScoringPlan,
    ws: &[usize],
    n_batch: u32,
) -> Result<Vec<Arc<Scored>>> {
    let sub = plan.part(ws);
    let s = score_plan(model.clone(), &sub, n_batch, cx.threads, cx.options())?;
    Ok((0..ws.len())
        .map(|k| Arc::new(window_of(&s, &sub, k)))
        .collect())
}

impl ModelWindows {
    /// The model's scores of windows `ws` of `plan`: from this process
    /// or the store (each window a sealed product named by the model and
    /// the window), those neither holds decoded in one call and kept.
    fn windows(
        &self,
        cx: &RunContext,
        n_batch: u32,
        plan: &ScoringPlan,
        ws: &[usize],
    ) -> Result<Vec<Arc<Scored>>> {
        let (prefix, model, rplan, keep) = match self {
            ModelWindows::Full(s) => {
                return Ok(ws
                    .iter()
                    .map(|&w| Arc::new(window_of(s, plan, w)))
                    .collect())
            }
            ModelWindows::Lazy(r) => (&r.prefix, &r.model, &r.plan, &r.keep),
        };
        let wid = |w: usize| window_id(prefix, &rplan.windows[w]);
        let stored = |w: usize| {
            cx.references
                .kept_only::<KeptWindow>(&wid(w), "qgwin")
                .and_then(|k| k.scored(rplan.windows[w].targets.len()))
        };
        let mut got: Vec<Option<Scored>> = ws.iter().map(|&w| stored(w)).collect();
        let missing = |got: &[Option<Scored>]| -> Vec<usize> {
            let mut m: Vec<usize> = ws
                .iter()
                .zip(got)
                .filter(|(_, g)| g.is_none())
                .map(|(w, _)| *w)
                .collect();
            m.sort_unstable();
            m
        };
        let asked = missing(&got);
        if !asked.is_empty() {
            // Each window decoded once, whoever asks at the same time: its
            // decode lock is held (taken in window order, so two askers
            // never each hold one the other waits for) while it is decoded
            // and kept, and a process that waited reads what the other
            // kept. Not the kept product's own lock (`kept` takes that one
            // to write).
            let decoding = asked
                .iter()
                .map(|w| cx.references.lock(&format!("{}#decoding", wid(*w))))
                .collect::<Result<Vec<_>>>()?;
            for (g, &w) in got.iter_mut().zip(ws) {
                if g.is_none() {
                    *g = stored(w);
                }
            }
            let todo = missing(&got);
            if !todo.is_empty() {
                let fresh = score_windows(cx, model, rplan, &todo, n_batch)?;
                for (w, s) in todo.iter().zip(fresh) {
                    cx.references
                        .kept(&wid(*w), "qgwin", &KeptWindow::finite, &|| {
                            Ok(KeptWindow::of(&s))
                        })?;
                    let at = ws.iter().position(|v| v == w).expect("asked for");
                    got[at] = Some(Arc::unwrap_or_clone(s));
                }
            }
            drop(decoding);
            // Every window decoded (here or by earlier runs): the whole,
            // kept as a full run would keep it (looked for only until it
            // is kept).
            let mut keep = keep.lock().unwrap_or_else(|p| p.into_inner());
            if keep.is_some() {
                let all: Option<Vec<Arc<Scored>>> = (0..rplan.windows.len())
                    .map(|v| stored(v).map(Arc::new))
                    .collect();
                if let Some(all) = all {
                    let b = keep.take().expect("checked above");
                    b.store_scored(cx, concat(&all))?;
                }
            }
        }
        Ok(got
            .into_iter()
            .map(|g| Arc::new(g.expect("decoded or kept")))
            .collect())
    }
}

/// One gated metric's sequence and the gates on it.
struct Tracked {
    metric: String,
    seq: MeanSequence,
    /// Running intersection of the bounds (once decided, a gate stays so).
    bounds: (f64, f64),
    /// The thresholds to decide on it.
    gates: Vec<Threshold>,
}

/// A threshold a sequential run decides: a gate's, or a sealed rule's.
struct Threshold {
    /// The gate's index (None: a preregistered rule's threshold).
    gate: Option<usize>,
    /// The gate's `max` (a rule's threshold is one).
    max: Option<f64>,
    /// The gate's `min`.
    min: Option<f64>,
    /// Once decided: whether it passed (a rule's: whether the mean is
    /// below), at which window.
    decided: Option<(bool, usize)>,
}

/// The per-window values of one visited window: each tracked metric's.
pub type WindowValues = std::collections::BTreeMap<&'static str, f64>;

/// A sequential design needs windows of equal size: the mean over windows
/// is then the mean over positions, the fixed-N metric.
pub fn equal_windows(decide: &Decide, plan: &ScoringPlan) -> Result<()> {
    let counts: Vec<usize> = plan.windows.iter().map(|w| w.targets.len()).collect();
    if counts.iter().any(|c| *c != counts[0]) {
        return Err(Error::input(format!(
            "{}: a sequential design needs windows of equal size (the mean over windows \
             is then the mean over tokens); these score {}..{} tokens",
            decide.at,
            counts.iter().min().unwrap_or(&0),
            counts.iter().max().unwrap_or(&0)
        )));
    }
    Ok(())
}

/// Visit `n` windows (or tasks) in the design's seeded order, [`STEP`] at a
/// time through `visit` (which decodes them and returns each one's values),
/// until every gate and sealed threshold of `case` is decided; the windows
/// used, in visiting order. `out` gets `windows_total`, each gated metric's
/// sequence bounds at the stop (`<metric>_seq_lo/hi`; the exact mean at N),
/// the `window_order` series and the `decided` text. `unit` names what is
/// visited ("window", "task").
pub fn run_sequence(
    case: &Case,
    decide: &Decide,
    n: usize,
    unit: &str,
    visit: &mut dyn FnMut(&[usize]) -> Result<Vec<WindowValues>>,
    out: &mut Outcome,
) -> Result<Vec<usize>> {
    let mut tracked: Vec<Tracked> = Vec::new();
    // The sequence of metric `m` (started on first use); None when the
    // design declares no bounds for it.
    let of = |tracked: &mut Vec<Tracked>, m: &str| -> Option<usize> {
        let &b = decide.bounds.get(m)?;
        Some(match tracked.iter().position(|t| t.metric == m) {
            Some(k) => k,
            None => {
                tracked.push(Tracked {
                    metric: m.to_string(),
                    seq: MeanSequence::new(n, b, decide.alpha),
                    bounds: b,
                    gates: Vec::new(),
                });
                tracked.len() - 1
            }
        })
    };
    // The gates of this model (`[[gate]] models`), numbered as the case
    // numbers them; a warn gate is decided as a fail gate is.
    for (i, g) in case
        .gates
        .iter()
        .enumerate()
        .filter(|(_, g)| g.applies_to(&out.model))
    {
        let Some(k) = of(&mut tracked, &g.metric) else {
            continue;
        };
        tracked[k].gates.push(Threshold {
            gate: Some(i),
            max: g.max,
            min: g.min,
            decided: None,
        });
    }
    // A sealed rule's thresholds: decided like a `max` gate on each.
    for (m, c) in &decide.stops {
        let Some(k) = of(&mut tracked, m) else {
            continue;
        };
        if !tracked[k]
            .gates
            .iter()
            .any(|g| g.gate.is_none() && g.max == Some(*c))
        {
            tracked[k].gates.push(Threshold {
                gate: None,
                max: Some(*c),
                min: None,
                decided: None,
            });
        }
    }
    let order = permutation(n, decide.seed);
    let mut seen: Vec<WindowValues> = Vec::new();
    let mut refused: Option<String> = None;
    'visit: for pair in order.chunks(STEP) {
        let values = visit(pair)?;
        if values.len() != pair.len() {
            return Err(Error::harness(format!(
                "a sequential visit of {} {unit}s gave {} values",
                pair.len(),
                values.len()
            )));
        }
        for (&w, v) in pair.iter().zip(values) {
            let j = seen.len();
            seen.push(v);
            if refused.is_some() {
                continue;
            }
            for t in &mut tracked {
                let Some(&value) = seen[j].get(t.metric.as_str()) else {
                    return Err(Error::harness(format!(
                        "{unit} {w} has no per-{unit} value of {}",
                        t.metric
                    )));
                };
                if let Err(e) = t.seq.push(value) {
                    refused = Some(format!(
                        "{unit} {w} (visit {}) has {} = {:+.6}, outside the declared bounds \
                         [{}, {}]: not decided sequentially; ran all {n} {unit}s",
                        j + 1,
                        t.metric,
                        e.value,
                        e.bounds.0,
                        e.bounds.1
                    ));
                    break;
                }
                let (lo, hi) = t.seq.bounds();
                t.bounds = if j + 1 == n {
                    (lo, hi)
                } else {
                    (t.bounds.0.max(lo), t.bounds.1.min(hi))
                };
                for g in &mut t.gates {
                    if g.decided.is_none() {
                        g.decided = decided(g.max, g.min, t.bounds).map(|p| (p, j + 1));
                    }
                }
            }
            let all = tracked
                .iter()
                .all(|t| t.gates.iter().all(|g| g.decided.is_some()));
            if refused.is_none() && all {
                break 'visit;
            }
        }
    }
    let used = seen.len();
    out.metrics.insert(format!("{unit}s_total"), n as f64);
    out.series.insert(
        format!("{unit}_order"),
        order[..used].iter().map(|w| *w as f64).collect(),
    );
    let mut lines = vec![format!("{}; {used} of {n} {unit}s", decide.describe())];
    for t in &tracked {
        // At N (all windows, or a value out of bounds) both bounds are
        // the exact mean of all N values, summed in window order.
        let (lo, hi) = if used == n {
            let mut by_window: Vec<(usize, f64)> = order
                .iter()
                .zip(&seen)
                .map(|(w, v)| (*w, v[t.metric.as_str()]))
                .collect();
            by_window.sort_by_key(|x| x.0);
            let mean = by_window.iter().map(|x| x.1).sum::<f64>() / n as f64;
            (mean, mean)
        } else {
            t.bounds
        };
        let [mlo, mhi] = Decide::bound_metrics(&t.metric);
        out.metrics.insert(mlo, lo);
        out.metrics.insert(mhi, hi);
        for g in &t.gates {
            let rule = match (g.gate, g.max, g.min) {
                (None, c, _) => format!(
                    "the preregistered rule's threshold {} on {}",
                    c.unwrap_or_default(),
                    t.metric
                ),
                (Some(i), Some(c), _) => format!("gate[{i}] {} <= {c}", t.metric),
                (Some(i), _, Some(c)) => format!("gate[{i}] {} >= {c}", t.metric),
                _ => t.metric.clone(),
            };
            // No float here: texts compare exactly with goldens; the
            // bounds are metrics, compared within their tolerance.
            lines.push(match g.decided {
                Some((pass, at)) if refused.is_none() && at < n => format!(
                    "{rule}: {} at {unit} {at} of {n}, its sequence's {} bound \
                     past the threshold",
                    match (g.gate.is_none(), pass) {
                        (true, true) => "below",
                        (true, false) => "above",
                        (false, true) => "pass",
                        (false, false) => "fail",
                    },
                    if pass == g.max.is_some() {
                        "upper"
                    } else {
                        "lower"
                    },
                ),
                _ => format!("{rule}: decided at N = {n} on the exact mean"),
            });
        }
    }
    if let Some(r) = &refused {
        lines.push(r.clone());
    }
    out.texts.insert("decided".into(), lines.join("\n"));
    Ok(order[..used].to_vec())
}

/// `parts` (one per visited window, `order` their windows) in window
/// order, as one [`Scored`]: at N the fixed-N case's, summed in its order.
pub fn in_window_order(order: &[usize], parts: &[Arc<Scored>]) -> Scored {
    let mut by_window: Vec<(usize, Arc<Scored>)> =
        order.iter().copied().zip(parts.iter().cloned()).collect();
    by_window.sort_by_key(|x| x.0);
    concat(&by_window.into_iter().map(|x| x.1).collect::<Vec<_>>())
}

impl ScoredText {
    /// Decide `case`'s gates on `candidate` (its windows of `plan`) window
    /// by window in the design's order against `reference`; the
    /// candidate's and the reference's scores of the windows used, in
    /// window order, with the metrics of the design (bounds at the stop,
    /// windows of N, what decided) in `out`.
    pub(crate) fn decide_sequentially(
        &self,
        cx: &RunContext,
        case: &Case,
        decide: &Decide,
        (candidate, plan): (&ModelWindows, &ScoringPlan),
        reference: &ModelWindows,
        out: &mut Outcome,
    ) -> Result<(Scored, Scored)> {
        equal_windows(decide, plan)?;
        let (mut cand, mut refs) = (Vec::new(), Vec::new());
        let t_decode = Instant::now();
        let order = run_sequence(
            case,
            decide,
            plan.windows.len(),
            "window",
            &mut |pair| {
                let rs = reference.windows(cx, self.n_batch, plan, pair)?;
                let cs = candidate.windows(cx, self.n_batch, plan, pair)?;
                let mut values = Vec::new();
                for (c, r) in cs.into_iter().zip(rs) {
                    // Only delta_nll_mean is sequential here (the parse checks).
                    values.push(WindowValues::from([(
                        "delta_nll_mean",
                        mean_nll(&c) - mean_nll(&r),
                    )]));
                    cand.push(c);
                    refs.push(r);
                }
                Ok(values)
            },
            out,
        )?;
        out.timings.decode += t_decode.elapsed();
        cand.truncate(order.len());
        refs.truncate(order.len());
        Ok((
            in_window_order(&order, &cand),
            in_window_order(&order, &refs),
        ))
    }
}
