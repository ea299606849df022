//! A reference model's scores (`.qgscores`): what they were computed from,
//! where they are kept, and how they are read back, checked and memoized.

use super::*;
use crate::core::auth::Seal;
use crate::core::error::Result;
use crate::core::fsutil::{read_sealed_with, write_sealed_with};
use crate::core::Settings;
use crate::execute::record::{read_record, record_jsonl, RecordHeader};
use crate::execute::windows::{Scored, ScoringPlan};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Scores as the store keeps them: with the vocabulary size and tokenizer
/// fingerprint of the model that made them (from their record's header),
/// for the one tokenizer check.
pub struct StoredScores {
    /// The scores.
    pub scored: Arc<Scored>,
    /// Vocabulary size of the model that scored them.
    pub n_vocab: usize,
    /// Its tokenizer fingerprint.
    pub fingerprint: String,
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
    /// The id and file of a reference's scores.
    pub(super) fn scores_file(&self, key: &ScoresKey) -> (String, PathBuf) {
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
    pub(crate) fn scores_product(&self, key: &ScoresKey) -> (String, PathBuf) {
        self.scores_file(key)
    }

    /// The reference's scores of `key.plan`, with the vocabulary that made
    /// them: from this process's memo, the shipped folder, the record cache
    /// (when it is for the same model file and build and reads back against
    /// the plan), or `score` (which returns the record header and the
    /// scores), then recorded. Building takes the product's lock, so
    /// concurrent processes score a reference once. `at` (where the case
    /// names the reference) prefixes the store's own errors: a shipped copy
    /// that is unusable, or a computation a shipped folder refuses.
    pub fn scores(
        &self,
        key: &ScoresKey,
        at: &dyn Display,
        score: &dyn Fn() -> Result<(RecordHeader, Scored)>,
    ) -> Result<Arc<StoredScores>> {
        let (id, path) = self.scores_file(key);
        let stored = |s: &Self| s.stored_scores(key, &id, &path).map_err(|e| e.context(at));
        if let Some(s) = stored(self)? {
            return Ok(s);
        }
        self.may_compute(&format!("the scores of reference `{}`", key.alias), &path)
            .map_err(|e| e.context(at))?;
        let _lock = self.lock(&id)?;
        // Another thread or process may have built it while this one waited.
        if let Some(s) = stored(self)? {
            return Ok(s);
        }
        let (header, scored) = score()?;
        self.write_scores(key, &path, &header, &scored)?;
        Ok(self.remember_scores(&id, &header, scored))
    }

    /// The scores of `key` from the memo, the shipped folder or the local
    /// cache; never computes. An unusable shipped copy is an error under
    /// `QUANTGATE_REFERENCE_MISSING=error`.
    fn stored_scores(
        &self,
        key: &ScoresKey,
        id: &str,
        path: &Path,
    ) -> Result<Option<Arc<StoredScores>>> {
        if let Some(s) = memo_get(&self.scores, id) {
            return Ok(Some(s));
        }
        if let Some(shipped) = self.shipped_path(path) {
            match Self::load_scores(key, &shipped, self.shipped_seal(&shipped)) {
                Ok(Some((h, s))) => return Ok(Some(self.remember_scores(id, &h, s))),
                Ok(None) => {}
                Err(why) => self.shipped_unusable(&shipped, &why)?,
            }
        }
        Ok(self.read_scores(key, id, path))
    }

    /// Keep scores and their record's vocabulary in the memo.
    fn remember_scores(
        &self,
        id: &str,
        header: &RecordHeader,
        scored: Scored,
    ) -> Arc<StoredScores> {
        let stored = StoredScores {
            scored: Arc::new(scored),
            n_vocab: header.n_vocab,
            fingerprint: header.tokenizer_fingerprint.clone(),
        };
        memo_put(&self.scores, id, Arc::new(stored))
    }

    /// The scores of `key` when this process or an earlier one computed
    /// them, or the shipped folder holds them (memo, or an intact file for
    /// the same model file and build that reads back against the plan);
    /// never computes. A model's scores are the same product whether it
    /// plays the reference or the candidate.
    pub(crate) fn cached_scores(&self, key: &ScoresKey) -> Option<Arc<Scored>> {
        let (id, path) = self.scores_file(key);
        let stored = self.stored_scores(key, &id, &path).ok().flatten()?;
        Some(stored.scored.clone())
    }

    /// Put scores a decode computed into the store (file and memo). Two
    /// writers of one product write the same bytes, renamed atomically.
    pub(crate) fn put_scores(
        &self,
        key: &ScoresKey,
        header: &RecordHeader,
        scored: Scored,
    ) -> Result<Arc<Scored>> {
        let (id, path) = self.scores_file(key);
        self.write_scores(key, &path, header, &scored)?;
        Ok(self.remember_scores(&id, header, scored).scored.clone())
    }

    /// Write a scores file, its header naming the settings that scored it.
    fn write_scores(
        &self,
        key: &ScoresKey,
        path: &Path,
        header: &RecordHeader,
        scored: &Scored,
    ) -> Result<()> {
        let header = RecordHeader {
            settings: Some(key.settings.describe()),
            ..header.clone()
        };
        write_sealed_with(
            path,
            record_jsonl(&header, key.plan, scored).into_bytes(),
            self.seal,
        )
    }

    /// A scores file: None when absent, the reason when it is not intact
    /// or not for `key`.
    pub(super) fn load_scores(
        key: &ScoresKey,
        path: &Path,
        seal: Seal,
    ) -> std::result::Result<Option<(RecordHeader, Scored)>, Malformed> {
        let Some(bytes) = read_sealed_with(path, seal)? else {
            return Ok(None);
        };
        let text = String::from_utf8(bytes).map_err(|e| e.to_string())?;
        let (h, scored) = read_record(&text, key.plan)?;
        if h.model_sha256 != key.model_sha256 || h.build != key.build {
            return Err(format!(
                "it is for another model or build ({} {}, expected {} {})",
                h.model_sha256, h.build, key.model_sha256, key.build
            )
            .into());
        }
        let want = key.settings.describe();
        if h.settings.as_deref() != Some(want.as_str()) {
            return Err(format!(
                "it was scored under other settings ({}, expected {want})",
                h.settings.as_deref().unwrap_or("none recorded")
            )
            .into());
        }
        Ok(Some((h, scored)))
    }

    /// The local scores file of `key`, when it is intact and for `key`
    /// (said on stderr when it is not: it is scored again).
    fn read_scores(&self, key: &ScoresKey, id: &str, path: &Path) -> Option<Arc<StoredScores>> {
        match Self::load_scores(key, path, self.seal) {
            Ok(Some((h, s))) => Some(self.remember_scores(id, &h, s)),
            Ok(None) => None,
            Err(why) => {
                crate::core::progress::say!(
                    "quantgate: reference cache {} is unusable ({why}); rescoring `{}`",
                    path.display(),
                    key.alias
                );
                None
            }
        }
    }
}
