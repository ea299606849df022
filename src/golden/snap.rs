//! The golden file format: insta's `.snap` layout (a YAML header with the
//! inputs the outcome was recorded with, then a plain body), written so
//! that `cargo insta accept` leaves a golden byte for byte as quantgate
//! wrote it, and read back line by line with the line of any error.

use crate::core::error::Malformed;
use crate::core::Outcome;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The inputs a golden was recorded with (its header's `info`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inputs(pub BTreeMap<String, String>);

impl Inputs {
    /// The inputs of `outcome`.
    pub(crate) fn of(outcome: &Outcome) -> Self {
        let mut m = BTreeMap::new();
        m.insert("case".into(), outcome.case.clone());
        m.insert(
            "case_sha256".into(),
            outcome.case_sha256.clone().unwrap_or_default(),
        );
        m.insert("model".into(), outcome.model.clone());
        m.insert(
            "model_sha256".into(),
            outcome.model_sha256.clone().unwrap_or_default(),
        );
        m.insert("build".into(), outcome.build.label());
        if let Some(s) = &outcome.settings {
            m.insert("settings".into(), s.describe());
        }
        if let Some(t) = &outcome.token_stream_sha256 {
            m.insert("token_stream_sha256".into(), t.clone());
        }
        if !outcome.runtimes.is_empty() {
            m.insert("runtimes".into(), outcome.runtimes.join("; "));
        }
        if let Some(d) = &outcome.prereg {
            m.insert("prereg".into(), d.prereg.clone());
            m.insert("prereg_sha256".into(), d.prereg_sha256.clone());
            m.insert("prereg_sealed_at".into(), d.sealed_at.clone());
        }
        Inputs(m)
    }

    /// Inputs whose change makes the golden another experiment, not a drift.
    pub(crate) const IDENTITY: &'static [&'static str] =
        &["case_sha256", "model_sha256", "prereg_sha256", "settings"];
}

/// A YAML scalar as insta's emitter writes it: plain unless it needs
/// quotes (insta's `need_quotes` rules), so `cargo insta accept` leaves a
/// golden byte for byte as quantgate wrote it.
fn yaml_scalar(s: &str) -> String {
    let special_start = s.starts_with(['&', '*', '?', '|', '-', '<', '>', '=', '!', '%', '@', '.']);
    let special_char = s.contains(|c: char| {
        matches!(
            c,
            ':' | '{' | '}' | '[' | ']' | ',' | '#' | '`' | '"' | '\'' | '\\'
        ) || (c.is_control())
    });
    let keyword = [
        "yes", "Yes", "YES", "no", "No", "NO", "True", "TRUE", "true", "False", "FALSE", "false",
        "on", "On", "ON", "off", "Off", "OFF", "null", "Null", "NULL", "~",
    ]
    .contains(&s);
    let needs = s.is_empty()
        || s.starts_with(' ')
        || s.ends_with(' ')
        || special_start
        || special_char
        || keyword
        || s.starts_with("0x")
        || s.parse::<i64>().is_ok()
        || s.parse::<f64>().is_ok();
    if !needs {
        return s.to_string();
    }
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Read back a scalar written by [`yaml_scalar`] (or by insta).
fn yaml_unscalar(s: &str) -> Option<String> {
    let s = s.trim();
    let Some(inner) = s.strip_prefix('"') else {
        return Some(s.to_string());
    };
    let inner = inner.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            'u' => {
                let hex: String = chars.by_ref().take(4).collect();
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
            }
            c => out.push(c),
        }
    }
    Some(out)
}

pub(crate) fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else {
        // Shortest text that reads back as the same f64.
        format!("{v:?}")
    }
}

/// The body: status, metrics (sorted), gate verdicts.
pub(crate) fn body(outcome: &Outcome) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "status: {}", outcome.status.as_str());
    let _ = writeln!(s, "metrics:");
    for (k, v) in &outcome.metrics {
        let _ = writeln!(s, "  {k}: {}", fmt_value(*v));
    }
    let _ = writeln!(s, "gates:");
    for g in &outcome.gates {
        let op = if g.bound == "max" { "≤" } else { "≥" };
        let verdict = if g.passed { "pass" } else { "fail" };
        // A warn gate says so (a fail gate, the default, as it always was).
        let level = if g.level.is_fail() { "" } else { " (warn)" };
        let _ = writeln!(
            s,
            "  {} {op} {}{level}: {verdict}",
            g.metric,
            fmt_value(g.threshold)
        );
    }
    if let Some(d) = &outcome.prereg {
        let _ = writeln!(s, "prereg: {}", d.line());
    }
    if !outcome.texts.is_empty() {
        let _ = writeln!(s, "texts:");
        for (k, v) in &outcome.texts {
            let _ = writeln!(s, "  {k}: {}", yaml_scalar(v));
        }
    }
    s
}

/// A line of a golden's `gates:` (as [`body`] writes it) split into its rule
/// (`metric op threshold`, with ` (warn)` for a warn gate) and its verdict
/// (`pass`, `fail`; None on a line without one).
pub(crate) fn gate_rule(line: &str) -> (&str, Option<&str>) {
    match line.rsplit_once(": ") {
        Some((rule, verdict)) => (rule, Some(verdict)),
        None => (line, None),
    }
}

/// The whole `.snap` file.
pub fn render(outcome: &Outcome, case_file: &str) -> String {
    let mut s = String::from("---\n");
    let _ = writeln!(s, "source: {}", yaml_scalar(case_file));
    let _ = writeln!(
        s,
        "expression: {}",
        yaml_scalar(&format!("{}::{}", outcome.case, outcome.model))
    );
    s.push_str("info:\n");
    for (k, v) in &Inputs::of(outcome).0 {
        let _ = writeln!(s, "  {k}: {}", yaml_scalar(v));
    }
    s.push_str("---\n");
    s.push_str(&body(outcome));
    s
}

/// A parsed golden.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// Header inputs.
    pub inputs: Inputs,
    /// `status:` value.
    pub status: String,
    /// Metrics by name.
    pub metrics: BTreeMap<String, f64>,
    /// Gate lines, as written.
    pub gates: Vec<String>,
    /// The `prereg:` decision line, if any.
    pub prereg: Option<String>,
    /// Text outcomes by name (compared exactly).
    pub texts: BTreeMap<String, String>,
    /// The body text (after the header).
    pub body: String,
}

/// Parse a golden; the error says which line is wrong.
pub fn parse(text: &str) -> std::result::Result<Parsed, Malformed> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, "---")) => {}
        _ => return Err("1: expected `---` (an insta .snap header)".into()),
    }
    let mut inputs = BTreeMap::new();
    let mut in_info = false;
    let mut body_start = None;
    for (i, line) in lines.by_ref() {
        if line == "---" {
            body_start = Some(i + 1);
            break;
        }
        if line == "info:" {
            in_info = true;
        } else if let Some(rest) = line.strip_prefix("  ").filter(|_| in_info) {
            let (k, v) = rest
                .split_once(": ")
                .ok_or(format!("{}: expected `key: value`", i + 1))?;
            let v = yaml_unscalar(v).ok_or(format!("{}: unterminated quoted value", i + 1))?;
            inputs.insert(k.to_string(), v);
        } else if line.starts_with("source: ") || line.starts_with("expression: ") {
            in_info = false;
        } else {
            return Err(format!("{}: unexpected header line `{line}`", i + 1).into());
        }
    }
    let body_start = body_start.ok_or("the header has no closing `---`")?;
    let body: String = text
        .lines()
        .skip(body_start)
        .map(|l| format!("{l}\n"))
        .collect();
    let mut status = None;
    let mut metrics = BTreeMap::new();
    let mut gates = Vec::new();
    let mut prereg = None;
    let mut texts = BTreeMap::new();
    let mut section = "";
    for (i, line) in text.lines().enumerate().skip(body_start) {
        let n = i + 1;
        if let Some(s) = line.strip_prefix("status: ") {
            status = Some(s.to_string());
        } else if let Some(s) = line.strip_prefix("prereg: ") {
            prereg = Some(s.to_string());
            section = "";
        } else if line == "metrics:" || line == "gates:" || line == "texts:" {
            section = &line[..line.len() - 1];
        } else if let Some(rest) = line.strip_prefix("  ") {
            match section {
                "metrics" => {
                    let (k, v) = rest
                        .split_once(": ")
                        .ok_or(format!("{n}: expected `name: value`"))?;
                    let v: f64 = v
                        .parse()
                        .map_err(|_| format!("{n}: `{v}` is not a number"))?;
                    if metrics.insert(k.to_string(), v).is_some() {
                        return Err(format!("{n}: metric `{k}` appears twice").into());
                    }
                }
                "gates" => gates.push(rest.to_string()),
                "texts" => {
                    let (k, v) = rest
                        .split_once(": ")
                        .ok_or(format!("{n}: expected `name: text`"))?;
                    let v = yaml_unscalar(v).ok_or(format!("{n}: unterminated quoted text"))?;
                    if texts.insert(k.to_string(), v).is_some() {
                        return Err(format!("{n}: text `{k}` appears twice").into());
                    }
                }
                _ => {
                    return Err(format!(
                        "{n}: indented line outside `metrics:`, `gates:` or `texts:`"
                    )
                    .into())
                }
            }
        } else if !line.trim().is_empty() {
            return Err(format!("{n}: unexpected line `{line}`").into());
        }
    }
    Ok(Parsed {
        inputs: Inputs(inputs),
        status: status.ok_or("no `status:` line")?,
        metrics,
        gates,
        prereg,
        texts,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_follow_insta_quoting_and_read_back() {
        assert_eq!(yaml_scalar("suites/ppl/x.toml"), "suites/ppl/x.toml");
        assert_eq!(yaml_scalar("ppl/x::m"), "\"ppl/x::m\"");
        assert_eq!(yaml_scalar("123"), "\"123\"");
        assert_eq!(yaml_scalar("off"), "\"off\"");
        assert_eq!(yaml_scalar("-a"), "\"-a\"");
        for s in [
            "plain",
            "a:b",
            "say \"hi\"",
            "back\\slash",
            "123",
            "",
            "tab\there",
        ] {
            assert_eq!(yaml_unscalar(&yaml_scalar(s)).as_deref(), Some(s), "{s}");
        }
    }
}
