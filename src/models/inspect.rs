//! `quantgate inspect`: what a GGUF file is, from its header, before any
//! weight is read.
//!
//! Contract: every number comes from the bounded preflight
//! ([`crate::models::gguf::preflight`]) of each part of the file; type names
//! and block sizes from ggml itself; the tokenizer fingerprint from a
//! vocabulary-only load by llama.cpp, the one the engine records. Bits per
//! weight are tensor bytes × 8 / parameters, as llama.cpp prints them.

use crate::core::error::{Error, Result};
use crate::models::gguf::{gguf_parts, preflight, Meta, TypeTotal};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One tensor type's row.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeRow {
    /// ggml's name of the type.
    pub name: String,
    /// The totals of its tensors.
    pub total: TypeTotal,
}

/// What `inspect` reports of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// The file named (the first part of a split file).
    pub path: PathBuf,
    /// Every part, in order (one for an unsplit file).
    pub parts: Vec<PathBuf>,
    /// Bytes of all parts.
    pub bytes: u64,
    /// `general.architecture`.
    pub architecture: Option<String>,
    /// `general.name`.
    pub name: Option<String>,
    /// `general.file_type` and llama.cpp's name for it.
    pub file_type: Option<(i128, Option<&'static str>)>,
    /// Parameters (elements of every tensor).
    pub params: u64,
    /// Tensor data bytes (None when a type's size is unknown to ggml).
    pub tensor_bytes: Option<u64>,
    /// Per tensor type, most bytes first.
    pub types: Vec<TypeRow>,
    /// `<arch>.context_length`.
    pub context_length: Option<i128>,
    /// Vocabulary size (`tokenizer.ggml.tokens`).
    pub n_vocab: Option<u64>,
    /// sha256 of the GGUF's `tokenizer.*` entries but the chat template.
    pub tokenizer_sha256: String,
    /// The engine's tokenizer fingerprint (None when not asked for).
    pub tokenizer_fingerprint: Option<String>,
    /// Whether the file carries a chat template.
    pub chat_template: bool,
    /// Every `quantize.*` entry (imatrix file, dataset, entries, chunks).
    pub quantize: BTreeMap<String, String>,
}

impl Inspection {
    /// Bits per weight: tensor bytes × 8 / parameters.
    pub fn bpw(&self) -> Option<f64> {
        self.tensor_bytes
            .filter(|_| self.params > 0)
            .map(|b| b as f64 * 8.0 / self.params as f64)
    }

    /// The JSON form (`inspect --json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "path": self.path.display().to_string(),
            "parts": self.parts.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "bytes": self.bytes,
            "architecture": self.architecture,
            "name": self.name,
            "file_type": self.file_type.map(|(id, _)| id as i64),
            "file_type_name": self.file_type.and_then(|(_, n)| n),
            "params": self.params,
            "tensor_bytes": self.tensor_bytes,
            "bpw": self.bpw(),
            "tensor_types": self.types.iter().map(|t| serde_json::json!({
                "type": t.name,
                "tensors": t.total.tensors,
                "params": t.total.elements,
                "bytes": t.total.bytes,
            })).collect::<Vec<_>>(),
            "context_length": self.context_length.map(|c| c as i64),
            "n_vocab": self.n_vocab,
            "tokenizer_sha256": self.tokenizer_sha256,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "chat_template": self.chat_template,
            "quantize": self.quantize,
        })
    }

    /// The text form, `label` (an alias, or the path) first.
    pub fn render(&self, label: &str) -> String {
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<14} {v}\n"));
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        line("file", self.path.display().to_string());
        if self.parts.len() > 1 {
            line("parts", format!("{} (bytes added up)", self.parts.len()));
        }
        line("bytes", group(self.bytes));
        line(
            "architecture",
            match (&self.architecture, &self.name) {
                (Some(a), Some(n)) => format!("{a} ({n})"),
                (a, _) => opt(a.clone()),
            },
        );
        line(
            "file type",
            opt(self
                .file_type
                .map(|(id, n)| format!("{} ({id})", n.unwrap_or("unknown to this llama.cpp")))),
        );
        line("parameters", group(self.params));
        line(
            "bits/weight",
            opt(self.bpw().map(|b| {
                format!(
                    "{b:.4} ({} tensor bytes × 8 / parameters)",
                    group(self.tensor_bytes.unwrap_or(0))
                )
            })),
        );
        line("context", opt(self.context_length.map(|c| c.to_string())));
        line("vocabulary", opt(self.n_vocab.map(|n| n.to_string())));
        line("tokenizer", opt(self.tokenizer_fingerprint.clone()));
        line("tokenizer.*", format!("sha256 {}", self.tokenizer_sha256));
        line(
            "chat template",
            if self.chat_template {
                "present"
            } else {
                "none"
            }
            .into(),
        );
        if self.quantize.is_empty() {
            line(
                "quantize",
                "no quantize.* entries (no imatrix recorded)".into(),
            );
        }
        for (k, v) in &self.quantize {
            line("quantize", format!("{k} = {v}"));
        }
        let mut s = format!("{label}\n{out}  tensor types, by bytes:\n");
        s.push_str(&format!(
            "    {:<10} {:>7} {:>14} {:>14} {:>7}\n",
            "type", "tensors", "parameters", "bytes", "share"
        ));
        for t in &self.types {
            let share = match (t.total.bytes, self.tensor_bytes) {
                (Some(b), Some(all)) if all > 0 => format!("{:.1}%", 100.0 * b as f64 / all as f64),
                _ => "-".into(),
            };
            s.push_str(&format!(
                "    {:<10} {:>7} {:>14} {:>14} {:>7}\n",
                t.name,
                t.total.tensors,
                group(t.total.elements),
                t.total.bytes.map_or("?".into(), group),
                share
            ));
        }
        s
    }
}

/// `1234567` → `1,234,567`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Inspect the GGUF at `path` (every part of a split file); with
/// `fingerprint`, also ask llama.cpp for the tokenizer fingerprint.
pub fn inspect(path: &Path, fingerprint: bool) -> Result<Inspection> {
    let parts = gguf_parts(path);
    let mut bytes = 0u64;
    let mut types: BTreeMap<String, TypeTotal> = BTreeMap::new();
    let mut params = 0u64;
    let mut first = None;
    for p in &parts {
        let len = std::fs::metadata(p)
            .map_err(|e| {
                Error::input(format!(
                    "{}: {e}{}",
                    p.display(),
                    crate::models::gguf::part_of(&parts, path)
                ))
            })?
            .len();
        bytes += len;
        let h = preflight(p)?;
        params = params.saturating_add(h.n_params);
        for (name, t) in &h.types {
            types.entry(name.clone()).or_default().add(t);
        }
        if first.is_none() {
            first = Some(h);
        }
    }
    let h = first.expect("at least one part");
    if let Some(Meta::Int(n)) = h.meta.get("split.count") {
        if *n != parts.len() as i128 && !(*n == 0 && parts.len() == 1) {
            return Err(Error::input(format!(
                "{}: `split.count` is {n}, but the file name says {} parts",
                path.display(),
                parts.len()
            )));
        }
    }
    let str_of = |k: &str| match h.meta.get(k) {
        Some(Meta::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let int_of = |k: &str| match h.meta.get(k) {
        Some(Meta::Int(v)) => Some(*v),
        _ => None,
    };
    let tensor_bytes = types
        .values()
        .try_fold(0u64, |a, t| t.bytes.map(|b| a.saturating_add(b)));
    let mut rows: Vec<TypeRow> = types
        .into_iter()
        .map(|(name, total)| TypeRow { name, total })
        .collect();
    rows.sort_by(|a, b| {
        b.total
            .bytes
            .cmp(&a.total.bytes)
            .then_with(|| a.name.cmp(&b.name))
    });
    let context_length = h
        .architecture
        .as_ref()
        .and_then(|a| int_of(&format!("{a}.context_length")));
    let quantize = h
        .meta
        .iter()
        .filter(|(k, _)| k.starts_with("quantize."))
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    let tokenizer_fingerprint = if fingerprint {
        Some(crate::engine::llama::vocab_fingerprint(&parts[0])?)
    } else {
        None
    };
    Ok(Inspection {
        path: path.to_path_buf(),
        parts,
        bytes,
        architecture: h.architecture.clone(),
        name: str_of("general.name"),
        file_type: int_of("general.file_type").map(|id| (id, crate::engine::llama::ftype_name(id))),
        params,
        tensor_bytes,
        types: rows,
        context_length,
        n_vocab: h.n_vocab,
        tokenizer_sha256: h.tokenizer_sha256.clone(),
        tokenizer_fingerprint,
        chat_template: h.chat_template,
        quantize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(134_515_008), "134,515,008");
    }

    /// The tiny header: one Q8_0 tensor of 4×4 = 16 elements, one block of
    /// 34 bytes; a split of it whose parts do not exist is an error naming
    /// the missing part.
    #[test]
    fn counts_parameters_and_bytes_of_the_tiny_header() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tiny.gguf");
        std::fs::write(&p, crate::models::gguf::tests::tiny_header()).unwrap();
        let i = inspect(&p, false).unwrap();
        assert_eq!(i.params, 16);
        assert_eq!(i.tensor_bytes, Some(34));
        assert_eq!(i.bpw(), Some(34.0 * 8.0 / 16.0));
        assert_eq!(i.types.len(), 1);
        assert_eq!(i.types[0].name, "Q8_0");
        assert_eq!(i.architecture.as_deref(), Some("llama"));
        let split = dir.path().join("tiny-00001-of-00002.gguf");
        std::fs::copy(&p, &split).unwrap();
        let e = inspect(&split, false).unwrap_err().to_string();
        assert!(
            e.contains("tiny-00002-of-00002.gguf") && e.contains("2-part"),
            "{e}"
        );
    }
}
