#!/usr/bin/env bash
# Device step 1 (transfer A, carry .device/A): the first part of vLLM's compiled ops to
# /tmp/pv, which lasts while the machine stays warm; step 2 (carry .device/B and .device/A2)
# must follow straight after, and device-b.sh unpacks the ops.
#   DEVICE_DIR=.device-0.32.0 bash engine/device-a.sh   (the sets of ENGINE=vllm-0.32.0 prepare.sh)
set -euo pipefail
DEV=${DEVICE_DIR:-.device}
ENGINE=$(cat "$DEV/A/engine" 2>/dev/null || echo vllm-0.33.0)
# One folder a release: a warm machine may have unpacked another release's ops already.
if [ "$ENGINE" = vllm-0.33.0 ]; then PV=/tmp/pv; else PV=/tmp/pv-${ENGINE#vllm-}; fi
mkdir -p "$PV"
cp "$DEV/A/so_C.xz.1" "$PV/"
echo "$ENGINE" >"$PV/engine"
# Set C2 (the model stages' transformers wheel), when carried too: device-b.sh installs it.
if [ -d "$DEV/C2/whl" ]; then mkdir -p "$PV/C/whl" && cp "$DEV/C2/whl/"*.whl "$PV/C/whl/"; fi
ls -la "$PV"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "gpus", torch.cuda.device_count())'
