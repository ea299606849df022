#!/usr/bin/env bash
# The robustness sweep: each hostile input of the robustness rounds run
# against the built `quantgate`, one line per probe:
#
#   OK   cache-flash-attn   exit 0  <the line that shows the answer>
#
# A probe is OK when the exit code is the one a user must get and the
# output says what it must (the file, key or mode named); BAD otherwise —
# a wrong pass, a crash, or an answer that names nothing. The sweep ends
# with the count and exits 1 on any BAD.
#
#   scripts/robustness-sweep.sh           # after `cargo build --release`
#   QG_SWEEP_WORK=/tmp/sweep scripts/robustness-sweep.sh   # keep the folder
#
# It needs the fixture models (`quantgate models fetch`) and python3.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
qg=$target/release/quantgate
[[ -x $qg ]] || { echo "sweep: $qg is not built (cargo build --release)" >&2; exit 2; }
work=${QG_SWEEP_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/qg-sweep.XXXXXX")}
mkdir -p "$work"
ok=0
bad=0
key=sweep-signing-key-0123456789abcdef

# Every variable the probes set is unset first: the caller's never leaks in.
for v in QUANTGATE_REFERENCE_DIR QUANTGATE_REFERENCE_MISSING QUANTGATE_SIGNING_KEY \
  QUANTGATE_SIGNING_KEY_FILE QUANTGATE_FLASH_ATTN QUANTGATE_KV_TYPE QUANTGATE_N_GPU_LAYERS \
  QUANTGATE_RESULT_CACHE QUANTGATE_ISOLATION QUANTGATE_OUT QUANTGATE_UPDATE; do
  unset "$v"
done
# Each probe's cache is its own (results, references), the fixture models
# linked in from the caller's cache (`quantgate models fetch` put them there).
models_cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
cache_at() {
  mkdir -p "$1"
  ln -sfn "$models_cache/models" "$1/models"
  ln -sfn "$models_cache/derived" "$1/derived"
  printf '%s' "$1"
}
export QUANTGATE_CACHE
QUANTGATE_CACHE=$(cache_at "$work/cache")

# probe NAME CODE TEXT CMD…: run CMD; OK when it exits CODE and its output
# holds TEXT (a fixed string; empty: anything).
probe() {
  local name=$1 want=$2 text=$3
  shift 3
  local out code line verdict
  out=$("$@" 2>&1)
  code=$?
  if [[ -n $text ]]; then
    line=$(grep -F -m1 -- "$text" <<<"$out")
  else
    line=$(head -1 <<<"$out")
  fi
  [[ -z $line ]] && line=$(grep -m1 -v '^quantgate: \(running\|reference work\)' <<<"$out")
  if [[ $code == "$want" && ( -z $text || $out == *"$text"* ) ]]; then
    verdict=OK; ((ok++))
  else
    verdict=BAD; ((bad++))
    printf '%s\n' "$out" >"$work/$name.log"
  fi
  printf '%-4s %-34s exit %-3s %s\n' "$verdict" "$name" "$code" "${line:0:150}"
}

# probe_not NAME CODE TEXT CMD…: as probe, but OK only when the output
# does NOT hold TEXT (a result that must not come from the cache).
probe_not() {
  local name=$1 want=$2 text=$3
  shift 3
  local out code verdict
  out=$("$@" 2>&1)
  code=$?
  if [[ $code == "$want" && $out != *"$text"* ]]; then
    verdict=OK; ((ok++))
  else
    verdict=BAD; ((bad++))
    printf '%s\n' "$out" >"$work/$name.log"
  fi
  printf '%-4s %-34s exit %-3s %s\n' "$verdict" "$name" "$code" "(no \"$text\")"
}

# A suites folder: the registry (the fixtures by their recipes, from the
# cache), WikiText-2, and a kld + ppl pair on the F16 reference.
s=$work/suites
mkdir -p "$s/ppl" "$s/kld"
cp suites/models.toml "$s/models.toml"
wiki_sha=$(sha256sum suites/data/wikitext-2-test.txt | cut -d' ' -f1)
for d in ppl kld; do cp suites/data/wikitext-2-test.txt "$s/$d/wiki.txt"; done
body() {
  printf 'kind = "%s"\nmodels = ["%s"]\n%s[text]\npath = "wiki.txt"\nsha256 = "%s"\n[window]\nmode = "llama-perplexity"\nn_ctx = 128\nchunks = 2\n' \
    "$1" "$2" "$3" "$wiki_sha"
}
body kld smollm2-q8_0 'reference = "smollm2-f16"
' >"$s/kld/k.toml"
body perplexity smollm2-q8_0 'reference = "smollm2-f16"
' >"$s/ppl/d.toml"
# The whole pair, and the perplexity case alone (`env VAR=… "${RUN[@]}"`).
RUN=("$qg" --suites "$s" run --threads 1)
ONLY=("$qg" --suites "$s" run --threads 1 ppl/d)
run() { "${RUN[@]}" "$@"; }
run_only() { "${ONLY[@]}" "$@"; }

echo "sweep: work folder $work"

# --- The result cache is keyed by every engine setting -------------------
run_only >/dev/null 2>&1
probe cache-same-settings-served 0 "result from the result cache" run_only
probe_not cache-flash-attn-flag 0 "result from the result cache" run_only --flash-attn on
probe_not cache-kv-type 0 "result from the result cache" run_only --flash-attn on --kv-type q8_0
probe_not cache-n-gpu-layers 0 "result from the result cache" run_only --n-gpu-layers 0
probe_not cache-threads 0 "result from the result cache" "$qg" --suites "$s" run --threads 2 ppl/d
probe cache-flash-attn-variable 0 "result from the result cache" env QUANTGATE_FLASH_ATTN=on "$qg" --suites "$s" run --threads 1 ppl/d

# --- Reference products forged and sealed again --------------------------
art=$work/artifact
QUANTGATE_SIGNING_KEY=$key "$qg" --suites "$s" reference build --out "$art" >/dev/null 2>&1
# Flip a byte near the end of the body and seal it again with sha256.
forge() {
  python3 - "$1" <<'PY'
import hashlib, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())[:-32]
b[-40] ^= 4
open(p, "wb").write(bytes(b) + hashlib.sha256(bytes(b)).digest())
PY
}
for ext in qgref qgscores; do
  f=$(ls "$art"/*.$ext)
  cp "$f" "$work/good.$ext"
  forge "$f"
  probe "shipped-$ext-forged-keyed" 2 "plain sha256 seal" \
    env QUANTGATE_SIGNING_KEY=$key QUANTGATE_REFERENCE_DIR="$art" QUANTGATE_CACHE="$(cache_at "$work/c-$ext")" \
    "$qg" --suites "$s" run --threads 1
  cp "$work/good.$ext" "$f"
done
probe shipped-keyed-genuine 0 "" \
  env QUANTGATE_SIGNING_KEY=$key QUANTGATE_REFERENCE_DIR="$art" QUANTGATE_CACHE="$(cache_at "$work/c-genuine")" "${RUN[@]}"
plain=$work/plain
"$qg" --suites "$s" reference build --out "$plain" >/dev/null 2>&1
probe shipped-unkeyed-warns 0 "is unauthenticated" \
  env QUANTGATE_REFERENCE_DIR="$plain" QUANTGATE_CACHE="$(cache_at "$work/c-plain")" "${RUN[@]}"
probe shipped-keyed-read-without-key 2 "is unusable" \
  env QUANTGATE_REFERENCE_DIR="$art" QUANTGATE_CACHE="$(cache_at "$work/c-nokey")" "${RUN[@]}"
# The local cache: a forged .qgref is rebuilt, never read (the windows'
# kept comparisons removed first, else the case reads those and never the
# rows).
lc=$(cache_at "$work/c-local")
QUANTGATE_CACHE=$lc "$qg" --suites "$s" run --threads 1 kld/k >/dev/null 2>&1
forge "$(ls "$lc"/reference/*.qgref)"
rm -f "$lc"/reference/*.qgkld
probe local-qgref-forged-rebuilt 0 "plain sha256 seal" \
  env QUANTGATE_CACHE="$lc" QUANTGATE_RESULT_CACHE=off "$qg" --suites "$s" run --threads 1 kld/k
# A forged kept comparison (.qgkld, kept again by the run above) is never
# read: said, and the window compared again.
forge "$(ls "$lc"/reference/*.qgkld | head -1)"
probe local-qgkld-forged-compared-again 0 "plain sha256 seal" \
  env QUANTGATE_CACHE="$lc" QUANTGATE_RESULT_CACHE=off "$qg" --suites "$s" run --threads 1 kld/k

# --- The key file --------------------------------------------------------
printf '%s\n' "$key" >"$work/key"
chmod 644 "$work/key"
probe key-file-world-readable 2 "mode 0644" env QUANTGATE_SIGNING_KEY_FILE="$work/key" "${ONLY[@]}"
chmod 600 "$work/key"
ln -sf "$work/key" "$work/key-link"
probe key-file-symlink 2 "is a symlink" env QUANTGATE_SIGNING_KEY_FILE="$work/key-link" "${ONLY[@]}"
probe key-too-short 2 "too short" env QUANTGATE_SIGNING_KEY=short "${ONLY[@]}"

# --- Flags and variables -------------------------------------------------
probe jobs-zero 2 "give at least 1" "$qg" --suites "$s" run --jobs 0
probe threads-zero 2 "give at least 1" "$qg" --suites "$s" run --threads 0
probe isolation-bad-value 2 "QUANTGATE_ISOLATION" env QUANTGATE_ISOLATION=pod "${ONLY[@]}"
probe_not isolation-test-shares-nothing 0 "(one decode)" \
  env QUANTGATE_ISOLATION=test QUANTGATE_RESULT_CACHE=off "$qg" --suites "$s" run --threads 1

# --- A model compared with itself ----------------------------------------
self=$work/self
mkdir -p "$self/ppl"
cp "$s/models.toml" "$self/models.toml"
cp "$s/ppl/wiki.txt" "$self/ppl/"
body perplexity smollm2-f16 'reference = "smollm2-f16"
' >"$self/ppl/alias.toml"
probe run-reference-is-candidate 2 "is the candidate \`smollm2-f16\` itself" \
  "$qg" --suites "$self" run --threads 1
init=$work/init
mkdir -p "$init/lm"
# GGUF headers (init pins them; nothing is decoded): the largest file is
# the reference, and a copy of it is the candidate that must be refused.
header() { python3 -c 'import struct,sys; open(sys.argv[1],"wb").write((b"GGUF"+struct.pack("<IQQ",3,0,0)).ljust(int(sys.argv[2]),b"\0"))' "$1" "$2"; }
header "$init/lm/m-f16.gguf" 2048
header "$init/lm/m-copy.gguf" 2048
header "$init/lm/m-q8_0.gguf" 1024
probe init-copy-of-reference 2 "the same bytes as the reference" \
  bash -c "cd '$init' && '$qg' init --model 'lm/*.gguf' --reference lm/m-f16.gguf"
: >"$init/empty.txt"
probe init-empty-text 2 "empty (no text to score)" \
  bash -c "cd '$init' && '$qg' init --model lm/m-f16.gguf --model lm/m-q8_0.gguf --text empty.txt"

# --- Preflight: hyperparameters llama.cpp cannot run ----------------------
pre=$work/pre
mkdir -p "$pre/ppl"
cp "$s/ppl/wiki.txt" "$pre/ppl/"
: >"$pre/models.toml"
gguf() {
  python3 - "$@" <<'PY'
import struct, sys
path, kvs = sys.argv[1], sys.argv[2:]
def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b
out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs) + 1)
out += s("general.architecture") + struct.pack("<I", 8) + s("llama")
for kv in kvs:
    k, v = kv.split("=")
    out += s("llama." + k) + struct.pack("<Ii", 5, int(v))
open(path, "wb").write(out + b"\0" * 64)
PY
}
good="block_count=2 embedding_length=64 attention.head_count=4 attention.head_count_kv=4 context_length=128 feed_forward_length=128 rope.dimension_count=16"
for p in context_length=-1 feed_forward_length=0 attention.head_count=0 rope.dimension_count=0; do
  name=${p%%=*}
  # shellcheck disable=SC2086
  gguf "$pre/$name.gguf" $(sed "s/$name=[-0-9]*/$p/" <<<"$good")
  sha=$(sha256sum "$pre/$name.gguf" | cut -d' ' -f1)
  bytes=$(stat -c %s "$pre/$name.gguf")
  alias=bad-${name//./-}
  alias=${alias//_/-}
  printf '[%s]\nsha256 = "%s"\nbytes = %s\npath = "%s.gguf"\n' "$alias" "$sha" "$bytes" "$name" >>"$pre/models.toml"
  body perplexity "$alias" "" >"$pre/ppl/$alias.toml"
  probe "preflight-$p" 2 "llama.$name\` = ${p#*=}" "$qg" --suites "$pre" run --threads 1 "ppl/$alias"
done

# --- Merge ----------------------------------------------------------------
shard=$work/shard.json
QUANTGATE_CACHE=$(cache_at "$work/c-shard") "${RUN[@]}" --json "$shard" >/dev/null 2>&1
probe merge-keyless-unauthenticated 0 "unauthenticated:" "$qg" --suites "$s" merge "$shard"
# Edit the first outcome of the shard's file.
edit() {
  python3 - "$shard" "$1" <<'PY'
import json, sys
p, what = sys.argv[1], sys.argv[2]
v = json.load(open(p))
o = v[0]
if what == "sha":
    o["model_sha256"] = None
else:
    o["metrics"] = {k: None for k in o["metrics"]}
json.dump(v, open(p, "w"))
PY
}
cp "$shard" "$work/shard-good.json"
edit sha
probe merge-model-sha256-null 2 "not recorded" "$qg" --suites "$s" merge "$shard"
cp "$work/shard-good.json" "$shard"
edit nan
probe_not merge-nan-metrics-never-pass 2 "2 passed" "$qg" --suites "$s" merge "$shard"

# --- The lock: two aliases for one file ----------------------------------
lk=$work/lock
mkdir -p "$lk/ppl"
cp "$s/ppl/wiki.txt" "$lk/ppl/"
: >"$lk/models.toml"
header "$lk/m.gguf" 4096
body perplexity "path:$lk/m.gguf" "" >"$lk/ppl/p.toml"
"$qg" --suites "$lk" run --threads 1 >/dev/null 2>&1
if [[ -f $lk/models.lock ]]; then
  python3 - "$lk/models.lock" <<'PY'
import sys
p = sys.argv[1]
t = open(p).read()
i = t.index("\n[")
entry = t[i:]
head = entry.split("]", 1)[0]
open(p, "a").write(entry.replace(head, head + "-twin", 1))
PY
fi
probe lock-two-aliases-one-file 2 "both pin" "$qg" --suites "$lk" run --threads 1

echo "sweep: $((ok + bad)) probes: $ok OK, $bad BAD"
if ((bad)); then
  echo "sweep: the BAD probes' output is in $work/<probe>.log" >&2
  exit 1
fi
[[ -z ${QG_SWEEP_WORK:-} ]] && rm -rf "$work"
exit 0
