#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs every test: the C++ suites through ctest
# (plain and under the sanitizers) and the Python harness through pytest. Exits
# non-zero if any test fails. Prints each stage's wall time as it ends and all of
# them at the end.
#
# The real-vLLM venv (scripts/real-venv.sh, the tests/realsched tier and the gloo
# test) is built in the background while the C++ stages run: it is mostly download
# and unpacking, they are compile and test. pytest waits for it. tests/python runs
# in parallel (pytest-xdist, -n auto; one test file per worker, so a file's
# module fixtures are built once). PYTEST_WORKERS=0 runs it serially.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
PYTHON=${PYTHON:-python3}
T0=$EPOCHREALTIME

status=0
times=()
seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# stage NAME COMMAND...: runs it, prints and records its wall time and result.
stage() {
  local name=$1 t=$EPOCHREALTIME rc=0 line
  shift
  echo "== $name"
  "$@" || rc=$?
  line=$(printf '%-12s %7s s  %s' "$name" "$(seconds_since "$t")" "$( ((rc)) && echo "FAILED (exit $rc)" || echo ok)")
  times+=("$line")
  echo "== $line"
  ((rc == 0)) || status=1
}
report() {
  echo "== stage times"
  printf '  %s\n' "${times[@]}"
  printf '  %-12s %7s s\n' total "$(seconds_since "$T0")"
}

stage setup env KVTIER_REAL=0 scripts/setup.sh
((status == 0)) || {
  report
  exit 1
}

venv_pid=""
venv_log=$BUILD_DIR/real-venv.log
if [ "${KVTIER_REAL:-1}" != 0 ]; then
  PYTHON="$PYTHON" scripts/real-venv.sh >"$venv_log" 2>&1 &
  venv_pid=$!
fi

# ASan+UBSan build of the C++ tests run under the sanitizers, then short fuzz
# runs (docs/HARDENING.md). KVTIER_HARDENING=0 skips it.
if [ "${KVTIER_HARDENING:-1}" != 0 ]; then
  stage hardening env FUZZ_SECONDS="${FUZZ_SECONDS:-10}" scripts/hardening.sh
fi
stage ctest ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"

real_python=""
if [ -n "$venv_pid" ]; then
  stage venv-wait wait "$venv_pid"
  sed 's/^/  /' "$venv_log"
  real_python=$(tail -n 1 "$venv_log")
  [ -x "$real_python" ] || real_python=""
fi

# Test files are in tests/python and its subfolders (tests/python/README.md).
if [ -d tests/python ] && [ -n "$(find tests/python -name 'test_*.py' -print -quit)" ]; then
  parallel=(-n "${PYTEST_WORKERS:-auto}" --dist loadfile)
  if [ "${PYTEST_WORKERS:-auto}" = 0 ] || ! "$PYTHON" -c "import xdist" 2>/dev/null; then
    parallel=()
  fi
  stage pytest env KVTIER_BUILD_DIR="$PWD/$BUILD_DIR" ${real_python:+KVTIER_REAL_PYTHON="$real_python"} \
    "$PYTHON" -m pytest -q "${parallel[@]}" --durations=30 tests/python
fi
# The real-vLLM tier, once per pinned release (newest first): the real scheduler side
# (tests/realsched) and vLLM's own offloading tests on the pristine and the patched tree
# (tests/upstream), in the venv built above; a release other than the venv's runs from its
# package tree (tests/real_release.py). KVTIER_REAL=0 skips it.
releases=$(find fixtures -mindepth 2 -maxdepth 2 -name PINS -printf '%h\n' | xargs -rn1 basename | grep '^vllm-' | sort -Vr)
if [ "${KVTIER_REAL:-1}" != 0 ]; then
  # One release at a time: a release's realsched already keeps both cores busy
  # (side by side, at c66710e, each took twice as long).
  for release in $releases; do
    if [ -n "$real_python" ]; then
      stage "realsched-${release#vllm-}" env KVTIER_RELEASE="$release" KVTIER_BUILD_DIR="$PWD/$BUILD_DIR" \
        "$real_python" -m pytest -q tests/realsched
    else
      stage "realsched-${release#vllm-}" false # the venv build failed: its log is above
    fi
  done
  # The upstream runner shards over every core itself: one release at a time.
  for release in $releases; do
    stage "upstream-${release#vllm-}" env KVTIER_RELEASE="$release" KVTIER_BUILD_DIR="$PWD/$BUILD_DIR" \
      scripts/upstream-tests.sh
  done
fi
report
exit $status
