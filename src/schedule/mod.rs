//! The one scheduler: a plan's groups (`plan::groups`, each one decode)
//! run `jobs` at a time, each after the groups whose references it reads,
//! each through an [`Executor`] — in this process or in an isolated worker
//! process ([`worker`]). `quantgate run` and the `cargo test` harness both
//! run their plans here.
//!
//! Contract: every selected trial gets exactly one outcome; a group that
//! measures the machine's speed runs with nothing beside it; a group that
//! panics in this process or whose worker dies fails its own trials (an
//! error outcome that says why) and every other group still runs.

pub(crate) mod executor;
pub(crate) mod group;
pub mod worker;

pub(crate) use executor::{executors, Executor, Isolation};
pub use worker::{Job, Selection, WORKER_ENV};

use crate::core::Outcome;
use crate::execute::RunContext;
use crate::plan::Planned;
pub use group::{build_references, trial, trials, GroupWork};
use std::path::Path;
use std::sync::Arc;

/// A plan's groups (each one decode) and where each runs: what
/// `quantgate run`, the `cargo test` harness and tests of the scheduler
/// all set up and run the same way.
pub struct Schedule {
    /// The groups, from `plan::groups` (their trials by index in the plan).
    pub groups: Vec<crate::plan::groups::Group>,
    executors: Vec<Option<Executor>>,
    runner: Arc<RunContext>,
}

impl Schedule {
    /// The groups of the `selected` trials of `planned` (with isolation
    /// `test`, one per trial: nothing shared), each given its executor: in
    /// this process on `runner`, or a worker planning `selection`.
    pub fn new(
        runner: &Arc<RunContext>,
        planned: &[Planned],
        selected: &[bool],
        isolation: Isolation,
        selection: Arc<Selection>,
    ) -> Self {
        let groups = crate::plan::groups::groups(planned, selected, isolation != Isolation::Test);
        let executors = executors(isolation, &groups, runner, &selection, true);
        Schedule {
            groups,
            executors,
            runner: runner.clone(),
        }
    }

    /// Every trial of the plan's groups in this process on `runner` (no
    /// workers), as a test of the scheduler runs it.
    pub fn here(runner: &Arc<RunContext>, planned: &[Planned]) -> Self {
        Self::new(
            runner,
            planned,
            &vec![true; planned.len()],
            Isolation::Off,
            Arc::new(Selection::default()),
        )
    }

    /// Run the groups ([`run_groups`]), `jobs` at a time, each as `job`
    /// says (its `run` and `provide` filled in per group), on the runner's
    /// threads, goldens (a preregistered rule's history) under `goldens`.
    pub fn run(
        &self,
        planned: &[Planned],
        jobs: usize,
        job: &Job,
        goldens: &Path,
        progress: &mut (dyn FnMut(&[&str], usize) + Send),
        done: &mut (dyn FnMut(usize, &Outcome, &[String]) + Send),
    ) -> (Vec<Outcome>, Vec<(String, f64, usize)>) {
        let exec = |g: usize, run: &[&Planned], provides: &[&Planned]| {
            let job = Job {
                run: run.iter().map(|p| p.name.clone()).collect(),
                provide: provides.iter().map(|p| p.name.clone()).collect(),
                ..job.clone()
            };
            self.executors[g]
                .as_ref()
                .expect("every group has an executor")
                .run(run, provides, &job, goldens, self.runner.threads)
        };
        run_groups(planned, &self.groups, jobs, &exec, progress, done)
    }
}

/// Runs one group, wherever: its index, its trials, the trials whose
/// reference work it does.
pub(crate) type RunGroup<'a> = dyn Fn(usize, &[&Planned], &[&Planned]) -> GroupRun + Sync + 'a;

/// Run every planned trial in its group (`groups`, from `plan::groups`),
/// each group after the groups whose references it reads, `jobs` groups at
/// a time, each through `exec` (the group's index, its trials, the trials
/// whose reference work it does; in this process or a worker): `progress`
/// hears each group's test names (none for reference work alone) and how
/// many trials it builds references for, `done` each outcome as it is
/// judged (with its index in `planned`), with what could not be written of it. The outcomes in plan
/// order, and the reference work per model (model, seconds, products built).
pub(crate) fn run_groups(
    planned: &[Planned],
    groups: &[crate::plan::groups::Group],
    jobs: usize,
    exec: &RunGroup<'_>,
    progress: &mut (dyn FnMut(&[&str], usize) + Send),
    done: &mut (dyn FnMut(usize, &Outcome, &[String]) + Send),
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
        done: &'a mut (dyn FnMut(usize, &Outcome, &[String]) + Send),
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
            crate::core::progress::say!("quantgate: reference work failed: {f}");
        }
        if !work.built.is_empty() {
            b.reference_work.push((
                grp.model.clone(),
                work.reference.as_secs_f64(),
                work.built.len(),
            ));
        }
        for (&i, (o, unwritten)) in grp.trials.iter().zip(outs) {
            (b.done)(i, &o, &unwritten);
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

/// A group's run, wherever it ran: an outcome per trial (in the group's
/// order) with the errors of writing its files, and the reference work.
#[derive(Debug, Default)]
pub(crate) struct GroupRun {
    /// Per trial: its outcome and what could not be written of it.
    pub outcomes: Vec<(Outcome, Vec<String>)>,
    /// The reference work.
    pub work: GroupWork,
}

#[cfg(test)]
mod tests {
    use super::*;

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
            sequential: false,
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
}
