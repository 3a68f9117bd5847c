#!/usr/bin/env bash
# Device step, the last call of a chain (carry .device-<version>/B, and C2 for the model
# stages; engine/transfer.py CHAINS), straight after the device-a.sh calls on the same warm
# machine: checks every set against B/sets.sha256 (carried with this call or stashed by
# device-a.sh), unpacks vLLM's compiled ops from A and A2 (once per warm machine), installs
# the wheels of W into /tmp/site, lays out the pristine tree (/tmp/v) and the patched one
# (/tmp/vp), then runs the suite (engine/suite.py). Everything comes back under $OUT:
# summary.txt, results.json, logs.tgz (every stage's log and JSON, the overlay apply log),
# stores.tgz (the small stores). Exit 3 when a set is missing or not the one prepared.
#   ONLY=llama,lfm2 GPUS=2 TOGETHER=1,2 bash engine/device-b.sh   (a subset; waves 1 and 2 as one)
#   DEVICE_DIR=.device-0.33.0 ONLY=... bash engine/device-b.sh      (another release's sets)
set -uo pipefail
T0=$(date +%s)
# shellcheck source=engine/device-lib.sh
. "$(dirname "$0")/device-lib.sh"
B=$(cd "$DEV/B" 2>/dev/null && pwd) || B=$PWD/$DEV/B
if [ ! -f "$B/engine" ]; then
  echo "no $DEV/B: carry it with this call (DEVICE_DIR picks another release's folder)"
  exit 3
fi
if [ ! -f "$B/sets.sha256" ] || [ ! -f "$B/ops.sha256" ]; then
  echo "$DEV/B has no sets.sha256 or ops.sha256: an older engine/prepare.sh wrote it; prepare again"
  exit 3
fi
ENGINE=$(cat "$B/engine")
PV=$(pv_dir "$ENGINE")
echo "engine $ENGINE (sets $DEV, stash $PV)"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/run"
MODELS=0
if needs_models "${ONLY:-}"; then MODELS=1; fi
setup_trees "$MODELS" || exit 3
"$B/kvstore" --version 2>&1 | head -1
echo "setup $(($(date +%s) - T0)) s"
GPUS=${GPUS:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
python3 engine/suite.py --pristine /tmp/v --patched /tmp/vp --site /tmp/site --models-site "$MODELS_SITE" \
  --kvstore "$B/kvstore" --launcher "$B/launcher" --out "$OUT/run" --gpus "$GPUS" --only "${ONLY:-}" --together "${TOGETHER:-}" \
  --engine "$ENGINE"
rc=$?
cp "$OUT/run/summary.txt" "$OUT/run/results.json" "$OUT/" 2>/dev/null
cp "$B/overlay-apply.log" "$OUT/run/logs/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT/run" logs
tar czf "$OUT/stores.tgz" -C /tmp --exclude='pressure*' --exclude='ttft*' --exclude='burst8b*' --exclude=suite-results.json kvstores 2>/dev/null
rm -rf "$OUT/run"
ls -la "$OUT"
echo "suite rc=$rc total $(($(date +%s) - T0)) s"
exit $rc
