//! `quantgate prereg seal|verify|report`: preregistered decision rules.

use super::args::{PreregAction, PreregArgs};
use super::{Conclusion, Ctx};
use quantgate::core::Error;
use quantgate::judge::prereg;
use std::path::Path;

/// Run `quantgate prereg …`.
pub fn run(ctx: &Ctx, a: PreregArgs) -> Result<Conclusion, Error> {
    match a.action {
        PreregAction::Seal { file } => seal(ctx, &file),
        PreregAction::Verify => verify(ctx, &a.dir, &a.goldens),
        PreregAction::Report => {
            let (text, ok) = quantgate::report::prereg::report(&a.dir, &ctx.suites, &a.goldens)?;
            print!("{text}");
            Ok(if ok {
                Conclusion::Pass
            } else {
                Conclusion::Unusable
            })
        }
    }
}

/// Check `file` against the suites, then seal it: a sealed file is final.
fn seal(ctx: &Ctx, file: &Path) -> Result<Conclusion, Error> {
    let p = prereg::parse(file)?;
    let case_file = ctx.suites.join(format!("{}.toml", p.case.0));
    let case = quantgate::plan::parse::parse_case(&case_file, &case_file, &p.case.0)
        .map_err(|e| e.context(format!("{}: case", p.case.1)))?
        .case;
    let registry = ctx.registry()?;
    for (alias, at) in [&p.candidate, &p.baseline] {
        registry.entry(alias).map_err(|e| e.context(at))?;
    }
    prereg::check_case(&p, &case)?;
    let line = prereg::seal(file, prereg::now_unix())?;
    println!(
        "sealed {} {} at {} (ledger line {}); commit prereg/ before the first run",
        line.path, line.sha256, line.time, line.line_no
    );
    Ok(Conclusion::Pass)
}

/// Every prereg, the ledger chain and the git history.
fn verify(ctx: &Ctx, dir: &Path, goldens: &Path) -> Result<Conclusion, Error> {
    let (checked, unsealed) = prereg::verify_all(dir, &ctx.suites, goldens)?;
    let mut bad = !unsealed.is_empty();
    for u in &unsealed {
        eprintln!("error: {u}");
    }
    for c in &checked {
        if c.problems.is_empty() {
            println!(
                "ok   {} {} sealed {}{}",
                c.line.path,
                c.line.sha256,
                c.line.time,
                c.commit
                    .as_ref()
                    .map(|h| format!(" in commit {}", &h[..12]))
                    .unwrap_or_else(|| " (not a git checkout: history not checked)".into())
            );
        } else {
            bad = true;
            println!("FAIL {}", c.line.path);
            for p in &c.problems {
                eprintln!("error: {p}");
            }
        }
    }
    Ok(if bad {
        Conclusion::Unusable
    } else {
        Conclusion::Pass
    })
}
