//! A [`Review`] as a reviewer reads it: plain text for a terminal,
//! Markdown for a pull request's comment (a summary line, what moved or
//! flipped with old → new, its change and its noise, the changes within
//! noise folded away), or JSON with every change.
//!
//! Contract: the worst first; unchanged items are counted, never listed;
//! a golden changed with no commit message naming it is said in every
//! form.

use super::{Change, Class, Review};
use std::fmt::Write as _;

/// A changed golden file no commit message of the range explains.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unexplained {
    /// Its path in the repository (`goldens/ppl/x/m.snap`).
    pub path: String,
    /// Why it counts as unexplained.
    pub why: String,
}

/// What was compared, for the heading.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// The old side (`origin/main`, a folder, a file).
    pub base: &'a str,
    /// The new side (`HEAD`, `the working tree`, …).
    pub head: &'a str,
    /// Goldens changed with no message naming them (revisions only).
    pub unexplained: &'a [Unexplained],
}

/// The most rows a Markdown table lists (a comment stays readable and
/// under GitHub's size limit); `--format json` has them all.
pub(crate) const MARKDOWN_ROWS: usize = 100;

/// The most within-noise lines plain text lists.
const TEXT_NOISE_ROWS: usize = 50;

fn old_new(c: &Change) -> String {
    use super::Value;
    // Two texts: each around where they first differ.
    if let (Some(Value::Text(a)), Some(Value::Text(b))) = (&c.old, &c.new) {
        let (a, b) = around_difference(a, b);
        return format!("{a} → {b}");
    }
    let show = |v: &Option<Value>| v.as_ref().map_or("–".into(), |v| v.show());
    format!("{} → {}", show(&c.old), show(&c.new))
}

/// `a` and `b` cut to a few characters around their first difference
/// (`…` where cut), each on one line.
fn around_difference(a: &str, b: &str) -> (String, String) {
    const BEFORE: usize = 12;
    const AFTER: usize = 24;
    let (ca, cb): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let first = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    let start = first.saturating_sub(BEFORE);
    let cut = |cs: &[char]| {
        let end = (first + AFTER).min(cs.len());
        let mut s: String = cs[start.min(end)..end].iter().collect();
        s = s.replace('\n', "⏎");
        format!(
            "{}{s}{}",
            if start > 0 { "…" } else { "" },
            if end < cs.len() { "…" } else { "" }
        )
    };
    (cut(&ca), cut(&cb))
}

fn item(c: &Change) -> String {
    match &c.label {
        Some(l) => format!("{} ({l})", c.item.show()),
        None => c.item.show(),
    }
}

fn delta(c: &Change) -> String {
    c.delta.map_or(String::new(), |d| {
        format!("{}{}", if d > 0.0 { "+" } else { "" }, super::sig(d))
    })
}

fn noise(c: &Change) -> String {
    c.noise.as_ref().map_or(String::new(), |n| n.show())
}

/// The review as plain text: a heading with the summary, then every change
/// but the unchanged ones, worst first (within-noise lines capped).
pub fn text(r: &Review, cx: &Context) -> String {
    let mut s = format!(
        "quantgate diff {} → {}: {}\n",
        cx.base,
        cx.head,
        r.summary()
    );
    let listed: Vec<&Change> = r
        .changes
        .iter()
        .filter(|c| c.class != Class::Unchanged)
        .collect();
    let noisy = listed
        .iter()
        .filter(|c| c.class == Class::WithinNoise)
        .count();
    let mut shown_noise = 0;
    for c in &listed {
        if c.class == Class::WithinNoise {
            shown_noise += 1;
            if shown_noise > TEXT_NOISE_ROWS {
                continue;
            }
        }
        let mut line = format!(
            "{:<12}  {}  {}  {}",
            c.class.as_str(),
            c.test(),
            item(c),
            old_new(c)
        );
        if c.delta.is_some() {
            let _ = write!(line, "  Δ {}", delta(c));
        }
        if c.noise.is_some() {
            let _ = write!(line, "  ({})", noise(c));
        }
        s.push_str(&line);
        s.push('\n');
    }
    if noisy > TEXT_NOISE_ROWS {
        let _ = writeln!(
            s,
            "… and {} more within noise (--format json lists every change)",
            noisy - TEXT_NOISE_ROWS
        );
    }
    for u in cx.unexplained {
        let _ = writeln!(s, "unexplained: {}: {}", u.path, u.why);
    }
    for (input, tests, old, new) in inputs(r) {
        let _ = writeln!(s, "recorded with another {input} ({tests}): {old} → {new}");
    }
    for c in &r.undeclared {
        let _ = writeln!(
            s,
            "note: case `{c}` could not be read on either side: its metrics were held against the default tolerance"
        );
    }
    s
}

/// The input changes, one per (input, old, new): the input, which tests
/// (`3 tests` or the one), old, new.
fn inputs(r: &Review) -> Vec<(String, String, String, String)> {
    let mut grouped: Vec<(String, Vec<&str>, String, String)> = Vec::new();
    for i in &r.inputs {
        match grouped
            .iter_mut()
            .find(|g| g.0 == i.input && g.2 == i.old && g.3 == i.new)
        {
            Some(g) => g.1.push(&i.test),
            None => grouped.push((i.input.clone(), vec![&i.test], i.old.clone(), i.new.clone())),
        }
    }
    let none = |v: String| {
        if v.is_empty() {
            "(none)".to_string()
        } else {
            v
        }
    };
    grouped
        .into_iter()
        .map(|(input, tests, old, new)| {
            let which = match tests[..] {
                [one] => one.to_string(),
                _ => format!("{} tests", tests.len()),
            };
            (input, which, none(old), none(new))
        })
        .collect()
}

/// A Markdown table of `rows` (at most [`MARKDOWN_ROWS`]).
fn table(s: &mut String, rows: &[&Change], with_class: bool) {
    if with_class {
        s.push_str("| | test | what | old → new | Δ | noise |\n|---|---|---|---|---:|---|\n");
    } else {
        s.push_str("| test | what | old → new | Δ | noise |\n|---|---|---|---:|---|\n");
    }
    for c in rows.iter().take(MARKDOWN_ROWS) {
        let cells = [
            format!("`{}`", c.test()),
            item(c),
            old_new(c),
            delta(c),
            noise(c),
        ]
        .map(|x| x.replace('|', "\\|"));
        if with_class {
            let mark = match c.class {
                Class::Flipped => "✗ flipped",
                Class::Moved => "↕ moved",
                Class::Removed => "− removed",
                Class::Added => "+ added",
                Class::WithinNoise => "≈ within noise",
                Class::Unchanged => "unchanged",
            };
            let _ = writeln!(s, "| {mark} | {} |", cells.join(" | "));
        } else {
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
    }
    if rows.len() > MARKDOWN_ROWS {
        let _ = writeln!(
            s,
            "\n… and {} more (`quantgate diff --format json` lists every change).",
            rows.len() - MARKDOWN_ROWS
        );
    }
}

/// The review as a pull request comment: one summary line, a table of
/// what flipped, moved, was added or removed (worst first), the goldens no
/// commit message explains, and the changes within noise folded in
/// `<details>`.
pub fn markdown(r: &Review, cx: &Context) -> String {
    let mut s = String::from("### quantgate diff\n\n");
    let verdict = match (r.count(Class::Flipped), r.count(Class::Moved)) {
        (0, 0) => "✓",
        (0, _) => "↕",
        _ => "✗",
    };
    let _ = writeln!(
        s,
        "{verdict} `{}` → `{}`: {}\n",
        cx.base,
        cx.head,
        r.summary()
    );
    let worst: Vec<&Change> = r
        .changes
        .iter()
        .filter(|c| {
            matches!(
                c.class,
                Class::Flipped | Class::Moved | Class::Added | Class::Removed
            )
        })
        .collect();
    if worst.is_empty() {
        s.push_str("Nothing flipped, moved, was added or removed.\n\n");
    } else {
        table(&mut s, &worst, true);
        s.push('\n');
    }
    if !cx.unexplained.is_empty() {
        s.push_str("**Goldens changed with no explanation** (the project's rule: a commit message says why each golden changed):\n\n");
        for u in cx.unexplained {
            let _ = writeln!(s, "- `{}`: {}", u.path, u.why);
        }
        s.push('\n');
    }
    let changed_inputs = inputs(r);
    if !changed_inputs.is_empty() {
        s.push_str("**Recorded with other inputs:**\n\n");
        for (input, tests, old, new) in changed_inputs.iter().take(MARKDOWN_ROWS) {
            let _ = writeln!(s, "- `{input}` ({tests}): `{old}` → `{new}`");
        }
        s.push('\n');
    }
    let noisy: Vec<&Change> = r
        .changes
        .iter()
        .filter(|c| c.class == Class::WithinNoise)
        .collect();
    if !noisy.is_empty() {
        let _ = writeln!(
            s,
            "<details>\n<summary>{} within noise</summary>\n",
            noisy.len()
        );
        table(&mut s, &noisy, false);
        s.push_str("\n</details>\n\n");
    }
    for c in &r.undeclared {
        let _ = writeln!(
            s,
            "Note: case `{c}` could not be read on either side; its metrics were held against the default tolerance.\n"
        );
    }
    s
}

/// The review as data: the sides, the counts, every change but the
/// unchanged ones (worst first), the unexplained goldens and the cases
/// read without their declarations.
pub fn json(r: &Review, cx: &Context) -> serde_json::Value {
    let counts: serde_json::Map<String, serde_json::Value> = Class::ALL
        .iter()
        .map(|c| (c.as_str().replace(" ", "_"), r.count(*c).into()))
        .collect();
    let listed: Vec<&Change> = r
        .changes
        .iter()
        .filter(|c| c.class != Class::Unchanged)
        .collect();
    serde_json::json!({
        "base": cx.base,
        "head": cx.head,
        "models": r.models.len(),
        "cases": r.cases.len(),
        "summary": r.summary(),
        "counts": counts,
        "changes": listed,
        "unexplained": cx.unexplained,
        "undeclared": r.undeclared,
        "inputs": r.inputs,
    })
}
