//! Line-numbered diffs of goldens, insta-style. The only module that uses
//! `similar`.

use similar::{Algorithm, ChangeTag, TextDiff};
use std::fmt::Write as _;

/// `old` vs `new` as grouped hunks with 4 lines of context:
/// `old_no new_no │-line` / `│+line` / `│ line`; plain text.
pub(crate) fn line_diff(old: &str, new: &str) -> String {
    let diff = TextDiff::configure()
        .algorithm(Algorithm::Patience)
        .diff_lines(old, new);
    let mut out = String::new();
    for (i, group) in diff.grouped_ops(4).iter().enumerate() {
        if i > 0 {
            out.push_str("┈┈┈┈┈┈┈┈┈┈┈┈┈┈┈┈\n");
        }
        for op in group {
            for change in diff.iter_changes(op) {
                let (sign, old_no, new_no) = match change.tag() {
                    ChangeTag::Delete => ("-", change.old_index(), None),
                    ChangeTag::Insert => ("+", None, change.new_index()),
                    ChangeTag::Equal => (" ", change.old_index(), change.new_index()),
                };
                let n = |v: Option<usize>| v.map_or(String::new(), |v| (v + 1).to_string());
                let line = change.value().trim_end_matches('\n');
                let _ = writeln!(out, "{:>5} {:>5} │{sign}{line}", n(old_no), n(new_no));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_lines_and_marks_changes() {
        let d = line_diff("a\nb\nc\n", "a\nB\nc\n");
        assert_eq!(
            d,
            "    1     1 │ a\n    2       │-b\n          2 │+B\n    3     3 │ c\n"
        );
        assert_eq!(line_diff("same\n", "same\n"), "");
    }
}
