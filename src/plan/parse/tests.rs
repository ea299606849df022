use super::*;
use std::path::PathBuf;

fn write(name: &str, body: &str) -> PathBuf {
    // One folder for every test's files (made once: tests run at once).
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| crate::core::scratch::scratch("case"));
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

const GOOD: &str = r#"kind = "perplexity"
models = ["a"]
[text]
path = "t.txt"
sha256 = "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"
[window]
mode = "llama-perplexity"
n_ctx = 64
chunks = 2
[[gate]]
metric = "ppl"
max = 10.0
"#;

#[test]
fn a_good_case_parses() {
    let p = write("good.toml", GOOD);
    let parsed = parse_case(&p, &p, "x/good").unwrap();
    let c = &parsed.case;
    assert_eq!(c.models[0].0, "a");
    assert_eq!(
        c.gates,
        vec![Gate {
            metric: "ppl".into(),
            max: Some(10.0),
            min: None,
            on: None,
            read: "ppl".into(),
            interval: None,
            level: Default::default(),
            models: Vec::new(),
            about: Some(("PPL", None)),
        }]
    );
    assert_eq!(c.kind, "perplexity");
    assert_eq!(c.windows.as_ref().map(|w| w.0), Some(Some(2)));
    assert_eq!(c.pins.len(), 1);
    assert_eq!(c.pins[0].table, "text");
    // The kind holds the windowing; n_batch defaults to min(512, n_ctx).
    let shown = format!("{:?}", parsed.kind);
    assert!(
        shown.contains("LlamaPerplexity { n_ctx: 64, chunks: Some(2), skip: 0 }")
            && shown.contains("n_batch: 64"),
        "{shown}"
    );
    let metrics = c.metric_names();
    assert!(
        metrics.contains(&"ppl".to_string()) && !metrics.contains(&"delta_nll_mean".to_string())
    );
    assert_eq!(
        c.metric_type("windows"),
        Some(crate::core::MetricType::Count)
    );
    assert_eq!(c.metric_type("ppl"), Some(crate::core::MetricType::Float));
}

#[test]
fn gate_on_unknown_metric_is_a_parse_error() {
    let p = write(
        "badgate.toml",
        &GOOD.replace("metric = \"ppl\"", "metric = \"pll\""),
    );
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(e.contains(":11:10: gate[0].metric: `pll` is not a metric of a perplexity case (did you mean `ppl`?)"), "{e}");
}

#[test]
fn gate_on_selects_existing_bounds_only() {
    let paired = GOOD.replace("models = [\"a\"]", "models = [\"a\"]\nreference = \"b\"");
    let ok = paired.replace(
        "metric = \"ppl\"",
        "metric = \"delta_nll_mean\"\non = \"ci95_hi\"",
    );
    let p = write("on.toml", &ok);
    let c = parse_case(&p, &p, "x").unwrap().case;
    assert_eq!(c.gates[0].gated_metric(), "delta_nll_ci95_hi");
    let bad = paired.replace(
        "metric = \"ppl\"",
        "metric = \"delta_nll_mean\"\non = \"ci99_hi\"",
    );
    let p = write("on-bad.toml", &bad);
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(
        e.contains("gate[0].on: `ci99_hi` is not one of ci95_lo, ci95_hi, boot95_lo, boot95_hi"),
        "{e}"
    );
    let none = GOOD.replace("metric = \"ppl\"", "metric = \"ppl\"\non = \"ci95_hi\"");
    let p = write("on-none.toml", &none);
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(
        e.contains("gate[0].on: `ppl` has no `ci95_hi` bound"),
        "{e}"
    );
}

#[test]
fn unknown_kind_and_missing_kind() {
    let p = write("kind.toml", &GOOD.replace("perplexity\"", "perplex\""));
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(
        e.contains(":1:8: kind: `perplex` is not one of perplexity"),
        "{e}"
    );
    let p = write("nokind.toml", &GOOD.replace("kind = \"perplexity\"\n", ""));
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(e.contains("missing key `kind`"), "{e}");
}

#[test]
fn nan_threshold_and_bad_pin_are_reported_with_positions() {
    let p = write("nan.toml", &GOOD.replace("max = 10.0", "max = nan"));
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(
        e.contains(":12:7: gate[0].max: `nan` is not a finite number"),
        "{e}"
    );
    let p = write("pin.toml", &GOOD.replace("d790b833", "D790B833"));
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(e.contains(":5:10: text.sha256:"), "{e}");
}

#[test]
fn knobs_are_bounded_at_parse_time() {
    for (from, to, want) in [
        (
            "max = 10.0",
            "max = 10.0\nmin = 11.0",
            "gate[0]: min 11 > max 10: no value passes",
        ),
        (
            "n_ctx = 64",
            "n_ctx = 4294967294",
            "window.n_ctx: 4294967294 must be an even number between 8 and 1048576",
        ),
        (
            "chunks = 2",
            "chunks = 2\n[bootstrap]\nresamples = 9223372036854775807",
            "bootstrap.resamples: 9223372036854775807 must be between 100 and 1000000",
        ),
    ] {
        let p = write("knob.toml", &GOOD.replace(from, to));
        let e = parse_case(&p, &p, "x").unwrap_err().message;
        assert!(e.contains(want), "{to}: {e}");
    }
    let strided = GOOD.replace(
        "mode = \"llama-perplexity\"\nn_ctx = 64\nchunks = 2",
        "mode = \"strided\"\nn_ctx = 4294967294\nstride = 4294967294",
    );
    let p = write("strided.toml", &strided);
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(e.contains("window.n_ctx: 4294967294 must be"), "{e}");
    let tf = "kind = \"teacher_forcing\"\nmodels = [\"a\"]\nprompt = \"pi is \"\n\
                  [expect]\nsource = \"pi\"\ncount = 5\n\
                  [[sampler]]\nname = \"t1\"\ntemperature = 1.0\nsamples = 18446744073709551615\n";
    let p = write("samples.toml", tf);
    let e = parse_case(&p, &p, "x").unwrap_err().message;
    assert!(
        e.contains("sampler.samples: 18446744073709551615 is more than 10000"),
        "{e}"
    );
}
