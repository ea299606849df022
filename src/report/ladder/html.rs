//! The ladder view as one self-contained HTML page with inline SVG plots:
//! the quality/size frontier, ΔNLL per window, the KL distribution.

use super::*;
use crate::core::present::Spread;
use crate::report::svg::*;

/// A metric against bits per weight, one point per model with its interval
/// as an error bar: the size/quality frontier.
pub(crate) fn pareto(v: &View, metric: &str, spread: Spread, label: &str) -> Option<String> {
    let lo = |r: &Row| spread.of(metric, &r.metrics);
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
    // The gates on this metric (or a bound of its interval): a line each.
    let mut gates: Vec<(String, String, f64)> = Vec::new();
    for t in v.rows.iter().flat_map(|r| &r.thresholds) {
        let on_metric =
            t.0 == metric || t.0.strip_prefix(metric).is_some_and(|r| r.starts_with('.'));
        if on_metric && t.2.is_finite() && !gates.contains(t) {
            gates.push(t.clone());
        }
    }
    ys.extend(gates.iter().map(|g| g.2));
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
    for (label, bound, threshold) in &gates {
        gate_line(&mut s, &f, label, bound, *threshold, *threshold);
    }
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

/// Row `r`'s series `name` (empty when it has none).
fn series_of<'a>(r: &'a Row, name: &str) -> &'a [f64] {
    r.series.get(name).map_or(&[][..], |s| &s[..])
}

/// A per-window series, one line per model.
pub(crate) fn per_window(
    v: &View,
    name: &str,
    title: &str,
    xlabel: &str,
    ylabel: &str,
) -> Option<String> {
    let series: Vec<(usize, &Row)> = v
        .rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !series_of(r, name).is_empty())
        .collect();
    if series.is_empty() {
        return None;
    }
    let n = series.iter().map(|s| series_of(s.1, name).len()).max()?;
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| series_of(s.1, name).iter().copied())
        .chain([0.0])
        .collect();
    let mut f = Frame::new(&[0.0, (n.max(2) - 1) as f64], &ys, false);
    f.xticks = XTicks::Integer;
    let mut s = f.open(title, xlabel, ylabel);
    for (i, r) in &series {
        let c = PALETTE[i % PALETTE.len()];
        let pts: Vec<String> = series_of(r, name)
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

/// A gate's threshold as a dashed red line at `y` (the threshold, or
/// where a log scale draws it), labelled `gate <metric> ≤ <threshold>`.
fn gate_line(s: &mut String, f: &Frame, label: &str, bound: &str, threshold: f64, y: f64) {
    let y = f.py(y);
    let op = if bound == "max" { "≤" } else { "≥" };
    let _ = write!(
        s,
        "<line class=\"gate\" x1=\"{ML}\" y1=\"{y:.1}\" x2=\"{x2}\" y2=\"{y:.1}\" stroke=\"#c00\" stroke-dasharray=\"6 3\"/>\
         <text x=\"{tx}\" y=\"{ty:.1}\" fill=\"#c00\" text-anchor=\"end\">gate {} {op} {threshold}</text>",
        esc(label),
        x2 = f.w - MR,
        tx = f.w - MR - 4.0,
        ty = y - 4.0,
    );
}

/// A distribution per model from its nine quantiles (p01, p05, p10,
/// median, p90, p95, p99, p99.9, max): a box from p10 to p90 with the
/// median, whiskers to p01 and p99, and marks at p99.9 and the maximum; log
/// scale, values below `floor` drawn at it.
pub(crate) fn quantiles(
    v: &View,
    q: &[&str; 9],
    floor: f64,
    title: &str,
    ylabel: &str,
) -> Option<String> {
    let rows: Vec<(usize, &Row, Vec<f64>)> = v
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let q: Option<Vec<f64>> = q
                .iter()
                .map(|k| r.metrics.get(*k).map(|v| v.max(floor)))
                .collect();
            Some((i, r, q?))
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    // The gates on a quantile (kld_p99 ≤ 0.5): a line each, in range.
    let mut gates: Vec<(String, String, f64)> = Vec::new();
    for t in v.rows.iter().flat_map(|r| &r.thresholds) {
        if q.contains(&t.0.as_str()) && t.2.is_finite() && !gates.contains(t) {
            gates.push(t.clone());
        }
    }
    let mut ys: Vec<f64> = rows.iter().flat_map(|r| r.2.iter().copied()).collect();
    ys.extend(gates.iter().map(|g| g.2.max(floor)));
    let mut f = Frame::new(&[-0.5, rows.len() as f64 - 0.5], &ys, true);
    f.x = (-0.5, rows.len() as f64 - 0.5);
    f.xticks = XTicks::None;
    let mut s = f.open(title, "model", ylabel);
    for (label, bound, threshold) in &gates {
        gate_line(&mut s, &f, label, bound, *threshold, threshold.max(floor));
    }
    for (slot, (i, r, q)) in rows.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let x = f.px(slot as f64);
        let _ = write!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{c}\"/>\
             <rect class=\"box\" x=\"{:.1}\" y=\"{:.1}\" width=\"24\" height=\"{:.1}\" fill=\"{c}\" fill-opacity=\"0.35\" stroke=\"{c}\"/>\
             <line x1=\"{:.1}\" y1=\"{m:.1}\" x2=\"{:.1}\" y2=\"{m:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>\
             <circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/><circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"none\" stroke=\"{c}\"/>",
            f.py(q[0]),
            f.py(q[6]),
            x - 12.0,
            f.py(q[4]),
            (f.py(q[2]) - f.py(q[4])).max(1.0),
            x - 12.0,
            x + 12.0,
            f.py(q[7]),
            f.py(q[8]),
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
pub(crate) fn html(views: &[View], outcomes: &[Outcome]) -> String {
    let mut s = String::from(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Quant ladder report</title>\
         <style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}\
         th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,th:first-child,td:last-child{text-align:left}\
         .fail{background:#fde0dc}.warn{background:#fff4ce}.error{background:#f4c7c3}figure{display:inline-block;margin:8px}</style></head><body>\n\
         <h1>Quant ladder report</h1>\n",
    );
    for v in views {
        let _ = writeln!(
            s,
            "<h2>{}</h2>\n<table><tr>{}</tr>",
            esc(&title(v)),
            head(v)
                .iter()
                .map(|h| format!("<th>{}</th>", esc(h)))
                .collect::<String>()
        );
        for r in &v.rows {
            let class = match r.status {
                Status::Pass if !r.warnings.is_empty() => "warn",
                Status::Pass => "pass",
                Status::Fail => "fail",
                Status::Error => "error",
            };
            let _ = writeln!(
                s,
                "<tr class=\"{class}\">{}</tr>",
                cells(v, r)
                    .iter()
                    .map(|c| format!("<td>{}</td>", esc(&c.replace("**", ""))))
                    .collect::<String>()
            );
        }
        s.push_str("</table>\n");
        for n in &v.notes {
            let _ = writeln!(s, "<p class=\"note\">{}</p>", esc(n));
        }
        for fig in v.plots.iter().filter_map(|p| match p {
            Plot::Frontier {
                metric,
                spread,
                label,
            } => pareto(v, metric, *spread, label),
            Plot::Series {
                series,
                title,
                xlabel,
                ylabel,
            } => per_window(v, series, title, xlabel, ylabel),
            Plot::Quantiles {
                metrics,
                floor,
                title,
                ylabel,
            } => quantiles(v, metrics, *floor, title, ylabel),
        }) {
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
    s.push_str(&esc(&legend(views)));
    s.push_str("</p>\n</body></html>\n");
    s
}
