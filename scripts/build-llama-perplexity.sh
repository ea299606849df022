#!/usr/bin/env bash
# Build llama.cpp's own `llama-perplexity` against the very llama.cpp sources the
# pinned llama-cpp-sys-2 crate compiles into quantgate (same commit, same ggml
# flags), so tests can compare quantgate's numbers with the reference tool's.
# Where quantgate's own build is in the cargo target folder (CARGO_TARGET_DIR,
# else target/: the crate's CMake tree of these sources, a Release CPU build,
# GGML_NATIVE off, static libraries), the tool's own files are compiled and
# linked against those very libraries, the object code quantgate runs (seconds);
# else llama.cpp is built again from the same sources (minutes).
#
# The crate ships llama.cpp's library and common/ sources but not tools/, so the
# tool's two files (perplexity.cpp, main.cpp) come from the llama-cpp-python sdist
# on PyPI (pinned version and sha256); nothing of them is kept in this repository.
# With the argument `bench`, builds llama.cpp's `llama-bench` instead (its
# llama-bench.cpp from the same sdist), in the same build tree.
# QUANTGATE_LLAMA_NATIVE=ON builds them with GGML_NATIVE on instead (ggml's
# CPU code for this machine's SIMD: another path through the same arithmetic;
# quantgate's own build, as llama-cpp-sys-2 makes it, has it off), in a build
# folder of its own (`-native`): the `native` runtime of suites/runtimes.toml.
# Prints the binary's path on stdout. Idempotent: a finished build (its stamp
# names the binary's sha256) is reused; concurrent callers build once (flock).
set -euo pipefail
tool=${1:-perplexity}
case "$tool" in perplexity|bench) ;; *) echo "usage: $0 [perplexity|bench]" >&2; exit 2;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
python=${QUANTGATE_PYTHON:-python3}

sys_version=$(grep -A1 '^name = "llama-cpp-sys-2"' "$here/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p')
[ -n "$sys_version" ] || { echo "llama-cpp-sys-2 not found in Cargo.lock" >&2; exit 2; }
find_src() {
  for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-"$sys_version"/llama.cpp; do
    [ -f "$d/CMakeLists.txt" ] && echo "$d" && return 0
  done
  return 1
}
src=$(find_src) || { (cd "$here" && cargo fetch -q >&2); src=$(find_src); } \
  || { echo "llama-cpp-sys-2 $sys_version sources not found" >&2; exit 2; }

native=${QUANTGATE_LLAMA_NATIVE:-OFF}
case "$native" in ON|OFF) ;; *) echo "QUANTGATE_LLAMA_NATIVE: \`$native\` is not ON or OFF" >&2; exit 2;; esac
out=${QUANTGATE_LLAMA_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate/llama-perplexity-$sys_version}
[ "$native" = ON ] && out="$out-native"
bin="$out/build/llama-$tool"
# A finished build leaves a stamp with the binary's sha256: a binary whose
# build was interrupted (or that was changed since) is built again.
stamp="$out/llama-$tool.built"
finished() { [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(sha256sum "$bin" | cut -d' ' -f1)" = "$(cat "$stamp")" ]; }
if finished; then echo "$bin"; exit 0; fi
mkdir -p "$out"
# One build at a time per build directory: tests run two at a time and each
# asks for the tool; a second caller waits here, then uses the first's build.
exec 9>"$out/.build.lock"
if ! flock -n 9; then
  echo "waiting for another build of llama-$tool in $out" >&2
  flock 9
fi
if finished; then echo "$bin"; exit 0; fi
rm -f "$stamp"

if [ ! -f "$out/perplexity.cpp" ] || { [ "$tool" = bench ] && [ ! -f "$out/llama-bench.cpp" ]; }; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  echo "fetching llama-cpp-python==$LCP_VERSION (sdist) for tools/perplexity" >&2
  # pip prepares an sdist's metadata with its build backend; give it one.
  # --target installs into a scratch folder, never the system; PEP 668 need not apply.
  PIP_BREAK_SYSTEM_PACKAGES=1 "$python" -m pip install -q --disable-pip-version-check --target "$tmp/backend" scikit-build-core >&2
  PYTHONPATH="$tmp/backend" "$python" -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary :all: --no-build-isolation -d "$tmp" "llama-cpp-python==$LCP_VERSION" >&2
  sdist="$tmp/llama_cpp_python-$LCP_VERSION.tar.gz"
  echo "$LCP_SHA256  $sdist" | sha256sum -c --quiet - >&2
  member="llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/tools/perplexity"
  bench="llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/tools/llama-bench"
  tar -xzf "$sdist" -C "$tmp" "$member/perplexity.cpp" "$member/main.cpp" "$bench/llama-bench.cpp"
  # A finished llama-perplexity keeps its sources (the same bytes anyway).
  [ -f "$out/perplexity.cpp" ] || cp "$tmp/$member/perplexity.cpp" "$out/perplexity.cpp"
  [ -f "$out/main.cpp" ] || cp "$tmp/$member/main.cpp" "$out/main.cpp"
  cp "$tmp/$bench/llama-bench.cpp" "$out/llama-bench.cpp"
fi

# The vendored llama-bench.cpp defines llama_bench(), not main().
cat > "$out/bench-main.cpp" <<'MAIN'
int llama_bench(int argc, char ** argv);
int main(int argc, char ** argv) { return llama_bench(argc, argv); }
MAIN

# quantgate's own llama.cpp build: the crate's CMake tree of these very sources
# (CMAKE_HOME_DIRECTORY), Release, CPU only, GGML_NATIVE off, static.
linked_tree() {
  local target=${CARGO_TARGET_DIR:-$here/target} c t
  for c in "$target"/release/build/llama-cpp-sys-2-*/out/build/CMakeCache.txt; do
    [ -f "$c" ] || continue
    t=$(dirname "$c")
    grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$c" || continue
    grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$c" || continue
    grep -qx 'GGML_NATIVE:BOOL=OFF' "$c" || continue
    grep -qx 'BUILD_SHARED_LIBS:BOOL=OFF' "$c" || continue
    grep -q '^GGML_\(CUDA\|VULKAN\|METAL\|HIP\|SYCL\|OPENCL\):BOOL=ON' "$c" && continue
    for a in common/libllama-common.a common/libllama-common-base.a src/libllama.a \
      ggml/src/libggml.a ggml/src/libggml-cpu.a ggml/src/libggml-base.a; do
      [ -f "$t/$a" ] || continue 2
    done
    echo "$t"
    return 0
  done
  return 1
}

tree=""
[ "$native" = OFF ] && tree=$(linked_tree) || true
if [ -n "$tree" ]; then
  vendor=""
  for a in "$tree"/vendor/*/lib*.a; do [ -f "$a" ] && vendor="$vendor \"$a\""; done
  cat > "$out/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.14)
project(quantgate_llama_perplexity C CXX)
# Linked against quantgate's own llama.cpp build: $tree
find_package(Threads REQUIRED)
find_package(OpenMP)
find_package(OpenSSL)
add_library(linked INTERFACE)
target_include_directories(linked INTERFACE "$src/include" "$src/common" "$src/ggml/include" "$src/vendor")
target_link_libraries(linked INTERFACE -Wl,--start-group
  "$tree/common/libllama-common.a" "$tree/common/libllama-common-base.a" $vendor
  "$tree/src/libllama.a" "$tree/ggml/src/libggml.a" "$tree/ggml/src/libggml-cpu.a"
  "$tree/ggml/src/libggml-base.a" -Wl,--end-group Threads::Threads \${CMAKE_DL_LIBS})
if(OpenMP_CXX_FOUND)
  target_link_libraries(linked INTERFACE OpenMP::OpenMP_CXX)
endif()
if(OpenSSL_FOUND)
  target_link_libraries(linked INTERFACE OpenSSL::SSL OpenSSL::Crypto)
endif()
set(LLAMA_LINK linked)
CMAKE
  how="linking llama-$tool against quantgate's own llama.cpp build in $tree"
else
  cat > "$out/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.14)
project(quantgate_llama_perplexity C CXX)
set(LLAMA_BUILD_COMMON ON CACHE BOOL "" FORCE)
foreach(opt LLAMA_BUILD_TOOLS LLAMA_BUILD_TESTS LLAMA_BUILD_EXAMPLES LLAMA_BUILD_SERVER LLAMA_CURL BUILD_SHARED_LIBS)
  set(\${opt} OFF CACHE BOOL "" FORCE)
endforeach()
set(GGML_NATIVE $native CACHE BOOL "" FORCE)
add_subdirectory("$src" llama.cpp)
set(LLAMA_LINK llama-common llama)
CMAKE
  how="building llama-$tool against $src (a few minutes)"
fi
cat >> "$out/CMakeLists.txt" <<'CMAKE'
# The same bytes from any build folder (no folder's path in __FILE__), so
# the tool's runs kept under its sha256 (tests/real_engine/llama_perplexity.rs) serve a
# rebuild of it, as CI's fresh tool folder each run.
add_compile_options("-ffile-prefix-map=${CMAKE_CURRENT_SOURCE_DIR}=." "-ffile-prefix-map=${CMAKE_CURRENT_BINARY_DIR}=build")
add_executable(llama-perplexity main.cpp perplexity.cpp)
target_link_libraries(llama-perplexity PRIVATE ${LLAMA_LINK})
target_compile_features(llama-perplexity PRIVATE cxx_std_17)
if(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/llama-bench.cpp")
  add_executable(llama-bench bench-main.cpp llama-bench.cpp)
  target_link_libraries(llama-bench PRIVATE ${LLAMA_LINK})
  target_compile_features(llama-bench PRIVATE cxx_std_17)
endif()
CMAKE
echo "$how" >&2
cmake -S "$out" -B "$out/build" -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$out/build" --target "llama-$tool" -j "$(nproc)" >&2
sha256sum "$bin" | cut -d' ' -f1 > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
echo "$bin"
