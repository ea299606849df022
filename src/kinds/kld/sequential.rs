//! Sequential decisions of a kld case's gates (`[decide] sequential =
//! true`): the windows visited in the design's seeded order, two at a time
//! ([`crate::kinds::scored_text::STEP`]); each visit compares the candidate's rows with the
//! reference's rows of those windows only, and gives the window's mean KL,
//! its same-top fraction and (against a reference model) its ΔNLL to the
//! confidence sequences of [`run_sequence`].
//!
//! Contract: the reference rows of a visit come from a whole reference at
//! hand (an imported `.kld`, a stored whole `.qgref`) or are decoded for
//! those windows only and kept in the store as their own sealed `.qgref`
//! (keyed by the windows), so the next candidate, or a later run, reads
//! them; a run holds one visit's rows at a time. At N the metrics are the
//! fixed-N case's (the same rows, the same positions, in window order).

use super::*;
use crate::core::case::Decide;
use crate::execute::observe::observe_one;
use crate::kinds::scored_text::{
    equal_windows, in_window_order, run_sequence, window_of, WindowValues,
};

/// Where a sequential run's reference rows come from.
enum Rows<'a> {
    /// All of them at hand.
    Whole(Arc<RefRows>),
    /// The reference model, decoded for the windows a visit needs.
    Model {
        alias: &'a str,
        at: &'a Location,
        model: Arc<dyn LoadedModel>,
        plan: ScoringPlan,
    },
}

/// What one visited window gave.
struct Visited {
    window: usize,
    scored: Arc<crate::execute::windows::Scored>,
    rscored: Option<Arc<crate::execute::windows::Scored>>,
    pos: Vec<PosKld>,
}

impl Kld {
    /// The reference rows of windows `ws` of `plan`, in that order.
    fn part_rows(
        &self,
        cx: &RunContext,
        rows: &Rows,
        plan: &ScoringPlan,
        ws: &[usize],
    ) -> Result<Arc<RefRows>> {
        match rows {
            Rows::Whole(r) => {
                let mut from = vec![0];
                for w in &plan.windows {
                    from.push(from.last().copied().unwrap_or(0) + w.targets.len());
                }
                Ok(Arc::new(RefRows {
                    rows: ws
                        .iter()
                        .flat_map(|&w| r.rows[from[w]..from[w + 1]].iter().cloned())
                        .collect(),
                    n_vocab: r.n_vocab,
                    tokenizer_fingerprint: r.tokenizer_fingerprint.clone(),
                }))
            }
            Rows::Model {
                alias,
                at,
                model,
                plan: rplan,
            } => {
                let part = rplan.part(ws);
                let header =
                    self.rows_header(cx, (alias, at), &part, model.info().n_vocab, Some(ws))?;
                let build = || {
                    let obs = self.text.observation(cx, model.clone(), &part);
                    self.rows_build(header.clone(), &part, &**model)
                        .decode(&obs)
                };
                // Live (`store = "none"`): decoded for this visit, and not
                // kept.
                if self.live {
                    let (n_vocab, tokenizer_fingerprint, rows) = build()?;
                    return Ok(Arc::new(RefRows {
                        rows,
                        n_vocab,
                        tokenizer_fingerprint,
                    }));
                }
                cx.references.part_rows(&header, alias, &build)
            }
        }
    }

    /// Decide `case`'s gates on `model` window by window in the design's
    /// order; the kld block, the perplexity metrics and (against a model)
    /// the paired metrics of the windows used, and their rows, in `out`.
    pub(super) fn decide_sequentially(
        &self,
        cx: &RunContext,
        case: &Case,
        decide: &Decide,
        src: &str,
        (model, plan): (&Arc<dyn LoadedModel>, &Arc<ScoringPlan>),
        out: &mut Outcome,
    ) -> Result<()> {
        let tx = &self.text;
        equal_windows(decide, plan)?;
        let t = Instant::now();
        let rows = self.sequential_rows(cx, case, src, model, plan)?;
        out.timings.decode += t.elapsed();
        let n_vocab = model.info().n_vocab;
        let keep = tx
            .windows_prefix(cx, &out.model, out)
            .filter(|_| !self.live);
        let kept = self.kept_key(cx, &out.model, plan, n_vocab, out)?;
        let mut visited: Vec<Visited> = Vec::new();
        let t_decode = Instant::now();
        let order = run_sequence(
            case,
            decide,
            plan.windows.len(),
            "window",
            &mut |ws| {
                let part = Arc::new(plan.part(ws));
                // The visit's windows compared already (by any case on the
                // same windows of the same files): neither side is decoded.
                let (scored, pos, ref_lp) = match kept.as_ref().and_then(|k| k.read(cx, &part)) {
                    Some(c) => c,
                    None => {
                        let c = self.visit(cx, case, (model, &rows), plan, ws, &part)?;
                        if let Some(prefix) = &keep {
                            keep_windows(cx, prefix, &part, &c.0);
                        }
                        if let Some(k) = &kept {
                            k.keep(cx, &part, (&c.0, &c.1, &c.2));
                        }
                        c
                    }
                };
                let rscored = reference_scored(&part, &pos, &ref_lp);
                let mut values = Vec::new();
                let mut at = 0;
                for (k, &w) in ws.iter().enumerate() {
                    let count = part.windows[k].targets.len();
                    let p = pos[at..at + count].to_vec();
                    at += count;
                    let c = window_of(&scored, &part, k);
                    let r = rscored.as_ref().map(|r| window_of(r, &part, k));
                    let mean = |s: &crate::execute::windows::Scored| {
                        s.windows[0].nll_sum / s.windows[0].count as f64
                    };
                    let mut v = WindowValues::from([
                        (
                            "kld_mean",
                            p.iter().map(|x| x.kl).sum::<f64>() / count as f64,
                        ),
                        (
                            "same_top",
                            p.iter().filter(|x| !x.flip()).count() as f64 / count as f64,
                        ),
                    ]);
                    if let Some(r) = &r {
                        v.insert("delta_nll_mean", mean(&c) - mean(r));
                    }
                    values.push(v);
                    visited.push(Visited {
                        window: w,
                        scored: Arc::new(c),
                        rscored: r.map(Arc::new),
                        pos: p,
                    });
                }
                Ok(values)
            },
            out,
        )?;
        out.timings.decode += t_decode.elapsed();
        let t = Instant::now();
        visited.truncate(order.len());
        visited.sort_by_key(|v| v.window);
        let ids: Vec<usize> = visited.iter().map(|v| v.window).collect();
        let cand: Vec<_> = visited.iter().map(|v| v.scored.clone()).collect();
        let scored = in_window_order(&ids, &cand);
        out.metrics.extend(perplexity_metrics(&scored.windows));
        let refs: Option<Vec<_>> = visited.iter().map(|v| v.rscored.clone()).collect();
        if let Some(refs) = refs {
            tx.add_paired(out, &scored, &in_window_order(&ids, &refs));
        }
        let pos: Vec<PosKld> = visited.iter().flat_map(|v| v.pos.clone()).collect();
        out.metrics.extend(kld_metrics(&pos, &self.bins));
        out.rows = Some(Arc::new(rows_table(
            &plan.part(&ids),
            &ids,
            &pos,
            &scored.token_nll,
        )));
        out.timings.measure += t.elapsed();
        Ok(())
    }

    /// One visit of windows `ws` (`part` of `plan`): the reference's rows
    /// of them, the candidate's decode compared with them.
    fn visit(
        &self,
        cx: &RunContext,
        case: &Case,
        (model, rows): (&Arc<dyn LoadedModel>, &Rows),
        plan: &ScoringPlan,
        ws: &[usize],
        part: &Arc<ScoringPlan>,
    ) -> Result<kept::Compared> {
        let refs = self.part_rows(cx, rows, plan, ws)?;
        if refs.rows.len() != part.targets() {
            return Err(Error::harness(format!(
                "{}: the reference holds {} positions of windows {ws:?}, which score {}",
                case.path.display(),
                refs.rows.len(),
                part.targets()
            )));
        }
        let n_vocab = model.info().n_vocab;
        let mut trial = self.trial(case, part.clone(), n_vocab, Refs::Rows(refs));
        observe_one(&self.text.observation(cx, model.clone(), part), &mut trial)?;
        let KldTrial {
            scorer,
            pos,
            ref_lp,
            ..
        } = trial;
        let scored = scorer
            .finish()
            .map_err(|e| e.context(case.path.display()))?;
        if pos.len() != part.targets() {
            return Err(Error::harness(format!(
                "{}: compared {} positions of {}",
                case.path.display(),
                pos.len(),
                part.targets()
            )));
        }
        Ok((scored, pos, ref_lp))
    }

    /// The reference rows of a sequential run: a whole reference when one
    /// is at hand (an imported file, a whole `.qgref` in the store), else
    /// the reference model, decoded visit by visit.
    fn sequential_rows<'a>(
        &'a self,
        cx: &RunContext,
        case: &Case,
        src: &str,
        model: &Arc<dyn LoadedModel>,
        plan: &ScoringPlan,
    ) -> Result<Rows<'a>> {
        let ci = model.info();
        let whole = match &self.reference {
            None => true,
            // Live: no stored reference is read.
            Some(_) if self.live => false,
            Some((alias, at)) => {
                let header = self.rows_header(cx, (alias, at), plan, ci.n_vocab, None)?;
                let (key, path) = cx.references.rows_product(&header);
                cx.references.holds(&key, &path)
            }
        };
        if whole {
            return Ok(Rows::Whole(
                self.reference_rows(cx, case, src, &**model, plan)?,
            ));
        }
        let (alias, at) = self.reference.as_ref().expect("checked above");
        let (_, rmodel) = cx.load_reference((alias, at), Vocab::of(ci))?;
        self.text.check_context(&*rmodel)?;
        let rplan = self
            .text
            .identical_plan(cx, at, src, &*rmodel, &**model, plan)?;
        Ok(Rows::Model {
            alias,
            at,
            model: rmodel,
            plan: rplan,
        })
    }
}
