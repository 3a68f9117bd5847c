#!/usr/bin/env bash
# Device step 1b (carry .device/C), between device-a.sh and device-b.sh on the same warm
# machine: the model stages' compiled ops to /tmp/pv/C (their transformers wheel, set C2, came
# with device-a.sh); device-b.sh
# unpacks them into both trees. Only the model stages (ONLY=glm5next,...) need it.
set -euo pipefail
mkdir -p /tmp/pv/C
cp -r .device/C/. /tmp/pv/C/
ls -la /tmp/pv/C /tmp/pv/C/whl 2>&1
