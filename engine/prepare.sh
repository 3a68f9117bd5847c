#!/usr/bin/env bash
# Prepares, on this machine, everything the GPU suite needs on the device machine (torch and
# CUDA, no vLLM, no network), as sets that a chain of device calls carries, each call under
# the 64 MiB it takes with the checkout (engine/transfer.py declares each set's cap and which
# call carries which; its check ends this script). Into .device-<version>/ (git-ignored),
# one folder a release:
#   A   vLLM's compiled ops (vllm/_C_stable_libtorch.abi3.so, xz), the first 40,000,000 bytes
#   A2  the rest of them
#   W   the dependency wheels the device image lacks (engine/wheels.txt; Python 3.12, no deps)
#   B   the vLLM .py tree with its dist-info, the files the overlays patch or add (from a real
#       `overlay apply`), a release `kvstore` and the portable libkvtier_store.so with the
#       shared libraries they need, the launcher the knob-1 stages plan with (docker/,
#       anchors/, the knob module), ops.sha256 (the unpacked ops) and sets.sha256 (every
#       file of the other sets: the device scripts check them before use)
#   C   the model stages' MoE ops (_moe_C, xz; engine/suite_models.py)
#   C2  their other ops (_flashkda_C, _flashmla_C(+_extension), _deepselect_C and the
#       vendored deep_gemm, one tar.xz) and the transformers wheel with their config classes
#   F   FlashAttention 3 (vllm_flash_attn/_vllm_fa3_C.abi3.so, xz): DeepSeek-V2-Lite's MLA
#       prefill (on SM90 vLLM has no other MLA prefill backend)
#   K   GLM-5.3's mHC kernels: tilelang, z3's library, ml_dtypes (engine/kernels.txt,
#       sha256-checked), installed here into one site tree, site.tar.xz
# Every set holds a file `engine` naming the release. The suite's own code and the model
# configs (engine/) travel with the working tree.
# Needs scripts/setup.sh done (the pinned wheel in the cache, sha256-checked here again).
#
#   engine/prepare.sh                     the newest pinned release (fixtures/vllm-*/WHEEL,
#                                         as scripts/demo.sh picks it), into .device-<version>/
#   ENGINE=vllm-0.33.0 engine/prepare.sh  another pinned release, into .device-0.33.0/
#                                         (DEVICE_DIR=.device-0.33.0 on the device side)
# About 2 minutes the first time for a wheel (mostly xz); the parts cut from the wheel are
# kept while its sha256 is the same.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kvtier
# The newest pinned release unless ENGINE names another (as scripts/demo.sh and
# scripts/real-venv.sh pick it; engine/device-lib.sh picks the same on the device).
NEWEST=$(find fixtures -mindepth 2 -maxdepth 2 -name WHEEL -printf '%h\n' | xargs -rn1 basename |
  grep '^vllm-' | sort -V | tail -1)
ENGINE=${ENGINE:-$NEWEST}
if [ -z "$ENGINE" ] || [ ! -f "fixtures/$ENGINE/WHEEL" ] || [ ! -f "anchors/$ENGINE/ORDER" ]; then
  echo "prepare: ENGINE=$ENGINE: no fixtures/$ENGINE/WHEEL or anchors/$ENGINE/ORDER" >&2
  exit 2
fi
read -r WHEEL_SHA WHEEL_NAME <"fixtures/$ENGINE/WHEEL"
WHEEL=$CACHE/wheels/$WHEEL_NAME
BUILD=${BUILD:-build-engine}
# One folder a release (a .device/ of an older prepare.sh is no longer read).
OUT=$ROOT/.device-${ENGINE#vllm-}
[ "$(sha256sum "$WHEEL" | cut -c1-64)" = "$WHEEL_SHA" ] || {
  echo "prepare: $WHEEL missing or its sha256 differs from fixtures/$ENGINE/WHEEL" >&2
  exit 1
}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# The parts cut from the wheel (A, A2, B/vtree.tar.xz, C, C2/ops.tar.xz) are kept while the
# wheel is the same (they take minutes of xz); everything else is made again on every run.
if [ "$(cat "$OUT/wheel.sha256" 2>/dev/null)" != "$WHEEL_SHA" ]; then
  rm -rf "$OUT"
fi
mkdir -p "$OUT/B"
find "$OUT" -mindepth 1 -maxdepth 1 ! -name A ! -name A2 ! -name B ! -name C ! -name C2 \
  ! -name F ! -name K ! -name wheel.sha256 -exec rm -rf {} +
find "$OUT/B" -mindepth 1 -maxdepth 1 ! -name vtree.tar.xz -exec rm -rf {} +
rm -rf "$OUT/C2/whl"
mkdir -p "$W/tree" "$W/whl" "$OUT/B/lib" "$OUT/W"

# Release build of the two tools from the committed state REV (default HEAD), in its own
# folder: other people's half-finished edits in the working tree never reach the device.
REV=${REV:-HEAD}
rev=$(git rev-parse "$REV")
SRC=$BUILD/src
# Tools, overlay files and the writer they verify all come from one revision (a kvstore
# older than the writer reports the writer's newer folders as foreign: seen on the H200).
if [ "$(cat "$BUILD/rev" 2>/dev/null)" != "$rev" ]; then
  rm -rf "$SRC" && mkdir -p "$SRC"
  git archive "$rev" | tar -x -C "$SRC"
  echo "$rev" >"$BUILD/rev"
fi
if [ ! -f "$BUILD/out/build.ninja" ]; then
  cmake -S "$SRC" -B "$BUILD/out" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD/out" -j2 --target overlay kvstore >/dev/null
KVSTORE=$(find "$BUILD/out" -type f -name kvstore -perm -u+x | head -1)
OVERLAY=$BUILD/out/patcher/overlay
cp "$KVSTORE" "$OUT/B/kvstore"
# The image has its own libstdc++; carry only the libraries it may lack.
ldd "$KVSTORE" | awk '/=> \// {print $3}' | grep -E 'libfmt|libisal|libcrypto' | xargs -r -I{} cp -L {} "$OUT/B/lib/"
# The store library the overlays load (kv_store_format/native.py; device-b.sh points
# KVTIER_STORE_LIB at it), built portable as for the image: static libstdc++/libgcc, so
# only glibc, ISA-L and libcrypto (keyed stores; found beside it through its $ORIGIN
# RPATH) come from outside.
if [ ! -f "$BUILD/portable/build.ninja" ]; then
  cmake -S "$SRC" -B "$BUILD/portable" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_PORTABLE=ON >/dev/null
fi
cmake --build "$BUILD/portable" -j2 --target kvtier_store >/dev/null
cp "$BUILD/portable/storeio/libkvtier_store.so" "$OUT/B/lib/"
# (Its RUNPATH is $ORIGIN: an ISA-L already copied above resolves to that copy.)
ldd "$OUT/B/lib/libkvtier_store.so" | awk '/=> \// {print $3}' | grep -E 'libisal|libcrypto' |
  { grep -v "^$OUT/B/lib/" || true; } | xargs -r -I{} cp -L {} "$OUT/B/lib/"
! ldd "$OUT/B/lib/libkvtier_store.so" | grep -qE 'libstdc\+\+|not found' || {
  echo "prepare: libkvtier_store.so is not portable: $(ldd "$OUT/B/lib/libkvtier_store.so" | tr -s ' \t\n' ' ')" >&2
  exit 1
}

# 1. The .py tree: no compiled files except in set A; third_party's .py files and the
#    dist-info are needed (platform detection reads version("vllm")).
unzip -q -o "$WHEEL" -x 'vllm/third_party/*' '*.so' 'vllm/vllm-rs' -d "$W/tree"
unzip -q -o "$WHEEL" 'vllm/third_party/*.py' -d "$W/tree"
if [ ! -s "$OUT/B/vtree.tar.xz" ] || [ ! -s "$OUT/A/so_C.xz.1" ] || [ ! -s "$OUT/A2/so_C.xz.2" ]; then
  (cd "$W/tree" && tar cf - vllm "$ENGINE.dist-info" | xz -T0 -6 >"$OUT/B/vtree.tar.xz.tmp")
  # 2. The compiled ops (stable-ABI libtorch extension; 0.34.0: 59.0 MB after xz, 0.33.0:
  #    63.7 MB): with the checkout over what one call takes, so the first OPS_CUT bytes are
  #    set A and the rest set A2.
  cut=$(python3 engine/transfer.py cut)
  unzip -p "$WHEEL" vllm/_C_stable_libtorch.abi3.so | xz -T0 -6 >"$W/so_C.xz"
  rm -rf "$OUT/A" "$OUT/A2" && mkdir -p "$OUT/A" "$OUT/A2"
  head -c "$cut" "$W/so_C.xz" >"$OUT/A/so_C.xz.1"
  tail -c +$((cut + 1)) "$W/so_C.xz" >"$OUT/A2/so_C.xz.2"
  cat "$OUT/A/so_C.xz.1" "$OUT/A2/so_C.xz.2" | cmp - "$W/so_C.xz"
  mv "$OUT/B/vtree.tar.xz.tmp" "$OUT/B/vtree.tar.xz"
  echo "$WHEEL_SHA" >"$OUT/wheel.sha256"
fi
# What the device unpacks from A and A2 must be (engine/device-lib.sh checks it).
ops_sha=$(unzip -p "$WHEEL" vllm/_C_stable_libtorch.abi3.so | sha256sum | cut -c1-64)
echo "$ops_sha  _C_stable_libtorch.abi3.so" >"$OUT/B/ops.sha256"

# 3. The overlays applied to a copy with the real tool; every file they change or add travels.
cp -a "$W/tree" "$W/ptree"
# The overlays of ORDER (same committed state) that patch the wheel's .py tree, in ORDER's
# order: vllm-fs-durable builds a C extension from csrc/, which the wheel's tree lacks.
mkdir -p "$W/ov" && git archive "$rev" anchors overlays | tar -x -C "$W/ov"
M=$W/ov/anchors/$ENGINE
PY_OVERLAYS=" kv-offload-scope kv-offload-store-local kv-offload-restore "
# (an if, not `[[ ]] &&`: a non-.py overlay last in ORDER made the loop's status 1 and set -e
# ended the script, silently, once vllm-fs-durable was added last)
order=$(grep -v '^#' "$M/ORDER" | while read -r o; do
  if [[ $PY_OVERLAYS == *" $o "* ]]; then printf '%s,' "$o"; fi; done)
echo "overlays ${order%,}; anchors and tools from $rev" >"$W/apply.log"
"$OVERLAY" apply --root "$W/ptree" --overlays "${order%,}" \
  --manifests "$M" --fragments "$W/ov/overlays" --check-injected >>"$W/apply.log"
"$OVERLAY" status --root "$W/ptree" --manifests "$M" --fragments "$W/ov/overlays" >>"$W/apply.log"
cp "$W/apply.log" "$OUT/B/overlay-apply.log"
(cd "$W/ptree" && { diff -rq "$W/tree/vllm" vllm 2>&1 || true; } | sed -n 's/^Files .* and \(.*\) differ$/\1/p; s/^Only in \(vllm[^:]*\): \(.*\)$/\1\/\2/p' \
  >"$W/changed.txt" && cat "$W/changed.txt" >>"$OUT/B/overlay-apply.log" &&
  tar cJf "$OUT/B/overlay_files.tar.xz" -T "$W/changed.txt")

# 4. The wheels the device image lacks (Python 3.12, no deps; see engine/wheels.txt).
plat=()
for p in manylinux_2_{17,24,26,27,28,31,34,35}_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
grep -v '^#' engine/wheels.txt | xargs python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${plat[@]}" -d "$W/whl"
cp "$W/whl"/*.whl "$OUT/W/"

# 5. The launcher the knob-1 stages plan with (engine/suite.py --launcher: docker/launch.sh,
#    the anchors' ORDER, the knob module), from the same revision as the overlays, so a stage
#    boots with exactly the connector JSON that revision's launch.sh writes.
rm -rf "$OUT/B/launcher" && mkdir -p "$OUT/B/launcher"
git archive "$rev" docker anchors overlays/kv-offload-scope VERSION | tar -x -C "$OUT/B/launcher"

# 6. Set C and C2 (the model stages' ops), kept while the wheel is the same; the model
#    stages' transformers (the image's may predate Glm5NextTextConfig; device-lib.sh installs
#    it apart, for the model stages only): the version both pinned releases accept.
if [ ! -s "$OUT/C/moe_C.xz" ] || [ ! -s "$OUT/C2/ops.tar.xz" ]; then
  rm -rf "$OUT/C" "$OUT/C2" && mkdir -p "$OUT/C" "$OUT/C2" "$W/ops"
  unzip -p "$WHEEL" vllm/_moe_C_stable_libtorch.abi3.so | xz -T0 -6 >"$OUT/C/moe_C.xz.tmp"
  unzip -q -o "$WHEEL" 'vllm/third_party/deep_gemm/*' vllm/_flashkda_C.abi3.so vllm/_flashmla_C.abi3.so \
    vllm/_flashmla_extension_C.abi3.so vllm/_deepselect_C.abi3.so -d "$W/ops"
  (cd "$W/ops" && tar cf - vllm | xz -T0 -6 >"$OUT/C2/ops.tar.xz.tmp")
  mv "$OUT/C/moe_C.xz.tmp" "$OUT/C/moe_C.xz"
  mv "$OUT/C2/ops.tar.xz.tmp" "$OUT/C2/ops.tar.xz"
fi
mkdir -p "$OUT/C2/whl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$OUT/C2/whl" "transformers==5.20.2"

# 7. Set F (the model stages' FlashAttention 3), kept while the wheel is the same. Its
#    stable-ABI torch symbols are _C's and FlashMLA's plus aoti_torch_aten_fill__Scalar.
if [ ! -s "$OUT/F/fa3_C.xz" ]; then
  rm -rf "$OUT/F" && mkdir -p "$OUT/F"
  unzip -p "$WHEEL" vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so | xz -T0 -6 >"$OUT/F/fa3_C.xz.tmp"
  mv "$OUT/F/fa3_C.xz.tmp" "$OUT/F/fa3_C.xz"
fi
# 8. Set K: the wheels of engine/kernels.txt (cached, each refused unless its sha256 is the
#    listed one), installed by pip into one site tree as the device would (--target), then
#    tar.xz: 35 MB against 80 MB of wheels. Two cuts, both in z3-solver: its z3 command-line
#    binary (22 MB; tilelang links the library only) and the second copy of libz3 a zip
#    cannot hold as a link. Kept while kernels.txt is the same.
KWHL=$CACHE/kernel-wheels
if ! cmp -s engine/kernels.txt "$OUT/K/kernels.txt" || [ ! -s "$OUT/K/site.tar.xz" ]; then
  rm -rf "$OUT/K" && mkdir -p "$OUT/K" "$KWHL" "$W/ksite"
  kwheels=()
  while read -r req sha; do
    [ -z "$req" ] || [[ $req == \#* ]] && continue
    name=${req%%==*} && ver=${req#*==}
    f=$(find "$KWHL" -maxdepth 1 -iname "${name//-/_}-$ver-*.whl" | head -1)
    if [ -z "$f" ] || [ "$(sha256sum "$f" | cut -c1-64)" != "$sha" ]; then
      rm -f "$f"
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${plat[@]}" -d "$KWHL" "$req"
      f=$(find "$KWHL" -maxdepth 1 -iname "${name//-/_}-$ver-*.whl" | head -1)
    fi
    if [ -z "$f" ] || [ "$(sha256sum "$f" | cut -c1-64)" != "$sha" ]; then
      echo "prepare: $req: the wheel's sha256 is not engine/kernels.txt's $sha" >&2
      exit 1
    fi
    kwheels+=("$f")
  done <engine/kernels.txt
  python3 -m pip install -q --no-deps --no-index --no-compile --only-binary=:all: \
    --python-version 3.12 --implementation cp "${plat[@]}" --target "$W/ksite" "${kwheels[@]}"
  rm -rf "$W/ksite/bin"
  z3lib=$W/ksite/z3/lib
  if cmp -s "$z3lib/libz3.so" "$z3lib/libz3.so.4.15"; then ln -sf libz3.so.4.15 "$z3lib/libz3.so"; fi
  (cd "$W/ksite" && tar cf - . | xz -T0 -6 >"$OUT/K/site.tar.xz.tmp")
  mv "$OUT/K/site.tar.xz.tmp" "$OUT/K/site.tar.xz"
  cp engine/kernels.txt "$OUT/K/kernels.txt"
fi

# Which release every set is: device-a.sh stashes its sets in /tmp/pv-<version>, device-b.sh
# hands it to the suite (--engine), so a warm machine never mixes two releases' sets.
for s in A A2 W B C C2 F K; do echo "$ENGINE" >"$OUT/$s/engine"; done
# Every file of the sets B does not hold, which device-lib.sh checks before it uses them
# (carried with its call or stashed by an earlier one).
(cd "$OUT" && find A A2 W C C2 F K -type f -print0 | sort -z | xargs -0 sha256sum) >"$OUT/B/sets.sha256"
# Every set against its cap and every call of every chain, with the checkout, against what
# one call takes less the margin for the checkout to grow; exit 1 naming the set to split.
python3 engine/transfer.py check "$OUT"
python3 engine/transfer.py calls "${OUT#"$ROOT"/}"
