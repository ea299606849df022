#!/usr/bin/env python3
"""record-ladder-series.py JSON ROWS OUT: the per-window series of a real
ladder run, for tests/real_engine/sequential_oracle.rs (tests/data/ladder-80.json).

JSON is a `quantgate run --json` file of a kld case over the ladder, ROWS
the `--out` folder of the same run (per-position Parquet rows). Writes OUT:
per candidate, the per-window ΔNLL (the outcome's delta_nll_per_window) and
the per-window mean KL(ref ‖ candidate) from the rows (mean of kl_vs_ref
by window). Needs duckdb (pip install duckdb) to read the Parquet files.

How tests/data/ladder-80.json was made (80 windows of WikiText-2 test at
n_ctx 512, F16 reference, 2 threads):
  quantgate run --suites S kld/w80 --json w80.json --out rows --no-cache
  scripts/record-ladder-series.py w80.json rows tests/data/ladder-80.json
with S/kld/w80.toml = suites/kld/wikitext2.toml with chunks = 80, models
Q8_0, Q6_K, Q4_K_M, Q2_K and no gates.
"""
import json
import sys

import duckdb

src, rows, out = sys.argv[1:4]
text = open(src).read()
outcomes = json.loads(text) if text.lstrip().startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
order = ["smollm2-q8_0", "smollm2-q6_k", "smollm2-q4_k_m", "smollm2-q2_k"]
models = []
for name in order:
    o = next(o for o in outcomes if o["model"] == name)
    assert o["status"] != "error", (name, o["error"])
    path = f"{rows}/{o['case']}/{name}.parquet"
    kld = [r[1] for r in duckdb.sql(
        f"select \"window\", avg(kl_vs_ref) from '{path}' group by \"window\" order by \"window\"").fetchall()]
    dnll = o["series"]["delta_nll_per_window"]
    assert len(kld) == len(dnll), (name, len(kld), len(dnll))
    models.append({"model": name, "delta_nll": dnll, "kld": kld})
json.dump({
    "about": "per-window ΔNLL and mean KL(F16 ‖ quant) of the SmolLM2 ladder over 80 windows "
             "of WikiText-2 test (n_ctx 512), made by scripts/record-ladder-series.py",
    "models": models,
}, open(out, "w"), indent=1)
