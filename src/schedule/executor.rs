//! Where each group's job runs, as the isolation asks: in this process, in
//! one worker process, or in any idle worker of the group's model.

use super::worker::{run_here, unanswered, Job, Selection, Worker};
use super::GroupRun;
pub(crate) use crate::core::config::Isolation;
use crate::core::EngineBuild;
use crate::execute::RunContext;
use crate::plan::Planned;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A model's worker processes: a job takes an idle one (or starts one) and
/// gives it back when done, so that a process's start, the model's sha256
/// check and its load are paid once for many jobs; a worker that died is
/// not given back (its job's tests say why; the next job starts afresh).
pub(crate) struct WorkerPool {
    alias: String,
    model_path: String,
    selection: Arc<Selection>,
    build: EngineBuild,
    env: Vec<(&'static str, String)>,
    signing_key: Option<crate::core::auth::Key>,
    idle: Mutex<Vec<Worker>>,
}

impl WorkerPool {
    fn run(&self, job: &Job, threads: u32) -> GroupRun {
        let taken = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut w = taken.unwrap_or_else(|| {
            Worker::new(
                &self.alias,
                self.model_path.clone(),
                self.selection.clone(),
                self.build.clone(),
                self.env.clone(),
                self.signing_key.clone(),
            )
        });
        let ran = w.run(job, threads);
        if !w.is_dead() {
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(w);
        }
        ran
    }
}

/// Where a group's job runs: this process, one worker process, or any
/// idle worker process of a model.
#[derive(Clone)]
pub(crate) enum Executor {
    /// In this process.
    InProcess(Arc<RunContext>),
    /// In one worker process (of a model, or of the group alone).
    Worker(Arc<Mutex<Worker>>),
    /// In any idle worker process of the group's model.
    Pool(Arc<WorkerPool>),
}

impl Executor {
    /// Run a group: `group` and `provides` are its planned trials; `job`
    /// names them (by test name) with what is done with their outcomes.
    pub(crate) fn run(
        &self,
        group: &[&Planned],
        provides: &[&Planned],
        job: &Job,
        goldens: &Path,
        threads: u32,
    ) -> GroupRun {
        match self {
            // A panic fails the group's trials, not the run.
            Executor::InProcess(cx) => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_here(cx, group, provides, goldens, job)
                }))
                .unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("(no message)");
                    GroupRun {
                        outcomes: unanswered(
                            job,
                            0,
                            &cx.engine().build(),
                            &format!("{{name}} panicked in this process: {what}"),
                        ),
                        work: Default::default(),
                    }
                })
            }
            Executor::Worker(w) => w
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .run(job, threads),
            Executor::Pool(pool) => pool.run(job, threads),
        }
    }
}

/// What a worker of `runner` is started with: its config, and its
/// engine's options over the config's.
fn worker_env(runner: &RunContext) -> Vec<(&'static str, String)> {
    let mut env = runner.config().to_env();
    env.extend(runner.options().to_env());
    env
}

/// The executor of each group, as `isolation` says; with
/// `reference_only_too` false, None for a group of reference work alone
/// (which then runs where the group that needs it runs).
pub(crate) fn executors(
    isolation: Isolation,
    groups: &[crate::plan::groups::Group],
    runner: &Arc<RunContext>,
    selection: &Arc<Selection>,
    reference_only_too: bool,
) -> Vec<Option<Executor>> {
    let build = runner.engine().build();
    let label = build.label();
    let model_path = |alias: &str| {
        runner
            .registry()
            .location(alias, &label, &runner.config().cache)
            .map(|l| l.display().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    let mut workers: std::collections::HashMap<String, Arc<Mutex<Worker>>> = Default::default();
    let mut pools: std::collections::HashMap<String, Arc<WorkerPool>> = Default::default();
    groups
        .iter()
        .enumerate()
        .map(|(g, grp)| {
            if grp.reference_only() && !reference_only_too {
                return None;
            }
            Some(match isolation {
                Isolation::Off => Executor::InProcess(runner.clone()),
                Isolation::Group => Executor::Pool(
                    pools
                        .entry(grp.model.clone())
                        .or_insert_with(|| {
                            Arc::new(WorkerPool {
                                alias: grp.model.clone(),
                                model_path: model_path(&grp.model),
                                selection: selection.clone(),
                                build: build.clone(),
                                env: worker_env(runner),
                                signing_key: runner.config().signing_key().cloned(),
                                idle: Mutex::new(Vec::new()),
                            })
                        })
                        .clone(),
                ),
                Isolation::Model | Isolation::Test => {
                    let key = match isolation {
                        Isolation::Model => grp.model.clone(),
                        _ => format!("group {g}"),
                    };
                    let w = workers.entry(key).or_insert_with(|| {
                        Arc::new(Mutex::new(Worker::new(
                            &grp.model,
                            model_path(&grp.model),
                            selection.clone(),
                            build.clone(),
                            worker_env(runner),
                            runner.config().signing_key().cloned(),
                        )))
                    });
                    Executor::Worker(w.clone())
                }
            })
        })
        .collect()
}
