# shellcheck shell=bash
# shellcheck disable=SC2034 # sets KVTIER_* globals for the scripts that source it
# Shared by the docker/ scripts. Sourced, never run.
#
# One place for: option parsing, the knob rules, where the pinned overlay
# order lives (anchors/<engine>-<version>/ORDER), what counts as an overlay
# artifact, and how the `overlay` CLI is called. The scripts differ only in
# what they do with the answers.

# Exit code for every refusal of the gate, the launch plan and bake's own
# checks: "bad input, nothing was touched".
KVTIER_EXIT_REFUSED=2

# A script's --help: its header comment without the shebang, the comment
# marks, shellcheck directives or any code.
help_text() {
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); if ($0 !~ /^shellcheck /) print; next } { exit }' "$1"
}

log() { printf '%s: %s\n' "${KVTIER_TOOL:-kvtier}" "$*" >&2; }
die() {
  log "$*"
  exit "$KVTIER_EXIT_REFUSED"
}

# A value quoted for an error message, so control characters stay visible.
q() { printf '%q' "$1"; }

# The last arms of every argument loop: --help, --version, and the error for
# an argument the script does not know.
#   *) other_arg "$0" "$1" ;;
other_arg() {
  case $2 in
  -h | --help)
    help_text "$1"
    exit 0
    ;;
  --version)
    print_version "$1"
    exit 0
    ;;
  *) die "unknown argument $(q "$2")$(suggest "$2" ${KVTIER_KNOWN_OPTIONS[@]+"${KVTIER_KNOWN_OPTIONS[@]}"} ${KVTIER_EXTRA_OPTIONS[@]+"${KVTIER_EXTRA_OPTIONS[@]}"} --help --version) (see --help)" ;;
  esac
}

# "; did you mean 'X'?" for WORD and the nearest of the CANDIDATES (at most
# two edits away, or one that starts with WORD), else nothing: the same help
# `overlay` and `kvstore` give for a mistyped command or option.
#   die "unknown command $(q "$w")$(suggest "$w" plan compare)"
suggest() {
  local word=$1
  shift
  (($#)) || return 0
  printf '%s\n' "$@" | awk -v w="$word" '
    function dist(a, b,   i, j, la, lb, c, d, cost) {
      la = length(a); lb = length(b)
      for (j = 0; j <= lb; j++) d[0, j] = j
      for (i = 1; i <= la; i++) {
        d[i, 0] = i
        for (j = 1; j <= lb; j++) {
          cost = substr(a, i, 1) == substr(b, j, 1) ? 0 : 1
          c = d[i - 1, j] + 1
          if (d[i, j - 1] + 1 < c) c = d[i, j - 1] + 1
          if (d[i - 1, j - 1] + cost < c) c = d[i - 1, j - 1] + cost
          if (i > 1 && j > 1 && substr(a, i, 1) == substr(b, j - 1, 1) && substr(a, i - 1, 1) == substr(b, j, 1) && d[i - 2, j - 2] + 1 < c) c = d[i - 2, j - 2] + 1
          d[i, j] = c
        }
      }
      return d[la, lb]
    }
    w != "" { n = dist(w, $0); if (index($0, w) == 1 && length(w) >= 3) n = 1
              if (n <= 2 && (best == "" || n < bestn)) { best = $0; bestn = n } }
    END { if (best != "") printf "; did you mean %s?", "\047" best "\047" }'
}

# The value options of a script or subcommand, one loop for all. SPEC names
# them as --option=variable words; each takes the next argument as its value,
# stored in that variable (printf -v: a caller's local works, bash scopes
# dynamically). Parsing stops at the first argument SPEC does not name (`--`,
# --help, --version, a flag, a mistake): it and all after it are left in
# KVTIER_REST for the caller to judge.
#   parse_options '--out=out --ranks=ranks' "$@"
#   set -- "${KVTIER_REST[@]}"
parse_options() {
  local _spec=" ${1//[[:space:]]/ } " _var
  shift
  while (($#)) && [[ $1 == --* && $_spec == *" $1="* ]]; do
    _var=${_spec#*" $1="}
    _var=${_var%% *}
    (($# >= 2)) || die "$1 needs a value"
    printf -v "$_var" '%s' "$2"
    shift 2
  done
  KVTIER_REST=("$@")
  read -ra KVTIER_KNOWN_OPTIONS <<<"$(sed -E 's/=[^ ]*//g' <<<"$_spec")"
}

# ---------------------------------------------------------------- knobs

# Is the knob in the caller's exported environment? Set-but-empty counts as
# set (and is then refused by the value rules).
knob_set() { [[ -n ${!1+x} ]]; }

# The knob rules live in one Python module that both overlays use
# (overlays/kv-offload-scope/kv_offload_knobs.py); this runs it with the
# engine's interpreter ($python when the caller named one and it runs here,
# else python3: the module is standard library only, any python3 agrees).
# Dies (exit 2) on the first bad knob. Sets KVTIER_KNOB to the effective 0|1
# and KVTIER_KNOBS to every knob name. Arguments go to `check` (the gate
# passes --restore-baked and then checks ORDER itself).
validate_knobs() {
  local contract out py=${python:-python3}
  contract=$(dirname "${BASH_SOURCE[0]}")/../overlays/kv-offload-scope/kv_offload_knobs.py
  [[ -f $contract ]] || die "$contract: missing (the knob rules)"
  command -v "$py" >/dev/null || py=python3
  out=$("$py" "$contract" check "$@" 2>&1) || die "$out"
  KVTIER_KNOB=$out
  mapfile -t KVTIER_KNOBS < <("$py" "$contract" names)
}

# ------------------------------------------------- engine, order, artifacts

# Picks anchors/<engine>-<version> under PREFIX: the one named, or else the
# newest release of the one engine present that is not an example
# (anchors/example-*: the example overlays' anchors ship beside the real
# engine's and never become the default; name them with --engine). With
# vllm-0.33.0 beside vllm-0.34.0 the default is 0.34.0; --engine vllm-0.33.0
# picks the older. Sets KVTIER_ENGINE_DIR (e.g. vllm-0.34.0), KVTIER_ENGINE
# (vllm) and KVTIER_ENGINE_VERSION (0.34.0).
resolve_engine() {
  local prefix=$1 named=${2:-} found=() d
  if [[ -n $named ]]; then
    [[ $named =~ ^[a-z][a-z0-9_]*-[0-9][A-Za-z0-9.+]*$ ]] ||
      die "--engine $(q "$named"): expected <engine>-<version>, e.g. vllm-1.2.3"
    [[ -d $prefix/anchors/$named ]] || die "$prefix/anchors/$named/ORDER: missing"
    found=("$named")
  else
    for d in "$prefix"/anchors/*/; do
      if [[ -d $d && $(basename "$d") != example-* ]]; then found+=("$(basename "$d")"); fi
    done
    ((${#found[@]} >= 1)) ||
      die "$prefix/anchors: expected an <engine>-<version> folder besides the example-* ones, found none; pass --engine"
    if ((${#found[@]} > 1)); then
      # Several releases of one engine: the newest (version order, not text).
      local engines
      engines=$(printf '%s\n' "${found[@]}" | sed 's/-[0-9].*//' | sort -u | wc -l)
      ((engines == 1)) ||
        die "$prefix/anchors: folders of ${engines} engines (${found[*]}); pass --engine"
      found=("$(printf '%s\n' "${found[@]}" | sort -V | tail -1)")
    fi
    [[ ${found[0]} =~ ^[a-z][a-z0-9_]*-[0-9][A-Za-z0-9.+]*$ ]] ||
      die "$prefix/anchors/${found[0]}: not an <engine>-<version> folder"
  fi
  KVTIER_ENGINE_DIR=${found[0]}
  KVTIER_ENGINE=${KVTIER_ENGINE_DIR%%-[0-9]*}
  KVTIER_ENGINE_VERSION=${KVTIER_ENGINE_DIR#"$KVTIER_ENGINE"-}
}

# The one engine the anchors under PREFIX are for (anchors/example-* aside):
# what a tree's release is looked up for when --engine is not given. Prints it.
anchors_engine() {
  local prefix=$1 d names=()
  for d in "$prefix"/anchors/*/; do
    d=$(basename "$d")
    [[ -d $prefix/anchors/$d && $d != example-* ]] || continue
    names+=("${d%%-[0-9]*}")
  done
  mapfile -t names < <(printf '%s\n' ${names[@]+"${names[@]}"} | sed '/^$/d' | sort -u)
  ((${#names[@]} == 1)) ||
    die "$prefix/anchors: expected the folders of one engine besides the example-* ones, found ${#names[@]} (${names[*]}); pass --engine"
  printf '%s' "${names[0]}"
}

# The release of the engine in a tree, read without importing it, by the
# rule `overlay` detects it with (patcher/locate.cpp): the Version: line of
# the tree's <engine>-*.dist-info/METADATA (what pip installed), else the
# version <engine>/_version.py assigns (a tree without metadata, as
# fixtures/fetch.py lays one out). Sets KVTIER_TREE_VERSION and
# KVTIER_TREE_VERSION_FROM (the file it came from), both empty when neither
# says; dies on dist-info folders that disagree (a broken install).
tree_release() {
  local root=$1 pkg=$2 metas=() m v
  KVTIER_TREE_VERSION="" KVTIER_TREE_VERSION_FROM=""
  mapfile -t metas < <(compgen -G "$root/$pkg-*.dist-info/METADATA" || true)
  for m in ${metas[@]+"${metas[@]}"}; do
    v=$(sed -nE 's/^Version:[[:space:]]*([^[:space:]]+)[[:space:]]*$/\1/p' "$m" | head -n1)
    [[ -n $v ]] || continue
    [[ -z $KVTIER_TREE_VERSION || $v == "$KVTIER_TREE_VERSION" ]] ||
      die "$root: two $pkg dist-info folders disagree ($KVTIER_TREE_VERSION_FROM says $KVTIER_TREE_VERSION, $m says $v): a broken install"
    KVTIER_TREE_VERSION=$v KVTIER_TREE_VERSION_FROM=$m
  done
  [[ -z $KVTIER_TREE_VERSION && -f $root/$pkg/_version.py ]] || return 0
  v=$(sed -nE "s/^(__version__|version)[^=]*=[[:space:]]*(version[[:space:]]*=[[:space:]]*)?['\"]([0-9][^'\"]*)['\"].*$/\3/p" \
    "$root/$pkg/_version.py" | head -n1)
  [[ -z $v ]] || KVTIER_TREE_VERSION=$v KVTIER_TREE_VERSION_FROM=$root/$pkg/_version.py
}

# anchors/<engine>-<version> for the tree ROOT (resolve_engine's globals):
# the one --engine names, which must then be the tree's release when the tree
# says one; else the tree's own release (tree_release), which must have an
# anchors folder: an unsupported release is refused (exit 2) naming the
# version found and the supported ones. A tree that says no release takes
# the only release there is; with several it needs --engine.
resolve_tree_engine() {
  local prefix=$1 named=$2 root=$3 pkg d supported=()
  if [[ -n $named ]]; then
    resolve_engine "$prefix" "$named"
    tree_release "$root" "$KVTIER_ENGINE"
    [[ -z $KVTIER_TREE_VERSION || $KVTIER_TREE_VERSION == "$KVTIER_ENGINE_VERSION" ]] ||
      die "$root: holds $KVTIER_ENGINE $KVTIER_TREE_VERSION ($KVTIER_TREE_VERSION_FROM), but --engine names $named"
    return 0
  fi
  pkg=$(anchors_engine "$prefix")
  for d in "$prefix/anchors/$pkg"-*/; do
    [[ -d $d ]] && supported+=("$(basename "$d")")
  done
  mapfile -t supported < <(printf '%s\n' "${supported[@]#"$pkg"-}" | sort -V)
  tree_release "$root" "$pkg"
  if [[ -z $KVTIER_TREE_VERSION ]]; then
    ((${#supported[@]} == 1)) ||
      die "$root: no $pkg-*.dist-info/METADATA or $pkg/_version.py says which $pkg release it is; pass --engine $pkg-VERSION (supported: ${supported[*]})"
    resolve_engine "$prefix" "$pkg-${supported[0]}"
    return 0
  fi
  [[ -d $prefix/anchors/$pkg-$KVTIER_TREE_VERSION ]] ||
    die "$root: $pkg $KVTIER_TREE_VERSION ($KVTIER_TREE_VERSION_FROM) is not a supported release; this kvtier supports $pkg ${supported[*]}"
  resolve_engine "$prefix" "$pkg-$KVTIER_TREE_VERSION"
}

# The release a bake recorded: the anchors folder its artifact list starts
# with (bake.sh lists anchors/<engine>-<version>/ORDER first). Prints it, or
# nothing when there is no list (yet): the gate and the launch plan then
# take resolve_engine's default, and refuse the missing list themselves.
baked_release() {
  local artifacts=$1 first
  [[ -f $artifacts ]] || return 0
  first=$(head -n1 "$artifacts")
  [[ $first =~ ^[0-9a-f]{64}\ \ anchors/([a-z][a-z0-9_]*-[0-9][A-Za-z0-9.+]*)/ORDER$ ]] || return 0
  printf '%s' "${BASH_REMATCH[1]}"
}

# Dies unless FILE is a recorded artifact list: a non-empty regular file. The
# wheel ships an empty one (so that pip removes the one the bake writes).
require_baked_list() {
  [[ -e $1 ]] || die "$1: missing; run bake.sh to record the artifact list (docs/DOCKER.md)"
  [[ -s $1 ]] || die "$1: empty: nothing baked yet; run bake.sh to record the artifact list (docs/DOCKER.md)"
}

# Reads the pinned apply order into KVTIER_ORDER (array): one overlay name a
# line; blank and '#' lines are skipped (as the overlay CLI does); no
# duplicates; at least one.
read_order() {
  local file=$1 line n=0 seen=" "
  KVTIER_ORDER=()
  [[ -f $file && ! -L $file ]] || die "$file: missing (or a symlink)"
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    line=${line#"${line%%[![:space:]]*}"}
    line=${line%"${line##*[![:space:]]}"}
    [[ -n $line && $line != \#* ]] || continue
    [[ $line =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "$file:$n: $(q "$line") is not an overlay name"
    [[ $seen != *" $line "* ]] || die "$file:$n: $line listed twice"
    seen+="$line "
    KVTIER_ORDER+=("$line")
  done <"$file"
  ((${#KVTIER_ORDER[@]})) || die "$file: empty"
}

# The value of a top-level `key = "value"` line in a manifest; empty if the
# key is absent or appears more than once.
manifest_value() {
  local file=$1 key=$2 hits
  hits=$(grep -E "^${key}[[:space:]]*=" "$file" || true)
  [[ -n $hits && $hits != *$'\n'* ]] || return 0
  sed -E "s/^${key}[[:space:]]*=[[:space:]]*[\"']([^\"']*)[\"'][[:space:]]*(#.*)?$/\1/" <<<"$hits"
}

# The manifest is the one ORDER names: its overlay/engine/engine_version
# fields agree with its file name and directory, and every fragment/source it
# references is a regular file in overlays/<name>/. Dies otherwise.
check_manifest() {
  local prefix=$1 name=$2 m ref
  m=$prefix/anchors/$KVTIER_ENGINE_DIR/$name.toml
  [[ -f $m && ! -L $m ]] || die "$m: missing (or a symlink)"
  [[ -d $prefix/overlays/$name && ! -L $prefix/overlays/$name ]] ||
    die "$prefix/overlays/$name: missing (or a symlink)"
  [[ $(manifest_value "$m" overlay) == "$name" ]] ||
    die "$m: overlay = $(q "$(manifest_value "$m" overlay)"), but ORDER names $name"
  [[ $(manifest_value "$m" engine) == "$KVTIER_ENGINE" ]] ||
    die "$m: engine is not \"$KVTIER_ENGINE\""
  [[ $(manifest_value "$m" engine_version) == "$KVTIER_ENGINE_VERSION" ]] ||
    die "$m: engine_version is not \"$KVTIER_ENGINE_VERSION\""
  while IFS= read -r ref; do
    [[ $ref =~ ^[A-Za-z0-9_][A-Za-z0-9._/-]*$ && $ref != *..* ]] ||
      die "$m: fragment/source $(q "$ref") is not a plain relative path"
    [[ -f $prefix/overlays/$name/$ref && ! -L $prefix/overlays/$name/$ref ]] ||
      die "$m: references $ref, but $prefix/overlays/$name/$ref is missing"
  done < <(sed -nE "s/^[[:space:]]*(fragment|source)[[:space:]]*=[[:space:]]*[\"']([^\"']+)[\"'].*$/\2/p" "$m")
}

# Prints, relative to PREFIX and one per line, every artifact of the pinned
# order: ORDER, each manifest, every file under each overlay's folder
# (byte-code caches excepted). Dies on a symlink among them.
list_artifacts() {
  local prefix=$1 name links
  printf '%s\n' "anchors/$KVTIER_ENGINE_DIR/ORDER"
  for name in "${KVTIER_ORDER[@]}"; do
    printf '%s\n' "anchors/$KVTIER_ENGINE_DIR/$name.toml"
    links=$(cd "$prefix" && find "overlays/$name" -type l -print -quit)
    [[ -z $links ]] || die "$prefix/$links: symlinks are not allowed among overlay artifacts"
    (cd "$prefix" && find "overlays/$name" -name __pycache__ -prune -o -type f ! -name '*.pyc' -print) |
      LC_ALL=C sort
  done
}

# ------------------------------------------------ overlays that rebuild binaries

# Does the overlay rebuild an engine binary (its manifest has [[built_files]],
# e.g. vllm-fs-durable: vllm/fs_io_C.abi3.so)? On a wheel install that needs
# the engine's pinned C/C++ sources, a compiler and Python.h, so bake.sh
# applies such overlays only with --rebuild-binaries.
rebuilds_binary() {
  grep -q '^\[\[built_files\]\]' "$1/anchors/$KVTIER_ENGINE_DIR/$2.toml"
}

# Where bake.sh records the overlays it applied (ORDER's names, in order):
# beside the artifact list, ARTIFACTS.sha256 -> ARTIFACTS.baked.
baked_file() { printf '%s.baked' "${1%.sha256}"; }

# Reads what bake.sh applied into KVTIER_BAKED (array) and checks it against
# KVTIER_ORDER: names of ORDER in ORDER's order, every overlay that rebuilds
# no binary included. A missing file means the whole ORDER (bakes before the
# record existed applied all of it).
read_baked() {
  local prefix=$1 file=$2 line i=0 name
  KVTIER_BAKED=()
  if [[ ! -e $file ]]; then
    KVTIER_BAKED=("${KVTIER_ORDER[@]}")
    return 0
  fi
  [[ -f $file && ! -L $file ]] || die "$file: not a regular file"
  while IFS= read -r line || [[ -n $line ]]; do
    [[ -n $line ]] || continue
    while ((i < ${#KVTIER_ORDER[@]})) && [[ ${KVTIER_ORDER[i]} != "$line" ]]; do
      rebuilds_binary "$prefix" "${KVTIER_ORDER[i]}" ||
        die "$file: lacks ${KVTIER_ORDER[i]} (only overlays that rebuild a binary may be left out of a bake)"
      i=$((i + 1))
    done
    ((i < ${#KVTIER_ORDER[@]})) || die "$file: $(q "$line") is not in ORDER (or out of ORDER's order)"
    KVTIER_BAKED+=("$line")
    i=$((i + 1))
  done <"$file"
  for name in "${KVTIER_ORDER[@]:i}"; do
    rebuilds_binary "$prefix" "$name" ||
      die "$file: lacks $name (only overlays that rebuild a binary may be left out of a bake)"
  done
  ((${#KVTIER_BAKED[@]})) || die "$file: empty"
}

# What bake.sh pins and gate.sh checks: the artifacts, and the overlays'
# store library (storeio/, PREFIX/lib/kvtier) when the prefix has one. Not
# part of the build id (build_id hashes the artifacts only).
list_baked() {
  list_artifacts "$1"
  store_lib_rel "$1"
}

# The overlays' store library under a data folder (data_dir_of), relative to
# it: lib/kvtier/ of an install (share/kvtier/../../lib/kvtier) or of a flat
# prefix (a folder holding anchors/, overlays/ and lib/kvtier/). Prints it
# with a newline, or nothing when there is none (a repository: the bake says
# so, and the gate refuses knob 1).
store_lib_rel() {
  local rel
  for rel in lib/kvtier/$KVTIER_STORE_LIB_NAME ../../lib/kvtier/$KVTIER_STORE_LIB_NAME; do
    if [[ -f $1/$rel && ! -L $1/$rel ]]; then
      printf '%s\n' "$rel"
      return 0
    fi
  done
}
KVTIER_STORE_LIB_NAME=libkvtier_store.so

# Every kv_store_format/native.py of the engine package in TREE (where the
# patched writer loads the store library from), one a line. Only the
# engine's own folder: a kvtier wheel installed in the same site-packages
# carries the overlay's copy of native.py too, which is not the tree's.
engine_natives() {
  local root=$1 pkg=$2
  [[ -d $root/$pkg ]] || return 0
  find "$root/$pkg" -path '*/kv_store_format/native.py' -type f | LC_ALL=C sort
}

# What bake.sh installed beside a native.py, recorded in that folder for
# `overlay revert` (which removes the files whose bytes still match, with
# the folder the overlay created): sha256sum lines, one per file.
KVTIER_INSTALLED_RECORD=.overlay-installed

# ----------------------------------------------------------- overlay CLI

# Arguments every `overlay` call shares: the tree, the manifests of this
# engine and the overlays to apply or check (default: the pinned order; bake
# and gate pass the baked ones).
overlay_common_args() {
  local prefix=$1 root=$2 IFS=,
  shift 2
  (($#)) || set -- "${KVTIER_ORDER[@]}"
  KVTIER_OVERLAY_ARGS=(--root "$root" --manifests "$prefix/anchors/$KVTIER_ENGINE_DIR"
    --overlays "$*")
}

# The folder holding anchors/ and overlays/ for a --prefix: the prefix itself
# (the repository, a flat prefix) or, for an installed tree (cmake --install,
# the image, the .deb), PREFIX/share/kvtier. Prints it.
data_dir_of() {
  local prefix=$1
  if [[ ! -d $prefix/anchors && -d $prefix/share/kvtier/anchors ]]; then
    printf '%s' "$prefix/share/kvtier"
  else
    printf '%s' "$prefix"
  fi
}

# Picks the overlay binary: the one named, <prefix>/bin/overlay, the
# installed <prefix>/../../bin/overlay (prefix = share/kvtier), or PATH.
resolve_overlay_bin() {
  local prefix=$1 named=${2:-}
  if [[ -n $named ]]; then
    KVTIER_OVERLAY=$named
  elif [[ -x $prefix/bin/overlay ]]; then
    KVTIER_OVERLAY=$prefix/bin/overlay
  elif [[ $(basename "$prefix") == kvtier && -x $prefix/../../bin/overlay ]]; then
    KVTIER_OVERLAY=$(cd "$prefix/../../bin" && pwd)/overlay
  else
    KVTIER_OVERLAY=$(command -v overlay || true)
  fi
  [[ -n $KVTIER_OVERLAY && -x $KVTIER_OVERLAY ]] ||
    die "overlay tool not found (pass --overlay PATH or install it as $prefix/bin/overlay)"
}

# The installed tools link this system's glibc (docker/build-tools.sh): a
# system older than PREFIX/GLIBC_REQUIRED says is refused here, by name,
# rather than by the loader at the first tool call.
check_glibc() {
  local prefix=$1 need have
  [[ -f $prefix/GLIBC_REQUIRED ]] || return 0
  need=$(<"$prefix/GLIBC_REQUIRED")
  [[ $need =~ ^[0-9]+\.[0-9]+$ ]] || die "$prefix/GLIBC_REQUIRED: expected a version like 2.34, got $(q "$need")"
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null) || die "getconf GNU_LIBC_VERSION failed: cannot tell this system's glibc"
  have=${have##* }
  [[ $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1) == "$need" ]] ||
    die "the installed tools need glibc >= $need; this system has $have (rebuild them on an older distribution)"
}

# The site-packages folder that holds `vllm` for the given python, found
# without importing vLLM (that would pull in torch).
discover_root() {
  local python=$1 pkg=$2 root
  root=$("$python" -c "import importlib.util, os, sys
s = importlib.util.find_spec(sys.argv[1])
print(os.path.dirname(os.path.dirname(s.origin)) if s and s.origin else '')" "$pkg" 2>/dev/null) ||
    die "$python: cannot run it to find the installed $pkg"
  [[ -n $root && -d $root/$pkg ]] || die "$python: $pkg is not installed"
  printf '%s' "$root"
}

# The options bake.sh and gate.sh share (see bake.sh's header). Sets the
# globals prefix, engine, overlay_bin, root, python and artifacts.
#   parse_tree_args SCRIPT "$@"
# shellcheck disable=SC2034
parse_tree_args() {
  local script=$1
  shift
  prefix=$(cd "$(dirname "$script")/.." && pwd)
  engine="" overlay_bin="" root="" python="" artifacts=""
  parse_options '--prefix=prefix --engine=engine --overlay=overlay_bin --root=root --python=python
    --artifacts=artifacts' "$@"
  ((${#KVTIER_REST[@]} == 0)) || other_arg "$script" "${KVTIER_REST[0]}"
}

# Makes $prefix absolute and points it at the data folder (data_dir_of).
resolve_prefix() {
  [[ -d $prefix ]] || die "--prefix $(q "$prefix"): does not exist (or is not a folder)"
  prefix=$(cd "$(data_dir_of "$prefix")" && pwd)
}

# The build id of the artifacts under PREFIX: kvtier-<16 hex> of the sha256
# of the artifact list (what bake.sh records as ARTIFACTS.sha256, and what
# launch.sh hands the writer as GLM53_KV_OFFLOAD_BUILD_ID). The C++ tools'
# --version prints the same id, computed at build time by cmake/build_id.sh.
build_id() {
  local prefix=$1 engine=${2:-} listing sum
  resolve_engine "$prefix" "$engine"
  read_order "$prefix/anchors/$KVTIER_ENGINE_DIR/ORDER"
  listing=$(list_artifacts "$prefix")
  local files=()
  mapfile -t files <<<"$listing"
  sum=$(cd "$prefix" && sha256sum -- "${files[@]}" | sha256sum)
  printf 'kvtier-%s' "${sum:0:16}"
}

# --version, the same shape for every tool and script:
#   NAME VERSION
#   <engine>-<version> build kvtier-<16 hex>     (one line per anchors folder
#                                                 that ships: not example-*)
# VERSION is the VERSION file beside anchors/ (the repository's, or
# share/kvtier/VERSION when installed); the build ids are build_id's.
print_version() {
  local script=$1 prefix d version
  prefix=$(data_dir_of "$(cd "$(dirname "$script")/.." && pwd)")
  version=$(cat "$prefix/VERSION" 2>/dev/null) || version=unknown
  printf '%s %s\n' "$(basename "$script" .sh)" "$version"
  for d in "$prefix"/anchors/*/; do
    [[ -f $d/ORDER && $(basename "$d") != example-* ]] || continue
    d=$(basename "$d")
    printf '%s build %s\n' "$d" "$(build_id "$prefix" "$d")"
  done
}
