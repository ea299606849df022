//! The sequential rule's numbers, checked independently:
//! - its bounds equal those of the `confseq` package (Waudby-Smith, Ramdas
//!   et al.; `betting_lower_cs` with the same one-sided adaptive Kelly
//!   bets, without replacement) on the same inputs, to the resolution of
//!   its grid: seeded synthetic populations (heavy tails, two-point,
//!   uniform) and the real ladder's per-window ΔNLL and KLD over 80 windows
//!   of WikiText-2 (`tests/data/ladder-80.json`, recorded by
//!   `quantgate run --json --out` on the fixture ladder);
//! - over 10,000 seeded visiting orders of each recorded series (and of
//!   heavy-tailed synthetic populations), each bound crosses the true mean
//!   in at most alpha of the runs, and the sequential verdict differs from
//!   the fixed-N verdict in at most alpha of them.
//!
//! The oracle is fetched by `scripts/fetch-confseq.sh` (or named by
//! `QUANTGATE_CONFSEQ`, the folder it prints) and run by
//! `scripts/confseq-oracle.py`.

use quantgate::measure::sequential::{
    decided, permutation, LowerSequence, MeanSequence, BREAKS, TRUNC_SCALE,
};
use quantgate::measure::SplitMix64;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The recorded ladder: per model, per-window ΔNLL and mean KLD.
#[derive(serde::Deserialize)]
struct Recorded {
    models: Vec<RecordedModel>,
}

#[derive(serde::Deserialize)]
struct RecordedModel {
    model: String,
    delta_nll: Vec<f64>,
    kld: Vec<f64>,
}

fn recorded() -> Recorded {
    let p = repo().join("tests/data/ladder-80.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Declared bounds of the recorded series (as the suites declare them).
const DNLL_BOUNDS: (f64, f64) = (-0.5, 0.5);
const KLD_BOUNDS: (f64, f64) = (0.0, 1.0);

fn uniform(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Synthetic populations in [0, 1]: (name, values).
fn synthetic() -> Vec<(String, Vec<f64>)> {
    let mut rng = SplitMix64(20_261_203);
    let mut out = Vec::new();
    for n in [20usize, 80, 200] {
        out.push((
            format!("heavy tail u^6, N={n}"),
            (0..n).map(|_| uniform(&mut rng).powi(6)).collect(),
        ));
        out.push((
            format!("two-point p=0.1, N={n}"),
            (0..n)
                .map(|_| f64::from(u8::from(uniform(&mut rng) < 0.1)))
                .collect(),
        ));
        out.push((
            format!("uniform, N={n}"),
            (0..n).map(|_| uniform(&mut rng)).collect(),
        ));
        out.push((
            format!("Pareto(1.5) capped at 1, N={n}"),
            (0..n)
                .map(|_| (0.01 / (1.0 - uniform(&mut rng)).powf(1.0 / 1.5)).min(1.0))
                .collect(),
        ));
    }
    out
}

fn scale(v: &[f64], (lo, hi): (f64, f64)) -> Vec<f64> {
    v.iter().map(|x| (x - lo) / (hi - lo)).collect()
}

/// The folder holding confseq (and NumPy when the Python lacks it).
fn confseq() -> String {
    std::env::var("QUANTGATE_CONFSEQ").unwrap_or_else(|_| {
        let out = Command::new(repo().join("scripts/fetch-confseq.sh"))
            .output()
            .expect("scripts/fetch-confseq.sh");
        assert!(
            out.status.success(),
            "scripts/fetch-confseq.sh (needs python3 with pip, README's prerequisites): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    })
}

/// confseq's lower bounds after each value of each series, for each
/// request `(N, alpha, series)`: one process for them all (its start-up and
/// imports cost more than a request's sums).
fn oracle(requests: &[(usize, f64, Vec<Vec<f64>>)]) -> Vec<Vec<Vec<f64>>> {
    let req: Vec<serde_json::Value> = requests
        .iter()
        .map(|(n_pop, alpha, series)| {
            serde_json::json!({
                "N": n_pop, "alpha": alpha, "breaks": BREAKS, "trunc_scale": TRUNC_SCALE,
                "series": series,
            })
        })
        .collect();
    let req = serde_json::Value::from(req);
    let mut child = Command::new(std::env::var("QUANTGATE_PYTHON").unwrap_or("python3".into()))
        .arg(repo().join("scripts/confseq-oracle.py"))
        .env("PYTHONPATH", confseq())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(req.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "confseq-oracle.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Vec<Vec<f64>>> =
        serde_json::from_slice(&out.stdout).expect("the oracle's JSON");
    assert_eq!(answers.len(), requests.len(), "one answer per request");
    answers
}

fn ours(n_pop: usize, alpha: f64, x: &[f64]) -> Vec<f64> {
    let mut s = LowerSequence::new(n_pop, alpha);
    x.iter()
        .map(|v| {
            s.push(*v);
            s.bound()
        })
        .collect()
}

#[test]
fn bounds_equal_confseqs_on_the_same_inputs() {
    let mut cases: Vec<(String, Vec<f64>)> = synthetic();
    for m in recorded().models {
        cases.push((
            format!("{} ΔNLL", m.model),
            scale(&m.delta_nll, DNLL_BOUNDS),
        ));
        cases.push((format!("{} KLD", m.model), scale(&m.kld, KLD_BOUNDS)));
    }
    let step = 1.0 / BREAKS as f64;
    let (mut compared, mut equal) = (0usize, 0usize);
    // Each case at each alpha: a seeded visiting order, as a sequential
    // case makes it; the lower bound on x and on 1 − x (the upper bound,
    // reflected). Every request goes to the oracle at once.
    let mut asked = Vec::new();
    for alpha in [0.05, 0.01] {
        for (name, pop) in &cases {
            let n = pop.len();
            let order = permutation(n, 7);
            let x: Vec<f64> = order.iter().map(|&i| pop[i]).collect();
            let flipped: Vec<f64> = x.iter().map(|v| 1.0 - v).collect();
            asked.push((name, (n, alpha, vec![x, flipped])));
        }
    }
    let requests: Vec<_> = asked.iter().map(|(_, r)| r.clone()).collect();
    let answers = oracle(&requests);
    for ((name, (n, alpha, series)), want) in asked.iter().zip(&answers) {
        assert_eq!(want.len(), series.len(), "{name}: one answer per series");
        for (side, (xs, w)) in series.iter().zip(want).enumerate() {
            let got = ours(*n, *alpha, xs);
            assert_eq!(got.len(), w.len());
            for (t, (g, w)) in got.iter().zip(w.iter()).enumerate() {
                compared += 1;
                equal += usize::from((g - w).abs() < 1e-12);
                assert!(
                    (g - w).abs() <= step + 1e-12,
                    "{name}, alpha {alpha}, side {side}, t={}: ours {g}, confseq {w}",
                    t + 1
                );
            }
        }
    }
    eprintln!(
        "{equal} of {compared} bounds equal to confseq's exactly, the rest within one grid step"
    );
    assert!(
        equal as f64 >= 0.99 * compared as f64,
        "only {equal} of {compared} bounds equal confseq's exactly"
    );
}

/// Over `runs` seeded orders of `pop` (in `bounds`) at `alpha`: how often
/// the lower and the upper bound ever cross the true mean, how often the
/// verdict on `max` differs from the fixed-N verdict, and the windows used.
fn validity(
    pop: &[f64],
    bounds: (f64, f64),
    alpha: f64,
    max: f64,
    runs: u64,
) -> (usize, usize, usize, Vec<usize>) {
    let n = pop.len();
    let mean = pop.iter().sum::<f64>() / n as f64;
    let fixed = mean <= max;
    let (mut low, mut high, mut wrong) = (0, 0, 0);
    let mut used = Vec::new();
    for r in 0..runs {
        let order = permutation(n, r);
        let mut s = MeanSequence::new(n, bounds, alpha);
        let (mut lm, mut hm) = (false, false);
        let mut run = (0.0f64, f64::INFINITY);
        let mut verdict = None;
        for (j, &i) in order.iter().enumerate() {
            s.push(pop[i]).unwrap();
            let (lo, hi) = s.bounds();
            lm |= lo > mean + 1e-12;
            hm |= hi < mean - 1e-12;
            run = if j == 0 {
                (lo, hi)
            } else {
                (run.0.max(lo), run.1.min(hi))
            };
            if verdict.is_none() {
                verdict = decided(Some(max), None, if j + 1 == n { (lo, hi) } else { run })
                    .map(|v| (v, j + 1));
            }
        }
        low += usize::from(lm);
        high += usize::from(hm);
        let (v, at) = verdict.expect("decided at N at the latest");
        wrong += usize::from(v != fixed);
        used.push(at);
    }
    (low, high, wrong, used)
}

#[test]
fn over_ten_thousand_orders_bounds_and_verdicts_err_at_most_alpha() {
    let alpha = 0.05;
    let runs = 10_000;
    // (name, values, declared bounds, the gate's max)
    type Population = (String, Vec<f64>, (f64, f64), f64);
    let mut populations: Vec<Population> = Vec::new();
    for m in recorded().models {
        populations.push((format!("{} ΔNLL", m.model), m.delta_nll, DNLL_BOUNDS, 0.05));
        populations.push((format!("{} KLD", m.model), m.kld, KLD_BOUNDS, 0.1));
    }
    for (name, pop) in synthetic().into_iter().filter(|(n, _)| n.contains("N=80")) {
        // A threshold just above the mean: the hardest honest gate.
        let mean = pop.iter().sum::<f64>() / pop.len() as f64;
        populations.push((name, pop, (0.0, 1.0), mean + 0.05));
    }
    // Two threads: the populations are independent.
    let results: Vec<_> = std::thread::scope(|s| {
        let half = populations.len().div_ceil(2);
        let parts: Vec<_> = populations
            .chunks(half)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|(_, pop, bounds, max)| validity(pop, *bounds, alpha, *max, runs))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    for ((name, pop, _, max), (low, high, wrong, used)) in populations.iter().zip(results) {
        let mean_used = used.iter().sum::<usize>() as f64 / used.len() as f64;
        eprintln!(
            "{name} (gate ≤ {max}): lower bound crossed the mean in {low}, upper in {high}, \
             verdict ≠ fixed-N in {wrong} of {runs} orders; windows used {}..{} (mean {mean_used:.1}) of {}",
            used.iter().min().unwrap(),
            used.iter().max().unwrap(),
            pop.len()
        );
        let limit = (alpha * runs as f64) as usize;
        assert!(
            low <= limit && high <= limit,
            "{name}: {low} / {high} > {limit}"
        );
        assert!(wrong <= limit, "{name}: {wrong} wrong verdicts > {limit}");
    }
}

#[test]
fn the_recorded_ladder_is_the_real_one() {
    // The data file holds what its header says: four candidates, 80 windows,
    // ΔNLL ordered as the ladder is (Q8_0 < Q6_K < Q4_K_M < Q2_K).
    let r = recorded();
    let names: Vec<&str> = r.models.iter().map(|m| m.model.as_str()).collect();
    assert_eq!(
        names,
        [
            "smollm2-q8_0",
            "smollm2-q6_k",
            "smollm2-q4_k_m",
            "smollm2-q2_k"
        ]
    );
    let means: Vec<f64> = r
        .models
        .iter()
        .map(|m| {
            assert_eq!((m.delta_nll.len(), m.kld.len()), (80, 80));
            m.delta_nll.iter().sum::<f64>() / 80.0
        })
        .collect();
    assert!(means.windows(2).all(|w| w[0] < w[1]), "{means:?}");
}
