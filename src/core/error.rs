//! Errors. Contract: every error says what the user wrote and where
//! (`path:line:col: key: message`), and keeps "the input could not be used"
//! apart from "the engine failed" and "the case failed".

use std::fmt;
use std::path::Path;

/// Which side is at fault; decides the exit code and the test outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A case, registry, text or model file could not be used (exit 2).
    Input,
    /// llama.cpp (or the fake engine) failed on a usable input.
    Engine,
    /// The harness itself could not run (I/O, a tool missing).
    Harness,
}

/// An error with its whole explanation in `message`.
#[derive(Debug, Clone)]
pub struct Error {
    /// Who is at fault.
    pub kind: ErrorKind,
    /// The full, user-facing message.
    pub message: String,
}

/// Crate-wide result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An input error.
    pub fn input(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Input,
            message: message.into(),
        }
    }
    /// An engine error.
    pub(crate) fn engine(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Engine,
            message: message.into(),
        }
    }
    /// A harness error.
    pub fn harness(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Harness,
            message: message.into(),
        }
    }
    /// An I/O error on `path`.
    pub fn io(path: &Path, err: std::io::Error) -> Self {
        Error::harness(format!("{}: {err}", path.display()))
    }
    /// Prefix the message with context, keeping the kind.
    pub fn context(self, ctx: impl fmt::Display) -> Self {
        Error {
            kind: self.kind,
            message: format!("{ctx}: {}", self.message),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Several errors found in one file, reported together.
pub fn join(errors: Vec<Error>) -> Error {
    let kind = errors.first().map_or(ErrorKind::Input, |e| e.kind);
    let message = errors
        .iter()
        .map(|e| e.message.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    Error { kind, message }
}
