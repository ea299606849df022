#!/usr/bin/env python3
"""confseq-oracle.py: the bounds confseq gives on the inputs quantgate's
sequential decisions were computed from (tests/real_engine/sequential_oracle.rs).

Reads JSON on stdin: a request {"N": int, "alpha": float, "breaks": int,
"trunc_scale": float, "series": [[x in [0, 1], ...], ...]}, or a list of
requests (one process for many: its start-up and imports are most of a small
request's time); writes JSON: for a request, one list of lower bounds per
series, the value after each x (for a list, one such answer per request), from
confseq.betting.betting_lower_cs with the adaptive Kelly bets
(confseq.betting_strategies.lambda_aKelly with N) taken one-sided.
Run with PYTHONPATH set to the folder scripts/fetch-confseq.sh prints.
"""
import json
import warnings
import sys
import types

import numpy as np

warnings.filterwarnings("ignore", category=RuntimeWarning)
# confseq 0.0.11 annotates with np.float_, which NumPy 2 removed.
if not hasattr(np, "float_"):
    np.float_ = np.float64
# Imported at the top of confseq.betting, used only by plotting, parallel
# and other functions than the one called here.
for name in ("matplotlib", "matplotlib.pyplot", "multiprocess", "scipy", "scipy.optimize"):
    if name not in sys.modules:
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            for attr in ("minimize", "newton", "root"):
                setattr(stub, attr, None)
            sys.modules[name] = stub

from confseq.betting import betting_lower_cs  # noqa: E402
from confseq.betting_strategies import lambda_aKelly  # noqa: E402


def answer(req):
    N = req["N"]
    out = []
    for x in req["series"]:
        x = np.asarray(x, dtype=float)
        lower = betting_lower_cs(
            x,
            lambdas_fns=[lambda x, m: np.maximum(0, lambda_aKelly(x, m, N=N))],
            alpha=req["alpha"],
            N=N,
            breaks=req["breaks"],
            trunc_scale=req["trunc_scale"],
            m_trunc=True,
        )
        out.append([float(v) for v in lower])
    return out


req = json.load(sys.stdin)
out = [answer(r) for r in req] if isinstance(req, list) else answer(req)
json.dump(out, sys.stdout)
