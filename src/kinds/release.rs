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

fn windows(text: &str, sha: &str, chunks: usize) -> String {
    format!(
        "[text]\npath = \"../data/{text}\"\nsha256 = \"{sha}\"\n\n\
         # llama-perplexity's windows: n_ctx tokens, the second half of each scored.\n\
         # More chunks give a tighter interval (and take longer).\n\
         [window]\nmode = \"llama-perplexity\"\nn_ctx = 512\nchunks = {chunks}\n"
    )
}

fn delta_nll(models: &[String], reference: &str, text: &str, sha: &str) -> String {
    format!(
        "# The release gate: the mean paired ΔNLL (quant − reference, per window of\n\
         # identical tokens) over 80 windows stays ≤ +0.05 nats/token, decided\n\
         # sequentially: the windows are visited in a seeded random order and each\n\
         # quant stops once the anytime-valid confidence sequence for its 80-window\n\
         # mean lies below (pass) or above (fail) +0.05; the reference is decoded only\n\
         # for windows a quant still needs. Each verdict is wrong with probability\n\
         # ≤ alpha; a quant near the threshold runs all 80 windows, and its verdict is\n\
         # then the fixed-N one. Remove [decide] to score every window.\n\
         kind = \"perplexity\"\ndescription = \"paired ΔNLL against the reference, decided sequentially\"\n\
         models = [{}]\nreference = {reference:?}\n\n{}\n\
         # Why +0.05: about a 5% rise in perplexity, the loss most readers of a\n\
         # quant's card still call \"close to the original\".\n\
         [[gate]]\nmetric = \"delta_nll_mean\"\nmax = 0.05\n\n\
         # A quant expected to be worse (a 2-bit one, say) can have a threshold of\n\
         # its own, reported as a warning (⚠ on the card) that does not fail the\n\
         # test: add models = [\"!*Q2_K*\"] to the gate above, and\n\
         # [[gate]]\n# metric = \"delta_nll_mean\"\n# max = 0.25\n# level = \"warn\"\n\
         # models = [\"*Q2_K*\"]\n\n\
         # alpha: each verdict's error level; seed: the window order (the one quantgate's\n\
         # own sequential cases use: on its fixture ladder Q8_0 stops at window 31 of 80,\n\
         # Q6_K at 36, Q2_K at 11, as its book says); bounds: the range every window's\n\
         # ΔNLL is declared to lie in (a window outside it stops the sequential rule: the\n\
         # case then runs all windows and says why).\n\
         [decide]\nsequential = true\nalpha = 0.05\nseed = 20261203\n\n\
         [decide.bounds]\ndelta_nll_mean = [-0.5, 0.5]\n",
        list(models),
        windows(text, sha, 80)
    )
}

fn kld(models: &[String], reference: &str, text: &str, sha: &str) -> String {
    format!(
        "# KL(reference ‖ quant) per scored position over the first 16 windows, top-1\n\
         # agreement and the flips where the reference is sure.\n\
         kind = \"kld\"\ndescription = \"KL divergence, same top, flips against the reference\"\n\
         models = [{}]\nreference = {reference:?}\n\n{}\n\
         # Why 0.1 nats: a mean KL past it goes with a top token that differs from the\n\
         # reference's at several percent of positions (llama.cpp's Q3-and-below range).\n\
         [[gate]]\nmetric = \"kld_mean\"\nmax = 0.1\n\n\
         # Why 0.5 nats at p99: the mean hides rare, large departures; one position in\n\
         # a hundred may move this far from the reference, no more.\n\
         [[gate]]\nmetric = \"kld_p99\"\nmax = 0.5\n",
        list(models),
        windows(text, sha, 16)
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
         # Why 10: at most 10 of the 64 questions the reference answers right may the\n\
         # quant answer wrong (about one in six), whatever it gains elsewhere.\n\
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
         # Why 1.0: a quant that generates slower than its reference loses the reason\n\
         # to use it; the ratio is of means over rotated rounds on one machine.\n\
         [[gate]]\nmetric = \"tg_ratio_vs_ref\"\nmin = 1.0\n",
        list(models)
    )
}
