//! Progress bars on stderr for the long steps (hashing, fetching, decoding),
//! drawn only when stderr is a terminal: logs and CI output stay clean. A
//! worker process's stderr is a pipe to its parent, which passes the bytes
//! on: a parent on a terminal says so (`QUANTGATE_PROGRESS_TERMINAL`), and
//! the worker draws as if its stderr were one.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use std::io::Write;

/// Set by a parent whose stderr is a terminal, for its worker processes.
pub(crate) const TERMINAL_ENV: &str = "QUANTGATE_PROGRESS_TERMINAL";

/// Whether this process's stderr is a terminal.
pub(crate) fn stderr_is_terminal() -> bool {
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
pub(crate) fn set_parent_terminal(on: bool) {
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

/// The style of a bar counting `unit` (`bytes`: sizes; else the plural
/// of what is counted).
fn style(unit: &str) -> ProgressStyle {
    let template = if unit == "bytes" {
        "{msg:>24} [{bar:30}] {bytes}/{total_bytes} {eta}".to_string()
    } else {
        format!("{{msg:>24}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{eta}}")
    };
    ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A bar of `len` units named `msg`; `unit` is `bytes` (sizes and ETA) or
/// the plural of what is counted (`windows`). Drawn on this process's
/// board when one is open ([`board_open`]), sent to the parent's board
/// when this is a worker of one, else drawn on stderr (when a terminal).
pub(crate) fn bar(len: u64, msg: &str, unit: &str) -> Bar {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    if FORWARD.load(std::sync::atomic::Ordering::Relaxed) {
        let b = Bar {
            bar: ProgressBar::hidden().with_position(0),
            forward: Some(Forward {
                id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                len,
                msg: msg.to_string(),
                unit: unit.to_string(),
                sent: std::sync::Mutex::new(None),
            }),
        };
        b.send(0, false);
        return b;
    }
    let bar = ProgressBar::with_draw_target(Some(len), target());
    bar.set_style(style(unit));
    bar.set_message(msg.to_string());
    let bar = match lock_board().as_ref() {
        Some(b) => b.multi.insert_before(&b.overall, bar),
        None => bar,
    };
    Bar { bar, forward: None }
}

/// A progress bar ([`bar`]): drawn here, or sent to the parent's board;
/// cleared when finished or dropped.
pub(crate) struct Bar {
    bar: ProgressBar,
    forward: Option<Forward>,
}

impl Drop for Bar {
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.finish_and_clear();
        }
    }
}

/// A worker's bar as its parent's board draws it: sent as lines on the
/// worker's stdout ([`PROGRESS`]), at most every 200 ms and at the end.
struct Forward {
    id: u64,
    len: u64,
    msg: String,
    unit: String,
    sent: std::sync::Mutex<Option<std::time::Instant>>,
}

/// Prefix of a worker's progress lines on its stdout: `id pos len unit`,
/// a tab, the bar's message (`pos` past `len`: the bar is finished).
pub(crate) const PROGRESS: &str = "QUANTGATE-PROGRESS ";

impl Bar {
    /// Advance by `n`.
    pub(crate) fn inc(&self, n: u64) {
        self.bar.inc(n);
        self.send(self.bar.position(), false);
    }

    /// Set the position.
    pub(crate) fn set_position(&self, pos: u64) {
        self.bar.set_position(pos);
        self.send(pos, false);
    }

    /// Done: cleared from where it was drawn.
    pub(crate) fn finish_and_clear(&self) {
        self.bar.finish_and_clear();
        self.send(0, true);
    }

    fn send(&self, pos: u64, done: bool) {
        let Some(f) = &self.forward else { return };
        let mut sent = f.sent.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if !done && sent.is_some_and(|t| now.duration_since(t).as_millis() < 200) {
            return;
        }
        *sent = Some(now);
        let pos = if done { f.len + 1 } else { pos.min(f.len) };
        let mut out = std::io::stdout().lock();
        let _ = out
            .write_all(progress_line(f.id, pos, f.len, &f.unit, &f.msg).as_bytes())
            .and_then(|()| out.flush());
    }
}

/// One progress line ([`PROGRESS`]), newline-terminated.
fn progress_line(id: u64, pos: u64, len: u64, unit: &str, msg: &str) -> String {
    let clean = |s: &str| s.replace(['\n', '\t', ' '], " ").trim().replace(' ', "_");
    format!(
        "{PROGRESS}{id} {pos} {len} {}\t{}\n",
        clean(unit),
        msg.replace(['\n', '\t'], " ")
    )
}

/// A progress line's fields after [`PROGRESS`]: (id, pos, len, unit, msg).
fn parse_progress(rest: &str) -> Option<(u64, u64, u64, String, String)> {
    let (head, msg) = rest.split_once('\t')?;
    let mut it = head.split(' ');
    let id = it.next()?.parse().ok()?;
    let pos = it.next()?.parse().ok()?;
    let len = it.next()?.parse().ok()?;
    let unit = it.next()?.to_string();
    Some((id, pos, len, unit, msg.to_string()))
}

/// Whether this worker's bars go to its parent's board (the parent says
/// so: `QUANTGATE_PROGRESS_TERMINAL=board`, the config's `progress_board`).
static FORWARD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Send this process's bars to the parent's board (a worker of a parent
/// that draws one): set by the edge from its config.
pub(crate) fn set_forward(on: bool) {
    FORWARD.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// One place that draws every bar of a run on a terminal: an overall bar
/// (tests done of all, with an ETA, and what is running), the bars of
/// this process, and those its workers send.
struct Board {
    multi: indicatif::MultiProgress,
    overall: ProgressBar,
    /// Workers' bars by (worker, its bar's id).
    remote: std::collections::HashMap<(u32, u64), ProgressBar>,
}

static BOARD: std::sync::Mutex<Option<Board>> = std::sync::Mutex::new(None);

fn lock_board() -> std::sync::MutexGuard<'static, Option<Board>> {
    BOARD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Open the board for a run of `total` tests, when stderr is a terminal
/// (else nothing is drawn, and false: logs stay lines).
pub fn board_open(total: u64) -> bool {
    if !stderr_is_terminal() {
        return false;
    }
    let multi = indicatif::MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let overall = multi.add(ProgressBar::new(total));
    overall.set_style(
        ProgressStyle::with_template("{prefix} {pos}/{len} tests [{bar:24}] ETA {eta} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("#> "),
    );
    overall.set_prefix("quantgate");
    overall.enable_steady_tick(std::time::Duration::from_millis(500));
    *lock_board() = Some(Board {
        multi,
        overall,
        remote: std::collections::HashMap::new(),
    });
    true
}

/// Whether a board is open (workers then send their bars to it).
pub(crate) fn board_is_open() -> bool {
    lock_board().is_some()
}

/// The overall bar: `done` more tests finished; `running` (when given) the
/// tests now running.
pub fn board_tick(done: u64, running: Option<&str>) {
    if let Some(b) = lock_board().as_ref() {
        b.overall.inc(done);
        if let Some(r) = running {
            b.overall.set_message(format!("running {r}"));
        }
    }
}

/// A progress line from worker `worker` ([`PROGRESS`] taken off): its bar
/// drawn, moved or (finished) cleared on the board. A line that does not
/// parse is ignored (progress never fails a run).
pub(crate) fn board_remote(worker: u32, rest: &str) {
    let Some((id, pos, len, unit, msg)) = parse_progress(rest) else {
        return;
    };
    let mut guard = lock_board();
    let Some(b) = guard.as_mut() else { return };
    if pos > len {
        if let Some(bar) = b.remote.remove(&(worker, id)) {
            bar.finish_and_clear();
            b.multi.remove(&bar);
        }
        return;
    }
    let bar = b.remote.entry((worker, id)).or_insert_with(|| {
        let bar = b.multi.insert_before(&b.overall, ProgressBar::new(len));
        bar.set_style(style(&unit));
        bar.set_message(msg);
        bar
    });
    bar.set_position(pos);
}

/// Close the board: every bar cleared.
pub fn board_close() {
    if let Some(b) = lock_board().take() {
        for bar in b.remote.values() {
            bar.finish_and_clear();
        }
        b.overall.finish_and_clear();
        let _ = b.multi.clear();
    }
}

/// A spinner for a step whose length is unknown (quantizing a model):
/// `{what} {msg}` and the time elapsed, ticking until it is finished.
pub(crate) fn spinner(what: &str, msg: &str) -> ProgressBar {
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

/// Pass one note on: to the sink, else to stderr (above the board's bars
/// when one is drawn).
pub(crate) fn note(line: &str) {
    match SINK.get() {
        Some(s) => s.note(line),
        None => line_out(line),
    }
}

/// A line on stderr: above the board when one is open, else as it is.
pub fn line_out(line: &str) {
    match lock_board().as_ref() {
        Some(b) => {
            let _ = b.multi.println(line);
        }
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

    /// A worker's progress line reads back as it was sent; a message keeps
    /// its spaces, a unit cannot break the line; a bad line is None.
    #[test]
    fn progress_lines_round_trip() {
        let l = super::progress_line(7, 12, 80, "windows", "decode smollm2-q8_0");
        assert!(l.starts_with(super::PROGRESS) && l.ends_with('\n'), "{l}");
        let rest = l.trim_end().strip_prefix(super::PROGRESS).unwrap();
        assert_eq!(
            super::parse_progress(rest),
            Some((7, 12, 80, "windows".into(), "decode smollm2-q8_0".into()))
        );
        let l = super::progress_line(1, 0, 3, "odd unit\n", "a\tb\nc");
        assert_eq!(l.matches('\n').count(), 1, "{l:?}");
        let rest = l.trim_end().strip_prefix(super::PROGRESS).unwrap();
        let (_, _, _, unit, msg) = super::parse_progress(rest).unwrap();
        assert_eq!((unit.as_str(), msg.as_str()), ("odd_unit", "a b c"));
        assert_eq!(super::parse_progress("x 1 2 w\tm"), None);
        assert_eq!(super::parse_progress("1 2 3 w"), None);
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
