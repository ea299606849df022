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
            XTicks::Linear => labelled(&nice_ticks(self.x.0, self.x.1, 5)),
            // Whole numbers from 0 (a window index is never negative): the
            // padding left of window 0 gets no tick.
            XTicks::Integer => nice_ticks(self.x.0.max(0.0), self.x.1, 6)
                .into_iter()
                .filter(|x| x.fract() == 0.0)
                .map(|x| (x, format!("{x:.0}")))
                .collect(),
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
        let ys = if self.logy {
            log_ticks(self.y.0, self.y.1)
        } else {
            labelled(&nice_ticks(self.y.0, self.y.1, 5))
        };
        for (yv, label) in ys {
            let y = self.py(yv);
            let _ = write!(
                s,
                "<line x1=\"{ML}\" y1=\"{y}\" x2=\"{l2}\" y2=\"{y}\" stroke=\"#eee\"/>\
                 <text x=\"{lx}\" y=\"{yy}\" text-anchor=\"end\">{yl}</text>",
                l2 = self.w - MR,
                lx = ML - 4.0,
                yy = y + 4.0,
                yl = label,
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

/// Round values in `[lo, hi]`, about `n` of them: multiples of a step of
/// 1, 2, 2.5 or 5 × 10^k (so that a reader can interpolate between them).
pub(crate) fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = hi - lo;
    if !(span > 0.0 && span.is_finite()) {
        return if lo.is_finite() { vec![lo] } else { Vec::new() };
    }
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag);
    let (first, last) = ((lo / step).ceil() as i64, (hi / step).floor() as i64);
    (first..=last)
        .map(|k| k as f64 * step)
        .map(|v| if v.abs() < step * 1e-9 { 0.0 } else { v })
        .collect()
}

/// Ticks with labels that show them exactly: as many decimals as the step
/// between them needs (all with the same), or powers of ten for very small
/// or large values.
pub(crate) fn labelled(ticks: &[f64]) -> Vec<(f64, String)> {
    let step = match ticks {
        [a, b, ..] => (b - a).abs(),
        [a] => a.abs(),
        [] => return Vec::new(),
    };
    let biggest = ticks.iter().fold(0f64, |m, t| m.max(t.abs()));
    if biggest > 0.0 && !(1e-4..1e5).contains(&biggest) {
        return ticks.iter().map(|&t| (t, format!("{t:.1e}"))).collect();
    }
    let decimals = (0..10)
        .find(|&d| {
            let shown: f64 = format!("{step:.d$}").parse().unwrap_or(f64::NAN);
            (shown - step).abs() <= step * 1e-9
        })
        .unwrap_or(10);
    ticks
        .iter()
        .map(|&t| (t, format!("{t:.decimals$}")))
        .collect()
}

/// Powers of ten in `[lo, hi]` (log10 of the axis' ends), with 2 and 5
/// times them when fewer than three powers fit.
pub(crate) fn log_ticks(lo: f64, hi: f64) -> Vec<(f64, String)> {
    let (a, b) = (lo.ceil() as i32, hi.floor() as i32);
    let mut out: Vec<(f64, String)> = (a..=b).map(|k| (10f64.powi(k), format!("1e{k}"))).collect();
    if out.len() < 3 {
        out = (a - 1..=b)
            .flat_map(|k| [1.0, 2.0, 5.0].map(|m| (m * 10f64.powi(k), format!("{m}e{k}"))))
            .filter(|(v, _)| (lo..=hi).contains(&v.log10()))
            .collect();
    }
    out
}

/// `s` escaped for HTML and SVG text.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks are multiples of 1, 2, 2.5 or 5 × 10^k inside the range, and
    /// their labels show them exactly, with one number of decimals.
    #[test]
    fn ticks_are_round_and_labelled_exactly() {
        let t = nice_ticks(-0.0123, 0.0431, 5);
        assert_eq!(t, vec![0.0, 0.02, 0.04]);
        let l: Vec<String> = labelled(&t).into_iter().map(|x| x.1).collect();
        assert_eq!(l, ["0.00", "0.02", "0.04"]);
        let t = nice_ticks(2.6, 8.5, 5);
        assert_eq!(t, vec![4.0, 6.0, 8.0]);
        assert_eq!(labelled(&t)[0].1, "4");
        let t = nice_ticks(0.0, 1.0, 4);
        assert_eq!(t, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(labelled(&t)[1].1, "0.25");
        assert_eq!(labelled(&t)[2].1, "0.50");
        // Every tick inside, and a step from the 1-2-2.5-5 family.
        for (lo, hi) in [(-1.2, 16.2), (0.0286, 0.0431), (1e-7, 3e-5), (190.0, 410.0)] {
            let t = nice_ticks(lo, hi, 5);
            assert!(t.len() >= 2, "{lo}..{hi}: {t:?}");
            assert!(t.iter().all(|x| (lo..=hi).contains(x)), "{lo}..{hi}: {t:?}");
            let step = t[1] - t[0];
            let m = step / 10f64.powf(step.log10().floor());
            assert!(
                [1.0, 2.0, 2.5, 5.0].iter().any(|k| (m - k).abs() < 1e-9),
                "{lo}..{hi}: step {step}"
            );
        }
        // Powers of ten on a log axis; 2 and 5 times them on a short one.
        let l = log_ticks(-6.0, -1.2);
        assert_eq!(
            l.iter().map(|x| x.1.as_str()).collect::<Vec<_>>(),
            ["1e-6", "1e-5", "1e-4", "1e-3", "1e-2"]
        );
        assert!(log_ticks(-2.9, -2.1).len() >= 2);
    }
}
