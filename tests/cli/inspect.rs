//! `quantgate inspect`.

use super::*;

/// `inspect` on the fixture by alias and by path, as text and JSON; a file
/// that is not a GGUF exits 2 naming it.
#[test]
fn inspect_prints_bits_per_weight_and_tensor_types() {
    let inspect = |root: &Path, args: &[&str]| quantgate(root, &[&["inspect"], args].concat());
    let root = suites("inspect");
    let fixture = fixture_path();
    let (code, out, err) = inspect(&root, &["tiny"]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "bits/weight",
        "tensor types, by bytes",
        "Q4_1",
        "llama",
        "file type      Q4_1 (3)",
        "vocabulary     49152",
        "sha256         b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let (code, out, err) = inspect(&root, &["--json", fixture.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let m = &v[0];
    assert_eq!(m["bytes"], 98_362_432u64);
    assert_eq!(m["file_type_name"], "Q4_1");
    assert_eq!(m["chat_template"], true);
    let bpw = m["bpw"].as_f64().unwrap();
    let expect = m["tensor_bytes"].as_f64().unwrap() * 8.0 / m["params"].as_f64().unwrap();
    assert_eq!(bpw, expect);
    assert!((5.0..6.5).contains(&bpw), "{bpw}");
    let bad = root.join("notes.gguf");
    std::fs::write(&bad, "<html>not a model</html>").unwrap();
    let (code, _, err) = inspect(&root, &[bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("notes.gguf") && err.contains("HTML"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}
