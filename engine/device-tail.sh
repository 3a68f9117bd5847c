#!/usr/bin/env bash
# Device step for the tail check (issue 29), instead of device-b.sh as a chain's last call
# (same carry, same setup: engine/device-lib.sh), then engine/tail.py on llama-big for each
# engine loop (VLLM_ENABLE_V1_MULTIPROCESSING 0 and 1), on the patched tree of
# B/overlay_files.tar.xz and, where B/overlay_files_main.tar.xz is there, on that one too (a
# control: another revision's overlays). TAIL lines come back in $OUT/tail.log.
#   TOKENS=3000 CHUNK=1024 IDLE=10 bash engine/device-tail.sh
set -uo pipefail
T0=$(date +%s)
# shellcheck source=engine/device-lib.sh
. "$(dirname "$0")/device-lib.sh"
B=$(cd "$DEV/B" 2>/dev/null && pwd) || B=$PWD/$DEV/B
if [ ! -f "$B/engine" ] || [ ! -f "$B/sets.sha256" ] || [ ! -f "$B/ops.sha256" ]; then
  echo "no $DEV/B as engine/prepare.sh writes it now: carry it with this call"
  exit 3
fi
ENGINE=$(cat "$B/engine")
PV=$(pv_dir "$ENGINE")
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
setup_trees 0 || exit 3
rm -rf /tmp/vq /tmp/tailstores && mkdir -p /tmp/tailstores
trees=(vp)
if [ -f "$B/overlay_files_main.tar.xz" ]; then
  cp -a /tmp/v /tmp/vq && tar xJf "$B/overlay_files_main.tar.xz" -C /tmp/vq && trees+=(vq)
fi
echo "engine $ENGINE setup $(($(date +%s) - T0)) s"
for tree in "${trees[@]}"; do
  for mp in 0 1; do
    store=/tmp/tailstores/$tree-mp$mp
    echo "== $tree multiprocessing=$mp"
    env PYTHONPATH="/tmp/$tree:/tmp/site" VLLM_ENABLE_V1_MULTIPROCESSING=$mp \
      VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 \
      GLM53_KV_OFFLOAD=1 GLM53_KV_OFFLOAD_DIR="$store" GLM53_KV_OFFLOAD_CPU_GB=1 \
      timeout 300 python3 engine/tail.py --model engine/models/llama-big \
      --tokens "${TOKENS:-3000}" --chunk "${CHUNK:-1024}" --idle "${IDLE:-10}" \
      >"$OUT/$tree-mp$mp.log" 2>&1
    echo "rc=$? $(grep '^TAIL' "$OUT/$tree-mp$mp.log" | sed "s/^TAIL /$tree /")" | tee -a "$OUT/tail.log"
    grep -E "KV store: (writer|the writer)|Traceback|Error" "$OUT/$tree-mp$mp.log" | head -5
  done
done
echo "total $(($(date +%s) - T0)) s"
