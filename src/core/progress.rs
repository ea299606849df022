//! Progress bars on stderr for the long steps (hashing, fetching, decoding),
//! drawn only when stderr is a terminal: logs and CI output stay clean. A
//! worker process's stderr is a pipe to its parent, which passes the bytes
//! on: a parent on a terminal says so (`QUANTGATE_PROGRESS_TERMINAL`), and
//! the worker draws as if its stderr were one.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use std::io::Write;

/// Set by a parent whose stderr is a terminal, for its worker processes.
pub const TERMINAL_ENV: &str = "QUANTGATE_PROGRESS_TERMINAL";

/// Whether this process's stderr is a terminal.
pub fn stderr_is_terminal() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}

/// Raw stderr drawn on as a terminal (ANSI cursor moves), for a worker
/// whose parent passes its stderr on to a terminal.
#[derive(Debug)]
struct PassedOn;

impl PassedOn {
    fn put(&self, s: &str) -> std::io::Result<()> {
        std::io::stderr().lock().write_all(s.as_bytes())
    }

    /// A cursor move of `n` (`ESC [ n letter`), nothing for 0.
    fn cursor(&self, n: usize, letter: char) -> std::io::Result<()> {
        if n > 0 {
            self.put(&format!("\x1b[{n}{letter}"))
        } else {
            Ok(())
        }
    }
}

impl TermLike for PassedOn {
    fn width(&self) -> u16 {
        100
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.cursor(n, 'A')
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.cursor(n, 'B')
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.cursor(n, 'C')
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.cursor(n, 'D')
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.put(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.put(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.put("\r\x1b[2K")
    }
    fn flush(&self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

static PARENT_TERMINAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Say that the parent process passing this one's stderr on draws on a
/// terminal (the config's `parent_terminal`), so bars are
/// drawn for it: set by the edge (a worker) from its config.
pub fn set_parent_terminal(on: bool) {
    PARENT_TERMINAL.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Where bars are drawn: stderr when it is a terminal, or when the parent
/// that passes this process's stderr on is on one; else nowhere.
fn target() -> ProgressDrawTarget {
    if !stderr_is_terminal() && PARENT_TERMINAL.load(std::sync::atomic::Ordering::Relaxed) {
        ProgressDrawTarget::term_like_with_hz(Box::new(PassedOn), 10)
    } else {
        ProgressDrawTarget::stderr()
    }
}

/// A bar of `len` units named `msg`; `unit` is `bytes` (sizes and ETA) or
/// the plural of what is counted (`windows`).
pub fn bar(len: u64, msg: &str, unit: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), target());
    let template = if unit == "bytes" {
        "{msg:>24} [{bar:30}] {bytes}/{total_bytes} {eta}".to_string()
    } else {
        format!("{{msg:>24}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{eta}}")
    };
    bar.set_style(
        ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(msg.to_string());
    bar
}

/// A spinner for a step whose length is unknown (quantizing a model):
/// `{what} {msg}` and the time elapsed, ticking until it is finished.
pub fn spinner(what: &str, msg: &str) -> ProgressBar {
    let spinner = ProgressBar::with_draw_target(None, target());
    spinner.set_style(
        ProgressStyle::with_template(&format!("{{spinner}} {what} {{msg}} {{elapsed}}"))
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    spinner.set_message(msg.to_string());
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    spinner
}

/// Where the library's notes go (a file pinned, a cache entry refused, a
/// reference read unauthenticated, a model derived): stderr, unless the
/// program that embeds quantgate takes them ([`set_sink`]). The library
/// writes no other way to stderr (`tests/cli/package.rs` checks).
pub trait Sink: Send + Sync {
    /// One note, a line or a few, without its trailing newline.
    fn note(&self, line: &str);
}

static SINK: std::sync::OnceLock<Box<dyn Sink>> = std::sync::OnceLock::new();

/// Take the library's notes from now on (once per process: false, and
/// `sink` unused, when one is set already).
pub fn set_sink(sink: Box<dyn Sink>) -> bool {
    SINK.set(sink).is_ok()
}

/// Pass one note on: to the sink, else to stderr.
pub fn note(line: &str) {
    match SINK.get() {
        Some(s) => s.note(line),
        None => eprintln!("{line}"),
    }
}

/// `say!("…", args)`: a note, formatted as `format!` does ([`note`]).
macro_rules! say {
    ($($t:tt)*) => {
        $crate::core::progress::note(&format!($($t)*))
    };
}
pub(crate) use say;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    struct Keep(Arc<Mutex<Vec<String>>>);
    impl super::Sink for Keep {
        fn note(&self, line: &str) {
            self.0.lock().unwrap().push(line.to_string());
        }
    }

    #[test]
    fn notes_go_to_the_sink_a_program_sets() {
        let kept = Arc::new(Mutex::new(Vec::new()));
        assert!(super::set_sink(Box::new(Keep(kept.clone()))));
        assert!(!super::set_sink(Box::new(Keep(kept.clone()))), "set once");
        super::say!("quantgate: pinned `{}` ({} bytes)", "a", 3);
        let kept = kept.lock().unwrap();
        assert!(
            kept.iter().any(|l| l == "quantgate: pinned `a` (3 bytes)"),
            "{kept:?}"
        );
    }
}
