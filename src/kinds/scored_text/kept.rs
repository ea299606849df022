//! One window's scores kept in the reference store (`.qgwin`), named by
//! what determines them: the model file, the engine settings that change
//! logits, the llama.cpp build, and the window itself (its tokens, where
//! its rows start, its scored positions and their targets). Not by the
//! case, the seed or how many windows the plan has: a kld case's 16
//! windows and a sequential ΔNLL case's 80 of the same text share the
//! first 16, so a window decoded by either is read by the other.
//!
//! Contract: a window is kept only from a decode of exactly that window
//! (each window starts from empty memory, and llama.cpp's logits do not
//! depend on the thread count or on the windows decoded beside it), so
//! whichever decode kept it, its values are bitwise those of any other.
//! A kept window is read back only through its seal and only when it has
//! one value per scored position of the window asked for.

use super::*;
use crate::execute::windows::PlannedWindow;

/// One window's scores as the store keeps them (sealed JSON,
/// `<cache>/reference/<sha256(id)>.qgwin`): the per-position values, from
/// which the window's sums are added up again in order (bitwise the
/// decode's).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptWindow {
    token_nll: Vec<f64>,
    token_top1: Vec<bool>,
    token_argmax: Vec<crate::engine::TokenId>,
}

impl KeptWindow {
    pub(crate) fn of(s: &Scored) -> Self {
        KeptWindow {
            token_nll: s.token_nll.clone(),
            token_top1: s.token_top1.clone(),
            token_argmax: s.token_argmax.clone(),
        }
    }

    /// Whether every value can be kept (a non-finite NLL never is).
    pub(crate) fn finite(&self) -> bool {
        self.token_nll.iter().all(|x| x.is_finite())
    }

    /// The window's scores, if they fit its plan (`targets` positions).
    pub(crate) fn scored(&self, targets: usize) -> Option<Scored> {
        let n = self.token_nll.len();
        if n != targets || self.token_top1.len() != n || self.token_argmax.len() != n {
            return None;
        }
        let mut w = crate::measure::WindowNll::default();
        for (nll, top1) in self.token_nll.iter().zip(&self.token_top1) {
            w.add(*nll, *top1);
        }
        Some(Scored {
            windows: vec![w],
            token_nll: self.token_nll.clone(),
            token_top1: self.token_top1.clone(),
            token_argmax: self.token_argmax.clone(),
            ..Scored::default()
        })
    }
}

/// What names every window of one model under one set of settings: the
/// model file's sha256, the settings that change logits (threads do not)
/// and the build.
pub(crate) fn windows_prefix(sha256: &str, settings: &str, build: &str) -> String {
    format!("{sha256}|{settings}|{build}")
}

/// The store id of window `pw` of the model and settings `prefix` names.
pub(crate) fn window_id(prefix: &str, pw: &PlannedWindow) -> String {
    let mut bytes = Vec::with_capacity(4 * (pw.window.tokens.len() + pw.targets.len()) + 16);
    for t in &pw.window.tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    bytes.extend_from_slice(&(pw.window.logits_from as u64).to_le_bytes());
    bytes.extend_from_slice(&(pw.first_scored as u64).to_le_bytes());
    for t in &pw.targets {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    format!(
        "{prefix}|window of {} tokens {}",
        pw.window.tokens.len(),
        crate::core::fsutil::sha256_bytes(&bytes)
    )
}

/// All of `plan`'s scores for the model and settings `prefix` names, when
/// the store keeps every one of its windows (whatever decode kept them: a
/// kld case's, a sequential case's, in any process or run): window after
/// window, bitwise a decode of the whole plan (each kept window is a
/// decode of exactly that window, read back through its seal). None when
/// any window is missing, or the store keeps no windows.
fn kept_whole(cx: &RunContext, prefix: &str, plan: &ScoringPlan) -> Option<Scored> {
    if !cx.references.keeps_windows || plan.windows.is_empty() {
        return None;
    }
    let mut whole = Scored::default();
    for pw in &plan.windows {
        let kept = cx
            .references
            .kept_only::<KeptWindow>(&window_id(prefix, pw), "qgwin")?
            .scored(pw.targets.len())?;
        whole.append(&kept);
    }
    Some(whole)
}

/// [`kept_whole`] for the model file `sha256` under `settings` and engine
/// `build` (its [`crate::engine::Engine::model_identity`]): the scores a
/// fixed-N perplexity case and its reference read from kept windows
/// (tests/real_engine/llama_perplexity.rs compares them with llama-perplexity's).
pub fn kept_scores(
    cx: &RunContext,
    sha256: &str,
    settings: &Settings,
    build: &str,
    plan: &ScoringPlan,
) -> Option<Scored> {
    kept_whole(
        cx,
        &windows_prefix(sha256, &settings.describe(), build),
        plan,
    )
}

/// Keep each window of `scored` (scores of all of `plan`, decoded here)
/// that the store does not hold yet, so that a sequential case visiting
/// the same windows reads them instead of decoding them. Best effort: a
/// window that cannot be kept is said once and decoded again by whoever
/// needs it.
pub(crate) fn keep_windows(cx: &RunContext, prefix: &str, plan: &ScoringPlan, scored: &Scored) {
    if !cx.references.keeps_windows
        || scored.windows.len() != plan.windows.len()
        || scored.token_nll.len() != plan.targets()
    {
        return;
    }
    for (w, pw) in plan.windows.iter().enumerate() {
        let id = window_id(prefix, pw);
        if cx
            .references
            .kept_only::<KeptWindow>(&id, "qgwin")
            .is_some()
        {
            continue;
        }
        // A window that cannot be kept is not handed to the store at all
        // (its memo would serve it to a sequential case).
        let window = KeptWindow::of(&super::window_of(scored, plan, w));
        if !window.finite() {
            continue;
        }
        if let Err(e) =
            cx.references
                .kept(&id, "qgwin", &KeptWindow::finite, &|| Ok(window.clone()))
        {
            crate::core::progress::say!(
                "quantgate: a decoded window could not be kept ({}); a later run decodes it again",
                e.message
            );
            return;
        }
    }
}
