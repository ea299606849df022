//! The `quantgate` binary on bad input and on the real fixture, one file
//! per subcommand or concern (run, report, reference, inspect, publish, the
//! harness, trust, robustness, the package); here, what they share: the
//! fixture, fresh folders, and running the binary.

#[path = "../common/mod.rs"]
mod common;
mod diff;
mod harness;
mod inspect;
mod package;
mod publish;
mod reference;
mod report;
mod robustness;
mod run;
mod runtimes;
mod trust;

use quantgate::engine::llama::LlamaEngine;
use quantgate::engine::Engine;
use quantgate::models::Registry;
use std::path::{Path, PathBuf};
use std::process::Command;

const WIKI_SHA: &str = "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0";

fn repo() -> PathBuf {
    quantgate::harness::project_root()
}

/// The fixture model's path, fetched if needed.
fn fixture_path() -> PathBuf {
    registry_file("smollm2-q4_1")
}

/// `<tmp>/qg-cli-<tag>-<pid>/`, emptied: a test's own folder ([`common::scratch`]: removed when the tests pass).
fn fresh_dir(tag: &str) -> PathBuf {
    common::scratch(&format!("cli-{tag}"))
}

/// A suites dir with the real fixture registered as `tiny` and the corpus.
fn suites(tag: &str) -> PathBuf {
    let root = fresh_dir(tag);
    std::fs::create_dir_all(root.join("ppl")).unwrap();
    std::fs::write(
        root.join("models.toml"),
        format!(
            "[tiny]\nsha256 = \"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53\"\nbytes = 98362432\npath = \"{}\"\n",
            fixture_path().display()
        ),
    )
    .unwrap();
    std::fs::copy(
        repo().join("suites/data/wikitext-2-test.txt"),
        root.join("ppl/wiki.txt"),
    )
    .unwrap();
    root
}

fn case(n_ctx: u32, gate: &str) -> String {
    format!(
        "kind = \"perplexity\"\nmodels = [\"tiny\"]\n[text]\npath = \"wiki.txt\"\nsha256 = \"{WIKI_SHA}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = {n_ctx}\nchunks = 2\n{gate}"
    )
}

/// `quantgate --suites ROOT ARGS…`: exit code, stdout, stderr.
fn quantgate(root: &Path, args: &[&str]) -> (i32, String, String) {
    output(
        Command::new(env!("CARGO_BIN_EXE_quantgate"))
            .arg("--suites")
            .arg(root)
            .args(args),
    )
}

/// Run `cmd`: exit code, stdout, stderr.
fn output(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `quantgate run --threads 1 ARGS…` on the suites at ROOT.
fn run(root: &Path, args: &[&str]) -> (i32, String, String) {
    quantgate(root, &[&["run", "--threads", "1"], args].concat())
}

/// `quantgate` with extra environment: exit code, stdout, stderr.
fn quantgate_env(root: &Path, env: &[(&str, &Path)], args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_quantgate"));
    c.arg("--suites").arg(root).args(args);
    c.env_remove("QUANTGATE_REFERENCE_DIR")
        .env_remove("QUANTGATE_REFERENCE_MISSING");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The metrics of a `--json` file, by test.
fn json_metrics(path: &Path) -> Vec<(String, serde_json::Value)> {
    let v: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.into_iter()
        .map(|o| {
            (
                format!(
                    "{}::{}",
                    o["case"].as_str().unwrap(),
                    o["model"].as_str().unwrap()
                ),
                o["metrics"].clone(),
            )
        })
        .collect()
}

/// The registry's file for `alias`, fetched or derived if needed.
fn registry_file(alias: &str) -> PathBuf {
    common::registry_model(alias).file.path
}

/// A suites dir for the reference tests: `ref` (F16, through a link the test
/// can take away) and `cand` (Q8_0), a kld and a paired-ΔNLL case of two
/// 128-token windows against `ref`.
fn reference_suites(tag: &str) -> (PathBuf, PathBuf) {
    let root = fresh_dir(tag);
    let suites = root.join("suites");
    for d in ["kld", "ppl"] {
        std::fs::create_dir_all(suites.join(d)).unwrap();
        std::fs::copy(
            repo().join("suites/data/wikitext-2-test.txt"),
            suites.join(d).join("wiki.txt"),
        )
        .unwrap();
    }
    let link = root.join("ref.gguf");
    std::os::unix::fs::symlink(registry_file("smollm2-f16"), &link).unwrap();
    let reg = Registry::load(&repo().join("suites/models.toml")).unwrap();
    let pin = |a: &str| {
        let e = reg.entry(a).unwrap();
        (e.sha256.clone().unwrap(), e.bytes.unwrap())
    };
    let ((rs, rb), (cs, cb)) = (pin("smollm2-f16"), pin("smollm2-q8_0"));
    std::fs::write(
        suites.join("models.toml"),
        format!(
            "[ref]\nsha256 = \"{rs}\"\nbytes = {rb}\npath = \"{}\"\n\n[cand]\nsha256 = \"{cs}\"\nbytes = {cb}\npath = \"{}\"\n",
            link.display(),
            registry_file("smollm2-q8_0").display()
        ),
    )
    .unwrap();
    let body = |kind: &str| {
        format!(
            "kind = \"{kind}\"\nmodels = [\"cand\"]\nreference = \"ref\"\n[text]\npath = \"wiki.txt\"\nsha256 = \"{WIKI_SHA}\"\n[window]\nmode = \"llama-perplexity\"\nn_ctx = 128\nchunks = 2\n"
        )
    };
    std::fs::write(suites.join("kld/k.toml"), body("kld")).unwrap();
    std::fs::write(suites.join("ppl/d.toml"), body("perplexity")).unwrap();
    (suites, link)
}
