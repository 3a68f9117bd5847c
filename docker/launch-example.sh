#!/usr/bin/env bash
# Example launcher: shows the wiring, not a product. Restarts one serving
# container per rank over ssh, with the gate in front of everything.
#
#   launch-example.sh --hosts h0,h1 --image IMG --tree TREE
#                     [--prefix P] [--base-env FILE] [--name NAME] [--python PY]
#                     -- SERVE_ARGV...
#
# rank R runs on the R-th host; TREE is a local copy of the image's engine
# tree (or the image's own, when this runs inside it) for the gate to check;
# PY compiles the injected sources for that check (the image's python version).
# Order: gate -> plan -> compare ranks -> then, and only then, per rank:
# docker stop, mkdir of the store (knob 1 only), docker run.
# Exit: 2 when the gate or the plan refuses (nothing stopped); otherwise the
# first failing remote command's code.
set -euo pipefail
KVTIER_TOOL=launch-example
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=docker/lib.sh
. "$here/lib.sh"

hosts="" image="" tree="" prefix=$(cd "$here/.." && pwd) base_env="" name=kvtier-serve python=""
while (($#)); do
  case $1 in
  --hosts | --image | --tree | --prefix | --base-env | --name | --python)
    (($# >= 2)) || die "$1 needs a value"
    case $1 in
    --hosts) hosts=$2 ;;
    --image) image=$2 ;;
    --tree) tree=$2 ;;
    --prefix) prefix=$2 ;;
    --base-env) base_env=$2 ;;
    --name) name=$2 ;;
    --python) python=$2 ;;
    esac
    shift 2
    ;;
  --)
    shift
    break
    ;;
  *) die "unknown argument $(q "$1")" ;;
  esac
done
[[ -n $hosts && -n $image && -n $tree ]] || die "--hosts, --image and --tree are required"
IFS=, read -ra host_list <<<"$hosts"

# 1. The gate: knobs, artifacts, tree. Nothing has been stopped yet.
gate_args=(--prefix "$prefix" --root "$tree")
[[ -z $python ]] || gate_args+=(--python "$python")
"$here/gate.sh" "${gate_args[@]}" || exit 2

# 2. One plan per rank, and proof that every rank got the same bytes.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ranks=$(seq -s, 0 $((${#host_list[@]} - 1)))
plan_args=(plan --ranks "$ranks" --out "$work/plan" --prefix "$prefix")
[[ -z $base_env ]] || plan_args+=(--base-env "$base_env")
"$here/launch.sh" "${plan_args[@]}" -- "$@" || exit 2
"$here/launch.sh" compare "$work/plan" || exit 2

# 3. Per rank: stop, (mkdir), run. Each remote command is one line quoted
# here, on purpose, for the remote shell (hence SC2029 below).
for r in "${!host_list[@]}"; do
  host=${host_list[$r]}
  dir=$work/plan/rank$r
  mapfile -t argv <"$dir/argv"
  mapfile -t envs <"$dir/env"
  mapfile -t mounts <"$dir/mounts"
  run=(docker run -d --name "$name" --gpus all --network host --ipc host)
  for e in "${envs[@]}"; do run+=(-e "$e"); done
  for m in "${mounts[@]}"; do run+=(-v "$m"); done
  run+=("$image" "${argv[@]}")

  # shellcheck disable=SC2029
  ssh "$host" "docker rm -f $(q "$name") >/dev/null 2>&1 || true"
  for m in "${mounts[@]}"; do
    # shellcheck disable=SC2029
    ssh "$host" "mkdir -p $(q "${m%%:*}")"
  done
  # shellcheck disable=SC2029
  ssh "$host" "$(printf '%q ' "${run[@]}")"
done
