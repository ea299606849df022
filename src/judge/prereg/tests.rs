use super::ledger::parse_utc;
use super::*;
use crate::models::gguf::gguf_total_bytes;

#[test]
fn utc_formatting_matches_known_dates() {
    assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(format_utc(1_798_761_599), "2026-12-31T23:59:59Z");
    assert!(parse_utc(&format_utc(1_764_505_384)).is_some());
    assert!(parse_utc("2026-11-30 13:03:13Z").is_none());
    assert!(parse_utc("2026-13-30T13:03:13Z").is_none());
}

#[test]
fn conditions_at_their_boundaries() {
    let lt = Condition::parse("ci95_hi < 0").unwrap();
    assert!(lt.holds(-1e-12) && !lt.holds(0.0) && !lt.holds(f64::NAN));
    let le = Condition::parse("ci95_hi <= 0").unwrap();
    assert!(le.holds(0.0) && !le.holds(1e-12));
    let gt = Condition::parse("ci95_lo > 0.01").unwrap();
    assert!(!gt.holds(0.01) && gt.holds(0.010_000_001));
    let ge = Condition::parse("value >= -0.5").unwrap();
    assert!(ge.holds(-0.5) && !ge.holds(-0.500_001));
    assert_eq!(lt.metric_name("delta_nll_mean"), "delta_nll_ci95_hi");
    assert_eq!(ge.metric_name("delta_nll_mean"), "delta_nll_mean");
    for bad in [
        "ci95_hi<0",
        "p99 < 0",
        "value == 0",
        "value < nan",
        "value < x",
    ] {
        assert!(Condition::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn split_parts_are_added_up() {
    let d = crate::core::scratch::scratch("split");
    std::fs::create_dir_all(&d).unwrap();
    for (i, n) in [(1, 10usize), (2, 20), (3, 5)] {
        std::fs::write(d.join(format!("m-{i:05}-of-00003.gguf")), vec![0u8; n]).unwrap();
    }
    assert_eq!(
        gguf_total_bytes(&d.join("m-00001-of-00003.gguf")).unwrap(),
        35
    );
    std::fs::write(d.join("single.gguf"), [0u8; 7]).unwrap();
    assert_eq!(gguf_total_bytes(&d.join("single.gguf")).unwrap(), 7);
    std::fs::remove_file(d.join("m-00002-of-00003.gguf")).unwrap();
    let e = gguf_total_bytes(&d.join("m-00001-of-00003.gguf")).unwrap_err();
    assert!(e.message.contains("m-00002-of-00003.gguf"), "{}", e.message);
    let _ = std::fs::remove_dir_all(&d);
}
