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
    h.push("verdict".into());
    h
}

/// A row's verdict: `reference`, `✓ pass (N gates)`, `⚠ pass (N gates)`
/// with its violated warn gates, `✗ FAIL` with its failed ones, or an
/// error. `short` leaves the gates out (the card's gates table names
/// them): `✗ FAIL (3 of 4 gates)`, `⚠ pass (1 of 2 gates warned)`.
pub(crate) fn verdict(r: &Row, short: bool) -> String {
    let warned = if r.warnings.is_empty() {
        String::new()
    } else {
        format!("; ⚠ {}", r.warnings.join("; ⚠ "))
    };
    let failed = r.marks.iter().filter(|m| m.mark == '✗').count();
    match r.status {
        _ if r.reference => "reference".to_string(),
        Status::Pass if r.warnings.is_empty() => format!("✓ pass ({} gates)", r.gates),
        Status::Pass if short => {
            format!("⚠ pass ({} of {} gates warned)", r.warnings.len(), r.gates)
        }
        Status::Pass => format!("⚠ pass ({} gates){warned}", r.gates),
        Status::Fail if short => format!("✗ **FAIL** ({failed} of {} gates)", r.gates),
        Status::Fail => format!("✗ **FAIL** {}{warned}", r.failures.join("; ")),
        Status::Error => format!("✗ **ERROR** {}{warned}", r.failures.join("; ")),
    }
}

/// Cells of a row under [`head`]: every titled column.
pub(crate) fn cells(v: &View, r: &Row) -> Vec<String> {
    row_cells(
        r,
        v.columns.iter().filter(|c| c.title().is_some()),
        Some(false),
    )
}

/// The model, size and BPW, the cells of `columns`, and with
/// `verdict_too` the row's verdict (`Some(short)`, see [`verdict`]).
fn row_cells<'a>(
    r: &Row,
    columns: impl Iterator<Item = &'a ViewColumn>,
    verdict_too: Option<bool>,
) -> Vec<String> {
    let mut c = vec![
        r.model.clone(),
        human_bytes(r.facts.bytes),
        num(r.facts.bpw, 2),
    ];
    c.extend(columns.map(|c| c.show(r)));
    if let Some(short) = verdict_too {
        c.push(verdict(r, short));
    }
    c
}

/// The most columns a model card's main table has (model, size, BPW, the
/// headline figures, the verdict); the other figures are in its details.
pub(crate) const CARD_COLUMNS: usize = 12;

/// The view's titled columns as the card lays them out: the headline ones
/// that fit in its main table ([`CARD_COLUMNS`]), and the rest.
fn card_columns(v: &View) -> (Vec<&ViewColumn>, Vec<&ViewColumn>) {
    let titled = v.columns.iter().filter(|c| c.title().is_some());
    let room = CARD_COLUMNS - 4;
    let mut main: Vec<&ViewColumn> = Vec::new();
    let mut rest: Vec<&ViewColumn> = Vec::new();
    for c in titled {
        if c.column.headline && main.len() < room {
            main.push(c);
        } else {
            rest.push(c);
        }
    }
    (main, rest)
}

/// A Markdown table: `head`, right-aligned but for the first and last
/// columns (with `last_left`), and `rows` (`|` escaped).
fn table(s: &mut String, head: &[String], rows: &[Vec<String>], last_left: bool) {
    let _ = writeln!(s, "| {} |", head.join(" | "));
    let n = head.len();
    let rule: Vec<&str> = (0..n)
        .map(|i| {
            if i == 0 || (last_left && i == n - 1) {
                "---"
            } else {
                "---:"
            }
        })
        .collect();
    let _ = writeln!(s, "|{}|", rule.join("|"));
    for r in rows {
        let c: Vec<String> = r.iter().map(|c| c.replace('|', "\\|")).collect();
        let _ = writeln!(s, "| {} |", c.join(" | "));
    }
}

/// A gate's value as its cell shows it: a whole number as such, else four
/// significant digits.
fn gate_value(v: Option<f64>) -> String {
    match v {
        None => "missing".into(),
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
        Some(x) if x == 0.0 || !x.is_finite() => format!("{x}"),
        Some(x) => {
            let digits = (3 - x.abs().log10().floor() as i64).clamp(0, 12) as usize;
            format!("{x:.digits$}")
        }
    }
}

/// The view's gates as a table: a column per gate (its rule in the kind's
/// words; the case beside it where two cases have the same rule), a row
/// per model with a gate, each cell ✓, ⚠ or ✗ with the value the gate
/// read, `–` where the gate does not apply to the model.
fn gates_table(s: &mut String, v: &View) {
    let mut gates: Vec<(&str, &str)> = Vec::new();
    for m in v.rows.iter().flat_map(|r| &r.marks) {
        if !gates.contains(&(m.case.as_str(), m.rule.as_str())) {
            gates.push((&m.case, &m.rule));
        }
    }
    if gates.is_empty() {
        return;
    }
    let shared = |rule: &str| gates.iter().filter(|g| g.1 == rule).count() > 1;
    let mut head = vec!["model".to_string()];
    head.extend(gates.iter().map(|(case, rule)| {
        if shared(rule) {
            format!("{rule} ({case})")
        } else {
            rule.to_string()
        }
    }));
    let rows: Vec<Vec<String>> = v
        .rows
        .iter()
        .filter(|r| !r.marks.is_empty())
        .map(|r| {
            let mut c = vec![r.model.clone()];
            c.extend(gates.iter().map(|(case, rule)| {
                r.marks
                    .iter()
                    .find(|m| m.case == *case && m.rule == *rule)
                    .map_or("–".into(), |m| {
                        format!("{} {}", m.mark, gate_value(m.observed))
                    })
            }));
            c
        })
        .collect();
    s.push_str("Gates: ✓ held, ⚠ violated (level warn: reported, not failed), ✗ failed; each with the value it read (a sequential gate's: its confidence sequence's bound at the stop).\n\n");
    table(s, &head, &rows, false);
    s.push('\n');
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

/// A YAML scalar: JSON's quoting (a JSON string is a YAML scalar).
fn yaml_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// The model card's front matter (YAML, as the Hugging Face Hub reads it):
/// `base_model` and `base_model_relation: quantized` when the base model's
/// Hub id is given, the `gguf` and `quantized` tags, and a `model-index`
/// (one entry, the release) with each row's figures the kinds list for the
/// Hub (PPL, KLD, MC accuracy), each named by its quant and measured by its
/// case, with the value the table shows.
pub(crate) fn front_matter(views: &[View], base_model: Option<&str>) -> String {
    let mut s = String::from("---\n");
    match base_model {
        Some(b) => {
            let _ = writeln!(s, "base_model: {}", yaml_str(b));
            s.push_str("base_model_relation: quantized\n");
        }
        None => s.push_str(
            "# base_model: the Hub id of the model these files quantize (--base-model ORG/NAME)\n",
        ),
    }
    s.push_str("tags:\n- gguf\n- quantized\n- quantgate\n");
    // One model-index entry (the Hub reads one per card: the release),
    // a result per quant and figure, named by both.
    let mut results = String::new();
    for v in views {
        for r in &v.rows {
            for (case, h) in &v.hub {
                let Some(value) = r.metrics.get(h.metric).filter(|x| x.is_finite()) else {
                    continue;
                };
                let _ =
                    write!(
                    results,
                    "  - task:\n      type: text-generation\n    dataset:\n      name: {}\n      \
                     type: {}\n    metrics:\n    - type: {}\n      value: {value:?}\n      \
                     name: {}\n",
                    yaml_str(case),
                    yaml_str(&format!("quantgate/{case}")),
                    yaml_str(h.hub_type),
                    yaml_str(&format!("{} of {} (reference {})", h.name, r.model, v.reference))
                );
            }
        }
    }
    if !results.is_empty() {
        let name = match (base_model, views.first()) {
            (Some(b), _) => format!("{b} GGUF quants"),
            (None, Some(v)) => format!("{} GGUF quants", v.reference),
            (None, None) => "GGUF quants".into(),
        };
        let _ = writeln!(s, "model-index:\n- name: {}\n  results:", yaml_str(&name));
        s.push_str(&results);
    }
    s.push_str("---\n\n");
    s
}

/// The Markdown report: a table per view and how to read it, under the
/// model card's front matter ([`front_matter`]; no `#` title of its own,
/// so it goes under the card's).
pub fn markdown(views: &[View]) -> String {
    model_card(views, None)
}

/// [`markdown()`] with the base model's Hub id in the front matter: per
/// view, the main table (at most [`CARD_COLUMNS`] columns: the headline
/// figures and the verdict), the gates table, what was measured, and the
/// other figures folded in a `<details>` section.
pub fn model_card(views: &[View], base_model: Option<&str>) -> String {
    let mut s = front_matter(views, base_model);
    s.push_str("## Quant ladder report\n\n");
    if views.is_empty() {
        s.push_str("No case with a reference model ran of a kind the report shows.\n");
    }
    for v in views {
        let _ = writeln!(s, "### {}\n", title(v));
        let (main, rest) = card_columns(v);
        let mut head: Vec<String> = ["model", "size", "BPW"].map(String::from).into();
        head.extend(main.iter().filter_map(|c| c.title()));
        head.push("verdict".into());
        let rows: Vec<Vec<String>> = v
            .rows
            .iter()
            .map(|r| row_cells(r, main.iter().copied(), Some(true)))
            .collect();
        table(&mut s, &head, &rows, true);
        s.push('\n');
        gates_table(&mut s, v);
        for n in &v.notes {
            let _ = writeln!(s, "{n}\n");
        }
        if !rest.is_empty() {
            let _ = writeln!(
                s,
                "<details>\n<summary>Every other figure ({} columns)</summary>\n",
                rest.len()
            );
            let mut head = vec!["model".to_string()];
            head.extend(rest.iter().filter_map(|c| c.title()));
            let rows: Vec<Vec<String>> = v
                .rows
                .iter()
                .map(|r| {
                    let mut c = vec![r.model.clone()];
                    c.extend(rest.iter().map(|c| c.show(r)));
                    c
                })
                .collect();
            table(&mut s, &head, &rows, false);
            s.push_str("\n</details>\n\n");
        }
    }
    if !views.is_empty() {
        let _ = writeln!(s, "{}", legend(views));
    }
    s
}
