//! Parse stage: one case file → a typed [`Case`].
//!
//! Contract: unknown keys, wrong types, missing keys and non-finite numbers
//! are errors naming `path:line:col: key`; a gate on a metric the case kind
//! does not produce is a parse-time error; nothing here touches a model.

use crate::engine::BosPolicy;
use crate::error::{Error, Result};
use crate::fsutil::{line_col, sha256_bytes};
use crate::parse::{nearest, parse_toml};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Case kinds and the metrics each produces.
pub const KINDS: &[(&str, &[&str])] = &[(
    "perplexity",
    &["nll_mean", "ppl", "ppl_se", "tokens_scored", "windows"],
)];

/// A parsed case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Test name stem: path under the suites root, `/`-separated, no `.toml`.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// sha256 of the file's bytes.
    pub content_sha256: String,
    /// Free text.
    pub description: String,
    /// Model aliases to run on, with their position in the file.
    pub models: Vec<(String, Location)>,
    /// What to do.
    pub spec: Spec,
    /// Gates.
    pub gates: Vec<Gate>,
}

/// `path:line:col` of a value, for messages after parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location(pub String);

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kind-specific part of a case.
#[derive(Debug, Clone)]
pub enum Spec {
    /// Teacher-forced perplexity of a text over windows.
    Perplexity(Perplexity),
}

impl Spec {
    /// The kind's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Spec::Perplexity(_) => "perplexity",
        }
    }
}

/// How a text is cut into windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WindowMode {
    /// `llama-perplexity` default: chunks of n_ctx, first token → BOS when
    /// the model adds one, the second half of each chunk scored.
    LlamaPerplexity,
}

/// A perplexity case.
#[derive(Debug, Clone)]
pub struct Perplexity {
    /// The text file.
    pub text: PathBuf,
    /// Its pinned sha256.
    pub text_sha256: String,
    /// Where the pin is written.
    pub text_sha256_at: Location,
    /// Windowing.
    pub mode: WindowMode,
    /// Window length.
    pub n_ctx: u32,
    /// Where n_ctx is written.
    pub n_ctx_at: Location,
    /// At most this many windows.
    pub chunks: Option<usize>,
    /// Batch size (`n_batch = n_ubatch`).
    pub n_batch: u32,
    /// BOS policy for tokenizing the text.
    pub bos: BosPolicy,
}

/// A gate: the metric must be ≤ max and ≥ min.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// Metric name.
    pub metric: String,
    /// Upper bound.
    pub max: Option<f64>,
    /// Lower bound.
    pub min: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PerplexityFile {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    description: String,
    models: Spanned<Vec<Spanned<String>>>,
    text: TextFile,
    window: WindowFile,
    #[serde(default)]
    gate: Vec<GateFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextFile {
    path: Spanned<String>,
    sha256: Spanned<String>,
    #[serde(default)]
    bos: Option<BosPolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowFile {
    mode: WindowMode,
    n_ctx: Spanned<u32>,
    chunks: Option<Spanned<usize>>,
    n_batch: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GateFile {
    metric: Spanned<String>,
    max: Option<f64>,
    min: Option<f64>,
}

#[derive(Deserialize)]
struct KindOnly {
    kind: Option<Spanned<String>>,
}

/// Parse the case at `path`; `name` is its test-name stem.
pub fn parse_case(path: &Path, name: &str) -> Result<Case> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::input(format!("{}: {e}", path.display())))?;
    let src = String::from_utf8(bytes.clone())
        .map_err(|e| Error::input(format!("{}: not UTF-8: {e}", path.display())))?;
    let at = |offset: usize| {
        let (l, c) = line_col(&src, offset);
        Location(format!("{}:{l}:{c}", path.display()))
    };
    // `kind` picks the schema; read it leniently first.
    let kind = toml::from_str::<KindOnly>(&src).ok().and_then(|k| k.kind);
    let kinds: Vec<&str> = KINDS.iter().map(|(k, _)| *k).collect();
    let Some(kind) = kind else {
        // Let the full parser report syntax errors first.
        parse_toml::<toml::Table>(path, &src)?;
        return Err(Error::input(format!(
            "{}: missing key `kind` (one of {})",
            path.display(),
            kinds.join(", ")
        )));
    };
    let metrics = match KINDS.iter().find(|(k, _)| *k == kind.get_ref()) {
        Some((_, m)) => *m,
        None => {
            return Err(Error::input(format!(
                "{}: kind: `{}` is not one of {}",
                at(kind.span().start),
                kind.get_ref(),
                kinds.join(", ")
            )))
        }
    };
    let f: PerplexityFile = parse_toml(path, &src)?;
    let mut errors = Vec::new();
    let base = path.parent().unwrap_or(Path::new("."));
    if f.models.get_ref().is_empty() {
        errors.push(Error::input(format!(
            "{}: models: list at least one model alias",
            at(f.models.span().start)
        )));
    }
    let sha = f.text.sha256.get_ref().clone();
    if sha.len() != 64
        || !sha
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        errors.push(Error::input(format!(
            "{}: text.sha256: `{sha}` is not 64 lower-case hex digits",
            at(f.text.sha256.span().start)
        )));
    }
    let n_ctx = *f.window.n_ctx.get_ref();
    if n_ctx < 8 || !n_ctx.is_multiple_of(2) {
        errors.push(Error::input(format!(
            "{}: window.n_ctx: {n_ctx} must be an even number ≥ 8",
            at(f.window.n_ctx.span().start)
        )));
    }
    if let Some(c) = &f.window.chunks {
        if *c.get_ref() == 0 {
            errors.push(Error::input(format!(
                "{}: window.chunks: must be ≥ 1",
                at(c.span().start)
            )));
        }
    }
    let n_batch = f
        .window
        .n_batch
        .as_ref()
        .map_or(512.min(n_ctx), |b| *b.get_ref());
    if let Some(b) = &f.window.n_batch {
        if n_batch == 0 || n_batch > n_ctx {
            errors.push(Error::input(format!(
                "{}: window.n_batch: {n_batch} must be between 1 and n_ctx ({n_ctx})",
                at(b.span().start)
            )));
        }
    }
    let mut gates = Vec::new();
    for (i, g) in f.gate.iter().enumerate() {
        let m = g.metric.get_ref();
        if !metrics.contains(&m.as_str()) {
            let hint = nearest(m, metrics.iter().copied())
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            errors.push(Error::input(format!(
                "{}: gate[{i}].metric: `{m}` is not a metric of a {} case{hint}; metrics: {}",
                at(g.metric.span().start),
                kind.get_ref(),
                metrics.join(", ")
            )));
        }
        if g.max.is_none() && g.min.is_none() {
            errors.push(Error::input(format!(
                "{}: gate[{i}]: give `max`, `min` or both",
                at(g.metric.span().start)
            )));
        }
        gates.push(Gate {
            metric: m.clone(),
            max: g.max,
            min: g.min,
        });
    }
    if !errors.is_empty() {
        return Err(crate::error::join(errors));
    }
    Ok(Case {
        name: name.to_string(),
        path: path.to_path_buf(),
        content_sha256: sha256_bytes(&bytes),
        description: f.description,
        models: f
            .models
            .get_ref()
            .iter()
            .map(|m| (m.get_ref().clone(), at(m.span().start)))
            .collect(),
        spec: Spec::Perplexity(Perplexity {
            text: base.join(f.text.path.get_ref()),
            text_sha256: sha,
            text_sha256_at: at(f.text.sha256.span().start),
            mode: f.window.mode,
            n_ctx,
            n_ctx_at: at(f.window.n_ctx.span().start),
            chunks: f.window.chunks.map(|c| c.into_inner()),
            n_batch,
            bos: f.text.bos.unwrap_or(BosPolicy::Model),
        }),
        gates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("qg-case-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
        let c = parse_case(&p, "x/good").unwrap();
        assert_eq!(c.models[0].0, "a");
        assert_eq!(
            c.gates,
            vec![Gate {
                metric: "ppl".into(),
                max: Some(10.0),
                min: None
            }]
        );
        let Spec::Perplexity(pp) = &c.spec;
        assert_eq!((pp.n_ctx, pp.chunks, pp.n_batch), (64, Some(2), 64));
    }

    #[test]
    fn gate_on_unknown_metric_is_a_parse_error() {
        let p = write(
            "badgate.toml",
            &GOOD.replace("metric = \"ppl\"", "metric = \"pll\""),
        );
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(e.contains(":11:10: gate[0].metric: `pll` is not a metric of a perplexity case (did you mean `ppl`?)"), "{e}");
    }

    #[test]
    fn unknown_kind_and_missing_kind() {
        let p = write("kind.toml", &GOOD.replace("perplexity\"", "perplex\""));
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(
            e.contains(":1:8: kind: `perplex` is not one of perplexity"),
            "{e}"
        );
        let p = write("nokind.toml", &GOOD.replace("kind = \"perplexity\"\n", ""));
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(e.contains("missing key `kind`"), "{e}");
    }

    #[test]
    fn nan_threshold_and_bad_pin_are_reported_with_positions() {
        let p = write("nan.toml", &GOOD.replace("max = 10.0", "max = nan"));
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(
            e.contains(":12:7: gate[0].max: `nan` is not a finite number"),
            "{e}"
        );
        let p = write("pin.toml", &GOOD.replace("d790b833", "D790B833"));
        let e = parse_case(&p, "x").unwrap_err().message;
        assert!(e.contains(":5:10: text.sha256:"), "{e}");
    }
}
