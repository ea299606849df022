//! A shipped reference folder (`QUANTGATE_REFERENCE_DIR`) and what a
//! product it lacks does (`QUANTGATE_REFERENCE_MISSING`).

use super::*;

/// A reference folder built elsewhere (`quantgate reference build`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipped {
    /// The folder (read only).
    pub dir: PathBuf,
    /// What to do about a product it lacks.
    pub missing: Missing,
}

/// What a store with a shipped folder does about a product the folder lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// An error naming the product and the case (the default).
    Error,
    /// Compute it here (loading the reference model), into the local cache.
    Compute,
}

/// The environment variable naming a shipped reference folder.
pub const REFERENCE_DIR_ENV: &str = "QUANTGATE_REFERENCE_DIR";

/// The environment variable saying what a missing shipped product does.
pub const REFERENCE_MISSING_ENV: &str = "QUANTGATE_REFERENCE_MISSING";

/// The shipped reference folder the environment names, if any: the folder
/// must exist; `QUANTGATE_REFERENCE_MISSING` is `error` (default) or `compute`.
pub fn shipped_from_env() -> Result<Option<Shipped>> {
    let missing = match std::env::var(REFERENCE_MISSING_ENV).as_deref() {
        Err(_) | Ok("") | Ok("error") => Missing::Error,
        Ok("compute") => Missing::Compute,
        Ok(other) => {
            return Err(Error::input(format!(
                "{REFERENCE_MISSING_ENV}=`{other}`: expected `error` or `compute`"
            )))
        }
    };
    let Some(dir) = std::env::var_os(REFERENCE_DIR_ENV).filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        return Err(Error::input(format!(
            "{REFERENCE_DIR_ENV}={}: not a folder (build one with `quantgate reference build CASE --out DIR`)",
            dir.display()
        )));
    }
    Ok(Some(Shipped { dir, missing }))
}
