//! `quantgate tokenize`: the token ids of a text file, one per line.

use super::args::TokenizeArgs;
use super::{Conclusion, Ctx};
use quantgate::core::Error;
use quantgate::engine::BosPolicy;
use quantgate::execute::RunContext;

/// Run `quantgate tokenize`.
pub fn run(ctx: &Ctx, a: TokenizeArgs) -> Result<Conclusion, Error> {
    let registry = ctx.registry()?;
    let bos = match a.bos.as_str() {
        "model" => BosPolicy::Model,
        "always" => BosPolicy::Always,
        "never" => BosPolicy::Never,
        other => {
            return Err(Error::input(format!(
                "--bos: `{other}` is not one of model, always, never"
            )))
        }
    };
    let runner = RunContext::new(&ctx.config, registry, ctx.engine.clone(), 1);
    let text = std::fs::read_to_string(&a.file)
        .map_err(|e| Error::input(format!("{}: {e}", a.file.display())))?;
    let (_, model) = runner.load(&a.model)?;
    for t in model
        .tokenize(&text, bos)?
        .iter()
        .take(a.limit.unwrap_or(usize::MAX))
    {
        println!("{}", t.id);
    }
    Ok(Conclusion::Pass)
}
