#!/usr/bin/env bash
# Prepares, on this machine, everything the GPU suite needs on the device machine (which has
# torch and CUDA but no vLLM and no network), as two transfers of under 64 MiB each:
#   .device/A  vLLM's compiled ops (vllm/_C_stable_libtorch.abi3.so, xz; about 61 MiB)
#   .device/C  the compiled ops of the MLA / MoE / KDA models (engine/suite.py model stages,
#              ENGINE.md "MLA, MoE and KDA"): _moe_C (xz, 38 MB), one tar.xz of _flashkda_C,
#              _flashmla_C(+_extension), _deepselect_C and the vendored deep_gemm (its .so
#              and JIT headers, 12 MB): 59.6 MiB less the wheel below, which is set C2
#   .device/C2 the transformers wheel with Glm5NextTextConfig (12.3 MiB), carried with A
#   .device/B  the vLLM .py tree with its dist-info, the dependency wheels the image lacks
#              (Python 3.12, no deps), the files the overlays patch or add (from a real
#              `overlay apply`), a release `kvstore` and the portable libkvtier_store.so with
#              the shared libraries they need, and the launcher the knob-1 stages plan
#              with (docker/, anchors/, the knob module)
# The suite's own code and the model configs (engine/) travel with the working tree.
# Needs scripts/setup.sh done (the pinned wheel in the cache, sha256-checked here again).
#
#   engine/prepare.sh            (from the project root; about 2 minutes, mostly xz)
#   ENGINE=vllm-0.32.0 engine/prepare.sh   (another pinned release: into .device-0.32.0/, its
#                                 own wheel, anchors and dist-info; DEVICE_DIR=... on both sides
#                                 picks it, see device-a.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kvtier
ENGINE=${ENGINE:-vllm-0.33.0}
if [ ! -f "fixtures/$ENGINE/WHEEL" ] || [ ! -f "anchors/$ENGINE/ORDER" ]; then
  echo "prepare: ENGINE=$ENGINE: no fixtures/$ENGINE/WHEEL or anchors/$ENGINE/ORDER" >&2
  exit 2
fi
read -r WHEEL_SHA WHEEL_NAME <"fixtures/$ENGINE/WHEEL"
WHEEL=$CACHE/wheels/$WHEEL_NAME
BUILD=${BUILD:-build-engine}
# The default release keeps the folder the device scripts have always read.
if [ "$ENGINE" = vllm-0.33.0 ]; then OUT=$ROOT/.device; else OUT=$ROOT/.device-${ENGINE#vllm-}; fi
[ "$(sha256sum "$WHEEL" | cut -c1-64)" = "$WHEEL_SHA" ] || {
  echo "prepare: $WHEEL missing or its sha256 differs from fixtures/$ENGINE/WHEEL" >&2
  exit 1
}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# The parts cut from the wheel are kept while the wheel is the same (they take minutes of
# xz); the tools, the overlay files and the wheels are made again on every run.
if [ "$(cat "$OUT/wheel.sha256" 2>/dev/null)" != "$WHEEL_SHA" ]; then
  rm -rf "$OUT/A" "$OUT/A2" "$OUT/B" "$OUT/C"
fi
rm -rf "$OUT/B/lib" "$OUT/B/whl" "$OUT/B/launcher"
mkdir -p "$W/tree" "$W/whl" "$OUT/A" "$OUT/B/lib"

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
  # 2. The compiled ops (stable-ABI libtorch extension), 63.7 MB compressed: with the
  #    checkout that is over the 64 MiB one transfer carries, so the first 40,000,000 bytes
  #    are set A and the rest set A2, which travels with B.
  unzip -p "$WHEEL" vllm/_C_stable_libtorch.abi3.so | xz -T0 -6 >"$W/so_C.xz"
  rm -rf "$OUT/A" "$OUT/A2" && mkdir -p "$OUT/A" "$OUT/A2"
  head -c 40000000 "$W/so_C.xz" >"$OUT/A/so_C.xz.1"
  tail -c +40000001 "$W/so_C.xz" >"$OUT/A2/so_C.xz.2"
  cat "$OUT/A/so_C.xz.1" "$OUT/A2/so_C.xz.2" | cmp - "$W/so_C.xz"
  mv "$OUT/B/vtree.tar.xz.tmp" "$OUT/B/vtree.tar.xz"
  echo "$WHEEL_SHA" >"$OUT/wheel.sha256"
fi

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
mkdir -p "$OUT/B/whl" && cp "$W/whl"/*.whl "$OUT/B/whl/"

# 5. The launcher the knob-1 stages plan with (engine/suite.py --launcher: docker/launch.sh,
#    the anchors' ORDER, the knob module), from the same revision as the overlays, so a stage
#    boots with exactly the connector JSON that revision's launch.sh writes.
rm -rf "$OUT/B/launcher" && mkdir -p "$OUT/B/launcher"
git archive "$rev" docker anchors overlays/kv-offload-scope VERSION | tar -x -C "$OUT/B/launcher"

# Which release these sets are: device-a.sh picks its /tmp folder by it, device-b.sh hands
# it to the suite (--engine), so a warm machine never mixes two releases' compiled ops.
echo "$ENGINE" >"$OUT/A/engine"
echo "$ENGINE" >"$OUT/B/engine"
# 6. Set C (the model stages' ops), kept while the wheel is the same; carried alone with the
#    checkout (device-c.sh), so it must stay under 64 MiB less the checkout's few MB.
#    Only for vLLM 0.33.0: the model stages name its files.
if [ "$ENGINE" != vllm-0.33.0 ]; then
  rm -rf "$OUT/C" "$OUT/C2"
elif [ ! -s "$OUT/C/moe_C.xz" ] || [ ! -s "$OUT/C/ops.tar.xz" ]; then
  rm -rf "$OUT/C" && mkdir -p "$OUT/C"
  unzip -p "$WHEEL" vllm/_moe_C_stable_libtorch.abi3.so | xz -T0 -6 >"$OUT/C/moe_C.xz.tmp"
  mkdir -p "$W/ops"
  unzip -q -o "$WHEEL" 'vllm/third_party/deep_gemm/*' vllm/_flashkda_C.abi3.so vllm/_flashmla_C.abi3.so \
    vllm/_flashmla_extension_C.abi3.so vllm/_deepselect_C.abi3.so -d "$W/ops"
  (cd "$W/ops" && tar cf - vllm | xz -T0 -6 >"$OUT/C/ops.tar.xz")
  mv "$OUT/C/moe_C.xz.tmp" "$OUT/C/moe_C.xz"
fi
# The transformers of the wheel's pin that has the models' config classes (the image's
# may predate Glm5NextTextConfig); device-b.sh installs it apart, for the model stages only.
# (Set C2, carried with set A: C alone plus the 5.3 MB checkout is already 52 MiB.)
if [ "$ENGINE" = vllm-0.33.0 ]; then
  rm -rf "$OUT/C/whl" "$OUT/C2" && mkdir -p "$OUT/C2/whl"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$OUT/C2/whl" "transformers==5.20.2"
fi
tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for pair in "C" "A C2" "B A2"; do
  set_bytes=$tree_bytes
  for d in $pair; do
    [ -d "$OUT/$d" ] && set_bytes=$((set_bytes + $(du -sb "$OUT/$d" | cut -f1)))
  done
  if [ "$set_bytes" -gt $((63 << 20)) ]; then
    echo "prepare: the call carrying .device/{${pair// /,}} with the checkout is $set_bytes bytes, over 63 MiB: split it" >&2
    exit 1
  fi
done
du -sh "$OUT"/*/
