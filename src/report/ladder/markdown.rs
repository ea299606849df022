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
    // ✓ every gate held, ⚠ a warn gate was violated, ✗ a gate failed.
    let warned = if r.warnings.is_empty() {
        String::new()
    } else {
        format!("; ⚠ {}", r.warnings.join("; ⚠ "))
    };
    let verdict = match r.status {
        _ if r.reference => "reference".to_string(),
        Status::Pass if r.warnings.is_empty() => format!("✓ pass ({} gates)", r.gates),
        Status::Pass => format!("⚠ pass ({} gates){warned}", r.gates),
        Status::Fail => format!("✗ **FAIL** {}{warned}", r.failures.join("; ")),
        Status::Error => format!("✗ **ERROR** {}{warned}", r.failures.join("; ")),
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
pub fn front_matter(views: &[View], base_model: Option<&str>) -> String {
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

/// [`markdown`] with the base model's Hub id in the front matter.
pub fn model_card(views: &[View], base_model: Option<&str>) -> String {
    let mut s = front_matter(views, base_model);
    s.push_str("## Quant ladder report\n\n");
    if views.is_empty() {
        s.push_str("No case with a reference model ran of a kind the report shows.\n");
    }
    for v in views {
        let head = head(v);
        let _ = writeln!(s, "### {}\n", title(v));
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
