//! The `[text]`/`[tokens]`, `[window]` and `[bootstrap]` tables, parsed
//! and checked with every error positioned.

use super::*;

/// `[text]`: a text, tokenized by the model.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextFile {
    path: Spanned<String>,
    sha256: Spanned<String>,
    #[serde(default)]
    bos: Option<BosPolicy>,
}

/// `[tokens]` (and the other pinned-file tables): a path and its sha256.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedFile {
    path: Spanned<String>,
    sha256: Spanned<String>,
}

impl PinnedFile {
    /// The pin, checked for form (64 hex digits) into `diag`.
    pub(crate) fn pin(&self, table: &'static str, case: &Case, diag: &mut Diagnostics) -> Pin {
        if let Some(msg) = bad_sha(&format!("{table}.sha256"), self.sha256.get_ref()) {
            diag.push_at(self.sha256.span().start, msg);
        }
        Pin {
            table,
            path: beside(&case.path, self.path.get_ref()),
            sha256: self.sha256.get_ref().clone(),
            at: diag.at(self.sha256.span().start),
        }
    }

    /// Where its sha256 is written.
    pub(crate) fn at(&self) -> usize {
        self.sha256.span().start
    }
}

/// `[window]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowFile {
    mode: Spanned<String>,
    n_ctx: Option<Spanned<u32>>,
    chunks: Option<Spanned<usize>>,
    skip: Option<Spanned<usize>>,
    stride: Option<Spanned<u32>>,
    length: Option<Spanned<u32>>,
    starts: Option<Spanned<Vec<usize>>>,
    n_batch: Option<Spanned<u32>>,
}

/// `[bootstrap]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapFile {
    seed: Option<u64>,
    resamples: Option<Spanned<usize>>,
    block: Option<usize>,
}

pub(crate) const MODES: &[&str] = &["llama-perplexity", "strided", "resets"];

/// Line and column (1-based) of the `index`-th whitespace-separated word.
pub(crate) fn token_position(src: &str, index: usize) -> (usize, usize) {
    let mut k = 0;
    for (l, line) in src.lines().enumerate() {
        let mut col = 0;
        for word in line.split_whitespace() {
            col = line[col..].find(word).map_or(col, |i| col + i);
            if k == index {
                return (l + 1, col + 1);
            }
            col += word.len();
            k += 1;
        }
    }
    (0, 0)
}

impl ScoredText {
    /// Parse the `[text]`/`[tokens]`, `[window]` and `[bootstrap]` tables.
    pub fn parse(
        case: &Case,
        text: Option<&TextFile>,
        tokens: Option<&PinnedFile>,
        window: &Spanned<WindowFile>,
        bootstrap: Option<&BootstrapFile>,
        diag: &mut Diagnostics,
    ) -> Result<ScoredText> {
        let (source, pin) = match (text, tokens) {
            (Some(t), None) => {
                let file = PinnedFile {
                    path: t.path.clone(),
                    sha256: t.sha256.clone(),
                };
                (
                    Source::Text(t.bos.unwrap_or(BosPolicy::Model)),
                    file.pin("text", case, diag),
                )
            }
            (None, Some(t)) => (Source::TokenIds, t.pin("tokens", case, diag)),
            _ => {
                return Err(Error::input(format!(
                "{}: give exactly one of [text] (a text to tokenize) or [tokens] (a token-id file)",
                diag.path().display()
            )))
            }
        };
        let w = window.get_ref();
        let mode = w.mode.get_ref().as_str();
        let mode_at = diag.at(w.mode.span().start);
        // Which keys each mode takes.
        let allowed: &[&str] = match mode {
            "llama-perplexity" => &["n_ctx", "chunks", "skip", "n_batch"],
            "strided" => &["n_ctx", "stride", "chunks", "n_batch"],
            "resets" => &["length", "starts", "n_batch"],
            _ => {
                diag.push(
                    &mode_at,
                    format!("window.mode: `{mode}` is not one of {}", MODES.join(", ")),
                );
                &[]
            }
        };
        let present: [(&str, Option<usize>); 7] = [
            ("n_ctx", w.n_ctx.as_ref().map(|v| v.span().start)),
            ("skip", w.skip.as_ref().map(|v| v.span().start)),
            ("chunks", w.chunks.as_ref().map(|v| v.span().start)),
            ("stride", w.stride.as_ref().map(|v| v.span().start)),
            ("length", w.length.as_ref().map(|v| v.span().start)),
            ("starts", w.starts.as_ref().map(|v| v.span().start)),
            ("n_batch", w.n_batch.as_ref().map(|v| v.span().start)),
        ];
        if MODES.contains(&mode) {
            for (key, pos) in present {
                if let Some(pos) = pos.filter(|_| !allowed.contains(&key)) {
                    diag.push_at(
                        pos,
                        format!(
                            "window.{key}: not used by mode = \"{mode}\" (it takes {})",
                            allowed.join(", ")
                        ),
                    );
                }
            }
            if mode == "resets" && matches!(source, Source::Text(_)) {
                diag.push(
                    &mode_at,
                    "window.mode: `resets` scores a pinned token-id file: use [tokens], not [text]",
                );
            }
        }
        // Errors about values come after the errors about keys.
        let mut later: Vec<(Location, String)> = Vec::new();
        let need =
            |v: &Option<Spanned<u32>>, key: &str, later: &mut Vec<(Location, String)>| match v {
                Some(v) => *v.get_ref(),
                None => {
                    later.push((
                        mode_at.clone(),
                        format!("window: mode = \"{mode}\" needs `{key}`"),
                    ));
                    0
                }
            };
        let chunks = w.chunks.as_ref().map(|c| *c.get_ref());
        if let Some(c) = w.chunks.as_ref().filter(|c| *c.get_ref() == 0) {
            later.push((
                diag.at(c.span().start),
                "window.chunks: must be ≥ 1 (zero windows)".into(),
            ));
        }
        let windowing = match mode {
            "strided" => {
                let n_ctx = need(&w.n_ctx, "n_ctx", &mut later);
                let stride = need(&w.stride, "stride", &mut later);
                if let Some(s) = &w.stride {
                    // The first scored row is context − stride − 1, and llama-perplexity
                    // refuses a stride beyond the context it was given.
                    if stride == 0 || stride > n_ctx {
                        later.push((
                            diag.at(s.span().start),
                            format!(
                                "window.stride: {stride} must be between 1 and n_ctx ({n_ctx})"
                            ),
                        ));
                    }
                }
                Windowing::Strided {
                    n_ctx,
                    stride,
                    chunks,
                }
            }
            "resets" => {
                let length = need(&w.length, "length", &mut later);
                let starts = match &w.starts {
                    Some(s) if s.get_ref().is_empty() => {
                        later.push((
                            diag.at(s.span().start),
                            "window.starts: list at least one start (zero windows)".into(),
                        ));
                        Vec::new()
                    }
                    Some(s) => s.get_ref().clone(),
                    None => {
                        later.push((
                            mode_at.clone(),
                            "window: mode = \"resets\" needs `starts`".into(),
                        ));
                        Vec::new()
                    }
                };
                if !(2..=MAX_CONTEXT).contains(&length) && w.length.is_some() {
                    later.push((
                        mode_at.clone(),
                        format!("window.length: {length} must be between 2 and {MAX_CONTEXT}"),
                    ));
                }
                Windowing::Resets { length, starts }
            }
            _ => Windowing::LlamaPerplexity {
                n_ctx: need(&w.n_ctx, "n_ctx", &mut later),
                chunks,
                skip: w.skip.as_ref().map_or(0, |s| *s.get_ref()),
            },
        };
        if let Windowing::LlamaPerplexity { n_ctx, .. } | Windowing::Strided { n_ctx, .. } =
            &windowing
        {
            if let Some(v) = &w.n_ctx {
                if *n_ctx < 8 || !n_ctx.is_multiple_of(2) || *n_ctx > MAX_CONTEXT {
                    later.push((
                        diag.at(v.span().start),
                        format!(
                            "window.n_ctx: {n_ctx} must be an even number between 8 and {MAX_CONTEXT}"
                        ),
                    ));
                }
            }
        }
        let context = windowing.context();
        // llama-perplexity: n_batch = min(-b, -c), before the strided enlargement.
        let batch_cap = match &windowing {
            Windowing::Strided { n_ctx, .. } => *n_ctx,
            _ => context,
        };
        let n_batch = w
            .n_batch
            .as_ref()
            .map_or(512.min(batch_cap.max(1)), |b| *b.get_ref());
        if let Some(b) = &w.n_batch {
            if n_batch == 0 || n_batch > context {
                later.push((
                    diag.at(b.span().start),
                    format!(
                        "window.n_batch: {n_batch} must be between 1 and the context ({context})"
                    ),
                ));
            }
        }
        for (loc, msg) in later {
            diag.push(&loc, msg);
        }
        let mut boot = Bootstrap::default();
        if let Some(b) = bootstrap {
            if let Some(s) = b.seed {
                boot.seed = s;
            }
            if let Some(r) = &b.resamples {
                if !(100..=MAX_RESAMPLES).contains(r.get_ref()) {
                    diag.push_at(
                        r.span().start,
                        format!(
                            "bootstrap.resamples: {} must be between 100 and {MAX_RESAMPLES}",
                            r.get_ref()
                        ),
                    );
                }
                boot.resamples = *r.get_ref();
            }
            if let Some(k) = b.block {
                boot.block = k;
            }
        }
        Ok(ScoredText {
            source,
            pin,
            windowing,
            window_at: mode_at,
            n_batch,
            bootstrap: boot,
        })
    }
}
