//! One window's comparison with its reference kept in the reference store
//! (`.qgkld`), as a window's scores are (`.qgwin`): named by the
//! candidate's window ([`window_id`]: the model file, the settings that
//! change logits, the build, the window's tokens and targets), the
//! reference's same window (its file, settings and build), how its rows
//! are kept (`tail`, `max_kept`) and the code that compares them
//! ([`comparison_source`]: a change to it compares again instead of
//! reading old numbers). Not by the case, its gates or how many windows
//! its plan has: a release's kld case and the suites' own over the
//! same 16 windows of the same files share every window.
//!
//! Contract: a window is kept only from the comparison of exactly that
//! window's decode with exactly that window's stored reference rows (each
//! window starts from empty memory, and a stored row is the same whichever
//! product holds it), so its values are bitwise those of any other
//! comparison of it. Only a reference model's rows kept compactly are
//! named so (not an imported file, not rows read live with `store =
//! "none"`). A kept window is read back only through its seal and only
//! when it holds one value per scored position of the window asked for.

use super::*;
use crate::execute::windows::{PlannedWindow, Scored};
use crate::kinds::scored_text::{window_id, KeptWindow};

/// One window's comparison as the store keeps it (sealed JSON,
/// `<cache>/reference/<sha256(id)>.qgkld`).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct KeptKld {
    /// The candidate's scores of the window.
    scores: KeptWindow,
    /// Each scored position compared with its reference row.
    pos: Vec<PosKld>,
    /// Each position's reference log-prob of the true token.
    ref_lp: Vec<f64>,
}

impl KeptKld {
    /// Whether every value can be kept (JSON holds no NaN or infinity).
    fn finite(&self) -> bool {
        self.scores.finite()
            && self.ref_lp.iter().all(|x| x.is_finite())
            && self.pos.iter().all(|p| {
                [p.kl, p.kl_rev, p.p_ref, p.p_cand, p.p1]
                    .iter()
                    .all(|x| x.is_finite())
            })
    }
}

/// What names a case's kept comparisons: the candidate's windows
/// (`cand`), the reference's (`reference`) and how its rows are kept.
pub(super) struct KldKey {
    cand: String,
    reference: String,
    rows: String,
}

/// A window's comparisons, in plan order: the candidate's scores, the
/// compared positions and the reference's log-probs of the truth.
pub(super) type Compared = (Scored, Vec<PosKld>, Vec<f64>);

/// The sha256 of the code that turns a candidate's decode of a window and
/// the reference's stored rows into a kept comparison (the comparison, the
/// rows' compaction, the row reduction, the scoring plan, the llama.cpp
/// engine): part of every kept comparison's id.
fn comparison_source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| {
        crate::engine::code_sha256(&[
            include_str!("mod.rs"),
            include_str!("kept.rs"),
            include_str!("../../measure/mod.rs"),
            include_str!("../../measure/kld/mod.rs"),
            include_str!("../../measure/kld/compress.rs"),
            include_str!("../../execute/observe.rs"),
            include_str!("../../execute/windows.rs"),
        ])
    })
}

impl KldKey {
    fn id(&self, pw: &PlannedWindow) -> String {
        format!(
            "{}|compared with {}|{}|code {}",
            window_id(&self.cand, pw),
            window_id(&self.reference, pw),
            self.rows,
            comparison_source()
        )
    }

    /// Every window of `plan`, when the store keeps them all (whatever
    /// case or run compared them); None when any one is missing, fails
    /// its seal or does not fit its window.
    pub(super) fn read(&self, cx: &RunContext, plan: &ScoringPlan) -> Option<Compared> {
        if !cx.references.keeps_windows || plan.windows.is_empty() {
            return None;
        }
        let (mut scored, mut pos, mut ref_lp) = (Scored::default(), Vec::new(), Vec::new());
        for pw in &plan.windows {
            let kept = cx.references.kept_only::<KeptKld>(&self.id(pw), "qgkld")?;
            let n = pw.targets.len();
            if kept.pos.len() != n || kept.ref_lp.len() != n {
                return None;
            }
            scored.append(&kept.scores.scored(n)?);
            pos.extend_from_slice(&kept.pos);
            ref_lp.extend_from_slice(&kept.ref_lp);
        }
        Some((scored, pos, ref_lp))
    }

    /// Keep each window of `plan` the store does not hold yet, from its
    /// comparison here. Best effort: a window that cannot be kept is said
    /// once and compared again by whoever needs it.
    pub(super) fn keep(
        &self,
        cx: &RunContext,
        plan: &ScoringPlan,
        (scored, pos, ref_lp): (&Scored, &[PosKld], &[f64]),
    ) {
        let total = plan.targets();
        if !cx.references.keeps_windows
            || scored.windows.len() != plan.windows.len()
            || scored.token_nll.len() != total
            || pos.len() != total
            || ref_lp.len() != total
        {
            return;
        }
        let mut from = 0;
        for (w, pw) in plan.windows.iter().enumerate() {
            let (at, to) = (from, from + pw.targets.len());
            from = to;
            let id = self.id(pw);
            if cx.references.kept_only::<KeptKld>(&id, "qgkld").is_some() {
                continue;
            }
            let kept = KeptKld {
                scores: KeptWindow::of(&crate::kinds::scored_text::window_of(scored, plan, w)),
                pos: pos[at..to].to_vec(),
                ref_lp: ref_lp[at..to].to_vec(),
            };
            if !kept.finite() {
                continue;
            }
            if let Err(e) = cx
                .references
                .kept(&id, "qgkld", &KeptKld::finite, &|| Ok(kept.clone()))
            {
                crate::core::progress::say!(
                    "quantgate: a compared window could not be kept ({}); a later run compares it again",
                    e.message
                );
                return;
            }
        }
    }
}

impl Kld {
    /// What names the kept comparisons of `alias`'s windows (its sha256
    /// recorded in `out` by [`ScoredText::prepare`]) with the reference
    /// model's: None with an imported reference, rows read live, or a
    /// store that keeps no windows.
    pub(super) fn kept_key(
        &self,
        cx: &RunContext,
        alias: &str,
        plan: &ScoringPlan,
        n_vocab: usize,
        out: &Outcome,
    ) -> Result<Option<KldKey>> {
        let (Some((ref_alias, ref_at)), None, false) = (&self.reference, &self.import, self.live)
        else {
            return Ok(None);
        };
        let Some(cand) = self.text.windows_prefix(cx, alias, out) else {
            return Ok(None);
        };
        let header = self.rows_header(cx, (ref_alias, ref_at), plan, n_vocab, None)?;
        Ok(Some(KldKey {
            cand,
            reference: crate::kinds::scored_text::windows_prefix(
                &header.reference_sha256,
                &header.settings,
                &header.build,
            ),
            rows: format!(
                "rows of {} entries, tail {:?}, at most {} kept",
                header.n_vocab, self.tail, self.max_kept
            ),
        }))
    }
}
