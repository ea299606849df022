#!/usr/bin/env bash
# fetch-huggingface-hub.sh: `huggingface_hub` (the Hub's own client, which
# reads model cards: ModelCard, metadata_load), pinned, with its
# dependencies, into <cache>/tools/huggingface_hub-<version>; prints the
# folder to put on PYTHONPATH. The test that parses quantgate's model card
# back (tests/cli/publish.rs) runs it.
set -euo pipefail
version=0.36.0
sha=7bcc9ad17d5b3f07b57c78e79d527102d08313caa278a641993acddcb894548d
py=${QUANTGATE_PYTHON:-python3}
cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
dest=$cache/tools/huggingface_hub-$version
if ! PYTHONPATH=$dest "$py" -c 'import huggingface_hub' 2>/dev/null; then
  echo "fetching huggingface_hub $version from PyPI" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$py" -m pip download --quiet --no-deps --dest "$tmp" "huggingface_hub==$version" >&2 \
    || { echo "huggingface_hub: download failed" >&2; exit 1; }
  whl=$tmp/huggingface_hub-$version-py3-none-any.whl
  echo "$sha  $whl" | sha256sum -c --quiet - \
    || { echo "$(basename "$whl"): sha256 mismatch" >&2; exit 1; }
  rm -rf "$dest.tmp.$$"
  "$py" -m pip install --quiet --target "$dest.tmp.$$" "$whl" >&2 \
    || { echo "huggingface_hub: pip install failed" >&2; exit 1; }
  mkdir -p "$(dirname "$dest")"
  rm -rf "$dest"
  mv -T "$dest.tmp.$$" "$dest"
fi
echo "$dest"
