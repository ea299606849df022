//! Parse stage: one case file → a [`Parsed`] case: the keys every case
//! shares, parsed here once, and the kind's own table, parsed by its kind.
//!
//! Contract: unknown keys, wrong types, missing keys and non-finite numbers
//! are errors naming `path:line:col: key`; every validation error of a file
//! is reported together; a gate or tolerance on a metric the case does not
//! produce is a parse-time error; nothing here touches a model.

use crate::core::case::{Decide, Gate, Level, Metric, Tolerance};
use crate::core::error::{Error, Result};
use crate::core::fsutil::sha256_bytes;
use crate::core::outcome::PREREG_METRICS;
use crate::core::parse::{nearest, parse_toml, Diagnostics};
use crate::core::Case;
use crate::kinds::{Parsed, KINDS};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use toml::Spanned;

/// The keys every case shares (the kind's own keys are its parser's).
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    description: String,
    models: Spanned<Vec<Spanned<String>>>,
    reference: Option<Spanned<String>>,
    prereg: Option<Spanned<String>>,
    #[serde(default)]
    gate: Vec<GateFile>,
    #[serde(default)]
    tolerance: BTreeMap<String, Spanned<Tolerance>>,
    decide: Option<Spanned<DecideFile>>,
}

/// `[decide]`: the sequential design.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideFile {
    sequential: bool,
    alpha: Option<Spanned<f64>>,
    seed: Option<u64>,
    #[serde(default)]
    bounds: BTreeMap<String, Spanned<Vec<f64>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GateFile {
    metric: Spanned<String>,
    max: Option<f64>,
    min: Option<f64>,
    on: Option<Spanned<String>>,
    level: Option<Spanned<String>>,
    models: Option<Spanned<Vec<String>>>,
}

#[derive(Deserialize)]
struct KindOnly {
    kind: Option<Spanned<String>>,
}

/// What the command line puts in place of a case's own models and reference.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Overrides {
    /// Run the case on these aliases instead of the models it lists
    /// (a preregistered case keeps its sealed ones).
    pub models: Option<Vec<String>>,
    /// The reference model of a case that names one (not of a
    /// preregistered case).
    pub reference: Option<String>,
}

/// Parse the case at `file`; `name` is its test-name stem, `path` how
/// messages show the file (`suites/<rel>`).
pub fn parse_case(file: &Path, path: &Path, name: &str) -> Result<Parsed> {
    parse_case_with(file, path, name, &Overrides::default())
}

/// The aliases a case's model entry names: a registry alias, or with
/// `path:` local files (relative to the case file, globs allowed), pinned in
/// the lock beside the registry that holds the case.
fn resolve_models(file: &Path, spec: &str) -> Result<Vec<String>> {
    if !spec.starts_with("path:") {
        return Ok(vec![spec.to_string()]);
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    let registry = dir
        .ancestors()
        .map(|d| d.join("models.toml"))
        .find(|r| r.is_file())
        .ok_or_else(|| {
            Error::input(format!(
                "`{spec}`: no models.toml above the case to pin the file beside"
            ))
        })?;
    let reg = crate::models::Registry::load(&registry)?;
    let files = crate::models::local::expand(spec, dir)?;
    crate::models::local::pin(&registry, &reg.own_aliases(), &files, false)
}

/// [`parse_case`] with the command line's [`Overrides`].
pub fn parse_case_with(
    file: &Path,
    path: &Path,
    name: &str,
    overrides: &Overrides,
) -> Result<Parsed> {
    let bytes =
        std::fs::read(file).map_err(|e| Error::input(format!("{}: {e}", path.display())))?;
    let src = std::str::from_utf8(&bytes)
        .map_err(|e| Error::input(format!("{}: not UTF-8: {e}", path.display())))?;
    let mut diag = Diagnostics::new(path, src);
    let names = crate::kinds::names().join(", ");
    // `kind` picks the schema; read it leniently first.
    let kind = toml::from_str::<KindOnly>(src).ok().and_then(|k| k.kind);
    let Some(kind) = kind else {
        // Let the full parser report syntax errors first.
        parse_toml::<toml::Table>(path, src)?;
        return Err(Error::input(format!(
            "{}: missing key `kind` (one of {names})",
            path.display()
        )));
    };
    let Some(&(kind_name, parse_kind, _)) = KINDS.iter().find(|(n, _, _)| n == kind.get_ref())
    else {
        return Err(Error::input(format!(
            "{}: kind: `{}` is not one of {names}",
            diag.at(kind.span().start),
            kind.get_ref()
        )));
    };
    let head: Head = parse_toml(path, src)?;
    if head.models.get_ref().is_empty() {
        diag.push_at(
            head.models.span().start,
            "models: list at least one model alias",
        );
    }
    let sealed = head.prereg.is_some();
    let cli = crate::core::case::Location("command line".into());
    let models = match &overrides.models {
        Some(m) if !sealed => m.iter().map(|a| (a.clone(), cli.clone())).collect(),
        _ => {
            let mut out: Vec<(String, crate::core::case::Location)> = Vec::new();
            for m in head.models.get_ref() {
                match resolve_models(file, m.get_ref()) {
                    Ok(aliases) => {
                        for a in aliases {
                            // Listed twice, it would run twice as one test name.
                            if let Some((_, first)) = out.iter().find(|(b, _)| *b == a) {
                                diag.push_at(
                                    m.span().start,
                                    format!("models: `{a}` is listed twice (first at {first})"),
                                );
                            } else {
                                out.push((a, diag.at(m.span().start)));
                            }
                        }
                    }
                    Err(e) => diag.push_at(m.span().start, format!("models: {e}")),
                }
            }
            out
        }
    };
    let reference = match (&head.reference, &overrides.reference) {
        (Some(_), Some(r)) if !sealed => Some((r.clone(), cli.clone())),
        (Some(r), _) => match resolve_models(file, r.get_ref()) {
            Ok(a) if a.len() == 1 => Some((a[0].clone(), diag.at(r.span().start))),
            Ok(a) => {
                diag.push_at(
                    r.span().start,
                    format!(
                        "reference: `{}` names {} models; name one",
                        r.get_ref(),
                        a.len()
                    ),
                );
                None
            }
            Err(e) => {
                diag.push_at(r.span().start, format!("reference: {e}"));
                None
            }
        },
        (None, _) => None,
    };
    let mut case = Case {
        name: name.to_string(),
        path: file.to_path_buf(),
        content_sha256: sha256_bytes(&bytes),
        kind: kind_name,
        description: head.description.clone(),
        models,
        reference,
        gates: Vec::new(),
        tolerances: BTreeMap::new(),
        prereg: head.prereg.as_ref().map(|p| {
            (
                crate::core::case::beside(file, p.get_ref()),
                diag.at(p.span().start),
            )
        }),
        metrics: Vec::new(),
        pins: Vec::new(),
        windows: None,
        decide: head
            .decide
            .as_ref()
            .and_then(|d| decide(d, &head.gate, head.prereg.is_some(), &mut diag)),
    };
    let kind = parse_kind(&case, src, &mut diag)?;
    case.metrics = kind.declared();
    case.pins = kind.pins();
    case.windows = kind.windows();
    if let Some(p) = &head.prereg {
        if case.reference.is_none() {
            diag.push_at(
                p.span().start,
                "prereg: a preregistered comparison needs `reference` (its baseline model)",
            );
        }
        case.metrics
            .extend(PREREG_METRICS.iter().map(|m| Metric::count(*m)));
    }
    let why_not = |m: &str| kind.why_not(m);
    // A gate's `models` must match a model of the case as written (with
    // models from the command line, any may match none).
    let aliases: Option<Vec<&str>> = overrides
        .models
        .is_none()
        .then(|| case.models.iter().map(|(a, _)| a.as_str()).collect());
    case.gates = gates(
        &head.gate,
        &case.metrics,
        kind_name,
        &why_not,
        aliases.as_deref(),
        &mut diag,
    );
    if let Some(file) = &head.decide {
        let at = diag.at(file.span().start);
        sequential_gates(
            &mut case,
            (&kind.sequential_metrics(), kind.sequential_unit()),
            &head.gate,
            &at,
            &mut diag,
        );
    }
    let metrics: Vec<String> = case.metric_names();
    let metrics: Vec<&str> = metrics.iter().map(String::as_str).collect();
    case.tolerances = tolerances(&head.tolerance, &metrics, &mut diag);
    diag.finish(Parsed {
        case: std::sync::Arc::new(case),
        kind,
    })
}

/// The gates of a case whose kind declares `declared`: each gate's metric
/// and, with `on`, the bound of an interval the metric declares; its
/// `level` (`fail` or `warn`) and the `models` it applies to (globs, each
/// matching one of `aliases` when given).
fn gates(
    files: &[GateFile],
    declared: &[Metric],
    kind: &str,
    why_not: &dyn Fn(&str) -> Option<&'static str>,
    aliases: Option<&[&str]>,
    diag: &mut Diagnostics,
) -> Vec<Gate> {
    let metrics: Vec<&str> = declared.iter().map(|m| m.name.as_str()).collect();
    let mut gates = Vec::new();
    for (i, g) in files.iter().enumerate() {
        let m = g.metric.get_ref();
        let decl = declared.iter().find(|d| &d.name == m);
        if decl.is_none() {
            let hint = nearest(m, metrics.iter().copied())
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            let why = why_not(m).unwrap_or_default();
            diag.push_at(
                g.metric.span().start,
                format!(
                    "gate[{i}].metric: `{m}` is not a metric of a {kind} case{why}{hint}; metrics: {}",
                    metrics.join(", ")
                ),
            );
        }
        match (g.min, g.max) {
            (None, None) => diag.push_at(
                g.metric.span().start,
                format!("gate[{i}]: give `max`, `min` or both"),
            ),
            (Some(lo), Some(hi)) if lo > hi => diag.push_at(
                g.metric.span().start,
                format!("gate[{i}]: min {lo} > max {hi}: no value passes"),
            ),
            _ => {}
        }
        let intervals = decl.map_or(&[][..], |d| &d.intervals[..]);
        let mut read = m.clone();
        if let (Some(on), Some(_)) = (&g.on, decl) {
            let bound = intervals
                .iter()
                .find_map(|iv| match on.get_ref().rsplit_once('_') {
                    Some((name, "lo")) if name == iv.name => Some(iv.lo.clone()),
                    Some((name, "hi")) if name == iv.name => Some(iv.hi.clone()),
                    _ => None,
                });
            match bound {
                Some(b) => read = b,
                None if intervals.is_empty() => diag.push_at(
                    on.span().start,
                    format!(
                        "gate[{i}].on: `{m}` has no `{}` bound (its kind declares no interval of it)",
                        on.get_ref()
                    ),
                ),
                None => diag.push_at(
                    on.span().start,
                    format!(
                        "gate[{i}].on: `{}` is not one of {}",
                        on.get_ref(),
                        intervals
                            .iter()
                            .flat_map(|iv| [format!("{}_lo", iv.name), format!("{}_hi", iv.name)])
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
            }
        }
        let level = match g.level.as_ref().map(|l| (l, l.get_ref().as_str())) {
            None | Some((_, "fail")) => Level::Fail,
            Some((_, "warn")) => Level::Warn,
            Some((l, other)) => {
                diag.push_at(
                    l.span().start,
                    format!("gate[{i}].level: `{other}` is not one of \"fail\", \"warn\""),
                );
                Level::Fail
            }
        };
        let models = g.models.as_ref().map_or(Vec::new(), |ms| {
            if ms.get_ref().is_empty() {
                diag.push_at(
                    ms.span().start,
                    format!(
                        "gate[{i}].models: empty; leave `models` out for a gate on every model"
                    ),
                );
            }
            for pattern in ms.get_ref() {
                match globset::Glob::new(pattern.strip_prefix('!').unwrap_or(pattern)) {
                    Err(e) => diag.push_at(
                        ms.span().start,
                        format!("gate[{i}].models: error parsing glob '{pattern}': {e}"),
                    ),
                    Ok(glob) => {
                        let matcher = glob.compile_matcher();
                        if let Some(aliases) = aliases.filter(|a| !a.iter().any(|a| matcher.is_match(a))) {
                            diag.push_at(
                                ms.span().start,
                                format!(
                                    "gate[{i}].models: '{pattern}' matches none of the case's models ({})",
                                    aliases.join(", ")
                                ),
                            );
                        }
                    }
                }
            }
            ms.get_ref().clone()
        });
        gates.push(Gate {
            metric: m.clone(),
            max: g.max,
            min: g.min,
            on: g.on.as_ref().map(|o| o.get_ref().clone()),
            read,
            interval: intervals.iter().find(|iv| iv.name == "ci95").cloned(),
            level,
            models,
            about: decl.and_then(|d| Some((d.label?, d.unit))),
        });
    }
    gates
}

/// The sequential design of `[decide]` (None when `sequential = false`,
/// its keys still checked): alpha in (0, 0.5], a seed, finite bounds with
/// lo < hi for gated metrics only.
fn decide(
    file: &Spanned<DecideFile>,
    gate_files: &[GateFile],
    prereg: bool,
    diag: &mut Diagnostics,
) -> Option<Decide> {
    let at = diag.at(file.span().start);
    let d = file.get_ref();
    let alpha = d.alpha.as_ref().map_or(0.05, |a| *a.get_ref());
    if let Some(a) = &d.alpha {
        if let Some(why) = Decide::alpha_problem("decide.alpha", alpha) {
            diag.push_at(a.span().start, why);
        }
    }
    if d.sequential && d.seed.is_none() {
        diag.push(
            &at,
            "decide.seed: a sequential design names the seed of its window order \
             (a number, part of the reviewed design)",
        );
    }
    let mut bounds = BTreeMap::new();
    for (m, b) in &d.bounds {
        let place = diag.at(b.span().start);
        match Decide::bounds_problem(&format!("decide.bounds.{m}"), b.get_ref()) {
            None => {
                bounds.insert(m.clone(), (b.get_ref()[0], b.get_ref()[1]));
            }
            Some(why) => diag.push(&place, why),
        }
        if !gate_files.iter().any(|g| g.metric.get_ref() == m) && !prereg {
            diag.push(
                &place,
                format!(
                    "decide.bounds.{m}: no gate is on `{m}`; bounds are declared for gated metrics"
                ),
            );
        }
    }
    d.sequential.then(|| Decide {
        alpha,
        seed: d.seed.unwrap_or(0),
        bounds,
        at,
        stops: Vec::new(),
    })
}

/// A sequential case's gates: each on a metric its kind can decide window
/// by window (`sequential`), one-sided, with declared bounds; each then
/// reads its metric's confidence-sequence bound at the stop (`seq_hi` for
/// a `max`, `seq_lo` for a `min`), which the case adds to its metrics.
fn sequential_gates(
    case: &mut Case,
    (sequential, unit): (&[&'static str], &str),
    files: &[GateFile],
    at: &crate::core::Location,
    diag: &mut Diagnostics,
) {
    let Some(d) = case.decide.clone() else { return };
    if sequential.is_empty() {
        diag.push(
            at,
            format!(
                "decide.sequential: a {} case cannot decide its gates sequentially \
                 (perplexity cases with a reference, kld and multiple_choice cases can, on \
                 their means over windows or tasks)",
                case.kind
            ),
        );
        return;
    }
    if case.gates.is_empty() && case.prereg.is_none() {
        diag.push(
            at,
            "decide.sequential: the case has no gate (nor preregistered rule) to decide",
        );
    }
    let mut added = Vec::new();
    for (i, (g, f)) in case.gates.iter_mut().zip(files).enumerate() {
        let place = diag.at(f.metric.span().start);
        if !sequential.contains(&g.metric.as_str()) {
            diag.push(
                &place,
                format!(
                    "gate[{i}].metric: `{}` is not a mean over {unit}s, so it cannot be decided \
                     sequentially; a sequential {} case gates {} (gate the others in a fixed-N case)",
                    g.metric,
                    case.kind,
                    sequential.join(", ")
                ),
            );
            continue;
        }
        if let Some(on) = &f.on {
            diag.push_at(
                on.span().start,
                format!(
                    "gate[{i}].on: a sequential gate is decided on its mean's confidence \
                     sequence; remove `on = \"{}\"`",
                    on.get_ref()
                ),
            );
        }
        let side = match (g.max, g.min) {
            (Some(_), None) => "hi",
            (None, Some(_)) => "lo",
            _ => {
                diag.push(
                    &place,
                    format!("gate[{i}]: a sequential gate has one bound, `max` or `min`"),
                );
                continue;
            }
        };
        if !d.bounds.contains_key(&g.metric) {
            diag.push(
                &d.at,
                format!(
                    "decide.bounds: no bounds for `{}` (gate[{i}]); declare the range every \
                     window's value lies in, e.g. {} = [-0.5, 0.5]",
                    g.metric, g.metric
                ),
            );
        }
        let [lo, hi] = Decide::bound_metrics(&g.metric);
        g.on = Some(format!("seq_{side}"));
        g.read = if side == "hi" { hi.clone() } else { lo.clone() };
        g.interval = Some(crate::core::case::Interval {
            name: "seq".into(),
            lo: lo.clone(),
            hi: hi.clone(),
            windows: Some(format!("{unit}s")),
        });
        if !added.contains(&lo) {
            added.extend([lo, hi]);
        }
    }
    // A preregistered rule reads the sequence of every metric with bounds.
    for m in d.bounds.keys() {
        let [lo, hi] = Decide::bound_metrics(m);
        if sequential.contains(&m.as_str()) && !added.contains(&lo) {
            added.extend([lo, hi]);
        } else if !sequential.contains(&m.as_str()) {
            diag.push(
                &d.at,
                format!(
                    "decide.bounds.{m}: `{m}` cannot be decided sequentially; a sequential {} \
                     case decides {}",
                    case.kind,
                    sequential.join(", ")
                ),
            );
        }
    }
    // A sequence's bounds compare with their golden as their metric does.
    let added: Vec<Metric> = added
        .into_iter()
        .map(|name| {
            let base = name
                .strip_suffix("_seq_lo")
                .or_else(|| name.strip_suffix("_seq_hi"))
                .unwrap_or(&name);
            let declared = case
                .metrics
                .iter()
                .find(|m| m.name == base)
                .and_then(|m| m.tolerance);
            match declared {
                Some((t, why)) => Metric::float(name).with_tolerance(t, why),
                None => Metric::float(name),
            }
        })
        .collect();
    case.metrics.extend(added);
    case.metrics.push(Metric::count(format!("{unit}s_total")));
}

/// Tolerances by metric (`default` for the rest).
fn tolerances(
    files: &BTreeMap<String, Spanned<Tolerance>>,
    metrics: &[&str],
    diag: &mut Diagnostics,
) -> BTreeMap<String, Tolerance> {
    let mut out = BTreeMap::new();
    for (k, t) in files {
        let v = t.get_ref();
        if k != "default" && !metrics.contains(&k.as_str()) {
            diag.push_at(
                t.span().start,
                format!(
                    "tolerance.{k}: `{k}` is not a metric of this case; metrics: default, {}",
                    metrics.join(", ")
                ),
            );
        }
        if v.atol < 0.0 || v.rtol < 0.0 {
            diag.push_at(
                t.span().start,
                format!("tolerance.{k}: atol and rtol must be ≥ 0"),
            );
        }
        out.insert(k.clone(), *v);
    }
    out
}

#[cfg(test)]
mod tests;
