//! The one reference store: what a reference model observed, computed once
//! per process per key and shared by every candidate, kept across processes
//! in `<cache>/reference` — compact full-distribution rows (`.qgref`) for KL,
//! and per-target scores (reference records, `.jsonl`) for paired ΔNLL; and
//! products a kind keeps by an id of its own ([`ReferenceStore::kept`], such
//! as a model's multiple-choice scores).
//! Also the one check that a reference and a candidate share a tokenizer
//! and the one check that a context fits a model.
//!
//! A reference built once can be shipped to other machines (shards):
//! `quantgate reference build` writes the products into a folder, and
//! `QUANTGATE_REFERENCE_DIR=DIR` makes every read look there first, read-only.
//! A product the folder lacks (or holds corrupt) is then computed only when
//! `QUANTGATE_REFERENCE_MISSING=compute`; by default it is an error naming
//! the product, the folder and the case, so a shard never silently loads the
//! reference model it was meant not to.
//!
//! Contract: a cache file is used only after every check its format has
//! (a `.qgref` is rebuilt when any fails; a record must match the model's
//! sha256, the build and the plan); a corrupt cache whose reference model
//! is not available is an error naming both, never a partial result. A
//! shipped folder is never written.

use crate::core::auth::Seal;
use crate::core::error::{Error, Malformed, Result};
use crate::core::fsutil::{read_sealed_with, write_sealed_with};
use crate::core::{Location, Settings};
use crate::engine::ModelInfo;
use crate::execute::qgref::CacheHeader;
use crate::measure::kld::RefPosition;
use std::collections::HashMap;
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

mod shipped;
pub(crate) use shipped::*;
mod checks;
mod scores;
pub(crate) use checks::*;
pub use scores::{ScoresKey, StoredScores};
pub(crate) mod live;
pub(crate) use live::{LiveRows, LiveSlots};

/// Reference rows for KL, and where they came from.
#[derive(Debug)]
pub(crate) struct RefRows {
    /// One per scored position.
    pub rows: Vec<RefPosition>,
    /// Reference vocabulary size.
    pub n_vocab: usize,
    /// Reference tokenizer fingerprint.
    pub tokenizer_fingerprint: String,
}

/// Products computed in this process, by id.
type Memo<T> = Mutex<HashMap<String, Arc<T>>>;

/// Reference rows and scores, once per process per key, cached on disk.
pub struct ReferenceStore {
    /// Where the caches live (`<cache>/reference` by default).
    pub dir: PathBuf,
    /// A shipped, read-only reference folder (`QUANTGATE_REFERENCE_DIR`),
    /// or why the environment that names it is unusable.
    shipped: Result<Option<Shipped>>,
    scores: Memo<StoredScores>,
    rows: Memo<RefRows>,
    kept: Memo<dyn std::any::Any + Send + Sync>,
    /// Rows read live, never kept ([`live`]).
    pub live: LiveSlots,
    /// How the products this store writes into [`ReferenceStore::dir`] are
    /// sealed, and how those it reads there must be: keyed
    /// ([`Seal::local`]) in the local cache, so that a product edited and
    /// sealed again is never read back; [`Seal::shipped`] in a folder built
    /// for other machines.
    pub seal: Seal,
    /// How a shipped folder's products must be sealed: keyed with the
    /// signing key when one is set ([`Seal::shipped`]).
    pub shipped_seal: Seal,
    /// Shipped files already named as unauthenticated (said once each).
    warned: Mutex<std::collections::BTreeSet<PathBuf>>,
    /// Whether decodes keep the windows they scored here for sequential
    /// cases (`.qgwin`): in a cache, yes; not in a folder built for other
    /// machines (`reference build --out`), which holds only the products
    /// its shards read.
    pub keeps_windows: bool,
}

/// A kept product's file: the id it was computed for, and the value.
#[derive(serde::Deserialize)]
struct KeptFile<T> {
    quantgate_kept: u32,
    id: String,
    value: T,
}

/// A kept product as it is written.
#[derive(serde::Serialize)]
struct KeptOut<'a, T> {
    quantgate_kept: u32,
    id: &'a str,
    value: &'a T,
}

/// A product of this process's memo.
fn memo_get<T: ?Sized>(memo: &Memo<T>, id: &str) -> Option<Arc<T>> {
    memo.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(id)
        .cloned()
}

/// Remember a product (the first one stays: equal ids, equal products).
fn memo_put<T: ?Sized>(memo: &Memo<T>, id: &str, value: Arc<T>) -> Arc<T> {
    memo.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(id.to_string())
        .or_insert(value)
        .clone()
}

impl ReferenceStore {
    /// A store with its caches under `dir`, and the shipped folder and
    /// keys `config` names (`QUANTGATE_REFERENCE_DIR`, the signing key).
    pub fn new(dir: PathBuf, config: &crate::core::config::Config) -> Self {
        Self::with_shipped(dir, Ok(config.reference.clone()), config)
    }

    /// A store with its caches under `dir` and `shipped` as the shipped
    /// folder (or why there is none to use), sealed with `config`'s keys.
    pub fn with_shipped(
        dir: PathBuf,
        shipped: Result<Option<Shipped>>,
        config: &crate::core::config::Config,
    ) -> Self {
        ReferenceStore {
            dir,
            shipped,
            scores: Mutex::new(HashMap::new()),
            rows: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
            live: LiveSlots::default(),
            seal: Seal::local(config),
            shipped_seal: Seal::shipped(config),
            warned: Mutex::new(Default::default()),
            keeps_windows: true,
        }
    }

    /// The seal a shipped folder's file at `path` must carry: keyed with
    /// the signing key when one is set (a file without its MAC is refused);
    /// without one, plain, and the file is named as unauthenticated (once).
    fn shipped_seal(&self, path: &Path) -> Seal {
        let seal = self.shipped_seal;
        if !seal.keyed()
            && path.is_file()
            && self
                .warned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(path.to_path_buf())
        {
            crate::core::progress::say!("{}", unauthenticated_warning(path));
        }
        seal
    }

    /// The shipped folder, when one is in use.
    pub(crate) fn shipped(&self) -> Option<&Shipped> {
        self.shipped.as_ref().ok().and_then(|s| s.as_ref())
    }

    /// The shipped folder's copy of a product kept in `path` (its file name).
    fn shipped_path(&self, path: &Path) -> Option<PathBuf> {
        let s = self.shipped()?;
        Some(s.dir.join(path.file_name()?))
    }

    /// The shipped folder that forbids reference work here (a reference
    /// model decode or load): one given with `QUANTGATE_REFERENCE_MISSING=error`;
    /// an unusable environment forbids it too.
    fn forbidding(&self) -> Result<Option<&Path>> {
        match &self.shipped {
            Err(why) => Err(why.clone()),
            Ok(Some(s)) if s.missing == Missing::Error => Ok(Some(&s.dir)),
            Ok(_) => Ok(None),
        }
    }

    /// May this store compute product `what` (a reference model decode),
    /// kept in `path`? Not when a shipped folder forbids it ([`Self::forbidding`]).
    fn may_compute(&self, what: &str, path: &Path) -> Result<()> {
        match self.forbidding()? {
            Some(dir) => Err(Error::input(format!(
                "{what}: not in the shipped reference folder {REFERENCE_DIR_ENV}={} (no {}), and \
                 {REFERENCE_MISSING_ENV}=error: build the folder with `quantgate reference build` for \
                 this case, or set {REFERENCE_MISSING_ENV}=compute to score the reference here",
                dir.display(),
                path.file_name().unwrap_or_default().to_string_lossy()
            ))),
            None => Ok(()),
        }
    }

    /// May a trial load reference model `alias` itself? Not when a shipped
    /// folder forbids it: a shard runs without its reference models (a kind
    /// that reads its reference model directly, as multiple choice does,
    /// then needs `compute`).
    pub(crate) fn may_load_reference(&self, alias: &str) -> Result<()> {
        match self.forbidding()? {
            Some(dir) => Err(Error::input(format!(
                "reference `{alias}`: {REFERENCE_DIR_ENV}={} ships the references and \
                 {REFERENCE_MISSING_ENV}=error, so no reference model is loaded here; this case \
                 needs its reference model itself (set {REFERENCE_MISSING_ENV}=compute to load it)",
                dir.display()
            ))),
            None => Ok(()),
        }
    }

    /// A shipped copy that fails its checks: an error under
    /// `QUANTGATE_REFERENCE_MISSING=error`, else said and left for the
    /// local cache or a new computation.
    fn shipped_unusable(&self, path: &Path, why: &dyn Display) -> Result<()> {
        let msg = format!("shipped reference {} is unusable ({why})", path.display());
        if self.forbidding()?.is_some() {
            return Err(Error::input(msg));
        }
        crate::core::progress::say!("quantgate: {msg}; computing it here");
        Ok(())
    }

    /// A product named by `id` — which must name everything the value
    /// depends on — kept in the local cache as `<sha256(id)>.<ext>` (sealed
    /// JSON that names its id): from this process's memo, or from the file
    /// when it is intact and for `id` (said on stderr and computed again
    /// when it is not), else `compute`d under the product's lock, so that
    /// concurrent processes compute it once, and kept when `keep` accepts
    /// it (a value that would not read back exactly, such as a non-finite
    /// number, is returned but not kept). Never read from a shipped folder.
    pub(crate) fn kept<T>(
        &self,
        id: &str,
        ext: &str,
        keep: &dyn Fn(&T) -> bool,
        compute: &dyn Fn() -> Result<T>,
    ) -> Result<Arc<T>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        let memo = || memo_get(&self.kept, id).and_then(|v| v.downcast::<T>().ok());
        if let Some(v) = memo() {
            return Ok(v);
        }
        let path = self.dir.join(format!(
            "{}.{ext}",
            crate::core::fsutil::sha256_bytes(id.as_bytes())
        ));
        let remember = |v: T| -> Arc<T> {
            let any: Arc<dyn std::any::Any + Send + Sync> = Arc::new(v);
            memo_put(&self.kept, id, any)
                .downcast::<T>()
                .expect("one id, one type")
        };
        if let Some(v) = read_kept::<T>(id, &path, self.seal) {
            return Ok(remember(v));
        }
        let _lock = self.lock(id)?;
        if let Some(v) = memo() {
            return Ok(v);
        }
        if let Some(v) = read_kept::<T>(id, &path, self.seal) {
            return Ok(remember(v));
        }
        let v = compute()?;
        if keep(&v) {
            let out = KeptOut {
                quantgate_kept: 1,
                id,
                value: &v,
            };
            let bytes = serde_json::to_vec(&out)
                .map_err(|e| Error::harness(format!("{}: {e}", path.display())))?;
            write_sealed_with(&path, bytes, self.seal)?;
        }
        Ok(remember(v))
    }

    /// A kept product (as [`ReferenceStore::kept`] keeps it) when this
    /// process's memo or an intact file holds it; never computes.
    pub(crate) fn kept_only<T>(&self, id: &str, ext: &str) -> Option<Arc<T>>
    where
        T: serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        if let Some(v) = memo_get(&self.kept, id).and_then(|v| v.downcast::<T>().ok()) {
            return Some(v);
        }
        let path = self.dir.join(format!(
            "{}.{ext}",
            crate::core::fsutil::sha256_bytes(id.as_bytes())
        ));
        let v: T = read_kept(id, &path, self.seal)?;
        let any: Arc<dyn std::any::Any + Send + Sync> = Arc::new(v);
        memo_put(&self.kept, id, any).downcast::<T>().ok()
    }

    /// Whether a product (`id`, kept in `path`) is in this process's memo
    /// or on disk. Only a hint for planning work: a file on disk is
    /// verified when it is read, and rebuilt when it is not intact.
    pub(crate) fn holds(&self, id: &str, path: &Path) -> bool {
        memo_holds(&self.scores, id)
            || memo_holds(&self.rows, id)
            || path.is_file()
            || self.shipped_path(path).is_some_and(|p| p.is_file())
    }

    /// An exclusive lock on the product `id` (a `flock` on
    /// `<dir>/locks/<sha>.lock`, released when dropped or when the process
    /// dies, so never stale): held while a product is built, so that
    /// concurrent processes and threads build it once.
    pub(crate) fn lock(&self, id: &str) -> Result<std::fs::File> {
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
    pub(crate) fn rows(
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

    /// Rows of a part of a reference (a sequential run's windows), from the
    /// `.qgref` file of `header` or built by `build` and written there, as
    /// [`ReferenceStore::rows`] keeps whole references but not remembered
    /// in this process: a run holds one part at a time, so memory stays
    /// flat in the windows it visits. A damaged file is said and rebuilt.
    pub(crate) fn part_rows(
        &self,
        header: &CacheHeader,
        ref_alias: &str,
        build: &dyn Fn() -> Result<(usize, String, Vec<RefPosition>)>,
    ) -> Result<Arc<RefRows>> {
        let (key, path) = self.rows_product(header);
        let read = |path: &Path, seal: Seal| match Self::read_rows(header, path, seal) {
            Ok(r) => r,
            Err(why) => {
                crate::core::progress::say!(
                    "quantgate: reference cache {} is unusable ({why}); rebuilding it from `{ref_alias}`",
                    path.display()
                );
                None
            }
        };
        let shipped = || {
            self.shipped_path(&path)
                .and_then(|p| read(&p, self.shipped_seal(&p)))
        };
        if let Some(r) = memo_get(&self.rows, &key)
            .or_else(shipped)
            .or_else(|| read(&path, self.seal))
        {
            return Ok(r);
        }
        self.may_compute(
            &format!("part of the rows of reference `{ref_alias}`"),
            &path,
        )?;
        let _lock = self.lock(&key)?;
        if let Ok(Some(r)) = Self::read_rows(header, &path, self.seal) {
            return Ok(r);
        }
        let (n_vocab, fingerprint, rows) = build()?;
        self.write_rows(header, &path, n_vocab, fingerprint, rows)
    }

    /// The lock of the rows product `key` (kept in `path`), once this store
    /// may compute it (not when a shipped folder forbids it: the error
    /// names the case and the reference).
    fn may_build_rows(
        &self,
        (case_path, ref_alias): (&Path, &str),
        (key, path): (&str, &Path),
    ) -> Result<std::fs::File> {
        self.may_compute(
            &format!(
                "{}: the rows of reference `{ref_alias}`",
                case_path.display()
            ),
            path,
        )?;
        self.lock(key)
    }

    /// How many references this process holds whole, as rows in memory
    /// ([`Self::rows`]: an imported file, or a damaged cache rebuilt); a
    /// run that streams every reference leaves it at 0.
    pub fn rows_held(&self) -> usize {
        self.rows.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The rows of `header` built into their `.qgref` file by `build`
    /// (the reference's decode, writing each row as it comes: nothing holds
    /// them whole), under the product's lock, unless this process holds
    /// them already or a file is there (intact: another process built it
    /// while this one waited; damaged: [`Self::rows`] says so and rebuilds
    /// it). What a trial that runs alone does
    /// (`QUANTGATE_ISOLATION=test`: no reference work ran before it) before
    /// it reads them as any stored reference is read ([`Self::row_stream`]).
    pub(crate) fn build_rows_file(
        &self,
        header: &CacheHeader,
        (case_path, ref_alias): (&Path, &str),
        build: &dyn Fn(&Path, Seal) -> Result<()>,
    ) -> Result<()> {
        let (key, path) = self.rows_product(header);
        if memo_holds(&self.rows, &key) || self.shipped_path(&path).is_some_and(|p| p.is_file()) {
            // Held here, or shipped (read, or said unusable, by `rows`).
            return Ok(());
        }
        let _lock = self.may_build_rows((case_path, ref_alias), (&key, &path))?;
        // A file already there, intact (built while this one waited) or
        // not (left to `rows`, which says why and rebuilds it, or says why
        // it cannot).
        if path.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        build(&path, self.seal)
    }

    /// The rows of `header`, read a range of windows at a time as they are
    /// needed (nothing holds them whole: peak memory does not grow with the
    /// windows; a model's llama.cpp contexts are kept across the calls,
    /// `engine/llama/pool.rs`), from the shipped folder's or the cache's
    /// intact file (its seal checked over the whole
    /// file first, its header against `header`, its tokenizer against the
    /// candidate's), and the file; None when this process holds them in
    /// memory already, or no intact file does: then [`ReferenceStore::rows`]
    /// reads or builds them (and says why a file was unusable).
    pub(crate) fn row_stream(
        &self,
        header: &CacheHeader,
        case_path: &Path,
        (ref_alias, ref_at): (&str, &Location),
        candidate: Vocab,
    ) -> Result<Option<(crate::execute::qgref::RowStream, PathBuf)>> {
        use crate::execute::qgref::RowStream;
        let (key, path) = self.rows_product(header);
        if memo_holds(&self.rows, &key) {
            return Ok(None);
        }
        let mut found = None;
        if let Some(shipped) = self.shipped_path(&path) {
            match RowStream::open(&shipped, header, self.shipped_seal(&shipped)) {
                Ok(Some(s)) => found = Some((s, shipped)),
                Ok(None) => {}
                Err(why) => self
                    .shipped_unusable(&shipped, &why)
                    .map_err(|e| e.context(case_path.display()))?,
            }
        }
        if found.is_none() {
            // A file that is not intact is left to `rows`, which says so
            // and rebuilds it (or says why it cannot).
            found = RowStream::open(&path, header, self.seal)
                .ok()
                .flatten()
                .map(|s| (s, path.clone()));
        }
        let Some((stream, file)) = found else {
            return Ok(None);
        };
        let h = stream.header();
        let stored = Vocab {
            alias: ref_alias,
            n_vocab: h.n_vocab,
            fingerprint: &h.tokenizer_fingerprint,
        };
        same_tokenizer(ref_at, "reference", stored, candidate)?;
        Ok(Some((stream, file)))
    }

    /// Where the rows of `header` are kept, and the id that names them.
    pub(crate) fn rows_product(&self, header: &CacheHeader) -> (String, PathBuf) {
        let key = header.key();
        let path = self.dir.join(format!("{key}.qgref"));
        (key, path)
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
        crate::core::fsutil::write_atomic(
            path,
            &crate::execute::qgref::encode(&h, &rows, self.seal),
        )?;
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
        seal: Seal,
    ) -> std::result::Result<Option<Arc<RefRows>>, Malformed> {
        match std::fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string().into()),
            Ok(bytes) => crate::execute::qgref::decode(&bytes, header, seal).map(|(h, rows)| {
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
        if let Some(shipped) = self.shipped_path(&path) {
            match Self::read_rows(header, &shipped, self.shipped_seal(&shipped)) {
                Ok(Some(rows)) => return Ok(memo_put(&self.rows, &key, rows)),
                Ok(None) => {}
                Err(why) => self
                    .shipped_unusable(&shipped, &why)
                    .map_err(|e| e.context(case_path.display()))?,
            }
        }
        let mut corrupt = match Self::read_rows(header, &path, self.seal) {
            Ok(Some(rows)) => return Ok(memo_put(&self.rows, &key, rows)),
            Ok(None) => None,
            Err(why) => Some(why),
        };
        let _lock = self.may_build_rows((case_path, ref_alias), (&key, &path))?;
        // Another thread or process may have built it while this one waited.
        if let Some(r) = memo_get(&self.rows, &key) {
            return Ok(r);
        }
        match Self::read_rows(header, &path, self.seal) {
            Ok(Some(rows)) => return Ok(memo_put(&self.rows, &key, rows)),
            Ok(None) => {}
            Err(why) => corrupt = Some(why),
        }
        if let Some(why) = &corrupt {
            crate::core::progress::say!(
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

/// The value of a kept product's file when it is intact and for `id`;
/// None when there is none, or (said on stderr) when it is unusable.
fn read_kept<T: serde::de::DeserializeOwned>(id: &str, path: &Path, seal: Seal) -> Option<T> {
    let why = match read_sealed_with(path, seal) {
        Ok(None) => return None,
        Err(why) => why.to_string(),
        Ok(Some(bytes)) => match serde_json::from_slice::<KeptFile<T>>(&bytes) {
            Ok(f) if f.quantgate_kept == 1 && f.id == id => return Some(f.value),
            Ok(f) if f.quantgate_kept != 1 => {
                format!("version {}, this build reads 1", f.quantgate_kept)
            }
            Ok(f) => format!("it is for `{}`, not `{id}`", f.id),
            Err(e) => e.to_string(),
        },
    };
    crate::core::progress::say!(
        "quantgate: reference cache {} is unusable ({why}); computing it again",
        path.display()
    );
    None
}

/// What is said of a shipped product read without a signing key: it is
/// intact (its sha256 seal holds) but nothing shows who wrote it.
pub(crate) fn unauthenticated_warning(path: &Path) -> String {
    format!(
        "quantgate: warning: shipped reference {} is unauthenticated: no signing key is set \
         ({}), so only its sha256 seal is checked, and anyone who could write the folder could \
         have edited it and sealed it again; build and read shipped references with a signing \
         key to authenticate them",
        path.display(),
        crate::core::auth::KEY_ENV
    )
}

/// Whether `id` is in a memo.
fn memo_holds<T: ?Sized>(m: &Memo<T>, id: &str) -> bool {
    m.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id)
}

#[cfg(test)]
mod tests;
