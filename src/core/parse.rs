//! TOML → typed values, with errors as `path:line:col: key: message`.
//!
//! Contract: syntax errors and every non-finite number (`nan`, `inf`) in a
//! file are collected and reported together; then serde (with
//! `deny_unknown_fields` on every struct) reports type errors, missing and
//! unknown keys, an unknown key with the nearest known one.

use crate::core::case::Location;
use crate::core::error::{Error, Result};
use crate::core::fsutil::line_col;
use serde::de::DeserializeOwned;
use std::path::Path;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Parse `src` (read from `path`) into `T`.
pub(crate) fn parse_toml<T: DeserializeOwned>(path: &Path, src: &str) -> Result<T> {
    let (root, syntax) = DeTable::parse_recoverable(src);
    let mut errors: Vec<Error> = syntax
        .iter()
        .map(|e| located(path, src, e.span().map(|s| s.start), None, e.message()))
        .collect();
    if errors.is_empty() {
        walk_non_finite(path, src, root.get_ref(), &mut String::new(), &mut errors);
    }
    if !errors.is_empty() {
        return Err(crate::core::error::join(errors));
    }
    toml::from_str::<T>(src).map_err(|e| {
        let at = e.span().map(|s| s.start);
        let key = at.and_then(|p| key_path_at(root.get_ref(), p));
        let mut msg = e.message().trim().to_string();
        if let Some(unknown) = msg
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
        {
            let expected = expected_names(&msg);
            if let Some(n) = nearest(unknown, expected.iter().map(String::as_str)) {
                msg = format!(
                    "unknown key `{unknown}` (did you mean `{n}`?); allowed: {}",
                    expected.join(", ")
                );
            } else {
                msg = format!("unknown key `{unknown}`; allowed: {}", expected.join(", "));
            }
        } else if let Some(rest) = msg.strip_prefix("missing field `") {
            msg = format!("missing key `{}", rest);
        }
        located(path, src, at, key.as_deref(), &msg)
    })
}

fn located(path: &Path, src: &str, at: Option<usize>, key: Option<&str>, msg: &str) -> Error {
    let loc = at
        .map(|p| {
            let (l, c) = line_col(src, p);
            format!(":{l}:{c}")
        })
        .unwrap_or_default();
    let key = key
        .filter(|k| !k.is_empty())
        .map(|k| format!(" {k}:"))
        .unwrap_or_default();
    Error::input(format!("{}{loc}:{key} {msg}", path.display()))
}

fn walk_non_finite(
    path: &Path,
    src: &str,
    table: &DeTable<'_>,
    prefix: &mut String,
    errors: &mut Vec<Error>,
) {
    for (k, v) in table {
        let len = prefix.len();
        if !prefix.is_empty() {
            prefix.push('.');
        }
        prefix.push_str(k.get_ref());
        walk_value(path, src, v, prefix, errors);
        prefix.truncate(len);
    }
}

fn walk_value(
    path: &Path,
    src: &str,
    v: &Spanned<DeValue<'_>>,
    prefix: &mut String,
    errors: &mut Vec<Error>,
) {
    match v.get_ref() {
        DeValue::Float(f) => {
            let s = f.as_str();
            if s.contains("nan") || s.contains("inf") {
                errors.push(located(
                    path,
                    src,
                    Some(v.span().start),
                    Some(prefix),
                    &format!(
                        "`{s}` is not a finite number; thresholds and parameters must be finite"
                    ),
                ));
            }
        }
        DeValue::Table(t) => walk_non_finite(path, src, t, prefix, errors),
        DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                let len = prefix.len();
                prefix.push_str(&format!("[{i}]"));
                walk_value(path, src, item, prefix, errors);
                prefix.truncate(len);
            }
        }
        _ => {}
    }
}

/// The dotted key path whose key or value covers byte `pos`.
fn key_path_at(table: &DeTable<'_>, pos: usize) -> Option<String> {
    fn in_value(v: &Spanned<DeValue<'_>>, pos: usize, out: &mut String) {
        match v.get_ref() {
            DeValue::Table(t) => {
                if let Some(p) = key_path_at(t, pos) {
                    out.push('.');
                    out.push_str(&p);
                }
            }
            DeValue::Array(a) => {
                for (i, item) in a.iter().enumerate() {
                    if item.span().contains(&pos)
                        || matches!(item.get_ref(), DeValue::Table(t) if key_path_at(t, pos).is_some())
                    {
                        out.push_str(&format!("[{i}]"));
                        in_value(item, pos, out);
                        return;
                    }
                }
            }
            _ => {}
        }
    }
    for (k, v) in table {
        let inside_table = matches!(v.get_ref(), DeValue::Table(t) if key_path_at(t, pos).is_some())
            || matches!(v.get_ref(), DeValue::Array(a) if a.iter().any(|i| i.span().contains(&pos) || matches!(i.get_ref(), DeValue::Table(t) if key_path_at(t, pos).is_some())));
        if k.span().contains(&pos) || v.span().contains(&pos) || inside_table {
            let mut out = k.get_ref().to_string();
            in_value(v, pos, &mut out);
            return Some(out);
        }
    }
    None
}

fn expected_names(msg: &str) -> Vec<String> {
    let Some(rest) = msg.split_once("expected").map(|(_, r)| r) else {
        return Vec::new();
    };
    rest.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The candidate closest to `word`, if it is close enough to be a typo.
pub(crate) fn nearest<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|(d, c)| *d <= (c.len().max(word.len()) / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Every validation error of one file, collected with its `path:line:col`
/// and reported together.
pub struct Diagnostics<'a> {
    path: &'a Path,
    src: &'a str,
    errors: Vec<Error>,
}

impl<'a> Diagnostics<'a> {
    /// Collect errors of `src`, read from `path`.
    pub(crate) fn new(path: &'a Path, src: &'a str) -> Self {
        Diagnostics {
            path,
            src,
            errors: Vec::new(),
        }
    }

    /// The file, as messages show it.
    pub(crate) fn path(&self) -> &'a Path {
        self.path
    }

    /// `path:line:col` of a byte offset.
    pub(crate) fn at(&self, offset: usize) -> Location {
        let (l, c) = line_col(self.src, offset);
        Location(format!("{}:{l}:{c}", self.path.display()))
    }

    /// An error at `loc`: `loc: msg`.
    pub(crate) fn push(&mut self, loc: &Location, msg: impl std::fmt::Display) {
        self.errors.push(Error::input(format!("{loc}: {msg}")));
    }

    /// An error at a byte offset.
    pub(crate) fn push_at(&mut self, offset: usize, msg: impl std::fmt::Display) {
        let loc = self.at(offset);
        self.push(&loc, msg);
    }

    /// `value`, or every error collected.
    pub(crate) fn finish<T>(self, value: T) -> Result<T> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            Err(crate::core::error::join(self.errors))
        }
    }
}

/// Declares a kind's own case table: the struct with the kind's keys, plus
/// the keys every case shares (parsed by the plan stage's head parser), so
/// that `deny_unknown_fields` rejects every key neither knows.
macro_rules! case_table {
    ($(#[$m:meta])* struct $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct $name {
            $($body)*
            kind: serde::de::IgnoredAny,
            #[serde(default)]
            description: serde::de::IgnoredAny,
            models: serde::de::IgnoredAny,
            #[serde(default)]
            reference: serde::de::IgnoredAny,
            #[serde(default)]
            prereg: serde::de::IgnoredAny,
            #[serde(default)]
            gate: serde::de::IgnoredAny,
            #[serde(default)]
            tolerance: serde::de::IgnoredAny,
            #[serde(default)]
            decide: serde::de::IgnoredAny,
        }
    };
}
pub(crate) use case_table;

/// A value from a closed set: `default` when absent; otherwise one of
/// `options`, or an error listing them (and `default`, to go on checking).
pub fn choice<T: Copy>(
    value: Option<&toml::Spanned<String>>,
    key: &str,
    options: &[(&str, T)],
    diag: &mut Diagnostics,
) -> T {
    let Some(v) = value else {
        return options[0].1;
    };
    match options.iter().find(|(n, _)| n == v.get_ref()) {
        Some((_, t)) => *t,
        None => {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            diag.push_at(
                v.span().start,
                format!(
                    "{key}: `{}` is not one of {}",
                    v.get_ref(),
                    names.join(", ")
                ),
            );
            options[0].1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        prompt: String,
        max: Option<f64>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        inner: Inner,
    }

    fn err(src: &str) -> String {
        parse_toml::<Outer>(Path::new("suites/x.toml"), src)
            .unwrap_err()
            .message
    }

    #[test]
    fn unknown_key_names_position_and_suggests() {
        let e = err("name = \"a\"\n[inner]\npromt = \"x\"\n");
        assert!(
            e.starts_with(
                "suites/x.toml:3:1: inner.promt: unknown key `promt` (did you mean `prompt`?)"
            ),
            "{e}"
        );
    }

    #[test]
    fn every_non_finite_number_is_reported() {
        let e = err("name = \"a\"\n[inner]\nprompt = \"x\"\nmax = nan\nmin = -inf\n");
        assert!(
            e.contains("suites/x.toml:4:7: inner.max: `nan` is not a finite number"),
            "{e}"
        );
        assert!(
            e.contains("suites/x.toml:5:7: inner.min: `-inf` is not a finite number"),
            "{e}"
        );
    }

    #[test]
    fn syntax_error_and_missing_key_and_wrong_type() {
        assert!(err("name = \n").starts_with("suites/x.toml:1:"));
        let e = err("name = \"a\"\n[inner]\nmax = 1.0\n");
        assert!(e.contains("missing key `prompt`"), "{e}");
        let e = err("name = 3\n[inner]\nprompt = \"x\"\n");
        assert!(
            e.starts_with("suites/x.toml:1:8: name: invalid type"),
            "{e}"
        );
        let e = err("name = \"a\"\nname = \"b\"\n[inner]\nprompt = \"x\"\n");
        assert!(e.starts_with("suites/x.toml:2:1:"), "{e}");
        assert!(e.contains("duplicate"), "{e}");
    }

    #[test]
    fn nearest_finds_typos_only() {
        let c = ["prompt", "model", "gate"];
        assert_eq!(nearest("promt", c.iter().copied()), Some("prompt"));
        assert_eq!(nearest("zzzzzz", c.iter().copied()), None);
    }
}
