#!/usr/bin/env bash
# Build llama-perplexity from the llama.cpp that a llama-cpp-python sdist on
# PyPI vendors (VERSION pinned by SHA256): another llama.cpp commit than the one
# quantgate links, a runtime for `quantgate drift` and drift cases
# (suites/runtimes.toml). Built as llama.cpp builds it, GGML_NATIVE off, static.
#
#   scripts/build-llama-perplexity-sdist.sh VERSION SHA256
#
# Prints the binary's path on stdout. Idempotent: a finished build (its stamp
# names the binary's sha256) is reused; concurrent callers build once (flock).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 VERSION SHA256" >&2; exit 2; }
version=$1
want=$2
python=${QUANTGATE_PYTHON:-python3}
cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
out=$cache/runtimes/llama-perplexity-sdist-$version
bin="$out/build/bin/llama-perplexity"
stamp="$out/llama-perplexity.built"
finished() { [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(sha256sum "$bin" | cut -d' ' -f1)" = "$(cat "$stamp")" ]; }
if finished; then echo "$bin"; exit 0; fi
mkdir -p "$out"
exec 9>"$out/.build.lock"
if ! flock -n 9; then
  echo "waiting for another build of llama-perplexity in $out" >&2
  flock 9
fi
if finished; then echo "$bin"; exit 0; fi
rm -f "$stamp"
if [ ! -f "$out/src/CMakeLists.txt" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  echo "fetching llama-cpp-python==$version (sdist) for its vendored llama.cpp" >&2
  PIP_BREAK_SYSTEM_PACKAGES=1 "$python" -m pip install -q --disable-pip-version-check --target "$tmp/backend" scikit-build-core >&2
  PYTHONPATH="$tmp/backend" "$python" -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary :all: --no-build-isolation -d "$tmp" "llama-cpp-python==$version" >&2
  sdist="$tmp/llama_cpp_python-$version.tar.gz"
  echo "$want  $sdist" | sha256sum -c --quiet - >&2 \
    || { echo "llama-cpp-python $version: sha256 is not $want" >&2; exit 1; }
  tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-$version/vendor/llama.cpp"
  rm -rf "$out/src"
  mv "$tmp/llama_cpp_python-$version/vendor/llama.cpp" "$out/src"
fi
echo "building llama-perplexity of llama-cpp-python $version's llama.cpp (a few minutes)" >&2
cmake -S "$out/src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON >&2
cmake --build "$out/build" --target llama-perplexity -j "$(nproc)" >&2
sha256sum "$bin" | cut -d' ' -f1 > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
echo "$bin"
