//! A small SVG plotting layer: a framed plot with axes, round ticks,
//! linear or log scales, and a palette.

use std::fmt::Write as _;

/// Series colours (Okabe–Ito, readable by colour-blind readers).
pub const PALETTE: [&str; 8] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442",
];

/// A plot frame: data ranges mapped to a `w`×`h` SVG with margins.
pub(crate) struct Frame {
    pub(crate) x: (f64, f64),
    pub(crate) y: (f64, f64),
    pub(crate) w: f64,
    pub(crate) h: f64,
    pub(crate) logy: bool,
    pub(crate) xticks: XTicks,
}

/// How the x axis is labelled.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum XTicks {
    /// Five evenly spaced values.
    Linear,
    /// Whole numbers (window indices).
    Integer,
    /// None (categories, labelled by the plot).
    None,
}

pub(crate) const ML: f64 = 70.0;

pub(crate) const MR: f64 = 150.0;

pub(crate) const MT: f64 = 30.0;

pub(crate) const MB: f64 = 45.0;

impl Frame {
    pub(crate) fn new(xs: &[f64], ys: &[f64], logy: bool) -> Frame {
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
    pub(crate) fn px(&self, x: f64) -> f64 {
        ML + (x - self.x.0) / (self.x.1 - self.x.0) * (self.w - ML - MR)
    }
    pub(crate) fn py(&self, y: f64) -> f64 {
        let y = if self.logy { y.max(1e-300).log10() } else { y };
        self.h - MB - (y - self.y.0) / (self.y.1 - self.y.0) * (self.h - MT - MB)
    }
    /// Axes, ticks, labels and the title, as an open `<svg>`.
    pub(crate) fn open(&self, title: &str, xlabel: &str, ylabel: &str) -> String {
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
    pub(crate) fn legend(&self, i: usize, label: &str) -> String {
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

pub(crate) fn tick(v: f64) -> String {
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

/// `s` escaped for HTML and SVG text.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
