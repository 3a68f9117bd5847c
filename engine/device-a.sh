#!/usr/bin/env bash
# Device step 1 (transfer A, carry .device/A): the first part of vLLM's compiled ops to
# /tmp/pv, which lasts while the machine stays warm; step 2 (carry .device/B and .device/A2)
# must follow straight after, and device-b.sh unpacks the ops.
set -euo pipefail
mkdir -p /tmp/pv
cp .device/A/so_C.xz.1 /tmp/pv/
# Set C2 (the model stages' transformers wheel), when carried too: device-b.sh installs it.
if [ -d .device/C2/whl ]; then mkdir -p /tmp/pv/C/whl && cp .device/C2/whl/*.whl /tmp/pv/C/whl/; fi
ls -la /tmp/pv
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "gpus", torch.cuda.device_count())'
