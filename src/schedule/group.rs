//! One group of trials run: the trials on one model that the planner
//! found to share an observation, and the reference work other models'
//! trials need from it, decoded once and fed to every consumer; each trial
//! started (its prereg verified, its cached result taken), run and judged
//! ([`crate::judge`]).
//!
//! Contract: every trial of a group gets exactly one outcome; an engine or
//! input error is an `error` outcome, never numbers; a cached result is
//! used only after every pinned input is re-verified.

use crate::core::error::{Error, ErrorKind};
use crate::core::outcome::split_test_name;
use crate::core::{Case, Outcome, Status};
use crate::execute::observe::{observe, observe_lockstep, Consumer, Fill, Observation, Observed};
use crate::execute::RunContext;
use crate::judge::prereg::{LedgerLine, Prereg};
use crate::judge::{cache, decide_prereg, rejudge, undeclared_metrics, verify_prereg};
use crate::kinds::{FeedSource, Finish, LiveFeed, RefBuild, Start};
use crate::plan::Planned;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run one planned trial and judge it. `goldens` is the goldens directory
/// a preregistered rule's history is checked against.
pub fn trial(cx: &RunContext, p: &Planned, goldens: &Path) -> Outcome {
    trials(cx, &[p], &[], goldens, false)
        .0
        .pop()
        .expect("one outcome per trial")
}

/// The reference products of every planned trial, built into `cx`'s
/// reference store (`quantgate reference build`): each reference model's
/// observation decoded once for all the trials that read it, what the store
/// already holds skipped. The work done (and what failed).
pub fn build_references(cx: &RunContext, planned: &[Planned], goldens: &Path) -> GroupWork {
    let all: Vec<&Planned> = planned.iter().collect();
    trials(cx, &[], &all, goldens, false).1
}

/// What a group run did besides its trials: the reference work.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct GroupWork {
    /// Reference products built (their ids).
    pub built: Vec<String>,
    /// Time of the reference work: its share of the decodes and its own
    /// row time.
    pub reference: Duration,
    /// Reference work that failed (the trials that need it then build it
    /// themselves, or report why they cannot).
    pub failed: Vec<String>,
}

/// A started trial: its outcome so far and how it goes on.
struct Started {
    out: Outcome,
    prereg: Option<(Prereg, LedgerLine)>,
    /// The result came from the cache.
    cached: bool,
    /// Still to decode and finish.
    pending: Option<(Observation, Box<dyn Finish>)>,
    /// The reference decode whose rows it reads live.
    feed: Option<LiveFeed>,
    /// The start or the decode failed.
    error: Option<Error>,
    /// The case its kind starts with (a sealed rule's stops added), until
    /// started.
    ready: Option<Arc<Case>>,
}

/// Run a group of trials — `group` on one model, which the planner found to
/// share an observation — and the reference work `provides` needs from that
/// model: every distinct observation decoded once, every consumer fed from
/// it. With `cache`, completed trials are read from and written to the
/// result cache. One outcome per trial of `group`, in order.
pub fn trials(
    cx: &RunContext,
    group: &[&Planned],
    provides: &[&Planned],
    goldens: &Path,
    cache: bool,
) -> (Vec<Outcome>, GroupWork) {
    let t0 = Instant::now();
    let mut started: Vec<Started> = group.iter().map(|p| begin(cx, p, goldens, cache)).collect();
    start_all(cx, group, &mut started);
    // Reference work: once per product, and only what the store lacks.
    let mut work = GroupWork::default();
    let mut refs = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    // With a shipped reference folder the products come from there (read
    // by each trial); what it lacks is computed by the trial that needs it,
    // or refused, as `QUANTGATE_REFERENCE_MISSING` says: no shared
    // reference decode is started here.
    let provides = if cx.references.shipped().is_some() {
        &[]
    } else {
        provides
    };
    for d in provides {
        let Ok(parsed) = &d.case else { continue };
        // A trial the result cache answers reads no reference.
        if cache && cache::holds(cx, d) {
            continue;
        }
        match parsed.kind.reference_work(cx, &parsed.case) {
            Ok(Some(w)) if seen.insert(w.key.clone()) => refs.push(w),
            Ok(_) => {}
            Err(e) => work
                .failed
                .push(format!("{} (reference): {}", d.name, e.message)),
        }
    }
    // Locks in key order (no two processes wait on each other); what
    // another process built while this one waited is not built again.
    refs.sort_by(|a, b| a.key.cmp(&b.key));
    let mut locks = Vec::new();
    refs.retain(|w| match cx.references.lock(&w.key) {
        Ok(l) => {
            locks.push(l);
            !w.path.is_file()
        }
        Err(e) => {
            work.failed.push(format!("{}: {}", w.key, e.message));
            false
        }
    });
    // Buckets by observation key, in order of first appearance; a trial
    // that reads its reference live makes its bucket decode in step with
    // that reference's feed (one per feed key).
    struct Bucket {
        obs: Observation,
        trials: Vec<usize>,
        refs: Vec<usize>,
        live: bool,
    }
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut pending: Vec<Option<Box<dyn Finish>>> = Vec::new();
    let mut feeds: Vec<LiveFeed> = Vec::new();
    let mut feed_of: Vec<Option<usize>> = vec![None; started.len()];
    for (i, s) in started.iter_mut().enumerate() {
        pending.push(None);
        let live = s.feed.take().map(|f| {
            let k = match feeds.iter().position(|g| g.key == f.key) {
                Some(k) => k,
                None => {
                    feeds.push(f);
                    feeds.len() - 1
                }
            };
            feed_of[i] = Some(k);
        });
        if let Some((obs, f)) = s.pending.take() {
            pending[i] = Some(f);
            match buckets.iter_mut().find(|b| b.obs.key() == obs.key()) {
                Some(b) => {
                    b.trials.push(i);
                    b.live |= live.is_some();
                }
                None => buckets.push(Bucket {
                    obs,
                    trials: vec![i],
                    refs: Vec::new(),
                    live: live.is_some(),
                }),
            }
        }
    }
    let mut ref_consumers: Vec<Option<Box<dyn RefBuild>>> = Vec::new();
    for (r, w) in refs.into_iter().enumerate() {
        ref_consumers.push(Some(w.consumer));
        match buckets
            .iter_mut()
            .find(|b| b.obs.key() == w.observation.key())
        {
            Some(b) => b.refs.push(r),
            None => buckets.push(Bucket {
                obs: w.observation,
                trials: Vec::new(),
                refs: vec![r],
                live: false,
            }),
        }
    }
    /// A bucket's readers: its trials, its reference work.
    type Readers = (Vec<Box<dyn Finish>>, Vec<Box<dyn RefBuild>>);
    let mut consumers: Vec<Readers> = buckets
        .iter()
        .map(|b| {
            let t = b.trials.iter().map(|&i| pending[i].take().expect("once"));
            let r = b
                .refs
                .iter()
                .map(|&r| ref_consumers[r].take().expect("once"));
            (t.collect(), r.collect())
        })
        .collect();
    fn all((t, r): &mut Readers) -> Vec<&mut dyn Consumer> {
        let mut all: Vec<&mut dyn Consumer> = Vec::new();
        for c in t.iter_mut() {
            all.push(&mut **c);
        }
        for c in r.iter_mut() {
            all.push(&mut **c);
        }
        all
    }
    let mut seen: Vec<Option<Observed>> = Vec::new();
    for (b, cs) in buckets.iter().zip(consumers.iter_mut()) {
        seen.push((!b.live).then(|| observe(&b.obs, &mut all(cs))));
    }
    // The live buckets and their feeds, a pair of windows at a time (the
    // engine's two lanes): each feed's windows before its readers' same
    // windows, so a reader finds the rows of the windows it decodes.
    let mut ref_time = Duration::ZERO;
    let mut feed_errors: Vec<Option<Error>> = vec![None; feeds.len()];
    let mut feed_read = vec![Duration::ZERO; feeds.len()];
    if !feeds.is_empty() || buckets.iter().any(|b| b.live) {
        let mut fillers: Vec<&mut dyn Fill> = Vec::new();
        let mut jobs: Vec<(&Observation, Vec<&mut dyn Consumer>)> = Vec::new();
        let (mut read, mut decoded) = (Vec::new(), Vec::new());
        for (f, feed) in feeds.iter_mut().enumerate() {
            match &mut feed.source {
                FeedSource::Read(r) => {
                    fillers.push(&mut **r);
                    read.push(f);
                }
                FeedSource::Decode {
                    observation,
                    producer,
                } => {
                    jobs.push((&*observation, vec![&mut **producer]));
                    decoded.push((f, observation.alias().to_string()));
                }
            }
        }
        let mut live_ix = Vec::new();
        for (k, (b, cs)) in buckets.iter().zip(consumers.iter_mut()).enumerate() {
            if b.live {
                jobs.push((&b.obs, all(cs)));
                live_ix.push(k);
            }
        }
        let (filled, done) =
            observe_lockstep(&mut fillers, &mut jobs, crate::kinds::scored_text::STEP);
        drop(jobs);
        let mut done = done.into_iter();
        for (f, (e, t)) in read.into_iter().zip(filled) {
            feed_errors[f] = e.map(|e| e.context("stored reference"));
            feed_read[f] = t;
        }
        let mut decode_time = Duration::ZERO;
        for (f, alias) in decoded {
            let fed = done.next().expect("one per job");
            decode_time += fed.decode + fed.reduce + fed.consumer[0];
            feed_errors[f] = fed.errors[0]
                .clone()
                .map(|e| e.context(format!("reference `{alias}`")));
        }
        for (k, d) in live_ix.into_iter().zip(done) {
            seen[k] = Some(d);
        }
        // A live decode is reference work; reading a stored reference is
        // its readers' (charged below, as a decode).
        ref_time += decode_time;
    }
    drop(feeds);
    for ((b, (trial_cs, ref_cs)), seen) in buckets.iter().zip(consumers).zip(seen) {
        let seen = seen.expect("every bucket decoded");
        let obs = &b.obs;
        // The decode is shared: each reader (trials and reference work) is
        // charged its share, the shared row reduction likewise.
        let readers = (b.trials.len() + b.refs.len()).max(1) as u32;
        let (decode, reduce) = (seen.decode / readers, seen.reduce / readers);
        for (k, (&i, c)) in b.trials.iter().zip(trial_cs).enumerate() {
            let s = &mut started[i];
            s.out.timings.decode += decode;
            s.out.timings.measure += reduce + seen.consumer[k];
            s.out.timings.shared_with = readers - 1;
            if let Some(f) = feed_of[i] {
                let shared = feed_of.iter().filter(|g| **g == Some(f)).count().max(1);
                s.out.timings.decode += feed_read[f] / shared as u32;
            }
            // A reader of a live reference whose decode failed fails with
            // that decode's error.
            let feed_error = feed_of[i].and_then(|f| feed_errors[f].clone());
            match feed_error.or_else(|| seen.errors[k].clone()) {
                Some(e) => {
                    s.error = Some(e.context(parsed_path(group[i])));
                }
                None => {
                    if let Err(e) = c.finish(cx, &mut s.out) {
                        s.error = Some(e);
                    }
                }
            }
        }
        for (k, c) in ref_cs.into_iter().enumerate() {
            let k = b.trials.len() + k;
            let t = Instant::now();
            let result = match &seen.errors[k] {
                Some(e) => Err(e.clone()),
                None => c.finish(cx),
            };

            ref_time += decode + reduce + seen.consumer[k] + t.elapsed();
            match result {
                Ok(()) => work.built.push(format!("`{}` {}", obs.alias(), obs.key())),
                Err(e) => work
                    .failed
                    .push(format!("`{}`: {}", obs.alias(), e.message)),
            }
        }
    }
    drop(locks);
    work.reference = ref_time;
    let outcomes = started
        .into_iter()
        .zip(group)
        .map(|(s, p)| conclude(cx, p, s, cache, t0))
        .collect();
    (outcomes, work)
}

/// The test name's case path, for the context of a decode error.
fn parsed_path(p: &Planned) -> String {
    p.case
        .as_ref()
        .map(|c| c.case.path.display().to_string())
        .unwrap_or_else(|_| p.name.clone())
}

/// Everything of a trial before its kind starts: the parse error, the
/// prereg verification, or the cached result; else the case to start.
fn begin(cx: &RunContext, p: &Planned, goldens: &Path, cache: bool) -> Started {
    let (case_name, _) = split_test_name(&p.name);
    let mut s = Started {
        out: Outcome::new(case_name, &p.model, cx.engine().build()),
        prereg: None,
        cached: false,
        pending: None,
        feed: None,
        error: None,
        ready: None,
    };
    let parsed = match &p.case {
        Ok(c) => c,
        Err(e) => {
            s.error = Some(e.clone());
            return s;
        }
    };
    let case = &parsed.case;
    s.out.kind = case.kind.to_string();
    s.out.case_sha256 = Some(case.content_sha256.clone());
    s.out.reference = case.reference.as_ref().map(|r| r.0.clone());
    s.out.reference_sha256 = case
        .reference
        .as_ref()
        .and_then(|r| cx.registry().entry(&r.0).ok()?.sha256.clone());
    // A preregistered rule is verified before any model runs, and again
    // for a cached result.
    if let Some((path, _)) = &case.prereg {
        match verify_prereg(case, &p.model, path, goldens) {
            Ok(v) => s.prereg = Some(v),
            Err(e) => {
                s.error = Some(e);
                return s;
            }
        }
    }
    if cache {
        if let Some(o) = cache::read(cx, p) {
            s.out = Outcome {
                reference: s.out.reference.take(),
                reference_sha256: s.out.reference_sha256.take(),
                ..o
            };
            s.cached = true;
            return s;
        }
    }
    // A sealed sequential rule: its thresholds are where the run may stop.
    s.ready = Some(match (&s.prereg, &case.decide) {
        (Some((pr, _)), Some(d)) => {
            let mut c = (**case).clone();
            let mut d = d.clone();
            for cond in [&pr.win, &pr.loss] {
                d.stops.push((pr.metric.0.clone(), cond.threshold));
            }
            c.decide = Some(d);
            Arc::new(c)
        }
        _ => case.clone(),
    });
    s
}

/// Start every trial [`begin`] left ready: the trials of one case (the
/// same parse, no sealed rule's stops) together where its kind starts them
/// so ([`crate::kinds::Kind::start_together`]), each other by itself.
fn start_all(cx: &RunContext, group: &[&Planned], started: &mut [Started]) {
    for i in 0..started.len() {
        let (Some(case), Ok(parsed)) = (started[i].ready.clone(), &group[i].case) else {
            continue;
        };
        let together: Vec<usize> = (i..started.len())
            .filter(|&j| {
                started[j]
                    .ready
                    .as_ref()
                    .is_some_and(|c| Arc::ptr_eq(c, &parsed.case))
            })
            .collect();
        if Arc::ptr_eq(&case, &parsed.case) && together.len() > 1 {
            let aliases: Vec<&str> = together.iter().map(|&j| group[j].model.as_str()).collect();
            let mut outs: Vec<&mut Outcome> = started
                .iter_mut()
                .enumerate()
                .filter(|(j, _)| together.contains(j))
                .map(|(_, s)| &mut s.out)
                .collect();
            if let Some(starts) = parsed
                .kind
                .start_together(cx, &parsed.case, &aliases, &mut outs)
            {
                for (&j, st) in together.iter().zip(starts) {
                    started[j].ready = None;
                    started[j].started(st);
                }
                continue;
            }
        }
        started[i].ready = None;
        let st = parsed
            .kind
            .start(cx, &case, &group[i].model, &mut started[i].out);
        started[i].started(st);
    }
}

impl Started {
    /// What its kind's start gave.
    fn started(&mut self, st: crate::core::error::Result<Start>) {
        match st {
            Ok(Start::Done) => {}
            Ok(Start::Observe(obs, f)) => self.pending = Some((obs, f)),
            Ok(Start::Live(obs, f, feed)) => {
                self.pending = Some((obs, f));
                self.feed = Some(feed);
            }
            Err(e) => self.error = Some(e),
        }
    }
}

/// Judge a trial whose kind has run (or failed, or came from the cache),
/// and keep a fresh, complete result in the cache.
fn conclude(cx: &RunContext, p: &Planned, s: Started, cache: bool, t0: Instant) -> Outcome {
    let Started {
        mut out,
        prereg,
        cached,
        error,
        ..
    } = s;
    if !cached {
        out.timings.total = t0.elapsed();
    }
    let result = match error {
        Some(e) => Err(e),
        None => {
            let parsed = p.case.as_ref().expect("no error: the case parsed");
            let fresh = (!cached).then(|| out.clone());
            let judged = (|| {
                if let Some((rule, line)) = &prereg {
                    decide_prereg(cx, &parsed.case, &p.model, rule, line, &mut out)?;
                }
                undeclared_metrics(&parsed.case, &out)
            })();
            if let (Some(fresh), Ok(())) = (fresh, &judged) {
                if cache {
                    cache::write(cx, p, &fresh);
                }
            }
            judged.map(|()| parsed)
        }
    };
    match result {
        Err(e) => {
            out.input_error = e.kind == ErrorKind::Input;
            out.error = Some(e.message);
            out.status = Status::Error;
        }
        Ok(parsed) => {
            out.error = None;
            rejudge(parsed, &mut out);
        }
    }
    out
}
