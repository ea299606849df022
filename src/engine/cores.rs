//! The machine's cores, shared by every quantgate process of this user.
//!
//! llama.cpp's threads wait for each other at every operation of a graph,
//! so two processes whose threads add up to more than the cores do not
//! share the machine, they stall each other: a thread that is switched out
//! holds up every barrier of its graph. A speed measurement taken beside
//! another process's decode is not the machine's speed at all, and a run
//! beside another run (two `cargo nextest` test processes, two CI jobs on
//! one runner, a test suite that starts `quantgate` twice) takes far longer
//! than the two one after the other.
//!
//! Contract: every compute call of the llama engine first holds one core
//! slot per thread it runs (every slot, for a speed measurement) and waits
//! while other processes and threads hold them; so the threads computing
//! at once never outnumber the cores, and a speed measurement runs with no
//! other quantgate decode on the machine. A slot is an exclusive `flock` on
//! `<temp>/quantgate-cores-<uid>/core-<i>.lock` (one file per core
//! `available_parallelism` counts), released when dropped or when the
//! process dies, so never stale. Every call passes a turnstile (one more
//! `flock`), which a waiter holds until its slots are free: no two waiters
//! hold slots the other needs, and a process that computes call after call
//! lets a waiter in between its calls. A thread that holds slots holds
//! them for the calls it makes inside. Where the folder cannot be made or
//! locked, calls run without slots, as before.

use crate::core::fsutil::{lock_file, lock_target};
use std::cell::Cell;
use std::fs::{File, TryLockError};
use std::path::PathBuf;

thread_local! {
    /// Slots this thread holds now (0: none).
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// Slots held by this thread until dropped.
#[must_use = "the slots are given back when this is dropped"]
pub(crate) struct Cores {
    files: Vec<File>,
}

impl Drop for Cores {
    fn drop(&mut self) {
        if !self.files.is_empty() {
            HELD.with(|h| h.set(0));
        }
    }
}

impl Cores {
    /// How many slots this handle holds (0 inside a call that holds them).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.files.len()
    }
}

/// The machine's core count as the process sees it.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The slots' folder: this user's, in the system's temp folder, so that
/// every cache and every checkout on the machine shares it.
fn folder() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("quantgate-cores-{uid}"))
}

/// Hold `threads` slots (at most every core's), waiting while others hold
/// them; none when this thread holds slots already.
pub(crate) fn hold(threads: usize) -> Cores {
    hold_in(&folder(), threads, cores())
}

/// Hold every slot: nothing else of quantgate's computes on the machine
/// until this is dropped.
pub(crate) fn hold_all() -> Cores {
    let n = cores();
    hold_in(&folder(), n, n)
}

fn hold_in(dir: &std::path::Path, threads: usize, n: usize) -> Cores {
    let none = Cores { files: Vec::new() };
    if HELD.with(Cell::get) > 0 {
        return none;
    }
    let want = threads.clamp(1, n.max(1));
    let slot = |i: usize| dir.join(format!("core-{i}.lock"));
    // Through the turnstile, one at a time: a waiter holds it until its
    // slots are free, so nobody who comes later takes them first.
    let Ok(turn) = lock_file(&dir.join("turnstile.lock")) else {
        return none;
    };
    // Any free slots at once, the common case; else slots 0.. in order.
    let mut files: Vec<File> = Vec::with_capacity(want);
    for i in 0..n {
        if files.len() == want {
            break;
        }
        let Ok(f) = lock_target(&slot(i)) else {
            return none;
        };
        match f.try_lock() {
            Ok(()) => files.push(f),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(_)) => return none,
        }
    }
    if files.len() < want {
        files.clear();
        for i in 0..want {
            let Ok(f) = lock_file(&slot(i)) else {
                return none;
            };
            files.push(f);
        }
    }
    drop(turn);
    HELD.with(|h| h.set(files.len()));
    Cores { files }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Threads asking for slots never hold more than the cores between
    /// them; a thread's inner calls take none; every slot is given back.
    #[test]
    fn computing_threads_never_outnumber_the_slots() {
        let dir = tempfile::tempdir().unwrap();
        let n = 3;
        let busy = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for t in 0..8 {
                let (busy, most, dir) = (busy.clone(), most.clone(), dir.path());
                s.spawn(move || {
                    for round in 0..20 {
                        let want = 1 + (t + round) % n;
                        let outer = hold_in(dir, want, n);
                        assert_eq!(outer.held(), want);
                        assert_eq!(hold_in(dir, 1, n).held(), 0, "inside a holding call");
                        let now = busy.fetch_add(want, Ordering::SeqCst) + want;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        busy.fetch_sub(want, Ordering::SeqCst);
                        drop(outer);
                    }
                });
            }
        });
        let most = most.load(Ordering::SeqCst);
        assert!(
            most <= n && most >= 2,
            "at most {n} at once, some at once: {most}"
        );
        // All given back: every slot at once, without waiting.
        assert_eq!(hold_in(dir.path(), n, n).held(), n);
    }

    /// More threads than cores hold every slot; a folder that cannot be
    /// made runs without slots.
    #[test]
    fn asks_beyond_the_cores_and_no_folder() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(hold_in(dir.path(), 16, 2).held(), 2);
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(hold_in(&file.join("sub"), 1, 2).held(), 0);
    }
}
