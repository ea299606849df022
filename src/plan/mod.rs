//! Discover, parse and plan: the case × model matrix of a run, answered
//! before any model loads (`--list`, filters and `--exact` need nothing
//! more). Used by the `cargo test` harness and by the CLI alike.
//!
//! Contract: a broken case becomes one planned test of its own that fails
//! alone; a model alias missing from the registry fails only its own tests;
//! the matrix is sorted by model, then name.

pub(crate) mod discover;
pub mod groups;
pub mod parse;

use crate::core::error::{Error, Result};
use crate::kinds::Parsed;
use crate::models::Registry;
use discover::discover;
use parse::{parse_case_with, Overrides};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One planned test: a case on a model, or a case that failed to parse.
#[derive(Debug, Clone)]
pub struct Planned {
    /// `suite/case::model` (or `suite/case` for a broken case).
    pub name: String,
    /// The case, or why it could not be used.
    pub case: std::result::Result<Parsed, Error>,
    /// Model alias (empty for a broken case).
    pub model: String,
}

/// Discover and parse; build the case × model matrix, sorted by model then name.
pub fn plan(
    suites: &Path,
    patterns: &[String],
    models: &[String],
) -> Result<(Registry, Vec<Planned>)> {
    plan_with(suites, patterns, models, &Overrides::default())
}

/// [`plan`] with the command line's [`Overrides`]: with `overrides.models`,
/// every selected case runs on those models (and only those: a
/// preregistered case, which keeps its sealed models, drops out).
pub fn plan_with(
    suites: &Path,
    patterns: &[String],
    models: &[String],
    overrides: &Overrides,
) -> Result<(Registry, Vec<Planned>)> {
    let registry = Registry::load(&suites.join("models.toml"))?;
    // With files named, the overriding aliases replace the filter.
    let models = overrides.models.as_deref().unwrap_or(models);
    for m in models.iter().chain(&overrides.reference) {
        registry.entry(m)?;
    }
    let mut parsed_cases = Vec::new();
    for found in discover(suites, patterns)? {
        // Messages show the case as `suites/<rel>`, wherever the root is.
        let shown = PathBuf::from("suites").join(&found.rel);
        // `::` parts a test name into case and model: `k::one.toml` would
        // report as case `k`, and a second such file overwrite its outputs.
        let parsed = if found.name().contains("::") {
            Err(crate::core::Error::input(format!(
                "{}: a case file's name cannot hold `::` (it separates the case from the \
                 model in test names); rename the file",
                shown.display()
            )))
        } else {
            parse_case_with(&found.path, &shown, found.name(), overrides)
        };
        parsed_cases.push((found, parsed));
    }
    // Cases may have pinned local files (`path:`) into the lock: read it again.
    let registry = Registry::load(&suites.join("models.toml"))?;
    let mut out = Vec::new();
    for (found, parsed) in parsed_cases {
        match parsed {
            Err(e) => out.push(Planned {
                name: found.name().to_string(),
                case: Err(e),
                model: String::new(),
            }),
            Ok(parsed) => {
                // A kind's variants (several wordings of a prompt): one test each.
                let variants = parsed.kind.variants();
                if variants.is_empty() {
                    plan_models(&registry, models, &parsed, &mut out);
                }
                for (suffix, kind) in variants {
                    let mut case = (*parsed.case).clone();
                    case.name = format!("{}/{suffix}", parsed.case.name);
                    let one = Parsed {
                        case: Arc::new(case),
                        kind,
                    };
                    plan_models(&registry, models, &one, &mut out);
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.model, &a.name).cmp(&(&b.model, &b.name)));
    Ok((registry, out))
}

/// One planned test per model of `parsed` (those in `models` when given).
fn plan_models(registry: &Registry, models: &[String], parsed: &Parsed, out: &mut Vec<Planned>) {
    let case = &parsed.case;
    for (alias, at) in &case.models {
        if !models.is_empty() && !models.contains(alias) {
            continue;
        }
        let checked = registry
            .entry(alias)
            .map_err(|e| e.context(format!("{at}: models")))
            .and_then(|m| match &case.reference {
                Some((r, rat)) => registry
                    .entry(r)
                    .map_err(|e| e.context(format!("{rat}: reference")))
                    .and_then(|re| {
                        // The reference among several candidates is their
                        // baseline row (a publisher's folder holds it); as
                        // the only candidate it would pass every gate
                        // vacuously, and that is refused.
                        let is_self = |a: &str| {
                            a == r
                                || registry
                                    .entry(a)
                                    .is_ok_and(|e| e.sha256.is_some() && e.sha256 == re.sha256)
                        };
                        let same_file = m.sha256.is_some() && m.sha256 == re.sha256;
                        if (r != alias && !same_file)
                            || !case.models.iter().all(|(a, _)| is_self(a))
                        {
                            return Ok(());
                        }
                        Err(Error::input(format!(
                            "{rat}: reference `{r}` is the candidate `{alias}` itself ({}), and \
                             the case has no other candidate: a model compared with itself passes \
                             every gate vacuously; name another reference, or another model",
                            if r == alias {
                                "the same alias".to_string()
                            } else {
                                format!(
                                    "the same file, sha256 {}",
                                    re.sha256.as_deref().unwrap_or("")
                                )
                            }
                        )))
                    }),
                None => Ok(()),
            });
        out.push(Planned {
            name: format!("{}::{alias}", case.name),
            case: checked.map(|()| parsed.clone()),
            model: alias.clone(),
        });
    }
}
