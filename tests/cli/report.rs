//! Reports: `prereg verify`, `report`, the HTML report in a browser, and the per-position Parquet rows recounted.

use super::*;

/// `quantgate prereg verify` and `report` on the repository's own sealed
/// comparisons: both verify, and the report shows each outcome as the
/// reviewed golden decides it (evaluated here independently of the tool).
#[test]
fn prereg_verify_and_report_on_the_suite() {
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .current_dir(repo())
        .args(["prereg", "verify"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_quantgate"))
        .current_dir(repo())
        .args(["prereg", "report"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{report}");
    let ledger = std::fs::read_to_string(repo().join("prereg/LEDGER")).unwrap();
    assert!(ledger.lines().count() >= 2);
    for line in ledger.lines() {
        let path = line.split(' ').nth(1).unwrap();
        let p = quantgate::judge::prereg::parse(&repo().join(path)).unwrap();
        let golden = std::fs::read_to_string(
            repo()
                .join("goldens")
                .join(&p.case.0)
                .join(format!("{}.snap", p.candidate.0)),
        )
        .unwrap();
        let metric = |name: &str| -> f64 {
            golden
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
                .unwrap()
                .parse()
                .unwrap()
        };
        // Both suite rules are "win if ci95_hi < 0; loss if ci95_lo > 0".
        let (lo, hi) = (metric("delta_nll_ci95_lo"), metric("delta_nll_ci95_hi"));
        let outcome = if hi < 0.0 {
            "win"
        } else if lo > 0.0 {
            "loss"
        } else {
            "tie"
        };
        let row = report
            .lines()
            .find(|l| l.starts_with(&format!("{path} ")))
            .unwrap_or_else(|| panic!("no row for {path}:\n{report}"));
        assert!(row.contains(&format!(" {outcome} ")), "{row}");
    }
}

/// The HTML report renders in a real browser: headless Chromium (Debian's
/// `chromium`, as CI installs it; `QUANTGATE_CHROMIUM` names another)
/// screenshots a report of three models, and every model's colour is drawn
/// on the page — in the plots, not only the legend — with no network.
#[test]
fn the_html_report_renders_its_plots_in_chromium() {
    use quantgate::core::{Outcome, Status};
    use quantgate::report::ladder;
    let chromium =
        std::env::var("QUANTGATE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).is_file(),
        "{chromium} is missing: install Debian's chromium (apt-get install chromium), README's prerequisites"
    );
    let dir = common::scratch("html");
    std::fs::create_dir_all(&dir).unwrap();
    let build = LlamaEngine::new().build();
    let mut outcomes = Vec::new();
    for (i, model) in ["big", "mid", "small"].iter().enumerate() {
        let s = (i + 1) as f64;
        for case in ["ppl/x", "kld/x"] {
            let mut o = Outcome::new(case, model, build.clone());
            o.kind = if case == "ppl/x" { "perplexity" } else { "kld" }.into();
            o.status = Status::Pass;
            o.reference = Some("f16".into());
            for (k, v) in [
                ("ppl", 10.0 + s),
                ("ppl_se", 0.1),
                ("delta_nll_mean", 0.01 * s),
                ("delta_nll_ci95_lo", 0.005 * s),
                ("delta_nll_ci95_hi", 0.015 * s),
                ("kld_mean", 0.02 * s),
                ("kld_mean_se", 0.001),
                ("kld_p01", 1e-4 * s),
                ("kld_p05", 3e-4 * s),
                ("kld_p10", 1e-3 * s),
                ("kld_median", 0.01 * s),
                ("kld_p90", 0.05 * s),
                ("kld_p95", 0.08 * s),
                ("kld_p99", 0.2 * s),
                ("kld_p999", 0.5 * s),
                ("kld_max", 1.0 * s),
            ] {
                if case == "ppl/x" || k.starts_with("kld") {
                    o.metrics.insert(k.into(), v);
                }
            }
            if case == "ppl/x" {
                o.series.insert(
                    "delta_nll_per_window".into(),
                    (0..8).map(|w| 0.01 * s + 0.002 * w as f64).collect(),
                );
            }
            outcomes.push(o);
        }
    }
    let facts = |m: &str| ladder::ModelFacts {
        bytes: Some(match m {
            "big" => 300,
            "mid" => 200,
            _ => 100,
        }),
        bpw: Some(match m {
            "big" => 8.5,
            "mid" => 6.0,
            _ => 3.0,
        }),
    };
    let views = ladder::views(&outcomes, &quantgate::kinds::presentations(), &facts);
    ladder::write(&dir, &views, &outcomes, None).unwrap();
    let shot = dir.join("shot.png");
    let out = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1400,1200",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", dir.join("report.html").display()))
        .output()
        .unwrap();
    assert!(
        shot.is_file(),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    let pixels = buf[..info.buffer_size()].chunks(px);
    let mut counts = [0usize; 3];
    let mut white = 0usize;
    let total = (info.width * info.height) as usize;
    for p in pixels {
        if p[0] > 245 && p[1] > 245 && p[2] > 245 {
            white += 1;
        }
        for (i, c) in ladder::PALETTE[..3].iter().enumerate() {
            let want = u32::from_str_radix(&c[1..], 16).unwrap();
            let rgb = [(want >> 16) as u8, (want >> 8) as u8, want as u8];
            if rgb.iter().zip(p).all(|(a, b)| a.abs_diff(*b) <= 8) {
                counts[i] += 1;
            }
        }
    }
    // A legend swatch is 10 × 10 pixels, in four plots: 400 pixels of a
    // model's colour are legends alone; its points, lines and boxes add more.
    for (i, n) in counts.iter().enumerate() {
        assert!(
            *n > 600,
            "model {i}'s colour is drawn on {n} pixels only: {counts:?}"
        );
    }
    assert!(white < total * 95 / 100, "the page is almost blank");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The answer flips of a multiple-choice case, checked against an
/// independent computation from its Parquet rows: each task's choice and
/// the reference's from the per-choice log-probabilities (argmax, first on
/// ties), the reference's margin from their softmax, then the flips both
/// ways, the agreement, and every margin bin's counts and rate.
#[test]
fn multiple_choice_flips_equal_a_recount_from_the_parquet_rows() {
    let dir = fresh_dir("mc");
    let json = dir.join("mc.json");
    let (code, stdout, stderr) = run(
        &repo().join("suites"),
        &[
            "mc/computed",
            "--model",
            "smollm2-q4_k_m",
            "--out",
            dir.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let outcomes: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let m = &outcomes[0]["metrics"];
    let file = std::fs::File::open(dir.join("mc/computed/smollm2-q4_k_m.parquet")).unwrap();
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(file).unwrap();
    let rows: Vec<std::collections::HashMap<String, String>> =
        parquet::file::reader::FileReader::get_row_iter(&reader, None)
            .unwrap()
            .map(|r| {
                r.unwrap()
                    .get_column_iter()
                    .map(|(n, f)| (n.clone(), f.to_string()))
                    .collect()
            })
            .collect();
    assert_eq!(rows.len() as f64, m["tasks"].as_f64().unwrap());
    let list = |s: &str| -> Vec<f64> {
        s.trim_matches('"')
            .trim_matches(['[', ']'])
            .split(',')
            .map(|x| f64::from(x.trim().parse::<f32>().unwrap()))
            .collect()
    };
    let argmax = |v: &[f64]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b });
    let margin = |v: &[f64]| {
        let mx = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut p: Vec<f64> = v.iter().map(|x| (x - mx).exp()).collect();
        let z: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= z);
        p.sort_by(|a, b| b.total_cmp(a));
        p[0] - p[1]
    };
    let (mut r2w, mut w2r, mut agree) = (0, 0, 0);
    let edges = [0.0, 0.1, 0.3, 0.6, f64::INFINITY];
    let mut bins = [(0usize, 0usize, 0usize); 4];
    for r in &rows {
        let (ours, theirs) = (list(&r["logprobs"]), list(&r["ref_logprobs"]));
        let (c, rc) = (argmax(&ours), argmax(&theirs));
        assert_eq!(r["chosen"], c.to_string());
        assert_eq!(r["ref_chosen"], rc.to_string());
        let (right, rright) = (r["correct"] == "true", r["ref_correct"] == "true");
        r2w += usize::from(rright && !right);
        w2r += usize::from(!rright && right);
        agree += usize::from(c == rc);
        let mg = margin(&theirs);
        assert!((mg - r["ref_margin"].parse::<f64>().unwrap()).abs() < 1e-12);
        let b = (0..4)
            .find(|&b| mg >= edges[b] && mg < edges[b + 1])
            .unwrap();
        bins[b].0 += 1;
        bins[b].1 += usize::from(c != rc);
        bins[b].2 += usize::from(rright && !right);
    }
    assert_eq!(m["flips_right_to_wrong"].as_f64().unwrap(), r2w as f64);
    assert_eq!(m["flips_wrong_to_right"].as_f64().unwrap(), w2r as f64);
    assert_eq!(
        m["agreement"].as_f64().unwrap(),
        agree as f64 / rows.len() as f64
    );
    assert!(
        r2w + w2r > 0,
        "Q4_K_M changes some answers of F16: the check has something to count"
    );
    for (b, (n, changed, rw)) in bins.iter().enumerate() {
        assert_eq!(
            m[format!("margin_bin{b}_n")].as_f64().unwrap(),
            *n as f64,
            "bin {b}"
        );
        assert_eq!(
            m[format!("margin_bin{b}_changed")].as_f64().unwrap(),
            *changed as f64,
            "bin {b}"
        );
        assert_eq!(
            m[format!("margin_bin{b}_right_to_wrong")].as_f64().unwrap(),
            *rw as f64,
            "bin {b}"
        );
        if *n > 0 {
            assert_eq!(
                m[format!("margin_bin{b}_changed_rate")].as_f64().unwrap(),
                *changed as f64 / *n as f64
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Our own JSONL task format scores a task as the binary `--multiple-choice`
/// format does: the computed tasks written both ways give the same verdicts
/// and the same metrics on the same model.
#[test]
fn jsonl_tasks_score_as_the_binary_format_does() {
    use quantgate::kinds::multiple_choice::{computed_tasks, write_binary};
    let root = fresh_dir("jsonl");
    let suites = root.join("suites");
    std::fs::create_dir_all(suites.join("mc")).unwrap();
    std::fs::copy(
        repo().join("suites/models.toml"),
        suites.join("models.toml"),
    )
    .unwrap();
    let tasks = computed_tasks(24, 5);
    let jsonl: String = tasks
        .iter()
        .map(|t| {
            serde_json::json!({
                "question": t.question,
                "choices": t.choices,
                "answer": t.labels.iter().position(|l| *l == 1).unwrap(),
            })
            .to_string()
                + "\n"
        })
        .collect();
    let bin = write_binary(&tasks);
    std::fs::write(suites.join("mc/t.jsonl"), &jsonl).unwrap();
    std::fs::write(suites.join("mc/t.bin"), &bin).unwrap();
    for (name, file, format, bytes) in [
        ("own", "t.jsonl", "jsonl", jsonl.as_bytes()),
        ("tool", "t.bin", "multiple-choice", &bin[..]),
    ] {
        std::fs::write(
            suites.join(format!("mc/{name}.toml")),
            format!(
                "kind = \"multiple_choice\"\nmodels = [\"smollm2-q8_0\"]\nformat = \"{format}\"\n\
                 [tasks_file]\npath = \"{file}\"\nsha256 = \"{}\"\n",
                quantgate::core::fsutil::sha256_bytes(bytes)
            ),
        )
        .unwrap();
    }
    let json = root.join("out.json");
    let (code, stdout, stderr) = run(&suites, &["mc", "--json", json.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let outcomes: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(outcomes.len(), 2);
    assert_eq!(outcomes[0]["metrics"], outcomes[1]["metrics"]);
    assert_eq!(outcomes[0]["metrics"]["tasks"], 24.0);
    let _ = std::fs::remove_dir_all(&root);
}
