//! Reference records: a reference model's per-target log-probs and top-1 ids
//! as JSONL, so later runs compare against them without loading the model.
//! Also the format of the reference-score cache.

use crate::core::error::Malformed;
use crate::engine::TokenId;
use crate::execute::windows::{Scored, ScoringPlan};
use crate::measure::WindowNll;
use serde::Serialize;

/// The header line of a reference record (JSONL).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordHeader {
    /// Format marker and version.
    pub quantgate_reference_record: u32,
    /// Reference model alias.
    pub model: String,
    /// Reference model sha256.
    pub model_sha256: String,
    /// Engine build that scored it.
    pub build: String,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Tokenizer fingerprint.
    pub tokenizer_fingerprint: String,
    /// Windowing mode.
    pub mode: String,
    /// Windows.
    pub windows: usize,
    /// Scored targets.
    pub targets: usize,
    /// sha256 of the scored token stream.
    pub token_stream_sha256: String,
    /// The engine settings that scored it (`Settings::describe`), in the
    /// reference store's files: a file copied under another product's
    /// name (another flash-attention or KV-cache setting) is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
}

/// One scored target of a reference record.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordEntry {
    /// Window index.
    pub window: usize,
    /// Position in the window whose row predicts the target.
    pub position: usize,
    /// The true next token.
    pub target: TokenId,
    /// Log-probability of the target (f64, round-trip exact).
    pub logprob: f64,
    /// The reference's argmax.
    pub top1: TokenId,
}

/// Serialise a scored plan as a reference record: a header line, then one
/// line per scored target.
pub(crate) fn record_jsonl(header: &RecordHeader, plan: &ScoringPlan, scored: &Scored) -> String {
    let mut out = serde_json::to_string(header).expect("header serialises");
    out.push('\n');
    let mut k = 0;
    for (w, pw) in plan.windows.iter().enumerate() {
        for (i, &target) in pw.targets.iter().enumerate() {
            let e = RecordEntry {
                window: w,
                position: pw.first_scored + i,
                target,
                logprob: -scored.token_nll[k],
                top1: scored.token_argmax[k],
            };
            out.push_str(&serde_json::to_string(&e).expect("entry serialises"));
            out.push('\n');
            k += 1;
        }
    }
    out
}

/// Read a reference record back as the scores of `plan`, checking that it
/// describes exactly the plan's windows and targets. Errors name the line.
pub(crate) fn read_record(
    src: &str,
    plan: &ScoringPlan,
) -> std::result::Result<(RecordHeader, Scored), Malformed> {
    let mut lines = src.lines().enumerate();
    let (_, first) = lines.next().ok_or("empty file")?;
    let header: RecordHeader =
        serde_json::from_str(first).map_err(|e| format!("1: header: {e}"))?;
    if header.quantgate_reference_record != 1 {
        return Err(format!(
            "1: unsupported record version {}",
            header.quantgate_reference_record
        )
        .into());
    }
    if header.token_stream_sha256 != plan.token_stream_sha256 {
        return Err(format!(
            "1: the record scores token stream {}, the case {}: not the same tokens",
            header.token_stream_sha256, plan.token_stream_sha256
        )
        .into());
    }
    let mut scored = Scored {
        windows: vec![WindowNll::default(); plan.windows.len()],
        ..Scored::default()
    };
    let mut expected = plan.windows.iter().enumerate().flat_map(|(w, pw)| {
        pw.targets
            .iter()
            .enumerate()
            .map(move |(i, t)| (w, pw.first_scored + i, *t))
    });
    for (l, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let e: RecordEntry =
            serde_json::from_str(line).map_err(|err| format!("{}: {err}", l + 1))?;
        let want = expected
            .next()
            .ok_or_else(|| format!("{}: more entries than the case scores", l + 1))?;
        if (e.window, e.position, e.target) != want {
            return Err(format!(
                "{}: entry (window {}, position {}, target {}) where the case scores (window {}, position {}, target {})",
                l + 1, e.window, e.position, e.target, want.0, want.1, want.2
            ).into());
        }
        if !e.logprob.is_finite() || e.logprob > 0.0 {
            return Err(format!(
                "{}: logprob {} is not a finite log-probability",
                l + 1,
                e.logprob
            )
            .into());
        }
        let top1 = e.top1 == e.target;
        scored.windows[e.window].add(-e.logprob, top1);
        scored.token_nll.push(-e.logprob);
        scored.token_top1.push(top1);
        scored.token_argmax.push(e.top1);
    }
    if let Some(w) = expected.next() {
        return Err(format!("ends early: no entry for window {}, position {}", w.0, w.1).into());
    }
    Ok((header, scored))
}
