//! KLD cases on the fake engine: every statistic against an independent f64
//! computation from the fake models' logit formula; the reference cache
//! (reuse without the reference model, corruption detected and rebuilt only
//! when the model is available); a candidate with another tokenizer; and
//! every bad `.kld` import. Real rows: tests/real_engine/kld_real.rs.

use crate::common;

use quantgate::core::Status;
use quantgate::core::{Column, Outcome};
use quantgate::engine::fake::{FakeEngine, FakeSpec, BOS, N_VOCAB};
use quantgate::execute::RunContext;
use quantgate::plan::plan;
use std::path::PathBuf;
use std::sync::Arc;

const N_CTX: usize = 64;
const CHUNKS: usize = 6;

fn text() -> String {
    // Repeats (copy positions) and variety.
    (0..N_CTX * CHUNKS + 10)
        .map(|i| char::from(b'a' + ((i * 7 + i / 13) % 26) as u8))
        .collect()
}

struct Fx {
    root: PathBuf,
}

impl Fx {
    fn new(tag: &str, case_extra: &str) -> Fx {
        let root = common::fake_root(
            &format!("kld-{tag}"),
            &[("ref", 100), ("cand", 101), ("other", 102)],
        );
        let t = text();
        std::fs::write(root.join("suites/t.txt"), &t).unwrap();
        std::fs::write(
            root.join("suites/k.toml"),
            format!(
                "kind = \"kld\"\nmodels = [\"cand\"]\n{case_extra}\n[text]\npath = \"t.txt\"\nsha256 = \"{}\"\n\
                 [window]\nmode = \"llama-perplexity\"\nn_ctx = {N_CTX}\nchunks = {CHUNKS}\n",
                quantgate::core::fsutil::sha256_bytes(t.as_bytes())
            ),
        )
        .unwrap();
        Fx { root }
    }

    fn engine() -> FakeEngine {
        FakeEngine::new()
            .with("ref", ref_spec())
            .with("cand", cand_spec())
            .with(
                "other",
                FakeSpec {
                    tokenizer: "fake-other",
                    ..FakeSpec::default()
                },
            )
    }

    fn runner(&self) -> (RunContext, Vec<quantgate::plan::Planned>) {
        let (registry, planned) = plan(&self.root.join("suites"), &[], &[]).unwrap();
        let mut r = RunContext::new(
            &common::fixture_config(&self.root),
            registry,
            Arc::new(Self::engine()),
            1,
        );
        r.references.dir = self.root.join("cache");
        (r, planned)
    }

    fn run(&self) -> Outcome {
        let (r, planned) = self.runner();
        quantgate::schedule::trial(&r, &planned[0], std::path::Path::new("goldens"))
    }

    /// The cache's files (not its `locks/` folder).
    fn cache_files(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.root.join("cache"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_file())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The cache's files but the windows kept for sequential cases
    /// (`.qgwin`) and the windows' kept comparisons (`.qgkld`), and how
    /// many `.qgwin` there are.
    fn products(&self) -> (Vec<PathBuf>, usize) {
        let (windows, products): (Vec<PathBuf>, Vec<PathBuf>) = self
            .cache_files()
            .into_iter()
            .filter(|p| !is_comparison(p))
            .partition(|p| p.extension().is_some_and(|e| e == "qgwin"));
        (products, windows.len())
    }

    /// The windows' kept comparisons (`.qgkld`).
    fn comparisons(&self) -> Vec<PathBuf> {
        self.cache_files()
            .into_iter()
            .filter(|p| is_comparison(p))
            .collect()
    }

    /// Remove the kept comparisons, so that the next run compares the
    /// candidate with its reference's stored rows again (what the tests of
    /// the reference's products read).
    fn forget_comparisons(&self) {
        for f in self.comparisons() {
            std::fs::remove_file(f).unwrap();
        }
    }
}

fn is_comparison(p: &std::path::Path) -> bool {
    p.extension().is_some_and(|e| e == "qgkld")
}

/// A confident reference (top-1 ≈ 0.93) and a candidate whose favourite
/// loses to the ripple at some positions (flips).
fn ref_spec() -> FakeSpec {
    FakeSpec {
        confidence: 9.0,
        ..FakeSpec::default()
    }
}

fn cand_spec() -> FakeSpec {
    FakeSpec {
        confidence: 2.1,
        ..FakeSpec::default()
    }
}

/// f64 log-softmax of a fake row, with libm `exp`.
fn log_softmax(spec: &FakeSpec, last: i32, pos: usize) -> Vec<f64> {
    let row = spec.logits(last, pos);
    common::exact_log_softmax(&row)
}

fn argmax(v: &[f64]) -> usize {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    v.iter().position(|&x| x == m).unwrap()
}

fn q7(sorted: &[f64], q: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * q;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

struct Pos {
    kl: f64,
    rev: f64,
    dp: f64,
    flip: bool,
    p1: f64,
    copy: bool,
}

/// Every scored position, computed from the logit formula directly.
fn independent() -> Vec<Pos> {
    let (rs, cs) = (ref_spec(), cand_spec());
    let mut ids = vec![BOS];
    ids.extend(text().bytes().map(i32::from));
    let mut out = Vec::new();
    for w in 0..CHUNKS {
        let mut toks = ids[w * N_CTX..(w + 1) * N_CTX].to_vec();
        toks[0] = BOS;
        for pos in N_CTX / 2..N_CTX - 1 {
            let target = ids[w * N_CTX + pos + 1] as usize;
            let (a, b) = (
                log_softmax(&rs, toks[pos], pos),
                log_softmax(&cs, toks[pos], pos),
            );
            let kl: f64 = a.iter().zip(&b).map(|(x, y)| x.exp() * (x - y)).sum();
            let rev: f64 = a.iter().zip(&b).map(|(x, y)| y.exp() * (y - x)).sum();
            let top = argmax(&a);
            out.push(Pos {
                kl,
                rev,
                dp: b[target].exp() - a[target].exp(),
                flip: argmax(&b) != top,
                p1: a[top].exp(),
                copy: toks[1..=pos].contains(&(target as i32)),
            });
        }
    }
    out
}

fn close(name: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol * want.abs().max(1.0),
        "{name}: {got} vs independent {want}"
    );
}

fn check_against_independent(m: &std::collections::BTreeMap<String, f64>) {
    let ps = independent();
    let n = ps.len() as f64;
    assert_eq!(m["positions"], n);
    let mut kl: Vec<f64> = ps.iter().map(|p| p.kl).collect();
    kl.sort_by(f64::total_cmp);
    close("kld_mean", m["kld_mean"], kl.iter().sum::<f64>() / n, 1e-9);
    close("kld_p99", m["kld_p99"], q7(&kl, 0.99), 1e-9);
    close("kld_median", m["kld_median"], q7(&kl, 0.5), 1e-9);
    close("kld_max", m["kld_max"], *kl.last().unwrap(), 1e-9);
    close(
        "kld_rev_mean",
        m["kld_rev_mean"],
        ps.iter().map(|p| p.rev).sum::<f64>() / n,
        1e-9,
    );
    let mut dp: Vec<f64> = ps.iter().map(|p| p.dp).collect();
    dp.sort_by(f64::total_cmp);
    close("dp_mean", m["dp_mean"], dp.iter().sum::<f64>() / n, 1e-9);
    close("dp_p05", m["dp_p05"], q7(&dp, 0.05), 1e-9);
    close(
        "dp_rms",
        m["dp_rms"],
        (dp.iter().map(|d| d * d).sum::<f64>() / n).sqrt(),
        1e-9,
    );
    let same = ps.iter().filter(|p| !p.flip).count() as f64;
    assert_eq!(m["same_top"], same / n);
    // Wilson by its textbook formula.
    let (z, ph) = (1.959963984540054, same / n);
    let c = (ph + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let h = z * (ph * (1.0 - ph) / n + z * z / (4.0 * n * n)).sqrt() / (1.0 + z * z / n);
    close(
        "same_top_wilson95_lo",
        m["same_top_wilson95_lo"],
        c - h,
        1e-12,
    );
    let edges = [0.0, 0.5, 0.9, 0.99, 0.999, f64::INFINITY];
    for b in 0..5 {
        let inb: Vec<&Pos> = ps
            .iter()
            .filter(|p| p.p1 >= edges[b] && p.p1 < edges[b + 1])
            .collect();
        assert_eq!(m[&format!("flip_bin{b}_n")], inb.len() as f64, "bin {b}");
        assert_eq!(
            m[&format!("flip_bin{b}_flips")],
            inb.iter().filter(|p| p.flip).count() as f64,
            "bin {b}"
        );
    }
    let copies: Vec<&Pos> = ps.iter().filter(|p| p.copy).collect();
    assert_eq!(m["copy_positions"], copies.len() as f64);
    close(
        "copy_kld_mean",
        m["copy_kld_mean"],
        copies.iter().map(|p| p.kl).sum::<f64>() / copies.len() as f64,
        1e-9,
    );
}

#[test]
fn every_statistic_matches_an_independent_computation() {
    // The fake vocabulary (258) is below the default cap: every entry exact.
    let fx = Fx::new("stats", "reference = \"ref\"");
    let o = fx.run();
    assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    check_against_independent(&o.metrics);
    // The fixture exercises flips and a populated confidence bin.
    let ps = independent();
    assert!(ps.iter().any(|p| p.flip) && ps.iter().any(|p| !p.flip));
    assert!(ps.iter().all(|p| p.p1 > 0.5));
    // The paired perplexity metrics come from the stored rows and equal a
    // perplexity case's against the live model.
    assert!(o.metrics.contains_key("delta_nll_mean"));
}

/// A trial run alone (QUANTGATE_ISOLATION=test, or `schedule::trial`: no
/// reference work ran before it) writes its reference's rows to the store
/// as they are decoded and reads them back a pair of windows at a time, as
/// any stored reference is read: it holds no reference whole, and its
/// numbers are bitwise those of the run that shares the reference's decode
/// with its candidates.
#[test]
fn a_trial_run_alone_streams_its_reference_and_holds_none_whole() {
    let fx = Fx::new("alone", "reference = \"ref\"");
    let (r, planned) = fx.runner();
    let alone = quantgate::schedule::trial(&r, &planned[0], std::path::Path::new("goldens"));
    assert_eq!(alone.status, Status::Pass, "{:?}", alone.error);
    assert_eq!(r.references.rows_held(), 0, "a reference held whole");
    // The rows, and each window of both models kept for a sequential case.
    let (files, windows) = fx.products();
    assert!(
        files.len() == 1 && files[0].extension().is_some_and(|e| e == "qgref"),
        "{files:?}"
    );
    assert_eq!(windows, 2 * CHUNKS);
    // The same case scheduled as a run schedules it (the reference's rows
    // built as reference work, then read), from an empty store: the same
    // numbers, and the same file byte for byte.
    let alone_file = std::fs::read(&files[0]).unwrap();
    std::fs::remove_file(&files[0]).unwrap();
    fx.forget_comparisons();
    let grouped = run_cases(&fx.root, &Fx::engine(), "k");
    assert_eq!(grouped.len(), 1);
    assert_eq!(
        format!("{:?}", grouped[0].metrics),
        format!("{:?}", alone.metrics)
    );
    assert_eq!(std::fs::read(&files[0]).unwrap(), alone_file);
}

#[test]
fn the_one_byte_tail_matches_too() {
    // Keep 16 entries exactly; the other 242 go to the companded tail.
    let fx = Fx::new("tail", "reference = \"ref\"\n[kld]\nmax_kept = 16\n");
    let o = fx.run();
    assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    let ps = independent();
    let mean = ps.iter().map(|p| p.kl).sum::<f64>() / ps.len() as f64;
    let err = (o.metrics["kld_mean"] - mean).abs();
    assert!(err < 1e-6, "mean KL {} vs {mean}", o.metrics["kld_mean"]);
    // Discrete statistics do not depend on the tail.
    assert_eq!(
        o.metrics["same_top"],
        ps.iter().filter(|p| !p.flip).count() as f64 / ps.len() as f64
    );
}

#[test]
fn the_reference_cache_is_reused_checked_and_rebuilt_only_from_the_model() {
    let fx = Fx::new("cache", "reference = \"ref\"\n[kld]\nmax_kept = 16\n");
    let first = fx.run();
    assert_eq!(first.status, Status::Pass, "{:?}", first.error);
    let (files, _) = fx.products();
    assert_eq!(files.len(), 1, "{files:?}");
    let good = std::fs::read(&files[0]).unwrap();
    // The windows' kept comparisons removed before each run: the
    // reference's rows are read.
    fx.forget_comparisons();
    // Without the reference model file, the cache stands in for it.
    let model = fx.root.join("suites/ref.gguf");
    let saved = std::fs::read(&model).unwrap();
    std::fs::remove_file(&model).unwrap();
    let again = fx.run();
    assert_eq!(again.status, Status::Pass, "{:?}", again.error);
    assert_eq!(
        format!("{:?}", again.metrics),
        format!("{:?}", first.metrics)
    );
    // Corrupted, model still gone: an error naming the cache, never used.
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 1;
    std::fs::write(&files[0], &bad).unwrap();
    fx.forget_comparisons();
    let o = fx.run();
    let e = o.error.clone().unwrap_or_default();
    assert_eq!(o.status, Status::Error, "{o:?}");
    assert!(
        e.contains("is unusable") && e.contains("not available to rebuild") && e.contains(".qgref"),
        "{e}"
    );
    assert_eq!(std::fs::read(&files[0]).unwrap(), bad, "left as found");
    // Truncated, model back: rebuilt, byte for byte.
    std::fs::write(&model, &saved).unwrap();
    std::fs::write(&files[0], &good[..good.len() - 100]).unwrap();
    fx.forget_comparisons();
    let o = fx.run();
    assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    assert_eq!(format!("{:?}", o.metrics), format!("{:?}", first.metrics));
    assert_eq!(std::fs::read(&files[0]).unwrap(), good);
}

#[test]
fn a_candidate_with_another_tokenizer_is_refused_before_computing() {
    let fx = Fx::new("vocab", "reference = \"ref\"");
    let case = fx.root.join("suites/k.toml");
    let body = std::fs::read_to_string(&case)
        .unwrap()
        .replace("models = [\"cand\"]", "models = [\"other\"]");
    std::fs::write(&case, body).unwrap();
    let o = fx.run();
    let e = o.error.clone().unwrap_or_default();
    assert_eq!(o.status, Status::Error);
    assert!(e.contains("different tokenizers"), "{e}");
    assert!(o.metrics.is_empty());
}

/// A llama-perplexity base file for the fixture's windows, written the way
/// the tool writes it, from the reference's logits.
fn kld_file() -> Vec<u8> {
    let rs = ref_spec();
    let mut ids = vec![BOS];
    ids.extend(text().bytes().map(i32::from));
    let mut b = b"_logits_".to_vec();
    b.extend_from_slice(&(N_CTX as u32).to_le_bytes());
    b.extend_from_slice(&(N_VOCAB as i32).to_le_bytes());
    b.extend_from_slice(&(CHUNKS as i32).to_le_bytes());
    for id in &ids[..N_CTX * CHUNKS] {
        b.extend_from_slice(&id.to_le_bytes());
    }
    for w in 0..CHUNKS {
        for pos in N_CTX / 2..N_CTX - 1 {
            let last = ids[w * N_CTX + pos];
            let row = rs.logits(last, pos);
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let min = row
                .iter()
                .copied()
                .fold(f32::INFINITY, f32::min)
                .max(max - 16.0);
            let sum: f64 = row.iter().map(|&l| f64::from((l - max).exp())).sum();
            let lse = sum.ln() as f32;
            let scale = (max - min) / 65535.0;
            b.extend_from_slice(&scale.to_le_bytes());
            b.extend_from_slice(&(min - max - lse).to_le_bytes());
            for &l in &row {
                let u = if l > min {
                    ((l - min) / scale).round() as u16
                } else {
                    0
                };
                b.extend_from_slice(&u.to_le_bytes());
            }
            // nv = 2·⌈n_vocab/2⌉ + 4 values: pad an odd vocabulary.
            if N_VOCAB % 2 == 1 {
                b.extend_from_slice(&0u16.to_le_bytes());
            }
        }
    }
    b
}

fn import_fixture(tag: &str, bytes: &[u8]) -> (Fx, Outcome) {
    let sha = quantgate::core::fsutil::sha256_bytes(bytes);
    let fx = Fx::new(
        tag,
        &format!("[reference_kld]\npath = \"base.kld\"\nsha256 = \"{sha}\"\n"),
    );
    std::fs::write(fx.root.join("suites/base.kld"), bytes).unwrap();
    let o = fx.run();
    (fx, o)
}

#[test]
fn an_imported_kld_gives_the_same_positions_as_our_reference() {
    let (_fx, o) = import_fixture("import", &kld_file());
    assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    let ps = independent();
    assert_eq!(o.metrics["positions"], ps.len() as f64);
    assert_eq!(o.metrics["approx_positions"], ps.len() as f64);
    // 16-bit rows: close to the exact KL, not equal.
    let mean = ps.iter().map(|p| p.kl).sum::<f64>() / ps.len() as f64;
    assert!(
        (o.metrics["kld_mean"] - mean).abs() < 1e-3,
        "{} {mean}",
        o.metrics["kld_mean"]
    );
    assert_eq!(
        o.metrics["same_top"],
        ps.iter().filter(|p| !p.flip).count() as f64 / ps.len() as f64
    );
    // No paired perplexity from a 16-bit base.
    assert!(!o.metrics.contains_key("delta_nll_mean"));
}

#[test]
fn bad_kld_files_fail_naming_the_file_and_offset() {
    let good = kld_file();
    let records = 20 + 4 * N_CTX * CHUNKS;
    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    let mut b = good.clone();
    b[0] = b'X';
    cases.push(("magic", b, "magic `_logits_` missing"));
    cases.push(("truncated", good[..good.len() - 3].to_vec(), "truncated"));
    let mut b = good.clone();
    b.extend_from_slice(&[0, 0]);
    cases.push(("trailing", b, "trailing bytes"));
    // n_vocab one more, file length made consistent: the dimension check fires.
    let mut b = good.clone();
    b[12..16].copy_from_slice(&(N_VOCAB as i32 + 2).to_le_bytes());
    let per = N_CTX - 1 - N_CTX / 2;
    b.resize(b.len() + per * CHUNKS * 2 * 2, 0);
    cases.push((
        "vocab",
        b,
        "n_vocab 260, the candidate's vocabulary has 258",
    ));
    let mut b = good.clone();
    b[8..12].copy_from_slice(&(N_CTX as u32 * 2).to_le_bytes());
    cases.push(("n_ctx", b, "make"));
    let mut b = good.clone();
    let at = 20 + 4 * (N_CTX + 5);
    b[at] ^= 1;
    cases.push((
        "tokens",
        b,
        "token stream differs from the case's: chunk 1, position 5",
    ));
    let mut b = good.clone();
    b[records..records + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    cases.push(("nan", b, "scale NaN"));
    for (tag, bytes, want) in cases {
        let (fx, o) = import_fixture(tag, &bytes);
        let e = o.error.clone().unwrap_or_default();
        assert_eq!(o.status, Status::Error, "{tag}: {o:?}");
        assert!(
            e.contains(want) && e.contains(&fx.root.join("suites/base.kld").display().to_string()),
            "{tag}: want `{want}` in: {e}"
        );
        assert!(o.metrics.is_empty(), "{tag}: no numbers from a bad file");
    }
}

/// The per-position Parquet file: written atomically, read back with the
/// parquet crate's own row reader, every row equal to the outcome's.
#[test]
fn per_position_rows_round_trip_through_parquet() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    let fx = Fx::new("parquet", "reference = \"ref\"\n[kld]\nmax_kept = 16\n");
    let o = fx.run();
    assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    let out = fx.root.join("out");
    quantgate::report::write_parquet(&out, &o).unwrap();
    let path = out.join("k").join("cand.parquet");
    let table = o.rows.as_ref().unwrap();
    let col = |name: &str| &table.columns.iter().find(|(n, _)| n == name).unwrap().1;
    let ints = |name: &str| match col(name) {
        Column::I32(v) => v.clone(),
        c => panic!("{name}: {c:?}"),
    };
    let floats = |name: &str| match col(name) {
        Column::F64(v) => v.clone(),
        c => panic!("{name}: {c:?}"),
    };
    let bools = |name: &str| match col(name) {
        Column::Bool(v) => v.clone(),
        c => panic!("{name}: {c:?}"),
    };
    let (window, position, target) = (ints("window"), ints("position"), ints("token_id"));
    let (kl, p1, dp) = (floats("kl_vs_ref"), floats("ref_p1"), floats("dp"));
    let (flip, copy) = (bools("flip"), bools("copy"));
    let positions = table.rows().unwrap();
    // The rows are the kld statistics' positions: the flips add up.
    let flips = flip.iter().filter(|f| **f).count() as f64;
    let same_top = o.metrics["same_top"];
    assert!(
        (1.0 - flips / positions as f64 - same_top).abs() < 1e-12,
        "{flips} {same_top}"
    );
    assert_eq!(positions as f64, o.metrics["positions"]);
    let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    assert_eq!(
        reader.metadata().file_metadata().num_rows() as usize,
        positions
    );
    let mut n = 0;
    for (i, row) in reader.get_row_iter(None).unwrap().enumerate() {
        let row = row.unwrap();
        let get = |name: &str| -> Field {
            row.get_column_iter()
                .find(|(k, _)| k.as_str() == name)
                .unwrap_or_else(|| panic!("no column {name}"))
                .1
                .clone()
        };
        assert_eq!(get("case"), Field::Str("k".into()));
        assert_eq!(get("model"), Field::Str("cand".into()));
        assert_eq!(get("window"), Field::Int(window[i]));
        assert_eq!(get("position"), Field::Int(position[i]));
        assert_eq!(get("token_id"), Field::Int(target[i]));
        assert_eq!(get("kl_vs_ref"), Field::Double(kl[i]));
        assert_eq!(get("ref_p1"), Field::Double(p1[i]));
        assert_eq!(get("flip"), Field::Bool(flip[i]));
        assert_eq!(get("dp"), Field::Double(dp[i]));
        assert_eq!(get("copy"), Field::Bool(copy[i]));
        n += 1;
    }
    assert_eq!(n, positions);
    // The window/position columns follow the plan: 6 windows × 31 positions.
    assert_eq!(window.iter().filter(|&&w| w == 5).count(), 31);
    assert_eq!(position[0] as usize, N_CTX / 2);
    // A destination that cannot be written: an error, no file, no temp left.
    let blocked = fx.root.join("blocked");
    std::fs::write(&blocked, "a file, not a directory").unwrap();
    let e = quantgate::report::write_parquet(&blocked, &o).unwrap_err();
    assert!(e.message.contains("blocked"), "{}", e.message);
    let leftovers: Vec<_> = std::fs::read_dir(&fx.root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".quantgate-tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A language-model-like row: Zipf-shaped logits (−1.1·ln(1 + rank))
/// plus uniform noise of width `spread`, ranks scattered over the ids.
fn row(seed: u64, n: usize, spread: f32) -> Vec<f32> {
    let mut r = quantgate::measure::SplitMix64(seed);
    let mut u = || (r.next_u64() >> 11) as f32 / (1u64 << 53) as f32;
    (0..n)
        .map(|j| {
            let rank = (j * 7919 + seed as usize * 13) % n;
            -1.1 * (1.0 + rank as f32).ln() + spread * (u() - 0.5)
        })
        .collect()
}

#[test]
fn compact_kl_matches_exact_f64() {
    for seed in 0..20u64 {
        let a = row(seed, 3000, 2.0);
        let mut b = a.clone();
        for (i, v) in b.iter_mut().enumerate() {
            *v += ((i as f32 * 0.37 + seed as f32).sin()) * 0.3;
        }
        let sa = quantgate::measure::row_stats(&a);
        let mut eb = Vec::new();
        let sb = quantgate::measure::row_stats_exps(&b, &mut eb);
        let exact = common::exact_kl(&a, &b);
        for (tail, k) in [
            (0.0, 3000),
            (1e-9, 3000),
            (1e-6, 3000),
            (1e-6, 1024),
            (1e-6, 256),
            (1e-6, 64),
            (1e-6, 1),
        ] {
            let r = quantgate::measure::kld::compress_row(&a, &sa, 7, tail, k);
            let c = quantgate::measure::kld::compare(&r, &b, &sb, &eb, 7, false);
            let err = (c.kl - exact).abs();
            // The store's error bound on a perturbation between Q6_K's and
            // Q4_K_M's (KL ~0.015 nats): benches/kld.rs measures 3e-6 and
            // 7e-6 mean, 2e-5 and 5e-5 p99, on real rows with K 256 and the
            // tail in 96 groups; tiny K only coarsely. (These synthetic rows
            // have heavier tails than SmolLM2's.)
            let tol = if k >= 1024 {
                1e-5
            } else if k >= 256 {
                3e-5
            } else if k >= 64 {
                1e-4
            } else {
                // K = 1: nearly all the mass in the groups.
                1e-3
            };
            assert!(err < tol, "{seed} {tail} {k}: {} vs {exact}", c.kl);
            assert!(r.tail_mass <= tail + 1e-15 || r.entries.len() == k);
            let rev = common::exact_kl(&b, &a);
            // The reverse sum reads the levels without the rounding
            // correction: coarser.
            assert!(
                (c.kl_rev - rev).abs() < 20.0 * tol,
                "{seed} {k}: rev {} vs {rev}",
                c.kl_rev
            );
        }
        // Exact on everything kept.
        let full = quantgate::measure::kld::compress_row(&a, &sa, 7, 0.0, 3000);
        assert_eq!(full.tail_mass, 0.0);
        let c = quantgate::measure::kld::compare(&full, &b, &sb, &eb, 7, false);
        assert!(
            (c.kl - exact).abs() < 1e-12 * exact.max(1.0),
            "{} {exact}",
            c.kl
        );
        // Reverse KL independently.
        let rev = common::exact_kl(&b, &a);
        assert!((c.kl_rev - rev).abs() < 1e-12 * rev.max(1.0));
    }
}

#[test]
fn row_stats_agree_with_naive_log_softmax() {
    let mut s: u32 = 12345;
    for len in [1usize, 7, 8, 9, 258, 49_152] {
        let row: Vec<f32> = (0..len)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 40.0 - 20.0
            })
            .collect();
        let st = quantgate::measure::row_stats(&row);
        // Independent reference: naive two-pass log-softmax with libm's exp.
        let naive = common::exact_log_softmax(&row);
        for j in [0, len / 2, len - 1] {
            let got = st.logprob(&row, j);
            let want = naive[j];
            assert!(
                (got - want).abs() < 1e-12,
                "len {len} j {j}: {got} vs {want}"
            );
        }
        assert_eq!(row[st.argmax], st.max);
    }
}

/// Counts of a kld case (positions, flips per bin) compare exactly with the
/// golden, whatever the case's tolerance: one flip more in a bin fails.
#[test]
fn a_changed_flip_count_fails_the_golden_whatever_the_tolerance() {
    use quantgate::golden::{check, Goldens, UpdateMode};
    // A tolerance that would swallow any float change of this size.
    let fx = Fx::new(
        "golden-counts",
        "reference = \"ref\"\n[tolerance.default]\natol = 10.0\nrtol = 0.5\n",
    );
    let (r, planned) = fx.runner();
    let o = quantgate::schedule::trial(&r, &planned[0], &fx.root.join("goldens"));
    assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    let case = &planned[0].case.as_ref().unwrap().case;
    let goldens = Goldens::new(fx.root.join("goldens"));
    check(&o, case, "suites/k.toml", &goldens, UpdateMode::Always).unwrap();
    check(&o, case, "suites/k.toml", &goldens, UpdateMode::No).unwrap();
    let path = goldens.path("k", "cand");
    let golden = std::fs::read_to_string(&path).unwrap();
    for (metric, ty) in [
        ("flip_bin2_n", "count"),
        ("positions", "count"),
        ("kld_mean", "float"),
    ] {
        let value = o.metrics[metric];
        let line = format!("  {metric}: {value:?}\n");
        assert!(golden.contains(&line), "{line} in\n{golden}");
        let bumped = golden.replace(&line, &format!("  {metric}: {:?}\n", value + 1.0));
        std::fs::write(&path, bumped).unwrap();
        let result = check(&o, case, "suites/k.toml", &goldens, UpdateMode::No);
        match ty {
            "count" => {
                let e = result.unwrap_err();
                assert!(
                    matches!(e, quantgate::golden::GoldenError::Changed(_)),
                    "{e}"
                );
                assert!(
                    e.to_string().contains(&format!(
                        "{metric}: {:?} → {value:?} (counts compare exactly)",
                        value + 1.0
                    )),
                    "{e}"
                );
            }
            // A float within the case's (lax) tolerance still matches.
            _ => result.unwrap(),
        }
        std::fs::write(&path, &golden).unwrap();
    }
    assert_eq!(
        case.metric_type("flip_bin2_n"),
        Some(quantgate::core::MetricType::Count)
    );
    assert_eq!(
        case.metric_type("copy_flip_bin0_flips"),
        Some(quantgate::core::MetricType::Count)
    );
    assert_eq!(
        case.metric_type("flip_bin2_rate"),
        Some(quantgate::core::MetricType::Float)
    );
}

/// Random byte edits (and truncations) of every cache a kld or paired
/// perplexity case reads back — reference rows (`.qgref`) and reference
/// scores (`.qgscores`) — never change a number or a verdict: the damaged
/// file is found out by its seal and rebuilt from the reference model.
#[test]
fn edited_caches_are_rebuilt_never_believed() {
    let fx = Fx::new("sealed", "reference = \"ref\"\n");
    let t = text();
    std::fs::write(
        fx.root.join("suites/p.toml"),
        format!(
            "kind = \"perplexity\"\nmodels = [\"cand\"]\nreference = \"ref\"\n[text]\npath = \"t.txt\"\nsha256 = \"{}\"\n\
             [window]\nmode = \"llama-perplexity\"\nn_ctx = {N_CTX}\nchunks = {CHUNKS}\n",
            quantgate::core::fsutil::sha256_bytes(t.as_bytes())
        ),
    )
    .unwrap();
    let run_all = || {
        let (r, planned) = fx.runner();
        assert_eq!(planned.len(), 2);
        planned
            .iter()
            .map(|p| quantgate::schedule::trial(&r, p, &fx.root.join("goldens")))
            .collect::<Vec<Outcome>>()
    };
    let base = run_all();
    for o in &base {
        assert_eq!(o.status, Status::Pass, "{:?}", o.error);
    }
    // The windows kept for sequential cases (`.qgwin`) are not read back
    // here (tests/fake_engine/sequential.rs edits them).
    let (files, _) = fx.products();
    let kinds: Vec<String> = files
        .iter()
        .map(|f| f.extension().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        kinds.contains(&"qgref".to_string()) && kinds.contains(&"qgscores".to_string()),
        "{files:?}"
    );
    // The windows' kept comparisons (`.qgkld`) are edited too; while a
    // reference product is edited, they are removed (else the run reads
    // them and never the product).
    let comparisons = fx.comparisons();
    assert!(!comparisons.is_empty());
    let mut rng = quantgate::measure::SplitMix64(20261201);
    for file in files.iter().chain(&comparisons) {
        let good = std::fs::read(file).unwrap();
        for i in 0..24 {
            let mut bad = good.clone();
            if i % 6 == 5 {
                bad.truncate(rng.below(good.len() as u64) as usize);
            } else {
                let at = rng.below(good.len() as u64) as usize;
                bad[at] ^= 1 << rng.below(8);
            }
            if !is_comparison(file) {
                fx.forget_comparisons();
            }
            std::fs::write(file, &bad).unwrap();
            let again = run_all();
            for (a, b) in again.iter().zip(&base) {
                assert_eq!(
                    a.status,
                    b.status,
                    "{}: edit {i}: {:?}",
                    file.display(),
                    a.error
                );
                assert_eq!(
                    common::bits(a),
                    common::bits(b),
                    "{}: edit {i}",
                    file.display()
                );
            }
            assert_eq!(
                std::fs::read(file).unwrap(),
                good,
                "{} rebuilt",
                file.display()
            );
        }
    }
}

/// Two candidates against one reference, the case written twice: through
/// the compact store (`stored.toml`) and read live (`live.toml`, `store =
/// "none"`); `ref_spec` is the reference's.
fn live_fixture(tag: &str, ref_spec: FakeSpec) -> (PathBuf, FakeEngine) {
    let root = common::fake_root(
        &format!("kld-live-{tag}"),
        &[("ref", 100), ("cand", 101), ("cand2", 103)],
    );
    let t = text();
    std::fs::write(root.join("suites/t.txt"), &t).unwrap();
    for (name, extra) in [
        ("stored", ""),
        ("live", "[kld]\nstore = \"none\"\nmax_kept = 16\n"),
    ] {
        let extra = if extra.is_empty() {
            "[kld]\nmax_kept = 16\n"
        } else {
            extra
        };
        std::fs::write(
            root.join(format!("suites/{name}.toml")),
            format!(
                "kind = \"kld\"\nmodels = [\"cand\", \"cand2\"]\nreference = \"ref\"\n{extra}\
                 [text]\npath = \"t.txt\"\nsha256 = \"{}\"\n\
                 [window]\nmode = \"llama-perplexity\"\nn_ctx = {N_CTX}\nchunks = {CHUNKS}\n",
                quantgate::core::fsutil::sha256_bytes(t.as_bytes())
            ),
        )
        .unwrap();
    }
    let engine = FakeEngine::new()
        .with("ref", ref_spec)
        .with("cand", cand_spec())
        .with(
            "cand2",
            FakeSpec {
                confidence: 4.0,
                ..FakeSpec::default()
            },
        );
    (root, engine)
}

/// Run the cases `pattern` selects in a fresh context over `engine`.
fn run_cases(root: &std::path::Path, engine: &FakeEngine, pattern: &str) -> Vec<Outcome> {
    run_jobs(root, engine, pattern, 1)
}

/// The same, `jobs` groups at a time.
fn run_jobs(
    root: &std::path::Path,
    engine: &FakeEngine,
    pattern: &str,
    jobs: usize,
) -> Vec<Outcome> {
    let (registry, planned) = plan(&root.join("suites"), &[pattern.to_string()], &[]).unwrap();
    let mut cx = RunContext::new(
        &common::fixture_config(root),
        registry,
        Arc::new(engine.clone()),
        1,
    );
    cx.references.dir = root.join("cache");
    common::run_planned(cx, &planned, jobs)
}

#[test]
fn a_live_reference_is_decoded_once_writes_nothing_and_gives_the_stored_numbers() {
    use std::sync::atomic::Ordering;
    let (root, engine) = live_fixture("same", ref_spec());
    let live = run_cases(&root, &engine, "live");
    assert_eq!(live.len(), 2);
    for o in &live {
        assert_eq!(o.status, Status::Pass, "{}: {:?}", o.model, o.error);
    }
    // Nothing was written: no reference rows, no lock, no scores.
    let files = common::tree(&root.join("cache"));
    assert!(
        files.is_empty(),
        "{:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    // The reference decoded once for both candidates, two windows a call
    // (the engine's lanes): three observations of CHUNKS windows each.
    assert_eq!(engine.windows.load(Ordering::Relaxed), 3 * CHUNKS);
    assert_eq!(
        engine.decodes.load(Ordering::Relaxed),
        3 * CHUNKS.div_ceil(2)
    );
    // Through the store: a reference file, and the same numbers bit for
    // bit (the same rows, in memory instead of on disk), the same rows.
    let stored = run_cases(&root, &engine, "stored");
    assert!(common::tree(&root.join("cache"))
        .iter()
        .any(|(p, _)| p.extension().is_some_and(|e| e == "qgref")));
    for (l, s) in live.iter().zip(&stored) {
        assert_eq!(
            (&l.model, s.status),
            (&s.model, Status::Pass),
            "{:?}",
            s.error
        );
        assert!(l.metrics.contains_key("kld_mean") && l.metrics.contains_key("delta_nll_mean"));
        assert_eq!(common::bits(l), common::bits(s), "{}", l.model);
        assert_eq!(l.texts, s.texts);
        assert_eq!(
            format!("{:?}", l.rows.as_ref().map(|r| &r.columns)),
            format!("{:?}", s.rows.as_ref().map(|r| &r.columns))
        );
    }
    assert_eq!(live[0].model, "cand");
    // Two candidates' groups at once, each reading the stored reference
    // a pair of windows at a time (slowed so that they overlap): the same
    // numbers, each group reading its own rows.
    let slow = |confidence| FakeSpec {
        confidence,
        sleep_ms: 3,
        ..FakeSpec::default()
    };
    let together = FakeEngine::new()
        .with("ref", ref_spec())
        .with("cand", slow(cand_spec().confidence))
        .with("cand2", slow(4.0));
    for (t, s) in run_jobs(&root, &together, "stored", 2).iter().zip(&stored) {
        assert_eq!(t.status, Status::Pass, "{}: {:?}", t.model, t.error);
        assert_eq!(common::bits(t), common::bits(s), "{}", t.model);
    }
    // The first candidate's numbers are the independent computation's
    // (exact same top; KL within the 16-entry store's error).
    let ps = independent();
    let same = ps.iter().filter(|p| !p.flip).count() as f64 / ps.len() as f64;
    assert_eq!(live[0].metrics["same_top"], same);
    let mean = ps.iter().map(|p| p.kl).sum::<f64>() / ps.len() as f64;
    assert!((live[0].metrics["kld_mean"] - mean).abs() < 1e-6);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_live_reference_that_fails_fails_every_candidate_with_its_error() {
    // A non-finite logit in a scored row of the reference's second window.
    let (root, engine) = live_fixture(
        "fails",
        FakeSpec {
            nan_at: Some((1, N_CTX - 8)),
            ..ref_spec()
        },
    );
    let live = run_cases(&root, &engine, "live");
    assert_eq!(live.len(), 2);
    for o in &live {
        let e = o.error.clone().unwrap_or_default();
        assert_eq!(o.status, Status::Error, "{}: {:?}", o.model, o.error);
        assert!(
            e.contains("reference `ref`") && e.contains("live.toml"),
            "{e}"
        );
        assert!(o.metrics.is_empty(), "{:?}", o.metrics);
    }
    assert!(common::tree(&root.join("cache")).is_empty());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_bad_store_setting_is_an_error_naming_the_key() {
    for (extra, want) in [
        (
            "reference = \"ref\"\n[kld]\nstore = \"disk\"\n",
            "kld.store: `disk` is not one of \"compact\", \"none\"",
        ),
        (
            "[reference_kld]\npath = \"t.txt\"\nsha256 = \"00\"\n[kld]\nstore = \"none\"\n",
            "kld.store: \"none\" reads a reference model's rows live",
        ),
    ] {
        let fx = Fx::new("store-key", extra);
        let o = fx.run();
        let e = o.error.clone().unwrap_or_default();
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert!(e.contains("k.toml:") && e.contains(want), "{e}");
    }
}
