//! A shipped reference folder (`QUANTGATE_REFERENCE_DIR`) and what a
//! product it lacks does (`QUANTGATE_REFERENCE_MISSING`), as the config
//! says.

use super::*;
pub use crate::core::config::{Missing, Shipped, REFERENCE_DIR_ENV, REFERENCE_MISSING_ENV};

/// The shipped reference folder this process's config names, if any (the
/// config checked that it is a folder).
pub fn shipped_from_env() -> Result<Option<Shipped>> {
    Ok(crate::core::config::Config::current().reference.clone())
}
