//! Live reference rows: a reference model's compact rows of the windows
//! being decoded now, read by its candidates in the same process as they
//! decode the same windows ([`crate::execute::observe::observe_lockstep`]),
//! and dropped when the next windows start. Nothing is written: the setting
//! for references too large to keep (a kld case's `store = "none"`).
//!
//! Contract: a row is read only from the windows it was decoded for; a
//! position the slot does not hold (not decoded yet, already dropped, or
//! its decode failed) is an error naming it, never another row.

use crate::core::error::{Error, Result};
use crate::measure::kld::RefPosition;
use std::ops::Range;
use std::sync::{Arc, RwLock, Weak};

/// The rows of one range of windows.
#[derive(Debug, Default)]
struct Part {
    /// The windows they belong to.
    windows: Range<usize>,
    /// The index (among all the scored positions) of the first row.
    from: usize,
    rows: Vec<RefPosition>,
}

/// One reference's live rows, shared by its producer and its readers.
#[derive(Debug, Default)]
pub(crate) struct LiveRows {
    part: RwLock<Part>,
}

impl LiveRows {
    /// Windows `windows` start, their first scored position being number
    /// `from`: the rows held so far are dropped.
    pub(crate) fn begin(&self, windows: Range<usize>, from: usize) {
        let mut p = self.part.write().unwrap_or_else(|e| e.into_inner());
        p.windows = windows;
        p.from = from;
        p.rows.clear();
    }

    /// The next row of the windows begun.
    pub(crate) fn push(&self, row: RefPosition) {
        self.part
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .rows
            .push(row);
    }

    /// `f` of the row of scored position `index` (in window `window`).
    pub(crate) fn with<T>(
        &self,
        index: usize,
        window: usize,
        f: impl FnOnce(&RefPosition) -> T,
    ) -> Result<T> {
        let p = self.part.read().unwrap_or_else(|e| e.into_inner());
        match index.checked_sub(p.from).and_then(|k| p.rows.get(k)) {
            Some(r) if p.windows.contains(&window) => Ok(f(r)),
            _ => Err(Error::harness(format!(
                "the live reference holds positions {}..{} of windows {:?}, not position {index} \
                 of window {window} (its decode failed, or it ran out of step)",
                p.from,
                p.from + p.rows.len(),
                p.windows
            ))),
        }
    }
}

/// The live rows of this process, by key: one slot per key while anyone
/// holds it. A key names one feed of one group, which its callers see to
/// (a kld case's: the product and the case, whose trials are one group;
/// or the product and the candidate's observation, one group's decode), so
/// that groups running at once never write where another reads.
#[derive(Debug, Default)]
pub struct LiveSlots {
    slots: std::sync::Mutex<std::collections::HashMap<String, Weak<LiveRows>>>,
}

impl LiveSlots {
    /// The slot of product `key` (the same one for every caller while any
    /// holds it).
    pub(crate) fn slot(&self, key: &str) -> Arc<LiveRows> {
        let mut m = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, w| w.strong_count() > 0);
        if let Some(s) = m.get(key).and_then(Weak::upgrade) {
            return s;
        }
        let s = Arc::new(LiveRows::default());
        m.insert(key.to_string(), Arc::downgrade(&s));
        s
    }
}
