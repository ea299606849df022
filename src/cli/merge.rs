//! `quantgate merge`: the outcomes of shards into one run, judged again.

use super::args::MergeArgs;
use super::{nothing_selected, outputs_ready, write_report, Conclusion, Ctx};
use quantgate::core::Error;
use quantgate::report;

/// Run `quantgate merge`.
pub fn run(ctx: &Ctx, a: MergeArgs) -> Result<Conclusion, Error> {
    outputs_ready(
        a.json.as_deref(),
        a.report.as_deref().map(|d| ("--report", d)),
        a.force,
    )?;
    let (registry, planned) = ctx.plan_selection(&a.cases, &a.models, a.reference.as_deref())?;
    if planned.is_empty() && !a.allow_empty {
        return Err(nothing_selected("merge", &a.cases, &a.models));
    }
    let found = quantgate::judge::merge::read_outcomes(&a.sources, ctx.config.signing_key())?;
    let pinned = |m: &str| registry.entry(m).ok()?.sha256.clone();
    let outcomes = quantgate::judge::merge::merge(&planned, found, &pinned)?;
    print!("{}", report::table(&outcomes));
    if let Some(path) = &a.json {
        report::write_json(path, &outcomes, ctx.config.signing_key())?;
    }
    if let Some(dir) = &a.report {
        write_report(
            dir,
            &outcomes,
            &registry,
            &ctx.label(),
            &ctx.config.cache,
            a.base_model.as_deref(),
        )?;
    }
    Ok(Conclusion::of_outcomes(&outcomes))
}
