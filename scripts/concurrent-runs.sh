#!/usr/bin/env bash
# Two quantgate runs started together on this machine, as two test processes
# or two CI jobs on one runner start them. Each binary gets a cache of its
# own (the models and derived quants of QUANTGATE_CACHE linked; no reference
# products, no results), so two binaries compare side by side.
#
#   scripts/concurrent-runs.sh BINARY [TAG]      # e.g. an old and a new build
#   scripts/concurrent-runs.sh BINARY TAG alone  # the two runs one after the other
#
# PAIR picks the two runs:
# - speed (the default): speed/ladder (a speed measurement) and ppl/wikitext2
#   (16 windows of F16 and Q2_K); prints the speed case's t/s and ratios
#   (against each model alone, they tell whether the runs disturbed each other);
# - sequential: ppl/delta_nll_sequential on Q8_0 and on Q6_K, one process
#   each (as nextest runs one test per process): both visit the F16
#   reference's windows in the same seeded order; prints the windows each used.
#
# Prints each run's wall time and both together. The book, performance:
# "Processes share the cores".
set -euo pipefail
bin=$(realpath "$1"); tag=${2:-run}; mode=${3:-together}
cd "$(dirname "$0")/.."
main=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
work=$(mktemp -d)
mkdir -p "$work/cache"
ln -s "$main/models" "$work/cache/models"
ln -s "$main/derived" "$work/cache/derived"
export QUANTGATE_CACHE="$work/cache"
# one NAME CASE [ARGS...]: the run, its outcomes in NAME.json.
one() {
  local name=$1; shift
  /usr/bin/time -f "$name %e s" "$bin" run "$@" --json "$work/$name.json" >"$work/$name.out" 2>&1
}
case ${PAIR:-speed} in
  speed) a=(speed speed/ladder); b=(ppl ppl/wikitext2) ;;
  sequential)
    a=(q8_0 ppl/delta_nll_sequential --model smollm2-q8_0)
    b=(q6_k ppl/delta_nll_sequential --model smollm2-q6_k) ;;
  *) echo "PAIR=$PAIR: not speed or sequential" >&2; exit 2 ;;
esac
start=$(date +%s.%N)
if [ "$mode" = alone ]; then
  one "${a[@]}"; one "${b[@]}"
else
  one "${a[@]}" & one "${b[@]}" & wait
fi
end=$(date +%s.%N)
tail -n 1 "$work/${a[0]}.out"; tail -n 1 "$work/${b[0]}.out"
python3 - "$work" "${a[0]}" "${b[0]}" "$tag" "$mode" "$start" "$end" <<'PY'
import json, sys
work, a, b, tag, mode, start, end = sys.argv[1:]
print(f"{tag} ({mode}): both done in {float(end) - float(start):.1f} s")
if a != "speed":
    for name in (a, b):
        for o in json.load(open(f"{work}/{name}.json")):
            m = o["metrics"]
            print(f"  {o['model']}: {m['windows']:.0f} of {m['windows_total']:.0f} windows, "
                  f"ΔNLL {m['delta_nll_mean']:+.5f}, {o['status']}")
    sys.exit()
for o in json.load(open(f"{work}/{a}.json")):
    m = o["metrics"]
    print(f"  {o['model']}: pp {m['pp_tps_mean']:.1f} t/s (ratio {m['pp_ratio_vs_ref']:.3f}), "
          f"tg {m['tg_tps_mean']:.1f} t/s (ratio {m['tg_ratio_vs_ref']:.3f}), {o['status']}")
PY
rm -rf "$work"
