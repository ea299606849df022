//! The per-digit rows of a teacher-forcing case × model and their two
//! renderings: the Parquet table (seed 000's columns) and the per-digit plot
//! as the seed's figures draw it — the odds of the true digit (log scale,
//! the reference's beside the model's, 1× marking a flip) and the noise (KL
//! against the reference) per digit, as plain SVG.
//!
//! Contract: pure renderings; digits without a row of their own (NaN) break
//! the plot's lines instead of being drawn as zero.

use crate::core::{Column, Table};
use crate::engine::TokenId;
use std::fmt::Write;

/// One digit (unit) position of a teacher-forced case.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DigitRow {
    /// 0-based unit index after the lead.
    pub unit: u32,
    /// Byte offset of the unit in the scored text.
    pub char_offset: u32,
    /// The token that starts the unit (−1: none, the unit is not measured).
    pub token_index: i32,
    /// Its id (−1: none).
    pub token_id: TokenId,
    /// Its piece.
    pub piece: String,
    /// The token is exactly the unit (E0).
    pub own_token: bool,
    /// log p(true token).
    pub logprob: f64,
    /// Tokens with a strictly higher logit.
    pub rank: i64,
    /// log p(true) − max over other tokens of log p; odds = e^margin.
    pub margin: f64,
    /// The model's top choice.
    pub top1_token: TokenId,
    /// Its piece.
    pub top1_piece: String,
    /// KL(ref ‖ model) over the whole vocabulary (NaN without a reference).
    pub kl_vs_ref: f64,
    /// The model's top choice is the reference's.
    pub top1_matches_ref: bool,
    /// The reference's margin at this position (NaN without a reference).
    pub ref_margin: f64,
    /// Percentile of `ref_margin` among all measured positions (0: the
    /// reference's least certain digit).
    pub ref_odds_percentile: f64,
    /// Chance each sampler draws the true token here.
    pub p_pick: Vec<f64>,
}

/// The per-digit rows of one teacher-forced case × model.
#[derive(Debug, Clone)]
pub(crate) struct DigitRows {
    /// One per unit.
    pub rows: Vec<DigitRow>,
    /// Sampler names, in `p_pick` order.
    pub samplers: Vec<String>,
    /// Whether a reference filled the `*_ref` columns.
    pub reference: bool,
}

impl DigitRows {
    /// The per-digit Parquet rows (seed 000's columns); the reference's and
    /// the samplers' columns only when the case has them.
    pub(crate) fn table(&self) -> Table {
        let r = &self.rows;
        let i = |g: &dyn Fn(&DigitRow) -> i32| Column::I32(r.iter().map(g).collect());
        let f = |g: &dyn Fn(&DigitRow) -> f64| Column::F64(r.iter().map(g).collect());
        let s = |g: &dyn Fn(&DigitRow) -> &str| {
            Column::Str(r.iter().map(|x| g(x).to_string()).collect())
        };
        let b = |g: &dyn Fn(&DigitRow) -> bool| Column::Bool(r.iter().map(g).collect());
        let mut columns = vec![
            ("position".to_string(), i(&|x| x.unit as i32)),
            ("char_offset".into(), i(&|x| x.char_offset as i32)),
            ("token_index".into(), i(&|x| x.token_index)),
            ("token_id".into(), i(&|x| x.token_id)),
            ("piece".into(), s(&|x| x.piece.as_str())),
            ("own_token".into(), b(&|x| x.own_token)),
            ("logprob".into(), f(&|x| x.logprob)),
            ("rank".into(), i(&|x| x.rank as i32)),
            ("margin".into(), f(&|x| x.margin)),
            ("odds".into(), f(&|x| x.margin.exp())),
            ("top1_token".into(), i(&|x| x.top1_token)),
            ("top1_piece".into(), s(&|x| x.top1_piece.as_str())),
        ];
        if self.reference {
            columns.push(("kl_vs_ref".into(), f(&|x| x.kl_vs_ref)));
            columns.push(("top1_matches_ref".into(), b(&|x| x.top1_matches_ref)));
            columns.push(("ref_margin".into(), f(&|x| x.ref_margin)));
            columns.push(("ref_odds_percentile".into(), f(&|x| x.ref_odds_percentile)));
        }
        for (k, name) in self.samplers.iter().enumerate() {
            columns.push((format!("p_pick_{name}"), f(&|x| x.p_pick[k])));
        }
        Table {
            name: "digit_position",
            columns,
        }
    }
}

const W: f64 = 960.0;
const PANEL: f64 = 220.0;
const LEFT: f64 = 64.0;
const TOP: f64 = 36.0;
const GAP: f64 = 48.0;

/// Polylines of `(x, y)` with NaN y values splitting the line.
fn lines(points: impl Iterator<Item = (f64, f64)>, style: &str) -> String {
    let mut out = String::new();
    let mut run: Vec<String> = Vec::new();
    let flush = |run: &mut Vec<String>, out: &mut String| {
        if run.len() > 1 {
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" {style} points=\"{}\"/>",
                run.join(" ")
            );
        }
        run.clear();
    };
    for (x, y) in points {
        if y.is_finite() {
            run.push(format!("{x:.1},{y:.1}"));
        } else {
            flush(&mut run, &mut out);
        }
    }
    flush(&mut run, &mut out);
    out
}

impl DigitRows {
    /// The SVG of one case × model; `first_flip` is marked.
    pub(crate) fn svg(&self, title: &str, first_flip: Option<usize>) -> String {
        digits_svg(title, self, first_flip)
    }
}

fn digits_svg(title: &str, rows: &DigitRows, first_flip: Option<usize>) -> String {
    let n = rows.rows.len().max(2);
    let plot_w = W - LEFT - 16.0;
    let x = |k: usize| LEFT + plot_w * k as f64 / (n - 1) as f64;
    // Panel 1: log10 odds, clamped to [-4, 6].
    let (lo, hi) = (-4.0f64, 6.0f64);
    let y1 = |m: f64| {
        let v = (m / std::f64::consts::LN_10).clamp(lo, hi);
        TOP + PANEL * (hi - v) / (hi - lo)
    };
    let top2 = TOP + PANEL + GAP;
    let kl_max = rows
        .rows
        .iter()
        .map(|r| r.kl_vs_ref)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-12);
    let y2 = |v: f64| top2 + PANEL * (1.0 - (v / kl_max).clamp(0.0, 1.0));
    let height = if rows.reference {
        top2 + PANEL + 40.0
    } else {
        TOP + PANEL + 40.0
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{LEFT}\" y=\"20\" font-size=\"14\">{}</text>",
        esc(title)
    );
    // Odds axis: gridlines at every power of ten, 1× emphasised.
    for p in lo as i32..=hi as i32 {
        let y = y1(f64::from(p) * std::f64::consts::LN_10);
        let stroke = if p == 0 { "#900" } else { "#ddd" };
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{stroke}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">1e{p}×</text>",
            LEFT + plot_w,
            LEFT - 4.0,
            y + 4.0
        );
    }
    if rows.reference {
        s.push_str(&lines(
            rows.rows
                .iter()
                .enumerate()
                .map(|(k, r)| (x(k), y1(r.ref_margin))),
            "stroke=\"#888\" stroke-width=\"1\"",
        ));
    }
    s.push_str(&lines(
        rows.rows
            .iter()
            .enumerate()
            .map(|(k, r)| (x(k), y1(r.margin))),
        "stroke=\"#1f5fbf\" stroke-width=\"1\"",
    ));
    let _ = writeln!(
        s,
        "<text x=\"{LEFT}\" y=\"{:.1}\">odds of the true digit (blue: model{}; below the red 1× line: a flip)</text>",
        TOP + PANEL + 16.0,
        if rows.reference { ", grey: reference" } else { "" }
    );
    if let Some(f) = first_flip.filter(|&f| f < rows.rows.len()) {
        let _ = writeln!(
            s,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{TOP}\" y2=\"{1:.1}\" stroke=\"#900\" stroke-dasharray=\"4 3\"/>\
             <text x=\"{2:.1}\" y=\"{3:.1}\" fill=\"#900\">first flip: {f}</text>",
            x(f),
            TOP + PANEL,
            x(f) + 4.0,
            TOP + 12.0
        );
    }
    if rows.reference {
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{kl_max:.3}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">0</text>",
            LEFT + plot_w,
            top2,
            top2,
            LEFT - 4.0,
            top2 + 4.0,
            LEFT - 4.0,
            top2 + PANEL
        );
        s.push_str(&lines(
            rows.rows
                .iter()
                .enumerate()
                .map(|(k, r)| (x(k), y2(r.kl_vs_ref))),
            "stroke=\"#c05000\" stroke-width=\"1\"",
        ));
        let _ = writeln!(
            s,
            "<text x=\"{LEFT}\" y=\"{:.1}\">noise: KL(reference ‖ model) per digit, nats</text>",
            top2 + PANEL + 16.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(k: u32, margin: f64, kl: f64) -> DigitRow {
        DigitRow {
            unit: k,
            char_offset: k,
            token_index: k as i32,
            token_id: 0,
            piece: String::new(),
            own_token: true,
            logprob: 0.0,
            rank: 0,
            margin,
            top1_token: 0,
            top1_piece: String::new(),
            kl_vs_ref: kl,
            top1_matches_ref: true,
            ref_margin: margin,
            ref_odds_percentile: 0.0,
            p_pick: Vec::new(),
        }
    }

    #[test]
    fn lines_break_at_missing_digits_and_the_flip_is_marked() {
        let rows = DigitRows {
            rows: vec![
                row(0, 2.0, 0.1),
                row(1, 1.0, 0.2),
                row(2, f64::NAN, f64::NAN),
                row(3, -1.0, 0.4),
                row(4, 3.0, 0.0),
            ],
            samplers: Vec::new(),
            reference: true,
        };
        let svg = digits_svg("a <b>", &rows, Some(3));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;b&gt;"));
        assert!(svg.contains("first flip: 3"));
        // Model odds, reference odds and KL: each split in two at digit 2.
        assert_eq!(svg.matches("<polyline").count(), 6);
        // The largest KL sits on the panel's top edge.
        assert!(svg.contains(">0.400</text>"));
        let no_ref = DigitRows {
            reference: false,
            ..rows
        };
        let svg = digits_svg("t", &no_ref, None);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(!svg.contains("noise") && !svg.contains("first flip"));
    }
}
