//! Sequential decisions of a multiple-choice case's gates (`[decide]
//! sequential = true`): tasks visited in the design's seeded order, two at
//! a time; each visit scores the tool's batches that hold them (on the
//! candidate, and on the reference when it gates agreement), and gives
//! each task's correctness (`accuracy`) and, against a reference, whether
//! the two models chose the same answer (`agreement`) to the confidence
//! sequences of [`run_sequence`].
//!
//! Contract: a task's scores are those of the fixed-N run (the tool's
//! batches, each decoded alone with its cache cleared), so at N the
//! metrics are the fixed-N case's. A batch's other tasks are decoded with
//! it but count only when visited. A whole kept score file (any earlier
//! fixed-N run, either role) serves every visit; the reference's batches
//! decoded here are kept one by one, so the next candidate reads them.

use super::*;
use crate::core::case::Decide;
use crate::execute::reference::same_tokenizer;
use crate::kinds::scored_text::{run_sequence, WindowValues};
use std::collections::BTreeSet;

/// A model's scores of the tool's batches `only` (all when None), and
/// every batch's task range.
pub(super) type Part<'a> = dyn Fn(&dyn LoadedModel, &Settings, Option<&[usize]>) -> Result<(Scores, Vec<(usize, usize)>)>
    + 'a;

/// What a sequential run scores with.
pub(super) struct Sides<'a> {
    /// The candidate.
    pub model: &'a Arc<dyn LoadedModel>,
    /// Its file's sha256.
    pub model_sha256: &'a str,
    /// The engine settings.
    pub settings: &'a Settings,
    /// How batches are scored.
    pub part: &'a Part<'a>,
}

/// One model's scores, filled batch by batch as visits need them.
struct Lazy {
    /// A whole kept score file, when there is one.
    whole: Option<Arc<KeptScores>>,
    scores: Scores,
    decoded: BTreeSet<usize>,
}

impl Lazy {
    fn new(whole: Option<Arc<KeptScores>>, n: usize) -> Self {
        Lazy {
            whole,
            scores: vec![Vec::new(); n],
            decoded: BTreeSet::new(),
        }
    }

    fn of(&self, task: usize) -> &[f64] {
        match &self.whole {
            Some(w) => &w.scores[task],
            None => &self.scores[task],
        }
    }

    /// The batches of `tasks` not at hand yet.
    fn missing(&self, tasks: &[usize], batch_of: &[usize]) -> Vec<usize> {
        if self.whole.is_some() {
            return Vec::new();
        }
        let b: BTreeSet<usize> = tasks
            .iter()
            .map(|&t| batch_of[t])
            .filter(|b| !self.decoded.contains(b))
            .collect();
        b.into_iter().collect()
    }

    /// Take the scores of batches `bs` (task ranges `batches`) from `s`.
    fn put(&mut self, bs: &[usize], batches: &[(usize, usize)], s: &Scores) {
        for &b in bs {
            let (a, e) = batches[b];
            self.scores[a..e].clone_from_slice(&s[a..e]);
            self.decoded.insert(b);
        }
    }
}

impl MultipleChoice {
    fn id<'a>(
        &'a self,
        model_sha256: &'a str,
        build: &'a str,
        settings: &'a Settings,
    ) -> ScoresId<'a> {
        ScoresId {
            model_sha256,
            build,
            file_sha256: &self.file.sha256,
            format: self.format,
            tasks: self.tasks,
            settings,
        }
    }

    /// Decide `case`'s gates on `tasks` task by task in the design's order;
    /// the metrics and rows of the tasks used in `out`.
    pub(super) fn decide_sequentially(
        &self,
        cx: &RunContext,
        case: &Case,
        decide: &Decide,
        tasks: &[(usize, Task)],
        sides: Sides,
        out: &mut Outcome,
    ) -> Result<()> {
        let Sides {
            model,
            model_sha256,
            settings,
            part,
        } = sides;
        let t = Instant::now();
        let n = tasks.len();
        let finite = |k: &KeptScores| k.scores.iter().flatten().all(|x| x.is_finite());
        let build = cx.identity_of(&model.info().file.alias);
        let cid = self.id(model_sha256, &build, settings).key();
        let whole = cx
            .references
            .kept_only::<KeptScores>(&cid, "qgmc")
            .filter(|k| k.scores.len() == n && finite(k));
        // The tool's batches (tokenized, nothing decoded).
        let (_, batches) = part(&**model, settings, Some(&[]))?;
        let mut batch_of = vec![0; n];
        for (b, &(a, e)) in batches.iter().enumerate() {
            batch_of[a..e].fill(b);
        }
        let mut cand = Lazy::new(whole, n);
        // The reference: its whole kept scores, else batch by batch, each
        // batch kept under the whole's id.
        let mut reference = match &self.reference {
            Some((r, at)) => {
                let pinned = cx.pinned_sha256(r).map_err(|e| e.context(at))?;
                let rbuild = cx.identity_of(r);
                let rid = self.id(&pinned, &rbuild, settings).key();
                let whole = cx
                    .references
                    .kept_only::<KeptScores>(&rid, "qgmc")
                    .filter(|k| k.scores.len() == n && finite(k));
                if let Some(k) = &whole {
                    self.same_vocab(r, at, k, model)?;
                }
                Some((r.as_str(), at, rid, Lazy::new(whole, n), None))
            }
            None => None,
        };
        out.timings.decode += t.elapsed();
        let t_decode = Instant::now();
        let labels = |k: usize, s: &[f64]| tasks[k].1.labels[pick(self.format, s)] == 1;
        let order = run_sequence(
            case,
            decide,
            n,
            "task",
            &mut |visit| {
                let need = cand.missing(visit, &batch_of);
                if !need.is_empty() {
                    let (s, _) = part(&**model, settings, Some(&need))?;
                    cand.put(&need, &batches, &s);
                }
                if let Some((r, at, rid, lazy, rmodel)) = &mut reference {
                    let mut need = lazy.missing(visit, &batch_of);
                    // Batches an earlier run (or candidate) kept.
                    let kept_id = |b: usize| format!("{rid}#batch{b}");
                    for &b in &need.clone() {
                        if let Some(k) = cx.references.kept_only::<KeptScores>(&kept_id(b), "qgmcb")
                        {
                            let (a, e) = batches[b];
                            if k.scores.len() == e - a && finite(&k) {
                                self.same_vocab(r, at, &k, model)?;
                                lazy.scores[a..e].clone_from_slice(&k.scores);
                                lazy.decoded.insert(b);
                                need.retain(|x| *x != b);
                            }
                        }
                    }
                    if !need.is_empty() {
                        if rmodel.is_none() {
                            let (_, m) = cx.load_reference((r, at), Vocab::of(model.info()))?;
                            *rmodel = Some(m);
                        }
                        let m: &Arc<dyn LoadedModel> = rmodel.as_ref().expect("loaded above");
                        let (s, rbatches) = part(&**m, settings, Some(&need))?;
                        if rbatches != batches {
                            return Err(Error::input(format!(
                                "{}: reference `{r}` batches the tasks unlike `{}`: their \
                                 tokenizers differ",
                                case.path.display(),
                                model.info().file.alias
                            )));
                        }
                        for &b in &need {
                            let (a, e) = batches[b];
                            let k = KeptScores::of(&**m, s[a..e].to_vec());
                            cx.references
                                .kept(&kept_id(b), "qgmcb", &finite, &|| Ok(k.clone()))?;
                        }
                        lazy.put(&need, &batches, &s);
                    }
                }
                Ok(visit
                    .iter()
                    .map(|&k| {
                        let c = cand.of(k);
                        let mut v =
                            WindowValues::from([("accuracy", f64::from(u8::from(labels(k, c))))]);
                        if let Some((_, _, _, lazy, _)) = &reference {
                            let same = pick(self.format, c) == pick(self.format, lazy.of(k));
                            v.insert("agreement", f64::from(u8::from(same)));
                        }
                        v
                    })
                    .collect())
            },
            out,
        )?;
        out.timings.decode += t_decode.elapsed();
        // The tasks used, in the file's order: at N, the fixed-N case.
        let mut used = order;
        used.sort_unstable();
        let sub: Vec<(usize, Task)> = used.iter().map(|&k| tasks[k].clone()).collect();
        let scores: Scores = used.iter().map(|&k| cand.of(k).to_vec()).collect();
        let refs: Option<Scores> = reference
            .as_ref()
            .map(|(_, _, _, lazy, _)| used.iter().map(|&k| lazy.of(k).to_vec()).collect());
        self.conclude(&sub, &scores, refs.as_ref(), out);
        Ok(())
    }

    /// Scores kept by reference `r` (named at `at`) came from the
    /// candidate's tokenizer.
    pub(super) fn same_vocab(
        &self,
        r: &str,
        at: &crate::core::Location,
        k: &KeptScores,
        model: &Arc<dyn LoadedModel>,
    ) -> Result<()> {
        let scored_by = Vocab {
            alias: r,
            n_vocab: k.n_vocab,
            fingerprint: &k.fingerprint,
        };
        same_tokenizer(at, "reference", scored_by, Vocab::of(model.info()))
    }
}
