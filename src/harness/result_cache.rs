//! The result cache: completed trials recorded under `<cache>/results`, so a
//! rerun (after an interruption) resumes from them. An entry is used only
//! after every pinned input of its trial is re-verified.

use crate::core::outcome::split_test_name;
use crate::core::{Outcome, Status};
use crate::execute::RunContext;
use crate::golden::Goldens;
use crate::plan::Planned;

/// The result cache key of a trial: this executable, the case's bytes (its
/// pins cover texts, token files and reference files), the model's and the
/// reference's pinned sha256, the engine and the threads. None when the
/// trial must always run: a preregistered case (its verification reads git),
/// Parquet output requested, an unpinned model, or
/// `QUANTGATE_RESULT_CACHE=off`.
fn result_key(runner: &RunContext, p: &Planned) -> Option<String> {
    static EXE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let case = &p.case.as_ref().ok()?.case;
    if case.prereg.is_some()
        || std::env::var_os("QUANTGATE_OUT").is_some_and(|d| !d.is_empty())
        || std::env::var("QUANTGATE_RESULT_CACHE").is_ok_and(|v| v == "off")
    {
        return None;
    }
    let exe = EXE
        .get_or_init(|| {
            let exe = std::env::current_exe().ok()?;
            crate::core::fsutil::sha256_file(&exe, |_| {})
                .ok()
                .map(|(s, _)| s)
        })
        .clone()?;
    let pinned = |alias: &str| runner.registry().entry(alias).ok()?.sha256.clone();
    let model = pinned(&p.model)?;
    let reference = match &case.reference {
        Some((r, _)) => format!("{r}={}", pinned(r)?),
        None => String::new(),
    };
    Some(crate::core::fsutil::sha256_bytes(
        format!(
            "{exe}|{}|{}|{}={model}|{reference}|{}|{}",
            case.name,
            case.content_sha256,
            p.model,
            runner.engine().identity(),
            runner.threads
        )
        .as_bytes(),
    ))
}

/// The trial's outcome: from the result cache when a complete run of the
/// same inputs is recorded there (after checking the model files still
/// match their pins), else run and, unless it errored, recorded.
pub fn outcome_of(runner: &RunContext, p: &Planned, goldens: &Goldens) -> Outcome {
    let Some(key) = result_key(runner, p) else {
        return crate::judge::trial(runner, p, &goldens.dir);
    };
    let path = crate::models::cache_dir()
        .join("results")
        .join(format!("{key}.json"));
    let cached = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<Outcome>(&t).ok())
        .filter(|o| o.case == split_test_name(&p.name).0 && o.model == p.model);
    if let Some(o) = cached {
        // A changed input is never answered from the cache: it runs (and
        // reports the mismatch).
        let verified = p
            .case
            .as_ref()
            .is_ok_and(|c| runner.verify_inputs(&c.case, &p.model).is_ok());
        if verified {
            eprintln!(
                "quantgate: {}: result from the result cache ({})",
                p.name,
                path.display()
            );
            return o;
        }
    }
    let o = crate::judge::trial(runner, p, &goldens.dir);
    if o.status != Status::Error {
        if let Ok(json) = serde_json::to_string(&o) {
            // Best effort: a result that cannot be cached is still a result.
            let _ = crate::core::fsutil::write_atomic(&path, json.as_bytes());
        }
    }
    o
}
