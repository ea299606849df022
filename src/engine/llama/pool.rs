//! Contexts kept across decode calls: a loaded model keeps the contexts its
//! calls are done with, keyed by every parameter they were made with, and
//! the next call with the same parameters takes one back with its KV cache
//! cleared, as llama-perplexity clears its one context between chunks.
//! Setting a context up (KV cache, compute buffers, the logits buffer
//! touched page by page) is then paid once per model and settings, not once
//! per call: a reference streamed a pair of windows at a time costs what it
//! costs read whole.
//!
//! Contract: a context taken back computes what a fresh one computes (its
//! whole memory cleared, data too); a context is kept idle only while all
//! contexts of all loaded models, in use and idle, fit both the engine's
//! budget ([`crate::core::config::Config::context_pool`]: 1 GiB unless
//! `QUANTGATE_CONTEXT_POOL_MIB` says otherwise) and the most that were ever
//! in use at once (each context estimated at its logits, KV cache and
//! compute buffers), and a model that must set one up frees other models'
//! idle contexts first: keeping contexts never raises the peak of memory
//! above what the decodes themselves needed. Calls of one model in a row
//! (a candidate reading a stored reference a pair of windows at a time,
//! sequential visits, prompts) reuse its contexts; models that take turns
//! (a live reference and its candidates) free each other's. A context
//! whose call failed or panicked is freed; idle contexts are freed before
//! their model.

use super::*;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;

/// The contexts of one engine's loaded models: what is in use, what is
/// idle, the most ever in use at once, and every model's idle contexts (so
/// that a model that must set one up can free other models' first).
#[derive(Debug)]
pub(crate) struct Contexts {
    /// The most bytes of contexts, in use and idle, held at once
    /// ([`crate::core::config::Config::context_pool`]).
    budget: u64,
    live: AtomicU64,
    idle: AtomicU64,
    peak_live: AtomicU64,
    every: Mutex<Vec<Weak<Kept>>>,
}

impl Contexts {
    /// No context yet; at most `budget` bytes held.
    pub(crate) fn new(budget: u64) -> Arc<Self> {
        Arc::new(Contexts {
            budget,
            live: AtomicU64::new(0),
            idle: AtomicU64::new(0),
            peak_live: AtomicU64::new(0),
            every: Mutex::new(Vec::new()),
        })
    }

    /// Bytes of contexts in use and idle.
    fn held(&self) -> u64 {
        self.live.load(Ordering::Relaxed) + self.idle.load(Ordering::Relaxed)
    }

    /// How many bytes of contexts, in use and idle, may be held: the
    /// budget, and never more than were ever in use at once (so that idle
    /// contexts never raise the peak). SmolLM2's context at n_ctx 512 is
    /// about 145 MiB by the estimate, Gemma 3's (262k vocabulary) about
    /// 0.55 GiB: a model's two lanes fit 1 GiB either way.
    fn room(&self) -> u64 {
        self.budget.min(self.peak_live.load(Ordering::Relaxed))
    }

    /// Free `kept`'s contexts (all of them, or until `enough` says so).
    fn free(&self, kept: &Kept, enough: &dyn Fn() -> bool) {
        let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
        while !enough() {
            let Some((_, bytes, ctx)) = kept.pop() else {
                break;
            };
            drop(ctx);
            self.idle.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Free idle contexts of any model until `bytes` more fit
    /// ([`Contexts::room`]), or none is idle.
    fn make_room(&self, bytes: u64) {
        let enough = || self.held() + bytes <= self.room().max(bytes);
        if enough() {
            return;
        }
        let every: Vec<Arc<Kept>> = self
            .every
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for kept in every {
            self.free(&kept, &enough);
            if enough() {
                return;
            }
        }
    }
}

/// What a context is made with: two contexts with the same key compute the
/// same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ContextKey {
    n_ctx: u32,
    n_batch: u32,
    n_ubatch: u32,
    n_seq: u32,
    threads: u32,
    flash_attn: bool,
    kv_type: String,
}

impl ContextKey {
    pub(super) fn of(settings: &Settings) -> Self {
        ContextKey {
            n_ctx: settings.n_ctx,
            n_batch: settings.n_batch,
            n_ubatch: settings.physical_batch(),
            n_seq: settings.n_seq.max(1),
            threads: settings.threads,
            flash_attn: settings.flash_attn,
            kv_type: settings.kv_type.clone(),
        }
    }
}

/// Idle contexts, each with its key and its estimated bytes. `'static`
/// stands for the model's lifetime: [`Loaded`] frees them in its `Drop`,
/// before its model, and hands them out only as borrowing it.
type Kept = Mutex<Vec<(ContextKey, u64, LlamaContext<'static>)>>;

/// The idle contexts of one loaded model.
pub(super) struct Idle {
    /// The engine's contexts.
    all: Arc<Contexts>,
    kept: Arc<Kept>,
    /// Contexts set up for the model so far.
    made: AtomicU64,
}

impl Idle {
    /// No idle context yet, one of the engine's `all`.
    pub(super) fn new(all: &Arc<Contexts>) -> Self {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let mut every = all.every.lock().unwrap_or_else(|p| p.into_inner());
        every.retain(|w| w.strong_count() > 0);
        every.push(Arc::downgrade(&kept));
        Idle {
            all: all.clone(),
            kept,
            made: AtomicU64::new(0),
        }
    }

    /// Free every idle context (the model is going).
    pub(super) fn clear(&self) {
        self.all.free(&self.kept, &|| false);
    }

    /// How many contexts were set up for the model.
    pub(super) fn made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }
}

/// A context of `Loaded`, given back to its model's idle contexts when
/// dropped (unless [`Pooled::discard`]ed, over budget, or dropped by a
/// panic).
pub(super) struct Pooled<'m> {
    ctx: Option<LlamaContext<'m>>,
    key: ContextKey,
    bytes: u64,
    home: &'m Idle,
}

impl<'m> Pooled<'m> {
    /// Free this context rather than keep it (its call failed).
    pub(super) fn discard(mut self) {
        self.ctx = None;
    }
}

impl<'m> Deref for Pooled<'m> {
    type Target = LlamaContext<'m>;
    fn deref(&self) -> &LlamaContext<'m> {
        self.ctx
            .as_ref()
            .expect("a pooled context is present until dropped")
    }
}

impl DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.ctx
            .as_mut()
            .expect("a pooled context is present until dropped")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        let all = &self.home.all;
        all.live.fetch_sub(self.bytes, Ordering::Relaxed);
        let Some(ctx) = self.ctx.take() else { return };
        if std::thread::panicking() || all.held() + self.bytes > all.room() {
            return;
        }
        all.idle.fetch_add(self.bytes, Ordering::Relaxed);
        // SAFETY: the context borrows the model of `Loaded` (which owns
        // `home`); it is kept only in `home`, freed before the model
        // (`Loaded`'s Drop) or by `make_room` while the model lives (it
        // holds `home.kept`'s lock, which `Loaded`'s Drop waits for), and
        // handed out again only as `Pooled<'m>` borrowing that `Loaded`.
        // `LlamaContext` holds no Rust reference to the model (a marker
        // only; the C context points at the C model, which does not move).
        let ctx: LlamaContext<'static> = unsafe { std::mem::transmute(ctx) };
        self.home
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((self.key.clone(), self.bytes, ctx));
    }
}

impl Loaded {
    /// A context for `settings`: one this model kept with the same key,
    /// its memory cleared, else a new one (other models' idle contexts
    /// freed first where the budget needs it).
    pub(super) fn context(&self, settings: &Settings) -> Result<Pooled<'_>> {
        let key = ContextKey::of(settings);
        let taken = {
            let mut kept = self.idle.kept.lock().unwrap_or_else(|p| p.into_inner());
            kept.iter()
                .position(|(k, _, _)| *k == key)
                .map(|i| kept.swap_remove(i))
        };
        let (ctx, bytes) = match taken {
            Some((_, bytes, mut ctx)) => {
                self.idle.all.idle.fetch_sub(bytes, Ordering::Relaxed);
                ctx.clear_kv_cache();
                (ctx, bytes)
            }
            None => {
                let bytes = self.context_bytes(settings);
                self.idle.all.make_room(bytes);
                let ctx = self.fresh_context(settings)?;
                self.idle.made.fetch_add(1, Ordering::Relaxed);
                (ctx, bytes)
            }
        };
        let all = &self.idle.all;
        let live = all.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        all.peak_live.fetch_max(live, Ordering::Relaxed);
        Ok(Pooled {
            ctx: Some(ctx),
            key,
            bytes,
            home: &self.idle,
        })
    }

    /// An estimate of what a context for `settings` holds: the logits of
    /// a full batch, the KV cache, and compute buffers of the same order as
    /// a batch of hidden states.
    fn context_bytes(&self, settings: &Settings) -> u64 {
        let n_vocab = self.info.n_vocab as u64;
        let n_batch = u64::from(settings.n_batch.max(1));
        let layers = u64::from(self.model.n_layer());
        let embd = self.model.n_embd().max(0) as u64;
        let kv_elt = if settings.kv_type == "f32" { 4 } else { 2 };
        let logits = n_batch * n_vocab * 4;
        let kv = 2 * u64::from(settings.n_ctx) * layers * embd * kv_elt;
        let compute = 8 * u64::from(settings.physical_batch()) * embd * 4;
        logits + kv + compute
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        self.idle.clear();
    }
}
