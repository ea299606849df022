//! `kind = "speed"`: prompt processing (`pp`, n tokens in batches of
//! n_batch) and token generation (`tg`, n tokens one `llama_decode` each)
//! in tokens per second, as llama-bench measures them (a warm-up run,
//! memory cleared before each repetition, t/s mean ± sd over repetitions),
//! with the file's bytes and bits per weight beside them.
//!
//! Contract: with a reference model, the candidate and the reference are
//! measured apart in `rounds`, in rotated order (the candidate first in even
//! rounds, the reference first in odd ones), and each round gives a ratio
//! candidate / reference of mean t/s; noise a shared machine adds to a
//! round cancels in its ratio. A case's candidates that run in one group
//! are measured together: each round measures every candidate and then the
//! reference once, that order rotated by one each round (one candidate:
//! the order above), so k candidates take k + 1 measurements a round, not
//! 2k. The ratio's interval is a Student-t interval
//! over rounds of ln(ratio). Speed metrics are measurements (goldens compare
//! them within a wide tolerance; gates on the ratios carry the decision). A
//! result is given again from the result cache only for the same
//! executable, files, settings and machine (CPU, CPUs, memory, host, the
//! engine's devices); `--no-cache` measures again.

use crate::core::case::{Metric, MetricType};
use crate::core::error::Result;
use crate::core::parse::{case_table, parse_toml, Diagnostics};
use crate::core::present::{Cell, Join, Presentation, ReportColumn};
use crate::core::{Case, Outcome, Settings};
use crate::engine::{BenchTest, LoadedModel};
use crate::execute::RunContext;
use crate::kinds::{Kind, Start};
use crate::measure::t_interval95;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toml::Spanned;

/// A `kind = "speed"` case.
#[derive(Debug, Clone)]
pub(crate) struct Speed {
    /// Prompt tokens of the `pp` test (0: none).
    pub pp: usize,
    /// Generated tokens of the `tg` test (0: none).
    pub tg: usize,
    /// Repetitions per model per round.
    pub repetitions: usize,
    /// Rounds (each measures every candidate and the reference once).
    pub rounds: usize,
    /// Logical and physical batch of `pp`.
    pub n_batch: u32,
    /// A warm-up run before each measurement.
    pub warmup: bool,
    /// The reference model, for ratios.
    pub reference: Option<(String, crate::core::Location)>,
}

case_table! {
    struct SpeedFile {
        pp: Option<Spanned<usize>>,
        tg: Option<Spanned<usize>>,
        repetitions: Option<Spanned<usize>>,
        rounds: Option<Spanned<usize>>,
        n_batch: Option<Spanned<u32>>,
        warmup: Option<bool>,
    }
}

/// Parse the kind's keys.
pub fn parse(case: &Case, src: &str, diag: &mut Diagnostics) -> Result<Arc<dyn Kind>> {
    let f: SpeedFile = parse_toml(diag.path(), src)?;
    let get = |v: &Option<Spanned<usize>>, d: usize| v.as_ref().map_or(d, |x| *x.get_ref());
    let k = Speed {
        pp: get(&f.pp, 512),
        tg: get(&f.tg, 128),
        repetitions: get(&f.repetitions, 5),
        rounds: get(&f.rounds, 3),
        n_batch: f.n_batch.as_ref().map_or(512, |n| *n.get_ref()),
        warmup: f.warmup.unwrap_or(true),
        reference: case.reference.clone(),
    };
    if k.pp == 0 && k.tg == 0 {
        diag.push_at(0, "pp, tg: at least one of them must be ≥ 1");
    }
    for (v, key, min) in [(&f.repetitions, "repetitions", 2), (&f.rounds, "rounds", 1)] {
        if let Some(v) = v.as_ref().filter(|v| *v.get_ref() < min) {
            diag.push_at(
                v.span().start,
                format!("{key}: {} must be ≥ {min}", v.get_ref()),
            );
        }
    }
    if k.reference.is_some() && k.rounds < 2 {
        diag.push_at(
            f.rounds.as_ref().map_or(0, |r| r.span().start),
            "rounds: a ratio to the reference needs ≥ 2 rounds for its interval",
        );
    }
    if let Some(n) = f.n_batch.as_ref().filter(|n| *n.get_ref() == 0) {
        diag.push_at(n.span().start, "n_batch: must be ≥ 1");
    }
    Ok(Arc::new(k))
}

/// The tests of a case: (name, test).
fn tests(k: &Speed) -> Vec<(&'static str, BenchTest, usize)> {
    let mut t = Vec::new();
    if k.pp > 0 {
        t.push(("pp", BenchTest::Prompt(k.pp), k.pp));
    }
    if k.tg > 0 {
        t.push(("tg", BenchTest::Generate(k.tg), k.tg));
    }
    t
}

/// Mean and sample standard deviation (0 for one value).
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Tokens per second of each repetition.
pub(crate) fn tps(tokens: usize, times: &[Duration]) -> Vec<f64> {
    times
        .iter()
        .map(|t| tokens as f64 / t.as_secs_f64())
        .collect()
}

/// The ratio of per-round means (candidate / reference): its geometric mean
/// over rounds and the Student-t 95% interval of ln(ratio), exponentiated.
pub(crate) fn round_ratio(cand: &[Vec<f64>], reference: &[Vec<f64>]) -> (f64, f64, f64) {
    let logs: Vec<f64> = cand
        .iter()
        .zip(reference)
        .map(|(c, r)| (mean_sd(c).0 / mean_sd(r).0).ln())
        .collect();
    let (m, lo, hi) = t_interval95(&logs);
    (m.exp(), lo.exp(), hi.exp())
}

impl Speed {
    fn settings(
        &self,
        model: &dyn LoadedModel,
        threads: u32,
        options: &crate::core::EngineOptions,
    ) -> Settings {
        let need = (self.pp.max(self.tg + 1)).next_multiple_of(256) as u32;
        let mut s = Settings::new(need.min(model.info().n_ctx_train.max(256)), threads)
            .with_options(options);
        s.n_batch = self.n_batch.min(s.n_ctx);
        s
    }
}

/// `mean [lo, hi]`: a t/s mean with its 95% Student-t interval over the
/// case's measurements (`repetitions` in each of `rounds`, whose sd is `sd`).
fn tps_ci(m: &crate::core::present::Metrics, mean: &str, sd: &str) -> Option<String> {
    let (x, s) = (*m.get(mean)?, *m.get(sd)?);
    let n = *m.get("repetitions")? * m.get("rounds").copied().unwrap_or(1.0);
    let (lo, hi) = crate::measure::stats::t_interval95_of(x, s, n as usize);
    Some(if lo.is_finite() {
        format!("{x:.1} [{lo:.1}, {hi:.1}]")
    } else {
        format!("{x:.1}")
    })
}

/// How speed cases show in the ladder report: beside every view's row of
/// the same model, prompt processing and generation t/s with the 95%
/// interval of the mean over the repetitions (the CSV has mean and sd, and
/// the ratios to the reference); the machine they were measured on is said
/// under the table.
pub(crate) fn present() -> Option<Presentation> {
    let tps = |title, cell: fn(&crate::core::present::Metrics) -> Option<String>, mean, sd| {
        let mut c = ReportColumn::new(title, Cell::Text(cell)).headline();
        c.csv = vec![
            (mean, crate::core::present::Field::Metric(mean)),
            (sd, crate::core::present::Field::Metric(sd)),
        ];
        c
    };
    Some(Presentation {
        kind: "speed",
        join: Join::Model,
        columns: vec![
            tps(
                "pp t/s [95% CI]",
                |m| tps_ci(m, "pp_tps_mean", "pp_tps_sd"),
                "pp_tps_mean",
                "pp_tps_sd",
            ),
            tps(
                "tg t/s [95% CI]",
                |m| tps_ci(m, "tg_tps_mean", "tg_tps_sd"),
                "tg_tps_mean",
                "tg_tps_sd",
            ),
            ReportColumn::csv_only(&["pp_ratio_vs_ref", "tg_ratio_vs_ref"]),
        ],
        plots: Vec::new(),
        legend: vec![
            "pp/tg t/s: a speed case's prompt processing and generation, the mean over its \
             repetitions with its 95% Student-t interval; the machine is named under the table.",
        ],
        align: None,
        hub: vec![],
        reference: vec![],
        unit: None,
    })
}

/// What a reader calls a speed case's metrics, and their units.
pub(crate) const SPEED_ABOUT: crate::core::case::About = &[
    ("model_bytes", "model size", "bytes"),
    ("model_bpw", "bits per weight", ""),
    ("repetitions", "repetitions per round", ""),
    ("rounds", "rounds", ""),
    ("pp_tokens", "prompt tokens", "tokens"),
    ("pp_tps_mean", "pp t/s", "t/s"),
    ("pp_tps_sd", "pp t/s standard deviation", "t/s"),
    ("pp_ref_tps_mean", "the reference's pp t/s", "t/s"),
    ("pp_ratio_vs_ref", "pp speed ÷ the reference's", ""),
    (
        "pp_ratio_vs_ref_ci95_lo",
        "pp speed ÷ the reference's, 95% CI lower bound",
        "",
    ),
    (
        "pp_ratio_vs_ref_ci95_hi",
        "pp speed ÷ the reference's, 95% CI upper bound",
        "",
    ),
    ("tg_tokens", "generated tokens", "tokens"),
    ("tg_tps_mean", "tg t/s", "t/s"),
    ("tg_tps_sd", "tg t/s standard deviation", "t/s"),
    ("tg_ref_tps_mean", "the reference's tg t/s", "t/s"),
    ("tg_ratio_vs_ref", "tg speed ÷ the reference's", ""),
    (
        "tg_ratio_vs_ref_ci95_lo",
        "tg speed ÷ the reference's, 95% CI lower bound",
        "",
    ),
    (
        "tg_ratio_vs_ref_ci95_hi",
        "tg speed ÷ the reference's, 95% CI upper bound",
        "",
    ),
];

impl Kind for Speed {
    fn about(&self) -> crate::core::case::About {
        SPEED_ABOUT
    }

    fn metrics(&self) -> Vec<Metric> {
        let m = |n: String, ty| Metric::new(n, ty);
        let mut out = vec![
            Metric::count("model_bytes"),
            Metric::float("model_bpw"),
            Metric::count("repetitions"),
            Metric::count("rounds"),
        ];
        for (name, _, _) in tests(self) {
            out.push(Metric::count(format!("{name}_tokens")));
            for s in ["tps_mean", "tps_sd"] {
                out.push(m(format!("{name}_{s}"), MetricType::Measurement));
            }
            if self.reference.is_some() {
                for s in [
                    "ref_tps_mean",
                    "ratio_vs_ref",
                    "ratio_vs_ref_ci95_lo",
                    "ratio_vs_ref_ci95_hi",
                ] {
                    out.push(m(format!("{name}_{s}"), MetricType::Measurement));
                }
            }
        }
        out
    }

    fn headline(&self) -> Vec<&'static str> {
        vec![
            "pp_tps_mean",
            "pp_tps_sd",
            "tg_tps_mean",
            "tg_tps_sd",
            "pp_ratio_vs_ref",
            "tg_ratio_vs_ref",
            "model_bytes",
            "model_bpw",
        ]
    }

    fn measures_speed(&self) -> bool {
        true
    }

    /// With a reference: the case's candidates run in one group, measured
    /// together ([`Kind::start_together`]).
    fn runs_jointly(&self) -> bool {
        self.reference.is_some()
    }

    /// Every round runs each model (the candidate, and the reference) a
    /// warm-up and `repetitions` times: `pp` rows in batches, and `tg`
    /// one-row passes, each about two batched rows' time on a CPU.
    fn weight(&self) -> usize {
        let models = 1 + usize::from(self.reference.is_some());
        let runs = self.repetitions + usize::from(self.warmup);
        self.rounds * models * runs * (self.pp + 2 * self.tg)
    }

    /// Measured whole here: the candidate (and the reference) in rounds.
    fn start(&self, cx: &RunContext, case: &Case, alias: &str, out: &mut Outcome) -> Result<Start> {
        let t = Instant::now();
        let model = self.begin(cx, alias, out)?;
        let reference = self.reference_model(cx)?;
        out.timings.prepare = t.elapsed();
        let t = Instant::now();
        let measured = self.measure(cx, case, &[&*model], reference.as_deref())?;
        self.record(&mut out.metrics, &measured, 0);
        out.timings.decode = t.elapsed();
        Ok(Start::Done)
    }

    /// A case's candidates in one group are measured together: each round
    /// measures every candidate and the reference once, in an order rotated
    /// by one each round, so the reference is measured once a round for
    /// all of them rather than again beside each (k candidates: k + 1
    /// measurements a round instead of 2k). With one candidate this is
    /// [`Kind::start`]'s order exactly.
    fn start_together(
        &self,
        cx: &RunContext,
        case: &Case,
        aliases: &[&str],
        outs: &mut [&mut Outcome],
    ) -> Option<Vec<Result<Start>>> {
        if self.reference.is_none() || aliases.len() < 2 {
            return None;
        }
        let t = Instant::now();
        let mut results: Vec<Result<Start>> = Vec::with_capacity(aliases.len());
        let mut models = Vec::new();
        for (i, alias) in aliases.iter().enumerate() {
            match self.begin(cx, alias, outs[i]) {
                Ok(m) => {
                    models.push((i, m));
                    results.push(Ok(Start::Done));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        let reference = self.reference_model(cx);
        let prepare = t.elapsed();
        let t = Instant::now();
        let cands: Vec<&dyn LoadedModel> = models.iter().map(|(_, m)| &**m).collect();
        let measured = reference.and_then(|r| self.measure(cx, case, &cands, r.as_deref()));
        let decode = t.elapsed();
        for (k, (i, _)) in models.iter().enumerate() {
            let out = &mut outs[*i];
            out.timings.prepare = prepare;
            match &measured {
                Ok(m) => {
                    self.record(&mut out.metrics, m, k);
                    out.timings.decode = decode;
                    out.timings.shared_with = (models.len() - 1) as u32;
                }
                Err(e) => results[*i] = Err(e.clone()),
            }
        }
        Some(results)
    }
}

/// A case's measurements: per test (name, tokens), each candidate's t/s
/// per round and repetition, and the reference's.
struct Measured {
    tests: Vec<(&'static str, usize, Vec<Rounds>, Rounds)>,
}

/// t/s of each repetition, per round.
type Rounds = Vec<Vec<f64>>;

impl Speed {
    /// Load candidate `alias` and fill what its outcome says before any
    /// measurement: its file's sha256, bytes and bits per weight, the
    /// settings, the machine, the repetitions and rounds.
    fn begin(
        &self,
        cx: &RunContext,
        alias: &str,
        out: &mut Outcome,
    ) -> Result<Arc<dyn LoadedModel>> {
        let (verified, model) = cx.load(alias)?;
        out.model_sha256 = Some(verified.file.sha256.clone());
        out.settings = Some(self.settings(&*model, cx.threads, cx.options()));
        out.machine = cx.machine();
        let m = &mut out.metrics;
        m.insert("model_bytes".into(), verified.bytes as f64);
        let tensor_bytes = verified
            .header
            .types
            .values()
            .try_fold(0u64, |a, t| t.bytes.map(|b| a + b));
        if let Some(b) = tensor_bytes.filter(|_| verified.header.n_params > 0) {
            m.insert(
                "model_bpw".into(),
                b as f64 * 8.0 / verified.header.n_params as f64,
            );
        }
        m.insert("repetitions".into(), self.repetitions as f64);
        m.insert("rounds".into(), self.rounds as f64);
        Ok(model)
    }

    /// The reference model, loaded (None without one).
    fn reference_model(&self, cx: &RunContext) -> Result<Option<Arc<dyn LoadedModel>>> {
        match &self.reference {
            Some((r, at)) => Ok(Some(
                cx.load(r)
                    .map_err(|e| e.context(format!("{at}: reference")))?
                    .1,
            )),
            None => Ok(None),
        }
    }

    /// Every test in `rounds`: in round r the candidates, then the
    /// reference, rotated left by r (one candidate: the candidate first
    /// in even rounds, the reference first in odd ones).
    fn measure(
        &self,
        cx: &RunContext,
        case: &Case,
        cands: &[&dyn LoadedModel],
        reference: Option<&dyn LoadedModel>,
    ) -> Result<Measured> {
        // Who is measured, in round 0's order: candidate i, then None for
        // the reference.
        let order: Vec<Option<usize>> = (0..cands.len())
            .map(Some)
            .chain(reference.map(|_| None))
            .collect();
        let names: Vec<String> = cands.iter().map(|m| m.info().file.alias.clone()).collect();
        let bar = crate::core::progress::bar(
            (tests(self).len() * self.rounds * order.len()) as u64,
            &format!("speed {}", names.join(", ")),
            "runs",
        );
        let mut out = Measured { tests: Vec::new() };
        for (name, test, tokens) in tests(self) {
            let mut cand: Vec<Rounds> = vec![Vec::new(); cands.len()];
            let mut refr: Rounds = Vec::new();
            for round in 0..self.rounds {
                let seed = round as u64;
                let measure = |who: &dyn LoadedModel| -> Result<Vec<f64>> {
                    bar.inc(1);
                    let s = self.settings(who, cx.threads, cx.options());
                    who.bench(&s, test, self.repetitions, self.warmup, seed)
                        .map(|t| tps(tokens, &t))
                        .map_err(|e| e.context(case.path.display()))
                };
                for step in 0..order.len() {
                    match (order[(round + step) % order.len()], reference) {
                        (Some(c), _) => cand[c].push(measure(cands[c])?),
                        (None, Some(r)) => refr.push(measure(r)?),
                        (None, None) => unreachable!("no reference, no None"),
                    }
                }
            }
            out.tests.push((name, tokens, cand, refr));
        }
        Ok(out)
    }

    /// Candidate `c`'s metrics from `measured`.
    fn record(&self, m: &mut crate::core::present::Metrics, measured: &Measured, c: usize) {
        for (name, tokens, cands, refr) in &measured.tests {
            let cand = &cands[c];
            let all: Vec<f64> = cand.iter().flatten().copied().collect();
            let (mean, sd) = mean_sd(&all);
            m.insert(format!("{name}_tokens"), *tokens as f64);
            m.insert(format!("{name}_tps_mean"), mean);
            m.insert(format!("{name}_tps_sd"), sd);
            if self.reference.is_some() {
                let rall: Vec<f64> = refr.iter().flatten().copied().collect();
                let (r, lo, hi) = round_ratio(cand, refr);
                m.insert(format!("{name}_ref_tps_mean"), mean_sd(&rall).0);
                m.insert(format!("{name}_ratio_vs_ref"), r);
                m.insert(format!("{name}_ratio_vs_ref_ci95_lo"), lo);
                m.insert(format!("{name}_ratio_vs_ref_ci95_hi"), hi);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// t/s per repetition, llama-bench's mean ± sd (Bessel's correction),
    /// and the per-round ratio's geometric mean with its interval, against
    /// hand-computed values.
    #[test]
    fn speed_statistics_by_hand() {
        let t = tps(
            100,
            &[Duration::from_millis(500), Duration::from_millis(250)],
        );
        assert_eq!(t, vec![200.0, 400.0]);
        let (m, sd) = mean_sd(&t);
        assert_eq!(m, 300.0);
        assert!((sd - 141.421_356_237_309_5).abs() < 1e-9);
        let cand = vec![vec![90.0, 110.0], vec![45.0, 55.0]];
        let refr = vec![vec![200.0], vec![100.0]];
        let (r, lo, hi) = round_ratio(&cand, &refr);
        // Both rounds have ratio 0.5: noise of the round cancels.
        assert!((r - 0.5).abs() < 1e-12 && (lo - 0.5).abs() < 1e-12 && (hi - 0.5).abs() < 1e-12);
        let (r, lo, hi) = round_ratio(&[vec![1.0], vec![4.0]], &[vec![1.0], vec![1.0]]);
        assert!((r - 2.0).abs() < 1e-12, "geometric mean of 1 and 4");
        assert!(lo < 1.0 && hi > 4.0);
    }
}
