#!/usr/bin/env bash
# The pre-stop gate. A launcher runs it before it stops or starts anything
# (before any docker or ssh call); any refusal exits 2, so a bad knob or a
# broken overlay artifact never takes down a healthy deployment.
#
#   gate.sh [--prefix DIR] [--engine NAME-VERSION] [--overlay BIN]
#           [--root TREE | --python PY] [--artifacts FILE]
#   gate.sh --knobs-only
#   gate.sh --help | --version
#
# Checks, in this order, stopping at the first failure:
#   1. every GLM53_KV_OFFLOAD* knob in the environment (the rules of
#      overlays/kv-offload-scope/kv_offload_knobs.py; GLM53_KV_OFFLOAD_RESTORE=1
#      only when ORDER lists kv-offload-restore); --knobs-only stops here;
#   2. the artifacts: the pinned ORDER, each manifest it names (and only
#      those, with matching overlay/engine fields), every fragment present,
#      and every file matching the checksummed list bake.sh recorded (missing,
#      truncated, edited, extra or re-pointed files all fail);
#   3. the tree: `overlay check` says the state of the overlays bake.sh
#      applied (ARTIFACTS.baked beside the list) is what the knobs need
#      (knob 1: every one applied, injected sources compile; knob 0: applied
#      or pristine, never half-applied, tampered or drifted);
#   4. knob 1 only: the store library the writer loads is beside every
#      kv_store_format/native.py of the engine, the one the bake installed
#      (or, when KVTIER_STORE_LIB is set, that file exists: the writer
#      loads it first).
#
# Options as in bake.sh, but --engine defaults to the release bake.sh
# recorded (the anchors folder its artifact list names). The tree to check is the one that will serve: inside
# the image, `--python python3` finds it (docker/launch-example.sh runs the
# gate that way); --root names a copy of it.
# Exit: 0 go; 2 refused (the message names the underlying cause and, for a
# tree refusal, `overlay`'s own exit code).
set -euo pipefail
KVTIER_TOOL=gate
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/lib.sh"

if [[ ${1:-} == --knobs-only ]]; then
  (($# == 1)) || die "--knobs-only takes no other argument"
  validate_knobs --restore-baked # the full gate checks that it is baked
  log "ok: knobs (knob $KVTIER_KNOB)"
  exit 0
fi
parse_tree_args "$0" "$@"

# 1. Knobs: pure checks of the environment, before touching any file.
validate_knobs --restore-baked # RESTORE=1 needs kv-offload-restore in ORDER (below)

# 2. Artifacts.
resolve_prefix
artifacts=${artifacts:-$prefix/ARTIFACTS.sha256}
# The release bake.sh baked (its artifact list says), unless --engine names one.
resolve_engine "$prefix" "${engine:-$(baked_release "$artifacts")}"
read_order "$prefix/anchors/$KVTIER_ENGINE_DIR/ORDER"
for name in "${KVTIER_ORDER[@]}"; do check_manifest "$prefix" "$name"; done
if [[ ${GLM53_KV_OFFLOAD_RESTORE-} == 1 && " ${KVTIER_ORDER[*]} " != *" kv-offload-restore "* ]]; then
  die "GLM53_KV_OFFLOAD_RESTORE=1 is refused: the kv-offload-restore overlay is not baked (not in ORDER)"
fi

require_baked_list "$artifacts"
artifacts=$(cd "$(dirname "$artifacts")" && pwd)/$(basename "$artifacts")
listing=$(list_baked "$prefix") # a refusal inside exits here, with 2
mapfile -t want <<<"$listing"
mapfile -t listed < <(sed -nE 's/^[0-9a-f]{64}  (.+)$/\1/p' "$artifacts")
lines=$(grep -c '' "$artifacts" || true)
((lines == ${#listed[@]})) || die "$artifacts: malformed (expected '<sha256>  <path>' lines)"
if [[ "${want[*]}" != "${listed[*]}" ]]; then
  extra=$(comm -23 <(printf '%s\n' "${want[@]}" | LC_ALL=C sort) <(printf '%s\n' "${listed[@]}" | LC_ALL=C sort) | head -n1)
  gone=$(comm -13 <(printf '%s\n' "${want[@]}" | LC_ALL=C sort) <(printf '%s\n' "${listed[@]}" | LC_ALL=C sort) | head -n1)
  [[ -z $extra ]] || die "$prefix/$extra: not in the baked artifact list $artifacts"
  [[ -z $gone ]] || die "$prefix/$gone: listed in $artifacts but missing"
  die "$artifacts: baked with another overlay order than ORDER names now"
fi
if ! bad=$(cd "$prefix" && sha256sum --check --strict --quiet "$artifacts" 2>&1); then
  die "artifact does not match the baked list: $(head -n1 <<<"$bad")"
fi

# 3. The tree's overlay state.
resolve_overlay_bin "$prefix" "$overlay_bin"
if [[ -z $root ]]; then
  [[ -n $python ]] || die "pass --root TREE or --python PY"
  root=$(discover_root "$python" "$KVTIER_ENGINE")
fi
[[ -d $root ]] || die "--root $(q "$root"): not a folder"
# Exactly the overlays bake.sh applied (ARTIFACTS.baked: ORDER, or ORDER
# without those that rebuild a binary when baked without --rebuild-binaries).
read_baked "$prefix" "$(baked_file "$artifacts")"
overlay_common_args "$prefix" "$root" "${KVTIER_BAKED[@]}"

overlay_says() {
  case $1 in
  1) echo "not in the expected state" ;;
  2) echo "usage or manifest error" ;;
  3) echo "drift" ;;
  4) echo "tampered or half-applied" ;;
  5) echo "injected source does not compile" ;;
  6) echo "I/O error" ;;
  *) echo "exit $1" ;;
  esac
}
check() {
  local rc=0
  "$KVTIER_OVERLAY" check "${KVTIER_OVERLAY_ARGS[@]}" "$@" >&2 || rc=$?
  return "$rc"
}
if ((KVTIER_KNOB)); then
  inject=(--check-injected)
  [[ -z $python ]] || inject+=(--python "$python")
  rc=0
  check --expect applied "${inject[@]}" || rc=$?
  ((rc == 0)) || die "$root: GLM53_KV_OFFLOAD=1 needs every overlay applied: $(overlay_says "$rc") (overlay exit $rc)"
  state=applied
else
  # The overlays are inert with the knob at 0, so a baked tree and a pristine
  # one both serve as before; anything in between does not.
  rc=0
  check --expect applied || rc=$?
  state=applied
  if ((rc == 1)); then
    rc=0
    check --expect pristine || rc=$?
    state=pristine
  fi
  ((rc == 0)) || die "$root: overlay state is neither applied nor pristine: $(overlay_says "$rc") (overlay exit $rc)"
fi
# 4. Knob 1: the store library the writer loads, beside every native.py of
# the tree's engine (bake.sh put it there; a bake without one says so).
if ((KVTIER_KNOB)) && [[ -n ${KVTIER_STORE_LIB-} ]]; then
  # The writer loads KVTIER_STORE_LIB first, when the engine's environment sets it.
  [[ -f $KVTIER_STORE_LIB ]] ||
    die "KVTIER_STORE_LIB=$(q "$KVTIER_STORE_LIB"): no such file; GLM53_KV_OFFLOAD=1's writer loads the store library from there"
elif ((KVTIER_KNOB)); then
  lib_rel=$(store_lib_rel "$prefix")
  mapfile -t natives < <(engine_natives "$root" "$KVTIER_ENGINE")
  for native in ${natives[@]+"${natives[@]}"}; do
    have=$(dirname "$native")/$KVTIER_STORE_LIB_NAME
    if [[ -z $lib_rel ]]; then
      [[ -f $have ]] || die "$have: missing, and the bake had none to install (no lib/kvtier/$KVTIER_STORE_LIB_NAME under $prefix): GLM53_KV_OFFLOAD=1's writer cannot start; bake from an install (cmake --install, the .deb, the image, the wheel)"
    else
      [[ -f $have ]] || die "$have: missing: GLM53_KV_OFFLOAD=1's writer loads the store library from there; run bake.sh again"
      cmp -s "$have" "$prefix/$lib_rel" || die "$have: differs from the baked $prefix/$lib_rel; run bake.sh again"
    fi
  done
fi
log "ok: knob $KVTIER_KNOB, overlays ${KVTIER_BAKED[*]} $state on $root"
