//! `cargo bench --bench ppl_timings`: SmolLM2 F16 at n_ctx 512, 4 and 32
//! chunks, each in its own `quantgate run --timings` process. Reports measure
//! time as a share of decode time (target ≤ 5%) and peak RSS at 4 vs 32 chunks
//! (target: within ±10%), both measured in this one run. Exits non-zero when a
//! target is missed.

use std::path::Path;
use std::process::{Command, ExitCode};

const WIKI_SHA: &str = "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0";

struct Run {
    decode: f64,
    measure: f64,
    rss_mib: f64,
}

fn run(bin: &str, suites: &Path, case: &str, model: &str) -> Run {
    let out = Command::new(bin)
        .arg("--suites")
        .arg(suites)
        .args(["run", case, "--model", model, "--timings"])
        .output()
        .expect("run quantgate");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = stdout
        .lines()
        .skip_while(|l| !l.starts_with("model "))
        .nth(1)
        .unwrap_or_else(|| panic!("no timings row in\n{stdout}"));
    let f: Vec<&str> = row.split_whitespace().collect();
    // model prepare load tokenize decode measure total measure% peak_rss MiB
    Run {
        decode: f[4].parse().unwrap(),
        measure: f[5].parse().unwrap(),
        rss_mib: f[8].parse().unwrap(),
    }
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    let repo = quantgate::harness::project_root();
    let bin = env!("CARGO_BIN_EXE_quantgate");
    let suites = std::env::temp_dir().join(format!("qg-bench-{}", std::process::id()));
    std::fs::create_dir_all(suites.join("ppl")).unwrap();
    std::fs::copy(repo.join("suites/models.toml"), suites.join("models.toml")).unwrap();
    let text = repo.join("suites/data/wikitext-2-test.txt");
    for chunks in [4, 32] {
        std::fs::write(
            suites.join(format!("ppl/c{chunks}.toml")),
            format!(
                "kind = \"perplexity\"\nmodels = [\"smollm2-f16\", \"smollm2-q4_1\"]\n[text]\npath = \"{}\"\nsha256 = \"{WIKI_SHA}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 512\nchunks = {chunks}\n",
                text.display()
            ),
        )
        .unwrap();
    }
    let mut ok = true;
    println!(
        "{:<14} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "model", "chunks", "decode_s", "measure_s", "measure%", "rss_MiB"
    );
    for model in ["smollm2-f16", "smollm2-q4_1"] {
        let small = run(bin, &suites, "ppl/c4", model);
        let big = run(bin, &suites, "ppl/c32", model);
        for (c, r) in [(4, &small), (32, &big)] {
            println!(
                "{model:<14} {c:>6} {:>9.2} {:>9.3} {:>8.2}% {:>9.0}",
                r.decode,
                r.measure,
                100.0 * r.measure / r.decode,
                r.rss_mib
            );
        }
        let share = big.measure / big.decode;
        let rss_ratio = big.rss_mib / small.rss_mib;
        println!("{model}: measure/decode at 32 chunks {:.2}% (target ≤ 5%); peak RSS 32/4 chunks {rss_ratio:.3} (target 0.9–1.1)", 100.0 * share);
        ok &= share <= 0.05 && (0.9..=1.1).contains(&rss_ratio);
    }
    let _ = std::fs::remove_dir_all(&suites);
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("a target was missed");
        ExitCode::FAILURE
    }
}
