//! Report stage: the table a person reads, `--timings`, and the `--json` file.
//!
//! Contract: JSON is one object per case × model (DESIGN.md, Outputs),
//! written atomically.

use crate::core::auth::Key;
use crate::core::error::Result;
use crate::core::{Outcome, Status};

pub mod ladder;
pub mod metrics_doc;
pub(crate) mod parquet;
pub mod prereg;
pub(crate) mod svg;
use std::fmt::Write as _;
use std::path::Path;

fn fmt_num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.6}")
    }
}

/// An outcome's metrics for the table: its headline ones present, in
/// order; all of them without a headline.
fn headline(o: &Outcome) -> Vec<(&str, f64)> {
    if o.headline.is_empty() {
        o.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    } else {
        o.headline
            .iter()
            .filter_map(|k| o.metrics.get(k).map(|v| (k.as_str(), *v)))
            .collect()
    }
}

/// The widest table the terminal gets (details stay in `--json`).
pub(crate) const TABLE_WIDTH: usize = 120;

/// The results table: per case (in order of first appearance), a header
/// with its headline metrics as aligned columns — as many as fit
/// [`TABLE_WIDTH`], the rest counted — and a row per model named
/// `case::model`; under a row its errors, violated gates and notes.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    let mut cases: Vec<&str> = Vec::new();
    for o in outcomes {
        if !cases.contains(&o.case.as_str()) {
            cases.push(&o.case);
        }
    }
    let name_w = outcomes
        .iter()
        .map(|o| o.case.chars().count() + o.model.chars().count() + 2)
        .max()
        .unwrap_or(4)
        .max(4);
    for case in cases {
        let rows: Vec<&Outcome> = outcomes.iter().filter(|o| o.case == case).collect();
        // Columns: the headline metrics, in the order the rows give them.
        let mut cols: Vec<&str> = Vec::new();
        for o in &rows {
            for (k, _) in headline(o) {
                if !cols.contains(&k) {
                    cols.push(k);
                }
            }
        }
        let cell =
            |o: &Outcome, k: &str| o.metrics.get(k).map_or("–".to_string(), |v| fmt_num(*v));
        let widths: Vec<usize> = cols
            .iter()
            .map(|k| {
                rows.iter()
                    .map(|o| cell(o, k).chars().count())
                    .max()
                    .unwrap_or(0)
                    .max(k.chars().count())
            })
            .collect();
        let all_metrics = rows.iter().map(|o| o.metrics.len()).max().unwrap_or(0);
        let fitting = |budget: usize| {
            let mut used = name_w + 2 + 6;
            let mut shown = 0;
            for w in &widths {
                if used + 2 + w > budget {
                    break;
                }
                used += 2 + w;
                shown += 1;
            }
            shown
        };
        // Room for `  (+N more in --json)` when not every metric fits.
        let shown = match fitting(TABLE_WIDTH) {
            n if n == cols.len() && n == all_metrics => n,
            _ => fitting(TABLE_WIDTH - 24),
        };
        let more = all_metrics.saturating_sub(shown);
        let _ = write!(s, "{case:<name_w$}  {:<6}", "status");
        for (k, w) in cols.iter().zip(&widths).take(shown) {
            let _ = write!(s, "  {k:>w$}");
        }
        if more > 0 {
            let _ = write!(s, "  (+{more} more in --json)");
        }
        s.push('\n');
        for o in rows {
            let status = match o.status {
                Status::Pass => "pass",
                Status::Fail => "FAIL",
                Status::Error => "ERROR",
            };
            let name = format!("{}::{}", o.case, o.model);
            let _ = write!(s, "{name:<name_w$}  {status:<6}");
            let indent = format!("{:<name_w$}  {:<6}", "", "");
            if let Some(e) = &o.error {
                // Every line of the error: several problems in one file are
                // reported together, and each matters.
                let mut lines = e.lines();
                let _ = writeln!(s, "  {}", lines.next().unwrap_or_default());
                for line in lines {
                    let _ = writeln!(s, "{indent}  {line}");
                }
            } else {
                for (k, w) in cols.iter().zip(&widths).take(shown) {
                    let _ = write!(s, "  {:>w$}", cell(o, k));
                }
                s.push('\n');
            }
            let under_row = name_w + 8;
            for g in o.gates.iter().filter(|g| !g.passed) {
                under(&mut s, under_row, "gate", &g.describe());
            }
            for note in &o.notes {
                under(&mut s, under_row, "note", note);
            }
            if let Some(d) = &o.prereg {
                let text = format!(
                    "{} (sealed {}; predicted {} in [{}, {}])",
                    d.line(),
                    d.sealed_at,
                    fmt_num(d.prediction[0]),
                    fmt_num(d.prediction[1]),
                    fmt_num(d.prediction[2]),
                );
                under(&mut s, under_row, &format!("prereg {}", d.prereg), &text);
            }
        }
    }
    let pass = outcomes.iter().filter(|o| o.status == Status::Pass).count();
    let errors = outcomes
        .iter()
        .filter(|o| o.status == Status::Error)
        .count();
    let _ = writeln!(
        s,
        "\n{pass} passed, {} failed, {errors} errors (cases that could not run)",
        outcomes.len() - pass - errors
    );
    s
}

/// `label: text` on lines under a row, indented `indent` (at most a third
/// of the width), wrapped at spaces to fit [`TABLE_WIDTH`] (a word longer
/// than the room stays whole).
fn under(s: &mut String, indent: usize, label: &str, text: &str) {
    let first = format!("{:w$}  {label}: ", "", w = indent.min(TABLE_WIDTH / 3));
    let cont = " ".repeat(first.chars().count());
    let mut line = first;
    let mut empty = true;
    for word in text.split(' ') {
        if !empty && line.chars().count() + 1 + word.chars().count() > TABLE_WIDTH {
            s.push_str(line.trim_end());
            s.push('\n');
            line = cont.clone();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    s.push_str(&line);
    s.push('\n');
}

/// Per-model stage timings (seconds), summed over that model's cases (a
/// decode shared by several cases counts its share to each), the
/// reference work done in shared decodes ((model, seconds, products)),
/// the same seconds per case, and the run's wall `phases` with their
/// shares.
pub fn timings(
    outcomes: &[Outcome],
    reference_work: &[(String, f64, usize)],
    phases: &[(&str, f64)],
) -> String {
    let by_model = stage_sums(outcomes, |o| &o.model);
    let mut s = format!(
        "{:<16} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>10} {:>10}\n",
        "model",
        "prepare",
        "load",
        "tokenize",
        "decode",
        "measure",
        "total",
        "measure%",
        "peak_rss"
    );
    let rss = peak_rss_kib().map_or("-".to_string(), |k| format!("{} MiB", k / 1024));
    for (m, (_, e)) in by_model {
        let pct = if e[3] > 0.0 {
            100.0 * e[4] / e[3]
        } else {
            f64::NAN
        };
        let _ = writeln!(
            s,
            "{m:<16} {:>8.2} {:>8.2} {:>9.3} {:>8.2} {:>8.3} {:>8.2} {:>9.2}% {:>10}",
            e[0], e[1], e[2], e[3], e[4], e[5], pct, rss
        );
    }
    for (model, secs, n) in reference_work {
        let _ = writeln!(
            s,
            "reference work on {model}: {secs:.2} s ({n} product{})",
            if *n == 1 { "" } else { "s" }
        );
    }
    s.push_str(&by_case(outcomes));
    if !phases.is_empty() {
        let total: f64 = phases.iter().map(|p| p.1).sum();
        let _ = writeln!(
            s,
            "\n{:<28} {:>9} {:>7}",
            "phase (wall)", "seconds", "share"
        );
        for (name, secs) in phases {
            let _ = writeln!(
                s,
                "{name:<28} {secs:>9.2} {:>6.1}%",
                100.0 * secs / total.max(f64::MIN_POSITIVE)
            );
        }
        let _ = writeln!(s, "{:<28} {total:>9.2}", "total");
    }
    s
}

/// Per key of `outcomes` (`key`: its model, its case), how many trials and
/// the seconds of their stages summed: prepare, load, tokenize, decode,
/// measure, total (a decode shared by several trials counts its share to
/// each).
fn stage_sums<'a>(
    outcomes: &'a [Outcome],
    key: impl Fn(&'a Outcome) -> &'a str,
) -> std::collections::BTreeMap<&'a str, (usize, [f64; 6])> {
    let mut sums: std::collections::BTreeMap<&str, (usize, [f64; 6])> = Default::default();
    for o in outcomes {
        let t = &o.timings;
        let e = sums.entry(key(o)).or_default();
        e.0 += 1;
        for (i, d) in [t.prepare, t.load, t.tokenize, t.decode, t.measure, t.total]
            .iter()
            .enumerate()
        {
            e.1[i] += d.as_secs_f64();
        }
    }
    sums
}

/// Per case: how many models it ran, and the seconds summed over its
/// trials ([`stage_sums`]; setup is prepare, load and tokenize): where a
/// run's time went, case by case.
fn by_case(outcomes: &[Outcome]) -> String {
    let mut s = format!(
        "\n{:<28} {:>6} {:>9} {:>8} {:>8} {:>8}\n",
        "case", "models", "setup", "decode", "measure", "total"
    );
    for (case, (n, e)) in stage_sums(outcomes, |o| &o.case) {
        let _ = writeln!(
            s,
            "{case:<28} {n:>6} {:>9.2} {:>8.2} {:>8.3} {:>8.2}",
            e[0] + e[1] + e[2],
            e[3],
            e[4],
            e[5]
        );
    }
    s
}

/// Peak resident set size of this process (Linux `VmHWM`), KiB.
pub(crate) fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Write the `--json` file.
/// With `key`, each outcome carries its MAC.
pub fn write_json(path: &Path, outcomes: &[Outcome], key: Option<&Key>) -> Result<()> {
    let values = outcomes
        .iter()
        .map(|o| crate::core::keys::outcome_json(o, key))
        .collect::<Result<Vec<_>>>()?;
    let body = serde_json::to_string_pretty(&values)
        .map_err(|e| crate::core::error::Error::harness(format!("serialising results: {e}")))?;
    crate::core::fsutil::write_atomic(path, format!("{body}\n").as_bytes())
}

/// The JSON file of one outcome under `dir`: `<dir>/<case>/<model>.json`,
/// the object `--json` writes for it (what `quantgate merge` reads back).
pub(crate) fn outcome_json_path(dir: &Path, o: &Outcome) -> std::path::PathBuf {
    dir.join(&o.case).join(format!("{}.json", o.model))
}

/// Write one outcome as its own JSON file ([`outcome_json_path`]), with
/// its MAC under `key` when one is given.
pub(crate) fn write_outcome_json(dir: &Path, o: &Outcome, key: Option<&Key>) -> Result<()> {
    let body = serde_json::to_string_pretty(&crate::core::keys::outcome_json(o, key)?)
        .map_err(|e| crate::core::error::Error::harness(format!("serialising results: {e}")))?;
    crate::core::fsutil::write_atomic(&outcome_json_path(dir, o), format!("{body}\n").as_bytes())
}

/// Remove what interrupted writers left in `dir`'s product folders, the
/// folders of the planned cases (`<dir>/<case>/`) and nothing deeper or
/// elsewhere: `--out ~` never walks the home folder.
pub fn clean_product_temps(dir: &Path, planned: &[crate::plan::Planned]) {
    let cases: std::collections::BTreeSet<&str> = planned
        .iter()
        .map(|p| crate::core::outcome::split_test_name(&p.name).0)
        .collect();
    for case in cases {
        crate::core::fsutil::clean_stale_temps_to(&dir.join(case), 1);
    }
}

/// The Parquet file of one outcome under `dir`: `<dir>/<case>/<model>.parquet`.
pub fn parquet_path(dir: &Path, o: &Outcome) -> std::path::PathBuf {
    dir.join(&o.case).join(format!("{}.parquet", o.model))
}

/// Write an outcome's per-position rows (nothing when its kind rendered
/// none) and the files its kind rendered beside them (plots).
pub fn write_parquet(dir: &Path, o: &Outcome) -> Result<()> {
    let sha = o.model_sha256.as_deref().unwrap_or_default();
    let dest = parquet_path(dir, o);
    if let Some(rows) = &o.rows {
        parquet::write_table(&dest, &o.case, &o.model, sha, rows)?;
    }
    for a in &o.artifacts {
        crate::core::fsutil::write_atomic(&dest.with_extension(a.extension), a.body.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_an_error_is_in_the_table() {
        let build = crate::engine::Engine::build(&crate::engine::fake::FakeEngine::new());
        let mut o = Outcome::new("ppl/x", "m", build);
        o.error = Some("x.toml:3:1: first\nx.toml:7:5: second\nx.toml:9:2: third".into());
        let t = table(&[o]);
        for want in ["first", "second", "third"] {
            assert!(t.contains(want), "{want} missing:\n{t}");
        }
        assert!(t.contains("0 passed, 0 failed, 1 errors"), "{t}");
    }

    /// `--timings`: per case the seconds of its trials summed, and the
    /// run's wall phases with their shares of the whole.
    #[test]
    fn timings_sum_each_case_and_share_the_wall_phases() {
        use std::time::Duration;
        let build = crate::engine::Engine::build(&crate::engine::fake::FakeEngine::new());
        let trial = |case: &str, model: &str, decode: u64| {
            let mut o = Outcome::new(case, model, build.clone());
            o.timings.decode = Duration::from_secs(decode);
            o.timings.total = Duration::from_secs(decode + 1);
            o
        };
        let outcomes = [
            trial("release/kld", "q8", 10),
            trial("release/kld", "q2", 4),
            trial("release/mc", "q8", 2),
        ];
        let t = timings(
            &outcomes,
            &[],
            &[("plan", 1.0), ("run", 6.0), ("report", 1.0)],
        );
        let row = |name: &str| {
            t.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{name}: {t}"))
                .split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>()
        };
        // case, models, setup, decode, measure, total
        assert_eq!(
            row("release/kld")[1..],
            ["2", "0.00", "14.00", "0.000", "16.00"]
        );
        assert_eq!(
            row("release/mc")[1..],
            ["1", "0.00", "2.00", "0.000", "3.00"]
        );
        assert_eq!(row("run")[1..], ["6.00", "75.0%"]);
        assert_eq!(row("total")[1..], ["8.00"]);
    }

    /// Per case a header of aligned headline columns and a row per model
    /// (`case::model`); the rest counted, never wider than 120 columns.
    #[test]
    fn the_table_shows_the_headline_and_counts_the_rest() {
        let build = crate::engine::Engine::build(&crate::engine::fake::FakeEngine::new());
        let mut o = Outcome::new("kld/x", "m", build);
        o.status = Status::Pass;
        for (k, v) in [
            ("kld_mean", 0.5),
            ("kld_p99", 2.0),
            ("dp_p05", 0.1),
            ("gated", 1.0),
        ] {
            o.metrics.insert(k.into(), v);
        }
        let all = table(std::slice::from_ref(&o));
        let lines: Vec<&str> = all.lines().collect();
        assert!(
            lines[0].contains("dp_p05") && !all.contains("more in --json"),
            "{all}"
        );
        let cols: Vec<&str> = lines[0].split_whitespace().collect();
        let vals: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(vals[0], "kld/x::m");
        let at = cols.iter().position(|c| *c == "dp_p05").unwrap();
        assert_eq!(vals[at], "0.100000", "{all}");
        o.headline = vec![
            "kld_mean".into(),
            "absent".into(),
            "kld_p99".into(),
            "gated".into(),
        ];
        let t = table(std::slice::from_ref(&o));
        let head: Vec<&str> = t.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            head,
            ["kld/x", "status", "kld_mean", "kld_p99", "gated", "(+1", "more", "in", "--json)"],
            "{t}"
        );
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .ends_with("0.500000        2      1"),
            "{t}"
        );
        // A violated gate's line under the row wraps within the width.
        let mut g = crate::core::GateResult {
            metric: "a_rather_long_metric_name_for_a_gate".into(),
            bound: "max".into(),
            threshold: 0.05,
            observed: Some(0.123456789),
            passed: false,
            interval: None,
            sequence: None,
            level: Default::default(),
            title: String::new(),
        };
        let mut wide = o.clone();
        wide.model = "a-model-with-a-long-name.Q4_K_M-00001-of-00003".into();
        wide.notes = vec!["word ".repeat(40)];
        wide.gates.push(g.clone());
        g.metric = "another_rather_long_metric_name_for_a_second_gate".into();
        wide.gates.push(g);
        let t = table(&[wide]);
        assert!(t.lines().all(|l| l.chars().count() <= TABLE_WIDTH), "{t}");
        assert!(
            t.contains("another_rather_long_metric_name_for_a_second_gate"),
            "{t}"
        );
        assert_eq!(t.matches("word").count(), 40, "{t}");
        // Many metrics: as many columns as fit 120, the rest counted.
        o.headline.clear();
        for k in 0..40 {
            o.metrics
                .insert(format!("metric_number_{k:02}"), 1234.5678 * k as f64);
        }
        let t = table(&[o]);
        assert!(t.lines().all(|l| l.chars().count() <= 140), "{t}");
        assert!(
            t.lines()
                .skip(1)
                .take(1)
                .all(|l| l.chars().count() <= TABLE_WIDTH),
            "{t}"
        );
        assert!(t.contains("more in --json"), "{t}");
    }
}
