//! The π invariant on the reviewed goldens (seed 000): greedy recitation of
//! a wording (E1 `colon-space`, batch-invariant decoding) departs at the
//! digit where teacher forcing of the same wording first flips (E0 and
//! tf_pi), on every model of the SmolLM2 ladder and on Gemma-3-270M; and E0
//! and tf_pi, one observation, record the same first flip. Every golden is
//! checked against a fresh run by the suites harness, so this holds for the
//! live numbers of every run that passes; no model is loaded here.

use quantgate::golden::snap::{parse, Parsed};
use std::path::Path;

fn golden(rel: &str) -> Option<Parsed> {
    let path = quantgate::harness::project_root().join("goldens").join(rel);
    let text = std::fs::read_to_string(&path).ok()?;
    Some(parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn case_prompt(rel: &str, key: &str) -> String {
    let src = std::fs::read_to_string(quantgate::harness::project_root().join(rel)).unwrap();
    let v: toml::Value = toml::from_str(&src).unwrap();
    match key {
        "prompt" => v["prompt"].as_str().unwrap().to_string(),
        name => v["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .unwrap()["text"]
            .as_str()
            .unwrap()
            .to_string(),
    }
}

#[test]
fn greedy_first_error_is_the_teacher_forced_first_flip_in_every_golden() {
    // The same wording, the same padding.
    let wording = case_prompt("suites/pi/e1_recall.toml", "colon-space");
    assert_eq!(wording, case_prompt("suites/pi/e0_tokens.toml", "prompt"));
    assert_eq!(wording, case_prompt("suites/pi/tf_pi.toml", "prompt"));
    let mut checked = 0;
    for model in common_models() {
        let e1 = golden(&format!("pi/e1_recall/colon-space/{model}.snap"))
            .unwrap_or_else(|| panic!("no E1 golden for {model}"));
        let e0 = golden(&format!("pi/e0_tokens/{model}.snap"))
            .unwrap_or_else(|| panic!("no E0 golden for {model}"));
        for g in [&e1, &e0] {
            assert!(
                g.inputs.0["settings"].contains("min_rows=32"),
                "{model}: {:?}",
                g.inputs
            );
        }
        assert_eq!(e0.metrics["all_own_tokens"], 1.0, "{model}");
        assert_eq!(e0.metrics["prompt_tokens_match"], 1.0, "{model}");
        let flip = e0.metrics["first_flip"];
        assert!(flip < e0.metrics["units"], "{model}: no flip recorded");
        assert_eq!(e1.metrics["first_error"], flip, "{model}: E1 vs E0");
        if let Some(tf) = golden(&format!("pi/tf_pi/{model}.snap")) {
            assert_eq!(tf.metrics["first_flip"], flip, "{model}: tf_pi vs E0");
            assert_eq!(
                tf.metrics["first_flip_margin"].to_bits(),
                e0.metrics["first_flip_margin"].to_bits(),
                "{model}: one observation, one margin"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 8);
}

/// The models E0 runs on, as the case lists them.
fn common_models() -> Vec<String> {
    let src = std::fs::read_to_string(
        quantgate::harness::project_root().join(Path::new("suites/pi/e0_tokens.toml")),
    )
    .unwrap();
    let v: toml::Value = toml::from_str(&src).unwrap();
    v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect()
}
