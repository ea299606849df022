#!/usr/bin/env bash
# Two quantgate runs started together on this machine, as two test processes
# or two CI jobs on one runner start them: speed/ladder (a speed measurement)
# and ppl/wikitext2 (16 windows of F16 and Q2_K). Each binary gets a cache of
# its own (the models and derived quants of QUANTGATE_CACHE linked; no
# reference products, no results), so two binaries compare side by side.
#
#   scripts/concurrent-runs.sh BINARY [TAG]      # e.g. an old and a new build
#   scripts/concurrent-runs.sh BINARY TAG alone  # the two runs one after the other
#
# Prints each run's wall time, both together, and the speed case's t/s and
# ratios (against each model alone, they tell whether the runs disturbed
# each other). The book, performance: "Processes share the cores".
set -euo pipefail
bin=$(realpath "$1"); tag=${2:-run}; mode=${3:-together}
cd "$(dirname "$0")/.."
main=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
work=$(mktemp -d)
mkdir -p "$work/cache"
ln -s "$main/models" "$work/cache/models"
ln -s "$main/derived" "$work/cache/derived"
export QUANTGATE_CACHE="$work/cache"
one() { /usr/bin/time -f "$1 %e s" "$bin" run "$1" --json "$work/$2.json" >"$work/$2.out" 2>&1; }
start=$(date +%s.%N)
if [ "$mode" = alone ]; then
  one speed/ladder speed; one ppl/wikitext2 ppl
else
  one speed/ladder speed & one ppl/wikitext2 ppl & wait
fi
end=$(date +%s.%N)
tail -n 1 "$work/speed.out"; tail -n 1 "$work/ppl.out"
python3 - "$work/speed.json" "$tag" "$mode" "$start" "$end" <<'PY'
import json, sys
path, tag, mode, start, end = sys.argv[1:]
print(f"{tag} ({mode}): both done in {float(end) - float(start):.1f} s")
for o in json.load(open(path)):
    m = o["metrics"]
    print(f"  {o['model']}: pp {m['pp_tps_mean']:.1f} t/s (ratio {m['pp_ratio_vs_ref']:.3f}), "
          f"tg {m['tg_tps_mean']:.1f} t/s (ratio {m['tg_ratio_vs_ref']:.3f}), {o['status']}")
PY
rm -rf "$work"
