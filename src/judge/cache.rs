//! The result cache: completed trials recorded under `<cache>/results`, so a
//! rerun (after an interruption, or of an unchanged suite) takes them from
//! there. An entry holds what the kind measured, before judging: a cached
//! trial is judged again (gates, a preregistered rule verified and decided
//! anew), and used only after every pinned input of its trial is
//! re-verified.

use crate::core::auth;
use crate::core::outcome::split_test_name;
use crate::core::Outcome;
use crate::execute::RunContext;
use crate::plan::Planned;
use std::path::PathBuf;

/// The entry of a trial: keyed by the code that computes it
/// ([`code_identity`]), the case's bytes (its
/// pins cover texts, token files and reference files; its windowing, batch,
/// context and seeds are written in it), the model's and the reference's
/// pinned sha256, the engine build, the threads and every engine option
/// that changes numbers ([`engine_key`]); a trial that
/// measures speed also by the machine ([`RunContext::machine`]), so a speed
/// result is given again only where it was measured; and by what else its
/// kind says keys it ([`crate::kinds::Kind::run_key`]: a drift case's
/// runtimes, so two runtimes never share a result). None when the trial
/// has no key (an unpinned model, or speed on a machine that cannot be told
/// apart).
fn entry(runner: &RunContext, p: &Planned) -> Option<PathBuf> {
    let parsed = p.case.as_ref().ok()?;
    let machine = if parsed.kind.measures_speed() {
        format!("|machine {}", runner.machine()?)
    } else {
        String::new()
    };
    let runtimes = parsed.kind.run_key(runner)?;
    let case = &parsed.case;
    let code = code_identity();
    let pinned = |alias: &str| runner.registry().entry(alias).ok()?.sha256.clone();
    let model = pinned(&p.model)?;
    let reference = match &case.reference {
        Some((r, _)) => format!("{r}={}", pinned(r)?),
        None => String::new(),
    };
    let key = crate::core::fsutil::sha256_bytes(
        format!(
            "{code}|{}|{}|{}={model}|{reference}|{}|{}{machine}|{runtimes}",
            case.name,
            case.content_sha256,
            p.model,
            runner.engine().identity(),
            engine_key(runner)
        )
        .as_bytes(),
    );
    Some(
        runner
            .config()
            .cache
            .join("results")
            .join(format!("{key}.qgresult")),
    )
}

/// The code a result comes from: the library's source, features, target
/// and compiler (`QUANTGATE_SOURCE_SHA256`, made by build.rs), and the
/// exact builds of the crates that compute, parse or seal numbers (each a
/// type's `TypeId`, which changes with the crate's version, features and
/// dependencies, and with the compiler). Every executable built from the
/// same source with the same crates (`quantgate`, the test harness, a
/// release repository's `cargo test` against it) shares its results; a
/// change to any of them keys a new entry.
fn code_identity() -> &'static str {
    use std::any::TypeId;
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let crates = [
            TypeId::of::<statrs::distribution::Normal>(),
            TypeId::of::<serde_json::Value>(),
            TypeId::of::<toml::Table>(),
            TypeId::of::<num_bigint::BigInt>(),
            TypeId::of::<parquet::errors::ParquetError>(),
            TypeId::of::<sha2::Sha256>(),
            TypeId::of::<hmac::Hmac<sha2::Sha256>>(),
            TypeId::of::<llama_cpp_2::model::LlamaModel>(),
        ];
        crate::core::fsutil::sha256_bytes(
            format!("{} {crates:?}", env!("QUANTGATE_SOURCE_SHA256")).as_bytes(),
        )
    })
}

/// The trial's recorded outcome, when a complete run of the same inputs is
/// recorded and every input still matches its pin (a changed input is
/// never answered from the cache: the trial runs and reports it).
pub fn read(runner: &RunContext, p: &Planned) -> Option<Outcome> {
    let (path, o) = lookup(runner, p)?;
    crate::core::progress::say!(
        "quantgate: {}: result from the result cache ({})",
        p.name,
        path.display()
    );
    Some(o)
}

/// Whether [`read`] would answer the trial (nothing printed): a trial
/// answered from the cache needs no reference work.
pub(crate) fn holds(runner: &RunContext, p: &Planned) -> bool {
    lookup(runner, p).is_some()
}

/// The engine settings of this run that change numbers and no case file
/// states: the threads, flash attention, the KV cache type and the GPU
/// layers (the build is keyed by the engine's identity beside it).
fn engine_key(runner: &RunContext) -> String {
    let o = runner.options();
    format!(
        "threads={} flash_attn={} kv={} n_gpu_layers={}",
        runner.threads,
        o.flash_attn,
        o.kv_type,
        o.n_gpu_layers
            .map_or("default".to_string(), |n| n.to_string())
    )
}

/// Why an outcome read back was not made under this run's engine settings
/// and build (a key that collides, or an entry copied under another
/// name, never serves a result made otherwise); None when it was. The
/// threads count only where `threads` says (the result cache keys them;
/// llama.cpp's CPU logits do not change with them, so a report may show a
/// result made with other threads).
pub(crate) fn settings_problem(runner: &RunContext, o: &Outcome, threads: bool) -> Option<String> {
    let build = runner.build_label();
    if o.build.label() != build {
        return Some(format!(
            "it was made by another engine build ({}, this run's is {build})",
            o.build.label()
        ));
    }
    let s = o.settings.as_ref()?;
    let want = runner.options();
    let differ: Vec<String> = [
        ("threads", s.threads.to_string(), runner.threads.to_string()),
        (
            "flash_attn",
            s.flash_attn.to_string(),
            want.flash_attn.to_string(),
        ),
        ("kv_type", s.kv_type.clone(), want.kv_type.clone()),
        (
            "n_gpu_layers",
            format!("{:?}", s.n_gpu_layers),
            format!("{:?}", want.n_gpu_layers),
        ),
    ]
    .into_iter()
    .filter(|(k, got, want)| got != want && (threads || *k != "threads"))
    .map(|(k, got, want)| format!("{k} {got}, this run's {want}"))
    .collect();
    (!differ.is_empty()).then(|| {
        format!(
            "it was made under other engine settings ({})",
            differ.join("; ")
        )
    })
}

fn lookup(runner: &RunContext, p: &Planned) -> Option<(PathBuf, Outcome)> {
    let path = entry(runner, p)?;
    let o = read_entry(&path, crate::core::keys::result_cache_key(runner.config()))
        .filter(|o| o.case == split_test_name(&p.name).0 && o.model == p.model)?;
    let parsed = p.case.as_ref().ok()?;
    if let Some(why) = settings_problem(runner, &o, true) {
        crate::core::progress::say!(
            "quantgate: result cache entry {} is unusable ({why}); running the trial",
            path.display()
        );
        return None;
    }
    if let Err(why) = parsed.kind.recheck(&o) {
        crate::core::progress::say!(
            "quantgate: result cache entry {} is unusable ({why}); running the trial",
            path.display()
        );
        return None;
    }
    runner.verify_inputs(&parsed.case, &p.model).ok()?;
    Some((path, o))
}

/// Record a trial's outcome (what its kind measured). Best effort: a result
/// that cannot be cached is still a result.
pub fn write(runner: &RunContext, p: &Planned, o: &Outcome) {
    let (Some(path), Some(key)) = (
        entry(runner, p),
        crate::core::keys::result_cache_key(runner.config()),
    ) else {
        return;
    };
    if let Ok(mut value) = serde_json::to_value(o) {
        auth::sign(&mut value, key);
        if let Ok(json) = serde_json::to_vec(&value) {
            let _ = crate::core::fsutil::write_sealed(&path, json);
        }
    }
}

/// A recorded outcome, when the entry is intact (sealed), authentic (its
/// MAC verifies with the result-cache key) and parses; a damaged or forged
/// entry is reported and the trial runs again.
fn read_entry(path: &std::path::Path, key: Option<&auth::Key>) -> Option<Outcome> {
    match authentic(path, key) {
        Ok(o) => o,
        Err(why) => {
            crate::core::progress::say!(
                "quantgate: result cache entry {} is unusable ({why}); running the trial",
                path.display()
            );
            None
        }
    }
}

/// The outcome an entry holds: Ok(None) when there is no entry (or no key
/// to authenticate one); Err(why) when it is damaged, forged or unreadable.
fn authentic(
    path: &std::path::Path,
    key: Option<&auth::Key>,
) -> Result<Option<Outcome>, crate::core::error::Malformed> {
    let Some(key) = key else {
        return Ok(None);
    };
    let Some(bytes) = crate::core::fsutil::read_sealed(path)? else {
        return Ok(None);
    };
    let mut value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
    auth::verify(&mut value, key)?;
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| format!("not an outcome: {e}").into())
}

/// The newest recorded outcome of a planned trial by any build of
/// quantgate (`quantgate report` after `cargo test`: the test binary's
/// entries), judged by the case's gates: an entry of the same case bytes,
/// model file and reference file (by sha256), whose pinned inputs verify
/// again. A preregistered
/// case is not answered (its decision needs its ledger checked by a run).
pub fn latest(runner: &RunContext, p: &Planned) -> Option<Outcome> {
    let parsed = p.case.as_ref().ok()?;
    let case = &parsed.case;
    if case.prereg.is_some() {
        return None;
    }
    let (name, model) = (split_test_name(&p.name).0, p.model.as_str());
    let model_sha = runner.registry().entry(model).ok()?.sha256.clone()?;
    let reference = case.reference.as_ref().map(|r| r.0.clone());
    // The reference by content: a file replaced and pinned again under the
    // same alias is another reference, and its old results are not taken.
    let reference_sha = match &reference {
        Some(r) => Some(runner.registry().entry(r).ok()?.sha256.clone()?),
        None => None,
    };
    let dir = runner.config().cache.join("results");
    // A speed result counts only on the machine it was measured on.
    let here = parsed.kind.measures_speed().then(|| runner.machine());
    let mut best: Option<(std::time::SystemTime, Outcome)> = None;
    for e in std::fs::read_dir(&dir).ok()?.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "qgresult") {
            continue;
        }
        let Some(o) = authentic(&path, crate::core::keys::result_cache_key(runner.config()))
            .ok()
            .flatten()
        else {
            continue;
        };
        if let Err(why) = parsed.kind.recheck(&o) {
            crate::core::progress::say!(
                "quantgate: result cache entry {} is unusable ({why}); not reported",
                path.display()
            );
            continue;
        }
        let same = o.case == name
            && o.model == model
            && here.as_ref().is_none_or(|m| m.is_some() && *m == o.machine)
            && o.case_sha256.as_deref() == Some(case.content_sha256.as_str())
            && o.model_sha256.as_deref() == Some(model_sha.as_str())
            && o.reference == reference
            && o.reference_sha256 == reference_sha
            && settings_problem(runner, &o, false).is_none();
        let when = e.metadata().and_then(|m| m.modified()).ok()?;
        if same && best.as_ref().is_none_or(|(t, _)| when > *t) {
            best = Some((when, o));
        }
    }
    let (_, mut o) = best?;
    runner.verify_inputs(case, model).ok()?;
    crate::judge::rejudge(parsed, &mut o);
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Status;

    /// Every single-byte edit of an entry makes it unusable, never a
    /// different outcome; so does an edit sealed again, or a missing MAC.
    #[test]
    fn an_edited_entry_is_never_read_back() {
        let dir = crate::core::scratch::scratch("result-entry");
        let path = dir.join("e.qgresult");
        let build = crate::engine::Engine::build(&crate::engine::fake::FakeEngine::new());
        let mut o = Outcome::new("ppl/x", "m", build);
        o.status = Status::Pass;
        o.metrics.insert("ppl".into(), 31.25);
        o.metrics.insert("windows".into(), 16.0);
        let config = crate::core::config::Config::load().unwrap();
        let key = crate::core::keys::result_cache_key(&config).expect("a result-cache key");
        let mut value = serde_json::to_value(&o).unwrap();
        auth::sign(&mut value, key);
        let json = serde_json::to_vec(&value).unwrap();
        crate::core::fsutil::write_sealed(&path, json.clone()).unwrap();
        let good = std::fs::read(&path).unwrap();
        let back = read_entry(&path, Some(key)).unwrap();
        assert_eq!(back.metrics, o.metrics);
        // Edited and sealed again (the trailing sha256 recomputed, as
        // anyone can): the MAC refuses it. So does an entry with no MAC.
        let forged = String::from_utf8(json)
            .unwrap()
            .replace("\"ppl\":31.25", "\"ppl\":3.25");
        assert!(forged.contains("3.25"));
        crate::core::fsutil::write_sealed(&path, forged.into_bytes()).unwrap();
        assert_eq!(
            authentic(&path, Some(key)).unwrap_err().to_string(),
            format!(
                "its MAC does not verify with the signing key ({}): the file was edited, or \
                 written under another key",
                key.source
            )
        );
        crate::core::fsutil::write_sealed(&path, serde_json::to_vec(&o).unwrap()).unwrap();
        assert!(authentic(&path, Some(key))
            .unwrap_err()
            .to_string()
            .contains("carries no MAC"));
        let mut rng = crate::measure::SplitMix64(7);
        for _ in 0..300 {
            let mut bad = good.clone();
            let at = rng.below(bad.len() as u64) as usize;
            bad[at] ^= 1 << rng.below(8);
            std::fs::write(&path, &bad).unwrap();
            assert!(
                read_entry(&path, Some(key)).is_none(),
                "byte {at} edited, still read"
            );
        }
        std::fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(read_entry(&path, Some(key)).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
