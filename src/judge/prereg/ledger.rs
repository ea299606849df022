//! The append-only ledger of sealed prereg files: `sha256 path time prev`
//! lines, each chained to the one before by hash; sealing appends a line,
//! reading verifies every line and the chain.

use super::{parse, Prereg};
use crate::core::error::{Error, Result};
use crate::core::fsutil::{sha256_bytes, write_atomic};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The ledger's file name, next to the prereg files.
pub const LEDGER: &str = "LEDGER";

/// One ledger line: `sha256 path utc head prev`.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerLine {
    /// sha256 of the sealed file's bytes.
    pub sha256: String,
    /// `prereg/<file>`.
    pub path: String,
    /// UTC seal time, `YYYY-MM-DDTHH:MM:SSZ`.
    pub time: String,
    /// git HEAD at sealing, or `-`.
    pub head: String,
    /// sha256 of the previous line (64 zeros for the first).
    pub prev: String,
    /// 1-based line number.
    pub line_no: usize,
    /// The line as written.
    pub raw: String,
}

/// Read and verify a ledger: every line well-formed and chained to the one
/// before. A missing ledger is empty.
pub fn read_ledger(path: &Path) -> Result<Vec<LedgerLine>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::input(format!("{}: {e}", path.display()))),
    };
    let text = String::from_utf8(bytes)
        .map_err(|e| Error::input(format!("{}: not UTF-8: {e}", path.display())))?;
    if !text.is_empty() && !text.ends_with('\n') {
        return Err(Error::input(format!(
            "{}: the last line does not end with a newline: the ledger was cut or edited",
            path.display()
        )));
    }
    let mut out: Vec<LedgerLine> = Vec::new();
    let mut prev = "0".repeat(64);
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let bad = |why: &str| {
            Error::input(format!(
                "{}:{n}: {why}\n  line: {raw}\n  (a ledger line is `sha256 path utc-time git-head prev-line-sha256`)",
                path.display()
            ))
        };
        let f: Vec<&str> = raw.split(' ').collect();
        let [sha, p, time, head, pv] = f[..] else {
            return Err(bad("not 5 space-separated fields"));
        };
        if !crate::core::fsutil::is_hex(sha, 64) || !crate::core::fsutil::is_hex(pv, 64) {
            return Err(bad("sha256 fields must be 64 lowercase hex digits"));
        }
        if head != "-" && !crate::core::fsutil::is_hex(head, 40) {
            return Err(bad("git head must be 40 hex digits or `-`"));
        }
        if parse_utc(time).is_none() {
            return Err(bad("time must be YYYY-MM-DDTHH:MM:SSZ"));
        }
        if pv != prev {
            return Err(bad(&format!(
                "chain broken: this line says the previous line hashes to {pv}, it hashes to {prev}: \
                 a line above was edited, removed or reordered"
            )));
        }
        prev = sha256_bytes(raw.as_bytes());
        out.push(LedgerLine {
            sha256: sha.into(),
            path: p.into(),
            time: time.into(),
            head: head.into(),
            prev: pv.into(),
            line_no: n,
            raw: raw.into(),
        });
    }
    Ok(out)
}

/// The ledger next to a prereg file.
pub fn ledger_of(prereg: &Path) -> PathBuf {
    prereg.parent().unwrap_or(Path::new(".")).join(LEDGER)
}

/// The project root: the ledger directory's parent.
pub fn root_of(prereg: &Path) -> PathBuf {
    let dir = prereg.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    abs.parent().map(Path::to_path_buf).unwrap_or(abs)
}

/// Seal `path`: append its hash to the ledger. Refuses a file already
/// sealed (same path or same bytes). Returns the new ledger line.
pub fn seal(path: &Path, now_unix: u64) -> Result<LedgerLine> {
    let p = parse(path)?;
    let ledger = ledger_of(path);
    let lines = read_ledger(&ledger)?;
    for l in &lines {
        if l.path == p.ledger_path {
            let why = if l.sha256 == p.sha256 {
                "is already sealed".to_string()
            } else {
                format!(
                    "was sealed with other bytes (sealed {}, now {}): a sealed prereg is never edited; \
                     write a new file",
                    l.sha256, p.sha256
                )
            };
            return Err(Error::input(format!(
                "{}: {why}\n  {}:{}: {}",
                path.display(),
                ledger.display(),
                l.line_no,
                l.raw
            )));
        }
        if l.sha256 == p.sha256 {
            return Err(Error::input(format!(
                "{}: the same bytes are already sealed as {} ({}:{})",
                path.display(),
                l.path,
                ledger.display(),
                l.line_no
            )));
        }
    }
    if p.ledger_path.contains(char::is_whitespace) {
        return Err(Error::input(format!(
            "{}: a prereg file name may not contain whitespace",
            path.display()
        )));
    }
    let root = root_of(path);
    let head = git(&root, &["rev-parse", "HEAD"])
        .filter(|h| crate::core::fsutil::is_hex(h, 40))
        .unwrap_or_else(|| "-".into());
    let prev = lines
        .last()
        .map(|l| sha256_bytes(l.raw.as_bytes()))
        .unwrap_or_else(|| "0".repeat(64));
    let time = format_utc(now_unix);
    let raw = format!("{} {} {time} {head} {prev}", p.sha256, p.ledger_path);
    let mut text = std::fs::read(&ledger).unwrap_or_default();
    text.extend_from_slice(raw.as_bytes());
    text.push(b'\n');
    write_atomic(&ledger, &text)?;
    Ok(LedgerLine {
        sha256: p.sha256,
        path: p.ledger_path,
        time,
        head,
        prev,
        line_no: lines.len() + 1,
        raw,
    })
}

/// The ledger line sealing `p`, after checking the file is unchanged.
pub fn sealed_line(p: &Prereg) -> Result<LedgerLine> {
    let ledger = ledger_of(&p.path);
    let lines = read_ledger(&ledger)?;
    let Some(line) = lines.iter().find(|l| l.path == p.ledger_path) else {
        return Err(Error::input(format!(
            "{}: not sealed: no line for {} in {} (run `quantgate prereg seal {}` before the first run)",
            p.path.display(),
            p.ledger_path,
            ledger.display(),
            p.path.display()
        )));
    };
    if line.sha256 != p.sha256 {
        return Err(Error::input(format!(
            "{}: changed after sealing (content, whitespace or line endings)\n  sealed  {}\n  now     {}\n  {}:{}: {}",
            p.path.display(),
            line.sha256,
            p.sha256,
            ledger.display(),
            line.line_no,
            line.raw
        )));
    }
    Ok(line.clone())
}

/// The ledger's time format (UTC).
const UTC: &str = "%Y-%m-%dT%H:%M:%SZ";

/// Unix seconds → `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_utc(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map_or_else(|| "(out of range)".into(), |t| t.format(UTC).to_string())
}

/// A valid `YYYY-MM-DDTHH:MM:SSZ` time, or None.
pub(crate) fn parse_utc(s: &str) -> Option<()> {
    // chrono accepts unpadded fields; the ledger writes them padded.
    (s.len() == 20 && chrono::NaiveDateTime::parse_from_str(s, UTC).is_ok()).then_some(())
}

/// Seconds since the Unix epoch, now.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Run git in `root`; None when git is missing or fails.
pub(crate) fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
