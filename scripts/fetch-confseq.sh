#!/usr/bin/env bash
# fetch-confseq.sh: the `confseq` package (Waudby-Smith, Howard, Ramdas et
# al.), the independent oracle of quantgate's sequential decisions, into
# <cache>/tools/confseq-0.0.11; prints the folder to put on PYTHONPATH.
# Only its pure-Python modules are used (not its C++ part, which needs
# Boost): the sdist is fetched and checked against its pinned sha256, and
# NumPy (< 2: confseq 0.0.11 uses np.float_) goes beside it when the Python
# at hand lacks it. scripts/confseq-oracle.py runs it.
set -euo pipefail
version=0.0.11
sha=b4f7723089478dda4b011a0bfe4d449f017d7ce0ec0d5039181c3e4a576bc914
numpy=1.26.4
py=${QUANTGATE_PYTHON:-python3}
cache=${QUANTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantgate}
dest=$cache/tools/confseq-$version
if [[ ! -f $dest/confseq/betting.py ]]; then
  echo "fetching confseq $version (sdist) from PyPI" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The sdist alone (no build): its metadata step would compile C++.
  "$py" - "$tmp" <<'PY' || { echo "confseq: download failed" >&2; exit 1; }
import re, sys, urllib.request
html = urllib.request.urlopen("https://pypi.org/simple/confseq/", timeout=60).read().decode()
url = next(u for u in re.findall(r'href="([^"#]+)', html) if u.endswith("/confseq-0.0.11.tar.gz"))
urllib.request.urlretrieve(url, sys.argv[1] + "/confseq.tar.gz")
PY
  echo "$sha  $tmp/confseq.tar.gz" | sha256sum -c --quiet - \
    || { echo "confseq-$version.tar.gz: sha256 mismatch" >&2; exit 1; }
  tar -xzf "$tmp/confseq.tar.gz" -C "$tmp"
  mkdir -p "$dest.tmp.$$"
  cp -r "$tmp/confseq-$version/src/confseq" "$dest.tmp.$$/confseq"
  mkdir -p "$(dirname "$dest")"
  mv -T "$dest.tmp.$$" "$dest" 2>/dev/null || rm -rf "$dest.tmp.$$"
fi
if ! PYTHONPATH=$dest "$py" -c 'import numpy' 2>/dev/null; then
  echo "installing numpy $numpy beside confseq" >&2
  "$py" -m pip install --quiet --target "$dest" "numpy==$numpy" >&2 \
    || { echo "numpy $numpy: pip install failed" >&2; exit 1; }
fi
echo "$dest"
