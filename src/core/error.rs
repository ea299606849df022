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
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
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

/// Bytes read back that cannot be used as their format says: a GGUF
/// header, a store or reference file, a llama-perplexity base file, a
/// golden, a preregistration, a list of token ids. It holds the format's
/// own words for what is wrong and where (an offset, a key, a position),
/// or, from a reader that opens the file itself, the I/O error that kept
/// it from reading; the reader knows no path, and its caller puts the path
/// in front and decides whose fault it is (a store's reader reports it and
/// builds the file again; a case's input is an input error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

/// `From<String>` and `From<&str>` for an error that is its words
/// (`struct E(pub String)`), so that `?` and `.into()` take a message.
macro_rules! from_words {
    ($e:ident) => {
        impl From<String> for $e {
            fn from(why: String) -> Self {
                $e(why)
            }
        }

        impl From<&str> for $e {
            fn from(why: &str) -> Self {
                $e(why.to_string())
            }
        }
    };
}
pub(crate) use from_words;

from_words!(Malformed);

impl From<Malformed> for Error {
    /// Bytes handed in that break their format are the input's fault.
    fn from(e: Malformed) -> Self {
        Error::input(e.0)
    }
}

impl From<SealError> for Malformed {
    fn from(e: SealError) -> Self {
        Malformed(e.to_string())
    }
}

/// Why a sealed file or a signed JSON product is not to be trusted: the
/// seal (a trailing sha256, or HMAC-SHA256 under the signing key) or the
/// MAC does not verify, or the file could not be read to check it. Each
/// says whether it looks like an accident (a truncation, a disk) or an edit
/// sealed again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Fewer bytes than the 32 of a seal.
    #[error("shorter than its seal: truncated")]
    Short,
    /// A plain seal that is not the contents' sha256.
    #[error("its trailing sha256 does not match its contents: truncated or corrupted on disk")]
    Corrupt,
    /// A keyed seal that does not verify under the key (`key` says where
    /// the key came from); `resealed` when the tag is the contents' plain
    /// sha256, as an edit sealed again without the key leaves it.
    #[error(
        "its keyed seal (HMAC-SHA256) does not verify with the key: the file was edited, \
         truncated, or written under another key ({key}){}",
        if *resealed {
            "; it carries a plain sha256 seal instead: it was edited and sealed again, or \
             written without the key"
        } else {
            ""
        }
    )]
    Forged {
        /// Where the signing key came from.
        key: String,
        /// Whether the tag is the plain sha256 of the contents.
        resealed: bool,
    },
    /// A signed JSON product without its MAC.
    #[error("carries no MAC, and a signing key is set ({key}): it was not written under that key")]
    NoMac {
        /// Where the signing key came from.
        key: String,
    },
    /// A signed JSON product whose MAC does not verify.
    #[error(
        "its MAC does not verify with the signing key ({key}): the file was edited, or \
         written under another key"
    )]
    BadMac {
        /// Where the signing key came from.
        key: String,
    },
    /// The file could not be read (its I/O error).
    #[error("{0}")]
    Read(String),
}

/// An outcome read back (result cache, shard, `--json` file) whose metrics
/// are not what its own data gives (a per-window series, counts): the
/// metrics that disagree, with both values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Inconsistent(pub String);

from_words!(Inconsistent);

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
