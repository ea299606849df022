//! The one tokenizer check and the one context check a reference and a
//! candidate pass before they are compared, and the `.qgref` header of
//! reference rows.

use super::*;

/// A model's vocabulary as the tokenizer check sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vocab<'a> {
    /// The model's alias (or, for a record, the model it was recorded on).
    pub alias: &'a str,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Tokenizer fingerprint.
    pub fingerprint: &'a str,
}

impl<'a> Vocab<'a> {
    /// The vocabulary of a loaded model.
    pub(crate) fn of(info: &'a ModelInfo) -> Self {
        Vocab {
            alias: &info.file.alias,
            n_vocab: info.n_vocab,
            fingerprint: &info.tokenizer_fingerprint,
        }
    }
}

/// The one tokenizer check: a reference (model, record or stored rows)
/// compares with a candidate only on one vocabulary and tokenizer. `at` is
/// where the case names the reference, `key` the key that names it.
pub(crate) fn same_tokenizer(
    at: &dyn Display,
    key: &str,
    reference: Vocab,
    candidate: Vocab,
) -> Result<()> {
    if reference.n_vocab == candidate.n_vocab && reference.fingerprint == candidate.fingerprint {
        return Ok(());
    }
    let short = |f: &str| f[..12.min(f.len())].to_string();
    Err(Error::input(format!(
        "{at}: {key}: `{}` and `{}` have different tokenizers (vocabulary {} vs {}, fingerprint {} vs {}): \
         a reference compares only within one base model",
        reference.alias,
        candidate.alias,
        reference.n_vocab,
        candidate.n_vocab,
        short(reference.fingerprint),
        short(candidate.fingerprint)
    )))
}

/// The one context check: `context` positions must fit the model's training
/// context. `at` says where the context comes from (`case.toml:7:8: window`).
pub(crate) fn fits_context(at: &dyn Display, context: usize, info: &ModelInfo) -> Result<()> {
    if context > info.n_ctx_train as usize {
        return Err(Error::input(format!(
            "{at}: context {context} is larger than the training context {} of model `{}`",
            info.n_ctx_train, info.file.alias
        )));
    }
    Ok(())
}

/// The `.qgref` header of reference rows: what determines them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_header(
    reference_sha256: String,
    token_stream_sha256: &str,
    windowing: String,
    settings: &Settings,
    build: String,
    tail: f64,
    max_kept: usize,
    positions: usize,
    n_vocab: usize,
) -> CacheHeader {
    CacheHeader {
        reference_sha256,
        token_stream_sha256: token_stream_sha256.to_string(),
        windowing,
        settings: settings.describe(),
        build,
        tail,
        max_kept,
        positions,
        n_vocab,
        tokenizer_fingerprint: String::new(),
    }
}
