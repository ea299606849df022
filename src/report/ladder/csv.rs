//! The ladder view as CSV: every number at full precision, a missing one
//! an empty field.

use super::*;

pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The CSV report: one line per view × model; the declared columns' fields
/// between the model's facts and its status (the header is the first
/// view's: every view has the same columns). Each header once: a field
/// two columns read (`windows`, `delta_nll_mean`) is written where it
/// first appears.
pub fn csv(views: &[View]) -> String {
    let mut s = String::from("reference,cases,model,bytes,bpw,");
    let all: Vec<String> = views
        .first()
        .map(|v| v.columns.iter().flat_map(ViewColumn::csv_headers).collect())
        .unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    let keep: Vec<bool> = all.iter().map(|f| seen.insert(f.clone())).collect();
    let fields: Vec<&String> = all
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(f, _)| f)
        .collect();
    for f in &fields {
        s.push_str(&csv_field(f));
        s.push(',');
    }
    let _ = writeln!(s, "status,failures,warnings");
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
            line.extend(
                v.columns
                    .iter()
                    .flat_map(|c| c.csv_values(r))
                    .zip(keep.iter().chain(std::iter::repeat(&true)))
                    .filter(|(_, k)| **k)
                    .map(|(f, _)| f),
            );
            line.push(if r.reference {
                "reference".into()
            } else {
                r.status.as_str().into()
            });
            line.push(csv_field(&r.failures.join("; ")));
            line.push(csv_field(&r.warnings.join("; ")));
            let _ = writeln!(s, "{}", line.join(","));
        }
    }
    s
}
