#!/usr/bin/env bash
# The worked example of docs/OVERLAYS.md: set up, then carry the example
# overlays (anchors/example-1.0, overlays/example-*) into a scratch copy of
# the synthetic engine tree fixtures/example: status, plan, apply with the
# compile check, check, revert, and prove the tree pristine byte for byte.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
OVERLAY="$BUILD_DIR/patcher/overlay"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -r fixtures/example "$scratch/tree"

run() {
  echo
  echo "\$ overlay $*"
  "$OVERLAY" --root "$scratch/tree" --engine example "$@"
}
expect_code() {
  local want=$1
  shift
  set +e
  run "$@"
  local got=$?
  set -e
  if [ "$got" -ne "$want" ]; then
    echo "demo: expected exit $want from 'overlay $*', got $got" >&2
    exit 1
  fi
  echo "(exit $got, as expected)"
}

run status
run plan
run apply --check-injected
run check
run status
expect_code 2 revert --overlays example-cache # refused: example-cache-stats stacks on it
run revert --overlays example-cache-stats
run check --overlays example-cache
run revert
run check --expect pristine

echo
if diff -r fixtures/example "$scratch/tree"; then
  echo "demo: pristine: the tree matches fixtures/example byte for byte"
else
  echo "demo: the reverted tree differs from fixtures/example" >&2
  exit 1
fi
