//! The reference side: its scores from the one reference store (after the
//! one tokenizer and context checks), a reference record, and the build
//! of reference scores in a shared decode.

use super::*;

/// A reference's scores of a plan (its reference record), built as a
/// consumer of the reference's observation.
pub struct ScoresBuild {
    scorer: PlanScorer,
    header: RecordHeader,
    key: (String, String, Settings, String, String),
}

impl ScoresBuild {
    /// A builder of `alias`'s scores of `plan`.
    pub(crate) fn new(
        text: &ScoredText,
        alias: &str,
        sha256: &str,
        build: &str,
        model: &Arc<dyn LoadedModel>,
        plan: &ScoringPlan,
        options: &EngineOptions,
    ) -> Self {
        let info = model.info();
        ScoresBuild {
            scorer: PlanScorer::new(Arc::new(plan.clone()), info.n_vocab),
            header: RecordHeader {
                quantgate_reference_record: 1,
                model: alias.to_string(),
                model_sha256: sha256.to_string(),
                build: build.to_string(),
                n_vocab: info.n_vocab,
                tokenizer_fingerprint: info.tokenizer_fingerprint.clone(),
                mode: text.windowing.mode().to_string(),
                windows: plan.windows.len(),
                targets: plan.targets(),
                token_stream_sha256: plan.token_stream_sha256.clone(),
                settings: None,
            },
            key: (
                alias.to_string(),
                sha256.to_string(),
                text.settings(0, options),
                build.to_string(),
                format!("{:?}", text.windowing),
            ),
        }
    }

    /// The record header and the scores.
    pub(crate) fn scored(self) -> Result<(RecordHeader, Scored)> {
        Ok((self.header, self.scorer.finish()?))
    }

    /// The record header and `scored`, this plan's scores computed
    /// otherwise (its windows, kept).
    pub(crate) fn with_scored(self, scored: Scored) -> (RecordHeader, Scored) {
        (self.header, scored)
    }
}

impl Consumer for ScoresBuild {
    fn absorb(&mut self, r: &Row<'_>, _: Mapped) -> Result<()> {
        self.scorer.take(r).map(|_| ())
    }
}

impl ScoresBuild {
    /// The scores, put in the store (file and memo) for later readers.
    pub(crate) fn store(self, cx: &RunContext) -> Result<Arc<Scored>> {
        self.store_with(cx, false)
    }

    /// [`ScoresBuild::store`], or with `best_effort` the scores even when
    /// they cannot be kept (said on stderr: later runs decode again).
    pub(crate) fn store_with(self, cx: &RunContext, best_effort: bool) -> Result<Arc<Scored>> {
        let plan = self.scorer.plan().clone();
        let (header, scored) = (self.header.clone(), self.scorer.finish()?);
        Self::put(cx, self.key, &plan, &header, scored, best_effort)
    }

    /// Put this plan's `scored`, computed otherwise (window by window), in
    /// the store as [`ScoresBuild::store_with`] would (best effort).
    pub(crate) fn store_scored(self, cx: &RunContext, scored: Scored) -> Result<Arc<Scored>> {
        let plan = self.scorer.plan().clone();
        let mut header = self.header.clone();
        header.windows = scored.windows.len();
        header.targets = scored.token_nll.len();
        Self::put(cx, self.key, &plan, &header, scored, true)
    }

    fn put(
        cx: &RunContext,
        (alias, sha, settings, build, windowing): (String, String, Settings, String, String),
        plan: &ScoringPlan,
        header: &RecordHeader,
        scored: Scored,
        best_effort: bool,
    ) -> Result<Arc<Scored>> {
        let key = ScoresKey {
            alias: &alias,
            model_sha256: &sha,
            plan,
            settings: &settings,
            build: &build,
            windowing,
        };
        if !best_effort {
            return cx.references.put_scores(&key, header, scored);
        }
        let kept = scored.clone();
        cx.references.put_scores(&key, header, scored).or_else(|e| {
            crate::core::progress::say!(
                "quantgate: the scores of `{alias}` could not be kept ({}); later runs decode them again",
                e.message
            );
            Ok(Arc::new(kept))
        })
    }
}

impl RefBuild for ScoresBuild {
    fn finish(self: Box<Self>, cx: &RunContext) -> Result<()> {
        self.store(cx).map(|_| ())
    }
}

impl ScoredText {
    /// The key of a model's scores of `plan` (its own plan).
    pub(crate) fn scores_key<'a>(
        &self,
        ref_alias: &'a str,
        sha: &'a str,
        plan: &'a ScoringPlan,
        settings: &'a Settings,
        build: &'a str,
    ) -> ScoresKey<'a> {
        ScoresKey {
            alias: ref_alias,
            model_sha256: sha,
            plan,
            settings,
            build,
            windowing: format!("{:?}", self.windowing),
        }
    }

    /// A reference model's scores of the candidate's plan, through the
    /// reference store: the reference is loaded, checked (tokenizer, context,
    /// identical token stream) and scored only when no cache holds them.
    pub(crate) fn reference_scores(
        &self,
        cx: &RunContext,
        (ref_alias, ref_at): &(String, Location),
        src: &str,
        model: &dyn LoadedModel,
        plan: &ScoringPlan,
    ) -> Result<Arc<Scored>> {
        // From the store (memo, shipped folder, cache) when it holds them:
        // no load. The key is the candidate's plan, which the reference's
        // must equal. Else computed here, when the store may (a shipped
        // folder can refuse): loaded, checked and scored under its lock.
        let build = cx.identity_of(ref_alias);
        let settings = self.settings(cx.threads, cx.options());
        let pinned = cx.pinned_sha256(ref_alias).map_err(|e| e.context(ref_at))?;
        let key = self.scores_key(ref_alias, &pinned, plan, &settings, &build);
        let stored = cx.references.scores(&key, ref_at, &|| {
            let (rv, rmodel) = cx.load_reference((ref_alias, ref_at), Vocab::of(model.info()))?;
            self.check_context(&*rmodel)?;
            let rplan = self.identical_plan(cx, ref_at, src, &*rmodel, model, plan)?;
            let mut b = ScoresBuild::new(
                self,
                ref_alias,
                &rv.file.sha256,
                &build,
                &rmodel,
                &rplan,
                cx.options(),
            );
            // Every window kept by decodes of other plans: no decode.
            if let Some(whole) = kept_scores(cx, &rv.file.sha256, &settings, &build, &rplan) {
                return Ok(b.with_scored(whole));
            }
            let obs = self.observation(cx, rmodel.clone(), &rplan);
            observe_one(&obs, &mut b)?;
            b.scored()
        })?;
        let recorded = Vocab {
            alias: ref_alias,
            n_vocab: stored.n_vocab,
            fingerprint: &stored.fingerprint,
        };
        same_tokenizer(ref_at, "reference", recorded, Vocab::of(model.info()))?;
        Ok(stored.scored.clone())
    }

    /// The reference's scores of the case's windows as work for a shared
    /// decode of the reference model (None when the store holds them).
    pub(crate) fn reference_scores_work(
        &self,
        cx: &RunContext,
        ref_alias: &str,
    ) -> Result<Option<RefWork>> {
        let src = self.pin.read_text()?;
        let (rv, rmodel) = cx.load(ref_alias)?;
        self.check_context(&*rmodel)?;
        let rplan = Arc::new(self.plan_for(cx, &src, &*rmodel)?);
        let build = cx.identity_of(ref_alias);
        let settings = self.settings(cx.threads, cx.options());
        let key = self.scores_key(ref_alias, &rv.file.sha256, &rplan, &settings, &build);
        let (id, path) = cx.references.scores_product(&key);
        if cx.references.holds(&id, &path) {
            return Ok(None);
        }
        let b = ScoresBuild::new(
            self,
            ref_alias,
            &rv.file.sha256,
            &build,
            &rmodel,
            &rplan,
            cx.options(),
        );
        // Every window kept by decodes of other plans: the whole kept from
        // them, no decode.
        if let Some(whole) = kept_scores(cx, &rv.file.sha256, &settings, &build, &rplan) {
            b.store_scored(cx, whole)?;
            return Ok(None);
        }
        Ok(Some(RefWork {
            key: id,
            path,
            observation: self.observation(cx, rmodel, &rplan),
            consumer: Box::new(b),
        }))
    }

    /// The reference's plan, which must score the candidate's tokens.
    pub(crate) fn identical_plan(
        &self,
        cx: &RunContext,
        ref_at: &Location,
        src: &str,
        reference: &dyn LoadedModel,
        candidate: &dyn LoadedModel,
        plan: &ScoringPlan,
    ) -> Result<ScoringPlan> {
        let rplan = self.plan_for(cx, src, reference)?;
        if rplan.token_stream_sha256 != plan.token_stream_sha256 {
            return Err(Error::input(format!(
                "{ref_at}: reference: `{}` and `{}` do not score identical tokens \
                 (token stream {} vs {})",
                reference.info().file.alias,
                candidate.info().file.alias,
                rplan.token_stream_sha256,
                plan.token_stream_sha256
            )));
        }
        Ok(rplan)
    }

    /// Score the windows on `alias` and return them as a reference record
    /// (JSONL) that later runs can compare against without the model.
    pub(crate) fn reference_record(&self, cx: &RunContext, alias: &str) -> Result<String> {
        let src = self.pin.read_text()?;
        let (verified, model) = cx.load(alias)?;
        let plan = self.plan_for(cx, &src, &*model)?;
        let build = cx.identity_of(alias);
        let obs = self.observation(cx, model.clone(), &plan);
        let mut b = ScoresBuild::new(
            self,
            alias,
            &verified.file.sha256,
            &build,
            &model,
            &plan,
            cx.options(),
        );
        observe_one(&obs, &mut b)?;
        let (header, scored) = b.scored()?;
        Ok(crate::execute::record::record_jsonl(
            &header, &plan, &scored,
        ))
    }
}
