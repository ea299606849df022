//! Where a kld trial's reference rows come from: the reference model's
//! decode read live, a stored `.qgref` read a pair of windows at a time
//! (built into the store first when a trial runs alone), or, whole, an
//! imported llama-perplexity file.

use super::{Kld, Refs};
use crate::core::error::{Error, Result};
use crate::core::{Case, Location};
use crate::engine::LoadedModel;
use crate::execute::observe::Observation;
use crate::execute::qgref::CacheHeader;
use crate::execute::reference::{rows_header, RefRows, Vocab};
use crate::execute::windows::ScoringPlan;
use crate::execute::RunContext;
use crate::kinds::reference_rows::{LiveBuild, RowsBuild, StoredFeed};
use crate::kinds::scored_text::windows_prefix;
use crate::kinds::{FeedSource, LiveFeed};
use std::sync::Arc;

impl Kld {
    /// The reference model's decode of `plan`'s windows whose rows a
    /// candidate (`model`) reads live, and where it reads them: keyed by
    /// the product the rows would be kept as and the case (whose trials
    /// are one group), so that every candidate of the group reads one
    /// decode and no other group's feed writes where they read.
    pub(super) fn live_feed(
        &self,
        cx: &RunContext,
        case: &Case,
        src: &str,
        model: &Arc<dyn LoadedModel>,
        plan: &ScoringPlan,
    ) -> Result<(Refs, LiveFeed)> {
        let (alias, at) = self
            .reference
            .as_ref()
            .ok_or_else(|| Error::harness("a live kld case without a reference model"))?;
        let tx = &self.text;
        let (_, rmodel) = cx.load_reference((alias, at), Vocab::of(model.info()))?;
        tx.check_context(&*rmodel)?;
        let rplan = tx.identical_plan(cx, at, src, &*rmodel, &**model, plan)?;
        let header = self.rows_header(cx, (alias, at), &rplan, rmodel.info().n_vocab, None)?;
        let (product, _) = cx.references.rows_product(&header);
        let key = format!("{product} live for {}", case.path.display());
        let slot = cx.references.live.slot(&key);
        let observation = tx.observation(cx, rmodel.clone(), &rplan);
        let build = self.rows_build(header, &rplan, &*rmodel);
        let producer = Box::new(LiveBuild::new(build, slot.clone()));
        Ok((
            Refs::Live(slot),
            LiveFeed {
                key,
                source: FeedSource::Decode {
                    observation,
                    producer,
                },
            },
        ))
    }

    /// The stored reference rows of `plan`, when the store holds them
    /// intact in a file (else the caller reads them whole, building them
    /// if need be), as a feed a candidate (`model`, decoding observation
    /// `obs`) reads a pair of windows at a time: keyed by the product and
    /// the candidate's observation (one group's), so that the trials of
    /// that decode read one feed and no other group's feed writes where
    /// they read.
    pub(super) fn stored_feed(
        &self,
        cx: &RunContext,
        case: &Case,
        model: &dyn LoadedModel,
        (plan, obs): (&ScoringPlan, &str),
    ) -> Result<Option<(Refs, LiveFeed)>> {
        let (Some((alias, at)), None) = (&self.reference, &self.import) else {
            return Ok(None);
        };
        let ci = model.info();
        let header = self.rows_header(cx, (alias, at), plan, ci.n_vocab, None)?;
        let Some((stream, path)) =
            cx.references
                .row_stream(&header, &case.path, (alias, at), Vocab::of(ci))?
        else {
            return Ok(None);
        };
        let (product, _) = cx.references.rows_product(&header);
        let key = format!("{product} read by {obs}");
        let slot = cx.references.live.slot(&key);
        let counts = plan.windows.iter().map(|w| w.targets.len()).collect();
        let feed = StoredFeed::new(stream, path, counts, slot.clone(), cx.threads as usize);
        Ok(Some((
            Refs::Live(slot),
            LiveFeed {
                key,
                source: FeedSource::Read(Box::new(feed)),
            },
        )))
    }

    /// The reference's rows of `plan` written to the store as they are
    /// decoded ([`ReferenceStore::build_rows_file`]), unless held already;
    /// nothing for an imported reference.
    ///
    /// [`ReferenceStore::build_rows_file`]: crate::execute::reference::ReferenceStore::build_rows_file
    pub(super) fn build_stored(
        &self,
        cx: &RunContext,
        case: &Case,
        src: &str,
        model: &dyn LoadedModel,
        plan: &ScoringPlan,
    ) -> Result<()> {
        let (Some((ref_alias, ref_at)), None) = (&self.reference, &self.import) else {
            return Ok(());
        };
        let ci = model.info();
        let at = (ref_alias.as_str(), ref_at);
        let header = self.rows_header(cx, at, plan, ci.n_vocab, None)?;
        cx.references
            .build_rows_file(&header, (&case.path, ref_alias), &|path, seal| {
                let (build, obs) = self.reference_pass(cx, (at, &header), src, model, plan)?;
                build.write(cx, &obs, path, seal)
            })
    }

    /// The reference model's decode of the windows of `plan` (the
    /// candidate's, on `model`; the same tokens, checked) and the builder
    /// of its rows under `header`.
    fn reference_pass(
        &self,
        cx: &RunContext,
        (at, header): ((&str, &Location), &CacheHeader),
        src: &str,
        model: &dyn LoadedModel,
        plan: &ScoringPlan,
    ) -> Result<(RowsBuild, Observation)> {
        let tx = &self.text;
        let (_, rmodel) = cx.load_reference(at, Vocab::of(model.info()))?;
        tx.check_context(&*rmodel)?;
        let rplan = tx.identical_plan(cx, at.1, src, &*rmodel, model, plan)?;
        let obs = tx.observation(cx, rmodel.clone(), &rplan);
        Ok((self.rows_build(header.clone(), &rplan, &*rmodel), obs))
    }

    /// The `.qgref` header of the reference's rows of `plan`.
    pub(super) fn rows_header(
        &self,
        cx: &RunContext,
        (ref_alias, ref_at): (&str, &Location),
        plan: &ScoringPlan,
        n_vocab: usize,
        part: Option<&[usize]>,
    ) -> Result<CacheHeader> {
        let tx = &self.text;
        let ref_sha = cx.pinned_sha256(ref_alias).map_err(|e| e.context(ref_at))?;
        // A part (a sequential run's visit) is its own product, named by
        // its windows.
        let windowing = match part {
            None => format!("{:?}", tx.windowing),
            Some(ws) => format!("{:?} windows {ws:?}", tx.windowing),
        };
        Ok(rows_header(
            ref_sha,
            &plan.token_stream_sha256,
            windowing,
            &tx.settings(cx.threads, cx.options()),
            cx.identity_of(ref_alias),
            self.tail,
            self.max_kept,
            plan.targets(),
            n_vocab,
        ))
    }

    /// The builder of the rows of `header` from `reference`'s decode of `plan`.
    pub(super) fn rows_build(
        &self,
        header: CacheHeader,
        plan: &ScoringPlan,
        reference: &dyn LoadedModel,
    ) -> RowsBuild {
        let wanted = plan
            .windows
            .iter()
            .enumerate()
            .flat_map(|(w, pw)| {
                pw.targets
                    .iter()
                    .enumerate()
                    .map(move |(k, &t)| (w, pw.first_scored + k, t as usize))
            })
            .collect();
        let ri = reference.info();
        let prefix = windows_prefix(&header.reference_sha256, &header.settings, &header.build);
        RowsBuild::new(
            header,
            wanted,
            (self.tail, self.max_kept),
            ri.n_vocab,
            ri.tokenizer_fingerprint.clone(),
        )
        .keeping_windows(prefix, plan)
    }

    /// The reference rows: an imported `.kld`, or the reference model's rows
    /// through the `.qgref` store (built once, checked on every read).
    pub(super) fn reference_rows(
        &self,
        cx: &RunContext,
        case: &Case,
        src: &str,
        model: &dyn LoadedModel,
        plan: &ScoringPlan,
    ) -> Result<Arc<RefRows>> {
        let ci = model.info();
        let tx = &self.text;
        if let Some(pin) = &self.import {
            let bytes = pin.read_bytes()?;
            let rows = crate::execute::qgref::import_llama_kld(
                &bytes,
                plan,
                tx.windowing.context(),
                ci.n_vocab,
            )
            .map_err(|e| Error::input(format!("{}: {e}", pin.path.display())))?;
            return Ok(Arc::new(RefRows {
                rows,
                n_vocab: ci.n_vocab,
                tokenizer_fingerprint: ci.tokenizer_fingerprint.clone(),
            }));
        }
        let Some((ref_alias, ref_at)) = &self.reference else {
            return Err(Error::input(format!(
                "{}: a kld case needs a reference",
                case.path.display()
            )));
        };
        let at = (ref_alias.as_str(), ref_at);
        let header = self.rows_header(cx, at, plan, ci.n_vocab, None)?;
        cx.references
            .rows(&header, &case.path, at, Vocab::of(ci), &|| {
                let (build, obs) = self.reference_pass(cx, (at, &header), src, model, plan)?;
                build.decode(&obs)
            })
    }
}
