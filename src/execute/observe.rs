//! Observations: what the engine decodes for a trial — one model file, its
//! settings, its teacher-forced windows — decoded once for every consumer
//! that needs it: the trials of several cases on that model, and the
//! reference products other trials take from it (DESIGN.md: plan by
//! observation).
//!
//! Contract: an observation's key is everything that determines its rows
//! (the model file's sha256, the settings line, every window's tokens and
//! first logit row); consumers of one decode see bitwise the rows each would
//! have seen alone, in order, each row reduced once (max, argmax,
//! log-sum-exp, and the `exp(l − max)` terms when a consumer reads them).
//! A consumer that fails stops receiving rows and keeps its error while the
//! others go on; an engine failure is every consumer's. Nothing holds more
//! than one row.

use crate::core::error::{Error, Result};
use crate::core::fsutil::hex;
use crate::core::Settings;
use crate::engine::{LoadedModel, Window};
use crate::measure::{row_stats, row_stats_exps, RowStats};
use sha2::{Digest, Sha256};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one decode produces: a model's rows over teacher-forced windows.
#[derive(Clone)]
pub struct Observation {
    /// The loaded model.
    pub model: Arc<dyn LoadedModel>,
    /// Engine settings of every pass.
    pub settings: Settings,
    /// The windows, in order.
    pub windows: Arc<Vec<Window>>,
    key: String,
}

impl Observation {
    /// An observation of `windows` on `model` under `settings`.
    pub(crate) fn new(
        model: Arc<dyn LoadedModel>,
        settings: Settings,
        windows: Vec<Window>,
    ) -> Self {
        let mut h = Sha256::new();
        h.update(model.info().file.sha256.as_bytes());
        h.update(settings.describe().as_bytes());
        for w in &windows {
            h.update((w.logits_from as u64).to_le_bytes());
            h.update((w.tokens.len() as u64).to_le_bytes());
            for t in &w.tokens {
                h.update(t.to_le_bytes());
            }
        }
        Observation {
            model,
            settings,
            windows: Arc::new(windows),
            key: hex(&h.finalize()),
        }
    }

    /// The content address: equal keys, bitwise equal rows.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The alias of the model it was made on (messages).
    pub(crate) fn alias(&self) -> &str {
        &self.model.info().file.alias
    }
}

impl std::fmt::Debug for Observation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Observation({} on `{}`, {} windows, {})",
            &self.key[..12],
            self.alias(),
            self.windows.len(),
            self.settings.describe()
        )
    }
}

/// One row of an observation, as every consumer sees it.
pub struct Row<'a> {
    /// Window index.
    pub window: usize,
    /// Position in the window (the row predicts the token at `pos + 1`).
    pub pos: usize,
    /// The logits.
    pub logits: &'a [f32],
    /// Their max, argmax and log-sum-exp.
    pub stats: &'a RowStats,
    /// `exp(l − max)` for every entry, in [`Consumer::map`] when a consumer
    /// asked for them ([`Consumer::wants_exps`]); empty otherwise.
    pub exps: &'a [f64],
}

/// What a consumer's [`Consumer::map`] hands to its [`Consumer::absorb`].
pub(crate) type Mapped = Option<Box<dyn std::any::Any + Send>>;

/// Something that reads an observation's rows as they stream past. A row's
/// work comes in two parts: [`Consumer::map`], the stateless part, runs on
/// any of the engine's threads while they would otherwise wait (rows of a
/// pass in any order, as llama-perplexity reduces a chunk's rows); then
/// [`Consumer::absorb`] takes the rows in order.
pub trait Consumer: Send + Sync {
    /// Whether [`Consumer::map`] reads [`Row::exps`].
    fn wants_exps(&self) -> bool {
        false
    }
    /// The stateless part of a row's work.
    fn map(&self, _row: &Row<'_>) -> Result<Mapped> {
        Ok(None)
    }
    /// A row and what `map` made of it, in order; an error stops this
    /// consumer (only). `row.exps` is empty here.
    fn absorb(&mut self, row: &Row<'_>, mapped: Mapped) -> Result<()>;
    /// The decode of the observation's windows `windows` starts (all of
    /// them at once, or a range at a time in [`observe_lockstep`]).
    fn begin(&mut self, _windows: &Range<usize>) {}
}

/// What one shared decode cost, and how each consumer ended.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    /// Time in the engine.
    pub decode: Duration,
    /// Wall time reducing each row once (stats, exps) and mapping it, on
    /// the engine's threads.
    pub reduce: Duration,
    /// Time in each consumer's `absorb`.
    pub consumer: Vec<Duration>,
    /// Each consumer's error, if it failed.
    pub errors: Vec<Option<Error>>,
}

/// A pass's rows reduced and mapped: per row its stats and, per live
/// consumer, what its `map` gave.
type Reduced = Vec<(RowStats, Vec<Result<Mapped>>)>;

/// Reduce and map the rows of one pass on `threads` threads.
fn reduce_pass(
    w: usize,
    rows: &[(usize, &[f32])],
    consumers: &[&dyn Consumer],
    want_exps: bool,
    threads: usize,
) -> Reduced {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        let mut exps: Vec<f64> = Vec::new();
        let mut done = Vec::new();
        loop {
            let r = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&(pos, logits)) = rows.get(r) else {
                break;
            };
            let stats = if want_exps {
                row_stats_exps(logits, &mut exps)
            } else {
                row_stats(logits)
            };
            let row = Row {
                window: w,
                pos,
                logits,
                stats: &stats,
                exps: if want_exps { &exps } else { &[] },
            };
            let mapped = consumers.iter().map(|c| c.map(&row)).collect();
            done.push((r, stats, mapped));
        }
        done
    };
    let threads = threads.clamp(1, rows.len().max(1));
    let mut all: Vec<(usize, RowStats, Vec<Result<Mapped>>)> = if threads == 1 {
        work()
    } else {
        std::thread::scope(|s| {
            let others: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
            let mut all = work();
            for h in others {
                all.extend(h.join().expect("a row worker panicked"));
            }
            all
        })
    };
    all.sort_by_key(|(r, _, _)| *r);
    all.into_iter().map(|(_, st, m)| (st, m)).collect()
}

/// Decode `obs` once, handing every row to every consumer. An engine
/// failure is returned as the error of every consumer.
pub(crate) fn observe(obs: &Observation, consumers: &mut [&mut dyn Consumer]) -> Observed {
    observe_range(obs, 0..obs.windows.len(), consumers)
}

impl Observed {
    /// Add what a later decode of more windows cost, and its errors (a
    /// consumer that failed there keeps its error).
    fn add(&mut self, later: Observed, consumers: &[usize]) {
        self.decode += later.decode;
        self.reduce += later.reduce;
        for (k, &i) in consumers.iter().enumerate() {
            self.consumer[i] += later.consumer[k];
            if self.errors[i].is_none() {
                self.errors[i] = later.errors[k].clone();
            }
        }
    }
}

/// Something that provides rows of windows a range at a time without a
/// decode (a stored reference read as it goes), in step with
/// [`observe_lockstep`]'s observations.
pub trait Fill: Send {
    /// How many windows it has.
    fn windows(&self) -> usize;
    /// Provide windows `windows` (the next ones, in order).
    fn fill(&mut self, windows: &Range<usize>) -> Result<()>;
}

/// Decode several observations in step, `step` windows at a time: windows
/// `0..step` of every filler (in order) and observation (in order), then
/// the next `step` of each, and so on, each consumer seeing its
/// observation's rows in order as [`observe`] hands them (a consumer that
/// failed is not fed again, nor a filler that failed). A consumer of a
/// later observation may so read what a filler or a consumer of an earlier
/// one made of the same windows (a reference's rows), and nothing need
/// hold more than `step` windows of them. One [`Observed`] per
/// observation, as if each had been decoded whole, and per filler its
/// error and the time it took.
pub(crate) fn observe_lockstep(
    fillers: &mut [&mut dyn Fill],
    jobs: &mut [(&Observation, Vec<&mut dyn Consumer>)],
    step: usize,
) -> (Vec<(Option<Error>, Duration)>, Vec<Observed>) {
    let step = step.max(1);
    let mut seen: Vec<Observed> = jobs
        .iter()
        .map(|(_, cs)| Observed {
            consumer: vec![Duration::ZERO; cs.len()],
            errors: vec![None; cs.len()],
            ..Observed::default()
        })
        .collect();
    let mut failed: Vec<(Option<Error>, Duration)> = vec![(None, Duration::ZERO); fillers.len()];
    let most = jobs
        .iter()
        .map(|(o, _)| o.windows.len())
        .chain(fillers.iter().map(|f| f.windows()))
        .max()
        .unwrap_or(0);
    for lo in (0..most).step_by(step) {
        for (f, e) in fillers.iter_mut().zip(failed.iter_mut()) {
            let hi = (lo + step).min(f.windows());
            if e.0.is_none() && lo < hi {
                let t = Instant::now();
                e.0 = f.fill(&(lo..hi)).err();
                e.1 += t.elapsed();
            }
        }
        for ((obs, consumers), done) in jobs.iter_mut().zip(seen.iter_mut()) {
            let hi = (lo + step).min(obs.windows.len());
            let live: Vec<usize> = (0..consumers.len())
                .filter(|&i| done.errors[i].is_none())
                .collect();
            if lo >= hi || live.is_empty() {
                continue;
            }
            let mut feed: Vec<&mut dyn Consumer> = Vec::with_capacity(live.len());
            for (i, c) in consumers.iter_mut().enumerate() {
                if live.contains(&i) {
                    feed.push(&mut **c);
                }
            }
            let part = observe_range(obs, lo..hi, &mut feed);
            done.add(part, &live);
        }
    }
    (failed, seen)
}

/// Decode windows `range` of `obs`, handing every row (numbered as in the
/// whole observation) to every consumer. An engine failure is returned as
/// the error of every consumer.
fn observe_range(
    obs: &Observation,
    range: Range<usize>,
    consumers: &mut [&mut dyn Consumer],
) -> Observed {
    let n = consumers.len();
    for c in consumers.iter_mut() {
        c.begin(&range);
    }
    let first = range.start;
    let mut done = Observed {
        consumer: vec![Duration::ZERO; n],
        errors: vec![None; n],
        ..Observed::default()
    };
    let threads = obs.settings.threads.max(1) as usize;
    let mut reduce = Duration::ZERO;
    let bar = crate::core::progress::bar(
        obs.windows.len() as u64,
        &format!("decode {}", obs.model.info().file.alias),
        "windows",
    );
    let engine = {
        let done = &mut done;
        let bar = &bar;
        obs.model
            .score_passes(&obs.settings, &obs.windows[range], &mut |w, rows| {
                let w = first + w;
                bar.set_position(w as u64 + 1);
                let live: Vec<usize> = (0..n).filter(|&i| done.errors[i].is_none()).collect();
                if live.is_empty() {
                    // Nobody is listening any more: stop decoding.
                    return Err(Error::harness("every consumer of the decode failed"));
                }
                let t = Instant::now();
                let want_exps = live.iter().any(|&i| consumers[i].wants_exps());
                let reduced = {
                    let shared: Vec<&dyn Consumer> = live
                        .iter()
                        .map(|&i| &*consumers[i] as &dyn Consumer)
                        .collect();
                    reduce_pass(w, rows, &shared, want_exps, threads)
                };
                reduce += t.elapsed();
                for (&(pos, logits), (stats, mapped)) in rows.iter().zip(reduced) {
                    let row = Row {
                        window: w,
                        pos,
                        logits,
                        stats: &stats,
                        exps: &[],
                    };
                    for (&i, m) in live.iter().zip(mapped) {
                        if done.errors[i].is_some() {
                            continue;
                        }
                        let t = Instant::now();
                        let r = m.and_then(|m| consumers[i].absorb(&row, m));
                        if let Err(e) = r {
                            done.errors[i] = Some(e);
                        }
                        done.consumer[i] += t.elapsed();
                    }
                }
                Ok(())
            })
    };
    bar.finish_and_clear();
    done.reduce = reduce;
    match engine {
        Ok(t) => done.decode = t.decode,
        Err(e) => {
            for slot in done.errors.iter_mut() {
                if slot.is_none() {
                    *slot = Some(e.clone());
                }
            }
        }
    }
    done
}

/// Decode `obs` for one consumer; its error or the engine's.
pub(crate) fn observe_one(obs: &Observation, consumer: &mut dyn Consumer) -> Result<Observed> {
    let mut done = observe(obs, &mut [consumer]);
    match done.errors[0].take() {
        Some(e) => Err(e),
        None => Ok(done),
    }
}

/// The value a consumer's [`Consumer::map`] made, by type.
pub(crate) fn mapped<T: 'static>(m: Mapped) -> Option<T> {
    m.and_then(|b| b.downcast::<T>().ok()).map(|b| *b)
}
