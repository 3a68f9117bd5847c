#!/usr/bin/env bash
# The main job on the embedded default: set up (the idempotent setup the test
# command uses, trimmed to what the demo runs), then show the whole system on the pinned vLLM release:
# apply both overlays to a scratch copy, run the pre-stop gate, write a real
# chunk store through the patched worker, verify / corrupt / gc / stat it, and
# revert to the pinned bytes. See scripts/demo.py for the steps.
#
#   scripts/demo.sh [--scratch DIR]     (everything it writes goes under DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$EPOCHREALTIME
# The demo's own setup: the packages, the three binaries and the pinned sources it
# runs; not the test tools, the test binaries or the 9 GB real-vLLM venv
# (scripts/test.sh sets those up).
# Only the release it runs: --engine NAME, --pins fixtures/NAME/PINS, else the newest pinned.
engine=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
  --engine) engine=${args[i + 1]:-} ;;
  --engine=*) engine=${args[i]#--engine=} ;;
  --pins) engine=$(basename "$(dirname "${args[i + 1]:-}")") ;;
  --pins=*) engine=$(basename "$(dirname "${args[i]#--pins=}")") ;;
  esac
done
if [ -z "$engine" ]; then
  engine=$(find fixtures -mindepth 2 -maxdepth 2 -name PINS -printf '%h\n' | xargs -rn1 basename | sort -V | tail -1)
fi
echo "setup: KVTIER_SETUP=demo KVTIER_ENGINES=$engine scripts/setup.sh (installs what is missing, builds the tools, fetches the pinned sources of $engine)"
KVTIER_SETUP=demo KVTIER_ENGINES=$engine scripts/setup.sh
setup_seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
PYTHONDONTWRITEBYTECODE=1 exec "${PYTHON:-python3}" scripts/demo.py \
  --build-dir "${BUILD_DIR:-build}" --setup-seconds "$setup_seconds" "$@"
