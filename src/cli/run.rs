//! `quantgate run`: plan the selected cases × models, run them group by
//! group (each in a worker process of its model unless
//! `QUANTGATE_ISOLATION=off`), judge, and print the table; `--json`,
//! `--report` and `--out` as asked.

use super::args::{RunArgs, Select};
use super::{nothing_selected, outputs_ready, write_report, Conclusion, Ctx};
use quantgate::core::{Error, TrialEnd};
use quantgate::execute::{threads_per_trial, RunContext};
use quantgate::plan::Planned;
use quantgate::report;
use quantgate::schedule::{Job, Schedule, Selection};
use std::sync::Arc;

/// `--threads`, checked: at least 1, at most the cores here.
fn threads(asked: Option<u32>) -> Result<Option<u32>, Error> {
    if asked == Some(0) {
        return Err(Error::input(
            "--threads 0: give at least 1 (the default is the cores here)".to_string(),
        ));
    }
    let cores = quantgate::execute::cores() as u32;
    Ok(asked.map(|t| {
        if t > cores {
            eprintln!(
                "quantgate: --threads {t} is more than the {cores} cores here (oversubscribed \
                 llama.cpp threads run slower, not faster); using {cores}"
            );
        }
        t.clamp(1, cores)
    }))
}

/// Say what is wrong with the plan before any decode: each case that does
/// not parse (its tests are errors in the table; the other cases run), and
/// each model that is its own reference.
fn say_early(planned: &[Planned]) {
    let mut said = std::collections::BTreeSet::new();
    for e in planned.iter().filter_map(|p| p.case.as_ref().err()) {
        if said.insert(e.message.clone()) {
            eprintln!("error: {}", e.message);
        }
    }
    // A model compared with itself passes every paired gate.
    for p in planned {
        if let Ok(c) = &p.case {
            if c.case.reference.as_ref().is_some_and(|r| r.0 == p.model) {
                eprintln!(
                    "quantgate: warning: {}: `{}` is its own reference; its paired \
                     metrics compare it with itself (ΔNLL and KLD 0), a pass that says \
                     nothing",
                    p.name, p.model
                );
            }
        }
    }
}

/// Run `quantgate run`.
pub fn run(ctx: &Ctx, a: RunArgs) -> Result<Conclusion, Error> {
    let RunArgs {
        select: Select {
            patterns,
            models,
            reference,
        },
        json,
        out,
        timings,
        threads: asked_threads,
        jobs,
        goldens,
        allow_empty,
        no_cache,
        // Read into the config by `dispatch`.
        n_gpu_layers: _,
        kv_type: _,
        flash_attn: _,
        report: report_dir,
        base_model,
        force,
    } = a;
    let config = &ctx.config;
    let started = std::time::Instant::now();
    // Output paths are checked before anything runs.
    outputs_ready(
        json.as_deref(),
        report_dir.as_deref().map(|d| ("--report", d)),
        force,
    )?;
    if let Some(d) = &out {
        quantgate::core::fsutil::writable_dir("--out", d)?;
    }
    let threads = threads(asked_threads)?;
    let goldens = goldens.unwrap_or_else(|| ctx.default_goldens());
    let isolation = config.isolation;
    let overrides = ctx.overrides(&models, reference.as_deref())?;
    let (registry, planned) =
        quantgate::plan::plan_with(&ctx.suites, &patterns, &models, &overrides)?;
    if planned.is_empty() && !allow_empty {
        return Err(nothing_selected("run", &patterns, &models));
    }
    say_early(&planned);
    let runner = Arc::new(RunContext::new(
        config,
        registry,
        ctx.engine.clone(),
        threads.unwrap_or_else(|| threads_per_trial(jobs.max(1))),
    ));
    if let Some(dir) = &out {
        report::clean_product_temps(dir, &planned);
    }
    // Plan by observation: each group is one decode, after the groups
    // whose references it reads; each runs in a worker process of its
    // model (QUANTGATE_ISOLATION=off: in this one). Rows are not kept in
    // the result cache: --out runs everything.
    let cache = !no_cache && out.is_none() && config.result_cache;
    // QUANTGATE_ISOLATION=test: one worker per test, nothing shared (as
    // the harness does), so no decode is shared either.
    let selection = Arc::new(Selection {
        suites: ctx.suites.clone(),
        goldens: goldens.clone(),
        patterns: patterns.clone(),
        models: models.clone(),
        overrides,
    });
    let schedule = Schedule::new(
        &runner,
        &planned,
        &vec![true; planned.len()],
        isolation,
        selection,
    );
    let job = Job {
        cache,
        rows: out.clone(),
        ..Job::default()
    };
    let mut write_failed = false;
    // On a terminal, one board: tests done of all with an ETA, and a bar per
    // decode in flight (workers' included); else a line per group.
    let board = quantgate::core::progress::board_open(planned.len() as u64);
    let planned_at = started.elapsed().as_secs_f64();
    let (outcomes, reference_work) = schedule.run(
        &planned,
        jobs.max(1),
        &job,
        &goldens,
        &mut |names, provides| {
            let line = match names {
                [] => format!("reference work for {provides} trials"),
                [one] => one.to_string(),
                _ => format!("{} (one decode)", names.join(", ")),
            };
            if board {
                quantgate::core::progress::board_tick(0, Some(&line));
            } else if names.is_empty() {
                eprintln!("quantgate: {line}");
            } else {
                eprintln!("quantgate: running {line}");
            }
        },
        &mut |_, _, unwritten| {
            quantgate::core::progress::board_tick(1, None);
            for e in unwritten {
                quantgate::core::progress::line_out(&format!("error: {e}"));
                write_failed = true;
            }
        },
    );
    quantgate::core::progress::board_close();
    drop(schedule);
    let ran_at = started.elapsed().as_secs_f64();
    print!("{}", report::table(&outcomes));
    if let Some(dir) = &report_dir {
        if let Err(e) = write_report(
            dir,
            &outcomes,
            runner.registry(),
            &ctx.label(),
            &config.cache,
            base_model.as_deref(),
        ) {
            eprintln!("error: {}", e.message);
            write_failed = true;
        }
    }
    if timings {
        let done = started.elapsed().as_secs_f64();
        let phases = [
            ("plan (cases, models, pins)", planned_at),
            ("run (verify, decode, judge)", ran_at - planned_at),
            ("report", done - ran_at),
        ];
        print!("\n{}", report::timings(&outcomes, &reference_work, &phases));
    }
    if let Some(path) = json {
        report::write_json(&path, &outcomes, config.signing_key())?;
    }
    Ok(
        if outcomes
            .iter()
            .any(|o| matches!(o.end(), TrialEnd::InputError(_)))
        {
            Conclusion::Unusable
        } else if write_failed {
            Conclusion::Fail
        } else {
            Conclusion::of_outcomes(&outcomes)
        },
    )
}
