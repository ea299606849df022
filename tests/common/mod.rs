//! Fixtures shared by the fake-engine tests (each test crate uses some).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Every real fixture model: the SmolLM2 ladder and Gemma-3-270M.
pub const REAL_MODELS: &[&str] = &[
    "smollm2-q4_1",
    "smollm2-f16",
    "smollm2-q8_0",
    "smollm2-q6_k",
    "smollm2-q4_k_m",
    "smollm2-q3_k_m",
    "smollm2-q2_k",
    "gemma3-270m-q4_k_m",
];

/// The token ids of `text` on model `m`.
pub fn token_ids(
    m: &dyn quantgate::engine::LoadedModel,
    text: &str,
    bos: quantgate::engine::BosPolicy,
) -> Vec<i32> {
    m.tokenize(text, bos)
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect()
}

/// A GGUF v3 header with no tensors, padded to `len` bytes (so files differ
/// in size and sha256). The fake engine never reads it; the preflight does.
pub fn gguf(len: usize) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    v.resize(len.max(24), 0);
    v
}

/// The quantgate cache of a fake-engine fixture under `root` (results,
/// reference products, kept windows): a test's products never land in the
/// user's cache (a fake engine's are keyed apart, but a result keyed by a
/// temp path would be left there by every run).
pub fn fixture_cache(root: &Path) -> PathBuf {
    root.join("qgcache")
}

/// The config of a fake-engine fixture under `root`: this process's
/// environment, the cache [`fixture_cache`].
pub fn fixture_config(root: &Path) -> quantgate::Config {
    quantgate::Config::builder()
        .cache(fixture_cache(root))
        .build()
        .unwrap()
}

// One implementation for the library's unit tests and these.
#[path = "../../src/core/scratch.rs"]
mod scratch;
pub use scratch::scratch;

/// The project registry's file for `alias` (suites/models.toml), verified;
/// fetched, or derived by this build's llama.cpp from its source, when the
/// cache lacks it.
pub fn registry_model(alias: &str) -> quantgate::models::Verified {
    use quantgate::engine::Engine;
    let repo = quantgate::harness::project_root();
    let reg = quantgate::models::Registry::load(&repo.join("suites/models.toml")).unwrap();
    let engine = quantgate::engine::llama::LlamaEngine::new();
    let q = |s: &Path, d: &Path, t: &str| engine.quantize(s, d, t, 2);
    let label = engine.build().label();
    let config = quantgate::Config::load().unwrap();
    quantgate::models::ensure(&config, &reg, alias, &label, &q).unwrap()
}

/// Every test of `planned` on `runner`, scheduled as the harness does,
/// `jobs` groups at once (no golden read or written): their outcomes.
pub fn run_planned(
    runner: quantgate::execute::RunContext,
    planned: &[quantgate::plan::Planned],
    jobs: usize,
) -> Vec<quantgate::core::Outcome> {
    quantgate::schedule::Schedule::here(&std::sync::Arc::new(runner), planned)
        .run(
            planned,
            jobs,
            &Default::default(),
            Path::new("goldens"),
            &mut |_, _| {},
            &mut |_, _, _| {},
        )
        .0
}

/// A fresh `<tmp>/qg-<tag>-<pid>/` ([`scratch`]) whose `suites/models.toml`
/// registers one fake GGUF of `bytes` bytes per `(alias, bytes)`, pinned by
/// sha256 and size.
pub fn fake_root(tag: &str, models: &[(&str, usize)]) -> PathBuf {
    let root = scratch(tag);
    std::fs::create_dir_all(root.join("suites")).unwrap();
    let mut reg = String::new();
    for &(alias, len) in models {
        let g = gguf(len);
        std::fs::write(root.join(format!("suites/{alias}.gguf")), &g).unwrap();
        reg.push_str(&format!(
            "[{alias}]\nsha256 = \"{}\"\nbytes = {len}\npath = \"{alias}.gguf\"\n",
            quantgate::core::fsutil::sha256_bytes(&g)
        ));
    }
    std::fs::write(root.join("suites/models.toml"), reg).unwrap();
    root
}

/// An outcome's metrics as their bits: equal only when every metric is
/// bitwise equal.
#[allow(dead_code)]
pub fn bits(o: &quantgate::core::Outcome) -> Vec<(String, u64)> {
    o.metrics
        .iter()
        .map(|(k, v)| (k.clone(), v.to_bits()))
        .collect()
}

/// Every file under `dir`, with its bytes, sorted by path (a file gone
/// between listing and reading is not in it).
pub fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                match std::fs::read(e.path()) {
                    Ok(bytes) => out.push((e.path(), bytes)),
                    // Renamed or removed since it was listed (a writer's
                    // temp file, polled while the writer runs): not there.
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => panic!("{}: {err}", e.path().display()),
                }
            }
        }
    }
    out.sort();
    out
}

/// One per-digit row, read back from the Parquet table a teacher-forcing
/// case renders.
pub struct DigitRow {
    pub piece: String,
    pub top1_piece: String,
    pub token_index: i32,
    pub token_id: i32,
    pub top1_token: i32,
    pub top1_matches_ref: bool,
    pub logprob: f64,
    pub rank: i64,
    pub margin: f64,
    pub kl_vs_ref: f64,
    pub ref_odds_percentile: f64,
}

pub fn digit_rows(o: &quantgate::core::Outcome) -> Vec<DigitRow> {
    use quantgate::core::Column;
    let t = o
        .rows
        .as_ref()
        .expect("a teacher-forcing case renders rows");
    assert_eq!(t.name, "digit_position");
    let n = t.rows().unwrap();
    // The reference's columns are there only with a reference.
    let col = |name: &str| t.columns.iter().find(|(c, _)| c == name).map(|(_, c)| c);
    let f = |name: &str| match col(name) {
        Some(Column::F64(v)) => v.clone(),
        None => vec![f64::NAN; n],
        Some(c) => panic!("{name}: {c:?}"),
    };
    let i = |name: &str| match col(name) {
        Some(Column::I32(v)) => v.clone(),
        c => panic!("{name}: {c:?}"),
    };
    let s = |name: &str| match col(name) {
        Some(Column::Str(v)) => v.clone(),
        c => panic!("{name}: {c:?}"),
    };
    let matches = match col("top1_matches_ref") {
        Some(Column::Bool(v)) => v.clone(),
        None => vec![false; n],
        Some(c) => panic!("top1_matches_ref: {c:?}"),
    };
    let (logprob, margin, kl, pct) = (
        f("logprob"),
        f("margin"),
        f("kl_vs_ref"),
        f("ref_odds_percentile"),
    );
    let (rank, index, id, top1_token) =
        (i("rank"), i("token_index"), i("token_id"), i("top1_token"));
    let (piece, top1) = (s("piece"), s("top1_piece"));
    (0..n)
        .map(|k| DigitRow {
            piece: piece[k].clone(),
            top1_piece: top1[k].clone(),
            token_index: index[k],
            token_id: id[k],
            top1_token: top1_token[k],
            top1_matches_ref: matches[k],
            logprob: logprob[k],
            rank: i64::from(rank[k]),
            margin: margin[k],
            kl_vs_ref: kl[k],
            ref_odds_percentile: pct[k],
        })
        .collect()
}

/// Exact KL(ref‖cand) over the full vocabulary, in f64 with libm `exp`: the
/// independent computation the compact path is checked against.
pub fn exact_kl(ref_row: &[f32], cand_row: &[f32]) -> f64 {
    let (a, b) = (exact_log_softmax(ref_row), exact_log_softmax(cand_row));
    a.iter().zip(&b).map(|(la, lb)| la.exp() * (la - lb)).sum()
}

/// Naive two-pass f64 log-softmax with libm `exp`: the independent
/// reference for checks, not the hot path.
pub fn exact_log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
    let lse = m + s.ln();
    row.iter().map(|&v| f64::from(v) - lse).collect()
}

/// The `llama-perplexity` binary `scripts/build-llama-perplexity.sh` builds
/// (once; later calls print its path) from the pinned llama.cpp sources.
pub fn llama_perplexity_tool() -> String {
    llama_tool("perplexity")
}

/// `llama-perplexity` (`perplexity`) or `llama-bench` (`bench`), built by
/// `scripts/build-llama-perplexity.sh [TOOL]`.
#[allow(dead_code)]
pub fn llama_tool(tool: &str) -> String {
    let out = std::process::Command::new("bash")
        .arg(quantgate::harness::project_root().join("scripts/build-llama-perplexity.sh"))
        .arg(tool)
        .output()
        .expect("run scripts/build-llama-perplexity.sh");
    assert!(
        out.status.success(),
        "building llama-{tool} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The fixture ladder's candidates the benches time against F16.
#[allow(dead_code)]
pub const LADDER: &[&str] = &[
    "smollm2-q8_0",
    "smollm2-q6_k",
    "smollm2-q4_k_m",
    "smollm2-q2_k",
];

/// sha256 of `suites/data/wikitext-2-test.txt`, as the benches' cases pin it.
#[allow(dead_code)]
pub const WIKI_SHA: &str = "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0";

/// A bench's ladder: the fixture's F16 and `candidates` files (fetched
/// and derived as needed), and a fresh folder `qg-bench-NAME-PID` holding
/// `suites/` (the registry, and `suites/<case_dir>/` for the bench's
/// cases) and a cache whose model files are the real cache's (linked) but
/// whose reference and result caches are its own.
#[allow(dead_code)]
pub struct BenchLadder {
    /// The F16 reference file.
    pub f16: std::path::PathBuf,
    /// The candidates' files, in order.
    pub cands: Vec<std::path::PathBuf>,
    /// The folder (removed by the bench when it ends).
    pub dir: std::path::PathBuf,
    /// `dir/suites`.
    pub suites: std::path::PathBuf,
    /// `dir/cache` (`QUANTGATE_CACHE` of the bench's runs).
    pub cache: std::path::PathBuf,
}

/// Set up a [`BenchLadder`].
#[allow(dead_code)]
pub fn bench_ladder(name: &str, candidates: &[&str], case_dir: &str) -> BenchLadder {
    let repo = quantgate::harness::project_root();
    let path = |alias: &str| registry_model(alias).file.path;
    let f16 = path("smollm2-f16");
    let cands = candidates.iter().map(|a| path(a)).collect();
    let dir = std::env::temp_dir().join(format!("qg-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (suites, cache) = (dir.join("suites"), dir.join("cache"));
    std::fs::create_dir_all(suites.join(case_dir)).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::copy(repo.join("suites/models.toml"), suites.join("models.toml")).unwrap();
    let real = quantgate::Config::load().unwrap().cache;
    for sub in ["models", "derived"] {
        std::os::unix::fs::symlink(real.join(sub), cache.join(sub)).unwrap();
    }
    BenchLadder {
        f16,
        cands,
        dir,
        suites,
        cache,
    }
}

/// Run `cmd` for a bench; its wall seconds. An exit code outside `ok` (or
/// a signal) panics with the command's output.
#[allow(dead_code)]
pub fn timed(cmd: &mut std::process::Command, what: &str, ok: &[i32]) -> f64 {
    let t = std::time::Instant::now();
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let secs = t.elapsed().as_secs_f64();
    if !out.status.code().is_some_and(|c| ok.contains(&c)) {
        panic!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    secs
}

/// `QG_BENCH_ROUNDS`, else `default`: how many rounds a bench alternates.
#[allow(dead_code)]
pub fn bench_rounds(default: usize) -> usize {
    std::env::var("QG_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// GGUF metadata edits for hostile-input tests: a header walked just far
/// enough to find where its key/value pairs and tensor infos lie.
#[allow(dead_code)]
pub mod gguf_edit {
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }
    /// Bytes of a value of GGUF type `t` at `at`.
    fn value_len(b: &[u8], t: u32, at: usize) -> usize {
        match t {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => 8 + u64_at(b, at) as usize,
            9 => {
                let (et, n) = (u32_at(b, at), u64_at(b, at + 4) as usize);
                let mut p = at + 12;
                for _ in 0..n {
                    p += value_len(b, et, p);
                }
                p - at
            }
            t => panic!("GGUF type {t}"),
        }
    }
    /// (end of the key/value pairs, end of the tensor infos, alignment).
    fn layout(b: &[u8]) -> (usize, usize, usize) {
        assert_eq!(&b[..4], b"GGUF");
        let (n_tensors, n_kv) = (u64_at(b, 8), u64_at(b, 16));
        let mut p = 24;
        let mut alignment = 32;
        for _ in 0..n_kv {
            let klen = u64_at(b, p) as usize;
            let key = &b[p + 8..p + 8 + klen];
            p += 8 + klen;
            let t = u32_at(b, p);
            if key == b"general.alignment" {
                alignment = u32_at(b, p + 4) as usize;
            }
            p += 4 + value_len(b, t, p + 4);
        }
        let kv_end = p;
        for _ in 0..n_tensors {
            p += 8 + u64_at(b, p) as usize;
            let dims = u32_at(b, p) as usize;
            p += 4 + 8 * dims + 4 + 8;
        }
        (kv_end, p, alignment)
    }
    /// Overwrite the f32 value of `key` in place.
    pub fn set_f32(b: &mut [u8], key: &str, v: f32) {
        let mut pat = (key.len() as u64).to_le_bytes().to_vec();
        pat.extend_from_slice(key.as_bytes());
        let at = b
            .windows(pat.len())
            .position(|w| w == pat)
            .unwrap_or_else(|| panic!("no key {key}"))
            + pat.len();
        assert_eq!(u32_at(b, at), 6, "{key} is not an f32");
        b[at + 4..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    /// The file with one more u32 key/value pair (tensor data moved to the
    /// next aligned offset; the tensors' offsets are relative to it).
    pub fn with_u32(b: &[u8], key: &str, v: u32) -> Vec<u8> {
        let (kv_end, infos_end, align) = layout(b);
        let data = infos_end.div_ceil(align) * align;
        let mut out = b[..kv_end].to_vec();
        out[16..24].copy_from_slice(&(u64_at(b, 16) + 1).to_le_bytes());
        out.extend_from_slice(&(key.len() as u64).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&4u32.to_le_bytes());
        out.extend_from_slice(&v.to_le_bytes());
        out.extend_from_slice(&b[kv_end..infos_end]);
        out.resize(out.len().div_ceil(align) * align, 0);
        out.extend_from_slice(&b[data..]);
        out
    }
}

/// llama-perplexity's KLD for one position: the reference row stored as
/// its 16-bit log-probs (min clamped at max − 16), summed over entries with
/// log-prob > −16; the candidate side in f64.
pub fn tool_kl(ref_row: &[f32], cand_row: &[f32]) -> f64 {
    let max = ref_row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let min = ref_row
        .iter()
        .copied()
        .fold(f32::INFINITY, f32::min)
        .max(max - 16.0);
    let sum: f64 = ref_row.iter().map(|&l| f64::from((l - max).exp())).sum();
    let lse = sum.ln() as f32;
    let min_lp = min - max - lse;
    let scale = (max - min) / 65535.0;
    let inv = 1.0 / scale;
    let m = cand_row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let cl = m + cand_row
        .iter()
        .map(|&v| (f64::from(v) - m).exp())
        .sum::<f64>()
        .ln();
    let mut kl = 0.0;
    for (j, &l) in ref_row.iter().enumerate() {
        let u = if l > min {
            (inv * (l - min)).round()
        } else {
            0.0
        };
        let lp = scale * u + min_lp;
        if lp > -16.0 {
            let lp = f64::from(lp);
            kl += lp.exp() * (lp - (f64::from(cand_row[j]) - cl));
        }
    }
    kl
}

/// The cell under column `col` in `model`'s row of a Markdown report,
/// whichever of its tables (the card's main table, its gates, its
/// details) has that column; None when none does.
pub fn card_cell(md: &str, model: &str, col: &str) -> Option<String> {
    let lines: Vec<&str> = md.lines().collect();
    let split = |l: &str| -> Vec<String> {
        l.trim()
            .trim_start_matches('|')
            .trim_end_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_string())
            .collect()
    };
    for (i, l) in lines.iter().enumerate() {
        if !l.starts_with("| model |") {
            continue;
        }
        let head = split(l);
        let Some(at) = head.iter().position(|h| h == col) else {
            continue;
        };
        let row = lines[i + 2..]
            .iter()
            .take_while(|l| l.starts_with('|'))
            .find(|l| l.starts_with(&format!("| {model} ")))?;
        return split(row).get(at).cloned();
    }
    None
}
