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
use std::sync::{Arc, Mutex};

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

/// Products computed in this process, by id.
type Memo<T> = Mutex<HashMap<String, Arc<T>>>;

/// Reference rows and scores, once per process per key, cached on disk.
pub struct ReferenceStore {
    /// Where the caches live (`<cache>/reference` by default).
    pub dir: PathBuf,
    scores: Memo<Scored>,
    rows: Memo<RefRows>,
}

/// A product of this process's memo.
fn memo_get<T>(memo: &Memo<T>, id: &str) -> Option<Arc<T>> {
    memo.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(id)
        .cloned()
}

/// Remember a product (the first one stays: equal ids, equal products).
fn memo_put<T>(memo: &Memo<T>, id: &str, value: Arc<T>) -> Arc<T> {
    memo.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(id.to_string())
        .or_insert(value)
        .clone()
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

    /// The id and file of a reference's scores.
    fn scores_file(&self, key: &ScoresKey) -> (String, PathBuf) {
        let id = format!(
            "{}|{}|{}|{}|{}",
            key.model_sha256,
            key.plan.token_stream_sha256,
            key.settings.describe(),
            key.build,
            key.windowing
        );
        let path = self.dir.join(format!(
            "{}.qgscores",
            crate::core::fsutil::sha256_bytes(id.as_bytes())
        ));
        (id, path)
    }

    /// Where the scores of `key` are kept, and the id that names them.
    pub fn scores_product(&self, key: &ScoresKey) -> (String, PathBuf) {
        self.scores_file(key)
    }

    /// The reference's scores of `key.plan`: from this process's memo, the
    /// record cache (when it is for the same model file and build and reads
    /// back against the plan), or `score` (which returns the record header
    /// and the scores), then recorded. Building takes the product's lock, so
    /// concurrent processes score a reference once.
    pub fn scores(
        &self,
        key: &ScoresKey,
        score: &dyn Fn() -> Result<(RecordHeader, Scored)>,
    ) -> Result<Arc<Scored>> {
        let (id, path) = self.scores_file(key);
        if let Some(s) = memo_get(&self.scores, &id) {
            return Ok(s);
        }
        if let Some(s) = self.read_scores(key, &path) {
            return Ok(memo_put(&self.scores, &id, s));
        }
        let _lock = self.lock(&id)?;
        // Another thread or process may have built it while this one waited.
        if let Some(s) = memo_get(&self.scores, &id) {
            return Ok(s);
        }
        if let Some(s) = self.read_scores(key, &path) {
            return Ok(memo_put(&self.scores, &id, s));
        }
        let (header, scored) = score()?;
        write_sealed(&path, record_jsonl(&header, key.plan, &scored).into_bytes())?;
        Ok(memo_put(&self.scores, &id, Arc::new(scored)))
    }

    /// The scores of `key` when this process or an earlier one computed
    /// them (memo, or an intact file for the same model file and build that
    /// reads back against the plan); never computes. A model's scores are
    /// the same product whether it plays the reference or the candidate.
    pub fn cached_scores(&self, key: &ScoresKey) -> Option<Arc<Scored>> {
        let (id, path) = self.scores_file(key);
        if let Some(s) = memo_get(&self.scores, &id) {
            return Some(s);
        }
        if !path.is_file() {
            return None;
        }
        let s = self.read_scores(key, &path)?;
        Some(memo_put(&self.scores, &id, s))
    }

    /// Put scores a decode computed into the store (file and memo). Two
    /// writers of one product write the same bytes, renamed atomically.
    pub fn put_scores(
        &self,
        key: &ScoresKey,
        header: &RecordHeader,
        scored: Scored,
    ) -> Result<Arc<Scored>> {
        let (id, path) = self.scores_file(key);
        write_sealed(&path, record_jsonl(header, key.plan, &scored).into_bytes())?;
        Ok(memo_put(&self.scores, &id, Arc::new(scored)))
    }

    /// The scores file of `key`, when it is intact and for `key`.
    fn read_scores(&self, key: &ScoresKey, path: &Path) -> Option<Arc<Scored>> {
        let cached = read_sealed(path).and_then(|b| match b {
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
        })?;
        match read_record(&text, key.plan) {
            Ok((h, scored)) if h.model_sha256 == key.model_sha256 && h.build == key.build => {
                Some(Arc::new(scored))
            }
            Ok(_) => {
                eprintln!(
                    "quantgate: reference cache {} is for another model or build; rescoring",
                    path.display()
                );
                None
            }
            Err(e) => {
                eprintln!(
                    "quantgate: reference cache {} is unusable ({e}); rescoring `{}`",
                    path.display(),
                    key.alias
                );
                None
            }
        }
    }

    /// Whether a product (`id`, kept in `path`) is in this process's memo
    /// or on disk. Only a hint for planning work: a file on disk is
    /// verified when it is read, and rebuilt when it is not intact.
    pub fn holds(&self, id: &str, path: &Path) -> bool {
        memo_holds(&self.scores, id) || memo_holds(&self.rows, id) || path.is_file()
    }

    /// An exclusive lock on the product `id` (a `flock` on
    /// `<dir>/locks/<sha>.lock`, released when dropped or when the process
    /// dies, so never stale): held while a product is built, so that
    /// concurrent processes and threads build it once.
    pub fn lock(&self, id: &str) -> Result<std::fs::File> {
        crate::core::fsutil::lock_file(&self.dir.join("locks").join(format!(
            "{}.lock",
            crate::core::fsutil::sha256_bytes(id.as_bytes())
        )))
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

    /// Where the rows of `header` are kept, and the id that names them.
    pub fn rows_product(&self, header: &CacheHeader) -> (String, PathBuf) {
        let key = header.key();
        let path = self.dir.join(format!("{key}.qgref"));
        (key, path)
    }

    /// Put rows a shared decode computed into the store (file and memo);
    /// `header` gets the reference's vocabulary size and fingerprint. The
    /// caller holds the product's lock.
    pub fn put_rows(
        &self,
        header: &CacheHeader,
        n_vocab: usize,
        fingerprint: String,
        rows: Vec<RefPosition>,
    ) -> Result<()> {
        let (key, path) = self.rows_product(header);
        let rows = self.write_rows(header, &path, n_vocab, fingerprint, rows)?;
        memo_put(&self.rows, &key, rows);
        Ok(())
    }

    fn write_rows(
        &self,
        header: &CacheHeader,
        path: &Path,
        n_vocab: usize,
        fingerprint: String,
        rows: Vec<RefPosition>,
    ) -> Result<Arc<RefRows>> {
        let mut h = header.clone();
        h.n_vocab = n_vocab;
        h.tokenizer_fingerprint = fingerprint;
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        crate::core::fsutil::write_atomic(path, &crate::execute::qgref::encode(&h, &rows))?;
        Ok(Arc::new(RefRows {
            rows,
            n_vocab: h.n_vocab,
            tokenizer_fingerprint: h.tokenizer_fingerprint,
        }))
    }

    /// The rows file of `header`: None when absent; the reason when it is
    /// not intact or not for `header`.
    fn read_rows(
        header: &CacheHeader,
        path: &Path,
    ) -> std::result::Result<Option<Arc<RefRows>>, String> {
        match std::fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
            Ok(bytes) => crate::execute::qgref::decode(&bytes, header).map(|(h, rows)| {
                Some(Arc::new(RefRows {
                    rows,
                    n_vocab: h.n_vocab,
                    tokenizer_fingerprint: h.tokenizer_fingerprint,
                }))
            }),
        }
    }

    fn cached_rows(
        &self,
        header: &CacheHeader,
        case_path: &Path,
        ref_alias: &str,
        build: &dyn Fn() -> Result<(usize, String, Vec<RefPosition>)>,
    ) -> Result<Arc<RefRows>> {
        let (key, path) = self.rows_product(header);
        if let Some(r) = memo_get(&self.rows, &key) {
            return Ok(r);
        }
        let mut corrupt = match Self::read_rows(header, &path) {
            Ok(Some(rows)) => return Ok(memo_put(&self.rows, &key, rows)),
            Ok(None) => None,
            Err(why) => Some(why),
        };
        let _lock = self.lock(&key)?;
        // Another thread or process may have built it while this one waited.
        if let Some(r) = memo_get(&self.rows, &key) {
            return Ok(r);
        }
        match Self::read_rows(header, &path) {
            Ok(Some(rows)) => return Ok(memo_put(&self.rows, &key, rows)),
            Ok(None) => {}
            Err(why) => corrupt = Some(why),
        }
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
        let rows = self.write_rows(header, &path, n_vocab, fingerprint, rows)?;
        Ok(memo_put(&self.rows, &key, rows))
    }
}

/// Whether `id` is in a memo.
fn memo_holds<T>(m: &Memo<T>, id: &str) -> bool {
    m.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id)
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
