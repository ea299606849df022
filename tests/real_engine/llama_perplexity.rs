//! quantgate's perplexity equals what llama.cpp's own `llama-perplexity` prints
//! for the same model, text, `-c 512 --chunks 16 -b 512 -fa off`: every running
//! per-chunk PPL, the final PPL and its ±, to the digits the tool prints.
//! The tool is built from the pinned llama.cpp sources by
//! `scripts/build-llama-perplexity.sh` (cached after the first build).
//! quantgate's side is the model's scores as the reference store keeps them
//! (read back and checked when an earlier run kept them, whole or window by
//! window, scored otherwise): the very numbers every perplexity case reads.

use crate::common;

use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::{BosPolicy, Engine, ModelPool};
use quantgate::execute::record::RecordHeader;
use quantgate::execute::reference::{ReferenceStore, ScoresKey};
use quantgate::execute::windows::Windowing;
use quantgate::execute::windows::{plan_windows, score_plan};
use quantgate::measure::perplexity_metrics;
use quantgate::models::Registry;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

const WIKI_SHA: &str = "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0";

fn repo() -> std::path::PathBuf {
    quantgate::harness::project_root()
}

/// Tests holding a lane ([`lane`]).
static BUSY: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

/// A test's share of the machine: held while it runs.
struct Lane;

impl Drop for Lane {
    fn drop(&mut self) {
        *BUSY.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        FREED.notify_one();
    }
}

/// Each test here runs the tool, then quantgate, on llama.cpp threads. Two
/// tests run side by side on half the cores each (on two cores two
/// one-thread decodes beat two two-thread decodes one after the other, as
/// quantgate's decode lanes do), and never more, so threads stay ≤ cores
/// (OpenMP collapses otherwise). The lane, and the threads to use in it.
/// llama.cpp's numbers do not depend on the thread count.
fn lane() -> (Lane, u32) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (lanes, threads) = if cores >= 2 { (2, cores / 2) } else { (1, 1) };
    let mut busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
    while *busy >= lanes {
        busy = FREED.wait(busy).unwrap_or_else(|p| p.into_inner());
    }
    *busy += 1;
    (Lane, threads as u32)
}

/// The tool's log for `args` on `model` and `text`. The tool is
/// deterministic for one binary, model, text, input files and arguments, so
/// its answer is kept in `<cache>/tool-runs/` (sealed, with the files it
/// wrote) and given again when all of those are the same: the checks still
/// compare quantgate's numbers with the tool's, without rerunning the tool.
/// An argument naming an existing file is an input (keyed by its sha256); a
/// path that does not exist yet is an output (kept, and restored).
fn run_tool(tool: &str, model: &Path, text: &Path, args: &[&str]) -> String {
    use quantgate::core::fsutil::{read_sealed, sha256_file, write_sealed};
    let sha = |p: &Path| sha256_file(p, |_| {}).unwrap().0;
    let mut key = format!("{}|{}|{}", sha(Path::new(tool)), sha(model), sha(text));
    let mut outputs = Vec::new();
    for a in args {
        let p = Path::new(a);
        if a.contains('/') && p.is_file() {
            key.push_str(&format!("|file:{}", sha(p)));
        } else if a.contains('/') {
            key.push_str(&format!("|out{}", outputs.len()));
            outputs.push(p.to_path_buf());
        } else {
            key.push_str(&format!("|{a}"));
        }
    }
    let dir = quantgate::Config::load()
        .unwrap()
        .cache
        .join("tool-runs")
        .join(quantgate::core::fsutil::sha256_bytes(key.as_bytes()));
    let kept = |name: &str| read_sealed(&dir.join(name)).ok().flatten();
    if let Some(log) = kept("log") {
        let files: Option<Vec<Vec<u8>>> = (0..outputs.len())
            .map(|k| kept(&format!("out{k}")))
            .collect();
        if let Some(files) = files {
            for (p, bytes) in outputs.iter().zip(files) {
                std::fs::write(p, bytes).unwrap();
            }
            return String::from_utf8(log).unwrap();
        }
    }
    let out = Command::new(tool)
        .args([
            "-m",
            &model.display().to_string(),
            "-f",
            &text.display().to_string(),
        ])
        .args(args)
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    for (k, p) in outputs.iter().enumerate() {
        write_sealed(&dir.join(format!("out{k}")), std::fs::read(p).unwrap()).unwrap();
    }
    write_sealed(&dir.join("log"), log.clone().into_bytes()).unwrap();
    log
}

/// quantgate's scores of `plan` on `model` (windowed as `windowing`, passes
/// of `n_batch`) as the reference store keeps them for every case: read
/// back and checked when an earlier run kept them (the whole, or every
/// window of it, as a perplexity case reads them), else scored and kept.
fn kept_scores(
    engine: &LlamaEngine,
    v: &quantgate::models::Verified,
    model: &Arc<dyn quantgate::engine::LoadedModel>,
    plan: &quantgate::execute::windows::ScoringPlan,
    windowing: &Windowing,
    n_batch: u32,
    threads: u32,
) -> Arc<quantgate::execute::windows::Scored> {
    let alias = v.file.alias.as_str();
    let store = ReferenceStore::new(
        quantgate::Config::load().unwrap().cache.join("reference"),
        &quantgate::Config::load().unwrap(),
    );
    let mut settings = quantgate::core::Settings::new(plan.n_ctx, threads);
    settings.n_batch = n_batch;
    let build = engine.model_identity(alias);
    let key = ScoresKey {
        alias,
        model_sha256: &v.file.sha256,
        plan,
        settings: &settings,
        build: &build,
        windowing: format!("{windowing:?}"),
    };
    let config = quantgate::Config::load().unwrap();
    let registry = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let cx =
        quantgate::execute::RunContext::new(&config, registry, Arc::new(engine.clone()), threads);
    store
        .scores(&key, &alias, &|| {
            let kept = quantgate::kinds::scored_text::kept_scores(
                &cx,
                &v.file.sha256,
                &settings,
                &build,
                plan,
            );
            let scored = match kept {
                Some(s) => s,
                None => score_plan(model.clone(), plan, n_batch, threads, &Default::default())?,
            };
            let info = model.info();
            let header = RecordHeader {
                quantgate_reference_record: 1,
                model: alias.to_string(),
                model_sha256: v.file.sha256.clone(),
                build: build.clone(),
                n_vocab: info.n_vocab,
                tokenizer_fingerprint: info.tokenizer_fingerprint.clone(),
                mode: windowing.mode().to_string(),
                windows: plan.windows.len(),
                targets: plan.targets(),
                token_stream_sha256: plan.token_stream_sha256.clone(),
                settings: None,
            };
            Ok((header, scored))
        })
        .unwrap()
        .scored
        .clone()
}

/// The engine, and the registry's `aliases` fetched or derived and verified.
fn models(aliases: &[&str]) -> (Arc<LlamaEngine>, Vec<quantgate::models::Verified>) {
    let verified = aliases.iter().map(|a| common::registry_model(a)).collect();
    (Arc::new(LlamaEngine::new()), verified)
}

/// The running PPL values the tool prints as `[1]x,[2]y,...`.
fn running(log: &str) -> Vec<f64> {
    let line = log
        .lines()
        .find(|l| l.starts_with("[1]"))
        .unwrap_or_else(|| panic!("{log}"));
    line.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(']').nth(1).unwrap().trim().parse().unwrap())
        .collect()
}

fn reference(tool: &str, model: &Path, text: &Path, t: &str) -> (Vec<f64>, f64, f64) {
    let log = run_tool(
        tool,
        model,
        text,
        &[
            "-c", "512", "--chunks", "16", "-b", "512", "-fa", "off", "-t", t,
        ],
    );
    let running = running(&log);
    let fin = log
        .lines()
        .find(|l| l.contains("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("{log}"));
    let nums: Vec<f64> = fin
        .split("PPL = ")
        .nth(1)
        .unwrap()
        .split(" +/- ")
        .map(|s| s.trim().parse().unwrap())
        .collect();
    (running, nums[0], nums[1])
}

/// Every running PPL (after 1, 2, ... windows) equals the tool's printed one.
fn assert_running_matches(windows: &[quantgate::measure::WindowNll], printed: &[f64], label: &str) {
    let (mut sum, mut n) = (0.0, 0);
    for (i, w) in windows.iter().enumerate() {
        sum += w.nll_sum;
        n += w.count;
        let ours = (sum / n as f64).exp();
        assert!(
            same_printed(ours, printed[i], 4),
            "{label} chunk {}: ours {ours} vs llama-perplexity {}",
            i + 1,
            printed[i]
        );
    }
}

/// Equal to the printed digits: |a − printed| ≤ half a unit in the last place.
fn same_printed(ours: f64, printed: f64, decimals: i32) -> bool {
    (ours - printed).abs() <= 0.5 * 10f64.powi(-decimals) + 1e-12
}

#[test]
fn perplexity_equals_llama_perplexity() {
    let (_lane, threads) = lane();
    let t = threads.to_string();
    let tool = common::llama_perplexity_tool();
    let (engine, verified) = models(&["smollm2-f16", "smollm2-q2_k"]);
    let pool = ModelPool::new(engine.clone());
    let text_path = repo().join("suites/data/wikitext-2-test.txt");
    let text = std::fs::read_to_string(&text_path).unwrap();
    for v in &verified {
        let alias = v.file.alias.as_str();
        let (running, ppl, pm) = reference(&tool, &v.file.path, &text_path, &t);
        assert_eq!(running.len(), 16);
        let model = pool.get(&v.file).unwrap();
        let ids: Vec<i32> = common::token_ids(&*model, &text, BosPolicy::Model);
        let bos = model.info().add_bos.then_some(model.info().bos);
        let windowing = Windowing::LlamaPerplexity {
            n_ctx: 512,
            chunks: Some(16),
            skip: 0,
        };
        let plan = plan_windows(&ids, &windowing, bos).unwrap();
        let obs = kept_scores(&engine, v, &model, &plan, &windowing, 512, threads);
        assert_running_matches(&obs.windows, &running, alias);
        let m = perplexity_metrics(&obs.windows);
        assert!(
            same_printed(m["ppl"], ppl, 4),
            "{alias}: ppl {} vs {ppl}",
            m["ppl"]
        );
        assert!(
            same_printed(m["ppl_se"], pm, 5),
            "{alias}: ± {} vs {pm}",
            m["ppl_se"]
        );
        assert_eq!(m["tokens_scored"], 16.0 * 255.0);
        eprintln!(
            "{alias}: quantgate ppl {:.6} ± {:.6}; llama-perplexity {ppl} ± {pm}",
            m["ppl"], m["ppl_se"]
        );
    }
}

#[test]
fn strided_mode_equals_ppl_stride() {
    let (_lane, threads) = lane();
    let t = threads.to_string();
    let tool = common::llama_perplexity_tool();
    let (engine, verified) = models(&["smollm2-f16"]);
    let v = &verified[0];
    let text_path = repo().join("suites/data/wikitext-2-test.txt");
    let log = run_tool(
        &tool,
        &v.file.path,
        &text_path,
        &[
            "-c",
            "256",
            "--ppl-stride",
            "128",
            "--chunks",
            "12",
            "-b",
            "256",
            "-fa",
            "off",
            "-t",
            &t,
        ],
    );
    assert!(
        log.contains("adjusting context size from 256 to 320"),
        "{log}"
    );
    let printed = running(&log);
    assert_eq!(printed.len(), 12);
    let pool = ModelPool::new(engine.clone());
    let model = pool.get(&v.file).unwrap();
    let text = std::fs::read_to_string(&text_path).unwrap();
    let ids: Vec<i32> = common::token_ids(&*model, &text, BosPolicy::Model);
    let strided = Windowing::Strided {
        n_ctx: 256,
        stride: 128,
        chunks: Some(12),
    };
    let plan = plan_windows(&ids, &strided, None).unwrap();
    // Context 256 + 64 = 320, padded by llama.cpp to 512, the tool's chunk;
    // n_batch = min(-b, -c) = 256, as the tool sets it before enlarging the context.
    assert_eq!(plan.n_ctx, 512);
    assert!(log.contains("Calculation chunk = 512"), "{log}");
    let obs = kept_scores(&engine, v, &model, &plan, &strided, 256, threads);
    assert!(obs.windows.iter().all(|w| w.count == 128));
    assert_running_matches(&obs.windows, &printed, "strided");
    let (sum, n) = obs
        .windows
        .iter()
        .fold((0.0, 0), |(s, n), w| (s + w.nll_sum, n + w.count));
    eprintln!(
        "strided: quantgate {:.6}, llama-perplexity {}",
        (sum / n as f64).exp(),
        printed[11]
    );
}

/// The first number after `label` on its line in the tool's log.
fn printed_after(log: &str, label: &str) -> f64 {
    let line = log
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` in\n{log}"));
    line[label.len()..]
        .trim_start_matches([' ', ':'])
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap()
}

/// `llama-perplexity --kl-divergence` on Q8_0 against an F16 base file it
/// wrote, vs quantgate on the same windows: importing that base file gives
/// the tool's own KLD block (same positions and tokens, or the import fails);
/// quantgate's exact reference gives the exact KLD, which the tool's 16-bit
/// rows approximate.
#[test]
fn kld_equals_llama_perplexity_kl_divergence() {
    let (_lane, threads) = lane();
    let t = threads.to_string();
    let tool = common::llama_perplexity_tool();
    let (engine, verified) = models(&["smollm2-f16", "smollm2-q8_0"]);
    let (f16, q8) = (&verified[0], &verified[1]);
    let dir = common::scratch("kld-tool");
    std::fs::create_dir_all(dir.join("suites")).unwrap();
    let base = dir.join("suites/f16.kld");
    let text_path = repo().join("suites/data/wikitext-2-test.txt");
    let common = [
        "-c", "512", "--chunks", "4", "-b", "512", "-fa", "off", "-t", &t,
    ];
    let b = base.display().to_string();
    let mut args = common.to_vec();
    args.extend(["--kl-divergence-base", b.as_str()]);
    run_tool(&tool, &f16.file.path, &text_path, &args);
    let mut args = common.to_vec();
    args.extend(["--kl-divergence-base", b.as_str(), "--kl-divergence"]);
    let log = run_tool(&tool, &q8.file.path, &text_path, &args);
    let tool_kld = printed_after(&log, "Mean    KLD");
    let tool_same = printed_after(&log, "Same top p") / 100.0;
    let tool_p99 = printed_after(&log, "99.0%   KLD");
    let tool_dp = printed_after(&log, "Mean    Δp") / 100.0;

    std::fs::copy(
        repo().join("suites/models.toml"),
        dir.join("suites/models.toml"),
    )
    .unwrap();
    let sha = quantgate::core::fsutil::sha256_file(&base, |_| {})
        .unwrap()
        .0;
    let head = |reference: &str| {
        format!(
            "kind = \"kld\"\nmodels = [\"smollm2-q8_0\"]\n{reference}\n[text]\npath = \"{}\"\n\
             sha256 = \"{WIKI_SHA}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 512\nchunks = 4\n",
            text_path.display()
        )
    };
    std::fs::write(
        dir.join("suites/imported.toml"),
        head(&format!(
            "[reference_kld]\npath = \"f16.kld\"\nsha256 = \"{sha}\"\n"
        )),
    )
    .unwrap();
    std::fs::write(
        dir.join("suites/exact.toml"),
        head("reference = \"smollm2-f16\""),
    )
    .unwrap();
    let (registry, planned) = quantgate::plan::plan(&dir.join("suites"), &[], &[]).unwrap();
    let runner = quantgate::execute::RunContext::new(
        &quantgate::Config::load().unwrap(),
        registry,
        engine.clone(),
        threads,
    );
    // Both cases score the same windows of Q8_0: one decode between them,
    // or, where a kld case compared those windows with F16 before (README's
    // publisher test's, in a whole run), the exact case reads its kept
    // comparisons and only the imported one decodes.
    let outcomes = common::run_planned(runner, &planned, 1);
    let get = |case: &str| {
        let o = outcomes.iter().find(|o| o.case == case).unwrap();
        assert_eq!(
            o.status,
            quantgate::core::Status::Pass,
            "{case}: {:?}",
            o.error
        );
        o
    };
    let (imported, exact) = (get("imported"), get("exact"));
    let (i, e) = (&imported.timings, &exact.timings);
    assert!(
        (i.shared_with == 1 && e.shared_with == 1)
            || (i.shared_with == 0 && e.shared_with == 0 && e.decode.is_zero()),
        "imported {i:?}, exact {e:?}"
    );
    let (imported, exact) = (&imported.metrics, &exact.metrics);
    eprintln!(
        "KLD Q8_0 vs F16, 4 chunks: llama-perplexity {tool_kld} (p99 {tool_p99}), \
         quantgate on its base file {:.6} (p99 {:.6}), quantgate exact {:.6} (p99 {:.6}); \
         same top: tool {tool_same}, imported {:.5}, exact {:.5}",
        imported["kld_mean"],
        imported["kld_p99"],
        exact["kld_mean"],
        exact["kld_p99"],
        imported["same_top"],
        exact["same_top"]
    );
    assert_eq!(imported["positions"], 4.0 * 255.0);
    assert_eq!(exact["positions"], 4.0 * 255.0);
    assert_eq!(imported["approx_positions"], 4.0 * 255.0);
    assert_eq!(exact["approx_positions"], 0.0);
    // On the tool's own base file: its numbers, to the printed digits (the
    // candidate side differs only by the tool's float arithmetic).
    for (metric, printed) in [
        ("kld_mean", tool_kld),
        ("kld_p99", tool_p99),
        ("same_top", tool_same),
        ("dp_mean", tool_dp),
    ] {
        let v = imported[metric];
        assert!(same_printed(v, printed, 5), "{metric}: {v} vs {printed}");
    }
    // Exact vs 16-bit: the tool's floor at −16 drops a little of every row.
    assert!(
        (exact["kld_mean"] - tool_kld).abs() < 2e-4,
        "{} vs {tool_kld}",
        exact["kld_mean"]
    );
    assert!((exact["same_top"] - tool_same).abs() <= 2.0 / 1020.0);
    // The tool's base file (~100 MB) is kept in the tool-run cache, not here.
    let _ = std::fs::remove_dir_all(&dir);
}

/// quantgate's scores of a task file on `v` as the reference store keeps
/// them for every multiple-choice case (read back when an earlier run or
/// case kept them, `score`d otherwise): the very numbers the kind reads.
#[allow(clippy::too_many_arguments)]
fn kept_mc_scores(
    engine: &LlamaEngine,
    v: &quantgate::models::Verified,
    model: &dyn quantgate::engine::LoadedModel,
    file: &Path,
    format: quantgate::kinds::multiple_choice::Format,
    tasks: usize,
    settings: &quantgate::core::Settings,
    score: &dyn Fn() -> quantgate::core::error::Result<quantgate::kinds::multiple_choice::Scores>,
) -> Arc<quantgate::kinds::multiple_choice::KeptScores> {
    use quantgate::kinds::multiple_choice::{kept_scores, KeptScores, ScoresId};
    let store = ReferenceStore::new(
        quantgate::Config::load().unwrap().cache.join("reference"),
        &quantgate::Config::load().unwrap(),
    );
    let build = engine.model_identity(&v.file.alias);
    let file_sha256 = quantgate::core::fsutil::sha256_file(file, |_| {})
        .unwrap()
        .0;
    let id = ScoresId {
        model_sha256: &v.file.sha256,
        build: &build,
        file_sha256: &file_sha256,
        format,
        tasks,
        settings,
    };
    kept_scores(&store, &id, &|| Ok(KeptScores::of(model, score()?))).unwrap()
}

/// The running accuracy × 100 the tool prints after each task
/// (`task\tacc_norm…` lines, a `%` after the value for HellaSwag).
fn running_accuracy(log: &str) -> Vec<f64> {
    log.lines()
        .skip_while(|l| !l.starts_with("task\tacc_norm"))
        .skip(1)
        .map_while(|l| {
            let mut f = l.split('\t');
            f.next()?.trim().parse::<usize>().ok()?;
            f.next()?.trim().trim_end_matches('%').parse::<f64>().ok()
        })
        .collect()
}

/// llama-perplexity's `--multiple-choice` (every task, and 20 drawn with
/// `--multiple-choice-tasks`), `--hellaswag` and `--winogrande` (each task's
/// two scores to the printed digit, and its pick) on pinned computed task
/// files: quantgate's kind scores them as the tool does, so every task's
/// verdict, in the tool's order (its running accuracy, printed per task,
/// gives each task right or wrong), and the final accuracy equal the
/// tool's, on F16 and Q4_K_M; the pinned files are byte for byte what the
/// generators write. quantgate's side is the scores as the reference store
/// keeps them for every multiple-choice case.
#[test]
fn multiple_choice_equals_llama_perplexity() {
    use quantgate::kinds::multiple_choice::{
        choice, computed_hellaswag, computed_tasks, read_binary, read_hellaswag, score,
        write_binary, write_hellaswag, Format,
    };
    let (_lane, threads) = lane();
    let t = threads.to_string();
    let mc = repo().join("suites/data/mc-computed.bin");
    let hs = repo().join("suites/data/hs-computed.txt");
    let mc_bytes = std::fs::read(&mc).unwrap();
    let hs_bytes = std::fs::read(&hs).unwrap();
    assert_eq!(
        write_binary(&computed_tasks(64, 2026)),
        mc_bytes,
        "the pinned task file is the generated one"
    );
    assert_eq!(
        write_hellaswag(&computed_hellaswag(48, 2027))
            .unwrap()
            .into_bytes(),
        hs_bytes,
        "the pinned HellaSwag file is the generated one"
    );
    let wg = repo().join("suites/data/wg-computed.csv");
    assert_eq!(
        quantgate::kinds::multiple_choice::computed_winogrande(40, 2028).into_bytes(),
        std::fs::read(&wg).unwrap(),
        "the pinned WinoGrande file is the generated one"
    );
    let runs: [(&std::path::Path, Format, usize, &[&str]); 3] = [
        (&mc, Format::MultipleChoice, 0, &["--multiple-choice"]),
        (
            &mc,
            Format::MultipleChoice,
            20,
            &["--multiple-choice", "--multiple-choice-tasks", "20"],
        ),
        (&hs, Format::Hellaswag, 400, &["--hellaswag"]),
    ];
    let tool = common::llama_perplexity_tool();
    let (engine, verified) = models(&["smollm2-f16", "smollm2-q4_k_m"]);
    for v in &verified {
        let model = engine.load(&v.file).unwrap();
        let mut settings = quantgate::core::Settings::new(2048, threads);
        settings.n_batch = 2048;
        settings.n_ubatch = 512;
        settings.n_seq = 4;
        // WinoGrande: the tool prints each task's two scores (6 decimals) and its pick.
        let wtasks = quantgate::kinds::multiple_choice::read_winogrande(
            &std::fs::read(&wg).unwrap(),
            0,
            "wg",
        )
        .unwrap();
        let log = run_tool(
            &tool,
            &v.file.path,
            &wg,
            &["--winogrande", "-c", "512", "-t", &t, "-fa", "off"],
        );
        let printed: Vec<(f64, f64, usize)> = log
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 6 && f[0].parse::<usize>().is_ok()).then(|| {
                    (
                        f[2].parse().unwrap(),
                        f[3].parse().unwrap(),
                        f[4].parse().unwrap(),
                    )
                })
            })
            .collect();
        assert_eq!(printed.len(), wtasks.len(), "{log}");
        let scores = kept_mc_scores(
            &engine,
            v,
            &*model,
            &wg,
            Format::Winogrande,
            0,
            &settings,
            &|| {
                quantgate::kinds::multiple_choice::score_winogrande(
                    &*model, &settings, &wtasks, "wg",
                )
            },
        );
        for (i, (s, p)) in scores.scores.iter().zip(&printed).enumerate() {
            let pick = quantgate::kinds::multiple_choice::pick(Format::Winogrande, s) + 1;
            assert_eq!(
                pick, p.2,
                "{}: WinoGrande task {i}: {s:?} against the tool's {p:?}",
                v.file.alias
            );
            assert!(
                (s[0] - p.0).abs() <= 5e-7 && (s[1] - p.1).abs() <= 5e-7,
                "{}: WinoGrande task {i}: {s:?} against the tool's {p:?}",
                v.file.alias
            );
        }
        for (file, format, n, flags) in runs {
            let bytes = std::fs::read(file).unwrap();
            let tasks = match format {
                Format::Hellaswag => read_hellaswag(&bytes, n, "hs").unwrap(),
                _ => read_binary(&bytes, n, "mc").unwrap(),
            };
            let args: Vec<&str> = flags
                .iter()
                .copied()
                .chain(["-c", "512", "-t", &t, "-fa", "off"])
                .collect();
            let log = run_tool(&tool, &v.file.path, file, &args);
            let running = running_accuracy(&log);
            assert_eq!(running.len(), tasks.len(), "{flags:?}: {log}");
            let scores = kept_mc_scores(&engine, v, &*model, file, format, n, &settings, &|| {
                score(&*model, &settings, &tasks, format, "tasks")
            });
            let mut correct = 0;
            for (i, ((_, t), s)) in tasks.iter().zip(&scores.scores).enumerate() {
                let right = t.labels[choice(s)] == 1;
                correct += usize::from(right);
                let ours = 100.0 * correct as f64 / (i + 1) as f64;
                assert!(
                    (ours - running[i]).abs() < 5e-7,
                    "{} {flags:?}: task {i}: ours {ours:.8} (right: {right}), the tool's {:.8}",
                    v.file.alias,
                    running[i]
                );
            }
            if let Some(line) = log.lines().find(|l| l.contains("Final result:")) {
                let printed: f64 = line
                    .split("Final result:")
                    .nth(1)
                    .unwrap()
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(
                    (printed - 100.0 * correct as f64 / tasks.len() as f64).abs() < 5e-5,
                    "{line}"
                );
            } else {
                // The tool prints no final line for HellaSwag, nor for a draw of < 100 tasks.
                assert!(
                    format == Format::Hellaswag || (n > 0 && n < 100),
                    "no final result: {log}"
                );
            }
        }
    }
}

/// An external runtime gives the numbers the linked build gives: llama.cpp's
/// own llama-perplexity of the very sources and flags quantgate links (the
/// `own` runtime of suites/runtimes.toml, built by the same script as the
/// tool here) writes, through its `--kl-divergence-base` file, rows
/// byte-equal to the ones quantgate encodes from its own logits, on F16 and
/// Q4_K_M: `quantgate drift` finds every figure 0, each runtime's floor 0,
/// and says the rows are bit-equal; `quantgate runtimes own` names its
/// sha256 and version.
#[test]
fn an_external_runtime_of_the_linked_sources_gives_its_numbers_bit_for_bit() {
    let (_lane, threads) = lane();
    common::llama_perplexity_tool();
    let bin = env!("CARGO_BIN_EXE_quantgate");
    let out = Command::new(bin)
        .current_dir(repo())
        .args(["runtimes", "own"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("own") && said.contains("sha256") && said.contains("version"),
        "{said}"
    );
    let json = common::scratch("drift-own.json");
    let out = Command::new(bin)
        .current_dir(repo())
        .args(["drift", "--runtime", "linked", "--runtime", "own"])
        .args(["--model", "smollm2-f16", "--model", "smollm2-q4_k_m"])
        .args(["--chunks", "2", "--threads", &threads.to_string(), "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let models = doc["models"].as_array().unwrap();
    assert_eq!(models.len(), 2, "{doc}");
    for m in models {
        let g = |k: &str| m["metrics"][k].as_f64().unwrap_or(f64::NAN);
        assert_eq!(g("bit_identical"), 1.0, "{}: {table}", m["model"]);
        assert_eq!(g("floor_bit_identical"), 1.0, "{}", m["model"]);
        for k in ["kld_max", "kld_mean", "delta_nll_mean", "floor_kld_max"] {
            assert_eq!(g(k), 0.0, "{}: {k}", m["model"]);
        }
        assert_eq!(g("ppl_a"), g("ppl_b"));
        assert_eq!(g("positions"), 2.0 * 255.0);
    }
    assert!(
        table.contains("| smollm2-f16 |") && table.contains("| yes |"),
        "{table}"
    );
    let _ = std::fs::remove_file(&json);
}
