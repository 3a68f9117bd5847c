#!/usr/bin/env bash
# Bakes the pinned overlays into an engine tree. The Dockerfile's bake step is
# exactly one call of this script; CI calls it directly on a copy of the
# pinned tree, so the image and CI run the same logic.
#
#   bake.sh [--prefix DIR] [--engine NAME-VERSION] [--overlay BIN]
#           [--root TREE | --python PY] [--artifacts FILE]
#           [--rebuild-binaries [--sources DIR]]
#   bake.sh --help | --version
#
#   --prefix     an install prefix (PREFIX/bin/overlay, PREFIX/share/kvtier/
#                {anchors,overlays}) or a folder holding anchors/ and overlays/
#                (the repository); default: the one this script lives in
#   --engine     anchors/<engine>-<version> to use; default: the release the
#                tree holds (Version: of its <engine>-*.dist-info/METADATA,
#                else <engine>/_version.py), which must be supported (an
#                anchors folder of that version); a tree that says none takes
#                the only release supported. With --engine, a tree that says
#                another release is refused
#   --overlay    the overlay tool; default: the prefix's, else PATH
#   --root       the engine's site-packages tree to patch
#   --python     interpreter of the installed engine: finds the tree when
#                --root is absent (and checks the installed version), and
#                compiles the injected sources (--check-injected)
#   --artifacts  where to record the checksummed artifact list the gate
#                verifies later; default: ARTIFACTS.sha256 beside anchors/
#   --rebuild-binaries
#                also apply the overlays of ORDER that rebuild an engine
#                binary (a [[built_files]] manifest: vllm-fs-durable rebuilds
#                vllm/fs_io_C.abi3.so, vLLM's own fs-tier extension). Opt-in:
#                on a wheel install it needs the engine's pinned C/C++ sources,
#                a C++ compiler and Python.h, which the serving image lacks,
#                and it changes vLLM's own code even with every knob at 0.
#                Without it those overlays are left out and named on stderr.
#   --sources    the pinned C/C++ sources they rebuild from (python3
#                fixtures/fetch.py --pins PINS --sources); default: the
#                `overlay` tool's (the fetch cache); exit 2 when neither has them
#
# The overlays applied are recorded beside the artifact list (ARTIFACTS.baked,
# ORDER's names one a line); the gate checks exactly those.
#
# Before anything is written it also checks that this system's glibc is at
# least the one the installed tools need (share/kvtier/GLIBC_REQUIRED, written
# by docker/build-tools.sh).
#
# Exit: 0 baked and checked; 2 bad usage, artifact, glibc, or an engine
# release without anchors here (the message names the version found and the
# supported ones; nothing written); otherwise the `overlay` CLI's code (1 wrong state,
# 3 drift, 4 tampered/half-applied, 5 compile failure, 6 I/O error).
set -euo pipefail
KVTIER_TOOL=bake
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/lib.sh"

rebuild=0 sources="" args=()
KVTIER_EXTRA_OPTIONS=(--rebuild-binaries --sources) # for other_arg's suggestion
while (($#)); do
  case $1 in
  --rebuild-binaries) rebuild=1 ;;
  --sources)
    (($# >= 2)) || die "--sources needs a value"
    sources=$2
    shift
    ;;
  *) args+=("$1") ;;
  esac
  shift
done
parse_tree_args "$0" ${args[@]+"${args[@]}"}
resolve_prefix
artifacts=${artifacts:-$prefix/ARTIFACTS.sha256}
if [[ -n $sources ]]; then
  ((rebuild)) || die "--sources is only used with --rebuild-binaries"
  [[ -d $sources ]] || die "--sources $(q "$sources"): not a folder"
  sources=$(cd "$sources" && pwd)
fi

# 1. The tree, given or the installed engine's (found, not read or written
# yet), and its release: the anchors folder of the vllm it holds.
if [[ -z $root ]]; then
  [[ -n $python ]] || die "pass --root TREE or --python PY"
  if [[ -n $engine ]]; then pkg=${engine%%-[0-9]*}; else pkg=$(anchors_engine "$prefix"); fi
  root=$(discover_root "$python" "$pkg")
fi
[[ -d $root ]] || die "--root $(q "$root"): not a folder"
resolve_tree_engine "$prefix" "$engine" "$root"
if [[ -n $KVTIER_TREE_VERSION_FROM ]]; then
  log "tree $root: $KVTIER_ENGINE $KVTIER_TREE_VERSION (from $KVTIER_TREE_VERSION_FROM)"
else
  log "tree $root: says no release; $KVTIER_ENGINE_DIR, $([[ -n $engine ]] && echo "named by --engine" || echo "the only one supported")"
fi

# 2. The artifacts: the pinned order, and each overlay it names, complete.
read_order "$prefix/anchors/$KVTIER_ENGINE_DIR/ORDER"
for name in "${KVTIER_ORDER[@]}"; do check_manifest "$prefix" "$name"; done
listing=$(list_baked "$prefix") # a refusal inside exits here, with 2
mapfile -t files <<<"$listing"
resolve_overlay_bin "$prefix" "$overlay_bin"
check_glibc "$prefix"
baked=()
for name in "${KVTIER_ORDER[@]}"; do
  if ((rebuild == 0)) && rebuilds_binary "$prefix" "$name"; then
    log "leaving out $name: it rebuilds an engine binary (vLLM's own code even at knob 0); --rebuild-binaries bakes it"
  else
    baked+=("$name")
  fi
done
((${#baked[@]})) || die "nothing to bake: every overlay of ORDER rebuilds a binary; pass --rebuild-binaries"
log "engine $KVTIER_ENGINE_DIR, order: ${KVTIER_ORDER[*]}; baking: ${baked[*]}"

# The list is computed now, from the artifacts that get applied, and
# recorded only once the tree checks out.
list_tmp=$(mktemp "${TMPDIR:-/tmp}/kvtier-artifacts.XXXXXX")
trap 'rm -f "$list_tmp"' EXIT
(cd "$prefix" && sha256sum -- "${files[@]}") >"$list_tmp"

# 3. Apply in the pinned order, compiling every injected source, then check
# the result independently. Any drift fails the bake (and the image build).
overlay_common_args "$prefix" "$root" "${baked[@]}"
inject=(--check-injected)
[[ -z $python ]] || inject+=(--python "$python")
apply_args=()
[[ -z $sources ]] || apply_args+=(--sources "$sources")
run_overlay() {
  local rc=0
  "$KVTIER_OVERLAY" "$@" || rc=$?
  ((rc == 0)) || {
    log "overlay $1 failed with exit $rc; the tree is not baked"
    exit "$rc"
  }
}
run_overlay apply "${KVTIER_OVERLAY_ARGS[@]}" "${inject[@]}" ${apply_args[@]+"${apply_args[@]}"}
run_overlay check "${KVTIER_OVERLAY_ARGS[@]}" "${inject[@]}" --expect applied

# 4. The store library where kv_store_format/native.py looks first
# (beside it), with the bundled ISA-L and libcrypto its $ORIGIN RPATH needs (a
# portable install bundles them; a plain one links the system's, and has none
# to copy; the wheel's are auditwheel's renamed copies in site-packages/
# kvtier.libs, which the library's other RPATH entry no longer reaches from
# beside native.py). Only into the engine's own package: a kvtier wheel in the
# same site-packages holds the overlay's copy of native.py too, and a file
# added there is one pip never removes and the gate's artifact list lacks.
# What it copies is recorded beside it (.overlay-installed), so `overlay
# revert` removes exactly those files with the folder the overlay made.
mapfile -t natives < <(engine_natives "$root" "$KVTIER_ENGINE")
lib_rel=$(store_lib_rel "$prefix")
if [[ -z $lib_rel ]]; then
  ((${#natives[@]} == 0)) ||
    log "no store library under $prefix (lib/kvtier/$KVTIER_STORE_LIB_NAME; a repository has none): none installed beside ${natives[0]}, so a GLM53_KV_OFFLOAD=1 writer cannot start and the gate refuses knob 1; bake from an install (cmake --install, the .deb, the image, the wheel) to ship it"
else
  lib=$prefix/$lib_rel
  mapfile -t libs < <(
    for dep in libisal libcrypto; do # ISA-L's CRC, libcrypto's HMAC (keyed stores)
      compgen -G "$(dirname "$lib")/$dep.so*" || true
      compgen -G "$(dirname "$lib")/../../../kvtier.libs/$dep-*.so*" || true
    done
  )
  for native in "${natives[@]}"; do
    dest=$(dirname "$native")
    cp "$lib" ${libs[@]+"${libs[@]}"} "$dest/" ||
      die "$native: cannot install the store library beside it"
    names=()
    for f in "$lib" ${libs[@]+"${libs[@]}"}; do names+=("$(basename "$f")"); done
    if ! (cd "$dest" && sha256sum -- "${names[@]}") >"$dest/$KVTIER_INSTALLED_RECORD.tmp" ||
      ! mv "$dest/$KVTIER_INSTALLED_RECORD.tmp" "$dest/$KVTIER_INSTALLED_RECORD"; then
      die "$dest/$KVTIER_INSTALLED_RECORD: cannot record what was installed there"
    fi
    log "store library installed beside $native (${names[*]}; recorded in $KVTIER_INSTALLED_RECORD)"
  done
fi

mkdir -p "$(dirname "$artifacts")"
baked_list=$(baked_file "$artifacts")
printf '%s\n' "${baked[@]}" >"$baked_list.tmp"
cp "$list_tmp" "$artifacts.tmp"
mv "$baked_list.tmp" "$baked_list"
mv "$artifacts.tmp" "$artifacts"
log "baked ${#baked[@]} of ${#KVTIER_ORDER[@]} overlays (${baked[*]}, recorded in $baked_list); artifact list ($((${#files[@]})) files) at $artifacts"
