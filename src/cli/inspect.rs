//! `quantgate inspect`: what GGUF files (or registry aliases) are.

use super::args::InspectArgs;
use super::{said, Conclusion, Ctx};
use quantgate::core::Error;
use quantgate::models::Registry;
use std::path::{Path, PathBuf};

/// A target as a file: a path as given, or a registry alias fetched or
/// derived and verified (with its pinned sha256).
fn resolve(
    ctx: &Ctx,
    registry: &mut Option<Registry>,
    t: &str,
) -> Result<(PathBuf, Option<String>), Error> {
    let path = Path::new(t);
    if path.exists() || t.ends_with(".gguf") || t.contains('/') {
        return Ok((path.to_path_buf(), None));
    }
    let reg = match registry {
        Some(r) => &*r,
        None => &*registry.insert(ctx.registry()?),
    };
    let v = ctx.ensure(reg, t)?;
    Ok((v.file.path.clone(), Some(v.file.sha256)))
}

/// Run `quantgate inspect`: each target in turn; a target that cannot be
/// inspected is said and the rest go on.
pub fn run(ctx: &Ctx, a: InspectArgs) -> Result<Conclusion, Error> {
    let mut registry = None;
    let mut all = Vec::new();
    let mut end = Conclusion::Pass;
    for t in &a.targets {
        let inspected = resolve(ctx, &mut registry, t).and_then(|(path, sha)| {
            quantgate::models::inspect::inspect(&path, true).map(|i| (sha, i))
        });
        match inspected {
            Ok((sha, i)) if a.json => {
                let mut v = i.to_json();
                v["target"] = t.clone().into();
                v["sha256"] = sha.into();
                all.push(v);
            }
            Ok((sha, i)) => {
                print!("{}", i.render(t));
                if let Some(sha) = sha {
                    println!("  sha256         {sha} (pinned, verified)");
                }
                println!();
            }
            Err(e) => end = end.max(said(&e)),
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).expect("JSON of plain values")
        );
    }
    Ok(end)
}
