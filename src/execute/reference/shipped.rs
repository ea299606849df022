//! A shipped reference folder (`QUANTGATE_REFERENCE_DIR`) and what a
//! product it lacks does (`QUANTGATE_REFERENCE_MISSING`): read by the
//! config, named here where the reference store uses them.

pub(crate) use crate::core::config::{Missing, Shipped, REFERENCE_DIR_ENV, REFERENCE_MISSING_ENV};
