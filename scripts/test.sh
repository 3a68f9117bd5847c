#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs every test: the C++ suites through ctest
# and the Python harness through pytest. Exits non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
PYTHON=${PYTHON:-python3}

status=0
# ASan+UBSan build of the C++ tests run under the sanitizers, then short fuzz
# runs (docs/HARDENING.md). KVTIER_HARDENING=0 skips it.
if [ "${KVTIER_HARDENING:-1}" != 0 ]; then
  FUZZ_SECONDS=${FUZZ_SECONDS:-10} scripts/hardening.sh || status=1
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" || status=1
if [ -d tests/python ] && compgen -G "tests/python/test_*.py" >/dev/null; then
  KVTIER_BUILD_DIR="$PWD/$BUILD_DIR" "$PYTHON" -m pytest -q tests/python || status=1
fi
# The real-scheduler tier (tests/realsched): the real vLLM 0.33.0 scheduler side, in the venv
# that setup built (scripts/real-venv.sh prints its python). KVTIER_REAL=0 skips it.
if [ "${KVTIER_REAL:-1}" != 0 ]; then
  KVTIER_BUILD_DIR="$PWD/$BUILD_DIR" "$(scripts/real-venv.sh)" -m pytest -q tests/realsched ||
    status=1
fi
KVTIER_BUILD_DIR="$PWD/$BUILD_DIR" scripts/upstream-tests.sh || status=1 # vLLM's own tests, both trees
exit $status
