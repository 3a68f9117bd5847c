#!/usr/bin/env bash
# Launch configuration: what each rank's container gets, as files a launcher
# reads, so every rank is fed the same bytes except where vLLM needs a
# difference.
#
#   launch.sh plan --ranks 0,1 --out DIR [--master-addr HOST] [--master-port PORT]
#                  [--prefix P] [--engine E] [--artifacts FILE] [--base-env FILE]
#                  -- SERVE_ARGV...
#   launch.sh compare DIR
#   launch.sh --help | --version
#
# A rank is one node of a multi-node tensor-parallel group. plan reads the
# GLM53_KV_OFFLOAD* knobs from the environment (same rules as the gate) and
# writes DIR/rank<R>/{argv,env,mounts,order}: argv one argument a line, env
# KEY=VALUE lines (the base env file's lines, in order), mounts
# HOST:CONTAINER:MODE lines, order the overlays the bake applied
# (ARTIFACTS.baked), in the pinned order.
#   knob 0: argv and env are the base, byte for byte; no mounts.
#   knob 1: argv gains --kv-transfer-config with one connector JSON (the same
#           for every rank; with GLM53_KV_OFFLOAD_RESTORE=1, accepted only when
#           ORDER lists kv-offload-restore, it names the LocalStoreTier
#           secondary tier restore reads through); env drops expandable_segments:True from
#           PYTORCH_CUDA_ALLOC_CONF and gains the knobs the caller exported
#           (plus GLM53_KV_OFFLOAD_BUILD_ID from the baked artifact list when
#           unset); the store folder is mounted read-write at the same path.
#   more than one rank (ranks 0..N-1, --master-addr required): every argv
#           gains `--nnodes N --master-addr HOST --master-port PORT` (default
#           port 29501, vLLM's), then `--node-rank R`, and `--headless` on
#           every rank but 0, as vLLM 0.33.0's and 0.34.0's arg_utils and
#           `vllm serve` define them. These are the only per-rank differences.
# compare checks that every rank of DIR got identical files except exactly
# those per-rank arguments (the connector JSON first, by name); a launcher
# runs it before any docker/ssh call. --engine defaults to the release
# bake.sh baked (the anchors folder the artifact list names), else the newest.
#
# Exit: 0 written / identical; 2 refused (nothing written) or ranks differ.
set -euo pipefail
KVTIER_TOOL=launch
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/lib.sh"

usage() { help_text "$0"; }

# The connector config for knob 1. Only validated integers go into it, so
# plain printf is exact. offload_prompt_only=false so decoded tokens are
# stored too.
# The boot guard: the spec is named through spec_module_path, a module only
# the kv-offload-store-local overlay creates. A vLLM without the overlays
# stops at boot with "No module named ...offloading.kv_store_local" instead
# of silently running stock CPU offloading (docs/DEPLOY.md).
# Secondary tiers: none for the store alone (the worker-local writer is the
# disk tier; vLLM's scheduler-side fs tier would write one node's bytes for
# every rank). With GLM53_KV_OFFLOAD_RESTORE=1 exactly one, LocalStoreTier,
# which reads each rank's own store back (docs/overlays/kv-offload-restore.md;
# the engine refuses to boot restore without it).
KVTIER_SPEC_NAME=StoreLocalOffloadingSpec
KVTIER_SPEC_MODULE=vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local
KVTIER_RESTORE_TIER=LocalStoreTier
KVTIER_RESTORE_MODULE=vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_restore_tier
connector_json() {
  local cpu_gb=$1 restore=$2 tiers=""
  ((restore == 0)) || tiers=$(printf '{"type":"%s","module_path":"%s"}' "$KVTIER_RESTORE_TIER" "$KVTIER_RESTORE_MODULE")
  printf '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"%s","spec_module_path":"%s","cpu_bytes_to_use":%d,"blocks_per_chunk":1,"offload_prompt_only":false,"secondary_tiers":[%s]}}' \
    "$KVTIER_SPEC_NAME" "$KVTIER_SPEC_MODULE" "$((cpu_gb * 1024 * 1024 * 1024))" "$tiers"
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

# The serve argv's --prefix-caching-hash-algo value (the default of vLLM 0.33.0
# and 0.34.0, sha256, when absent).
hash_algo() {
  local algo=sha256
  while (($#)); do
    case $1 in
    --prefix-caching-hash-algo) algo=${2-} && shift ;;
    --prefix-caching-hash-algo=*) algo=${1#*=} ;;
    esac
    shift
  done
  printf '%s' "$algo"
}

plan() {
  local ranks="" out="" prefix engine="" artifacts="" base_env="" master_addr="" master_port=29501
  prefix=$(cd "$(dirname "$0")/.." && pwd)
  parse_options '--ranks=ranks --out=out --prefix=prefix --engine=engine --artifacts=artifacts
    --base-env=base_env --master-addr=master_addr --master-port=master_port' "$@"
  set -- "${KVTIER_REST[@]}"
  if (($#)); then
    [[ $1 == -- ]] || die "unknown argument $(q "$1") (see --help)"
    shift
  fi
  local argv=("$@")

  # Everything is checked before anything is written. RESTORE=1 is judged
  # against this prefix's ORDER below, as the gate does (the knob module alone
  # cannot see what the prefix bakes).
  validate_knobs --restore-baked
  [[ $ranks =~ ^[0-9]{1,4}(,[0-9]{1,4})*$ ]] || die "--ranks $(q "$ranks"): expected e.g. 0,1"
  local rank_list seen=" " r
  IFS=, read -ra rank_list <<<"$ranks"
  for r in "${rank_list[@]}"; do
    r=$((10#$r))
    [[ $seen != *" $r "* ]] || die "--ranks: rank $r listed twice"
    seen+="$r "
  done
  local nnodes=${#rank_list[@]}
  if ((nnodes > 1)); then
    [[ $(printf '%s\n' "${rank_list[@]}" | sort -n | tr '\n' ' ') == "$(seq -s ' ' 0 $((nnodes - 1))) " ]] ||
      die "--ranks $(q "$ranks"): a multi-node group needs ranks 0..$((nnodes - 1))"
    [[ -n $master_addr ]] || die "--master-addr HOST is required with more than one rank (rank 0's address)"
    [[ $master_addr =~ ^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$ ]] || die "--master-addr $(q "$master_addr"): not a host name or address"
    if [[ ! $master_port =~ ^[1-9][0-9]{0,4}$ ]] || ((master_port > 65535)); then
      die "--master-port $(q "$master_port"): must be an integer 1..65535"
    fi
  fi
  [[ -n $out ]] || die "--out DIR is required"
  [[ ! -e $out ]] || die "$out: already exists; launch.sh writes a fresh folder"
  [[ -d $(dirname "$out") ]] || die "$out: its parent folder does not exist"
  ((${#argv[@]})) || die "no serve argv after --"
  local a
  for a in "${argv[@]}"; do
    [[ $a != *$'\n'* ]] || die "argv: $(q "$a") contains a newline"
  done
  resolve_prefix
  # The release bake.sh baked into this prefix, unless --engine names one.
  resolve_engine "$prefix" "${engine:-$(baked_release "${artifacts:-$prefix/ARTIFACTS.sha256}")}"
  read_order "$prefix/anchors/$KVTIER_ENGINE_DIR/ORDER"
  # What the bake applied (ARTIFACTS.baked; all of ORDER before a bake): the
  # order file lists only those, never an overlay left out of the image.
  read_baked "$prefix" "$(baked_file "${artifacts:-$prefix/ARTIFACTS.sha256}")"
  local restore=0
  if [[ ${GLM53_KV_OFFLOAD_RESTORE-} == 1 ]]; then
    [[ " ${KVTIER_ORDER[*]} " == *" kv-offload-restore "* ]] ||
      die "GLM53_KV_OFFLOAD_RESTORE=1 is refused: the kv-offload-restore overlay is not baked (not in $prefix/anchors/$KVTIER_ENGINE_DIR/ORDER)"
    restore=$KVTIER_KNOB
  fi

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

  # The multi-node arguments are the launcher's: one in the base argv would
  # be duplicated or contradicted.
  if ((nnodes > 1)); then
    for a in "${argv[@]}"; do
      case $a in
      --nnodes | --nnodes=* | -n | --node-rank | --node-rank=* | -r | --headless | --master-addr | --master-addr=* | --master-port | --master-port=*)
        die "argv already has $a; with several ranks launch.sh sets --nnodes, --node-rank, --master-addr, --master-port and --headless"
        ;;
      esac
    done
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
    # Restore needs block hashes that mean the same after a restart: vLLM
    # seeds xxhash variants per process unless PYTHONHASHSEED is set (the
    # engine refuses that boot; refused here first, before any container).
    if ((restore)) && [[ $(hash_algo "${argv[@]}") == xxhash* ]]; then
      local seeded=0
      for a in "${env_lines[@]}"; do [[ $a != PYTHONHASHSEED=* ]] || seeded=1; done
      ((seeded)) ||
        die "GLM53_KV_OFFLOAD_RESTORE=1 with --prefix-caching-hash-algo $(hash_algo "${argv[@]}") needs PYTHONHASHSEED in the base env (xxhash block hashes change at every restart without it)"
    fi
    argv+=(--kv-transfer-config "$(connector_json "$GLM53_KV_OFFLOAD_CPU_GB" "$restore")")

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
      [[ -s $artifacts ]] ||
        die "$artifacts: $([[ -e $artifacts ]] && echo "empty (nothing baked yet)" || echo missing); bake first (docker/bake.sh, docs/DOCKER.md \"Launch configuration\") or set GLM53_KV_OFFLOAD_BUILD_ID (the store namespace is fenced by it)"
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
    {
      printf '%s\n' "${argv[@]}"
      if ((nnodes > 1)); then
        printf '%s\n' --nnodes "$nnodes" --master-addr "$master_addr" --master-port "$master_port" --node-rank "$r"
        ((r == 0)) || printf '%s\n' --headless
      fi
    } >"$tmp/rank$r/argv"
    # Knob 0: the base env file's bytes, untouched.
    if ((KVTIER_KNOB == 0)) && [[ -n $base_env ]]; then
      cp "$base_env" "$tmp/rank$r/env"
    else
      { ((${#env_lines[@]} == 0)) || printf '%s\n' "${env_lines[@]}"; } >"$tmp/rank$r/env"
    fi
    { ((${#mounts[@]} == 0)) || printf '%s\n' "${mounts[@]}"; } >"$tmp/rank$r/mounts"
    printf '%s\n' "${KVTIER_BAKED[@]}" >"$tmp/rank$r/order"
  done
  mv "$tmp" "$out"
  log "wrote ${#rank_list[@]} rank plans to $out (knob $KVTIER_KNOB)"
}

# The argument after --kv-transfer-config in an argv file, if any.
connector_of() { sed -n '/^--kv-transfer-config$/{n;p;q}' "$1"; }

# The per-rank tail of an argv file that plan wrote for rank R of a
# multi-node group: `--node-rank R`, then `--headless` unless R is 0.
rank_tail() {
  local r=$1
  printf '%s\n' --node-rank "$r"
  ((r == 0)) || printf '%s\n' --headless
}

compare() {
  (($# == 1)) || die "usage: launch.sh compare DIR"
  local dir=$1 ranks=() d first f r n tail lines
  [[ -d $dir ]] || die "$dir: does not exist (or is not a folder)"
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
  local work
  work=$(mktemp -d)
  # shellcheck disable=SC2064 # expand now: the folder is local
  trap "rm -rf '$work'" RETURN
  n=${#ranks[@]}
  for r in "${ranks[@]}"; do
    cp "$dir/$r/argv" "$work/$r"
    ((n > 1)) || continue
    # Strip exactly this rank's tail; anything else left over is a difference.
    tail=$(rank_tail "${r#rank}")
    lines=$(grep -c '' <<<"$tail")
    [[ $(tail -n "$lines" "$dir/$r/argv") == "$tail" ]] ||
      die "$r: argv does not end with its own $(tr '\n' ' ' <<<"$tail")(multi-node rank arguments)"
    head -n "-$lines" "$dir/$r/argv" >"$work/$r"
    [[ $(sed -n '/^--nnodes$/{n;p;q}' "$work/$r") == "$n" ]] || die "$r: argv lacks --nnodes $n for $n ranks"
  done
  for r in "${ranks[@]:1}"; do
    [[ $(connector_of "$dir/$r/argv") == "$(connector_of "$dir/$first/argv")" ]] ||
      die "$r: connector JSON differs from $first's"
    cmp -s "$work/$first" "$work/$r" || die "$r: argv differs from $first's (beyond --node-rank/--headless)"
    for f in env mounts order; do
      cmp -s "$dir/$first/$f" "$dir/$r/$f" || die "$r: $f differs from $first's"
    done
  done
  log "${#ranks[@]} ranks identical but for their rank arguments"
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
--version)
  print_version "$0"
  exit 0
  ;;
*) die "expected a subcommand: plan or compare$(suggest "${1:-}" plan compare) (see --help)" ;;
esac
