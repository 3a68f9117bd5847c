#!/usr/bin/env bash
# vLLM's own KV-offloading unit tests (from the pinned sdist, fixtures/fetch.py --tests, never
# committed) on the pristine installed tree and on a patched copy, compared per test id
# (tests/upstream/run.py, in the real-vLLM venv that scripts/real-venv.sh builds), for the
# release KVTIER_RELEASE names (default: the venv's own). Fails on any difference with the
# tier off, and on one that tests/upstream/knob1-differences-<release>.txt does not explain
# with GLM53_KV_OFFLOAD=1. docs/overlays/kv-offload-scope.md says what runs and why.
#
#   scripts/upstream-tests.sh              the CI selection, knobs unset, 0 and 1
#   scripts/upstream-tests.sh --all        every fetched test file (about 1,540 tests)
#   KVTIER_REAL=0 scripts/upstream-tests.sh   skipped (no real-vLLM venv)
#   KVTIER_BUILD_DIR=DIR                   where patcher/overlay is (default build/)
#
# Exit codes: 0 no unexplained difference, 1 a difference, 2 setup error.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KVTIER_REAL:-1}" = 0 ]; then
  echo "upstream-tests: skipped (KVTIER_REAL=0)"
  exit 0
fi
export KVTIER_BUILD_DIR=${KVTIER_BUILD_DIR:-$PWD/build}
python=$(scripts/real-venv.sh)
exec "$python" tests/upstream/run.py --knobs unset,0,1 "$@"
