//! Per-digit plots of a teacher-forcing case × model, as the seed's figures
//! draw them: the odds of the true digit (log scale, the reference's beside
//! the model's, 1× marking a flip) and the noise (KL against the
//! reference) per digit. Plain SVG, written atomically beside the Parquet.
//!
//! Contract: a pure rendering of [`DigitRows`]; digits without a row of
//! their own (NaN) break the lines instead of being drawn as zero.

use crate::kinds::teacher_forcing::DigitRows;
use std::fmt::Write;

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

/// The SVG of one case × model; `first_flip` is marked.
pub fn digits_svg(title: &str, rows: &DigitRows, first_flip: Option<usize>) -> String {
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
    use crate::kinds::teacher_forcing::DigitRow;

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
