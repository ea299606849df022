//! `cargo bench --bench live`: a ladder KLD job (WikiText-2 test, n_ctx
//! 512, 2 threads) run in one process (`QUANTGATE_ISOLATION=off`, result
//! cache off) three ways, on 4 and on 32 chunks (`QG_BENCH_CHUNKS=4,32`).
//! The ladder is `QG_BENCH_LADDER`: `smollm2` (default: F16 reference,
//! Q8_0, Q6_K, Q4_K_M, Q2_K candidates; a 49,152-token vocabulary) or
//! `gemma` (Gemma 3 270M F16 reference, Q8_0 candidate; 262,144 tokens).
//!
//! - live (`[kld] store = "none"`): the candidates read the reference's
//!   rows as it decodes the same windows, two at a time; nothing is kept;
//! - stored (the default compact store, reference cache emptied first):
//!   the reference's rows built, written to `.qgref`, read by every
//!   candidate;
//! - sequential (`suites/kld/sequential.toml`'s rule on the ladder's Q8_0:
//!   KLD mean ≤ 0.1 and same top ≥ 0.8, decided sequentially over up to
//!   all the chunks): the reference decoded and stored only for the
//!   windows the candidate visits, each visit its own file. It stops where
//!   its verdicts are decided, so the line says how many windows it used.
//!
//! Per run it prints wall seconds, the process's peak RSS (`wait4`'s
//! `ru_maxrss`) and the bytes the run left in the reference cache; per
//! chunk count, the largest |live − stored| over every KL metric of every
//! candidate and whether every count (positions, same top, flips, bins)
//! is equal. Exits non-zero when the live run writes a reference file,
//! when a KL metric differs by more than the store's declared tolerance
//! (`kinds::reference_rows::store_tolerance`) or a count differs at all,
//! or when a path's peak RSS at the most chunks exceeds its peak at the
//! fewest by more than 5%.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{LADDER as CANDIDATES, WIKI_SHA};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitCode};

/// One run's wall seconds and peak RSS (KiB); it must exit 0.
// The child is reaped by `wait4`, which also gives its rusage.
#[allow(clippy::zombie_processes)]
fn measured(cmd: &mut Command, what: &str) -> (f64, u64) {
    use std::os::unix::process::ExitStatusExt;
    let t = std::time::Instant::now();
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let pid = child.id() as libc::pid_t;
    // Drain stderr on a thread so the child never blocks on it.
    let mut err = child.stderr.expect("piped");
    let drain = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own child, waited for once; both pointers are to
    // live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "{what}: wait4 failed");
    let secs = t.elapsed().as_secs_f64();
    let stderr = drain.join().unwrap_or_default();
    let st = std::process::ExitStatus::from_raw(status);
    if !st.success() {
        panic!("{what} failed ({st}):\n{stderr}");
    }
    (secs, usage.ru_maxrss as u64)
}

/// Every file under `dir` (recursively) and their bytes.
fn files(dir: &Path) -> (usize, u64) {
    let mut n = (0, 0);
    for e in walk(dir) {
        n.0 += 1;
        n.1 += std::fs::metadata(&e).map_or(0, |m| m.len());
    }
    n
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// model → metrics of a `--json` file (every outcome must pass).
fn metrics(path: &Path) -> BTreeMap<String, BTreeMap<String, f64>> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut out = BTreeMap::new();
    for o in v.as_array().expect("an array of outcomes") {
        let model = o["model"].as_str().unwrap().to_string();
        assert_eq!(o["status"], "pass", "{}: {o}", path.display());
        let m = o["metrics"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
            .collect();
        out.insert(model, m);
    }
    out
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    let repo = quantgate::harness::project_root();
    let qg = env!("CARGO_BIN_EXE_quantgate");
    let chunks: Vec<usize> = std::env::var("QG_BENCH_CHUNKS")
        .unwrap_or_else(|_| "4,32".into())
        .split(',')
        .map(|c| c.trim().parse().expect("QG_BENCH_CHUNKS: numbers"))
        .collect();
    let which = std::env::var("QG_BENCH_LADDER").unwrap_or_else(|_| "smollm2".into());
    let (reference, candidates): (&str, Vec<&str>) = match which.as_str() {
        "smollm2" => ("smollm2-f16", CANDIDATES.to_vec()),
        "gemma" => ("gemma3-270m-f16", vec!["gemma3-270m-q8_0"]),
        other => panic!("QG_BENCH_LADDER: `{other}` is not smollm2 or gemma"),
    };
    let ladder = common::bench_ladder("live", &[&[reference][..], &candidates].concat(), "kld");
    println!("ladder {which}: reference {reference}, candidates {candidates:?}");
    let text = repo.join("suites/data/wikitext-2-test.txt");
    let run = |case: &str, json: &Path, what: &str| {
        let mut c = Command::new(qg);
        c.env("QUANTGATE_CACHE", &ladder.cache)
            .env("QUANTGATE_ISOLATION", "off")
            .env("QUANTGATE_RESULT_CACHE", "off")
            .arg("--suites")
            .arg(&ladder.suites)
            .args(["run", case, "--threads", "2", "--json"])
            .arg(json);
        measured(&mut c, what)
    };
    let mut ok = true;
    let mut rss_of: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    println!(
        "{:>6} {:<7} {:>8} {:>14} {:>22}",
        "chunks", "store", "wall_s", "peak_rss_MiB", "reference cache"
    );
    for &n in &chunks {
        for (name, store, decide) in [
            ("live", "none", ""),
            ("stored", "compact", ""),
            (
                "sequential",
                "compact",
                "[[gate]]\nmetric = \"kld_mean\"\nmax = 0.1\n\
                 [[gate]]\nmetric = \"same_top\"\nmin = 0.8\n\
                 [decide]\nsequential = true\nalpha = 0.05\nseed = 20261203\n\
                 [decide.bounds]\nkld_mean = [0.0, 0.5]\nsame_top = [0.0, 1.0]\n",
            ),
        ] {
            std::fs::write(
                ladder.suites.join(format!("kld/{name}.toml")),
                format!(
                    "kind = \"kld\"\nmodels = {:?}\nreference = \"{reference}\"\n\
                     [kld]\nstore = \"{store}\"\n\
                     [text]\npath = \"{}\"\nsha256 = \"{WIKI_SHA}\"\n\
                     [window]\nmode = \"llama-perplexity\"\nn_ctx = 512\nchunks = {n}\n{decide}",
                    if decide.is_empty() {
                        &candidates[..]
                    } else {
                        &candidates[..1]
                    },
                    text.display()
                ),
            )
            .unwrap();
        }
        let mut got = BTreeMap::new();
        for name in ["live", "stored", "sequential"] {
            let _ = std::fs::remove_dir_all(ladder.cache.join("reference"));
            let json = ladder.dir.join(format!("{name}-{n}.json"));
            let (secs, rss) = run(&format!("kld/{name}"), &json, &format!("{name} {n} chunks"));
            let (count, bytes) = files(&ladder.cache.join("reference"));
            println!(
                "{n:>6} {name:<7} {secs:>8.1} {:>14.0} {:>22}",
                rss as f64 / 1024.0,
                format!("{count} files, {bytes} B")
            );
            rss_of.entry(name).or_default().push(rss);
            if name == "sequential" {
                let used: Vec<String> = metrics(&json)
                    .iter()
                    .map(|(m, v)| format!("{m} {}", v.get("windows").copied().unwrap_or(f64::NAN)))
                    .collect();
                println!("{n:>6} sequential windows used: {}", used.join(", "));
                continue;
            }
            if name == "live" {
                let qgref = walk(&ladder.cache.join("reference"))
                    .into_iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "qgref"))
                    .count();
                if qgref > 0 {
                    eprintln!("the live run wrote {qgref} reference file(s)");
                    ok = false;
                }
            }
            got.insert(name, metrics(&json));
        }
        // Live against stored, per candidate and metric.
        let (mut worst, mut worst_at, mut counts_equal) = (0.0f64, String::new(), true);
        for (model, l) in &got["live"] {
            let s = &got["stored"][model];
            for (k, lv) in l {
                let Some(sv) = s.get(k) else {
                    eprintln!("{model}: {k} only in the live run");
                    ok = false;
                    continue;
                };
                let d = (lv - sv).abs();
                match quantgate::kinds::reference_rows::store_tolerance(k) {
                    Some((t, _)) => {
                        if d > worst {
                            (worst, worst_at) = (d, format!("{model} {k}"));
                        }
                        if d > t.atol + t.rtol * sv.abs() {
                            eprintln!(
                                "{model}: {k} live {lv} stored {sv}: beyond the store's tolerance"
                            );
                            ok = false;
                        }
                    }
                    None => {
                        if lv.to_bits() != sv.to_bits() {
                            counts_equal = false;
                            eprintln!("{model}: {k} live {lv} stored {sv}");
                        }
                    }
                }
            }
        }
        println!(
            "{n:>6} live vs stored: largest |Δ| of a KL metric {worst:.3e} ({}); every other metric bitwise equal: {counts_equal}",
            if worst_at.is_empty() { "none" } else { &worst_at }
        );
        ok &= counts_equal;
    }
    for (name, rss) in &rss_of {
        if let (Some(first), Some(last)) = (rss.first(), rss.last()) {
            let growth = *last as f64 / *first as f64;
            println!(
                "{which} {name}: peak RSS {} chunks / {} chunks: {growth:.3} ({:.0} / {:.0} MiB)",
                chunks.last().unwrap(),
                chunks[0],
                *last as f64 / 1024.0,
                *first as f64 / 1024.0
            );
            ok &= growth <= 1.05;
        }
    }
    let _ = std::fs::remove_dir_all(&ladder.dir);
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("a target was missed (no reference file, metrics within the store's tolerance, flat peak RSS)");
        ExitCode::FAILURE
    }
}
