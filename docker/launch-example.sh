#!/usr/bin/env bash
# Example launcher: shows the wiring, not a product. Restarts one serving
# container per node of a multi-node tensor-parallel group over ssh, with the
# gate in front of everything.
#
#   launch-example.sh --hosts h0,h1 --image IMG [--tree TREE]
#                     [--prefix P] [--image-prefix DIR] [--python PY]
#                     [--base-env FILE] [--name NAME] [--master-port PORT]
#                     -- SERVE_ARGV...
#   launch-example.sh --help | --version
#
# Rank R runs on the R-th host; h0 is the leader (--master-addr), the others
# run --headless. The gate checks the tree that will serve: by default it
# runs inside IMG on every host (docker run --rm, its gate.sh under
# --image-prefix, default /opt/kvtier, with --python PY, default python3),
# with the caller's knobs. --tree TREE instead gates a local copy of the
# image's engine tree (for instance extracted ahead of the restart window).
# Order: gate -> plan -> compare ranks -> then, and only then, per rank:
# docker rm -f (the old container), mkdir of the store (knob 1 only), docker run.
# SERVE_ARGV is what follows the image on `docker run`: the vLLM image's
# entrypoint is `vllm serve`, so `-- MODEL [serve options]`.
# Exit: 2 when the gate or the plan refuses (nothing stopped); otherwise the
# first failing remote command's code.
set -euo pipefail
KVTIER_TOOL=launch-example
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=docker/lib.sh
. "$here/lib.sh"

hosts="" image="" tree="" prefix=$(cd "$here/.." && pwd) base_env="" name=kvtier-serve python=""
image_prefix=/opt/kvtier master_port=29501
parse_options '--hosts=hosts --image=image --tree=tree --prefix=prefix --base-env=base_env --name=name
  --python=python --image-prefix=image_prefix --master-port=master_port' "$@"
set -- "${KVTIER_REST[@]}"
if (($#)); then
  [[ $1 == -- ]] || other_arg "$0" "$1"
  shift
fi
[[ -n $hosts && -n $image ]] || die "--hosts and --image are required"
IFS=, read -ra host_list <<<"$hosts"

# 1. The gate: knobs, artifacts, tree. Nothing has been stopped yet.
if [[ -n $tree ]]; then
  gate_args=(--prefix "$prefix" --root "$tree")
  [[ -z $python ]] || gate_args+=(--python "$python")
  "$here/gate.sh" "${gate_args[@]}" || exit 2
else
  # Inside the image, on every host: the very files and python that will
  # serve, and the image each host actually has under that name.
  "$here/gate.sh" --knobs-only || exit 2
  gate=(docker run --rm --network none --entrypoint "$image_prefix/share/kvtier/docker/gate.sh")
  while IFS= read -r v; do gate+=(-e "$v=${!v}"); done < <(compgen -e | grep '^GLM53_KV_OFFLOAD' || true)
  gate+=("$image" --prefix "$image_prefix" --python "${python:-python3}")
  for host in "${host_list[@]}"; do
    # shellcheck disable=SC2029
    ssh "$host" "$(printf '%q ' "${gate[@]}")" || {
      log "$host: the gate inside $image refused; nothing was stopped"
      exit 2
    }
  done
fi

# 2. One plan per rank, and proof that every rank got the same bytes.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ranks=$(seq -s, 0 $((${#host_list[@]} - 1)))
plan_args=(plan --ranks "$ranks" --out "$work/plan" --prefix "$prefix")
((${#host_list[@]} == 1)) || plan_args+=(--master-addr "${host_list[0]}" --master-port "$master_port")
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
