#!/usr/bin/env bash
# Builds, once per machine, the virtual environment in which the real-vLLM tier
# (tests/realsched, tests/upstream) imports the real vLLM: the newest pinned release's wheel
# (sha256-checked against fixtures/<release>/WHEEL) installed with all its dependencies, real
# torch included. Every other pinned release runs in the same venv from its own package tree
# (fixtures/fetch.py --package: the wheel's Python files and dist-info, first on the path;
# tests/realsched/release.py), so one venv serves both releases CI runs.
# vLLM's compiled ops are never loaded: on a machine without a GPU the platform resolves to
# "unspecified" and the scheduler path needs no vllm._C.
#
#   scripts/real-venv.sh          build if missing, then print the venv's python path
#   KVTIER_REAL_VENV=DIR          where the venv lives (default ~/.cache/kvtier/venv-<release>)
#
# Idempotent: a finished venv carries a stamp naming the wheel's sha256 and the extra
# requirements; with a matching stamp nothing is done. A half-built venv (no stamp) is
# removed and built again. About 9 GB and 4-7 minutes on a 2-core machine, mostly download
# and unpacking: --no-compile leaves byte-compiling to the first import (the tests import a
# small part of torch and vLLM), which saves CPU while scripts/test.sh builds C++ beside it.
# Exit codes: 0 ok, 1 wheel sha256 mismatch, 3 build failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kvtier
RELEASE=$(find fixtures -mindepth 2 -maxdepth 2 -name WHEEL -printf '%h\n' | xargs -rn1 basename | grep '^vllm-' | sort -V | tail -1)
VENV=${KVTIER_REAL_VENV:-$CACHE/venv-$RELEASE}
EXTRA=(pytest)
read -r WHEEL_SHA WHEEL_NAME <"fixtures/$RELEASE/WHEEL"
WHEEL=$CACHE/wheels/$WHEEL_NAME
STAMP="$VENV/.kvtier-stamp"
want="$WHEEL_SHA ${EXTRA[*]}"

# The other pinned releases' package trees (seconds, from their cached wheels).
packages() {
  local pins
  for pins in fixtures/vllm-*/PINS; do
    [ "$(basename "$(dirname "$pins")")" = "$RELEASE" ] && continue
    "$PYTHON" fixtures/fetch.py --pins "$pins" --package >/dev/null
  done
}

if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  packages
  echo "$VENV/bin/python"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.venv-$RELEASE.lock"
flock 9
# Another process may have finished it while we waited for the lock.
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  packages
  echo "$VENV/bin/python"
  exit 0
fi

# The wheel: fetch.py downloads it only when missing or wrong; check it again here
# because the venv is built from it.
"$PYTHON" fixtures/fetch.py --pins "fixtures/$RELEASE/PINS" >/dev/null
got=$(sha256sum "$WHEEL" | cut -c1-64)
if [ "$got" != "$WHEEL_SHA" ]; then
  echo "real-venv: $WHEEL: sha256 $got does not match fixtures/$RELEASE/WHEEL" >&2
  exit 1
fi

# The wheel's own requirements (no extras), but for GPU-only packages the CPU tier never
# imports: vLLM 0.34.0 pins flashinfer-python==0.7.3, which the index does not serve.
GPU_ONLY="flashinfer-python"
requirements() {
  "$PYTHON" - "$WHEEL" "$GPU_ONLY" <<'PY'
import re, sys, zipfile
wheel, skip = sys.argv[1], set(sys.argv[2].split())
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist: ") or "extra ==" in line:
            continue
        req = line.removeprefix("Requires-Dist: ")
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")
        if name not in skip:
            print(req)
PY
}

echo "real-venv: building $VENV ($RELEASE + torch, about 9 GB, a few minutes)" >&2
rm -rf "$VENV"
t0=$(date +%s)
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
if ! requirements >"$reqs" || ! "$PYTHON" -m venv "$VENV" ||
  ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile -r "$reqs" "${EXTRA[@]}" >&2 ||
  ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile --no-deps "$WHEEL" >&2; then
  echo "real-venv: building $VENV failed; removed" >&2
  rm -rf "$VENV"
  exit 3
fi
echo "$want" >"$STAMP"
packages
echo "real-venv: built in $(($(date +%s) - t0)) s, $(du -sh "$VENV" | cut -f1)" >&2
echo "$VENV/bin/python"
