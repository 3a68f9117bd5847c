#!/usr/bin/env bash
# Device step 1 (transfer A, carry .device/A): unpack vLLM's compiled ops to /tmp/pv, which
# lasts while the machine stays warm; step 2 must follow straight after.
set -euo pipefail
mkdir -p /tmp/pv
python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
  .device/A/so_C.xz /tmp/pv/_C_stable_libtorch.abi3.so
ls -la /tmp/pv
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "gpus", torch.cuda.device_count())'
