#!/usr/bin/env bash
# The main job on the embedded default: set up (the same idempotent setup the
# test command uses), then show the whole system on the pinned vLLM release:
# apply both overlays to a scratch copy, run the pre-stop gate, write a real
# chunk store through the patched worker, verify / corrupt / gc / stat it, and
# revert to the pinned bytes. See scripts/demo.py for the steps.
#
#   scripts/demo.sh [--scratch DIR]     (everything it writes goes under DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$EPOCHREALTIME
echo "setup: scripts/setup.sh (installs what is missing, builds, fetches the pinned sources)"
scripts/setup.sh
setup_seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
PYTHONDONTWRITEBYTECODE=1 exec "${PYTHON:-python3}" scripts/demo.py \
  --build-dir "${BUILD_DIR:-build}" --setup-seconds "$setup_seconds" "$@"
