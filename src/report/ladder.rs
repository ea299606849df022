//! The ladder report: from one run's outcomes, one view per reference model,
//! a row per model (bytes, bits per weight, PPL ± se, ΔNLL with its 95%
//! interval and windows better, KLD mean/p99/max, Δp RMS, same-top with its
//! Wilson interval, the flip rate where the reference is most confident, and
//! the gate verdicts), largest file first; as Markdown (model-card ready),
//! CSV, and one self-contained HTML page with inline SVG plots.
//!
//! Contract: every number is one the run measured (a metric of its
//! outcome, or the model file's own header); a missing one is shown as
//! missing (`–`, an empty CSV field), never as zero. A model whose trial
//! failed to run is a row that says ERROR.

use crate::core::error::Result;
use crate::core::{Outcome, Status};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What the model file says of itself.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelFacts {
    /// Bytes, every part of a split file added up.
    pub bytes: Option<u64>,
    /// Bits per weight (tensor bytes × 8 / parameters).
    pub bpw: Option<f64>,
}

/// Flips where the reference is most confident: the bins whose lower edge
/// is at least [`TOP_EDGE`] (else the last bin), pooled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopFlips {
    /// Lower p1 edge of the pooled bins.
    pub edge: f64,
    /// Flips.
    pub flips: u64,
    /// Positions.
    pub n: u64,
    /// Wilson 95% interval of flips / n.
    pub wilson: (f64, f64),
}

/// The reference top-1 probability from which bins count as "top".
pub const TOP_EDGE: f64 = 0.99;

/// One model in a view.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Alias.
    pub model: String,
    /// File facts.
    pub facts: ModelFacts,
    /// Worst status over the view's cases.
    pub status: Status,
    /// Metrics by name: the perplexity case's, then the kld case's.
    pub metrics: BTreeMap<String, f64>,
    /// Pooled top-confidence flips (kld case).
    pub top_flips: Option<TopFlips>,
    /// `case: metric` of every failed gate, and errors.
    pub failures: Vec<String>,
    /// Gates checked.
    pub gates: usize,
    /// ΔNLL per window.
    pub delta_nll_per_window: Vec<f64>,
    /// The speed case's metrics of this model (pp/tg t/s, their ratios), if one ran.
    pub speed: BTreeMap<String, f64>,
}

/// One reference's ladder.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The reference alias.
    pub reference: String,
    /// The perplexity case and the kld case behind the columns.
    pub cases: Vec<String>,
    /// Rows, largest file first.
    pub rows: Vec<Row>,
}

fn kind_of(o: &Outcome) -> &'static str {
    if o.metrics.contains_key("kld_mean") {
        "kld"
    } else if o.metrics.contains_key("delta_nll_mean") || o.metrics.contains_key("ppl") {
        "perplexity"
    } else {
        ""
    }
}

/// The views of `outcomes`: per reference, at most one perplexity and one
/// kld case each (a second case of a kind opens another view); outcomes of
/// an unknown kind on such a case (an error) join their case's view.
pub fn views(outcomes: &[Outcome], facts: &dyn Fn(&str) -> ModelFacts) -> Vec<View> {
    // Each case's kind, from any of its outcomes that ran.
    let mut case_kind: BTreeMap<&str, &'static str> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.reference.is_some()) {
        let k = kind_of(o);
        if !k.is_empty() {
            case_kind.insert(&o.case, k);
        }
    }
    // (reference, {kind: case}) in order of first appearance.
    let mut slots: Vec<(String, BTreeMap<&'static str, String>)> = Vec::new();
    let mut cases: Vec<(&str, &str)> = outcomes
        .iter()
        .filter_map(|o| Some((o.case.as_str(), o.reference.as_deref()?)))
        .filter(|(c, _)| case_kind.contains_key(c))
        .collect();
    cases.sort();
    cases.dedup();
    for (case, reference) in cases {
        let kind = case_kind[case];
        let at = slots
            .iter()
            .position(|(r, k)| r == reference && !k.contains_key(kind))
            .unwrap_or_else(|| {
                slots.push((reference.to_string(), BTreeMap::new()));
                slots.len() - 1
            });
        slots[at].1.insert(kind, case.to_string());
    }
    let mut out: Vec<View> = slots
        .iter()
        .map(|(r, k)| View {
            reference: r.clone(),
            cases: ["perplexity", "kld"]
                .iter()
                .filter_map(|kind| k.get(kind).cloned())
                .collect(),
            rows: Vec::new(),
        })
        .collect();
    for (i, (_, kinds)) in slots.iter().enumerate() {
        let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
        // The perplexity case first: its ΔNLL columns win over a kld case's.
        for kind in ["perplexity", "kld"] {
            let Some(case) = kinds.get(kind) else {
                continue;
            };
            for o in outcomes.iter().filter(|o| &o.case == case) {
                let row = rows.entry(&o.model).or_insert_with(|| Row {
                    model: o.model.clone(),
                    facts: facts(&o.model),
                    status: Status::Pass,
                    metrics: BTreeMap::new(),
                    top_flips: None,
                    failures: Vec::new(),
                    gates: 0,
                    delta_nll_per_window: Vec::new(),
                    speed: BTreeMap::new(),
                });
                for (k, v) in &o.metrics {
                    row.metrics.entry(k.clone()).or_insert(*v);
                }
                if row.delta_nll_per_window.is_empty() {
                    if let Some(s) = o.series.get("delta_nll_per_window") {
                        row.delta_nll_per_window = s.clone();
                    }
                }
                if kind == "kld" {
                    row.top_flips = top_flips(&o.metrics);
                }
                row.gates += o.gates.len();
                for g in o.gates.iter().filter(|g| !g.passed) {
                    row.failures.push(format!("{}: {}", o.case, g.metric));
                }
                match o.status {
                    Status::Error => {
                        row.status = Status::Error;
                        let first = o.error.as_deref().unwrap_or("").lines().next();
                        row.failures
                            .push(format!("{}: error: {}", o.case, first.unwrap_or("")));
                    }
                    Status::Fail if row.status == Status::Pass => row.status = Status::Fail,
                    _ => {}
                }
            }
        }
        let mut rows: Vec<Row> = rows.into_values().collect();
        // Speed beside quality: a speed case's t/s of the same model.
        for r in &mut rows {
            if let Some(o) = outcomes.iter().find(|o| {
                o.model == r.model
                    && (o.metrics.contains_key("pp_tps_mean")
                        || o.metrics.contains_key("tg_tps_mean"))
            }) {
                r.speed = o
                    .metrics
                    .iter()
                    .filter(|(k, _)| k.starts_with("pp_") || k.starts_with("tg_"))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
            }
        }
        rows.sort_by(|a, b| {
            b.facts
                .bytes
                .cmp(&a.facts.bytes)
                .then_with(|| a.model.cmp(&b.model))
        });
        out[i].rows = rows;
    }
    out
}

/// Pooled flips of the bins whose lower edge (recovered from
/// `flip_bin{b}_min_swing` = ln(p/(1−p))) is ≥ [`TOP_EDGE`], else of the last bin.
pub fn top_flips(m: &BTreeMap<String, f64>) -> Option<TopFlips> {
    let mut bins = Vec::new();
    for b in 0.. {
        let (Some(n), Some(k)) = (
            m.get(&format!("flip_bin{b}_n")),
            m.get(&format!("flip_bin{b}_flips")),
        ) else {
            break;
        };
        let edge = m
            .get(&format!("flip_bin{b}_min_swing"))
            .map_or(0.0, |s| 1.0 / (1.0 + (-s).exp()));
        bins.push((edge, *k as u64, *n as u64));
    }
    let last = bins.last()?.0;
    let from = if bins.iter().any(|b| b.0 >= TOP_EDGE - 1e-9) {
        TOP_EDGE - 1e-9
    } else {
        last
    };
    let top: Vec<_> = bins.iter().filter(|b| b.0 >= from).collect();
    let (flips, n) = top.iter().fold((0, 0), |(k, n), b| (k + b.1, n + b.2));
    Some(TopFlips {
        edge: top.first()?.0,
        flips,
        n,
        wilson: crate::measure::stats::wilson95(flips as usize, n as usize),
    })
}

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        Some(x) => format!("{x}"),
        None => "–".into(),
    }
}

fn human_bytes(b: Option<u64>) -> String {
    match b {
        None => "–".into(),
        Some(b) if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
    }
}

/// Cells of a row, as the Markdown table shows them.
fn cells(r: &Row) -> Vec<String> {
    let m = |k: &str| r.metrics.get(k).copied();
    let pm = |a: &str, b: &str, d: usize| match (m(a), m(b)) {
        (Some(x), Some(s)) => format!("{x:.d$} ± {s:.d$}"),
        (x, _) => num(x, d),
    };
    let interval = |v: &str, lo: &str, hi: &str, d: usize| match (m(v), m(lo), m(hi)) {
        (Some(x), Some(l), Some(h)) => format!("{x:+.d$} [{l:+.d$}, {h:+.d$}]"),
        (x, _, _) => num(x, d),
    };
    let same_top = match (
        m("same_top"),
        m("same_top_wilson95_lo"),
        m("same_top_wilson95_hi"),
    ) {
        (Some(x), Some(l), Some(h)) => {
            format!("{:.2}% [{:.2}, {:.2}]", x * 100.0, l * 100.0, h * 100.0)
        }
        (x, _, _) => num(x.map(|x| x * 100.0), 2),
    };
    let flips = r.top_flips.map_or("–".into(), |t| {
        if t.n == 0 {
            "0/0".into()
        } else {
            format!(
                "{}/{} = {:.2}% [{:.2}, {:.2}]",
                t.flips,
                t.n,
                t.flips as f64 / t.n as f64 * 100.0,
                t.wilson.0 * 100.0,
                t.wilson.1 * 100.0
            )
        }
    });
    let windows = match (m("windows_better"), m("windows")) {
        (Some(b), Some(w)) => format!("{b:.0}/{w:.0}"),
        _ => "–".into(),
    };
    let tps = |t: &str| match (
        r.speed.get(&format!("{t}_tps_mean")),
        r.speed.get(&format!("{t}_tps_sd")),
    ) {
        (Some(m), Some(sd)) => format!("{m:.1} ± {sd:.1}"),
        _ => "–".into(),
    };
    let verdict = match r.status {
        Status::Pass => format!("pass ({} gates)", r.gates),
        Status::Fail => format!("**FAIL** {}", r.failures.join("; ")),
        Status::Error => format!("**ERROR** {}", r.failures.join("; ")),
    };
    vec![
        r.model.clone(),
        human_bytes(r.facts.bytes),
        num(r.facts.bpw, 2),
        pm("ppl", "ppl_se", 4),
        interval(
            "delta_nll_mean",
            "delta_nll_ci95_lo",
            "delta_nll_ci95_hi",
            4,
        ),
        windows,
        num(m("kld_mean"), 5),
        num(m("kld_p99"), 4),
        num(m("kld_max"), 3),
        num(m("dp_rms").map(|x| x * 100.0), 3),
        same_top,
        flips,
        tps("pp"),
        tps("tg"),
        verdict,
    ]
}

const HEAD: [&str; 15] = [
    "model",
    "size",
    "BPW",
    "PPL ± se",
    "ΔNLL [95% CI]",
    "windows better",
    "KLD mean",
    "KLD p99",
    "KLD max",
    "Δp RMS %",
    "same top % [Wilson 95%]",
    "flips where p1 ≥ 0.99 [Wilson 95%]",
    "pp t/s",
    "tg t/s",
    "gates",
];

fn title(v: &View) -> String {
    format!("Reference {} — {}", v.reference, v.cases.join(", "))
}

/// The Markdown report: a table per view and how to read it.
pub fn markdown(views: &[View]) -> String {
    let mut s = String::from("# Quant ladder report\n\n");
    if views.is_empty() {
        s.push_str("No perplexity or kld case with a reference model ran.\n");
    }
    for v in views {
        let _ = writeln!(s, "## {}\n", title(v));
        let _ = writeln!(s, "| {} |", HEAD.join(" | "));
        let _ = writeln!(
            s,
            "|{}|",
            HEAD.iter()
                .enumerate()
                .map(|(i, _)| if i == 0 || i == HEAD.len() - 1 {
                    "---"
                } else {
                    "---:"
                })
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &v.rows {
            let c: Vec<String> = cells(r)
                .into_iter()
                .map(|c| c.replace('|', "\\|"))
                .collect();
            let _ = writeln!(s, "| {} |", c.join(" | "));
        }
        s.push('\n');
    }
    s.push_str(
        "PPL ± se as llama-perplexity prints it. ΔNLL: mean over windows of the per-window \
         mean NLL difference to the reference (nats/token), 95% Student-t interval over \
         windows; windows better: windows where the model's NLL is below the reference's. \
         KLD: KL(reference ‖ model) per scored position, nats. Δp: p(true token) − the \
         reference's. Same top: positions whose argmax equals the reference's. Flips: \
         positions where the reference's top-1 probability is ≥ 0.99 and the model's argmax \
         differs. BPW: tensor bytes × 8 / parameters, from the GGUF header. pp/tg t/s: \
         a speed case's prompt processing and generation, mean ± sd over its repetitions.\n",
    );
    s
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// CSV columns: plain numbers, full precision, empty when missing.
const CSV_METRICS: &[&str] = &[
    "ppl",
    "ppl_se",
    "delta_nll_mean",
    "delta_nll_ci95_lo",
    "delta_nll_ci95_hi",
    "windows_better",
    "windows",
    "ln_ppl_ratio",
    "ln_ppl_ratio_se",
    "kld_mean",
    "kld_mean_se",
    "kld_p99",
    "kld_max",
    "dp_rms",
    "same_top",
    "same_top_wilson95_lo",
    "same_top_wilson95_hi",
];

/// CSV columns of the speed case, when one ran on the model.
const CSV_SPEED: &[&str] = &[
    "pp_tps_mean",
    "pp_tps_sd",
    "tg_tps_mean",
    "tg_tps_sd",
    "pp_ratio_vs_ref",
    "tg_ratio_vs_ref",
];

/// The CSV report: one line per view × model.
pub fn csv(views: &[View]) -> String {
    let mut s = String::from("reference,cases,model,bytes,bpw,");
    s.push_str(&CSV_METRICS.join(","));
    s.push_str(",top_flip_edge,top_flips,top_flip_n,top_flip_wilson95_lo,top_flip_wilson95_hi");
    let _ = writeln!(s, ",{},status,failures", CSV_SPEED.join(","));
    let f = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
    for v in views {
        for r in &v.rows {
            let mut line = vec![
                csv_field(&v.reference),
                csv_field(&v.cases.join(" ")),
                csv_field(&r.model),
                r.facts.bytes.map(|b| b.to_string()).unwrap_or_default(),
                f(r.facts.bpw),
            ];
            line.extend(CSV_METRICS.iter().map(|k| f(r.metrics.get(*k).copied())));
            let t = r.top_flips;
            line.push(f(t.map(|t| t.edge)));
            line.push(t.map(|t| t.flips.to_string()).unwrap_or_default());
            line.push(t.map(|t| t.n.to_string()).unwrap_or_default());
            line.push(f(t.map(|t| t.wilson.0)));
            line.push(f(t.map(|t| t.wilson.1)));
            for k in CSV_SPEED {
                line.push(f(r.speed.get(*k).copied()));
            }
            line.push(r.status.as_str().into());
            line.push(csv_field(&r.failures.join("; ")));
            let _ = writeln!(s, "{}", line.join(","));
        }
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Series colours (Okabe–Ito, readable by colour-blind readers).
pub const PALETTE: [&str; 8] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442",
];

/// A plot frame: data ranges mapped to a `w`×`h` SVG with margins.
struct Frame {
    x: (f64, f64),
    y: (f64, f64),
    w: f64,
    h: f64,
    logy: bool,
    xticks: XTicks,
}

/// How the x axis is labelled.
#[derive(Clone, Copy, PartialEq)]
enum XTicks {
    /// Five evenly spaced values.
    Linear,
    /// Whole numbers (window indices).
    Integer,
    /// None (categories, labelled by the plot).
    None,
}

/// The smallest KL the distribution plot shows: a model scored against
/// itself has KL ~1e-20 from rounding, which would squash the others.
const KL_FLOOR: f64 = 1e-6;

const ML: f64 = 70.0;
const MR: f64 = 150.0;
const MT: f64 = 30.0;
const MB: f64 = 45.0;

impl Frame {
    fn new(xs: &[f64], ys: &[f64], logy: bool) -> Frame {
        let range = |v: &[f64], log: bool| {
            let v: Vec<f64> = v
                .iter()
                .copied()
                .filter(|x| x.is_finite() && (!log || *x > 0.0))
                .map(|x| if log { x.log10() } else { x })
                .collect();
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                    (a.min(*x), b.max(*x))
                });
            if !lo.is_finite() {
                (0.0, 1.0)
            } else if hi - lo < 1e-12 {
                (lo - 0.5, hi + 0.5)
            } else {
                let pad = (hi - lo) * 0.08;
                (lo - pad, hi + pad)
            }
        };
        Frame {
            x: range(xs, false),
            y: range(ys, logy),
            w: 640.0,
            h: 320.0,
            logy,
            xticks: XTicks::Linear,
        }
    }
    fn px(&self, x: f64) -> f64 {
        ML + (x - self.x.0) / (self.x.1 - self.x.0) * (self.w - ML - MR)
    }
    fn py(&self, y: f64) -> f64 {
        let y = if self.logy { y.max(1e-300).log10() } else { y };
        self.h - MB - (y - self.y.0) / (self.y.1 - self.y.0) * (self.h - MT - MB)
    }
    /// Axes, ticks, labels and the title, as an open `<svg>`.
    fn open(&self, title: &str, xlabel: &str, ylabel: &str) -> String {
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"11\">\
             <rect width=\"{w}\" height=\"{h}\" fill=\"#fff\"/>\
             <text x=\"{tx}\" y=\"18\" font-size=\"13\" font-weight=\"bold\">{t}</text>\
             <text x=\"{cx}\" y=\"{by}\" text-anchor=\"middle\">{xl}</text>\
             <text transform=\"translate(14 {cy}) rotate(-90)\" text-anchor=\"middle\">{yl}</text>",
            w = self.w,
            h = self.h,
            tx = ML,
            t = esc(title),
            cx = (ML + self.w - MR) / 2.0,
            by = self.h - 8.0,
            xl = esc(xlabel),
            cy = (MT + self.h - MB) / 2.0,
            yl = esc(ylabel),
        );
        let _ = write!(
            s,
            "<rect x=\"{ML}\" y=\"{MT}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>",
            self.w - ML - MR,
            self.h - MT - MB
        );
        let xs: Vec<(f64, String)> = match self.xticks {
            XTicks::Linear => (0..=4)
                .map(|i| self.x.0 + (self.x.1 - self.x.0) * i as f64 / 4.0)
                .map(|x| (x, tick(x)))
                .collect(),
            XTicks::Integer => {
                let (a, b) = (self.x.0.ceil() as i64, self.x.1.floor() as i64);
                let step = ((b - a) / 6).max(1) as usize;
                (a..=b)
                    .step_by(step)
                    .map(|i| (i as f64, i.to_string()))
                    .collect()
            }
            XTicks::None => Vec::new(),
        };
        for (fx, label) in xs {
            let x = self.px(fx);
            let _ = write!(
                s,
                "<line x1=\"{x}\" y1=\"{b}\" x2=\"{x}\" y2=\"{b2}\" stroke=\"#999\"/>\
                 <text x=\"{x}\" y=\"{ty}\" text-anchor=\"middle\">{label}</text>",
                b = self.h - MB,
                b2 = self.h - MB + 4.0,
                ty = self.h - MB + 16.0,
            );
        }
        for i in 0..=4 {
            let fy = self.y.0 + (self.y.1 - self.y.0) * i as f64 / 4.0;
            let yv = if self.logy { 10f64.powf(fy) } else { fy };
            let y = self.py(yv);
            let _ = write!(
                s,
                "<line x1=\"{ML}\" y1=\"{y}\" x2=\"{l2}\" y2=\"{y}\" stroke=\"#eee\"/>\
                 <text x=\"{lx}\" y=\"{yy}\" text-anchor=\"end\">{yl}</text>",
                l2 = self.w - MR,
                lx = ML - 4.0,
                yy = y + 4.0,
                yl = tick(yv),
            );
        }
        if !self.logy && self.y.0 < 0.0 && self.y.1 > 0.0 {
            let y = self.py(0.0);
            let _ = write!(
                s,
                "<line x1=\"{ML}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#555\" stroke-dasharray=\"4 3\"/>",
                self.w - MR
            );
        }
        s
    }
    fn legend(&self, i: usize, label: &str) -> String {
        let y = MT + 14.0 * i as f64 + 6.0;
        format!(
            "<rect x=\"{x}\" y=\"{y0}\" width=\"10\" height=\"10\" fill=\"{c}\"/><text x=\"{tx}\" y=\"{ty}\">{l}</text>",
            x = self.w - MR + 10.0,
            y0 = y - 8.0,
            c = PALETTE[i % PALETTE.len()],
            tx = self.w - MR + 24.0,
            ty = y + 1.0,
            l = esc(label)
        )
    }
}

fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e4).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// A metric against bits per weight, one point per model with its interval
/// as an error bar: the size/quality frontier.
fn pareto(
    v: &View,
    metric: &str,
    lo: &dyn Fn(&Row) -> Option<(f64, f64)>,
    label: &str,
) -> Option<String> {
    let pts: Vec<(usize, &Row, f64, f64)> = v
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, r, r.facts.bpw?, *r.metrics.get(metric)?)))
        .filter(|p| p.3.is_finite())
        .collect();
    if pts.is_empty() {
        return None;
    }
    let xs: Vec<f64> = pts.iter().map(|p| p.2).collect();
    let mut ys: Vec<f64> = pts.iter().map(|p| p.3).collect();
    for p in &pts {
        if let Some((l, h)) = lo(p.1) {
            ys.extend([l, h]);
        }
    }
    let f = Frame::new(&xs, &ys, false);
    let mut s = f.open(
        &format!("{label} against bits per weight"),
        "bits per weight",
        label,
    );
    let mut sorted = pts.clone();
    sorted.sort_by(|a, b| a.2.total_cmp(&b.2));
    let path: Vec<String> = sorted
        .iter()
        .map(|p| format!("{:.1},{:.1}", f.px(p.2), f.py(p.3)))
        .collect();
    let _ = write!(
        s,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#bbb\"/>",
        path.join(" ")
    );
    for (i, r, x, y) in &pts {
        let c = PALETTE[i % PALETTE.len()];
        if let Some((l, h)) = lo(r) {
            let _ = write!(
                s,
                "<line class=\"errbar\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>",
                f.py(l),
                f.py(h),
                x = f.px(*x)
            );
        }
        let _ = write!(
            s,
            "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"{c}\"><title>{}: {label} {y}</title></circle>",
            f.px(*x),
            f.py(*y),
            esc(&r.model)
        );
        s.push_str(&f.legend(*i, &r.model));
    }
    s.push_str("</svg>");
    Some(s)
}

/// ΔNLL per window, one line per model.
fn per_window(v: &View) -> Option<String> {
    let series: Vec<(usize, &Row)> = v
        .rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.delta_nll_per_window.is_empty())
        .collect();
    if series.is_empty() {
        return None;
    }
    let n = series
        .iter()
        .map(|s| s.1.delta_nll_per_window.len())
        .max()?;
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.delta_nll_per_window.iter().copied())
        .chain([0.0])
        .collect();
    let mut f = Frame::new(&[0.0, (n.max(2) - 1) as f64], &ys, false);
    f.xticks = XTicks::Integer;
    let mut s = f.open("ΔNLL per window", "window", "ΔNLL (nats/token)");
    for (i, r) in &series {
        let c = PALETTE[i % PALETTE.len()];
        let pts: Vec<String> = r
            .delta_nll_per_window
            .iter()
            .enumerate()
            .map(|(w, d)| format!("{:.1},{:.1}", f.px(w as f64), f.py(*d)))
            .collect();
        let _ = write!(
            s,
            "<polyline class=\"series\" points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"1.5\"/>",
            pts.join(" ")
        );
        s.push_str(&f.legend(*i, &r.model));
    }
    s.push_str("</svg>");
    Some(s)
}

/// The distribution of KL per position per model, from its percentiles:
/// a box from p10 to p90 with the median, whiskers to p01 and p99, and
/// marks at p99.9 and the maximum; log scale.
fn kl_distribution(v: &View) -> Option<String> {
    const Q: [&str; 9] = [
        "kld_p01",
        "kld_p05",
        "kld_p10",
        "kld_median",
        "kld_p90",
        "kld_p95",
        "kld_p99",
        "kld_p999",
        "kld_max",
    ];
    let rows: Vec<(usize, &Row, Vec<f64>)> = v
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let q: Option<Vec<f64>> = Q
                .iter()
                .map(|k| r.metrics.get(*k).map(|v| v.max(KL_FLOOR)))
                .collect();
            Some((i, r, q?))
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let ys: Vec<f64> = rows.iter().flat_map(|r| r.2.iter().copied()).collect();
    let mut f = Frame::new(&[-0.5, rows.len() as f64 - 0.5], &ys, true);
    f.x = (-0.5, rows.len() as f64 - 0.5);
    f.xticks = XTicks::None;
    let mut s = f.open(
        "KL divergence per position (p01 … max; below 1e-6 drawn at 1e-6)",
        "",
        "KL (nats), log scale",
    );
    for (slot, (i, r, q)) in rows.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let x = f.px(slot as f64);
        let _ = write!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{c}\"/>\
             <rect class=\"box\" x=\"{:.1}\" y=\"{:.1}\" width=\"24\" height=\"{:.1}\" fill=\"{c}\" fill-opacity=\"0.35\" stroke=\"{c}\"/>\
             <line x1=\"{:.1}\" y1=\"{m:.1}\" x2=\"{:.1}\" y2=\"{m:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>\
             <circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/><circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"none\" stroke=\"{c}\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
            f.py(q[0]),
            f.py(q[6]),
            x - 12.0,
            f.py(q[4]),
            (f.py(q[2]) - f.py(q[4])).max(1.0),
            x - 12.0,
            x + 12.0,
            f.py(q[7]),
            f.py(q[8]),
            f.h - MB + 14.0 + 11.0 * (slot % 2) as f64,
            esc(&r.model),
            m = f.py(q[3]),
        );
        s.push_str(&f.legend(*i, &r.model));
    }
    s.push_str("</svg>");
    Some(s)
}

/// The HTML report: every view's table and plots, and the figures the
/// teacher-forcing cases drew (when the outcomes carry them), in one file
/// with no external resource.
pub fn html(views: &[View], outcomes: &[Outcome]) -> String {
    let mut s = String::from(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Quant ladder report</title>\
         <style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}\
         th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,th:first-child,td:last-child{text-align:left}\
         .fail{background:#fde0dc}.error{background:#f4c7c3}figure{display:inline-block;margin:8px}</style></head><body>\n\
         <h1>Quant ladder report</h1>\n",
    );
    for v in views {
        let _ = writeln!(
            s,
            "<h2>{}</h2>\n<table><tr>{}</tr>",
            esc(&title(v)),
            HEAD.iter()
                .map(|h| format!("<th>{}</th>", esc(h)))
                .collect::<String>()
        );
        for r in &v.rows {
            let class = match r.status {
                Status::Pass => "pass",
                Status::Fail => "fail",
                Status::Error => "error",
            };
            let _ = writeln!(
                s,
                "<tr class=\"{class}\">{}</tr>",
                cells(r)
                    .iter()
                    .map(|c| format!("<td>{}</td>", esc(&c.replace("**", ""))))
                    .collect::<String>()
            );
        }
        s.push_str("</table>\n");
        let ci = |r: &Row| {
            Some((
                *r.metrics.get("delta_nll_ci95_lo")?,
                *r.metrics.get("delta_nll_ci95_hi")?,
            ))
        };
        let se = |r: &Row| {
            let (m, e) = (*r.metrics.get("kld_mean")?, *r.metrics.get("kld_mean_se")?);
            Some((m - 1.96 * e, m + 1.96 * e))
        };
        for fig in [
            pareto(v, "kld_mean", &se, "KLD mean (nats)"),
            pareto(v, "delta_nll_mean", &ci, "ΔNLL (nats/token)"),
            per_window(v),
            kl_distribution(v),
        ]
        .into_iter()
        .flatten()
        {
            let _ = writeln!(s, "<figure>{fig}</figure>");
        }
    }
    let figures: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.artifacts.iter().any(|a| a.extension == "svg"))
        .collect();
    if !figures.is_empty() {
        s.push_str("<h2>Teacher forcing: odds of the true digit</h2>\n");
        for o in figures {
            for a in o.artifacts.iter().filter(|a| a.extension == "svg") {
                let body = a.body.trim_start_matches(|c| c != '<');
                let body = body
                    .strip_prefix("<?xml")
                    .map_or(body, |r| r.split_once("?>").map_or(r, |x| x.1));
                let _ = writeln!(
                    s,
                    "<figure><figcaption>{} on {}</figcaption>{}</figure>",
                    esc(&o.case),
                    esc(&o.model),
                    body
                );
            }
        }
    }
    s.push_str("<p>");
    s.push_str(&esc(markdown(&[]).lines().last().unwrap_or("")));
    s.push_str("</p>\n</body></html>\n");
    s
}

/// The files a report folder holds.
pub const FILES: [&str; 3] = ["report.md", "report.csv", "report.html"];

/// Whether a report may be written into `dir`, checked before any work:
/// the folder can be made and written, and holds no report already (one is
/// replaced only when `force`). Err names the flag, the folder and the fix.
pub fn ready(flag: &str, dir: &Path, force: bool) -> Result<()> {
    crate::core::fsutil::writable_dir(flag, dir)?;
    let held: Vec<&str> = FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).exists())
        .collect();
    if !held.is_empty() && !force {
        return Err(crate::core::Error::input(format!(
            "{flag} {}: holds a report already ({}); pass --force to replace it, or name \
             another folder",
            dir.display(),
            held.join(", ")
        )));
    }
    Ok(())
}

/// Write `report.md`, `report.csv` and `report.html` into `dir`; the paths.
pub fn write(dir: &Path, views: &[View], outcomes: &[Outcome]) -> Result<Vec<PathBuf>> {
    let [md, csv_name, html_name] = FILES;
    let files = [
        (md, markdown(views)),
        (csv_name, csv(views)),
        (html_name, html(views, outcomes)),
    ];
    let mut out = Vec::new();
    for (name, body) in files {
        let p = dir.join(name);
        crate::core::fsutil::write_atomic(&p, body.as_bytes())?;
        out.push(p);
    }
    Ok(out)
}

/// Bytes and bits per weight of a registry model, from its file's header
/// (every part of a split file); nothing when the file is not there or is
/// not the size the registry pins.
pub fn facts_of(registry: &crate::models::Registry, build_label: &str, alias: &str) -> ModelFacts {
    let Ok(path) = registry.location(alias, build_label) else {
        return ModelFacts::default();
    };
    let pinned = registry.entry(alias).ok().and_then(|e| e.bytes);
    match crate::models::inspect::inspect(&path, false) {
        Ok(i) if pinned.is_none_or(|b| b == i.bytes) => ModelFacts {
            bytes: Some(i.bytes),
            bpw: i.bpw(),
        },
        _ => ModelFacts::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::GateResult;

    fn outcome(case: &str, model: &str, m: &[(&str, f64)]) -> Outcome {
        let build = crate::engine::Engine::build(&crate::engine::fake::FakeEngine::new());
        let mut o = Outcome::new(case, model, build);
        o.status = Status::Pass;
        o.reference = Some("f16".into());
        o.metrics = m.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        o
    }

    /// A perplexity and a kld case on the same reference make one view; rows
    /// are sorted by size, a missing metric is a dash (never 0), a failed
    /// gate is named, and the top bins' flips are pooled with their Wilson
    /// interval.
    #[test]
    fn one_view_per_reference_sorted_by_size() {
        let mut a = outcome(
            "ppl/x",
            "q8",
            &[("ppl", 10.0), ("ppl_se", 0.1), ("delta_nll_mean", 0.001)],
        );
        a.series
            .insert("delta_nll_per_window".into(), vec![0.001, 0.002]);
        let mut b = outcome("ppl/x", "q2", &[("ppl", 12.0), ("delta_nll_mean", 0.2)]);
        b.status = Status::Fail;
        b.gates.push(GateResult {
            metric: "delta_nll_mean".into(),
            bound: "max".into(),
            threshold: 0.05,
            observed: Some(0.2),
            passed: false,
            interval: None,
        });
        let swing = |p: f64| (p / (1.0 - p)).ln();
        let k = outcome(
            "kld/x",
            "q2",
            &[
                ("kld_mean", 0.3),
                ("flip_bin0_n", 100.0),
                ("flip_bin0_flips", 50.0),
                ("flip_bin0_min_swing", f64::NEG_INFINITY),
                ("flip_bin1_n", 30.0),
                ("flip_bin1_flips", 3.0),
                ("flip_bin1_min_swing", swing(0.99)),
                ("flip_bin2_n", 10.0),
                ("flip_bin2_flips", 1.0),
                ("flip_bin2_min_swing", swing(0.999)),
            ],
        );
        let facts = |m: &str| ModelFacts {
            bytes: Some(if m == "q8" { 200 } else { 100 }),
            bpw: Some(if m == "q8" { 8.5 } else { 2.6 }),
        };
        let mut sp = outcome(
            "speed/x",
            "q8",
            &[
                ("pp_tps_mean", 400.0),
                ("pp_tps_sd", 5.0),
                ("tg_tps_mean", 80.0),
                ("tg_tps_sd", 2.0),
            ],
        );
        sp.reference = None;
        let vs = views(&[k, b, a, sp], &facts);
        assert_eq!(vs.len(), 1);
        let v = &vs[0];
        assert_eq!(v.cases, ["ppl/x", "kld/x"]);
        assert_eq!(v.rows[0].model, "q8");
        let t = v.rows[1].top_flips.unwrap();
        assert_eq!((t.flips, t.n), (4, 40));
        assert!((t.edge - 0.99).abs() < 1e-9);
        assert_eq!(t.wilson, crate::measure::stats::wilson95(4, 40));
        let md = markdown(&vs);
        let q8 = md.lines().find(|l| l.starts_with("| q8 ")).unwrap();
        assert!(
            q8.contains("10.0000 ± 0.1000") && q8.contains("| – |"),
            "{q8}"
        );
        let q2 = md.lines().find(|l| l.starts_with("| q2 ")).unwrap();
        assert!(q2.contains("**FAIL** ppl/x: delta_nll_mean"), "{q2}");
        assert!(q2.contains("4/40 = 10.00%"), "{q2}");
        let csv = csv(&vs);
        assert_eq!(csv.lines().count(), 3, "{csv}");
        let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
        let q8c: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
        assert_eq!(head.len(), q8c.len());
        let col = |n: &str| head.iter().position(|h| *h == n).unwrap();
        assert_eq!(q8c[col("kld_mean")], "");
        assert_eq!(q8c[col("ppl")], "10");
        let html = html(&vs, &[]);
        assert!(html.contains("<svg"));
        for external in ["<script", "src=", "href=", "<link", "url("] {
            assert!(!html.contains(external), "not self-contained: {external}");
        }
        assert_eq!(html.matches("class=\"series\"").count(), 1);
    }
}
