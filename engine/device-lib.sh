# shellcheck shell=bash
# Sourced by engine/device-a.sh, device-b.sh and device-tail.sh, from the project root on the
# device machine: which release's sets (DEVICE_DIR; by default .device-<newest pinned
# release>, the folder engine/prepare.sh writes by default), where each set is (carried with
# this call, or stashed in /tmp/pv-<version>/ by device-a.sh on the same warm machine), its
# check against B/sets.sha256, and the setup every suite run shares.
# KVTIER_PV_ROOT replaces /tmp for the stash (tests).

# The newest pinned release, as engine/prepare.sh and scripts/real-venv.sh pick it.
newest_release() {
  find fixtures -mindepth 2 -maxdepth 2 -name WHEEL -printf '%h\n' | xargs -rn1 basename |
    grep '^vllm-' | sort -V | tail -1
}

if [ -z "${DEVICE_DIR:-}" ]; then
  DEVICE_DIR=$(newest_release)
  if [ -z "$DEVICE_DIR" ]; then
    echo "device: no fixtures/vllm-*/WHEEL under $PWD: run from the project root" >&2
    exit 3
  fi
  DEVICE_DIR=.device-${DEVICE_DIR#vllm-}
fi
DEV=${DEVICE_DIR%/}
PV_ROOT=${KVTIER_PV_ROOT:-/tmp}

# pv_dir ENGINE: the stash of one release (a warm machine may hold another release's too).
pv_dir() { echo "$PV_ROOT/pv-${1#vllm-}"; }

# clear_run [ROOT]: what the last suite call left under ROOT (/tmp): the trees, the models'
# site and the stores. KVTIER_KEEP_STORES=1 keeps ROOT/kvstores, for a call that needs a store
# an earlier call wrote on this warm machine (ttft.glm5wide.stall after its .write).
clear_run() {
  local root=${1:-/tmp}
  rm -rf "$root/v" "$root/vp" "$root/site-models"
  [ "${KVTIER_KEEP_STORES:-0}" = 1 ] || rm -rf "$root/kvstores"
  mkdir -p "$root/v"
}

# set_ok SET DIR: DIR holds every file that $B/sets.sha256 lists for SET, with its sha256.
set_ok() {
  local lines
  lines=$(sed -n "s|^\([0-9a-f]\{64\}\)  $1/|\1  |p" "$B/sets.sha256")
  [ -n "$lines" ] && (cd "$2" && sha256sum --check --quiet --status - <<<"$lines")
}

# set_dir SET: the folder holding SET as prepare.sh wrote it, carried with this call
# ($DEV/SET) or stashed ($PV/SET); a line saying what to carry, and status 1, when neither is.
set_dir() {
  local d
  for d in "$DEV/$1" "$PV/$1"; do
    if [ -d "$d" ] && set_ok "$1" "$d"; then
      echo "$d"
      return 0
    fi
  done
  echo "set $1: neither $DEV/$1 (carried with this call) nor $PV/$1 (stashed by" \
    "'bash engine/device-a.sh $1' on this warm machine) holds what $DEV/B/sets.sha256" \
    "lists: make the chain's calls straight after one another (docs/ENGINE.md, 'The GPU" \
    "suite: commands')" >&2
  return 1
}

# needs_models ONLY: whether the suite's selection runs a model stage (suite.plan), which
# needs sets C and C2.
needs_models() {
  python3 - "$1" <<'PY'
import sys

sys.path.insert(0, "engine")
import suite

sys.exit(0 if any(s.models_site for s in suite.plan(sys.argv[1], "", 8)) else 1)
PY
}

# unxz SRC... DST: the xz stream of the SRC files, joined, decompressed into DST.
unxz_to() {
  local dst=${*: -1}
  cat "${@:1:$#-1}" | python3 -c \
    "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), open(sys.argv[1], 'wb'))" \
    "$dst"
}

# setup_trees MODELS: vLLM's compiled ops (unpacked once per warm machine, checked against
# B/ops.sha256), the dependency wheels into /tmp/site, the pristine tree /tmp/v and the
# patched one /tmp/vp; with MODELS=1 the model stages' ops into both trees and their
# transformers into /tmp/site-models (MODELS_SITE). Status 1 with a line on what is missing.
setup_trees() {
  local a a2 w c c2 f k ops_sha so=$PV/_C_stable_libtorch.abi3.so
  # shellcheck disable=SC2034 # read by device-b.sh
  MODELS_SITE=
  mkdir -p "$PV"
  ops_sha=$(cut -c1-64 "$B/ops.sha256") || return 1
  if [ "$(sha256sum "$so" 2>/dev/null | cut -c1-64)" != "$ops_sha" ]; then
    a=$(set_dir A) && a2=$(set_dir A2) || return 1
    unxz_to "$a/so_C.xz.1" "$a2/so_C.xz.2" "$so.tmp" || {
      echo "the compiled ops did not unpack from $a and $a2" >&2
      return 1
    }
    [ "$(sha256sum "$so.tmp" | cut -c1-64)" = "$ops_sha" ] || {
      echo "the compiled ops unpacked from $a and $a2 differ from $B/ops.sha256" >&2
      return 1
    }
    mv "$so.tmp" "$so"
  fi
  w=$(set_dir W) || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$w"/*.whl >/tmp/pip-site.log 2>&1 || {
    tail -5 /tmp/pip-site.log >&2
    echo "set W: the wheels did not install into /tmp/site" >&2
    return 1
  }
  clear_run /tmp
  tar xJf "$B/vtree.tar.xz" -C /tmp/v || return 1
  # vllm.vllm_flash_attn is imported at module level on CUDA (fa_utils); the Triton attention
  # backend never calls it, and the real extension is too big to carry: an empty
  # placeholder module, outside every file we patch or pin.
  echo "# placeholder: no FA kernels on this run" >/tmp/v/vllm/vllm_flash_attn/_vllm_fa2_C.py
  # vLLM 0.34.0's kernel warmup imports the MiniMax-M3 warmup on every CUDA boot, and that
  # module imports the CuTe DSL (nvidia-cutlass-dsl, not carried: no stage uses it). The
  # warmup does nothing for a model without MiniMax-M3's sparse attention, the only case
  # the stand-in allows; it refuses the rest rather than skip a warmup a model needs.
  warmup=/tmp/v/vllm/model_executor/warmup/minimax_m3_msa_warmup.py
  if [ -f "$warmup" ]; then
    cat >"$warmup" <<'PY'
# stand-in (engine/device-lib.sh): the real module imports the CuTe DSL the suite lacks.
def minimax_m3_msa_warmup(worker):
    for module in worker.get_model().modules():
        if type(module).__name__ == "MiniMaxM3SparseAttention":
            raise RuntimeError("MiniMax-M3 needs nvidia-cutlass-dsl, not carried")
PY
  fi
  cp "$so" /tmp/v/vllm/
  # The model stages' ops: _moe_C, FlashKDA/FlashMLA, DeepSelect, deep_gemm and
  # FlashAttention 3 (set F) into the tree; their transformers, tilelang with z3 and
  # ml_dtypes (set K) and a second tvm_ffi into a site of their own (model stages only).
  if [ "${1:-0}" = 1 ]; then
    c=$(set_dir C) && c2=$(set_dir C2) && f=$(set_dir F) && k=$(set_dir K) || return 1
    unxz_to "$c/moe_C.xz" /tmp/v/vllm/_moe_C_stable_libtorch.abi3.so || {
      echo "set C: _moe_C did not unpack" >&2
      return 1
    }
    tar xJf "$c2/ops.tar.xz" -C /tmp/v || {
      echo "set C2: ops.tar.xz did not unpack" >&2
      return 1
    }
    # DeepSeek-V2-Lite's MLA prefill: FA3 is what vLLM picks on SM90 once it loads (the
    # FA2 placeholder above stays: FA2 is never picked on SM90 while FA3 loads).
    unxz_to "$f/fa3_C.xz" /tmp/v/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so || {
      echo "set F: _vllm_fa3_C did not unpack" >&2
      return 1
    }
    # tilelang's libraries find libtvm_ffi and libz3 beside their package
    # (RUNPATH $ORIGIN/../../tvm_ffi/lib, ../../z3/lib): W's apache-tvm-ffi goes here too.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site-models "$c2"/whl/*.whl "$w"/apache_tvm_ffi-*.whl >/tmp/pip-models.log 2>&1 || {
      tail -5 /tmp/pip-models.log >&2
      echo "set C2: the transformers and tvm_ffi wheels did not install into /tmp/site-models" >&2
      return 1
    }
    tar xJf "$k/site.tar.xz" -C /tmp/site-models || {
      echo "set K: site.tar.xz did not unpack" >&2
      return 1
    }
    # shellcheck disable=SC2034 # read by device-b.sh
    MODELS_SITE=/tmp/site-models
  fi
  cp -a /tmp/v /tmp/vp && tar xJf "$B/overlay_files.tar.xz" -C /tmp/vp || return 1
  export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # The overlays' store library (kv_store_format/native.py), packed by engine/prepare.sh.
  export KVTIER_STORE_LIB=$B/lib/libkvtier_store.so
}
