#!/usr/bin/env python3
"""The CI workflow `quantgate init` writes, run on this machine, step by step.

    scripts/release-gates-local.py DIR [--work FOLDER] [--keep]
    scripts/release-gates-local.py --fixture DIR    # DIR made first, as below
    scripts/release-gates-local.py --fixture DIR --quants q8_0 --text FILE --speed KEY=N,...

DIR is a release repository `quantgate init` wrote (its GGUF files inside it,
its goldens accepted). With --fixture, DIR (which must not exist) is made from
the fixture ladder: copies of SmolLM2's F16 and its quants (--quants, default
q8_0,q4_k_m,q2_k) as out/mine-*.gguf, `quantgate init --model 'out/*.gguf'`
(with `--text FILE` when given: a shorter corpus, fewer windows), its speed
case's measurement sizes set by `--speed` when given (`pp=64,tg=16`: a shorter
measurement; keep 3 rounds, whose t interval the golden can hold), and goldens written by
`QUANTGATE_UPDATE=always cargo test --release`.
The script reads DIR/.github/workflows/release-gates.yml and runs its jobs in
the order their `needs` give (build, the partitions of `gates` one after
another, merge), each step's `run` script with bash as the runner would, in
the order the file lists them, with the workflow's, the job's and the step's `env`
(tests/cli/publish.rs runs it on a fixture of F16 and Q8_0 over a short text):

- `actions/checkout`: a fresh copy of DIR's files (GGUF files hard-linked);
- each job its own empty `QUANTGATE_CACHE` (under the work folder), as a fresh
  runner has: nothing reaches a job but through artifacts;
- `actions/upload-artifact` / `download-artifact`: folders under the work
  folder (a `pattern` download puts each artifact in a folder of its name,
  as GitHub does);
- `${{ matrix.* }}` from the job's matrix, `${{ secrets.NAME }}` from this
  process's environment (empty when unset);
- the runner set-up (`apt-get`, `pip install` and `cargo install` lines,
  `Swatinem/rust-cache`, `taiki-e/install-action`) is not run: this machine
  has its prerequisites, `quantgate` (this checkout's release build) and
  `cargo-nextest` on PATH; the pull-request comment is not posted, and
  `$GITHUB_STEP_SUMMARY` is a file the script checks holds the merged table;
- a step that fails fails its job (later steps run only with `if:
  always()`); a job runs when its needs succeeded or with `if: always()`;
  a pull request's job (`if: github.event_name == 'pull_request'`, the
  golden review) is not run: this is a push.

Then the same cases run unsharded (`quantgate run --json` in DIR), and the
merged verdicts are compared with them: the same tests, the same statuses,
every metric of every kind but speed bitwise (speed is measured again by
each run: its counts are compared, and a speed verdict that differs is said,
not failed: a shared machine's speed is not asserted). Exit 0 when everything the
workflow promises held, 1 naming the first difference.

The build job reuses this checkout's target folder (CARGO_TARGET_DIR) and
Cargo.lock, offline: only quantgate and DIR's crate compile.
"""

import argparse
import fnmatch
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SETUP = re.compile(r"^\s*(sudo\s+)?(apt-get|pip3?\s+install|cargo\s+install)\b")


def say(*a):
    print("release-gates-local:", *a, file=sys.stderr, flush=True)


def die(msg):
    say("FAILED:", msg)
    sys.exit(1)


def load_yaml(path):
    try:
        import yaml
    except ImportError:
        # PyYAML from PyPI, into a folder of this run's own.
        target = tempfile.mkdtemp(prefix="qg-pyyaml-")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", target, "PyYAML==6.0.3"],
            check=True,
        )
        sys.path.insert(0, target)
        import yaml
    with open(path) as f:
        # YAML 1.1 reads the key `on` as True; only `jobs` matters here.
        return yaml.safe_load(f)


def expand(text, matrix):
    """`${{ … }}` expressions of a run script or env value."""

    def one(m):
        expr = m.group(1).strip()
        if expr.startswith("matrix."):
            return str(matrix[expr[len("matrix."):]])
        if expr.startswith("secrets."):
            return os.environ.get(expr[len("secrets."):], "")
        die(f"expression `{expr}` is not one this script knows")

    return re.sub(r"\$\{\{(.*?)\}\}", one, str(text))


def job_order(jobs):
    done, order = set(), []
    while len(order) < len(jobs):
        ready = [
            n for n, j in jobs.items()
            if n not in done and set(as_list(j.get("needs"))) <= done
        ]
        if not ready:
            die("the jobs' needs form a cycle")
        for n in ready:
            done.add(n)
            order.append(n)
    return order


def as_list(v):
    if v is None:
        return []
    return v if isinstance(v, list) else [v]


def checkout(src, dest):
    """DIR's files as a clone would hold them: no build outputs."""
    skip = {"target", ".git"}

    def copy(s, d):
        if os.path.getsize(s) > (1 << 20) and s.endswith(".gguf"):
            os.link(s, d)
        else:
            shutil.copy2(s, d)

    shutil.copytree(
        src,
        dest,
        ignore=lambda d, names: [n for n in names if n in skip and pathlib.Path(d) == src],
        copy_function=copy,
        symlinks=True,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=pathlib.Path)
    ap.add_argument("--work", type=pathlib.Path)
    ap.add_argument("--keep", action="store_true", help="keep the work folder after a pass")
    ap.add_argument("--fixture", action="store_true", help="make DIR from the fixture ladder first")
    ap.add_argument("--quants", default="q8_0,q4_k_m,q2_k", help="the fixture's quants of F16")
    ap.add_argument("--text", type=pathlib.Path, help="the fixture's corpus (init --text)")
    ap.add_argument("--speed", default="", help="the fixture's speed sizes: pp=N,tg=N,repetitions=N,rounds=N")
    a = ap.parse_args()
    src = a.dir.resolve()
    if a.fixture:
        quants = [q.strip() for q in a.quants.split(",") if q.strip()]
        make_fixture_repository(src, quants, a.text.resolve() if a.text else None, speed_sizes(a.speed))
    elif a.text or a.speed or a.quants != ap.get_default("quants"):
        die("--quants, --text and --speed shape a --fixture")
    workflow = src / ".github/workflows/release-gates.yml"
    if not workflow.is_file():
        die(f"{workflow}: no workflow (run `quantgate init` first)")
    doc = load_yaml(workflow)
    jobs = doc["jobs"]
    work = (a.work or pathlib.Path(tempfile.mkdtemp(prefix="qg-workflow-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    artifacts = work / "artifacts"
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir()

    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    subprocess.run(["cargo", "build", "--release", "--bin", "quantgate"], cwd=ROOT, check=True)
    nextest = subprocess.run(
        [str(ROOT / "scripts/fetch-cargo-nextest.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    tools = work / "bin"
    shutil.rmtree(tools, ignore_errors=True)
    tools.mkdir()
    (tools / "quantgate").symlink_to(target / "release/quantgate")
    (tools / "cargo-nextest").symlink_to(nextest)
    base_env = dict(os.environ)
    base_env.update(
        PATH=f"{tools}:{os.environ['PATH']}",
        CARGO_TARGET_DIR=str(target),
        CARGO_NET_OFFLINE="true",
        GITHUB_STEP_SUMMARY=str(work / "step-summary.md"),
    )
    (work / "step-summary.md").write_text("")
    for k in ("CI", "QUANTGATE_OUT", "QUANTGATE_REFERENCE_DIR", "QUANTGATE_UPDATE"):
        base_env.pop(k, None)

    results = {}
    for name in job_order(jobs):
        job = jobs[name]
        if "github.event_name == 'pull_request'" in str(job.get("if", "")):
            # A pull request's job (the golden review): this run is a push.
            say(f"job {name}: a pull request's job, not run for a push")
            results[name] = True
            continue
        needs_ok = all(results[n] for n in as_list(job.get("needs")))
        if not needs_ok and "always()" not in str(job.get("if", "")):
            say(f"job {name}: skipped (a job it needs failed)")
            results[name] = False
            continue
        matrix = (job.get("strategy") or {}).get("matrix") or {}
        keys = list(matrix)
        combos = [{}]
        for k in keys:
            combos = [dict(c, **{k: v}) for c in combos for v in matrix[k]]
        ok_all = True
        for combo in combos:
            label = name + "".join(f" {k}={v}" for k, v in combo.items())
            ws = work / "jobs" / re.sub(r"[^\w=.-]+", "_", label)
            shutil.rmtree(ws, ignore_errors=True)
            shutil.rmtree(work / "caches" / ws.name, ignore_errors=True)
            ws.mkdir(parents=True)
            ok = True
            for i, step in enumerate(job["steps"]):
                title = expand(step.get("name") or step.get("uses") or f"step {i + 1}", combo)
                if not ok and "always()" not in str(step.get("if", "")):
                    say(f"{label}: {title}: skipped")
                    continue
                t = time.time()
                uses = step.get("uses", "")
                with_ = {k: expand(v, combo) for k, v in (step.get("with") or {}).items()}
                if uses.startswith("actions/checkout@"):
                    shutil.rmtree(ws)
                    checkout(src, ws)
                    # This build's dependency versions (offline).
                    shutil.copy2(ROOT / "Cargo.lock", ws / "Cargo.lock")
                elif uses.startswith("actions/upload-artifact@"):
                    dest = artifacts / with_["name"]
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.mkdir(parents=True)
                    for p in with_["path"].split():
                        p = ws / p
                        if p.is_dir():
                            shutil.copytree(p, dest / p.name if len(with_["path"].split()) > 1 else dest,
                                            dirs_exist_ok=True)
                        elif p.is_file():
                            shutil.copy2(p, dest / p.name)
                elif uses.startswith("actions/download-artifact@"):
                    into = ws / with_.get("path", ".")
                    if "name" in with_:
                        shutil.copytree(artifacts / with_["name"], into, dirs_exist_ok=True)
                    else:
                        for art in sorted(artifacts.iterdir()):
                            if fnmatch.fnmatch(art.name, with_["pattern"]):
                                shutil.copytree(art, into / art.name, dirs_exist_ok=True)
                elif uses.startswith(("Swatinem/rust-cache@", "taiki-e/install-action@",
                                      "actions/setup-python@", "actions/cache@")):
                    # Runner set-up: this machine's cargo cache, nextest, Python
                    # and the Hub's cache.
                    say(f"{label}: {title}: runner set-up, not run here")
                    continue
                elif uses.startswith("marocchino/sticky-pull-request-comment@"):
                    # Posts to a pull request on GitHub: the step summary
                    # holds the same table here.
                    say(f"{label}: {title}: posts to GitHub, not run here")
                    continue
                elif "run" in step:
                    script = "\n".join(
                        f": runner set-up, not run here: {l.strip()}" if SETUP.match(l) else l
                        for l in expand(step["run"], combo).splitlines()
                    )
                    env = dict(base_env)
                    # A fresh runner's cache: each job its own, empty at
                    # its start (results, reference products, kept windows
                    # are never carried from one job to another but by
                    # artifacts, as on GitHub).
                    env["QUANTGATE_CACHE"] = str(work / "caches" / ws.name)
                    for scope in (doc.get("env"), job.get("env"), step.get("env")):
                        env.update({k: expand(v, combo) for k, v in (scope or {}).items()})
                    log = work / "logs" / f"{ws.name}.{i + 1}.log"
                    log.parent.mkdir(exist_ok=True)
                    with open(log, "w") as f:
                        rc = subprocess.run(
                            ["bash", "-e", "-c", script], cwd=ws, env=env, stdout=f, stderr=subprocess.STDOUT
                        ).returncode
                    if rc != 0:
                        ok = False
                        say(f"{label}: {title}: exit {rc} (log {log})")
                else:
                    die(f"{label}: {title}: `{uses}` is not an action this script knows")
                say(f"{label}: {title}: {time.time() - t:.1f} s")
            say(f"job {label}: {'passed' if ok else 'failed'}")
            ok_all &= ok
        results[name] = ok_all

    # The merge's result against the same cases run unsharded.
    merged_json = next((work / "jobs").glob("merge*/*merged.json"), None)
    if merged_json is None:
        die("the merge wrote no merged.json")
    report = next(merged_json.parent.glob("*report/report.md"), None)
    if report is None:
        die("the merge wrote no report")
    summary = (work / "step-summary.md").read_text()
    card = report.read_text()
    # The card's tables, its front matter left out (the Hub reads that).
    body = card.split("\n---\n", 1)[1] if card.startswith("---\n") else card
    if body.strip() not in summary or summary.lstrip().startswith("---"):
        die("the step summary does not hold the merged report's tables (without front matter)")
    if "## Quant ladder report" not in summary:
        die("the step summary holds no ladder table")
    # Each partition's JUnit file, as the workflow uploads it: one testcase
    # per test of the partition.
    junit = sorted(artifacts.glob("junit-*/junit.xml"))
    partitions = [c for c in jobs.get("gates", {}).get("strategy", {}).get("matrix", {}).get("partition", [])]
    if len(junit) != len(partitions):
        die(f"{len(junit)} JUnit files uploaded for {len(partitions)} partitions")
    cases = sum(j.read_text().count("<testcase ") for j in junit)
    merged_tests = len(json.loads(merged_json.read_text()))
    if cases < merged_tests:
        die(f"the JUnit files hold {cases} test cases, the merge {merged_tests} outcomes")
    say(f"JUnit: {len(junit)} files, {cases} test cases; step summary holds the card's tables")
    t = time.time()
    unsharded = work / "unsharded.json"
    env = dict(base_env)
    rc = subprocess.run(
        ["quantgate", "run", "--json", str(unsharded)], cwd=src, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ).returncode
    if rc not in (0, 1) or not unsharded.is_file():
        die(f"the unsharded `quantgate run` exited {rc}")
    say(f"unsharded run: {time.time() - t:.1f} s")
    compare(json.loads(merged_json.read_text()), json.loads(unsharded.read_text()))
    if not a.keep and a.work is None:
        shutil.rmtree(work)
    else:
        say(f"work folder kept: {work}")


def speed_sizes(spec):
    """`pp=64,tg=16,…` as {key: int}: only the speed case's sizes."""
    sizes = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition("=")
        if key not in ("pp", "tg", "repetitions", "rounds") or not value.isdigit():
            die(f"--speed {spec}: `{part}` is not one of pp=N, tg=N, repetitions=N, rounds=N")
        sizes[key] = int(value)
    return sizes


def make_fixture_repository(dir, quants, text, speed):
    """A release repository of the fixture ladder's F16 and `quants`, its
    corpus `text` (None: init's default), its speed case's sizes `speed`
    (each key's line in suites/release/speed.toml replaced), goldens
    accepted."""
    if dir.exists():
        die(f"--fixture {dir}: exists already")
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    subprocess.run(["cargo", "build", "--release", "--bin", "quantgate"], cwd=ROOT, check=True)
    qg = str(target / "release/quantgate")
    (dir / "out").mkdir(parents=True)
    for q in ["f16", *quants]:
        alias = f"smollm2-{q}"
        subprocess.run([qg, "models", "fetch", alias], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        info = json.loads(
            subprocess.run([qg, "inspect", alias, "--json"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout
        )
        shutil.copy2(info[0]["path"], dir / "out" / f"mine-{q}.gguf")
    init = [qg, "init", "--model", "out/*.gguf"]
    if text is not None:
        init += ["--text", str(text)]
    subprocess.run(init, cwd=dir, check=True, stdout=subprocess.DEVNULL)
    case = dir / "suites/release/speed.toml"
    toml = case.read_text()
    for key, value in speed.items():
        toml, n = re.subn(rf"(?m)^{key} = \d+$", f"{key} = {value}", toml)
        if n != 1:
            die(f"{case}: no single `{key} = N` line to set")
    case.write_text(toml)
    shutil.copy2(ROOT / "Cargo.lock", dir / "Cargo.lock")
    env = dict(os.environ, QUANTGATE_UPDATE="always", CARGO_NET_OFFLINE="true",
               CARGO_TARGET_DIR=str(target))
    env.pop("CI", None)
    t = time.time()
    # Exit 101 is expected: the gates of Q2_K fail; the goldens are written.
    subprocess.run(["cargo", "test", "--release"], cwd=dir, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    goldens = sorted((dir / "goldens").rglob("*.snap"))
    if len(goldens) != 4 * len(quants):
        die(f"--fixture: {len(goldens)} goldens written, not {4 * len(quants)} (4 cases × {len(quants)} quants)")
    say(f"fixture repository {dir}: {len(goldens)} goldens in {time.time() - t:.1f} s")


SPEED_MEASURED = re.compile(r"tps|ratio")


def compare(merged, unsharded):
    key = lambda o: (o["case"], o["model"])
    m = {key(o): o for o in merged}
    u = {key(o): o for o in unsharded}
    if set(m) != set(u):
        die(f"tests differ: merged only {sorted(set(m) - set(u))}, unsharded only {sorted(set(u) - set(m))}")
    for k in sorted(m):
        a, b = m[k], u[k]
        speed = a.get("kind") == "speed"
        if a["status"] != b["status"] and speed:
            say(f"{k}: speed measured again: merged {a['status']}, unsharded {b['status']} (not asserted)")
        elif a["status"] != b["status"]:
            die(f"{k}: merged {a['status']}, unsharded {b['status']}")
        ma = {n: v for n, v in a["metrics"].items() if not (speed and SPEED_MEASURED.search(n))}
        mb = {n: v for n, v in b["metrics"].items() if not (speed and SPEED_MEASURED.search(n))}
        if ma != mb:
            diff = sorted(n for n in set(ma) | set(mb) if ma.get(n) != mb.get(n))
            die(f"{k}: metrics differ: {diff[:8]}")
    fails = sorted(f"{c}::{mo}" for (c, mo), o in m.items() if o["status"] != "pass")
    say(f"merged equals unsharded on {len(m)} tests (speed's measured t/s aside); not passing: {fails}")


if __name__ == "__main__":
    main()
