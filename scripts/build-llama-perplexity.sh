#!/usr/bin/env bash
# Build llama.cpp's own `llama-perplexity` from the very sources that the pinned
# llama-cpp-sys-2 crate compiles into quantgate (same commit, same CPU flags:
# GGML_NATIVE=OFF, as the crate's build.rs sets without target-cpu), so that
# tests can compare quantgate's numbers with the reference tool's.
# Prints the binary's path on stdout. Idempotent: a finished build is reused.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
sys_version=$(grep -A1 '^name = "llama-cpp-sys-2"' "$here/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p')
[ -n "$sys_version" ] || { echo "llama-cpp-sys-2 not in Cargo.lock" >&2; exit 2; }
src=""
for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-"$sys_version"/llama.cpp; do
  [ -f "$d/tools/perplexity/perplexity.cpp" ] && src=$d
done
if [ -z "$src" ]; then
  (cd "$here" && cargo fetch -q >&2)
  for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-"$sys_version"/llama.cpp; do
    [ -f "$d/tools/perplexity/perplexity.cpp" ] && src=$d
  done
fi
[ -n "$src" ] || { echo "llama-cpp-sys-2 $sys_version sources not found" >&2; exit 2; }
out=${QUANTGATE_LLAMA_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate/llama-perplexity-$sys_version}
bin="$out/bin/llama-perplexity"
if [ ! -x "$bin" ]; then
  echo "building llama-perplexity from $src into $out (a few minutes)" >&2
  cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$out" --target llama-perplexity -j "$(nproc)" >&2
fi
echo "$bin"
