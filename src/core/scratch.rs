//! Scratch paths for tests: the library's unit tests use this module, and
//! the integration tests include this very file (`tests/common/mod.rs`).
//! A test's folders were left in the temp folder by every run before.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};

/// A scratch path `<tmp>/qg-<name>-<pid>` for a test of this process
/// (whatever a process of the same pid left there is removed first),
/// removed again when this process exits, unless a test panicked: a failed
/// test's folders are kept (and named on stderr) to be looked into. Only
/// paths this process named are removed, and only at its exit.
pub fn scratch(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("qg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let _ = std::fs::remove_file(&path);
    register(&path);
    path
}

/// The paths [`scratch`] named in this process.
static NAMED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Whether a test of this process panicked (a panic hook, chained to the
/// one before it, notes it).
static PANICKED: AtomicBool = AtomicBool::new(false);

fn register(path: &Path) {
    static HOOKS: Once = Once::new();
    HOOKS.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::SeqCst);
            before(info)
        }));
        // SAFETY: `remove` is a plain function that never unwinds (its
        // removal errors are ignored); atexit keeps only its address.
        unsafe { libc::atexit(remove) };
    });
    NAMED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(path.to_path_buf());
}

/// At exit: every named path, removed; or, after a panic, named as kept.
extern "C" fn remove() {
    let named = std::mem::take(&mut *NAMED.lock().unwrap_or_else(|p| p.into_inner()));
    let keep = PANICKED.load(Ordering::SeqCst);
    for path in named.iter().filter(|p| p.exists()) {
        if keep {
            eprintln!("kept after a failed test: {}", path.display());
        } else if path.is_dir() {
            let _ = std::fs::remove_dir_all(path);
        } else {
            let _ = std::fs::remove_file(path);
        }
    }
}
