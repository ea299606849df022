//! `quantgate prereg report`: every sealed comparison, wins and losses in
//! one table, decided from the reviewed goldens.

use crate::core::error::Result;
use crate::judge::prereg::verify_all;
use std::path::Path;

/// `quantgate prereg report`: every sealed comparison, wins and losses in
/// one table, decided from the reviewed goldens. Returns the text and
/// whether everything verified.
pub fn report(dir: &Path, suites: &Path, goldens: &Path) -> Result<(String, bool)> {
    use std::fmt::Write as _;
    let (checked, unsealed) = verify_all(dir, suites, goldens)?;
    let mut ok = unsealed.is_empty();
    let mut rows = vec![[
        "prereg".to_string(),
        "candidate vs baseline".into(),
        "metric".into(),
        "value [lo, hi]".into(),
        "outcome".into(),
        "predicted [low, high]".into(),
        "hit".into(),
        "sealed".into(),
    ]];
    let mut notes = Vec::new();
    let num = |v: f64| format!("{v:+.4}");
    for c in &checked {
        let Some(p) = &c.prereg else {
            ok = false;
            rows.push([
                c.line.path.clone(),
                "?".into(),
                "?".into(),
                "".into(),
                "INVALID".into(),
                "".into(),
                "".into(),
                c.line.time.clone(),
            ]);
            notes.extend(c.problems.iter().cloned());
            continue;
        };
        let pred = format!(
            "{} [{}, {}]",
            num(p.prediction.0),
            num(p.prediction.1),
            num(p.prediction.2)
        );
        let golden_path =
            crate::golden::Goldens::new(goldens.to_path_buf()).path(&p.case.0, &p.candidate.0);
        let (value, outcome, hit) = if !c.problems.is_empty() {
            ok = false;
            notes.extend(c.problems.iter().cloned());
            (String::new(), "INVALID".to_string(), String::new())
        } else {
            match std::fs::read_to_string(&golden_path) {
                Err(_) => ("".into(), "not run".into(), "".into()),
                Ok(text) => match crate::golden::parse(&text) {
                    Err(e) => {
                        ok = false;
                        notes.push(format!("{}:{e}", golden_path.display()));
                        ("".into(), "INVALID".into(), "".into())
                    }
                    Ok(g) if g.inputs.0.get("prereg_sha256") != Some(&p.sha256) => {
                        ok = false;
                        notes.push(format!(
                            "{}: recorded under prereg sha256 {:?}, the sealed file is {}",
                            golden_path.display(),
                            g.inputs.0.get("prereg_sha256"),
                            p.sha256
                        ));
                        ("".into(), "INVALID".into(), "".into())
                    }
                    Ok(g) => match p.decide(&g.metrics, &c.line.time) {
                        Err(e) => {
                            ok = false;
                            notes.push(format!("{}: {e}", golden_path.display()));
                            ("".into(), "INVALID".into(), "".into())
                        }
                        Ok(d) => {
                            let b: Vec<f64> = d.bounds.values().copied().collect();
                            let (lo, hi) = (
                                b.iter().copied().fold(f64::INFINITY, f64::min),
                                b.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                            );
                            (
                                format!("{} [{}, {}]", num(d.value), num(lo), num(hi)),
                                d.outcome.as_str().to_string(),
                                if d.prediction_hit { "yes" } else { "no" }.to_string(),
                            )
                        }
                    },
                },
            }
        };
        rows.push([
            p.ledger_path.clone(),
            format!("{} vs {}", p.candidate.0, p.baseline.0),
            format!("{} ({} windows)", p.metric.0, p.windows),
            value,
            outcome,
            pred,
            hit,
            c.line.time.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        let _ = writeln!(s, "{}", cells.join("  ").trim_end());
    }
    for c in &checked {
        if let Some(p) = &c.prereg {
            let _ = writeln!(s, "\n{}: {}", p.ledger_path, p.rule_text());
            if !p.note.trim().is_empty() {
                let _ = writeln!(s, "  note: {}", p.note.trim().replace('\n', "\n        "));
            }
        }
    }
    for n in unsealed.iter().chain(&notes) {
        let _ = writeln!(s, "\nerror: {n}");
    }
    Ok((s, ok))
}
