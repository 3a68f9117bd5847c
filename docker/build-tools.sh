#!/usr/bin/env bash
# The Dockerfile's builder stage: builds `overlay` and `kvstore` on Debian and
# lays them out under one prefix so they run on the serving image whatever
# its userland.
#
#   build-tools.sh packages
#       prints the Debian packages scripts/setup.sh installs (one list, kept
#       there; the image build reuses it)
#   build-tools.sh install-packages
#       apt-get installs exactly those
#   build-tools.sh build --src DIR --build DIR --out PREFIX
#       builds the two tools into PREFIX/libexec, copies every shared library
#       they load, glibc and its loader included, into PREFIX/lib, and writes
#       PREFIX/bin/{overlay,kvstore} launchers that run them on that loader.
#       Debian's libstdc++ needs a newer glibc than the serving image may have
#       (bookworm's wants 2.36, Ubuntu 22.04 has 2.35), so none of the image's
#       C runtime is used.
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

# The launcher of one bundled tool. Python started by the tool (for
# --check-injected) is exec'd normally and sees none of this.
wrapper() {
  local tool=$1 loader=$2
  # shellcheck disable=SC2016 # $0 and $here expand when the launcher runs
  printf '%s\n' \
    '#!/bin/sh' \
    "# Runs $tool on the glibc and libraries it was built against (../lib)." \
    'here=$(dirname "$(readlink -f "$0")")' \
    "exec \"\$here/../lib/$loader\" --library-path \"\$here/../lib\" --argv0 \"\$0\" \"\$here/../libexec/$tool\" \"\$@\""
}

build() {
  local src="" bdir="" out=""
  while (($#)); do
    case $1 in
    --src | --build | --out)
      (($# >= 2)) || die "$1 needs a value"
      case $1 in
      --src) src=$2 ;;
      --build) bdir=$2 ;;
      --out) out=$2 ;;
      esac
      shift 2
      ;;
    *) die "unknown argument $(q "$1")" ;;
    esac
  done
  [[ -n $src && -n $bdir && -n $out ]] || die "build needs --src, --build and --out"
  mkdir -p "$out/bin" "$out/lib" "$out/libexec"
  out=$(cd "$out" && pwd)

  cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build "$bdir" --target overlay kvstore -j"${JOBS:-2}"
  install -m 0755 "$bdir/patcher/overlay" "$bdir/kvstore/kvstore" "$out/libexec/"

  local tool lib loader=""
  for tool in overlay kvstore; do
    while IFS= read -r lib; do
      [[ $(basename "$lib") != ld-linux* ]] || loader=$(basename "$lib")
      [[ $lib -ef $out/lib/$(basename "$lib") ]] || cp -L "$lib" "$out/lib/"
    done < <(ldd "$out/libexec/$tool" |
      awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}')
  done
  [[ -n $loader ]] || die "no ELF loader among the tools' libraries"
  for tool in overlay kvstore; do
    wrapper "$tool" "$loader" >"$out/bin/$tool"
    chmod 0755 "$out/bin/$tool"
    env -i "$out/bin/$tool" --help >/dev/null || die "$out/bin/$tool does not run"
  done
  log "built overlay and kvstore into $out, with $(find "$out/lib" -type f | wc -l) bundled libraries"
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
