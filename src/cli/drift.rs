//! `quantgate drift --runtime A --runtime B --model …`: each model through
//! two runtimes over the same windows of a text (WikiText-2 test unless
//! `--text`), as a drift case measures it (`kinds::drift::measure`), printed
//! as a table with the floor beside each figure; `quantgate runtimes`: the
//! declared runtimes, each verified.
//!
//! Exit 0: every model within the build-upgrade gates (KLD(B‖A) mean ≤
//! 1e-4, the ΔNLL 95% interval inside ±0.002); 1: beyond them, or a
//! runtime failed on a model; 2: unusable input (a runtime not declared,
//! not as pinned, not llama-perplexity-compatible; a model or text that
//! cannot be used).

use super::args::{DriftArgs, RuntimesArgs};
use super::{Conclusion, Ctx};
use quantgate::core::case::{Location, Pin};
use quantgate::core::Error;
use quantgate::engine::BosPolicy;
use quantgate::execute::runtime::{Registry, LINKED};
use quantgate::execute::windows::Windowing;
use quantgate::kinds::drift::{measure, ready, Ready};
use quantgate::kinds::scored_text::{Bootstrap, ScoredText, Source};
use std::fmt::Write as _;

/// The build-upgrade gates: KLD(B‖A) mean at most this.
pub const KLD_MEAN_MAX: f64 = 1e-4;
/// … and the ΔNLL 95% interval inside ± this (nats/token).
pub const DELTA_NLL_BAND: f64 = 0.002;

/// Run `quantgate runtimes`.
pub fn runtimes(ctx: &Ctx, a: RuntimesArgs) -> Result<Conclusion, Error> {
    let reg = Registry::load(&ctx.suites)?;
    let names: Vec<String> = if a.names.is_empty() {
        std::iter::once(LINKED.to_string())
            .chain(reg.entries.keys().cloned())
            .collect()
    } else {
        a.names.clone()
    };
    let mut end = Conclusion::Pass;
    for n in &names {
        match ready(&ctx.suites, n, &ctx.label()) {
            Ok(Ready::Linked(label)) => println!("{n:<12} ok  linked: {label}"),
            Ok(Ready::External(e)) => println!(
                "{n:<12} ok  {} sha256 {} ({})",
                e.path.display(),
                e.sha256,
                e.version
            ),
            Err(e) => end = end.max(super::said(&e)),
        }
    }
    Ok(end)
}

/// Run `quantgate drift`.
pub fn run(ctx: &Ctx, a: DriftArgs) -> Result<Conclusion, Error> {
    let [ra, rb] = match &a.runtimes[..] {
        [x, y] if x != y => [x.clone(), y.clone()],
        _ => {
            return Err(Error::input(format!(
                "--runtime: name two different runtimes, A then B (got {:?})",
                a.runtimes
            )))
        }
    };
    if a.n_ctx < 8 || !a.n_ctx.is_multiple_of(2) || a.chunks == 0 {
        return Err(Error::input(format!(
            "--n-ctx {} --chunks {}: an even window of at least 8 tokens, at least one chunk",
            a.n_ctx, a.chunks
        )));
    }
    // Both runtimes first: a bad one is said before any model loads.
    let label = ctx.label();
    let runtime_a = ready(&ctx.suites, &ra, &label)?;
    let runtime_b = ready(&ctx.suites, &rb, &label)?;
    let overrides = ctx.overrides(&a.models, None)?;
    let aliases = overrides.models.clone().unwrap_or(a.models.clone());
    let registry = ctx.registry()?;
    for m in &aliases {
        registry.entry(m)?;
    }
    let cache = ctx.config.cache.clone();
    let text = match &a.text {
        Some(t) => t.clone(),
        None => {
            let p = cache.join("runtime-runs").join("wikitext-2-test.txt");
            if !p.is_file() {
                quantgate::core::fsutil::write_atomic(&p, super::init::WIKITEXT)?;
            }
            p
        }
    };
    let bytes = std::fs::read(&text)
        .map_err(|e| Error::input(format!("--text {}: {e}", text.display())))?;
    let sha = quantgate::core::fsutil::sha256_bytes(&bytes);
    let tx = ScoredText {
        source: Source::Text(BosPolicy::Model),
        pin: Pin {
            table: "text",
            path: text.clone(),
            sha256: sha.clone(),
            at: Location("--text".into()),
        },
        windowing: Windowing::LlamaPerplexity {
            n_ctx: a.n_ctx,
            chunks: Some(a.chunks),
            skip: 0,
        },
        window_at: Location("--n-ctx".into()),
        n_batch: a.n_ctx.min(512),
        bootstrap: Bootstrap::default(),
    };
    let mut cx = ctx.runner(registry);
    if let Some(t) = a.threads {
        cx.threads = t.max(1);
    }
    let src = tx.pin.read_text()?;
    println!("quantgate drift: A = {}", runtime_a.identity());
    println!("                 B = {}", runtime_b.identity());
    println!(
        "{} (sha256 {sha}), {} windows of {} tokens, {} threads; floor: A run twice, and each runtime against itself at {} thread(s)",
        text.display(),
        a.chunks,
        a.n_ctx,
        cx.threads,
        if cx.threads > 1 { 1 } else { 2 }
    );
    println!(
        "gates: KLD(B‖A) mean ≤ {KLD_MEAN_MAX:e} (a build upgrade moves logits by rounding only), \
         ΔNLL 95% CI inside ±{DELTA_NLL_BAND} nats/token (no change a reader of a PPL table would see)\n"
    );
    let mut rows: Vec<Vec<String>> = vec![[
        "model",
        "PPL A",
        "PPL B",
        "ΔNLL B−A [95% CI] (floor)",
        "KLD mean (floor)",
        "KLD p99 (floor)",
        "KLD max (floor)",
        "same top % (floor)",
        "bit-equal",
        "A s",
        "B s",
        "verdict",
    ]
    .map(String::from)
    .into()];
    let mut end = Conclusion::Pass;
    let mut json = Vec::new();
    for alias in &aliases {
        let got = (|| {
            let (verified, model) = cx.load(alias)?;
            tx.check_context(&*model)?;
            let plan = tx.plan_for(&cx, &src, &*model)?;
            measure(
                &cx,
                &tx,
                &*model,
                &verified.file.path,
                &plan,
                [&runtime_a, &runtime_b],
                &cache.join("runtime-runs"),
            )
        })();
        let m = match got {
            Ok(m) => m,
            Err(e) => {
                end = end.max(super::said(&e.context(alias)));
                continue;
            }
        };
        let g = |k: &str| m.metrics.get(k).copied().unwrap_or(f64::NAN);
        let sig = quantgate::golden::review::sig;
        let within = g("kld_mean") <= KLD_MEAN_MAX
            && g("delta_nll_ci95_lo") >= -DELTA_NLL_BAND
            && g("delta_nll_ci95_hi") <= DELTA_NLL_BAND;
        if !within {
            end = end.max(Conclusion::Fail);
        }
        rows.push(vec![
            alias.clone(),
            format!("{:.4}", g("ppl_a")),
            format!("{:.4}", g("ppl_b")),
            format!(
                "{:+.6} [{:+.6}, {:+.6}] ({})",
                g("delta_nll_mean"),
                g("delta_nll_ci95_lo"),
                g("delta_nll_ci95_hi"),
                sig(g("floor_delta_nll"))
            ),
            format!("{} ({})", sig(g("kld_mean")), sig(g("floor_kld_mean"))),
            format!("{} ({})", sig(g("kld_p99")), sig(g("floor_kld_p99"))),
            format!("{} ({})", sig(g("kld_max")), sig(g("floor_kld_max"))),
            format!(
                "{:.2} ({:.2})",
                100.0 * g("same_top"),
                100.0 * g("floor_same_top")
            ),
            if g("bit_identical") == 1.0 {
                "yes"
            } else {
                "no"
            }
            .into(),
            format!("{:.1}", m.seconds[0]),
            format!("{:.1}", m.seconds[1]),
            if within { "✓ within" } else { "✗ beyond" }.into(),
        ]);
        json.push(serde_json::json!({
            "model": alias,
            "metrics": m.metrics,
            "delta_nll_per_window": m.per_window,
            "seconds": m.seconds,
            "within": within,
        }));
    }
    print!("{}", table(&rows));
    if let Some(p) = &a.json {
        let doc = serde_json::json!({
            "a": runtime_a.identity(),
            "b": runtime_b.identity(),
            "text": text.display().to_string(),
            "text_sha256": sha,
            "n_ctx": a.n_ctx,
            "chunks": a.chunks,
            "threads": cx.threads,
            "models": json,
        });
        quantgate::core::fsutil::write_atomic(
            p,
            serde_json::to_string_pretty(&doc)
                .unwrap_or_default()
                .as_bytes(),
        )?;
    }
    Ok(end)
}

/// `rows` (the first the header) as a Markdown table.
fn table(rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(s, "| {} |", r.join(" | "));
        if i == 0 {
            let _ = writeln!(s, "|{}|", vec!["---"; r.len()].join("|"));
        }
    }
    s
}
