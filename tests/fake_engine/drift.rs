//! Drift cases (`kind = "drift"`) on the fake engine, against external
//! runtimes that are shell scripts answering as llama-perplexity does:
//! `--help` naming `--kl-divergence-base`, `--version`, and a run that puts
//! a prepared base file where it is asked to. The linked engine writes the
//! base file such a runtime hands back, so every figure is known.

use crate::common;

use quantgate::core::case::{Location, Pin};
use quantgate::core::{Outcome, Status};
use quantgate::engine::fake::{FakeEngine, FakeSpec};
use quantgate::engine::BosPolicy;
use quantgate::execute::runtime::basefile::{OwnedRow, Reader, Writer};
use quantgate::execute::windows::Windowing;
use quantgate::execute::RunContext;
use quantgate::kinds::scored_text::{Bootstrap, ScoredText, Source};
use quantgate::plan::plan;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const N_CTX: u32 = 32;
const CHUNKS: usize = 6;

fn text() -> String {
    (0..N_CTX as usize * (CHUNKS + 1))
        .map(|i| char::from(b'a' + ((i * 5 + i / 7) % 26) as u8))
        .collect()
}

fn engine() -> FakeEngine {
    FakeEngine::new().with("m", FakeSpec::default())
}

struct Fx {
    root: PathBuf,
}

impl Fx {
    fn new(tag: &str) -> Fx {
        let root = common::fake_root(&format!("drift-{tag}"), &[("m", 100)]);
        std::fs::write(root.join("suites/t.txt"), text()).unwrap();
        Fx { root }
    }

    fn suites(&self) -> PathBuf {
        self.root.join("suites")
    }

    fn cx(&self) -> RunContext {
        let (registry, _) = plan(&self.suites(), &[], &[]).unwrap_or_else(|_| {
            // No case yet: the registry alone.
            (
                quantgate::models::Registry::load(&self.suites().join("models.toml")).unwrap(),
                Vec::new(),
            )
        });
        let mut cx = RunContext::new(
            &common::fixture_config(&self.root),
            registry,
            Arc::new(engine()),
            2,
        );
        cx.references.dir = self.root.join("cache");
        cx
    }

    /// The linked engine's base file of the case's windows on `m`, at
    /// `path`.
    fn linked_base_file(&self, path: &Path) {
        let cx = self.cx();
        let tx = ScoredText {
            source: Source::Text(BosPolicy::Model),
            pin: Pin {
                table: "text",
                path: self.suites().join("t.txt"),
                sha256: quantgate::core::fsutil::sha256_bytes(text().as_bytes()),
                at: Location("test".into()),
            },
            windowing: Windowing::LlamaPerplexity {
                n_ctx: N_CTX,
                chunks: Some(CHUNKS),
                skip: 0,
            },
            window_at: Location("test".into()),
            n_batch: N_CTX,
            bootstrap: Bootstrap::default(),
        };
        let (_, model) = cx.load("m").unwrap();
        let plan = tx.plan_for(&cx, &text(), &*model).unwrap();
        let settings = tx.settings(1, cx.options());
        quantgate::execute::runtime::linked_base_file(&*model, &settings, &plan, path).unwrap();
    }

    /// A runtime script `name` that answers `--help` and `--version` as
    /// llama-perplexity does and, run with `-t 1`, hands back `one`, else
    /// `other`; declared in runtimes.toml as pinned by its sha256 (or by
    /// `pin` when given).
    fn runtime(&self, name: &str, one: &Path, other: &Path, pin: Option<&str>) {
        let script = self.suites().join(format!("{name}.sh"));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n\
                 case \"$1\" in --help) echo 'usage: llama-perplexity [options]'; \
                 echo '  --kl-divergence-base FNAME'; exit 0;; \
                 --version) echo 'version: 1 ({name})' >&2; exit 0;; esac\n\
                 file='{}'\n\
                 while [ $# -gt 0 ]; do\n\
                   case \"$1\" in -t) [ \"$2\" = 1 ] && file='{}';; \
                   --kl-divergence-base) out=$2;; esac\n\
                   shift\n\
                 done\n\
                 cp \"$file\" \"$out\"\n",
                other.display(),
                one.display()
            ),
        )
        .unwrap();
        self.declare(name, pin);
    }

    /// The script `<suites>/<name>.sh` made executable and declared in
    /// runtimes.toml, pinned by its sha256 (or by `pin` when given).
    fn declare(&self, name: &str, pin: Option<&str>) {
        let script = self.suites().join(format!("{name}.sh"));
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let sha = match pin {
            Some(p) => p.to_string(),
            None => {
                quantgate::core::fsutil::sha256_file(&script, |_| {})
                    .unwrap()
                    .0
            }
        };
        let file = self.suites().join("runtimes.toml");
        let mut all = std::fs::read_to_string(&file).unwrap_or_default();
        all.push_str(&format!(
            "[{name}]\npath = \"{name}.sh\"\nsha256 = \"{sha}\"\n"
        ));
        std::fs::write(file, all).unwrap();
    }

    fn case(&self, name: &str, runtimes: &str) {
        std::fs::write(
            self.suites().join(format!("{name}.toml")),
            format!(
                "kind = \"drift\"\nmodels = [\"m\"]\nruntimes = {runtimes}\n\
                 [text]\npath = \"t.txt\"\nsha256 = \"{}\"\n\
                 [window]\nmode = \"llama-perplexity\"\nn_ctx = {N_CTX}\nchunks = {CHUNKS}\n\
                 [[gate]]\nmetric = \"kld_mean\"\nmax = 1e-4\n",
                quantgate::core::fsutil::sha256_bytes(text().as_bytes())
            ),
        )
        .unwrap();
    }

    fn run(&self, name: &str) -> Outcome {
        let (registry, planned) = plan(&self.suites(), &[name.to_string()], &[]).unwrap();
        let mut cx = RunContext::new(
            &common::fixture_config(&self.root),
            registry,
            Arc::new(engine()),
            2,
        );
        cx.references.dir = self.root.join("cache");
        quantgate::schedule::trial(&cx, &planned[0], &self.root.join("goldens"))
    }
}

/// `src` with the top entry of the row at `row` (counting from 0) moved
/// down by `by`.
fn perturbed(src: &Path, dst: &Path, row: usize, by: u16) {
    let mut r = Reader::open(src).unwrap();
    let mut w = Writer::create(dst, &r.head.clone()).unwrap();
    let mut x = OwnedRow {
        scale: 0.0,
        min: 0.0,
        q: Vec::new(),
    };
    let mut i = 0;
    while r.next_row(&mut x).unwrap() {
        if i == row {
            let top = (0..x.q.len())
                .max_by_key(|&j| (x.q[j], std::cmp::Reverse(j)))
                .unwrap();
            x.q[top] -= by;
        }
        w.row(&x).unwrap();
        i += 1;
    }
    w.finish().unwrap();
}

/// A runtime that hands back the linked engine's own base file is the
/// linked runtime bit for bit: every figure 0, each floor 0, the gate
/// held. One whose file differs at one position shows it (KL at one
/// position, the rest byte-equal) and fails a gate it exceeds; one that
/// differs from itself between thread counts has a floor that says so.
/// Each runtime's identity is recorded.
#[test]
fn a_drift_case_measures_runtimes_against_each_other_and_themselves() {
    let fx = Fx::new("measure");
    let (base, moved) = (fx.root.join("base.kld"), fx.root.join("moved.kld"));
    fx.linked_base_file(&base);
    perturbed(&base, &moved, 3, 20_000);
    fx.runtime("same", &base, &base, None);
    fx.runtime("other", &moved, &moved, None);
    fx.runtime("flaky", &moved, &base, None);

    fx.case("same", "[\"linked\", \"same\"]");
    let o = fx.run("same");
    assert!(o.error.is_none(), "{:?}", o.error);
    let positions = (CHUNKS * (N_CTX as usize - 1 - N_CTX as usize / 2)) as f64;
    let m = &o.metrics;
    assert_eq!(m["positions"], positions);
    assert_eq!(m["windows"], CHUNKS as f64);
    for k in [
        "bit_identical",
        "floor_bit_identical",
        "same_top",
        "floor_same_top",
    ] {
        assert_eq!(m[k], 1.0, "{k}");
    }
    for k in [
        "kld_mean",
        "kld_max",
        "delta_nll_mean",
        "floor_kld_max",
        "floor_delta_nll",
    ] {
        assert_eq!(m[k], 0.0, "{k}");
    }
    assert_eq!(m["ppl_a"], m["ppl_b"]);
    assert_eq!(o.status, Status::Pass);
    assert!(
        o.runtimes[1].starts_with("B: same sha256 ") && o.runtimes[1].contains("version: 1 (same)"),
        "{:?}",
        o.runtimes
    );
    assert!(o.runtimes[0].starts_with("A: linked ("), "{:?}", o.runtimes);

    // One position differs: KL there, and only there.
    fx.case("other", "[\"linked\", \"other\"]");
    let o = fx.run("other");
    assert!(o.error.is_none(), "{:?}", o.error);
    let m = &o.metrics;
    assert_eq!(m["bit_identical"], 0.0);
    assert_eq!(m["rows_identical"], positions - 1.0);
    assert!(
        m["kld_max"] > 0.0 && m["kld_mean"] == m["kld_max"] / positions,
        "{m:?}"
    );
    assert_eq!(m["floor_kld_max"], 0.0);
    // The KL at that position, computed here from the two rows.
    let (mut ra, mut rb) = (Reader::open(&base).unwrap(), Reader::open(&moved).unwrap());
    let (mut a, mut b) = (
        OwnedRow {
            scale: 0.0,
            min: 0.0,
            q: Vec::new(),
        },
        OwnedRow {
            scale: 0.0,
            min: 0.0,
            q: Vec::new(),
        },
    );
    for _ in 0..4 {
        ra.next_row(&mut a).unwrap();
        rb.next_row(&mut b).unwrap();
    }
    let lp = |r: &OwnedRow, i: usize| f64::from(r.scale * f32::from(r.q[i]) + r.min);
    // Each row normalized over its entries above −16.
    let norm = |r: &OwnedRow| {
        (0..r.q.len())
            .map(|i| lp(r, i))
            .filter(|v| *v > -16.0)
            .map(f64::exp)
            .sum::<f64>()
            .ln()
    };
    let (na, nb) = (norm(&a), norm(&b));
    let kl: f64 = (0..a.q.len())
        .filter(|&i| lp(&b, i) > -16.0)
        .map(|i| (lp(&b, i) - nb).exp() * ((lp(&b, i) - nb) - (lp(&a, i) - na)))
        .sum();
    assert!(
        (m["kld_max"] - kl).abs() <= 1e-12 * kl.abs().max(1.0),
        "{} {kl}",
        m["kld_max"]
    );
    if m["kld_mean"] > 1e-4 {
        assert_eq!(o.status, Status::Fail);
    }

    // A runtime that differs from itself between thread counts: its floor
    // is that difference.
    fx.case("flaky", "[\"linked\", \"flaky\"]");
    let o = fx.run("flaky");
    assert!(o.error.is_none(), "{:?}", o.error);
    assert_eq!(o.metrics["floor_bit_identical"], 0.0);
    assert!(o.metrics["floor_kld_max"] > 0.0, "{:?}", o.metrics);

    // A baseline that differs from itself run twice as it is (the same
    // threads, the same binary; think of a GPU build's atomics): the floor
    // says so even where another thread count would not.
    let script = fx.suites().join("jitter.sh");
    let count = fx.root.join("jitter.count");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh
             case \"$1\" in --help) echo '  --kl-divergence-base FNAME'; exit 0;;              --version) echo 'version: 1 (jitter)' >&2; exit 0;; esac
             n=$(cat '{c}' 2>/dev/null || echo 0); n=$((n + 1)); echo $n > '{c}'
             file='{base}'; [ $n = 2 ] && file='{moved}'
             while [ $# -gt 0 ]; do [ \"$1\" = --kl-divergence-base ] && out=$2; shift; done
             cp \"$file\" \"$out\"
",
            c = count.display(),
            base = base.display(),
            moved = moved.display()
        ),
    )
    .unwrap();
    fx.declare("jitter", None);
    fx.case("jitter", "[\"jitter\", \"linked\"]");
    let o = fx.run("jitter");
    assert!(o.error.is_none(), "{:?}", o.error);
    // Its first run is the linked rows; its second (the repeat) is not.
    assert_eq!(o.metrics["bit_identical"], 1.0, "{:?}", o.metrics);
    assert_eq!(o.metrics["floor_bit_identical"], 0.0, "{:?}", o.metrics);
    assert!(o.metrics["floor_kld_max"] > 0.0, "{:?}", o.metrics);
}

/// A runtime is used only as pinned: a binary whose sha256 is not its pin
/// is refused naming the runtime, the file and both hashes; a binary that
/// is not llama-perplexity is refused saying so; a runtime not declared is
/// a parse error naming the key's position. Two runtimes never share a
/// cached result: the same case with another binary under the same name
/// is not answered from the result cache.
#[test]
fn a_runtime_is_used_only_as_pinned_and_never_shares_a_result() {
    let fx = Fx::new("pinned");
    let (base, moved) = (fx.root.join("base.kld"), fx.root.join("moved.kld"));
    fx.linked_base_file(&base);
    perturbed(&base, &moved, 0, 30_000);
    let zero = "0".repeat(64);
    fx.runtime("wrong", &base, &base, Some(&zero));
    fx.case("wrong", "[\"linked\", \"wrong\"]");
    let o = fx.run("wrong");
    let e = o.error.as_deref().unwrap_or_default();
    assert!(
        e.contains("[wrong]") && e.contains("wrong.sh has sha256") && e.contains(&zero),
        "{e}"
    );
    assert_ne!(o.status, Status::Pass);
    // Not llama-perplexity: its --help names no --kl-divergence-base.
    let script = fx.suites().join("hello.sh");
    std::fs::write(&script, "#!/bin/sh\necho hello\n").unwrap();
    fx.declare("hello", None);
    fx.case("hello", "[\"linked\", \"hello\"]");
    let e = fx.run("hello").error.unwrap_or_default();
    assert!(e.contains("is not llama-perplexity-compatible"), "{e}");
    // Not declared: a parse error at the name.
    fx.case("nowhere", "[\"linked\", \"nowhere\"]");
    let err = plan(&fx.suites(), &["nowhere".to_string()], &[])
        .map(|(_, p)| p[0].case.as_ref().err().map(|e| e.message.clone()))
        .unwrap()
        .unwrap_or_default();
    assert!(
        err.contains("nowhere.toml:3:") && err.contains("runtime `nowhere` is not declared"),
        "{err}"
    );

    // The same case, the same runtime name, another binary: another key.
    fx.runtime("b", &base, &base, None);
    fx.case("keyed", "[\"linked\", \"b\"]");
    let (registry, planned) = plan(&fx.suites(), &["keyed".to_string()], &[]).unwrap();
    let cx = RunContext::new(
        &common::fixture_config(&fx.root),
        registry,
        Arc::new(engine()),
        2,
    );
    let first = fx.run("keyed");
    assert_eq!(first.metrics["bit_identical"], 1.0);
    quantgate::judge::cache::write(&cx, &planned[0], &first);
    assert!(quantgate::judge::cache::read(&cx, &planned[0]).is_some());
    assert_eq!(
        std::fs::read_dir(common::fixture_cache(&fx.root).join("results"))
            .unwrap()
            .count(),
        1,
        "the entry is in the fixture's cache"
    );
    let file = fx.suites().join("runtimes.toml");
    let toml = std::fs::read_to_string(&file).unwrap();
    let b_old = toml.split("[b]").nth(1).unwrap().to_string();
    std::fs::write(&file, toml.replace(&format!("[b]{b_old}"), "")).unwrap();
    fx.runtime("b", &moved, &moved, None);
    assert!(quantgate::judge::cache::read(&cx, &planned[0]).is_none());
}
