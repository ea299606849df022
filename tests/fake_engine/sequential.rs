//! Sequential cases (`[decide] sequential = true`) on the fake engine,
//! against the fixed-N run of the same windows: the verdict, the stopping
//! point (replayed from the fixed-N per-window series in the seeded order),
//! the metrics over the windows used, the reference decoded only for the
//! windows some candidate needed (or not at all from a warm store), the
//! fixed-N numbers at N, a value outside its bounds, and every bad
//! `[decide]` table.

use crate::common;

use quantgate::core::{Outcome, Status};
use quantgate::engine::fake::{FakeEngine, FakeSpec};
use quantgate::execute::RunContext;
use quantgate::kinds::scored_text::STEP;
use quantgate::measure::sequential::{decided, permutation, MeanSequence};
use quantgate::plan::plan;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const N_CTX: usize = 32;
const CHUNKS: usize = 40;

fn text() -> String {
    (0..N_CTX * CHUNKS + 10)
        .map(|i| char::from(b'a' + ((i * 7 + i / 13 + i * i / 31) % 26) as u8))
        .collect()
}

struct Fx {
    root: PathBuf,
}

/// The reference and two candidates: one close to it, one far.
fn engine() -> FakeEngine {
    FakeEngine::new()
        .with("ref", FakeSpec::default())
        .with(
            "near",
            FakeSpec {
                confidence: 3.8,
                ..FakeSpec::default()
            },
        )
        .with(
            "far",
            FakeSpec {
                confidence: 9.0,
                ..FakeSpec::default()
            },
        )
}

impl Fx {
    fn new(tag: &str) -> Fx {
        let root = common::fake_root(
            &format!("seq-{tag}"),
            &[("ref", 100), ("near", 101), ("far", 102)],
        );
        std::fs::write(root.join("suites/t.txt"), text()).unwrap();
        Fx { root }
    }

    /// Write case `name` with `extra` (gates, `[decide]`) after the text
    /// and windows.
    fn case(&self, name: &str, extra: &str) {
        self.case_over(name, CHUNKS, extra);
    }

    /// [`Fx::case`] over the first `chunks` windows.
    fn case_over(&self, name: &str, chunks: usize, extra: &str) {
        std::fs::write(
            self.root.join(format!("suites/{name}.toml")),
            format!(
                "kind = \"perplexity\"\nmodels = [\"near\", \"far\"]\nreference = \"ref\"\n\
                 [text]\npath = \"t.txt\"\nsha256 = \"{}\"\n\
                 [window]\nmode = \"llama-perplexity\"\nn_ctx = {N_CTX}\nchunks = {chunks}\n{extra}",
                quantgate::core::fsutil::sha256_bytes(text().as_bytes())
            ),
        )
        .unwrap();
    }

    /// Run case `name` on both candidates in one context; the outcomes
    /// and the windows decoded (of every model).
    fn run(&self, name: &str) -> (Vec<Outcome>, usize) {
        self.run_on(engine(), name)
    }

    /// [`Fx::run`] on engine `e`.
    fn run_on(&self, e: FakeEngine, name: &str) -> (Vec<Outcome>, usize) {
        let decodes = e.windows.clone();
        let (registry, planned) =
            plan(&self.root.join("suites"), &[name.to_string()], &[]).unwrap();
        let mut cx = RunContext::new(
            &common::fixture_config(&self.root),
            registry,
            Arc::new(e),
            1,
        );
        cx.references.dir = self.root.join("cache");
        let outs = planned
            .iter()
            .map(|p| quantgate::schedule::trial(&cx, p, &self.root.join("goldens")))
            .collect();
        (outs, decodes.load(Ordering::SeqCst))
    }
}

const DECIDE: &str = "[decide]\nsequential = true\nalpha = 0.05\nseed = 11\n";

/// The fixed-N run's per-window ΔNLL series per candidate.
fn fixed(fx: &Fx, gate: &str) -> Vec<Outcome> {
    fx.case("fixed", gate);
    let (outs, _) = fx.run("fixed");
    let models: Vec<&str> = outs.iter().map(|o| o.model.as_str()).collect();
    assert_eq!(models, ["far", "near"]);
    for o in &outs {
        assert!(o.error.is_none(), "{:?}", o.error);
        assert_eq!(o.series["delta_nll_per_window"].len(), CHUNKS);
    }
    outs
}

/// Case `seq`: the ΔNLL gate `max = c`, decided sequentially ([`DECIDE`])
/// within bounds [-5, 5].
fn sequential_case(fx: &Fx, c: f64) {
    fx.case(
        "seq",
        &format!(
            "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = {c}\n{DECIDE}\
             [decide.bounds]\ndelta_nll_mean = [-5.0, 5.0]\n"
        ),
    );
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn a_sequential_case_stops_early_with_the_fixed_n_verdict() {
    let fx = Fx::new("early");
    let base = fixed(&fx, "");
    let (far, near) = (
        mean(&base[0].series["delta_nll_per_window"]),
        mean(&base[1].series["delta_nll_per_window"]),
    );
    assert!(near < far, "{near} {far}");
    // A threshold between the two, far from both: the near one passes, the
    // far one fails, each long before N.
    let c = (near + far) / 2.0;
    sequential_case(&fx, c);
    // A cold store: the fixed-N run kept the reference's scores.
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    let (outs, decodes) = fx.run("seq");
    let mut used_all = Vec::new();
    for (o, b) in outs.iter().zip(&base) {
        assert!(o.error.is_none(), "{}: {:?}", o.model, o.error);
        let fixed_pass = mean(&b.series["delta_nll_per_window"]) <= c;
        assert_eq!(o.status == Status::Pass, fixed_pass, "{}", o.model);
        let used = o.metrics["windows"] as usize;
        assert!(used < CHUNKS, "{}: {used} windows", o.model);
        assert_eq!(o.metrics["windows_total"], CHUNKS as f64);
        // Replayed independently of the run: the fixed-N series in the
        // seeded order, through the sequence, stops at the same window.
        let order = permutation(CHUNKS, 11);
        let series = &b.series["delta_nll_per_window"];
        let mut s = MeanSequence::new(CHUNKS, (-5.0, 5.0), 0.05);
        let mut run = (f64::NEG_INFINITY, f64::INFINITY);
        let mut stop = None;
        for (j, &w) in order.iter().enumerate() {
            s.push(series[w]).unwrap();
            let (lo, hi) = s.bounds();
            run = (run.0.max(lo), run.1.min(hi));
            if decided(Some(c), None, run).is_some() {
                stop = Some((j + 1, run));
                break;
            }
        }
        let (at, (lo, hi)) = stop.expect("decided before N");
        assert_eq!(used, at, "{}", o.model);
        assert_eq!(o.metrics["delta_nll_mean_seq_lo"], lo);
        assert_eq!(o.metrics["delta_nll_mean_seq_hi"], hi);
        assert_eq!(
            o.series["window_order"],
            order[..at].iter().map(|w| *w as f64).collect::<Vec<_>>()
        );
        // The metrics are over the windows used, in window order.
        let mut ws: Vec<usize> = order[..at].to_vec();
        ws.sort_unstable();
        let want: Vec<f64> = ws.iter().map(|&w| series[w]).collect();
        assert_eq!(o.series["delta_nll_per_window"], want);
        assert!((o.metrics["delta_nll_mean"] - mean(&want)).abs() < 1e-12);
        let d = &o.texts["decided"];
        let verdict = if fixed_pass { "pass" } else { "fail" };
        assert!(
            d.contains(&format!(
                "gate[0] delta_nll_mean <= {c}: {verdict} at window {at} of {CHUNKS}"
            )),
            "{d}"
        );
        used_all.push(at);
    }
    // The report shows both rows' PPL (and the reference's) over the
    // windows both decoded: the first `min(used)` of the seeded order,
    // summed from the fixed-N run's own per-window series.
    assert_ne!(used_all[0], used_all[1], "the rows stopped apart");
    let order = permutation(CHUNKS, 11);
    let common = &order[..*used_all.iter().min().unwrap()];
    let ppl_over = |o: &Outcome, suffix: &str| {
        let (sum, tok) = (
            &o.series[&format!("window_nll_sum{suffix}")],
            &o.series[&format!("window_tokens{suffix}")],
        );
        let n: f64 = common.iter().map(|&w| tok[w]).sum();
        (common.iter().map(|&w| sum[w]).sum::<f64>() / n).exp()
    };
    let views =
        quantgate::report::ladder::views(&outs, &quantgate::kinds::presentations(), &|_| {
            quantgate::report::ladder::ModelFacts::default()
        });
    for b in &base {
        let r = views[0].rows.iter().find(|r| r.model == b.model).unwrap();
        let (got, want) = (r.metrics["ppl"], ppl_over(b, ""));
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{}: {got} {want}",
            b.model
        );
        let (got, want) = (r.metrics["ppl_ref"], ppl_over(b, "_ref"));
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{}: ref {got} {want}",
            b.model
        );
        assert_eq!(r.metrics["ppl_windows"], common.len() as f64);
    }
    // Windows go to the engine in pairs (its two lanes): a stop at the first
    // of a pair leaves the second decoded. The reference decoded once per
    // window some candidate needed, and every model's windows kept window
    // by window: a rerun decodes none; damaged window files are decoded
    // again, those alone.
    decoded_once(&fx, (&outs, decodes), &used_all, "qgwin", Kept::EveryModel);
    // A store that holds every model's whole scores (a fixed-N run kept
    // them) serves the windows visited: nothing decodes, and the numbers
    // are the window-by-window run's bit for bit.
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    fixed(&fx, "");
    let (warm, decodes) = fx.run("seq");
    assert_eq!(decodes, 0);
    for (w, o) in warm.iter().zip(&outs) {
        assert_eq!(w.metrics, o.metrics, "{}", o.model);
        assert_eq!(w.texts, o.texts, "{}", o.model);
    }
}

/// Two runs of one sequential case at once on one cache (two processes:
/// nextest's test processes, two CI jobs on one runner), each with its own
/// store in memory: between them they decode each window of each model
/// once, as one run alone does, the one that waited reading what the other
/// kept; and both give the alone run's numbers.
#[test]
fn two_runs_at_once_decode_each_window_once() {
    let fx = Fx::new("at-once");
    let base = fixed(&fx, "");
    sequential_case(
        &fx,
        (mean(&base[0].series["delta_nll_per_window"])
            + mean(&base[1].series["delta_nll_per_window"]))
            / 2.0,
    );
    // Every model slow enough that the two runs' decodes overlap.
    let slow = || {
        let mut e = engine();
        for spec in e.specs.values_mut() {
            spec.sleep_ms = 20;
        }
        e
    };
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    let (alone, alone_decodes) = fx.run_on(slow(), "seq");
    assert!(alone_decodes > 0);
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    let start = std::sync::Barrier::new(2);
    let both: Vec<(Vec<Outcome>, usize)> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    fx.run_on(slow(), "seq")
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(
        both[0].1 + both[1].1,
        alone_decodes,
        "windows decoded by the two runs at once ({} + {}) against one run alone",
        both[0].1,
        both[1].1
    );
    for (outs, _) in &both {
        for (o, a) in outs.iter().zip(&alone) {
            assert!(o.error.is_none(), "{}: {:?}", o.model, o.error);
            assert_eq!(o.metrics, a.metrics, "{}", o.model);
            assert_eq!(o.texts, a.texts, "{}", o.model);
        }
    }
}

/// Which of a sequential case's models keep their decoded parts.
enum Kept {
    /// Every model (the reference and each candidate): a rerun decodes
    /// nothing, and every damaged file is decoded again.
    EveryModel,
    /// Every visit's comparison (`.qgkld`, a kld case): a rerun decodes
    /// nothing; with them removed, it decodes the candidates again, and a
    /// damaged file of the reference costs `again` windows.
    Comparisons { again: usize },
}

/// After a cold sequential run of case `seq` (`outs`, `decodes` windows
/// decoded, candidates stopping at `used` windows): the reference was
/// decoded once for the windows some candidate needed (in visits of
/// [`STEP`]); a second run decodes what `kept` says is not kept, with the
/// same numbers; damaged kept files (extension `ext`: one file of the
/// reference, or every window file when every model keeps them) are found
/// out by their seals and decoded again, those alone (a model that visited
/// every window is read from its whole scores instead).
fn decoded_once(
    fx: &Fx,
    (outs, decodes): (&[Outcome], usize),
    used: &[usize],
    ext: &str,
    kept: Kept,
) {
    let decoded = |u: &usize| (u.div_ceil(STEP) * STEP).min(CHUNKS);
    let candidates: usize = used.iter().map(decoded).sum();
    let most = used.iter().map(decoded).max().unwrap();
    assert_eq!(decodes, candidates + most);
    let (second, decodes) = fx.run("seq");
    for (a, b) in second.iter().zip(outs) {
        assert_eq!(a.metrics, b.metrics);
        assert_eq!(a.texts, b.texts);
    }
    let mut files: Vec<_> = std::fs::read_dir(fx.root.join("cache"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    let (rerun, third) = match kept {
        Kept::EveryModel => {
            let partial = |d: usize| if d < CHUNKS { d } else { 0 };
            let windows = used.iter().map(decoded).map(partial).sum::<usize>() + partial(most);
            assert_eq!(files.len(), windows, "a file per window of each model");
            (0, windows)
        }
        Kept::Comparisons { again } => {
            files.truncate(1);
            let mut compared = 0;
            for f in std::fs::read_dir(fx.root.join("cache")).unwrap().flatten() {
                if f.path().extension().is_some_and(|e| e == "qgkld") {
                    std::fs::remove_file(f.path()).unwrap();
                    compared += 1;
                }
            }
            assert_eq!(compared, candidates, "a file per window of each candidate");
            (0, candidates + again)
        }
    };
    assert_eq!(decodes, rerun);
    assert!(!files.is_empty(), "a kept part of the reference");
    for kept in &files {
        let mut bytes = std::fs::read(kept).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        std::fs::write(kept, &bytes).unwrap();
    }
    let (outs3, decodes) = fx.run("seq");
    for (a, b) in outs3.iter().zip(outs) {
        assert_eq!(a.metrics, b.metrics);
    }
    assert_eq!(decodes, third);
}

#[test]
fn at_n_a_sequential_case_is_the_fixed_n_case() {
    let fx = Fx::new("at-n");
    let base = fixed(&fx, "");
    // The threshold at the near model's exact mean: undecidable before N.
    let c = mean(&base[1].series["delta_nll_per_window"]);
    let gate = format!("[[gate]]\nmetric = \"delta_nll_mean\"\nmax = {c}\n");
    fx.case("fixed", &gate);
    let (fixed_outs, _) = fx.run("fixed");
    let cache = fx.root.join("cache");
    let _ = std::fs::remove_dir_all(&cache);
    fx.case(
        "seq",
        &format!("{gate}{DECIDE}[decide.bounds]\ndelta_nll_mean = [-2.0, 2.0]\n"),
    );
    let (outs, decodes) = fx.run("seq");
    let (o, f) = (&outs[1], &fixed_outs[1]);
    assert_eq!(o.metrics["windows"], CHUNKS as f64, "{:?}", o.texts);
    assert_eq!(o.status, f.status);
    assert_eq!(o.status, Status::Pass);
    for (k, v) in &f.metrics {
        assert_eq!(o.metrics[k].to_bits(), v.to_bits(), "{k}");
    }
    assert_eq!(
        o.metrics["delta_nll_mean_seq_lo"],
        f.metrics["delta_nll_mean"]
    );
    assert_eq!(
        o.metrics["delta_nll_mean_seq_hi"],
        f.metrics["delta_nll_mean"]
    );
    assert!(o.texts["decided"].contains("decided at N = 40 on the exact mean"));
    // Every window of the reference was decoded, and each model's windows
    // are kept in the store: the next run decodes none, with the same
    // numbers.
    assert!(decodes >= 2 * CHUNKS);
    let (second, again) = fx.run("seq");
    assert_eq!(again, 0);
    for (a, b) in second.iter().zip(&outs) {
        assert_eq!(a.metrics, b.metrics, "{}", b.model);
    }
}

#[test]
fn a_value_outside_the_declared_bounds_runs_to_n_and_says_so() {
    let fx = Fx::new("bounds");
    let base = fixed(&fx, "");
    let far = mean(&base[0].series["delta_nll_per_window"]);
    let gate = format!(
        "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = {}\n",
        far * 10.0
    );
    fx.case(
        "seq",
        &format!("{gate}{DECIDE}[decide.bounds]\ndelta_nll_mean = [-0.0001, 0.0001]\n"),
    );
    let (outs, _) = fx.run("seq");
    let o = &outs[0];
    assert_eq!(o.metrics["windows"], CHUNKS as f64);
    let d = &o.texts["decided"];
    assert!(
        d.contains("outside the declared bounds [-0.0001, 0.0001]"),
        "{d}"
    );
    assert!(
        d.contains("not decided sequentially; ran all 40 windows"),
        "{d}"
    );
    // The verdict is the fixed-N one on the exact mean.
    assert_eq!(
        o.metrics["delta_nll_mean_seq_hi"],
        o.metrics["delta_nll_mean"]
    );
    assert_eq!(o.status == Status::Pass, far <= far * 10.0);
}

/// The error case `bad` is planned with.
fn parse_error(fx: &Fx, what: &str) -> quantgate::core::error::Error {
    match plan(&fx.root.join("suites"), &["bad".to_string()], &[]) {
        Err(e) => e,
        Ok((_, planned)) => planned[0]
            .case
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("{what}: parsed"))
            .clone(),
    }
}

#[test]
fn bad_decide_tables_are_errors_naming_their_key() {
    let fx = Fx::new("bad");
    let gate = "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = 0.05\n";
    let b = "[decide.bounds]\ndelta_nll_mean = [-0.5, 0.5]\n";
    let cases: &[(&str, String, &str)] = &[
        (
            "no seed",
            format!("{gate}[decide]\nsequential = true\n{b}"),
            "decide.seed: a sequential design names the seed",
        ),
        (
            "alpha",
            format!("{gate}[decide]\nsequential = true\nseed = 1\nalpha = 0.7\n{b}"),
            "decide.alpha: 0.7 is not in (0, 0.5]",
        ),
        (
            "bounds order",
            format!("{gate}{DECIDE}[decide.bounds]\ndelta_nll_mean = [0.5, -0.5]\n"),
            "decide.bounds.delta_nll_mean: give [lo, hi], finite, lo < hi",
        ),
        (
            "no bounds",
            format!("{gate}{DECIDE}"),
            "decide.bounds: no bounds for `delta_nll_mean` (gate[0])",
        ),
        (
            "bounds of no gate",
            format!("{gate}{DECIDE}{b}ppl = [0, 100]\n"),
            "decide.bounds.ppl: no gate is on `ppl`",
        ),
        (
            "not a mean",
            format!(
                "[[gate]]\nmetric = \"ppl\"\nmax = 100\n{DECIDE}[decide.bounds]\nppl = [0, 1000]\n"
            ),
            "gate[0].metric: `ppl` is not a mean over windows",
        ),
        (
            "on",
            format!(
                "[[gate]]\nmetric = \"delta_nll_mean\"\non = \"ci95_hi\"\nmax = 0.05\n{DECIDE}{b}"
            ),
            "gate[0].on: a sequential gate is decided on its mean's confidence sequence",
        ),
        (
            "two sides",
            format!("[[gate]]\nmetric = \"delta_nll_mean\"\nmin = -0.1\nmax = 0.05\n{DECIDE}{b}"),
            "gate[0]: a sequential gate has one bound",
        ),
        (
            "unknown key",
            format!("{gate}{DECIDE}stop = 3\n{b}"),
            "decide.stop: unknown key `stop`",
        ),
    ];
    for (what, extra, want) in cases {
        fx.case("bad", extra);
        let err = parse_error(&fx, what);
        assert!(err.message.contains(want), "{what}: {}", err.message);
        assert!(err.message.contains("bad.toml:"), "{what}: {}", err.message);
        assert_eq!(err.kind, quantgate::core::error::ErrorKind::Input, "{what}");
    }
    // A kind that cannot decide sequentially says so.
    std::fs::write(
        fx.root.join("suites/bad.toml"),
        format!(
            "kind = \"speed\"\nmodels = [\"near\"]\nreference = \"ref\"\npp = 8\ntg = 4\n\
             [[gate]]\nmetric = \"tg_ratio_vs_ref\"\nmin = 0.5\n{DECIDE}[decide.bounds]\n\
             tg_ratio_vs_ref = [0, 10]\n"
        ),
    )
    .unwrap();
    let err = parse_error(&fx, "speed");
    assert!(
        err.message
            .contains("a speed case cannot decide its gates sequentially"),
        "{}",
        err.message
    );
}

impl Fx {
    /// Write kld case `name` with `extra` after the text and windows.
    fn kld_case(&self, name: &str, extra: &str) {
        self.kld_case_over(name, CHUNKS, extra);
    }

    /// [`Fx::kld_case`] over the text's first `chunks` windows.
    fn kld_case_over(&self, name: &str, chunks: usize, extra: &str) {
        std::fs::write(
            self.root.join(format!("suites/{name}.toml")),
            format!(
                "kind = \"kld\"\nmodels = [\"near\", \"far\"]\nreference = \"ref\"\n\
                 [text]\npath = \"t.txt\"\nsha256 = \"{}\"\n\
                 [window]\nmode = \"llama-perplexity\"\nn_ctx = {N_CTX}\nchunks = {chunks}\n{extra}",
                quantgate::core::fsutil::sha256_bytes(text().as_bytes())
            ),
        )
        .unwrap();
    }
}

/// Per-window means of a kld outcome's rows: mean KL and same-top fraction,
/// by the case's window number.
fn kld_by_window(o: &Outcome) -> std::collections::BTreeMap<i32, (f64, f64)> {
    use quantgate::core::Column;
    let t = o.rows.as_ref().expect("kld rows");
    let col = |n: &str| &t.columns.iter().find(|c| c.0 == n).expect(n).1;
    let (Column::I32(w), Column::F64(kl), Column::Bool(flip)) =
        (col("window"), col("kl_vs_ref"), col("flip"))
    else {
        panic!("kld row columns")
    };
    let mut sums: std::collections::BTreeMap<i32, (f64, f64, f64)> = Default::default();
    for ((w, kl), flip) in w.iter().zip(kl).zip(flip) {
        let e = sums.entry(*w).or_default();
        e.0 += kl;
        e.1 += f64::from(u8::from(!flip));
        e.2 += 1.0;
    }
    sums.into_iter()
        .map(|(w, (kl, same, n))| (w, (kl / n, same / n)))
        .collect()
}

#[test]
fn a_sequential_kld_case_stops_early_and_at_n_is_the_fixed_n_case() {
    let fx = Fx::new("kld");
    fx.kld_case("fixed", "");
    let (base, _) = fx.run("fixed");
    for o in &base {
        assert!(o.error.is_none(), "{:?}", o.error);
    }
    let per: Vec<_> = base.iter().map(kld_by_window).collect();
    let mean_of = |p: &std::collections::BTreeMap<i32, (f64, f64)>, f: fn(&(f64, f64)) -> f64| {
        p.values().map(f).sum::<f64>() / p.len() as f64
    };
    let (far, near) = (mean_of(&per[0], |x| x.0), mean_of(&per[1], |x| x.0));
    assert!(near < far, "{near} {far}");
    // kld_mean between the two; same_top below both (both pass it).
    let c = (near + far) / 2.0;
    let s = per.iter().map(|p| mean_of(p, |x| x.1)).fold(1.0, f64::min) / 2.0;
    let design = format!(
        "[[gate]]\nmetric = \"kld_mean\"\nmax = {c}\n[[gate]]\nmetric = \"same_top\"\nmin = {s}\n\
         {DECIDE}[decide.bounds]\nkld_mean = [0.0, {}]\nsame_top = [0.0, 1.0]\n",
        far * 4.0
    );
    fx.kld_case("seq", &design);
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    let (outs, decodes) = fx.run("seq");
    let order = permutation(CHUNKS, 11);
    let mut used_all = Vec::new();
    for (o, p) in outs.iter().zip(&per) {
        assert!(o.error.is_none(), "{}: {:?}", o.model, o.error);
        let used = o.metrics["windows"] as usize;
        assert!(used < CHUNKS, "{}: {used} windows", o.model);
        // Replayed from the fixed-N rows in the seeded order: both gates
        // decided at the window the run stopped at.
        let mut seqs = [
            (
                MeanSequence::new(CHUNKS, (0.0, far * 4.0), 0.05),
                Some(c),
                None,
            ),
            (MeanSequence::new(CHUNKS, (0.0, 1.0), 0.05), None, Some(s)),
        ];
        let mut run = [(f64::NEG_INFINITY, f64::INFINITY); 2];
        let mut stop = [None; 2];
        for (j, &w) in order.iter().enumerate() {
            let v = p[&(w as i32)];
            for (k, (seq, max, min)) in seqs.iter_mut().enumerate() {
                seq.push(if k == 0 { v.0 } else { v.1 }).unwrap();
                let (lo, hi) = seq.bounds();
                run[k] = (run[k].0.max(lo), run[k].1.min(hi));
                if stop[k].is_none() {
                    stop[k] = decided(*max, *min, run[k]).map(|pass| (pass, j + 1));
                }
            }
            if stop.iter().all(Option::is_some) {
                break;
            }
        }
        let at = stop.iter().map(|s| s.unwrap().1).max().unwrap();
        assert_eq!(used, at, "{}", o.model);
        assert!(stop[1].unwrap().0, "{}: same_top passes", o.model);
        let pass = stop[0].unwrap().0;
        assert_eq!(pass, mean_of(p, |x| x.0) <= c, "{}", o.model);
        assert_eq!(o.status == Status::Pass, pass, "{}", o.model);
        // Within floating-point summation order of the replay.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs());
        assert!(close(o.metrics["kld_mean_seq_lo"], run[0].0), "{}", o.model);
        assert!(close(o.metrics["kld_mean_seq_hi"], run[0].1), "{}", o.model);
        assert!(close(o.metrics["same_top_seq_lo"], run[1].0), "{}", o.model);
        // The kld block is over the windows used: their rows are the
        // fixed-N rows of those windows.
        let got = kld_by_window(o);
        let mut ws: Vec<i32> = order[..at].iter().map(|w| *w as i32).collect();
        ws.sort_unstable();
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), ws);
        for (w, v) in &got {
            assert_eq!(v.0.to_bits(), p[w].0.to_bits(), "window {w}");
            assert_eq!(v.1, p[w].1, "window {w}");
        }
        let want = ws.iter().map(|w| p[w].0).sum::<f64>() / at as f64;
        assert!(close(o.metrics["kld_mean"], want), "{}", o.model);
        assert!(o.metrics.contains_key("delta_nll_mean"));
        let d = &o.texts["decided"];
        let verdict = if pass { "pass" } else { "fail" };
        assert!(
            d.contains(&format!("gate[0] kld_mean <= {c}: {verdict} at window")),
            "{d}"
        );
        assert!(
            d.contains(&format!("gate[1] same_top >= {s}: pass at window")),
            "{d}"
        );
        used_all.push(at);
    }
    // The reference decoded only for the windows some candidate needed
    // (in visits of STEP), each once, kept by visit, and every visit's
    // comparison kept; without them, a damaged visit file of the
    // reference is decoded again (one visit).
    decoded_once(
        &fx,
        (&outs, decodes),
        &used_all,
        "qgref",
        Kept::Comparisons { again: STEP },
    );

    // Live (`store = "none"`), fresh cache: the same stops and numbers bit
    // for bit, nothing written, the reference decoded for each visit of
    // each candidate (nothing kept to share).
    fx.kld_case("seq", &format!("{design}[kld]\nstore = \"none\"\n"));
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    let (live, windows) = fx.run("seq");
    for (l, o) in live.iter().zip(&outs) {
        assert!(l.error.is_none(), "{}: {:?}", l.model, l.error);
        assert_eq!(l.metrics.len(), o.metrics.len());
        for (k, v) in &o.metrics {
            assert_eq!(l.metrics[k].to_bits(), v.to_bits(), "{}: {k}", l.model);
        }
        assert_eq!(l.texts, o.texts);
    }
    assert!(common::tree(&fx.root.join("cache")).is_empty());
    let visited: usize = used_all.iter().map(|u| u.div_ceil(STEP) * STEP).sum();
    assert_eq!(windows, 2 * visited);

    // At N (a threshold at the near model's exact mean): every metric is
    // the fixed-N case's, bit for bit.
    let exact = mean_of(&per[1], |x| x.0);
    let gate = format!("[[gate]]\nmetric = \"kld_mean\"\nmax = {}\n", exact * 2.0);
    fx.kld_case("fixed", &gate);
    let (fixed_outs, _) = fx.run("fixed");
    let f = &fixed_outs[1];
    let at_n = format!(
        "[[gate]]\nmetric = \"kld_mean\"\nmax = {}\n{DECIDE}[decide.bounds]\nkld_mean = [0.0, {}]\n",
        exact * 2.0,
        exact * 1e6
    );
    fx.kld_case("seq", &at_n);
    let (outs, _) = fx.run("seq");
    let o = &outs[1];
    assert_eq!(o.metrics["windows"], CHUNKS as f64, "{:?}", o.texts);
    assert_eq!(o.status, f.status);
    for (k, v) in &f.metrics {
        assert_eq!(o.metrics[k].to_bits(), v.to_bits(), "{k}");
    }
    assert_eq!(
        o.rows.as_ref().unwrap().columns,
        f.rows.as_ref().unwrap().columns
    );
}

/// Thresholds that fit a ladder: a gate with `models` applies to those
/// models only, and a `level = "warn"` gate is reported (a note, the
/// card's ⚠) without failing the test. Fixed-N and sequential alike, each
/// model decided by its own gates: the far candidate violates its warn
/// gate and passes its looser fail gate; the near one has one strict gate.
#[test]
fn gates_per_model_and_warn_gates_decide_each_model_by_its_own() {
    let fx = Fx::new("per-model");
    let base = fixed(&fx, "");
    let (far, near) = (
        mean(&base[0].series["delta_nll_per_window"]),
        mean(&base[1].series["delta_nll_per_window"]),
    );
    let c = (near + far) / 2.0;
    let loose = far + (far - near);
    let gates = format!(
        "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = {c}\nmodels = [\"!far\"]\n\
         [[gate]]\nmetric = \"delta_nll_mean\"\nmax = {c}\nlevel = \"warn\"\nmodels = [\"f*\"]\n\
         [[gate]]\nmetric = \"delta_nll_mean\"\nmax = {loose}\nmodels = [\"far\"]\n"
    );
    let bounds = "[decide.bounds]\ndelta_nll_mean = [-5.0, 5.0]\n";
    for (name, decide) in [
        ("per_model", String::new()),
        ("per_model_seq", format!("{DECIDE}{bounds}")),
    ] {
        fx.case(name, &format!("{gates}{decide}"));
        let (outs, _) = fx.run(name);
        let (o_far, o_near) = (&outs[0], &outs[1]);
        assert_eq!(
            (o_far.model.as_str(), o_near.model.as_str()),
            ("far", "near")
        );
        for o in &outs {
            assert!(o.error.is_none(), "{name} {}: {:?}", o.model, o.error);
            assert_eq!(o.status, Status::Pass, "{name} {}: {:?}", o.model, o.gates);
        }
        // near: its one gate, held.
        assert_eq!(o_near.gates.len(), 1, "{:?}", o_near.gates);
        assert_eq!(o_near.gates[0].threshold, c);
        assert!(o_near.gates[0].passed);
        assert!(!o_near.notes.iter().any(|n| n.starts_with("warning")));
        // far: the warn gate violated, the fail gate held; a pass that warns.
        assert_eq!(o_far.gates.len(), 2, "{:?}", o_far.gates);
        let warn = o_far.gates.iter().find(|g| g.threshold == c).unwrap();
        assert!(!warn.passed);
        assert_eq!(warn.level, quantgate::core::case::Level::Warn);
        assert!(o_far.gates.iter().any(|g| g.threshold == loose && g.passed));
        assert!(
            o_far
                .notes
                .iter()
                .any(|n| n.starts_with("warning: delta_nll_mean")),
            "{:?}",
            o_far.notes
        );
        assert_eq!(o_far.end(), quantgate::TrialEnd::Pass);
        if !decide.is_empty() {
            // Decided early by its own gates, far from both thresholds.
            for o in &outs {
                assert!(
                    o.metrics["windows"] < CHUNKS as f64,
                    "{}: {:?}",
                    o.model,
                    o.metrics
                );
            }
        }
        // The JSON says the level of a warn gate only.
        let json = serde_json::to_value(&o_far.gates).unwrap();
        assert_eq!(
            json[0].get("level").or(json[1].get("level")).unwrap(),
            "warn"
        );
        assert!(json[0].get("level").is_none() || json[1].get("level").is_none());
        // The card: ⚠ for far, ✓ for near.
        let views =
            quantgate::report::ladder::views(&outs, &quantgate::kinds::presentations(), &|_| {
                quantgate::report::ladder::ModelFacts::default()
            });
        let md = quantgate::report::ladder::markdown(&views);
        // A model's rows: the main table's, then the gates table's.
        let rows = |m: &str| -> Vec<String> {
            md.lines()
                .filter(|l| l.starts_with(&format!("| {m} ")))
                .map(String::from)
                .collect()
        };
        let (far_rows, near_rows) = (rows("far"), rows("near"));
        assert!(
            far_rows[0].ends_with("| ⚠ pass (1 of 2 gates warned) |"),
            "{md}"
        );
        assert!(near_rows[0].ends_with("| ✓ pass (1 gates) |"), "{md}");
        // The gates table: a column per rule, the warn gate's marked as
        // such; far warned on it and held its own fail gate, near held
        // its one gate and has none of far's.
        let head = md
            .lines()
            .filter(|l| l.starts_with("| model |"))
            .nth(1)
            .unwrap_or_else(|| panic!("no gates table: {md}"));
        let cols: Vec<&str> = head.split(" | ").collect();
        let at = |rule: &str| {
            cols.iter()
                .position(|c| c.trim_end_matches(" |") == rule)
                .unwrap_or_else(|| panic!("{rule}: {head}"))
        };
        let cell = |row: &str, i: usize| row.split(" | ").nth(i).unwrap().to_string();
        let how = match decide.is_empty() {
            true => "",
            false => " (decided sequentially)",
        };
        let strict = at(&format!("ΔNLL ≤ {c} nats/token{how}"));
        let warned = at(&format!("ΔNLL ≤ {c} nats/token{how} (warn)"));
        let own = at(&format!("ΔNLL ≤ {loose} nats/token{how}"));
        assert!(cell(&far_rows[1], warned).starts_with('⚠'), "{md}");
        assert!(cell(&far_rows[1], own).starts_with('✓'), "{md}");
        assert!(cell(&far_rows[1], strict).starts_with('–'), "{md}");
        assert!(cell(&near_rows[1], strict).starts_with('✓'), "{md}");
        assert!(cell(&near_rows[1], warned).starts_with('–'), "{md}");
    }
    // A gate's models that match none of the case's, or a bad level: errors
    // naming the key.
    fx.case(
        "bad_models",
        "[[gate]]\nmetric = \"delta_nll_mean\"\nmax = 0.1\nmodels = [\"q2*\"]\nlevel = \"maybe\"\n",
    );
    let (_, planned) = plan(&fx.root.join("suites"), &["bad_models".to_string()], &[]).unwrap();
    let err = planned[0].case.as_ref().err().unwrap().to_string();
    assert!(
        err.contains("gate[0].models: 'q2*' matches none of the case's models (near, far)"),
        "{err}"
    );
    assert!(
        err.contains("gate[0].level: `maybe` is not one of \"fail\", \"warn\""),
        "{err}"
    );
}

/// A kld case's decode keeps each window it scored (the reference's and
/// each candidate's), named by the model and the window's own tokens, not
/// by the case: a sequential ΔNLL case over more windows of the same text
/// reads the kld case's windows instead of decoding them, and its numbers
/// are bit for bit those of a cold run. Run together, the sequential
/// group starts after the kld groups.
#[test]
fn a_kld_case_keeps_the_windows_a_sequential_case_reads() {
    const K: usize = 16;
    let fx = Fx::new("kld-windows");
    let base = fixed(&fx, "");
    let c = (mean(&base[0].series["delta_nll_per_window"])
        + mean(&base[1].series["delta_nll_per_window"]))
        / 2.0;
    sequential_case(&fx, c);
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    let (cold, cold_decodes) = fx.run("seq");
    // The windows each model decoded cold: its visits' pairs (the
    // reference's, every window some candidate visited).
    let order = permutation(CHUNKS, 11);
    let decoded = |o: &Outcome| {
        let used = o.metrics["windows"] as usize;
        (used.div_ceil(STEP) * STEP).min(CHUNKS)
    };
    let most = cold.iter().map(decoded).max().unwrap();
    let sets: Vec<&[usize]> = cold
        .iter()
        .map(|o| &order[..decoded(o)])
        .chain([&order[..most]])
        .collect();
    assert_eq!(cold_decodes, sets.iter().map(|s| s.len()).sum::<usize>());

    // The first K windows of the same text, scored by a kld case.
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    fx.kld_case_over("k", K, "");
    let (k, _) = fx.run("k");
    assert!(k.iter().all(|o| o.error.is_none()), "{k:?}");
    let (warm, warm_decodes) = fx.run("seq");
    for (w, o) in warm.iter().zip(&cold) {
        assert!(w.error.is_none(), "{}: {:?}", w.model, w.error);
        assert_eq!(w.metrics.len(), o.metrics.len());
        for (name, v) in &o.metrics {
            assert_eq!(
                w.metrics[name].to_bits(),
                v.to_bits(),
                "{}: {name}",
                o.model
            );
        }
        assert_eq!(w.series, o.series, "{}", o.model);
        assert_eq!(w.texts, o.texts, "{}", o.model);
    }
    // Only the windows past the kld case's K were decoded.
    let past_k: usize = sets
        .iter()
        .map(|s| s.iter().filter(|&&w| w >= K).count())
        .sum();
    assert!(past_k < cold_decodes, "some visited window is below K");
    assert_eq!(warm_decodes, past_k);

    // Planned together: the sequential case's group after the kld groups.
    let (_, planned) = plan(&fx.root.join("suites"), &[], &[]).unwrap();
    let selected: Vec<bool> = planned
        .iter()
        .map(|p| {
            p.case
                .as_ref()
                .is_ok_and(|c| ["k", "seq"].contains(&c.case.name.as_str()))
        })
        .collect();
    let groups = quantgate::plan::groups::groups(&planned, &selected, true);
    let name = |g: &quantgate::plan::groups::Group| {
        g.trials
            .first()
            .map(|&i| planned[i].case.as_ref().unwrap().case.name.clone())
    };
    let at = |n: &str| groups.iter().position(|g| name(g).as_deref() == Some(n));
    let (first_seq, last_k) = (
        at("seq").expect("a sequential group"),
        groups
            .iter()
            .rposition(|g| name(g).as_deref() == Some("k"))
            .expect("kld groups"),
    );
    assert!(last_k < first_seq, "{groups:?}");
}

/// A fixed-N perplexity case whose every window some other decode kept (a
/// kld case's, over the same windows) reads them instead of decoding:
/// the candidates' and the reference's, no window decoded, every number
/// and series bit for bit a cold run's. A kept window edited on disk is
/// never read back: that model's windows are decoded again, same numbers.
#[test]
fn a_fixed_n_case_reads_the_windows_a_kld_case_kept() {
    const K: usize = 16;
    let fx = Fx::new("kld-fixed");
    fx.case_over("few", K, "");
    let (cold, cold_decodes) = fx.run("few");
    assert_eq!(cold_decodes, 3 * K, "two candidates and the reference");
    let same = |a: &[Outcome], why: &str| {
        for (w, o) in a.iter().zip(&cold) {
            assert!(w.error.is_none(), "{why}: {}: {:?}", w.model, w.error);
            assert_eq!(common::bits(w), common::bits(o), "{why}: {}", o.model);
            assert_eq!(w.series, o.series, "{why}: {}", o.model);
        }
    };
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    fx.kld_case_over("k", K, "");
    let (k, _) = fx.run("k");
    assert!(k.iter().all(|o| o.error.is_none()), "{k:?}");
    let (warm, warm_decodes) = fx.run("few");
    same(&warm, "warm");
    assert_eq!(warm_decodes, 0);
    // The kept windows edited (each flipped in one byte), and the wholes
    // the warm run kept removed: every window is decoded again.
    let files: Vec<PathBuf> = std::fs::read_dir(fx.root.join("cache"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let mut edited = 0;
    for f in &files {
        match f.extension().and_then(|e| e.to_str()) {
            Some("qgscores") => std::fs::remove_file(f).unwrap(),
            Some("qgwin") => {
                let mut b = std::fs::read(f).unwrap();
                let at = b.len() / 3;
                b[at] ^= 0x04;
                std::fs::write(f, b).unwrap();
                edited += 1;
            }
            _ => {}
        }
    }
    assert_eq!(edited, 3 * K, "{files:?}");
    let (again, again_decodes) = fx.run("few");
    same(&again, "edited");
    assert_eq!(again_decodes, 3 * K);
    let _ = std::fs::remove_dir_all(&fx.root);
}

/// A kld case keeps each window's comparison with its reference
/// (`.qgkld`): another kld case over the same windows of the same files
/// (another name, other gates) decodes nothing, neither a candidate nor
/// the reference, and gives every metric, series and row bit for bit; a
/// sequential kld case's visits read them the same way (bit for bit its
/// cold run). A kept comparison edited on disk is never read back: the
/// candidates are compared again, same numbers.
#[test]
fn a_kld_case_reads_the_comparisons_another_kld_case_kept() {
    const K: usize = 16;
    let fx = Fx::new("kld-kept");
    let design = format!(
        "[[gate]]\nmetric = \"kld_mean\"\nmax = 1.0\n\
         {DECIDE}[decide.bounds]\nkld_mean = [0.0, 4.0]\n"
    );
    fx.kld_case_over("seq", K, &design);
    let (seq_cold, seq_cold_decodes) = fx.run("seq");
    assert!(seq_cold_decodes > 0);
    let same = |a: &[Outcome], b: &[Outcome], why: &str| {
        assert_eq!(a.len(), b.len());
        for (w, o) in a.iter().zip(b) {
            assert!(w.error.is_none(), "{why}: {}: {:?}", w.model, w.error);
            assert_eq!(common::bits(w), common::bits(o), "{why}: {}", o.model);
            assert_eq!(w.series, o.series, "{why}: {}", o.model);
            assert_eq!(w.rows, o.rows, "{why}: {}", o.model);
        }
    };
    std::fs::remove_dir_all(fx.root.join("cache")).unwrap();
    fx.kld_case_over("k", K, "");
    let (cold, cold_decodes) = fx.run("k");
    assert_eq!(cold_decodes, 3 * K, "two candidates and the reference");
    fx.kld_case_over("other", K, "[[gate]]\nmetric = \"kld_p99\"\nmax = 2.0\n");
    let (warm, warm_decodes) = fx.run("other");
    same(&warm, &cold, "another case");
    assert_eq!(warm_decodes, 0);
    let (seq, seq_decodes) = fx.run("seq");
    same(&seq, &seq_cold, "sequential");
    assert_eq!(seq_decodes, 0);
    // Every kept comparison edited (one byte each): the candidates are
    // decoded again (the reference's rows are stored whole).
    let mut edited = 0;
    for f in std::fs::read_dir(fx.root.join("cache")).unwrap().flatten() {
        let f = f.path();
        if f.extension().and_then(|e| e.to_str()) == Some("qgkld") {
            let mut b = std::fs::read(&f).unwrap();
            let at = b.len() / 3;
            b[at] ^= 0x04;
            std::fs::write(&f, b).unwrap();
            edited += 1;
        }
    }
    assert_eq!(edited, 2 * K);
    let (again, again_decodes) = fx.run("other");
    same(&again, &cold, "edited");
    assert_eq!(again_decodes, 2 * K);
    let _ = std::fs::remove_dir_all(&fx.root);
}
