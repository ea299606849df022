//! `quantgate reference export|build`: a reference model's scores as a
//! record, or the reference products of a selection built once for shards.

use super::args::{ReferenceAction, ReferenceArgs, Select};
use super::{Conclusion, Ctx};
use quantgate::core::Error;
use std::path::{Path, PathBuf};

/// Run `quantgate reference …`.
pub fn run(ctx: &Ctx, a: ReferenceArgs) -> Result<Conclusion, Error> {
    match a.action {
        ReferenceAction::Export { case, out, model } => export(ctx, &case, &out, model),
        ReferenceAction::Build { select, out } => build(ctx, &select, &out),
    }
}

/// `reference export CASE --out FILE [--model ALIAS]`.
fn export(ctx: &Ctx, case: &Path, out: &Path, model: Option<String>) -> Result<Conclusion, Error> {
    if out.is_dir() {
        return Err(Error::input(format!(
            "--out {}: is a directory; give a file path",
            out.display()
        )));
    }
    let registry = ctx.registry()?;
    let name = case.display().to_string();
    let parsed = quantgate::plan::parse::parse_case(case, case, &name)?;
    let Some(alias) = model.or_else(|| parsed.case.reference.as_ref().map(|r| r.0.clone())) else {
        return Err(Error::input(format!(
            "{}: the case names no `reference`; pass --model ALIAS",
            case.display()
        )));
    };
    let runner = ctx.runner(registry);
    let jsonl = parsed
        .kind
        .reference_record(&runner, &alias)
        .unwrap_or_else(|| {
            Err(Error::input(format!(
                "{}: only perplexity and kld cases have reference records",
                case.display()
            )))
        })?;
    quantgate::core::fsutil::write_atomic(out, jsonl.as_bytes())?;
    let sha = quantgate::core::fsutil::sha256_bytes(jsonl.as_bytes());
    println!(
        "{}: {} targets, sha256 {sha}",
        out.display(),
        jsonl.lines().count() - 1
    );
    Ok(Conclusion::Pass)
}

/// `reference build [SELECTION] --out DIR`.
fn build(ctx: &Ctx, select: &Select, out: &PathBuf) -> Result<Conclusion, Error> {
    if out.exists() && !out.is_dir() {
        return Err(Error::input(format!(
            "--out {}: exists and is not a directory",
            out.display()
        )));
    }
    let (registry, planned) = ctx.plan_selection(
        &select.patterns,
        &select.models,
        select.reference.as_deref(),
    )?;
    // A selected case that cannot be used is an error, named, before any
    // work: a folder built without its products would fail every shard
    // that needs them, and say less.
    let mut broken: Vec<Error> = Vec::new();
    for e in planned.iter().filter_map(|p| p.case.as_ref().err()) {
        if !broken.iter().any(|b| b.message == e.message) {
            broken.push(e.clone());
        }
    }
    if !broken.is_empty() {
        return Err(quantgate::core::error::join(broken));
    }
    // A selection that reads no reference builds nothing: say so rather
    // than leave an empty folder that every shard refuses.
    let reads = planned
        .iter()
        .filter(|p| {
            p.case
                .as_ref()
                .is_ok_and(|c| c.kind.reference_observation().is_some())
        })
        .count();
    if reads == 0 {
        return Err(Error::input(format!(
            "nothing to build: none of the {} selected tests ({}) reads a reference model",
            planned.len(),
            if select.patterns.is_empty() {
                "every case".to_string()
            } else {
                select.patterns.join(" ")
            }
        )));
    }
    let mut runner = ctx.runner(registry);
    // The products go to --out, whatever the environment ships.
    runner.references = quantgate::execute::reference::ReferenceStore::with_shipped(
        out.clone(),
        Ok(None),
        &ctx.config,
    );
    // Sealed for other machines: keyed with the signing key when one is
    // set (the shards then refuse any edit), else plain (and each shard
    // names every file it reads as unauthenticated).
    runner.references.seal = quantgate::core::auth::Seal::shipped(&ctx.config);
    // The folder holds the products shards read, not the windows a
    // decode keeps for sequential cases in a cache.
    runner.references.keeps_windows = false;
    if !runner.references.seal.keyed() {
        eprintln!(
            "quantgate: warning: no signing key is set ({}): the products in {} are sealed with \
             plain sha256, and every shard will name them as unauthenticated",
            quantgate::core::auth::KEY_ENV,
            out.display()
        );
    }
    let t = std::time::Instant::now();
    let work = quantgate::schedule::build_references(&runner, &planned, &ctx.default_goldens());
    for f in &work.failed {
        eprintln!("error: {f}");
    }
    let mut files: Vec<(String, u64)> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            let bytes = e.metadata().map_or(0, |m| m.len());
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    for (name, bytes) in &files {
        println!("{}  {bytes} bytes", out.join(name).display());
    }
    println!(
        "quantgate: {} reference product(s) built in {:.1} s, {} in {}",
        work.built.len(),
        t.elapsed().as_secs_f64(),
        files.len(),
        out.display()
    );
    Ok(Conclusion::of(work.failed.is_empty()))
}
