#!/usr/bin/env bash
# Device step for every call of a chain but its last (engine/transfer.py CHAINS; the calls in
# docs/ENGINE.md, "The GPU suite: commands"): copies the sets carried with this call to
# /tmp/pv-<version>/<set>/, which lasts while the machine stays warm (30 s between calls);
# engine/device-b.sh, the chain's last call, checks them against its B/sets.sha256 and
# uses them. Exit 3 when a named set was not carried or is another release's.
#   bash engine/device-a.sh A        carry [".device-0.34.0/A"]   (the newest release)
#   bash engine/device-a.sh A2       carry [".device-0.34.0/A2"]
#   DEVICE_DIR=.device-0.33.0 bash engine/device-a.sh A   (another release's sets)
set -euo pipefail
# shellcheck source=engine/device-lib.sh
. "$(dirname "$0")/device-lib.sh"
if [ $# -eq 0 ]; then
  echo "usage: bash engine/device-a.sh SET... (the sets of $DEV carried with this call)" >&2
  exit 2
fi
ENGINE=
for s in "$@"; do
  if [ ! -f "$DEV/$s/engine" ]; then
    echo "device-a: no $DEV/$s/engine: carry $DEV/$s with this call" >&2
    exit 3
  fi
  e=$(cat "$DEV/$s/engine")
  if [ -n "$ENGINE" ] && [ "$e" != "$ENGINE" ]; then
    echo "device-a: $DEV/$s holds $e's set, $DEV/$1 $ENGINE's: prepare them again" >&2
    exit 3
  fi
  ENGINE=$e
done
PV=$(pv_dir "$ENGINE")
mkdir -p "$PV"
for s in "$@"; do
  rm -rf "${PV:?}/$s" && cp -a "$DEV/$s" "$PV/$s"
done
echo "$ENGINE" >"$PV/engine"
echo "engine $ENGINE: stashed $* in $PV"
du -sh "$PV"/*/
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "gpus", torch.cuda.device_count())' ||
  true
# The host's cores: whether our threads can share a physical core with the engine's (issue 47).
lscpu 2>/dev/null | grep -E '^(Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|L3 cache):' || true
