//! Preflight of the hyperparameters llama.cpp asserts on or divides by:
//! a bad value is an input error naming its key, never an abort.

use super::Meta;
use crate::core::error::Malformed;
use std::collections::BTreeMap;

/// The most layers llama.cpp takes (`LLAMA_MAX_LAYERS`).
const MAX_LAYERS: i128 = 512;

/// The hyperparameters llama.cpp asserts on (a GGML_ASSERT aborts the whole
/// process; it is no error a caller can catch) or divides by, checked as
/// input errors naming each key: norm epsilons finite and ≥ 0, a block count
/// of 1 to 512, head counts of at least 1 with the KV heads dividing the
/// heads, an embedding width the heads divide (unless a key length is
/// given). Per-layer arrays and absent keys are left to llama.cpp.
pub(super) fn hyperparameters(
    meta: &BTreeMap<String, Meta>,
    arch: Option<&str>,
) -> std::result::Result<(), Malformed> {
    let Some(arch) = arch else {
        return Ok(());
    };
    let key = |k: &str| format!("{arch}.{k}");
    let mut problems: Vec<String> = Vec::new();
    let mut int = |k: &str| -> Option<i128> {
        match meta.get(&key(k)) {
            Some(Meta::Int(v)) => Some(*v),
            None | Some(Meta::Array(_)) => None,
            Some(other) => {
                problems.push(format!("`{}` = {other}: not an integer", key(k)));
                None
            }
        }
    };
    let blocks = int("block_count");
    let heads = int("attention.head_count");
    let kv_heads = int("attention.head_count_kv");
    let width = int("embedding_length");
    let key_length = int("attention.key_length");
    let [context, value_length, vocab, ffn, rope, experts, experts_used] = [
        "context_length",
        "attention.value_length",
        "vocab_size",
        "feed_forward_length",
        "rope.dimension_count",
        "expert_count",
        "expert_used_count",
    ]
    .map(&mut int);
    for k in [
        "attention.layer_norm_rms_epsilon",
        "attention.layer_norm_epsilon",
        "attention.group_norm_epsilon",
    ] {
        match meta.get(&key(k)) {
            None => {}
            Some(Meta::Float(v)) if v.is_finite() && *v >= 0.0 => {}
            Some(v) => problems.push(format!(
                "`{}` = {v}: a norm epsilon must be a finite number ≥ 0 (llama.cpp aborts on \
                 GGML_ASSERT(eps >= 0.0f))",
                key(k)
            )),
        }
    }
    if let Some(b) = blocks.filter(|b| !(1..=MAX_LAYERS).contains(b)) {
        problems.push(format!(
            "`{}` = {b}: llama.cpp takes 1 to {MAX_LAYERS} blocks",
            key("block_count")
        ));
    }
    if let Some(h) = heads.filter(|h| *h < 1) {
        problems.push(format!(
            "`{}` = {h}: a model needs at least one attention head",
            key("attention.head_count")
        ));
    }
    match (heads, kv_heads) {
        (_, Some(kv)) if kv < 1 => problems.push(format!(
            "`{}` = {kv}: llama.cpp divides the heads by it",
            key("attention.head_count_kv")
        )),
        (Some(h), Some(kv)) if h >= 1 && h % kv != 0 => problems.push(format!(
            "`{}` = {kv} does not divide `{}` = {h} (grouped-query attention shares each KV \
             head among a whole number of heads)",
            key("attention.head_count_kv"),
            key("attention.head_count")
        )),
        _ => {}
    }
    if let Some(w) = width.filter(|w| *w < 1) {
        problems.push(format!("`{}` = {w}: not a width", key("embedding_length")));
    }
    // Lengths llama.cpp sizes tensors and contexts by: at least 1 where
    // given (a feed-forward width only in a model with attention heads:
    // some recurrent architectures have none).
    let positive = [
        ("context_length", context),
        ("attention.key_length", key_length),
        ("attention.value_length", value_length),
        ("vocab_size", vocab),
        (
            "feed_forward_length",
            ffn.filter(|_| heads.is_some_and(|h| h >= 1)),
        ),
    ];
    for (k, v) in positive {
        if let Some(v) = v.filter(|v| *v < 1) {
            problems.push(format!("`{}` = {v}: must be at least 1", key(k)));
        }
    }
    if let Some(v) = ffn.filter(|v| *v < 0) {
        problems.push(format!(
            "`{}` = {v}: a width cannot be negative",
            key("feed_forward_length")
        ));
    }
    // Rotary embeddings turn pairs of a head's dimensions.
    let head_width = key_length.or(match (width, heads) {
        (Some(w), Some(h)) if w >= 1 && h >= 1 => Some(w / h),
        _ => None,
    });
    if let Some(r) = rope {
        if r < 1 || r % 2 != 0 || head_width.is_some_and(|hw| r > hw) {
            problems.push(format!(
                "`{}` = {r}: rotary embeddings need an even number of dimensions from 2 to the \
                 head width{}",
                key("rope.dimension_count"),
                head_width.map(|hw| format!(" ({hw})")).unwrap_or_default()
            ));
        }
    }
    if let (Some(n), Some(used)) = (experts, experts_used) {
        if n < 0 || used < 0 || used > n {
            problems.push(format!(
                "`{}` = {used} of `{}` = {n}: a token cannot use more experts than there are",
                key("expert_used_count"),
                key("expert_count")
            ));
        }
    }
    if let (Some(w), Some(h), None) = (width, heads, key_length) {
        if w >= 1 && h >= 1 && w % h != 0 {
            problems.push(format!(
                "`{}` = {w} is not a multiple of `{}` = {h} (the head width is their quotient)",
                key("embedding_length"),
                key("attention.head_count")
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "hyperparameters llama.cpp cannot run: {}",
            problems.join("; ")
        )
        .into())
    }
}
