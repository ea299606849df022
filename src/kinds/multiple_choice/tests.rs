use super::*;

/// std::mt19937(1)'s first outputs, and its 10000th (the C++ standard's
/// check value for the default seed 5489).
#[test]
fn mersenne_twister_is_std_mt19937() {
    let mut r = Mt19937::new(1);
    assert_eq!(r.next(), 1_791_095_845);
    assert_eq!(r.next(), 4_282_876_139);
    let mut d = Mt19937::new(5489);
    let mut v = 0;
    for _ in 0..10000 {
        v = d.next();
    }
    assert_eq!(v, 4_123_659_995);
}

/// The binary format round-trips; bad files are errors naming the task
/// and the byte; a task without a correct choice or with one choice is
/// refused, not scored.
#[test]
fn binary_tasks_round_trip_and_bad_ones_are_named() {
    let t = |q: &str, c: &[&str], right: usize| Task {
        question: q.into(),
        choices: c.iter().map(|s| s.to_string()).collect(),
        labels: (0..c.len()).map(|i| i32::from(i == right)).collect(),
    };
    let tasks = vec![t("2+2=", &["4", "5"], 0), t("3+3=", &["5", "6", "7"], 1)];
    let bytes = write_binary(&tasks);
    let back = read_binary(&bytes, 0, "f.bin").unwrap();
    assert_eq!(back.iter().map(|x| x.1.clone()).collect::<Vec<_>>(), tasks);
    let cut = read_binary(&bytes[..bytes.len() - 3], 0, "f.bin")
        .unwrap_err()
        .to_string();
    assert!(
        cut.contains("f.bin: task 1:") && cut.contains("the file ends"),
        "{cut}"
    );
    let e = read_binary(&write_binary(&[t("q", &["a"], 0)]), 0, "f.bin")
        .unwrap_err()
        .to_string();
    assert!(e.contains("task 0: 1 choice(s)"), "{e}");
    let mut none = t("q", &["a", "b"], 0);
    none.labels = vec![0, 0];
    let e = read_binary(&write_binary(&[none]), 0, "f.bin")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no choice is labelled correct"), "{e}");
    let e = read_binary(b"\x05\0\0\0", 0, "f.bin")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a --multiple-choice file"), "{e}");
    assert_eq!(tool_selection(5, 5).len(), 5);
}

/// HellaSwag files: 6 lines per task, a gold index 0–3; the tool's draw
/// takes every task once; bad files name the line.
#[test]
fn hellaswag_files_are_read_as_the_tool_reads_them() {
    let text = write_hellaswag(&computed_hellaswag(10, 7)).unwrap();
    let tasks = read_hellaswag(text.as_bytes(), 400, "hs").unwrap();
    let mut seen: Vec<usize> = tasks.iter().map(|t| t.0).collect();
    assert_ne!(
        seen,
        (0..10).collect::<Vec<_>>(),
        "drawn in the tool's order"
    );
    seen.sort();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    assert_eq!(read_hellaswag(text.as_bytes(), 3, "hs").unwrap().len(), 3);
    let e = read_hellaswag(b"a\n1\nx\ny\nz\n", 400, "hs")
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 lines, not a positive multiple of 6"), "{e}");
    let e = read_hellaswag(b"a\n7\nw\nx\ny\nz\n", 400, "hs")
        .unwrap_err()
        .to_string();
    assert!(e.contains("task 0 (line 2): gold ending `7`"), "{e}");
    // Lemire's method on a range of 1 is 0, whatever the engine says.
    assert_eq!(uniform_below(&mut Mt19937::new(1), 1), 0);
}

/// WinoGrande CSV as the tool splits it (a quoted sentence with commas,
/// one `_`), and every line it would skip or leave out is an error.
#[test]
fn winogrande_lines_are_split_as_the_tool_splits_them() {
    let csv = computed_winogrande(4, 3);
    let t = read_winogrande(csv.as_bytes(), 0, "wg").unwrap();
    assert_eq!(t.len(), 4);
    let line0 = csv.lines().next().unwrap();
    assert!(
        line0.contains('"') && t[0].1.first.contains(", so "),
        "{line0}"
    );
    assert!(!t[0].1.first.contains('"') && t[0].1.second.ends_with('.'));
    let e = read_winogrande(b"0,no blank here,a,b,1\n\n", 0, "wg")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1: the sentence has no `_`"), "{e}");
    let e = read_winogrande(b"0,a _ b,x,y,3\n\n", 0, "wg")
        .unwrap_err()
        .to_string();
    assert!(e.contains("answer `3` is not 1 or 2"), "{e}");
    let e = read_winogrande(b"0,a _ b,x,y,1\n", 0, "wg")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 1:") && e.contains("leaves out the last line"),
        "{e}"
    );
    let e = read_winogrande(b"0,a _ b,x\n\n", 0, "wg")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not 5 comma-separated fields"), "{e}");
}

/// Our own JSONL format: read as written; a bad line is named, an
/// answer out of range or a single choice refused.
#[test]
fn jsonl_tasks_and_their_errors() {
    let ok = b"{\"question\": \"2+2=\", \"choices\": [\"4\", \"5\"], \"answer\": 0}\n\n{\"question\": \"q\", \"choices\": [\"a\", \"b\", \"c\"], \"answer\": 2}\n";
    let t = read_jsonl(ok, 0, "t.jsonl").unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t[1].0, 1);
    assert_eq!(t[1].1.labels, vec![0, 0, 1]);
    let e = read_jsonl(
        b"{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 2}\n",
        0,
        "t.jsonl",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("t.jsonl: line 1: answer 2 is out of range"),
        "{e}"
    );
    let e = read_jsonl(
        b"\n{\"question\": \"q\", \"choices\": [\"a\"], \"answer\": 0}\n",
        0,
        "t.jsonl",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 2: 1 choice(s)"), "{e}");
    let e = read_jsonl(b"{\"question\": 3}\n", 0, "t.jsonl")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1:"), "{e}");
}

#[test]
fn mcnemar_exact_by_hand() {
    // b = 0, c = 5: 2 × (1/32).
    assert!((mcnemar_exact(0, 5) - 0.0625).abs() < 1e-12);
    // b = 1, c = 4: 2 × (1 + 5)/32.
    assert!((mcnemar_exact(1, 4) - 0.375).abs() < 1e-12);
    assert_eq!(mcnemar_exact(3, 3), 1.0);
    assert_eq!(mcnemar_exact(0, 0), 1.0);
}
