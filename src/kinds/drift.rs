//! `kind = "drift"`: each model through two runtimes (`runtimes = [A, B]`:
//! the llama.cpp quantgate links, `linked`, or a llama-perplexity binary of
//! `<suites>/runtimes.toml`) over the same windows of the same text, and
//! the difference gated: ΔNLL per window (B − A) with its 95% interval,
//! KL(B‖A) per position (mean, p99, max), the top token's agreement, PPL
//! each. Beside every figure its floor: what "no change" measures, the
//! worst of runtime A run twice as it is, and each runtime against itself
//! at another thread count.
//!
//! Contract: both runtimes' logits are compared in llama-perplexity's
//! `--kl-divergence-base` encoding (the linked one's written exactly as
//! the tool writes it), so two builds that compute the same logits give
//! byte-equal rows, `bit_identical = 1` and every figure 0; a runtime is
//! used only as pinned ([`crate::execute::runtime`]), and its identity
//! (sha256, `--version`) keys the result and is recorded with it.

use crate::core::case::{Location, Metric, Pin};
use crate::core::error::{Error, Result};
use crate::core::parse::{case_table, parse_toml, Diagnostics};
use crate::core::{Case, Outcome};
use crate::execute::runtime::{self, External, Job, Registry, LINKED};
use crate::execute::windows::{ScoringPlan, Windowing};
use crate::execute::RunContext;
use crate::kinds::scored_text::{
    BootstrapFile, PinnedFile, ScoredText, Source, TextFile, WindowFile,
};
use crate::kinds::{Kind, Start};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use toml::Spanned;

case_table! {
    struct DriftFile {
        runtimes: Spanned<Vec<Spanned<String>>>,
        text: Option<TextFile>,
        tokens: Option<PinnedFile>,
        window: Spanned<WindowFile>,
        bootstrap: Option<BootstrapFile>,
    }
}

/// A drift case.
#[derive(Debug, Clone)]
pub(crate) struct Drift {
    /// The text and its windows.
    pub text: ScoredText,
    /// Runtime A (the baseline) and runtime B (compared with it).
    pub runtimes: [String; 2],
    /// Where `runtimes` is written.
    pub at: Location,
    /// The suites folder whose `runtimes.toml` declares them.
    pub suites: PathBuf,
}

/// The suites folder of a case file: the nearest folder above it that holds
/// `models.toml`, else the case's own folder.
fn suites_of(file: &Path) -> PathBuf {
    let dir = file.parent().unwrap_or(Path::new("."));
    dir.ancestors()
        .find(|d| d.join("models.toml").is_file())
        .unwrap_or(dir)
        .to_path_buf()
}

/// Drift cases are not a ladder: the report leaves them out (`quantgate
/// drift` prints their table).
pub(crate) fn present() -> Option<crate::core::present::Presentation> {
    None
}

/// Parse the kind's tables.
pub fn parse(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>> {
    let f: DriftFile = parse_toml(diag.path(), src)?;
    let text = ScoredText::parse(
        case,
        f.text.as_ref(),
        f.tokens.as_ref(),
        &f.window,
        f.bootstrap.as_ref(),
        diag,
    )?;
    let at = diag.at(f.runtimes.span().start);
    if !matches!(text.source, Source::Text(_)) {
        diag.push(&at, "a drift case scores a [text]: an external runtime reads the text and tokenizes it itself");
    }
    match &text.windowing {
        Windowing::LlamaPerplexity {
            chunks: Some(_),
            skip: 0,
            ..
        } => {}
        _ => diag.push(
            &text.window_at,
            "window: a drift case takes llama-perplexity's windows (mode = \"llama-perplexity\", \
             `chunks` set, no `skip`): the windows an external runtime's --kl-divergence-base file holds",
        ),
    }
    if let Some((_, r)) = &case.reference {
        diag.push(
            r,
            "reference: a drift case compares each model with itself on another runtime; it takes no reference",
        );
    }
    if case.decide.is_some() {
        diag.push(&at, "decide: a drift case is not decided sequentially");
    }
    let names: Vec<String> = f
        .runtimes
        .get_ref()
        .iter()
        .map(|s| s.get_ref().clone())
        .collect();
    if names.len() != 2 || names[0] == names[1] {
        diag.push(
            &at,
            format!(
                "runtimes: name two different runtimes, A (the baseline) and B (compared with it); got {names:?}"
            ),
        );
    }
    let suites = suites_of(&case.path);
    match Registry::load(&suites) {
        Ok(reg) => {
            for n in f.runtimes.get_ref() {
                if let Err(e) = reg.get(n.get_ref()) {
                    diag.push_at(n.span().start, format!("runtimes: {}", e.message));
                }
            }
        }
        Err(e) => diag.push(&at, format!("runtimes: {}", e.message)),
    }
    let mut runtimes = [String::new(), String::new()];
    for (slot, n) in runtimes.iter_mut().zip(names) {
        *slot = n;
    }
    Ok(Arc::new(Drift {
        text,
        runtimes,
        at,
        suites,
    }))
}

/// The figures of one comparison, and of the floors, as metric names.
const FIGURES: &[&str] = &[
    "nll_mean_a",
    "nll_mean_b",
    "ppl_a",
    "ppl_b",
    "delta_nll_mean",
    "delta_nll_ci95_lo",
    "delta_nll_ci95_hi",
    "kld_mean",
    "kld_p99",
    "kld_max",
    "kld_rev_mean",
    "same_top",
    "same_top_wilson95_lo",
    "same_top_wilson95_hi",
    "floor_delta_nll",
    "floor_kld_mean",
    "floor_kld_p99",
    "floor_kld_max",
    "floor_same_top",
];

/// The counts.
const COUNTS: &[&str] = &[
    "windows",
    "positions",
    "rows_identical",
    "bit_identical",
    "floor_bit_identical",
];

/// What a reader calls a drift case's metrics, and their units.
pub(crate) const DRIFT_ABOUT: crate::core::case::About = &[
    ("windows", "windows", ""),
    ("positions", "positions compared", "positions"),
    (
        "rows_identical",
        "positions whose rows are byte-equal",
        "positions",
    ),
    ("bit_identical", "every row byte-equal (1) or not (0)", ""),
    ("nll_mean_a", "NLL mean on runtime A", "nats/token"),
    ("nll_mean_b", "NLL mean on runtime B", "nats/token"),
    ("ppl_a", "PPL on runtime A", ""),
    ("ppl_b", "PPL on runtime B", ""),
    ("delta_nll_mean", "ΔNLL (B − A)", "nats/token"),
    (
        "delta_nll_ci95_lo",
        "ΔNLL (B − A), 95% CI lower bound",
        "nats/token",
    ),
    (
        "delta_nll_ci95_hi",
        "ΔNLL (B − A), 95% CI upper bound",
        "nats/token",
    ),
    ("kld_mean", "KLD(B ‖ A) mean", "nats"),
    ("kld_p99", "KLD(B ‖ A) p99", "nats"),
    ("kld_max", "KLD(B ‖ A) max", "nats"),
    ("kld_rev_mean", "KLD(A ‖ B) mean", "nats"),
    ("same_top", "same top token", ""),
    (
        "same_top_wilson95_lo",
        "same top token, Wilson 95% lower bound",
        "",
    ),
    (
        "same_top_wilson95_hi",
        "same top token, Wilson 95% upper bound",
        "",
    ),
    (
        "floor_delta_nll",
        "floor of |ΔNLL| (A twice; each runtime at another thread count)",
        "nats/token",
    ),
    ("floor_kld_mean", "floor of KLD mean", "nats"),
    ("floor_kld_p99", "floor of KLD p99", "nats"),
    ("floor_kld_max", "floor of KLD max", "nats"),
    ("floor_same_top", "floor of same top token", ""),
    (
        "floor_bit_identical",
        "each runtime byte-equal to itself (1) or not (0)",
        "",
    ),
];

/// A runtime ready to produce base files.
#[derive(Debug, Clone)]
pub enum Ready {
    /// The llama.cpp quantgate links.
    Linked(String),
    /// An external binary, verified.
    External(External),
}

impl Ready {
    /// What a result records of it, and its cache key holds.
    pub fn identity(&self) -> String {
        match self {
            Ready::Linked(label) => format!("{LINKED} ({label})"),
            Ready::External(e) => e.identity(),
        }
    }
}

/// Runtime `name` of the suites folder `suites`, verified.
pub fn ready(suites: &Path, name: &str, cx_label: &str) -> Result<Ready> {
    match Registry::load(suites)?.get(name)? {
        None => Ok(Ready::Linked(cx_label.to_string())),
        Some(d) => d.resolve().map(Ready::External),
    }
}

/// What one model's drift measured: the figures, the per-window ΔNLL, and
/// how long each runtime took (seconds).
#[derive(Debug, Clone)]
pub struct Measured {
    /// The metrics ([`FIGURES`], [`COUNTS`]).
    pub metrics: BTreeMap<String, f64>,
    /// ΔNLL (B − A) per window.
    pub per_window: Vec<f64>,
    /// Seconds each runtime took for its first base file.
    pub seconds: [f64; 2],
}

/// Measure the drift of runtime `b` against `a` on `model` (loaded, at
/// `model_file`), over `plan` of the text at `text`, with the floors
/// (A run twice; each runtime again at another thread count). Base files go in a
/// folder of their own under `work`, removed after.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    cx: &RunContext,
    tx: &ScoredText,
    model: &dyn crate::engine::LoadedModel,
    model_file: &Path,
    plan: &ScoringPlan,
    runtimes: [&Ready; 2],
    work: &Path,
) -> Result<Measured> {
    std::fs::create_dir_all(work).map_err(|e| Error::io(work, e))?;
    let dir = tempfile::Builder::new()
        .prefix("drift-")
        .tempdir_in(work)
        .map_err(|e| Error::io(work, e))?;
    let threads = cx.threads.max(1);
    let other = if threads > 1 { 1 } else { 2 };
    let job = |t: u32| Job {
        model: model_file,
        text: &tx.pin.path,
        n_ctx: plan.n_ctx,
        chunks: plan.windows.len(),
        n_batch: tx.n_batch,
        threads: t,
    };
    let bar = crate::core::progress::bar(
        5,
        &format!("drift {}", model.info().file.alias),
        "base files",
    );
    let produce = |r: &Ready, t: u32, name: &str| -> Result<PathBuf> {
        let out = dir.path().join(name);
        match r {
            Ready::Linked(_) => {
                let settings = tx.settings(t, cx.options());
                runtime::linked_base_file(model, &settings, plan, &out)?;
            }
            Ready::External(e) => e.base_file(&job(t), &out)?,
        }
        bar.inc(1);
        Ok(out)
    };
    let mut seconds = [0.0; 2];
    let t0 = Instant::now();
    let a = produce(runtimes[0], threads, "a.kld")?;
    seconds[0] = t0.elapsed().as_secs_f64();
    // The floor: A run twice as it is, then A and B each at another
    // thread count; the worst of the three is what "no change" measures.
    let again = produce(runtimes[0], threads, "a-again.kld")?;
    let floor_repeat = runtime::compare(&a, &again, plan)?.metrics();
    let _ = std::fs::remove_file(&again);
    let a2 = produce(runtimes[0], other, "a2.kld")?;
    let floor_a = runtime::compare(&a, &a2, plan)?.metrics();
    let _ = std::fs::remove_file(&a2);
    let t0 = Instant::now();
    let b = produce(runtimes[1], threads, "b.kld")?;
    seconds[1] = t0.elapsed().as_secs_f64();
    let drift = runtime::compare(&a, &b, plan)?;
    let _ = std::fs::remove_file(&a);
    let b2 = produce(runtimes[1], other, "b2.kld")?;
    let floor_b = runtime::compare(&b, &b2, plan)?.metrics();
    bar.finish_and_clear();
    let mut metrics = drift.metrics();
    let worst = |k: &str, pick: fn(f64, f64) -> f64| {
        let all = [&floor_repeat, &floor_a, &floor_b].map(|m| m.get(k).copied());
        // A floor missing from any run is no floor (never a zero).
        all.iter()
            .try_fold(None, |acc: Option<f64>, v| {
                v.map(|v| Some(acc.map_or(v, |a| pick(a, v))))
            })
            .flatten()
    };
    let floors = [
        (
            "floor_delta_nll",
            worst("delta_nll_mean", |x, y| x.abs().max(y.abs())),
        ),
        ("floor_kld_mean", worst("kld_mean", f64::max)),
        ("floor_kld_p99", worst("kld_p99", f64::max)),
        ("floor_kld_max", worst("kld_max", f64::max)),
        ("floor_same_top", worst("same_top", f64::min)),
        ("floor_bit_identical", worst("bit_identical", f64::min)),
    ];
    for (k, v) in floors {
        if let Some(v) = v {
            metrics.insert(k.to_string(), v);
        }
    }
    Ok(Measured {
        metrics,
        per_window: drift.per_window(),
        seconds,
    })
}

impl Kind for Drift {
    fn about(&self) -> crate::core::case::About {
        DRIFT_ABOUT
    }

    fn metrics(&self) -> Vec<Metric> {
        crate::core::case::metrics_of(FIGURES, &[])
            .into_iter()
            .chain(crate::core::case::metrics_of(COUNTS, COUNTS))
            .collect()
    }

    fn headline(&self) -> Vec<&'static str> {
        vec![
            "ppl_a",
            "ppl_b",
            "delta_nll_mean",
            "kld_mean",
            "kld_max",
            "same_top",
            "bit_identical",
            "floor_kld_max",
        ]
    }

    fn pins(&self) -> Vec<Pin> {
        vec![self.text.pin.clone()]
    }

    fn windows(&self) -> Option<(Option<usize>, Location)> {
        Some(self.text.declared_windows())
    }

    fn weight(&self) -> usize {
        4 * self.text.weight()
    }

    /// The runtimes' identities: two runtimes never share a result.
    fn run_key(&self, cx: &RunContext) -> Option<String> {
        let label = cx.engine().build().label();
        let ids: Option<Vec<String>> = self
            .runtimes
            .iter()
            .map(|n| ready(&self.suites, n, &label).ok().map(|r| r.identity()))
            .collect();
        ids.map(|ids| format!("runtimes {}", ids.join(" | ")))
    }

    /// Measured whole here: both runtimes' base files and the floors.
    fn start(
        &self,
        cx: &RunContext,
        _case: &Case,
        alias: &str,
        out: &mut Outcome,
    ) -> Result<Start> {
        let (_src, model, plan) = self.text.prepare(cx, alias, out)?;
        let label = cx.engine().build().label();
        let ready_of = |n: &str| {
            ready(&self.suites, n, &label).map_err(|e| e.context(format!("{}: runtimes", self.at)))
        };
        let (a, b) = (ready_of(&self.runtimes[0])?, ready_of(&self.runtimes[1])?);
        out.runtimes = vec![
            format!("A: {}", a.identity()),
            format!("B: {}", b.identity()),
        ];
        let file = model.info().file.path.clone();
        let t = Instant::now();
        let m = measure(
            cx,
            &self.text,
            &*model,
            &file,
            &plan,
            [&a, &b],
            &cx.config().cache.join("runtime-runs"),
        )?;
        out.timings.decode = t.elapsed();
        out.metrics.extend(m.metrics);
        out.series
            .insert("delta_nll_per_window".into(), m.per_window);
        Ok(Start::Done)
    }
}
