//! The standard release cases `quantgate init` writes: one per kind that
//! gates a quant against its reference (paired ΔNLL, KLD with its flips,
//! multiple choice with its flips, speed), each file documenting its gate.
//! They live with the kinds, which declare the metrics they gate.

/// The case files under `suites/release/`, by name: `models` against
/// `reference` (as the cases name them), the corpus `text` (a file under
/// `suites/data/`) with its sha256, and the multiple-choice tasks' sha256
/// (`suites/data/mc-computed.bin`).
pub fn cases(
    models: &[String],
    reference: &str,
    text: &str,
    text_sha256: &str,
    tasks_sha256: &str,
) -> Vec<(&'static str, String)> {
    vec![
        (
            "delta_nll.toml",
            delta_nll(models, reference, text, text_sha256),
        ),
        ("kld.toml", kld(models, reference, text, text_sha256)),
        ("mc.toml", mc(models, reference, tasks_sha256)),
        ("speed.toml", speed(models, reference)),
    ]
}

fn list(models: &[String]) -> String {
    models
        .iter()
        .map(|m| format!("{m:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn windows(text: &str, sha: &str) -> String {
    format!(
        "[text]\npath = \"../data/{text}\"\nsha256 = \"{sha}\"\n\n\
         # llama-perplexity's windows: n_ctx tokens, the second half of each scored.\n\
         # More chunks give a tighter interval (and take longer).\n\
         [window]\nmode = \"llama-perplexity\"\nn_ctx = 512\nchunks = 16\n"
    )
}

fn delta_nll(models: &[String], reference: &str, text: &str, sha: &str) -> String {
    format!(
        "# The release gate: the mean paired ΔNLL (quant − reference, per window of\n\
         # identical tokens) stays ≤ +0.05 nats/token.\n\
         kind = \"perplexity\"\ndescription = \"paired ΔNLL against the reference\"\n\
         models = [{}]\nreference = {reference:?}\n\n{}\n\
         [[gate]]\nmetric = \"delta_nll_mean\"\nmax = 0.05\n",
        list(models),
        windows(text, sha)
    )
}

fn kld(models: &[String], reference: &str, text: &str, sha: &str) -> String {
    format!(
        "# KL(reference ‖ quant) per scored position on the same windows (one decode\n\
         # with delta_nll), top-1 agreement and the flips where the reference is sure.\n\
         kind = \"kld\"\ndescription = \"KL divergence, same top, flips against the reference\"\n\
         models = [{}]\nreference = {reference:?}\n\n{}\n\
         [[gate]]\nmetric = \"kld_mean\"\nmax = 0.1\n\n\
         [[gate]]\nmetric = \"kld_p99\"\nmax = 0.5\n",
        list(models),
        windows(text, sha)
    )
}

fn mc(models: &[String], reference: &str, sha: &str) -> String {
    format!(
        "# 64 computed questions (sums, products, digits of π, unit conversions) in\n\
         # llama-perplexity's --multiple-choice format: the answers the reference gets\n\
         # right and the quant gets wrong, and McNemar's p of the flips.\n\
         kind = \"multiple_choice\"\ndescription = \"multiple choice against the reference\"\n\
         models = [{}]\nreference = {reference:?}\nn_ctx = 512\n\n\
         [tasks_file]\npath = \"../data/mc-computed.bin\"\nsha256 = \"{sha}\"\n\n\
         [[gate]]\nmetric = \"flips_right_to_wrong\"\nmax = 10\n",
        list(models)
    )
}

fn speed(models: &[String], reference: &str) -> String {
    format!(
        "# Prompt processing and generation speed against the reference, measured\n\
         # apart in rotated rounds on this machine: a quant should not generate slower\n\
         # than its reference (lower `min` on machines where it may).\n\
         kind = \"speed\"\ndescription = \"speed against the reference\"\n\
         models = [{}]\nreference = {reference:?}\npp = 256\ntg = 32\nrepetitions = 3\nrounds = 3\n\n\
         [[gate]]\nmetric = \"tg_ratio_vs_ref\"\nmin = 1.0\n",
        list(models)
    )
}
