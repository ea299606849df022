//! `quantgate report`: the ladder report from `--json` files of `run`
//! (judged again, as `merge` judges shards), else from the result cache.

use super::args::{ReportArgs, Select};
use super::{nothing_selected, outputs_ready, write_report, Conclusion, Ctx};
use quantgate::core::{Error, Outcome};
use std::path::PathBuf;

/// Run `quantgate report`.
pub fn run(ctx: &Ctx, a: ReportArgs) -> Result<Conclusion, Error> {
    outputs_ready(None, Some(("--out", &a.out)), a.force)?;
    let outcomes = if a.json.is_empty() {
        from_cache(ctx, &a.select, a.allow_empty)?
    } else {
        from_json(ctx, &a.select, &a.json)?
    };
    if outcomes.is_empty() && !a.json.is_empty() && !a.allow_empty {
        return Err(Error::input(format!(
            "nothing to report: --json {} hold no outcome; pass --allow-empty to \
             accept an empty report",
            a.json
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(" --json ")
        )));
    }
    let registry = ctx.registry()?;
    let md = write_report(
        &a.out,
        &outcomes,
        &registry,
        &ctx.label(),
        &ctx.config.cache,
        a.base_model.as_deref(),
    )?;
    print!("{md}");
    Ok(Conclusion::Pass)
}

/// The outcomes of `--json` files, judged again from the cases, as `merge`
/// judges shards: a status or a number is never taken on the file's word.
fn from_json(ctx: &Ctx, select: &Select, json: &[PathBuf]) -> Result<Vec<Outcome>, Error> {
    let (reg, planned) = ctx.plan_selection(
        &select.patterns,
        &select.models,
        select.reference.as_deref(),
    )?;
    if let Some(f) = json.iter().find(|f| !f.is_file()) {
        return Err(Error::input(format!(
            "--json {}: no such file",
            f.display()
        )));
    }
    let found = quantgate::judge::merge::read_outcomes(json, ctx.config.signing_key())?;
    let given: std::collections::BTreeSet<String> = found
        .iter()
        .map(|(_, o)| format!("{}::{}", o.case, o.model))
        .collect();
    let planned: Vec<_> = planned
        .into_iter()
        .filter(|p| given.contains(&p.name))
        .collect();
    let pinned = |m: &str| reg.entry(m).ok()?.sha256.clone();
    quantgate::judge::merge::merge(&planned, found, &pinned)
}

/// The newest verified result of each selected test in the result cache.
fn from_cache(ctx: &Ctx, select: &Select, allow_empty: bool) -> Result<Vec<Outcome>, Error> {
    let (reg, planned) = ctx.plan_selection(
        &select.patterns,
        &select.models,
        select.reference.as_deref(),
    )?;
    let runner = ctx.runner(reg);
    if planned.is_empty() && !allow_empty {
        return Err(nothing_selected("report", &select.patterns, &select.models));
    }
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for p in &planned {
        match quantgate::judge::cache::latest(&runner, p) {
            Some(o) => found.push(o),
            None => missing.push(p.name.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(Error::input(format!(
            "no verified result in the result cache ({}) for {} of {} selected tests \
             (run them first, or select fewer): {}",
            ctx.config.cache.join("results").display(),
            missing.len(),
            planned.len(),
            missing.join(", ")
        )));
    }
    Ok(found)
}
