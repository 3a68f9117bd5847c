#!/usr/bin/env bash
# The Dockerfile's builder stage: builds `overlay` and `kvstore` on Debian and
# lays them out under one prefix so they run on the serving image's (older or
# different) userland.
#
#   build-tools.sh packages
#       prints the Debian packages scripts/setup.sh installs (one list, kept
#       there; the image build reuses it)
#   build-tools.sh install-packages
#       apt-get installs exactly those
#   build-tools.sh build --src DIR --build DIR --out PREFIX [--glibc-max X.Y]
#       builds the two tools into PREFIX/bin, copies every shared library they
#       need except glibc's into PREFIX/lib (found through DT_RPATH), and fails
#       if anything needs a glibc newer than X.Y (the serving image's)
set -euo pipefail
KVTIER_TOOL=build-tools
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=docker/lib.sh
. "$here/lib.sh"

setup_packages() {
  # Evaluates only the APT_PACKAGES=( ... ) assignment of setup.sh.
  local src
  src=$(awk '/^APT_PACKAGES=\(/ {f = 1} f {print} f && /\)/ {exit}' "$here/../scripts/setup.sh")
  [[ -n $src ]] || die "$here/../scripts/setup.sh: no APT_PACKAGES list"
  local APT_PACKAGES=()
  eval "$src"
  printf '%s\n' "${APT_PACKAGES[@]}"
}

build() {
  local src="" bdir="" out="" glibc_max=2.35
  while (($#)); do
    case $1 in
    --src | --build | --out | --glibc-max)
      (($# >= 2)) || die "$1 needs a value"
      case $1 in
      --src) src=$2 ;;
      --build) bdir=$2 ;;
      --out) out=$2 ;;
      --glibc-max) glibc_max=$2 ;;
      esac
      shift 2
      ;;
    *) die "unknown argument $(q "$1")" ;;
    esac
  done
  [[ -n $src && -n $bdir && -n $out ]] || die "build needs --src, --build and --out"
  [[ $glibc_max =~ ^[0-9]+\.[0-9]+$ ]] || die "--glibc-max $(q "$glibc_max"): expected X.Y"
  mkdir -p "$out/bin" "$out/lib"
  out=$(cd "$out" && pwd)

  # DT_RPATH (not RUNPATH) so the bundled libstdc++ also serves libfmt.
  cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_BUILD_RPATH="$out/lib" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags"
  cmake --build "$bdir" --target overlay kvstore -j"${JOBS:-2}"
  install -m 0755 "$bdir/patcher/overlay" "$bdir/gc/kvstore" "$out/bin/"

  local bin lib newest=0.0 v
  for bin in "$out/bin/overlay" "$out/bin/kvstore"; do
    while IFS= read -r lib; do
      case $(basename "$lib") in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
      *) cp -L "$lib" "$out/lib/" ;;
      esac
    done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
  done
  for bin in "$out"/bin/* "$out"/lib/*; do
    [[ -f $bin ]] || continue
    while IFS= read -r v; do
      [[ $(printf '%s\n%s\n' "$v" "$newest" | sort -V | tail -n1) == "$v" ]] && newest=$v
    done < <(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -u)
  done
  [[ $(printf '%s\n%s\n' "$newest" "$glibc_max" | sort -V | tail -n1) == "$glibc_max" ]] ||
    die "the tools need glibc $newest, the serving image has $glibc_max"
  "$out/bin/overlay" --help >/dev/null
  "$out/bin/kvstore" --help >/dev/null
  log "built overlay and kvstore into $out (needs glibc >= $newest)"
}

case ${1:-} in
packages) setup_packages ;;
install-packages)
  mapfile -t pkgs < <(setup_packages)
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
  rm -rf /var/lib/apt/lists/*
  ;;
build)
  shift
  build "$@"
  ;;
*) die "expected a subcommand: packages, install-packages or build" ;;
esac
