#!/usr/bin/env bash
# Launch configuration: what each rank's container gets, as files a launcher
# reads, so every rank is fed the same bytes.
#
#   launch.sh plan --ranks 0,1 --out DIR [--prefix P] [--engine E]
#                  [--artifacts FILE] [--base-env FILE] -- SERVE_ARGV...
#   launch.sh compare DIR
#
# plan reads the GLM53_KV_OFFLOAD* knobs from the environment (same rules as
# the gate) and writes DIR/rank<R>/{argv,env,mounts,order}: argv one argument
# a line, env KEY=VALUE lines (the base env file's lines, in order), mounts
# HOST:CONTAINER:MODE lines, order the pinned overlay order.
#   knob 0: argv and env are the base, byte for byte; no mounts.
#   knob 1: argv gains --kv-transfer-config with one connector JSON (the same
#           for every rank); env drops expandable_segments:True from
#           PYTORCH_CUDA_ALLOC_CONF and gains the knobs the caller exported
#           (plus GLM53_KV_OFFLOAD_BUILD_ID from the baked artifact list when
#           unset); the store folder is mounted read-write at the same path.
# compare checks that every rank of DIR got identical files (the connector
# JSON first, by name) and is what a launcher runs before any docker/ssh call.
#
# Exit: 0 written / identical; 2 refused (nothing written) or ranks differ.
set -euo pipefail
KVTIER_TOOL=launch
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/lib.sh"

usage() { sed -n '2,22p' "$0"; }

# The connector config for knob 1. Only validated integers go into it, so
# plain printf is exact. No secondary tiers: the worker-local writer is the
# disk tier (vLLM's scheduler-side tier would write one node's bytes for every
# rank). offload_prompt_only=false so decoded tokens are stored too.
connector_json() {
  local cpu_gb=$1
  printf '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":%d,"blocks_per_chunk":1,"offload_prompt_only":false,"secondary_tiers":[]}}' \
    "$((cpu_gb * 1024 * 1024 * 1024))"
}

# PYTORCH_CUDA_ALLOC_CONF without its expandable_segments:True entry. vLLM
# refuses the OffloadingConnector with it unless the CuMem allocator is on:
# the VMM allocator may remap KV-cache pages under the registered memory.
drop_expandable() {
  local IFS=, entry kept=()
  for entry in $1; do
    [[ ${entry//[[:space:]]/} == "expandable_segments:True" ]] || kept+=("$entry")
  done
  printf '%s' "${kept[*]}"
}

plan() {
  local ranks="" out="" prefix engine="" artifacts="" base_env=""
  prefix=$(cd "$(dirname "$0")/.." && pwd)
  while (($#)); do
    case $1 in
    --ranks | --out | --prefix | --engine | --artifacts | --base-env)
      (($# >= 2)) || die "$1 needs a value"
      case $1 in
      --ranks) ranks=$2 ;;
      --out) out=$2 ;;
      --prefix) prefix=$2 ;;
      --engine) engine=$2 ;;
      --artifacts) artifacts=$2 ;;
      --base-env) base_env=$2 ;;
      esac
      shift 2
      ;;
    --)
      shift
      break
      ;;
    *) die "unknown argument $(q "$1") (see --help)" ;;
    esac
  done
  local argv=("$@")

  # Everything is checked before anything is written.
  validate_knobs
  [[ $ranks =~ ^[0-9]{1,4}(,[0-9]{1,4})*$ ]] || die "--ranks $(q "$ranks"): expected e.g. 0,1"
  local rank_list seen=" " r
  IFS=, read -ra rank_list <<<"$ranks"
  for r in "${rank_list[@]}"; do
    r=$((10#$r))
    [[ $seen != *" $r "* ]] || die "--ranks: rank $r listed twice"
    seen+="$r "
  done
  [[ -n $out ]] || die "--out DIR is required"
  [[ ! -e $out ]] || die "$out: already exists; launch.sh writes a fresh folder"
  ((${#argv[@]})) || die "no serve argv after --"
  local a
  for a in "${argv[@]}"; do
    [[ $a != *$'\n'* ]] || die "argv: $(q "$a") contains a newline"
  done
  [[ -d $prefix ]] || die "--prefix $(q "$prefix"): not a folder"
  resolve_engine "$prefix" "$engine"
  read_order "$prefix/anchors/$KVTIER_ENGINE_DIR/ORDER"

  local env_lines=() line n=0
  if [[ -n $base_env ]]; then
    [[ -f $base_env ]] || die "$base_env: missing"
    while IFS= read -r line || [[ -n $line ]]; do
      n=$((n + 1))
      [[ $line =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "$base_env:$n: expected KEY=VALUE"
      [[ $line != GLM53_KV_OFFLOAD* ]] ||
        die "$base_env:$n: knobs come from the caller's environment, not the base env"
      env_lines+=("$line")
    done <"$base_env"
  fi

  local mounts=()
  if ((KVTIER_KNOB)); then
    for a in "${argv[@]}"; do
      case $a in
      --kv-transfer-config | --kv-transfer-config=* | --kv-offloading-size* | --kv-offloading-backend*)
        die "argv already has $a; with GLM53_KV_OFFLOAD=1 the launcher owns the connector config"
        ;;
      esac
    done
    argv+=(--kv-transfer-config "$(connector_json "$GLM53_KV_OFFLOAD_CPU_GB")")

    local i v
    for i in "${!env_lines[@]}"; do
      [[ ${env_lines[$i]} == PYTORCH_CUDA_ALLOC_CONF=* ]] || continue
      v=$(drop_expandable "${env_lines[$i]#PYTORCH_CUDA_ALLOC_CONF=}")
      [[ $v != "${env_lines[$i]#PYTORCH_CUDA_ALLOC_CONF=}" ]] || continue
      log "GLM53_KV_OFFLOAD=1: dropping expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF: vLLM refuses the OffloadingConnector with it unless the CuMem allocator is on; this process runs on PyTorch's default caching allocator"
      if [[ -n $v ]]; then
        env_lines[i]=PYTORCH_CUDA_ALLOC_CONF=$v
      else
        unset 'env_lines[i]'
      fi
    done
    env_lines=("${env_lines[@]}")

    # Replay exactly the knobs the caller exported (setness, not defaults:
    # the code in the image applies the same defaults).
    for v in "${KVTIER_KNOBS[@]}"; do
      knob_set "$v" && env_lines+=("$v=${!v}")
    done
    if ! knob_set GLM53_KV_OFFLOAD_BUILD_ID; then
      artifacts=${artifacts:-$prefix/ARTIFACTS.sha256}
      [[ -f $artifacts ]] ||
        die "$artifacts: missing; set GLM53_KV_OFFLOAD_BUILD_ID or bake first (the store namespace is fenced by it)"
      v=$(sha256sum <"$artifacts")
      env_lines+=("GLM53_KV_OFFLOAD_BUILD_ID=kvtier-${v:0:16}")
    fi
    mounts+=("$GLM53_KV_OFFLOAD_DIR:$GLM53_KV_OFFLOAD_DIR:rw")
  fi

  local tmp
  tmp=$(mktemp -d "$(dirname "$out")/.launch.XXXXXX")
  for r in "${rank_list[@]}"; do
    r=$((10#$r))
    mkdir "$tmp/rank$r"
    printf '%s\n' "${argv[@]}" >"$tmp/rank$r/argv"
    # Knob 0: the base env file's bytes, untouched.
    if ((KVTIER_KNOB == 0)) && [[ -n $base_env ]]; then
      cp "$base_env" "$tmp/rank$r/env"
    else
      { ((${#env_lines[@]} == 0)) || printf '%s\n' "${env_lines[@]}"; } >"$tmp/rank$r/env"
    fi
    { ((${#mounts[@]} == 0)) || printf '%s\n' "${mounts[@]}"; } >"$tmp/rank$r/mounts"
    printf '%s\n' "${KVTIER_ORDER[@]}" >"$tmp/rank$r/order"
  done
  mv "$tmp" "$out"
  log "wrote ${#rank_list[@]} rank plans to $out (knob $KVTIER_KNOB)"
}

# The argument after --kv-transfer-config in an argv file, if any.
connector_of() { sed -n '/^--kv-transfer-config$/{n;p;q}' "$1"; }

compare() {
  (($# == 1)) || die "usage: launch.sh compare DIR"
  local dir=$1 ranks=() d first f r
  [[ -d $dir ]] || die "$dir: not a folder"
  for d in "$dir"/rank*; do
    [[ -d $d && $(basename "$d") =~ ^rank[0-9]+$ ]] && ranks+=("$(basename "$d")")
  done
  ((${#ranks[@]})) || die "$dir: no rank<R> folders"
  mapfile -t ranks < <(printf '%s\n' "${ranks[@]}" | sort -t k -k2n)
  first=${ranks[0]}
  for r in "${ranks[@]}"; do
    for f in argv env mounts order; do
      [[ -f $dir/$r/$f ]] || die "$dir/$r/$f: missing"
    done
  done
  for r in "${ranks[@]:1}"; do
    [[ $(connector_of "$dir/$r/argv") == "$(connector_of "$dir/$first/argv")" ]] ||
      die "$r: connector JSON differs from $first's"
    for f in argv env mounts order; do
      cmp -s "$dir/$first/$f" "$dir/$r/$f" || die "$r: $f differs from $first's"
    done
  done
  log "${#ranks[@]} ranks identical"
}

case ${1:-} in
plan)
  shift
  plan "$@"
  ;;
compare)
  shift
  compare "$@"
  ;;
-h | --help)
  usage
  exit 0
  ;;
*) die "expected a subcommand: plan or compare (see --help)" ;;
esac
