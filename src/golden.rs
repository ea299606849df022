//! Judge stage, second half: goldens, the reviewed outcome of every case ×
//! model, in insta's `.snap` layout so `cargo insta review` works on them.
//!
//! Contract: discrete outcomes (status, counts, gate verdicts) compare
//! exactly, floats within the case's tolerance, NaN never equal. A changed or
//! missing golden is written beside the old one as `.snap.new` (never over
//! it) unless the update mode says otherwise; under `CI` nothing is written
//! and an explicit update request is an error. A golden that does not parse
//! is a failure naming the file, never "missing". Golden files are written
//! atomically.

use crate::case::Case;
use crate::error::{Error, Result};
use crate::runner::{Outcome, Status};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Metrics that are counts: compared exactly.
const DISCRETE: &[&str] = &[
    "tokens_scored",
    "windows",
    "top1_matches",
    "top1_matches_ref",
    "windows_better",
    "first_error",
    "digits_correct",
    "complete",
    "units_expected",
    "tokens_generated",
    "max_tokens_reached",
    "units",
    "units_measured",
    "own_token_units",
    "all_own_tokens",
    "prompt_tokens_match",
    "first_flip",
    "flips",
    "ref_first_flip",
    "ref_flips",
];

/// What to do with a changed or missing golden (insta's modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateMode {
    /// Write `.snap.new` beside the golden and fail.
    New,
    /// Overwrite the golden and pass (gates still fail).
    Always,
    /// Write nothing and fail.
    No,
}

/// The update mode from `QUANTGATE_UPDATE` (else `INSTA_UPDATE`), given
/// whether `CI` is set: `auto` (the default) is `new` locally and `no` under
/// CI; asking to write under CI is an error.
pub fn update_mode_from(
    quantgate: Option<&str>,
    insta: Option<&str>,
    ci: bool,
) -> Result<UpdateMode> {
    let (var, value) = match (quantgate, insta) {
        (Some(v), _) => ("QUANTGATE_UPDATE", v),
        (None, Some(v)) => ("INSTA_UPDATE", v),
        (None, None) => ("QUANTGATE_UPDATE", "auto"),
    };
    let mode = match value {
        "auto" | "" => return Ok(if ci { UpdateMode::No } else { UpdateMode::New }),
        "new" | "unseen" => UpdateMode::New,
        "always" | "force" => UpdateMode::Always,
        "no" => UpdateMode::No,
        other => {
            return Err(Error::input(format!(
                "{var}=`{other}` is not one of \"auto\", \"new\", \"always\", \"no\""
            )))
        }
    };
    if ci && mode != UpdateMode::No {
        return Err(Error::input(format!(
            "{var}={value} asks to update goldens, but CI is set: goldens are never written under CI; \
             update them locally and commit the reviewed files"
        )));
    }
    Ok(mode)
}

/// The update mode of this process's environment.
pub fn update_mode() -> Result<UpdateMode> {
    let q = std::env::var("QUANTGATE_UPDATE").ok();
    let i = std::env::var("INSTA_UPDATE").ok();
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0");
    update_mode_from(q.as_deref(), i.as_deref(), ci)
}

/// Where goldens live, and how their paths are shown in messages.
#[derive(Debug, Clone)]
pub struct Goldens {
    /// Directory on disk.
    pub dir: PathBuf,
    /// How the directory is shown (`goldens`).
    pub shown: PathBuf,
}

impl Goldens {
    /// Goldens under `dir`, shown as `goldens/...`.
    pub fn new(dir: PathBuf) -> Self {
        Goldens {
            dir,
            shown: PathBuf::from("goldens"),
        }
    }

    /// The golden of `case` on `model`: `goldens/<case>/<model>.snap`.
    pub fn path(&self, case: &str, model: &str) -> PathBuf {
        self.dir.join(case).join(format!("{model}.snap"))
    }

    fn show(&self, p: &Path) -> String {
        self.shown
            .join(p.strip_prefix(&self.dir).unwrap_or(p))
            .display()
            .to_string()
    }
}

/// The inputs a golden was recorded with (its header's `info`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inputs(pub BTreeMap<String, String>);

impl Inputs {
    /// The inputs of `outcome`.
    pub fn of(outcome: &Outcome) -> Self {
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
            m.insert(
                "settings".into(),
                format!(
                    "n_ctx={} n_batch={} n_ubatch={} flash_attn={} kv={}{}",
                    s.n_ctx,
                    s.n_batch,
                    s.n_batch,
                    if s.flash_attn { "on" } else { "off" },
                    s.kv_type,
                    if s.min_rows > 0 {
                        format!(" min_rows={}", s.min_rows)
                    } else {
                        String::new()
                    }
                ),
            );
        }
        if let Some(t) = &outcome.token_stream_sha256 {
            m.insert("token_stream_sha256".into(), t.clone());
        }
        if let Some(d) = &outcome.prereg {
            m.insert("prereg".into(), d.prereg.clone());
            m.insert("prereg_sha256".into(), d.prereg_sha256.clone());
            m.insert("prereg_sealed_at".into(), d.sealed_at.clone());
        }
        Inputs(m)
    }

    /// Inputs whose change makes the golden another experiment, not a drift.
    const IDENTITY: &'static [&'static str] = &["case_sha256", "model_sha256", "prereg_sha256"];
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

fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else {
        // Shortest text that reads back as the same f64.
        format!("{v:?}")
    }
}

/// The body: status, metrics (sorted), gate verdicts.
pub fn body(outcome: &Outcome) -> String {
    let mut s = String::new();
    let status = match outcome.status {
        Status::Pass => "pass",
        Status::Fail => "fail",
        Status::Error => "error",
    };
    let _ = writeln!(s, "status: {status}");
    let _ = writeln!(s, "metrics:");
    for (k, v) in &outcome.metrics {
        let _ = writeln!(s, "  {k}: {}", fmt_value(*v));
    }
    let _ = writeln!(s, "gates:");
    for g in &outcome.gates {
        let op = if g.bound == "max" { "≤" } else { "≥" };
        let verdict = if g.passed { "pass" } else { "fail" };
        let _ = writeln!(
            s,
            "  {} {op} {}: {verdict}",
            g.metric,
            fmt_value(g.threshold)
        );
    }
    if let Some(d) = &outcome.prereg {
        let _ = writeln!(s, "prereg: {}", prereg_line(d));
    }
    if !outcome.texts.is_empty() {
        let _ = writeln!(s, "texts:");
        for (k, v) in &outcome.texts {
            let _ = writeln!(s, "  {k}: {}", yaml_scalar(v));
        }
    }
    s
}

/// `win; prediction hit` — the decision as the golden and the report show it.
pub fn prereg_line(d: &crate::prereg::Decision) -> String {
    format!(
        "{}; prediction {}",
        d.outcome.as_str(),
        if d.prediction_hit { "hit" } else { "missed" }
    )
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
pub fn parse(text: &str) -> std::result::Result<Parsed, String> {
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
            return Err(format!("{}: unexpected header line `{line}`", i + 1));
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
                        return Err(format!("{n}: metric `{k}` appears twice"));
                    }
                }
                "gates" => gates.push(rest.to_string()),
                "texts" => {
                    let (k, v) = rest
                        .split_once(": ")
                        .ok_or(format!("{n}: expected `name: text`"))?;
                    let v = yaml_unscalar(v).ok_or(format!("{n}: unterminated quoted text"))?;
                    if texts.insert(k.to_string(), v).is_some() {
                        return Err(format!("{n}: text `{k}` appears twice"));
                    }
                }
                _ => {
                    return Err(format!(
                        "{n}: indented line outside `metrics:`, `gates:` or `texts:`"
                    ))
                }
            }
        } else if !line.trim().is_empty() {
            return Err(format!("{n}: unexpected line `{line}`"));
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

/// Differences between a golden and the current outcome (its rendering,
/// parsed), one line each; empty when they match within tolerance.
pub fn compare(golden: &Parsed, now: &Parsed, case: &Case) -> Vec<String> {
    let mut diffs = Vec::new();
    if golden.status != now.status {
        diffs.push(format!("status: {} → {}", golden.status, now.status));
    }
    if golden.prereg != now.prereg {
        diffs.push(format!(
            "prereg: {} → {}",
            golden.prereg.as_deref().unwrap_or("(none)"),
            now.prereg.as_deref().unwrap_or("(none)")
        ));
    }
    let names: std::collections::BTreeSet<&String> =
        golden.metrics.keys().chain(now.metrics.keys()).collect();
    for k in names {
        match (golden.metrics.get(k), now.metrics.get(k)) {
            (Some(_), None) => diffs.push(format!("{k}: missing now")),
            (None, Some(v)) => diffs.push(format!("{k}: new metric = {}", fmt_value(*v))),
            (Some(b), Some(a)) => {
                if DISCRETE.contains(&k.as_str()) {
                    if a != b {
                        diffs.push(format!(
                            "{k}: {} → {} (counts compare exactly)",
                            fmt_value(*b),
                            fmt_value(*a)
                        ));
                    }
                } else {
                    let t = case.tolerance(k);
                    let allowed = t.atol + t.rtol * b.abs();
                    // NaN is never within tolerance, either way round.
                    let within = (a - b).abs() <= allowed;
                    if !within {
                        diffs.push(format!(
                            "{k}: {} → {} (|Δ| = {:.3e} > atol {:e} + rtol {:e}·|golden| = {:.3e})",
                            fmt_value(*b),
                            fmt_value(*a),
                            (a - b).abs(),
                            t.atol,
                            t.rtol,
                            allowed
                        ));
                    }
                }
            }
            (None, None) => {}
        }
    }
    let keys: std::collections::BTreeSet<&String> =
        golden.texts.keys().chain(now.texts.keys()).collect();
    for k in keys {
        match (golden.texts.get(k), now.texts.get(k)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => diffs.push(format!(
                "{k}: {} → {} (texts compare exactly)",
                a.map_or("(none)".into(), |v| format!("{v:?}")),
                b.map_or("(none)".into(), |v| format!("{v:?}"))
            )),
        }
    }
    if golden.gates != now.gates {
        diffs.push(format!(
            "gates: [{}] → [{}]",
            golden.gates.join("; "),
            now.gates.join("; ")
        ));
    }
    diffs
}

fn accept_hint(pending: &str, golden: &str) -> String {
    format!(
        "To review: `cargo insta review` (or accept all: `cargo insta accept`; by hand: `mv {pending} {golden}`)"
    )
}

/// Check `outcome` against its golden; write per `mode`. Ok(()) when the
/// golden matches (or was written in `Always` mode); Err(message) otherwise.
pub fn check(
    outcome: &Outcome,
    case: &Case,
    case_file: &str,
    goldens: &Goldens,
    mode: UpdateMode,
) -> std::result::Result<(), String> {
    if outcome.status == Status::Error {
        // An error is reported by itself; there is nothing to record.
        return Ok(());
    }
    let path = goldens.path(&outcome.case, &outcome.model);
    let pending = PathBuf::from(format!("{}.new", path.display()));
    let (shown, shown_new) = (goldens.show(&path), goldens.show(&pending));
    let rendered = render(outcome, case_file);
    let write = |dest: &Path| {
        crate::fsutil::write_atomic(dest, rendered.as_bytes())
            .map_err(|e| format!("writing {}: {e}", goldens.show(dest)))
    };
    let old = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{shown}: cannot read the golden: {e}")),
    };
    let Some(old) = old else {
        return match mode {
            UpdateMode::Always => write(&path),
            UpdateMode::New => {
                write(&pending)?;
                Err(format!(
                    "no golden yet for {}::{}; wrote {shown_new}:\n{}\n{}",
                    outcome.case,
                    outcome.model,
                    indent(&rendered),
                    accept_hint(&shown_new, &shown)
                ))
            }
            UpdateMode::No => Err(format!(
                "missing golden {shown} for {}::{} (nothing written: update mode `no`{}); \
                 run `cargo test --release` locally to write it, review and commit it",
                outcome.case,
                outcome.model,
                if std::env::var_os("CI").is_some() {
                    ", CI is set"
                } else {
                    ""
                }
            )),
        };
    };
    let golden = parse(&old).map_err(|e| {
        format!(
            "{shown}:{e}\nthe golden does not parse; it is not treated as missing. Fix it, or delete it and rerun to record a new one"
        )
    })?;
    let current = Inputs::of(outcome);
    let changed_inputs: Vec<String> = Inputs::IDENTITY
        .iter()
        .filter(|k| golden.inputs.0.get(**k) != current.0.get(**k))
        .map(|k| {
            format!(
                "  {k}: {} → {}",
                golden.inputs.0.get(*k).map_or("(none)", String::as_str),
                current.0.get(*k).map_or("(none)", String::as_str)
            )
        })
        .collect();
    let now =
        parse(&rendered).map_err(|e| format!("internal: a rendered golden does not parse: {e}"))?;
    let diffs = compare(&golden, &now, case);
    if changed_inputs.is_empty() && diffs.is_empty() {
        if mode != UpdateMode::No && pending.exists() {
            let _ = std::fs::remove_file(&pending);
        }
        return Ok(());
    }
    let what = if changed_inputs.is_empty() {
        format!(
            "golden {shown} changed:\n{}",
            diffs.iter().map(|d| format!("  {d}\n")).collect::<String>()
        )
    } else {
        format!(
            "golden {shown} was recorded with other inputs (another case version or model file), not compared value by value:\n{}\n",
            changed_inputs.join("\n")
        )
    };
    let diff = crate::diff::line_diff(&old, &rendered);
    match mode {
        UpdateMode::Always => write(&path),
        UpdateMode::New => {
            write(&pending)?;
            Err(format!(
                "{what}-old golden / +new outcome:\n{diff}wrote {shown_new}\n{}",
                accept_hint(&shown_new, &shown)
            ))
        }
        UpdateMode::No => Err(format!(
            "{what}-old golden / +new outcome:\n{diff}nothing written (update mode `no`)"
        )),
    }
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Goldens under `goldens` whose case × model is not in `expected`
/// (`(case, model)` pairs), sorted.
pub fn orphans(
    goldens: &Goldens,
    expected: &[(String, String)],
    known_cases: &[String],
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![goldens.dir.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(model) = name.strip_suffix(".snap") else {
                continue;
            };
            let case = p
                .parent()
                .and_then(|d| d.strip_prefix(&goldens.dir).ok())
                .map(|d| {
                    d.components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join("/")
                })
                .unwrap_or_default();
            let pair = (case.clone(), model.to_string());
            // A case that failed to parse keeps its goldens: we cannot tell.
            let parsed_case_known = expected.iter().any(|(c, _)| *c == case);
            if !expected.contains(&pair) && (parsed_case_known || !known_cases.contains(&case)) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The failure message for orphaned goldens.
pub fn orphans_message(goldens: &Goldens, orphans: &[PathBuf]) -> String {
    let list: Vec<String> = orphans.iter().map(|p| goldens.show(p)).collect();
    format!(
        "{} golden(s) belong to no case × model any more:\n{}\nremove them with:\n  git rm {}",
        list.len(),
        list.iter().map(|p| format!("  {p}\n")).collect::<String>(),
        list.join(" ")
    )
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
