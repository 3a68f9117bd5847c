#!/usr/bin/env bash
# Device step 2 (transfer B, carry .device/B and .device/A2), straight after step 1: unpacks
# vLLM's compiled ops from the two parts, installs the wheels into
# /tmp/site, lays out the pristine tree (/tmp/v) and the patched one (/tmp/vp), then runs the
# suite (engine/suite.py). Everything comes back under $OUT: summary.txt, results.json,
# logs.tgz (every stage's log and JSON, the overlay apply log), stores.tgz (the small stores).
#   ONLY=llama,lfm2 GPUS=2 TOGETHER=1,2 bash engine/device-b.sh   (a subset; waves 1 and 2 as one)
#   DEVICE_DIR=.device-0.32.0 ONLY=... bash engine/device-b.sh      (another release's sets)
set -uo pipefail
T0=$(date +%s)
DEV=${DEVICE_DIR:-.device}
B=$PWD/$DEV/B
ENGINE=$(cat "$B/engine" 2>/dev/null || echo vllm-0.33.0)
if [ "$ENGINE" = vllm-0.33.0 ]; then PV=/tmp/pv; else PV=/tmp/pv-${ENGINE#vllm-}; fi
echo "engine $ENGINE (sets $DEV, ops $PV)"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/run"
if [ ! -f "$PV/_C_stable_libtorch.abi3.so" ]; then
  [ -f "$PV/so_C.xz.1" ] || { echo "no $PV: run engine/device-a.sh first (same warm machine, same DEVICE_DIR)"; exit 3; }
  [ -f "$DEV/A2/so_C.xz.2" ] || { echo "no $DEV/A2: carry it with $DEV/B"; exit 3; }
  cat "$PV/so_C.xz.1" "$DEV/A2/so_C.xz.2" | python3 -c \
    "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), open(sys.argv[1], 'wb'))" \
    "$PV/_C_stable_libtorch.abi3.so" || { echo "the compiled ops did not unpack"; exit 3; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/whl/*.whl 2>&1 | tail -3
rm -rf /tmp/v /tmp/vp /tmp/kvstores && mkdir -p /tmp/v
tar xJf "$B/vtree.tar.xz" -C /tmp/v
# vllm.vllm_flash_attn is imported at module level on CUDA (fa_utils); the Triton attention
# backend never calls it, and the real extension (300+ MB) is too big to carry: an empty
# placeholder module, outside every file we patch or pin.
echo "# placeholder: no FA kernels on this run" >/tmp/v/vllm/vllm_flash_attn/_vllm_fa2_C.py
cp "$PV/_C_stable_libtorch.abi3.so" /tmp/v/vllm/
# The model stages' ops (device-c.sh), when they came: _moe_C, FlashKDA/FlashMLA, DeepSelect,
# deep_gemm into the tree; their transformers into a site of its own (model stages only).
MODELS_SITE=
rm -rf /tmp/site-models
if [ -s $PV/C/moe_C.xz ]; then
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    $PV/C/moe_C.xz /tmp/v/vllm/_moe_C_stable_libtorch.abi3.so || echo "set C: _moe_C did not unpack"
  tar xJf $PV/C/ops.tar.xz -C /tmp/v || echo "set C: ops.tar.xz did not unpack"
  if ls $PV/C/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-models \
      $PV/C/whl/*.whl 2>&1 | tail -3
  else
    echo "set C: no transformers wheel (carry .device/C2 with device-a.sh): the image's transformers"
  fi
  MODELS_SITE=/tmp/site-models
fi
cp -a /tmp/v /tmp/vp && tar xJf "$B/overlay_files.tar.xz" -C /tmp/vp
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The overlays' store library (kv_store_format/native.py), packed by engine/prepare.sh.
export KVTIER_STORE_LIB=$B/lib/libkvtier_store.so
"$B/kvstore" --version 2>&1 | head -1
echo "setup $(( $(date +%s) - T0 )) s"
GPUS=${GPUS:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
python3 engine/suite.py --pristine /tmp/v --patched /tmp/vp --site /tmp/site --models-site "$MODELS_SITE" \
  --kvstore "$B/kvstore" --launcher "$B/launcher" --out "$OUT/run" --gpus "$GPUS" --only "${ONLY:-}" --together "${TOGETHER:-}" \
  --engine "$ENGINE"
rc=$?
cp "$OUT/run/summary.txt" "$OUT/run/results.json" "$OUT/" 2>/dev/null
cp "$B/overlay-apply.log" "$OUT/run/logs/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT/run" logs
tar czf "$OUT/stores.tgz" -C /tmp --exclude='pressure*' --exclude='ttft*' --exclude='burst8b*' kvstores 2>/dev/null
rm -rf "$OUT/run"
ls -la "$OUT"
echo "suite rc=$rc total $(( $(date +%s) - T0 )) s"
exit $rc
