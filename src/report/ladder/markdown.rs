//! The ladder view as a Markdown table (model-card ready).

use super::*;
use crate::core::present::num;

pub(crate) fn human_bytes(b: Option<u64>) -> String {
    match b {
        None => "–".into(),
        Some(b) if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
    }
}

/// The table's header: the report's own columns around the view's
/// declared ones.
pub(crate) fn head(v: &View) -> Vec<String> {
    let mut h: Vec<String> = ["model", "size", "BPW"].map(String::from).into();
    h.extend(v.columns.iter().filter_map(ViewColumn::title));
    h.push("gates".into());
    h
}

/// Cells of a row, as the Markdown table shows them.
pub(crate) fn cells(v: &View, r: &Row) -> Vec<String> {
    let verdict = match r.status {
        Status::Pass => format!("pass ({} gates)", r.gates),
        Status::Fail => format!("**FAIL** {}", r.failures.join("; ")),
        Status::Error => format!("**ERROR** {}", r.failures.join("; ")),
    };
    let mut c = vec![
        r.model.clone(),
        human_bytes(r.facts.bytes),
        num(r.facts.bpw, 2),
    ];
    c.extend(
        v.columns
            .iter()
            .filter(|c| c.title().is_some())
            .map(|c| c.show(r)),
    );
    c.push(verdict);
    c
}

pub(crate) fn title(v: &View) -> String {
    format!("Reference {} — {}", v.reference, v.cases.join(", "))
}

/// The views' legend: each kind's, once, in order.
pub(crate) fn legend(views: &[View]) -> String {
    let mut all: Vec<&str> = Vec::new();
    for l in views.iter().flat_map(|v| &v.legend) {
        if !all.contains(l) {
            all.push(l);
        }
    }
    all.join(" ")
}

/// The Markdown report: a table per view and how to read it.
pub fn markdown(views: &[View]) -> String {
    let mut s = String::from("# Quant ladder report\n\n");
    if views.is_empty() {
        s.push_str("No case with a reference model ran of a kind the report shows.\n");
    }
    for v in views {
        let head = head(v);
        let _ = writeln!(s, "## {}\n", title(v));
        let _ = writeln!(s, "| {} |", head.join(" | "));
        let _ = writeln!(
            s,
            "|{}|",
            head.iter()
                .enumerate()
                .map(|(i, _)| if i == 0 || i == head.len() - 1 {
                    "---"
                } else {
                    "---:"
                })
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &v.rows {
            let c: Vec<String> = cells(v, r)
                .into_iter()
                .map(|c| c.replace('|', "\\|"))
                .collect();
            let _ = writeln!(s, "| {} |", c.join(" | "));
        }
        s.push('\n');
        for n in &v.notes {
            let _ = writeln!(s, "{n}\n");
        }
    }
    if !views.is_empty() {
        let _ = writeln!(s, "{}", legend(views));
    }
    s
}
