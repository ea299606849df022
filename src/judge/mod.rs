//! Judge stage: planned trials run by their kinds — a group of trials that
//! share an observation in one decode, with the reference work folded in —
//! then judged: their gates, a preregistered rule (verified before any model
//! runs, decided after), and the check that each produced only the metrics
//! its kind declared. Completed trials are kept in the result cache.
//!
//! Contract: every gate is evaluated and every violation listed; a missing
//! or NaN metric is a violation, never a pass; an engine or input error is
//! an `error` outcome, never numbers; a cached result is used only after
//! every pinned input is re-verified, and is judged again like a fresh one.

pub mod cache;
pub mod gates;
pub mod merge;
pub mod prereg;

use crate::core::error::{Error, ErrorKind, Result};
use crate::core::outcome::split_test_name;
use crate::core::{Case, Outcome, Status};
use crate::execute::observe::{observe, Consumer, Observation};
use crate::execute::RunContext;
use crate::kinds::{Finish, RefBuild, Start};
use crate::plan::Planned;
use gates::judge;
use prereg::{LedgerLine, Prereg};
use std::path::Path;
use std::time::{Duration, Instant};

/// Run one planned trial and judge it. `goldens` is the goldens directory
/// a preregistered rule's history is checked against.
pub fn trial(cx: &RunContext, p: &Planned, goldens: &Path) -> Outcome {
    trials(cx, &[p], &[], goldens, false)
        .0
        .pop()
        .expect("one outcome per trial")
}

/// Run every planned trial in this process, grouped by observation
/// (`plan::groups`), each group after the groups whose references it reads,
/// `jobs` groups at a time (each on `cx`'s threads), as [`run_groups`] does.
pub fn run_plan(
    cx: &RunContext,
    planned: &[Planned],
    goldens: &Path,
    cache: bool,
    jobs: usize,
    progress: &mut (dyn FnMut(&[&str], usize) + Send),
    done: &mut (dyn FnMut(&Outcome) + Send),
) -> (Vec<Outcome>, Vec<(String, f64, usize)>) {
    let everything = vec![true; planned.len()];
    let groups = crate::plan::groups::groups(planned, &everything, true);
    let exec = |_: usize, run: &[&Planned], provides: &[&Planned]| {
        let (outcomes, work) = trials(cx, run, provides, goldens, cache);
        GroupRun {
            outcomes: outcomes.into_iter().map(|o| (o, Vec::new())).collect(),
            work,
        }
    };
    run_groups(planned, &groups, jobs, &exec, progress, &mut |o, _| done(o))
}

/// Runs one group, wherever: its index, its trials, the trials whose
/// reference work it does.
pub type RunGroup<'a> = dyn Fn(usize, &[&Planned], &[&Planned]) -> GroupRun + Sync + 'a;

/// Run every planned trial in its group (`groups`, from `plan::groups`),
/// each group after the groups whose references it reads, `jobs` groups at
/// a time, each through `exec` (the group's index, its trials, the trials
/// whose reference work it does; in this process or a worker): `progress`
/// hears each group's test names (none for reference work alone) and how
/// many trials it builds references for, `done` each outcome as it is
/// judged, with what could not be written of it. The outcomes in plan
/// order, and the reference work per model (model, seconds, products built).
pub fn run_groups(
    planned: &[Planned],
    groups: &[crate::plan::groups::Group],
    jobs: usize,
    exec: &RunGroup<'_>,
    progress: &mut (dyn FnMut(&[&str], usize) + Send),
    done: &mut (dyn FnMut(&Outcome, &[String]) + Send),
) -> (Vec<Outcome>, Vec<(String, f64, usize)>) {
    use std::sync::{Condvar, Mutex};
    // A group that measures the machine's speed runs with nothing beside it.
    let alone: Vec<bool> = groups
        .iter()
        .map(|g| {
            g.trials.iter().any(|&i| {
                planned[i]
                    .case
                    .as_ref()
                    .is_ok_and(|p| p.kind.measures_speed())
            })
        })
        .collect();
    /// Per group: 0 waiting, 1 running, 2 done.
    struct Board<'a> {
        state: Vec<u8>,
        by_index: Vec<Option<Outcome>>,
        reference_work: Vec<(String, f64, usize)>,
        progress: &'a mut (dyn FnMut(&[&str], usize) + Send),
        done: &'a mut (dyn FnMut(&Outcome, &[String]) + Send),
    }
    let board = Mutex::new(Board {
        state: vec![0; groups.len()],
        by_index: vec![None; planned.len()],
        reference_work: Vec::new(),
        progress,
        done,
    });
    let changed = Condvar::new();
    let work = || loop {
        let g = {
            let mut b = board.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                let ready = next_group(&b.state, groups, &alone);
                match ready {
                    Some(g) => {
                        b.state[g] = 1;
                        let names: Vec<&str> = groups[g]
                            .trials
                            .iter()
                            .map(|&i| planned[i].name.as_str())
                            .collect();
                        (b.progress)(&names, groups[g].provides.len());
                        break g;
                    }
                    None if b.state.iter().all(|&s| s != 0) => return,
                    None => b = changed.wait(b).unwrap_or_else(|p| p.into_inner()),
                }
            }
        };
        // A panicking group must not leave the other jobs waiting for it:
        // the guard stops them all, and the scope passes the panic on.
        struct Abort<'b, 'c>(&'b Mutex<Board<'c>>, &'b Condvar);
        impl Drop for Abort<'_, '_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    let mut b = self.0.lock().unwrap_or_else(|p| p.into_inner());
                    b.state.iter_mut().for_each(|s| *s = 2);
                    self.1.notify_all();
                }
            }
        }
        let _abort = Abort(&board, &changed);
        let grp = &groups[g];
        let run: Vec<&Planned> = grp.trials.iter().map(|&i| &planned[i]).collect();
        let provides: Vec<&Planned> = grp.provides.iter().map(|&i| &planned[i]).collect();
        let GroupRun {
            outcomes: outs,
            work,
        } = exec(g, &run, &provides);
        let mut b = board.lock().unwrap_or_else(|p| p.into_inner());
        for f in &work.failed {
            eprintln!("quantgate: reference work failed: {f}");
        }
        if !work.built.is_empty() {
            b.reference_work.push((
                grp.model.clone(),
                work.reference.as_secs_f64(),
                work.built.len(),
            ));
        }
        for (&i, (o, unwritten)) in grp.trials.iter().zip(outs) {
            (b.done)(&o, &unwritten);
            b.by_index[i] = Some(o);
        }
        b.state[g] = 2;
        changed.notify_all();
    };
    if jobs <= 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..jobs {
                s.spawn(work);
            }
        });
    }
    let b = board.into_inner().unwrap_or_else(|p| p.into_inner());
    (b.by_index.into_iter().flatten().collect(), b.reference_work)
}

/// The group to start next (in the groups' order), given each group's
/// state (0 waiting, 1 running, 2 done): one whose reference work is done,
/// and — when a group is running — neither one that must run alone nor
/// beside one that does.
fn next_group(
    state: &[u8],
    groups: &[crate::plan::groups::Group],
    alone: &[bool],
) -> Option<usize> {
    let running: Vec<usize> = (0..state.len()).filter(|&g| state[g] == 1).collect();
    let blocked = running.iter().any(|&r| alone[r]);
    (0..groups.len()).find(|&g| {
        state[g] == 0
            && groups[g].after.iter().all(|&a| state[a] == 2)
            && (running.is_empty() || !(blocked || alone[g]))
    })
}

/// The reference products of every planned trial, built into `cx`'s
/// reference store (`quantgate reference build`): each reference model's
/// observation decoded once for all the trials that read it, what the store
/// already holds skipped. The work done (and what failed).
pub fn build_references(cx: &RunContext, planned: &[Planned], goldens: &Path) -> GroupWork {
    let all: Vec<&Planned> = planned.iter().collect();
    trials(cx, &[], &all, goldens, false).1
}

/// A group's run, wherever it ran: an outcome per trial (in the group's
/// order) with the errors of writing its files, and the reference work.
#[derive(Debug, Default)]
pub struct GroupRun {
    /// Per trial: its outcome and what could not be written of it.
    pub outcomes: Vec<(Outcome, Vec<String>)>,
    /// The reference work.
    pub work: GroupWork,
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
    /// The start or the decode failed.
    error: Option<Error>,
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
    let mut started: Vec<Started> = group.iter().map(|p| start(cx, p, goldens, cache)).collect();
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
    // Buckets by observation key, in order of first appearance.
    let mut buckets: Vec<(Observation, Vec<usize>, Vec<usize>)> = Vec::new();
    let mut pending: Vec<Option<Box<dyn Finish>>> = Vec::new();
    for (i, s) in started.iter_mut().enumerate() {
        pending.push(None);
        if let Some((obs, f)) = s.pending.take() {
            pending[i] = Some(f);
            match buckets.iter_mut().find(|b| b.0.key() == obs.key()) {
                Some(b) => b.1.push(i),
                None => buckets.push((obs, vec![i], Vec::new())),
            }
        }
    }
    let mut ref_consumers: Vec<Option<Box<dyn RefBuild>>> = Vec::new();
    for (r, w) in refs.into_iter().enumerate() {
        ref_consumers.push(Some(w.consumer));
        match buckets
            .iter_mut()
            .find(|b| b.0.key() == w.observation.key())
        {
            Some(b) => b.2.push(r),
            None => buckets.push((w.observation, Vec::new(), vec![r])),
        }
    }
    let mut ref_time = Duration::ZERO;
    for (obs, trial_ix, ref_ix) in &buckets {
        let mut trial_cs: Vec<Box<dyn Finish>> = trial_ix
            .iter()
            .map(|&i| pending[i].take().expect("once"))
            .collect();
        let mut ref_cs: Vec<Box<dyn RefBuild>> = ref_ix
            .iter()
            .map(|&r| ref_consumers[r].take().expect("once"))
            .collect();
        let seen = {
            let mut all: Vec<&mut dyn Consumer> = Vec::new();
            for c in trial_cs.iter_mut() {
                all.push(&mut **c);
            }
            for c in ref_cs.iter_mut() {
                all.push(&mut **c);
            }
            observe(obs, &mut all)
        };
        // The decode is shared: each reader (trials and reference work) is
        // charged its share, the shared row reduction likewise.
        let readers = (trial_ix.len() + ref_ix.len()).max(1) as u32;
        let (decode, reduce) = (seen.decode / readers, seen.reduce / readers);
        for (k, (&i, c)) in trial_ix.iter().zip(trial_cs).enumerate() {
            let s = &mut started[i];
            s.out.timings.decode += decode;
            s.out.timings.measure += reduce + seen.consumer[k];
            s.out.timings.shared_with = readers - 1;
            match &seen.errors[k] {
                Some(e) => {
                    s.error = Some(e.clone().context(parsed_path(group[i])));
                }
                None => {
                    if let Err(e) = c.finish(cx, &mut s.out) {
                        s.error = Some(e);
                    }
                }
            }
        }
        for (k, c) in ref_cs.into_iter().enumerate() {
            let k = trial_ix.len() + k;
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

/// Everything of a trial before the shared decode: the parse error, the
/// prereg verification, the cached result, or the kind's start.
fn start(cx: &RunContext, p: &Planned, goldens: &Path, cache: bool) -> Started {
    let (case_name, _) = split_test_name(&p.name);
    let mut s = Started {
        out: Outcome::new(case_name, &p.model, cx.engine().build()),
        prereg: None,
        cached: false,
        pending: None,
        error: None,
    };
    let parsed = match &p.case {
        Ok(c) => c,
        Err(e) => {
            s.error = Some(e.clone());
            return s;
        }
    };
    let case = &parsed.case;
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
    match parsed.kind.start(cx, case, &p.model, &mut s.out) {
        Ok(Start::Done) => {}
        Ok(Start::Observe(obs, f)) => s.pending = Some((obs, f)),
        Err(e) => s.error = Some(e),
    }
    s
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

/// Judge measured metrics by the case: every gate evaluated, the verdict,
/// and the metrics the table shows (the kind's headline and every gated
/// metric). For fresh results, cached ones and merged shards alike.
pub fn rejudge(parsed: &crate::kinds::Parsed, out: &mut Outcome) {
    out.gates = judge(&parsed.case.gates, &out.metrics);
    let headline = parsed.kind.headline();
    if !headline.is_empty() {
        out.headline = headline.iter().map(|m| m.to_string()).collect();
        for g in &parsed.case.gates {
            let m = g.gated_metric();
            if !out.headline.contains(&m) {
                out.headline.push(m);
            }
        }
    }
    out.status = if out.gates.iter().all(|g| g.passed) {
        Status::Pass
    } else {
        Status::Fail
    };
}

/// A metric the kind did not declare has no type to compare it by.
fn undeclared_metrics(case: &Case, out: &Outcome) -> Result<()> {
    let stray: Vec<&str> = out
        .metrics
        .keys()
        .filter(|m| case.metric_type(m).is_none())
        .map(String::as_str)
        .collect();
    if stray.is_empty() {
        Ok(())
    } else {
        Err(Error::harness(format!(
            "{}: a kind = \"{}\" case produced metrics it does not declare: {}",
            case.path.display(),
            case.kind,
            stray.join(", ")
        )))
    }
}

/// Parse the case's prereg, check it is sealed, unchanged, consistent with
/// the case and (in git) committed before the case's golden.
fn verify_prereg(
    case: &Case,
    alias: &str,
    path: &Path,
    goldens: &Path,
) -> Result<(Prereg, LedgerLine)> {
    // Every error of the prereg file names that file.
    let p = prereg::parse(path)?;
    let line = prereg::sealed_line(&p)?;
    prereg::check_case(&p, case)?;
    let golden = crate::golden::Goldens::new(goldens.to_path_buf()).path(&case.name, alias);
    prereg::check_history(&p, &line, &golden)?;
    Ok((p, line))
}

/// Evaluate a prereg's rule on the measured metrics (after its size rule
/// on the candidate's and the baseline's files).
fn decide_prereg(
    cx: &RunContext,
    case: &Case,
    alias: &str,
    p: &Prereg,
    line: &LedgerLine,
    out: &mut Outcome,
) -> Result<()> {
    if let Some((baseline, _)) = &case.reference {
        let bytes = |a: &str| {
            cx.prepare(a)
                .and_then(|v| crate::models::gguf::gguf_total_bytes(&v.file.path))
        };
        prereg::check_size(p, bytes(alias)?, bytes(baseline)?)?;
    }
    let windows = out.metrics.get("windows").copied().unwrap_or(f64::NAN);
    if windows != p.windows as f64 {
        return Err(Error::input(format!(
            "{}: windows: {} preregistered, {windows} evaluated",
            p.path.display(),
            p.windows
        )));
    }
    let d = p
        .decide(&out.metrics, &line.time)
        .map_err(|e| Error::harness(format!("{}: {e}", p.path.display())))?;
    out.metrics
        .insert("prereg_outcome".into(), d.outcome.as_metric());
    out.metrics.insert(
        "prereg_prediction_hit".into(),
        if d.prediction_hit { 1.0 } else { 0.0 },
    );
    out.prereg = Some(d);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Outcome, Status};

    /// Groups 0..4, group 3 after group 0; group 2 measures speed.
    #[test]
    fn a_speed_group_starts_alone_and_nothing_starts_beside_it() {
        let group = |after: Vec<usize>| crate::plan::groups::Group {
            model: "m".into(),
            observation: None,
            trials: Vec::new(),
            provides: Vec::new(),
            after,
            weight: 0,
        };
        let groups = vec![group(vec![]), group(vec![]), group(vec![]), group(vec![0])];
        let alone = [false, false, true, false];
        // Nothing running: the first waiting group.
        assert_eq!(next_group(&[0, 0, 0, 0], &groups, &alone), Some(0));
        // Group 0 running: 1 may start beside it, not the speed group 2,
        // nor 3, which waits for 0.
        assert_eq!(next_group(&[1, 0, 0, 0], &groups, &alone), Some(1));
        assert_eq!(next_group(&[1, 1, 0, 0], &groups, &alone), None);
        // Nothing running: the speed group starts.
        assert_eq!(next_group(&[2, 2, 0, 0], &groups, &alone), Some(2));
        // While it runs, nothing starts, though 3 is ready.
        assert_eq!(next_group(&[2, 2, 1, 0], &groups, &alone), None);
        assert_eq!(next_group(&[2, 2, 2, 0], &groups, &alone), Some(3));
        assert_eq!(next_group(&[2, 2, 2, 2], &groups, &alone), None);
    }
    use crate::engine::fake::{FakeEngine, FakeSpec};
    use crate::execute::RunContext;
    use crate::plan::plan;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    /// A suites tree with two tiny GGUF "models" and one perplexity case.
    fn suite(tag: &str, case_extra: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("qg-runner-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("ppl")).unwrap();
        let gguf = crate::models::gguf::tests::tiny_header();
        std::fs::write(root.join("m.gguf"), &gguf).unwrap();
        let sha = crate::core::fsutil::sha256_bytes(&gguf);
        std::fs::write(
            root.join("models.toml"),
            format!(
                "[good]\nsha256 = \"{sha}\"\nbytes = {}\npath = \"m.gguf\"\n\n[sharp]\nsha256 = \"{sha}\"\npath = \"m.gguf\"\n",
                gguf.len()
            ),
        )
        .unwrap();
        let text: String = (0..300)
            .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
            .collect();
        std::fs::write(root.join("ppl/t.txt"), &text).unwrap();
        let tsha = crate::core::fsutil::sha256_bytes(text.as_bytes());
        std::fs::write(
            root.join("ppl/case.toml"),
            format!(
                "kind = \"perplexity\"\nmodels = [\"good\", \"sharp\"]\n[text]\npath = \"t.txt\"\nsha256 = \"{tsha}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 64\nchunks = 3\n{case_extra}"
            ),
        )
        .unwrap();
        root
    }

    /// Independent reference: llama-perplexity's windows and a naive
    /// log-softmax over the fake engine's logit formula.
    fn reference_nll(spec: &FakeSpec, text: &[u8], n_ctx: usize, chunks: usize) -> (f64, usize) {
        let mut toks = vec![crate::engine::fake::BOS];
        toks.extend(text.iter().map(|&b| i32::from(b)));
        let (mut sum, mut n) = (0.0, 0);
        for c in 0..chunks.min(toks.len() / n_ctx) {
            let start = c * n_ctx;
            for pos in n_ctx / 2..n_ctx - 1 {
                let input = if pos == 0 {
                    crate::engine::fake::BOS
                } else {
                    toks[start + pos]
                };
                let row: Vec<f64> = spec.logits(input, pos).into_iter().map(f64::from).collect();
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
                sum += lse - row[toks[start + pos + 1] as usize];
                n += 1;
            }
        }
        (sum / n as f64, n)
    }

    fn run_all(root: &Path, engine: FakeEngine) -> Vec<Outcome> {
        let (registry, planned) = plan(root, &[], &[]).unwrap();
        let cx = RunContext::new(registry, Arc::new(engine), 1);
        planned
            .iter()
            .map(|p| trial(&cx, p, &root.join("goldens")))
            .collect()
    }

    /// Shards merged: every planned test once, gates judged again; a
    /// missing, doubled, foreign or inconsistent outcome is refused by name.
    #[test]
    fn shards_merge_into_the_unsharded_run_or_are_refused() {
        let root = suite("merge", "[[gate]]\nmetric = \"ppl\"\nmax = 1e9\n");
        let (_, planned) = plan(&root, &[], &[]).unwrap();
        let out = run_all(&root, FakeEngine::new());
        assert!(out.iter().all(|o| o.status == Status::Pass), "{out:?}");
        let dirs: Vec<PathBuf> = (0..2).map(|k| root.join(format!("shard{k}"))).collect();
        for (o, d) in out.iter().zip(&dirs) {
            crate::report::write_outcome_json(d, o).unwrap();
        }
        let pinned = |_: &str| None;
        let merge_of = |sources: &[PathBuf]| {
            merge::merge(&planned, merge::read_outcomes(sources).unwrap(), &pinned)
        };
        let merged = merge_of(&dirs).unwrap();
        assert_eq!(merged.len(), 2);
        for (m, o) in merged.iter().zip(&out) {
            assert_eq!((&m.case, &m.model, m.status), (&o.case, &o.model, o.status));
            assert_eq!(m.metrics, o.metrics);
            assert_eq!(m.gates, o.gates);
            assert!(!m.headline.is_empty(), "judged again: the table's metrics");
        }
        // One shard gone: the missing test named.
        let e = merge_of(&dirs[..1]).unwrap_err();
        assert!(
            e.message.contains("1 of 2 planned tests have no outcome"),
            "{}",
            e.message
        );
        assert!(e.message.contains(&planned[1].name), "{}", e.message);
        assert_eq!(e.kind, ErrorKind::Input);
        // A shard counted twice.
        let twice = [dirs[0].clone(), dirs[1].clone(), dirs[0].clone()];
        let e = merge_of(&twice).unwrap_err();
        assert!(
            e.message
                .contains(&format!("{} ran 2 times", planned[0].name)),
            "{}",
            e.message
        );
        // A shard's outcome edited to pass with a violated gate: judged
        // again, it fails.
        let mut bad = out[1].clone();
        bad.metrics.insert("ppl".into(), 2e9);
        let edited = root.join("edited");
        crate::report::write_outcome_json(&edited, &bad).unwrap();
        let m = merge_of(&[dirs[0].clone(), edited.clone()]).unwrap();
        assert_eq!(m[1].status, Status::Fail);
        assert!(!m[1].gates[0].passed);
        // NaN never passes either (serde writes it as null: not an outcome).
        let mut nan = out[1].clone();
        nan.metrics.insert("ppl".into(), f64::NAN);
        crate::report::write_outcome_json(&edited, &nan).unwrap();
        match merge::read_outcomes(&[dirs[0].clone(), edited.clone()]) {
            Err(e) => assert!(e.message.contains("edited"), "{}", e.message),
            Ok(found) => {
                let m = merge::merge(&planned, found, &pinned).unwrap();
                assert_ne!(m[1].status, Status::Pass, "{:?}", m[1]);
            }
        }
        // Another case version, another model file, another build, other
        // settings, a test the selection does not plan: each named.
        let mut other = out[1].clone();
        other.case_sha256 = Some("0".repeat(64));
        other.model_sha256 = Some("1".repeat(64));
        other.build.ggml = "another ggml".into();
        if let Some(s) = other.settings.as_mut() {
            s.n_ctx += 1;
        }
        crate::report::write_outcome_json(&edited, &other).unwrap();
        let mut foreign = out[1].clone();
        foreign.model = "nobody".into();
        crate::report::write_outcome_json(&edited, &foreign).unwrap();
        let found = merge::read_outcomes(&[dirs[0].clone(), edited.clone()]).unwrap();
        let pin = |m: &str| (m == planned[1].model).then(|| "2".repeat(64));
        let e = merge::merge(&planned, found, &pin).unwrap_err();
        for want in [
            "ran another version of",
            "ran another file of",
            "the shards ran 2 builds",
            "ran under 2 settings",
            "is not a test of this selection",
        ] {
            assert!(e.message.contains(want), "{want}: {}", e.message);
        }
        // A file that is not an outcome is an error naming it.
        std::fs::write(edited.join("junk.json"), "{\"case\": 3}").unwrap();
        let e = merge::read_outcomes(std::slice::from_ref(&edited)).unwrap_err();
        assert!(e.message.contains("junk.json"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn fake_engine_through_every_stage() {
        let sharp = FakeSpec {
            confidence: 9.0,
            ..FakeSpec::default()
        };
        let root = suite("stages", "[[gate]]\nmetric = \"ppl\"\nmax = 1e9\n");
        let out = run_all(&root, FakeEngine::new().with("sharp", sharp.clone()));
        assert_eq!(out.len(), 2);
        let text = std::fs::read(root.join("ppl/t.txt")).unwrap();
        for (o, spec) in out.iter().zip([FakeSpec::default(), sharp]) {
            assert_eq!(o.status, Status::Pass, "{o:?}");
            let (want, n) = reference_nll(&spec, &text, 64, 3);
            assert_eq!(o.metrics["tokens_scored"], n as f64);
            assert_eq!(o.metrics["windows"], 3.0);
            assert!(
                (o.metrics["nll_mean"] - want).abs() < 1e-12,
                "{} vs {want}",
                o.metrics["nll_mean"]
            );
            assert!((o.metrics["ppl"] - want.exp()).abs() < 1e-9);
        }
    }

    /// Per-window mean NLLs and per-token NLLs, recomputed independently.
    fn reference_windows(
        spec: &FakeSpec,
        text: &[u8],
        n_ctx: usize,
        chunks: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut toks = vec![crate::engine::fake::BOS];
        toks.extend(text.iter().map(|&b| i32::from(b)));
        let (mut means, mut all) = (Vec::new(), Vec::new());
        for c in 0..chunks {
            let start = c * n_ctx;
            let mut v = Vec::new();
            for pos in n_ctx / 2..n_ctx - 1 {
                let row: Vec<f64> = spec
                    .logits(toks[start + pos], pos)
                    .into_iter()
                    .map(f64::from)
                    .collect();
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
                v.push(lse - row[toks[start + pos + 1] as usize]);
            }
            means.push(v.iter().sum::<f64>() / v.len() as f64);
            all.extend(v);
        }
        (means, all)
    }

    /// The test suite with `sharp` as the candidate and `good` as its reference.
    fn paired_suite(tag: &str, extra: &str) -> PathBuf {
        let root = suite(tag, extra);
        let case = std::fs::read_to_string(root.join("ppl/case.toml")).unwrap();
        let case = case.replace(
            "models = [\"good\", \"sharp\"]",
            "models = [\"sharp\"]\nreference = \"good\"",
        );
        std::fs::write(root.join("ppl/case.toml"), case).unwrap();
        root
    }

    #[test]
    fn paired_delta_nll_against_a_reference_is_recomputed_independently() {
        let root = paired_suite(
            "paired",
            "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = 0.05\n",
        );
        let sharp = FakeSpec {
            confidence: 6.0,
            ..FakeSpec::default()
        };
        let out = run_all(&root, FakeEngine::new().with("sharp", sharp.clone()));
        let o = &out[0];
        assert!(o.error.is_none(), "{o:?}");
        let text = std::fs::read(root.join("ppl/t.txt")).unwrap();
        let (cm, ct) = reference_windows(&sharp, &text, 64, 3);
        let (rm, rt) = reference_windows(&FakeSpec::default(), &text, 64, 3);
        let d: Vec<f64> = cm.iter().zip(&rm).map(|(a, b)| a - b).collect();
        let mean = d.iter().sum::<f64>() / 3.0;
        let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
        use statrs::distribution::ContinuousCDF;
        let t = statrs::distribution::StudentsT::new(0.0, 1.0, 2.0)
            .unwrap()
            .inverse_cdf(0.975);
        let close = |name: &str, want: f64| {
            let got = o.metrics[name];
            assert!(
                (got - want).abs() < 1e-9 * want.abs().max(1.0),
                "{name}: {got} vs {want}"
            );
        };
        close("delta_nll_mean", mean);
        close("delta_nll_ci95_lo", mean - t * sd / 3f64.sqrt());
        close("delta_nll_ci95_hi", mean + t * sd / 3f64.sqrt());
        close(
            "windows_better",
            d.iter().filter(|x| **x < 0.0).count() as f64,
        );
        close("ppl_ref", (rt.iter().sum::<f64>() / rt.len() as f64).exp());
        // llama-perplexity's token-level figures from the per-token NLLs.
        let n = ct.len() as f64;
        let (fa, fb) = (ct.iter().sum::<f64>() / n, rt.iter().sum::<f64>() / n);
        let va = ct.iter().map(|x| (x - fa).powi(2)).sum::<f64>() / n / (n - 1.0);
        let vb = rt.iter().map(|x| (x - fb).powi(2)).sum::<f64>() / n / (n - 1.0);
        let cov = ct
            .iter()
            .zip(&rt)
            .map(|(a, b)| (a - fa) * (b - fb))
            .sum::<f64>()
            / n
            / (n - 1.0);
        close("ln_ppl_ratio", fa - fb);
        close("ln_ppl_ratio_se", (va + vb - 2.0 * cov).sqrt());
        close("ppl_ratio", (fa - fb).exp());
        close("nll_token_corr", cov / (va.sqrt() * vb.sqrt()));
        let (lo, hi) = (
            o.metrics.get("delta_nll_boot95_lo"),
            o.metrics.get("delta_nll_boot95_hi"),
        );
        // Three windows are too few for a block bootstrap: no interval at all.
        assert!(lo.is_none() && hi.is_none(), "{lo:?} {hi:?}");
        // Confidence on the wrong next byte costs: the candidate is worse.
        assert!(mean > 0.0);
        assert_eq!(
            o.status,
            if mean <= 0.05 {
                Status::Pass
            } else {
                Status::Fail
            }
        );
    }

    #[test]
    fn reference_with_another_tokenizer_is_refused() {
        let root = paired_suite("tok", "");
        let other = FakeSpec {
            tokenizer: "another-base-model",
            ..FakeSpec::default()
        };
        let out = run_all(&root, FakeEngine::new().with("good", other));
        let e = out[0].error.as_deref().unwrap();
        assert!(
            e.contains("case.toml:3:13: reference: `good` and `sharp` have different tokenizers"),
            "{e}"
        );
        assert!(out[0].input_error);
    }

    #[test]
    fn gate_violation_fails_with_observed_and_threshold() {
        let root = suite(
            "gate",
            "[[gate]]\nmetric = \"ppl\"\nmax = 1.5\n[[gate]]\nmetric = \"windows\"\nmin = 3\n",
        );
        let out = run_all(&root, FakeEngine::new());
        let o = &out[0];
        assert_eq!(o.status, Status::Fail);
        let msg = o.failure_message().unwrap();
        assert!(
            msg.starts_with("ppl/case::good: gate violated\n  ppl = "),
            "{msg}"
        );
        assert!(msg.contains("violates ppl ≤ 1.5 (max 1.5)"), "{msg}");
        assert!(!msg.contains("windows"), "{msg}");
    }

    #[test]
    fn nan_logits_and_decode_errors_are_errors_not_numbers() {
        let root = suite("faults", "[[gate]]\nmetric = \"ppl\"\nmax = 1e9\n");
        let engine = FakeEngine::new()
            .with(
                "good",
                FakeSpec {
                    nan_at: Some((1, 40)),
                    ..FakeSpec::default()
                },
            )
            .with(
                "sharp",
                FakeSpec {
                    decode_error_in: Some(2),
                    ..FakeSpec::default()
                },
            );
        let out = run_all(&root, engine);
        assert!(
            out.iter()
                .all(|o| o.status == Status::Error && o.metrics.is_empty()),
            "{out:?}"
        );
        let e0 = out[0].error.as_deref().unwrap();
        assert!(
            e0.contains("model `good`") && e0.contains("m.gguf") && e0.contains("sha256 "),
            "{e0}"
        );
        assert!(
            e0.contains("non-finite logit NaN for token 7 at position 40"),
            "{e0}"
        );
        let e1 = out[1].error.as_deref().unwrap();
        assert!(e1.contains("llama_decode failed (1) in window 2"), "{e1}");
    }

    #[test]
    fn n_ctx_beyond_training_and_text_pin_mismatch_name_the_case() {
        let root = suite("ctx", "");
        let small = FakeSpec {
            n_ctx_train: 32,
            ..FakeSpec::default()
        };
        let out = run_all(&root, FakeEngine::new().with("good", small));
        let e = out[0].error.as_deref().unwrap();
        assert!(e.contains("case.toml:7:8: window: context 64 is larger than the training context 32 of model `good`"), "{e}");
        assert!(out[0].input_error);
        std::fs::write(root.join("ppl/t.txt"), "changed").unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[1].error.as_deref().unwrap();
        assert!(
            e.contains("case.toml:5:10: text.sha256:") && e.contains("does not match its pin"),
            "{e}"
        );
    }

    #[test]
    fn broken_case_fails_alone_and_unknown_alias_names_the_case() {
        let root = suite("broken", "");
        std::fs::write(root.join("ppl/bad.toml"), "kind = \"perplexity\"\nmodels = [\"nosuch\"]\n[text]\npath = \"t.txt\"\nsha256 = \"x\"\npromt = 1\n").unwrap();
        std::fs::write(
            root.join("ppl/alias.toml"),
            std::fs::read_to_string(root.join("ppl/case.toml"))
                .unwrap()
                .replace("\"sharp\"", "\"shrap\""),
        )
        .unwrap();
        let (_, planned) = plan(&root, &[], &[]).unwrap();
        let names: Vec<_> = planned.iter().map(|p| p.name.as_str()).collect();
        assert!(
            names.contains(&"ppl/bad") && names.contains(&"ppl/case::good"),
            "{names:?}"
        );
        let bad = planned.iter().find(|p| p.name == "ppl/bad").unwrap();
        let e = bad.case.as_ref().unwrap_err();
        assert!(
            e.message
                .contains("suites/ppl/bad.toml:6:1: text.promt: unknown key `promt`"),
            "{}",
            e.message
        );
        let alias = planned
            .iter()
            .find(|p| p.name == "ppl/alias::shrap")
            .unwrap();
        let e = alias.case.as_ref().unwrap_err();
        assert!(
            e.message
                .contains("alias.toml:2:19: models: model alias `shrap` is not in"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("(did you mean `sharp`?)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn registry_problems_are_input_errors() {
        let root = suite("registry", "");
        let good = std::fs::read_to_string(root.join("models.toml")).unwrap();
        std::fs::write(
            root.join("models.toml"),
            good.replace("path = \"m.gguf\"\n\n", "path = \"missing.gguf\"\n\n"),
        )
        .unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[0].error.as_deref().unwrap_or_else(|| panic!("{out:?}"));
        assert!(
            e.contains("model `good`: file") && e.contains("missing.gguf does not exist"),
            "{e}"
        );
        // A directory, or a symlink loop, where the file should be: said as it is.
        std::fs::create_dir_all(root.join("adir")).unwrap();
        std::fs::write(
            root.join("models.toml"),
            good.replace("path = \"m.gguf\"\n\n", "path = \"adir\"\n\n"),
        )
        .unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[0].error.as_deref().unwrap();
        assert!(
            e.contains("model `good`") && e.contains("adir is a directory"),
            "{e}"
        );
        assert!(out[0].input_error);
        std::os::unix::fs::symlink(root.join("loop"), root.join("loop")).unwrap();
        std::fs::write(
            root.join("models.toml"),
            good.replace("path = \"m.gguf\"\n\n", "path = \"loop\"\n\n"),
        )
        .unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[0].error.as_deref().unwrap();
        assert!(
            e.contains("model `good`") && e.contains("loop") && !e.contains("does not exist"),
            "{e}"
        );
        // Wrong sha256: expected, actual and size are shown.
        let wrong = format!("0{}", &crate::core::fsutil::sha256_bytes(b"other")[1..]);
        std::fs::write(
            root.join("models.toml"),
            format!("[good]\nsha256 = \"{wrong}\"\npath = \"m.gguf\"\n[sharp]\nsha256 = \"{wrong}\"\npath = \"m.gguf\"\n"),
        )
        .unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[0].error.as_deref().unwrap();
        assert!(
            e.contains("sha256 mismatch")
                && e.contains("expected 0")
                && e.contains("actual   ")
                && e.contains("bytes)"),
            "{e}"
        );
        // A truncated GGUF pinned by its own sha256 is stopped by the preflight.
        let t = &crate::models::gguf::tests::tiny_header()[..30];
        std::fs::write(root.join("m.gguf"), t).unwrap();
        std::fs::write(root.join("models.toml"), format!("[good]\nsha256 = \"{}\"\npath = \"m.gguf\"\n[sharp]\nsha256 = \"{}\"\npath = \"m.gguf\"\n", crate::core::fsutil::sha256_bytes(t), crate::core::fsutil::sha256_bytes(t))).unwrap();
        let out = run_all(&root, FakeEngine::new());
        let e = out[0].error.as_deref().unwrap();
        assert!(
            e.contains("not a usable GGUF file") && e.contains("m.gguf"),
            "{e}"
        );
        assert!(out[0].input_error);
    }
}
