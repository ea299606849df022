//! The one reference store: what a reference model observed, computed once
//! per process per key and shared by every candidate, kept across processes
//! in `<cache>/reference` — compact full-distribution rows (`.qgref`) for KL,
//! and per-target scores (reference records, `.jsonl`) for paired ΔNLL.
//! Also the one check that a reference and a candidate share a tokenizer
//! and the one check that a context fits a model.
//!
//! Contract: a cache file is used only after every check its format has
//! (a `.qgref` is rebuilt when any fails; a record must match the model's
//! sha256, the build and the plan); a corrupt cache whose reference model
//! is not available is an error naming both, never a partial result.

use crate::core::error::{Error, Result};
use crate::core::fsutil::{read_sealed, write_sealed};
use crate::core::{Location, Settings};
use crate::engine::ModelInfo;
use crate::execute::qgref::CacheHeader;
use crate::execute::record::{read_record, record_jsonl, RecordHeader};
use crate::execute::windows::{Scored, ScoringPlan};
use crate::measure::kld::RefPosition;
use std::collections::HashMap;
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Reference rows for KL, and where they came from.
pub struct RefRows {
    /// One per scored position.
    pub rows: Vec<RefPosition>,
    /// Reference vocabulary size.
    pub n_vocab: usize,
    /// Reference tokenizer fingerprint.
    pub tokenizer_fingerprint: String,
}

impl RefRows {
    /// The rows are an imported 16-bit llama-perplexity reference.
    pub fn imported(&self) -> bool {
        self.rows.iter().any(|r| r.approximate)
    }
}

type Slot<T> = Arc<OnceLock<Result<Arc<T>>>>;

/// Reference rows and scores, once per process per key, cached on disk.
pub struct ReferenceStore {
    /// Where the caches live (`<cache>/reference` by default).
    pub dir: PathBuf,
    scores: Mutex<HashMap<String, Slot<Scored>>>,
    rows: Mutex<HashMap<String, Slot<RefRows>>>,
}

/// The once-per-process slot of `key` in a memo of shared results.
fn memo_slot<T>(memo: &Mutex<HashMap<String, Slot<T>>>, key: &str) -> Slot<T> {
    let mut m = memo.lock().unwrap_or_else(|p| p.into_inner());
    m.entry(key.to_string()).or_default().clone()
}

/// What a reference model's scores were computed from: its file, the plan,
/// the settings and the build.
pub struct ScoresKey<'a> {
    /// Reference alias (messages).
    pub alias: &'a str,
    /// Reference file sha256.
    pub model_sha256: &'a str,
    /// The plan it scores (identical on both sides).
    pub plan: &'a ScoringPlan,
    /// Engine settings.
    pub settings: &'a Settings,
    /// Engine build label.
    pub build: &'a str,
    /// The windowing, as the case declares it.
    pub windowing: String,
}

impl ReferenceStore {
    /// A store with its caches under `dir`.
    pub fn new(dir: PathBuf) -> Self {
        ReferenceStore {
            dir,
            scores: Mutex::new(HashMap::new()),
            rows: Mutex::new(HashMap::new()),
        }
    }

    /// The reference's scores of `key.plan`: from this process's memo, the
    /// record cache (when it is for the same model file and build and reads
    /// back against the plan), or `score` (which returns the record header
    /// and the scores), then recorded.
    pub fn scores(
        &self,
        key: &ScoresKey,
        score: &dyn Fn() -> Result<(RecordHeader, Scored)>,
    ) -> Result<Arc<Scored>> {
        let id = format!(
            "{}|{}|{}|{}|{}",
            key.model_sha256,
            key.plan.token_stream_sha256,
            key.settings.describe(),
            key.build,
            key.windowing
        );
        let slot = memo_slot(&self.scores, &id);
        slot.get_or_init(|| {
            // A reference record, sealed: read back only when intact.
            let path = self.dir.join(format!(
                "{}.qgscores",
                crate::core::fsutil::sha256_bytes(id.as_bytes())
            ));
            let cached = read_sealed(&path).and_then(|b| match b {
                None => Ok(None),
                Some(b) => String::from_utf8(b).map(Some).map_err(|e| e.to_string()),
            });
            let text = cached.unwrap_or_else(|why| {
                eprintln!(
                    "quantgate: reference cache {} is unusable ({why}); rescoring `{}`",
                    path.display(),
                    key.alias
                );
                None
            });
            if let Some(text) = text {
                match read_record(&text, key.plan) {
                    Ok((h, scored))
                        if h.model_sha256 == key.model_sha256 && h.build == key.build =>
                    {
                        return Ok(Arc::new(scored))
                    }
                    Ok(_) => eprintln!(
                        "quantgate: reference cache {} is for another model or build; rescoring",
                        path.display()
                    ),
                    Err(e) => eprintln!(
                        "quantgate: reference cache {} is unusable ({e}); rescoring `{}`",
                        path.display(),
                        key.alias
                    ),
                }
            }
            let (header, scored) = score()?;
            write_sealed(&path, record_jsonl(&header, key.plan, &scored).into_bytes())?;
            Ok(Arc::new(scored))
        })
        .clone()
    }

    /// Reference rows from the `.qgref` cache file of `header`, or built by
    /// `build` (which loads the reference model, scores it and returns its
    /// vocabulary size, tokenizer fingerprint and rows) and written there.
    /// Once per process per key; a corrupt cache is rebuilt, or reported
    /// with the reason when the reference model is not available. The rows
    /// are checked against the candidate's tokenizer (`ref_at` is where the
    /// case names the reference) and the positions the header expects.
    pub fn rows(
        &self,
        header: &CacheHeader,
        case_path: &Path,
        (ref_alias, ref_at): (&str, &Location),
        candidate: Vocab,
        build: &dyn Fn() -> Result<(usize, String, Vec<RefPosition>)>,
    ) -> Result<Arc<RefRows>> {
        let refs = self.cached_rows(header, case_path, ref_alias, build)?;
        let stored = Vocab {
            alias: ref_alias,
            n_vocab: refs.n_vocab,
            fingerprint: &refs.tokenizer_fingerprint,
        };
        same_tokenizer(ref_at, "reference", stored, candidate)?;
        if refs.rows.len() != header.positions {
            return Err(Error::harness(format!(
                "{}: the reference holds {} positions, the case scores {}",
                case_path.display(),
                refs.rows.len(),
                header.positions
            )));
        }
        Ok(refs)
    }

    fn cached_rows(
        &self,
        header: &CacheHeader,
        case_path: &Path,
        ref_alias: &str,
        build: &dyn Fn() -> Result<(usize, String, Vec<RefPosition>)>,
    ) -> Result<Arc<RefRows>> {
        let key = header.key();
        let path = self.dir.join(format!("{key}.qgref"));
        let slot = memo_slot(&self.rows, &key);
        slot.get_or_init(|| {
            let corrupt = match std::fs::read(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => Some(e.to_string()),
                Ok(bytes) => match crate::execute::qgref::decode(&bytes, header) {
                    Ok((h, rows)) => {
                        return Ok(Arc::new(RefRows {
                            rows,
                            n_vocab: h.n_vocab,
                            tokenizer_fingerprint: h.tokenizer_fingerprint,
                        }))
                    }
                    Err(why) => Some(why),
                },
            };
            if let Some(why) = &corrupt {
                eprintln!(
                    "quantgate: reference cache {} is unusable ({why}); rebuilding it from `{ref_alias}`",
                    path.display()
                );
            }
            let (n_vocab, fingerprint, rows) = build().map_err(|e| match &corrupt {
                Some(why) => Error::input(format!(
                    "{}: reference cache {} is unusable ({why}), and the reference model `{ref_alias}` \
                     is not available to rebuild it: {}",
                    case_path.display(),
                    path.display(),
                    e.message
                )),
                None => e,
            })?;
            let mut h = header.clone();
            h.n_vocab = n_vocab;
            h.tokenizer_fingerprint = fingerprint;
            std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
            crate::core::fsutil::write_atomic(&path, &crate::execute::qgref::encode(&h, &rows))?;
            Ok(Arc::new(RefRows {
                rows,
                n_vocab: h.n_vocab,
                tokenizer_fingerprint: h.tokenizer_fingerprint,
            }))
        })
        .clone()
    }
}

/// A model's vocabulary as the tokenizer check sees it.
#[derive(Debug, Clone, Copy)]
pub struct Vocab<'a> {
    /// The model's alias (or, for a record, the model it was recorded on).
    pub alias: &'a str,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Tokenizer fingerprint.
    pub fingerprint: &'a str,
}

impl<'a> Vocab<'a> {
    /// The vocabulary of a loaded model.
    pub fn of(info: &'a ModelInfo) -> Self {
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
pub fn same_tokenizer(
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
pub fn fits_context(at: &dyn Display, context: usize, info: &ModelInfo) -> Result<()> {
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
pub fn rows_header(
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
