#!/usr/bin/env bash
# One self-check of a node before a launch, in the manner of `brew doctor`:
# every check runs (none stops the others) and says ok, warn, FAIL or skip,
# with the way out. It asks the tools that already know rather than keeping
# rules of its own: the knob module, gate.sh (artifacts, tree state through
# `overlay check`, the store library beside native.py), `overlay status`
# (the next step for a tree in a bad state), the patched tree's own code
# (docker/doctor_probe.py: the store library's loader and version check, the
# key file and store folder checks the writer makes at boot, the disk
# budget), and `kvstore stat` / `kvstore verify` on the store.
#
#   doctor.sh [--prefix DIR] [--engine NAME-VERSION] [--overlay BIN]
#             [--root TREE | --python PY] [--artifacts FILE]
#             [--kvstore BIN] [--textfile-dir DIR] [--ranks N] [--quick]
#   doctor.sh --help | --version
#
# Options as in gate.sh, plus:
#   --kvstore       the kvstore tool; default: the prefix's, else PATH
#   --textfile-dir  node-exporter's textfile folder the kvtier units write
#                   to; default /var/lib/prometheus/node-exporter
#   --ranks         tensor-parallel ranks this node serves (the disk budget
#                   is per rank); default: the rank folders the store holds
#   --quick         no `kvstore verify` (it reads every byte of the store)
#
# The knobs come from the environment, as for the gate: run it with those the
# engine will get. Exit: 0 no check failed (warnings allowed); 2 any FAIL.
set -euo pipefail
KVTIER_TOOL=doctor
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=docker/lib.sh
. "$here/lib.sh"

kvstore_bin="" textfile=/var/lib/prometheus/node-exporter quick=0 ranks="" args=()
KVTIER_EXTRA_OPTIONS=(--kvstore --textfile-dir --ranks --quick)
while (($#)); do
  case $1 in
  --quick) quick=1 ;;
  --kvstore | --textfile-dir | --ranks)
    (($# >= 2)) || die "$1 needs a value"
    case $1 in
    --kvstore) kvstore_bin=$2 ;;
    --textfile-dir) textfile=$2 ;;
    --ranks) ranks=$2 ;;
    esac
    shift
    ;;
  *) args+=("$1") ;;
  esac
  shift
done
parse_tree_args "$0" ${args[@]+"${args[@]}"}
[[ -z $ranks || $ranks =~ ^[1-9][0-9]{0,3}$ ]] || die "--ranks $(q "$ranks"): a whole number 1..9999"

fails=0 warns=0
say() { # VERDICT CHECK DETAIL
  printf '%-4s %s: %s\n' "$1" "$2" "$3"
  case $1 in FAIL) fails=$((fails + 1)) ;; warn) warns=$((warns + 1)) ;; esac
}
# The last line a command wrote, without its "tool: " prefix.
last_line() { sed -n '$s/^[a-z-]*: //p' <<<"$1"; }

# 1. The knobs, by the knob module (what the gate and the engine run).
knob=0
if out=$( (validate_knobs --restore-baked && echo "knob $KVTIER_KNOB") 2>&1); then
  knob=${out##*knob }
  set_knobs=$(compgen -e | grep '^GLM53_KV_OFFLOAD' | tr '\n' ' ' || true)
  say ok knobs "GLM53_KV_OFFLOAD=$knob${set_knobs:+ (set: ${set_knobs% })}"
else
  say FAIL knobs "$(last_line "$out")"
fi

# 2. Artifacts, tree state and the store library beside native.py: the gate.
gate_args=()
for opt in prefix engine overlay_bin root python artifacts; do
  [[ -n ${!opt} ]] || continue
  flag=--${opt%_bin}
  [[ $opt == prefix ]] || gate_args+=("$flag" "${!opt}")
done
gate_args=(--prefix "$prefix" ${gate_args[@]+"${gate_args[@]}"})
knobs_ok=$fails
if out=$("$here/gate.sh" "${gate_args[@]}" 2>&1); then
  say ok gate "$(last_line "$out")"
elif ((knobs_ok)); then
  # The gate stops at the knobs; so that the rest is judged too, run it again
  # with only the tier's on/off intent (and placeholders it requires).
  intended=${GLM53_KV_OFFLOAD-0}
  [[ $intended == 1 ]] || intended=0
  unset_knobs=()
  while IFS= read -r v; do unset_knobs+=(-u "$v"); done < <(compgen -e | grep '^GLM53_KV_OFFLOAD' || true)
  aside=(GLM53_KV_OFFLOAD="$intended")
  ((intended == 0)) || aside+=(GLM53_KV_OFFLOAD_DIR=/kvtier-doctor GLM53_KV_OFFLOAD_CPU_GB=1)
  if out=$(env "${unset_knobs[@]}" "${aside[@]}" "$here/gate.sh" "${gate_args[@]}" 2>&1); then
    say ok gate "with the knobs set aside: $(last_line "$out")"
  else
    say FAIL gate "with the knobs set aside: $(last_line "$out")"
  fi
else
  say FAIL gate "$(last_line "$out")"
fi

# The rest needs the prefix's data folder and the tree.
resolve_prefix
artifacts=${artifacts:-$prefix/ARTIFACTS.sha256}
engine_dir=${engine:-$(baked_release "$artifacts")}
if ! (resolve_engine "$prefix" "$engine_dir") >/dev/null 2>&1; then
  say FAIL engine "no anchors for ${engine_dir:-any release} under $prefix"
  echo "doctor: $fails problem(s), $warns warning(s)"
  exit 2
fi
resolve_engine "$prefix" "$engine_dir"
if [[ -z $root && -n $python ]]; then root=$( (discover_root "$python" "$KVTIER_ENGINE") 2>/dev/null || true); fi
py=${python:-python3}

# 3. When the gate refused the tree: what `overlay status` says to do.
if [[ -n $root && -d $root ]] && (resolve_overlay_bin "$prefix" "$overlay_bin") >/dev/null 2>&1; then
  resolve_overlay_bin "$prefix" "$overlay_bin"
  status=$("$KVTIER_OVERLAY" status --root "$root" --manifests "$prefix/anchors/$KVTIER_ENGINE_DIR" 2>&1 || true)
  while IFS= read -r line; do
    [[ -z $line ]] || say warn tree "${line#*next: }"
  done < <(grep 'next: ' <<<"$status" || true)
fi

# 4. The store: its size and ranks (kvstore stat), then every byte (verify).
if [[ -z $kvstore_bin ]]; then
  if [[ -x $prefix/bin/kvstore ]]; then kvstore_bin=$prefix/bin/kvstore
  elif [[ -x $prefix/../../bin/kvstore ]]; then kvstore_bin=$(cd "$prefix/../../bin" && pwd)/kvstore
  else kvstore_bin=$(command -v kvstore || true); fi
fi
store_bytes=0 store_ranks=0 dir=${GLM53_KV_OFFLOAD_DIR-}
if [[ -z $dir ]]; then
  say skip store "GLM53_KV_OFFLOAD_DIR unset"
elif [[ -z $kvstore_bin || ! -x $kvstore_bin ]]; then
  say FAIL store "kvstore not found (pass --kvstore BIN)"
elif [[ ! -d $dir ]]; then
  say warn store "$dir does not exist yet: the writer makes it at its first boot"
else
  rc=0
  out=$("$kvstore_bin" stat --json "$dir" 2>/dev/null) || rc=$?
  if ((rc == 8)); then
    say warn store "$dir: no store here: empty (the engine has not written yet, or the store's disk is not mounted)"
  elif ((rc != 0)); then
    say FAIL store "kvstore stat $dir: exit $rc"
  else
    read -r store_ranks store_bytes < <("$py" -c 'import json, sys
d = json.load(sys.stdin)
print(len(d.get("ranks", [])), sum(r.get("bytes", 0) for r in d.get("ranks", [])))' <<<"$out")
    say ok store "$dir: $store_ranks rank(s), $store_bytes bytes"
    if ((quick)); then
      say skip verify "--quick: kvstore verify not run"
    elif out=$("$kvstore_bin" verify "$dir" 2>&1); then
      say ok verify "$(tail -n1 <<<"$out")"
    else
      say FAIL verify "$(tail -n1 <<<"$out") (kvstore verify $dir lists each finding; docs/DEPLOY.md, 'Operate the store')"
    fi
  fi
fi

# 5. What only the engine's own code can say (doctor_probe.py).
mapfile -t natives < <([[ -n $root ]] && engine_natives "$root" "$KVTIER_ENGINE")
probe=(--knobs "$prefix/overlays/kv-offload-scope/kv_offload_knobs.py" --store-bytes "$store_bytes"
  --ranks "${ranks:-$store_ranks}" --source "$prefix/overlays/kv-offload-store-local")
((${#natives[@]} == 0)) || probe+=(--offloading "$(dirname "$(dirname "${natives[0]}")")")
command -v "$py" >/dev/null || py=python3
if out=$("$py" "$here/doctor_probe.py" "${probe[@]}" 2>&1); then
  while IFS=$'\t' read -r verdict check detail; do
    [[ -n $verdict ]] && say "$verdict" "$check" "$detail"
  done <<<"$out"
else
  say FAIL probe "$py $here/doctor_probe.py: $(tail -n1 <<<"$out")"
fi

# 6. Where the kvtier units write their metrics, and whether gc reports.
if [[ ! -d $textfile ]]; then
  say warn textfile "$textfile: no such folder (node-exporter's --collector.textfile.directory; --textfile-dir)"
elif [[ ! -f $textfile/kvtier_gc.prom ]]; then
  say warn textfile "$textfile/kvtier_gc.prom: missing: is kvtier-gc.timer (or the sidecar) running?"
else
  last=$(sed -nE 's/^kvstore_last_success_timestamp_seconds\{command="gc"\} ([0-9.e+]+)$/\1/p' "$textfile/kvtier_gc.prom")
  age=$(awk -v t="${last:-0}" -v now="$(date +%s)" 'BEGIN { printf "%d", now - t }')
  if ((age > 3600)); then
    say warn textfile "$textfile/kvtier_gc.prom: gc last succeeded ${age} s ago (KvtierGcNotRunning)"
  else
    say ok textfile "$textfile/kvtier_gc.prom: gc last succeeded ${age} s ago"
  fi
fi

echo "doctor: $fails problem(s), $warns warning(s)"
((fails == 0)) || exit "$KVTIER_EXIT_REFUSED"
