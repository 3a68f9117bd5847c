#!/usr/bin/env bash
# Device step 2 for the tail check (issue 29), instead of device-b.sh: same transfer (carry
# .device/B and .device/A2, straight after device-a.sh), same setup, then engine/tail.py on
# llama-big for each engine loop (VLLM_ENABLE_V1_MULTIPROCESSING 0 and 1), on the patched
# tree of .device/B/overlay_files.tar.xz and, where .device/B/overlay_files_main.tar.xz is
# there, on that one too (a control: another revision's overlays). TAIL lines come back in
# $OUT/tail.log.
#   TOKENS=3000 CHUNK=1024 IDLE=10 bash engine/device-tail.sh
set -uo pipefail
T0=$(date +%s)
B=$PWD/.device/B
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ ! -f /tmp/pv/_C_stable_libtorch.abi3.so ]; then
  [ -f /tmp/pv/so_C.xz.1 ] || { echo "no /tmp/pv: run engine/device-a.sh first"; exit 3; }
  cat /tmp/pv/so_C.xz.1 .device/A2/so_C.xz.2 | python3 -c \
    "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), open(sys.argv[1], 'wb'))" \
    /tmp/pv/_C_stable_libtorch.abi3.so || { echo "the compiled ops did not unpack"; exit 3; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$B"/whl/*.whl 2>&1 | tail -3
rm -rf /tmp/v /tmp/vp /tmp/vq /tmp/tailstores && mkdir -p /tmp/v /tmp/tailstores
tar xJf "$B/vtree.tar.xz" -C /tmp/v
echo "# placeholder: no FA kernels on this run" >/tmp/v/vllm/vllm_flash_attn/_vllm_fa2_C.py
cp /tmp/pv/_C_stable_libtorch.abi3.so /tmp/v/vllm/
cp -a /tmp/v /tmp/vp && tar xJf "$B/overlay_files.tar.xz" -C /tmp/vp
trees=(vp)
if [ -f "$B/overlay_files_main.tar.xz" ]; then
  cp -a /tmp/v /tmp/vq && tar xJf "$B/overlay_files_main.tar.xz" -C /tmp/vq && trees+=(vq)
fi
echo "setup $(( $(date +%s) - T0 )) s"
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
echo "total $(( $(date +%s) - T0 )) s"
