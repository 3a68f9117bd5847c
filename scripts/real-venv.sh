#!/usr/bin/env bash
# Builds, once per machine, the virtual environment in which the real-scheduler tests
# (tests/realsched) import the real vLLM 0.33.0: the pinned wheel (sha256-checked against
# fixtures/vllm-0.33.0/WHEEL) installed with all its dependencies, real torch included.
# vLLM's compiled ops are never loaded: on a machine without a GPU the platform resolves to
# "unspecified" and the scheduler path needs no vllm._C.
#
#   scripts/real-venv.sh          build if missing, then print the venv's python path
#   KVTIER_REAL_VENV=DIR          where the venv lives (default ~/.cache/kvtier/venv-vllm-0.33.0)
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
VENV=${KVTIER_REAL_VENV:-$CACHE/venv-vllm-0.33.0}
EXTRA=(pytest)
read -r WHEEL_SHA WHEEL_NAME <fixtures/vllm-0.33.0/WHEEL
WHEEL=$CACHE/wheels/$WHEEL_NAME
STAMP="$VENV/.kvtier-stamp"
want="$WHEEL_SHA ${EXTRA[*]}"

if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.venv-vllm-0.33.0.lock"
flock 9
# Another process may have finished it while we waited for the lock.
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

# The wheel: fetch.py downloads it only when missing or wrong; check it again here
# because the venv is built from it.
"$PYTHON" fixtures/fetch.py --pins fixtures/vllm-0.33.0/PINS >/dev/null
got=$(sha256sum "$WHEEL" | cut -c1-64)
if [ "$got" != "$WHEEL_SHA" ]; then
  echo "real-venv: $WHEEL: sha256 $got does not match fixtures/vllm-0.33.0/WHEEL" >&2
  exit 1
fi

echo "real-venv: building $VENV (vLLM 0.33.0 + torch, about 5.5 GB, a few minutes)" >&2
rm -rf "$VENV"
t0=$(date +%s)
if ! "$PYTHON" -m venv "$VENV" ||
  ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile "$WHEEL" "${EXTRA[@]}" >&2; then
  echo "real-venv: building $VENV failed; removed" >&2
  rm -rf "$VENV"
  exit 3
fi
echo "$want" >"$STAMP"
echo "real-venv: built in $(($(date +%s) - t0)) s, $(du -sh "$VENV" | cut -f1)" >&2
echo "$VENV/bin/python"
