#!/usr/bin/env bash
# The Dockerfile's builder stage: builds `overlay` and `kvstore` on Debian and
# installs them under one prefix with `cmake --install`, so the image holds
# exactly the layout an install from source or the .deb gives.
#
#   build-tools.sh packages
#       prints the Debian packages the build needs (a subset of
#       scripts/setup.sh's, without the test and lint tools)
#   build-tools.sh install-packages
#       apt-get installs exactly those
#   build-tools.sh build --src DIR --build DIR --out PREFIX
#       configures with KVTIER_PORTABLE=ON (libstdc++ and libgcc linked
#       statically; fmt, toml++ and ISA-L copied to PREFIX/lib/kvtier), builds
#       both tools and the overlays' store library and installs them:
#       PREFIX/bin/{overlay,kvstore}, PREFIX/lib/kvtier/libkvtier_store.so,
#       PREFIX/share/kvtier/{anchors,overlays,docker}, bash completion, docs.
#       glibc is the running system's: PREFIX/share/kvtier/GLIBC_REQUIRED
#       records the newest glibc symbol version the tools need, and bake.sh
#       refuses an image whose glibc is older.
#   build-tools.sh --help | --version
#
# Exit: 0 done; 2 bad usage or a layout check failed; otherwise the failing
# build command's code.
set -euo pipefail
KVTIER_TOOL=build-tools
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=docker/lib.sh
. "$here/lib.sh"

# What the builder stage installs: the compiler, the build tools and the
# libraries' headers. The top CMakeLists finds GTest unconditionally, hence
# the gtest/gmock headers. No clang, shellcheck or Python: CI needs those,
# the image build does not. libssl-dev: keyed stores (docs/FORMAT.md 3.6):
# without libcrypto the store library cannot seal and the writer refuses a
# key; the install bundles libcrypto into lib/kvtier like ISA-L.
BUILD_PACKAGES=(
  g++ cmake ninja-build pkg-config
  libfmt-dev libcli11-dev libgtest-dev libgmock-dev
  libtomlplusplus-dev nlohmann-json3-dev libisal-dev libssl-dev
)

# The newest GLIBC_x.y symbol version any of the given ELF files needs.
glibc_required() {
  objdump -T "$@" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -uV | tail -n1
}

build() {
  local src="" bdir="" out=""
  parse_options '--src=src --build=bdir --out=out' "$@"
  ((${#KVTIER_REST[@]} == 0)) || other_arg "$0" "${KVTIER_REST[0]}"
  [[ -n $src && -n $bdir && -n $out ]] || die "build needs --src, --build and --out"
  [[ -f $src/CMakeLists.txt ]] || die "--src $(q "$src"): no CMakeLists.txt there"
  mkdir -p "$out"
  out=$(cd "$out" && pwd)

  cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_PORTABLE=ON \
    -DCMAKE_INSTALL_PREFIX="$out" >/dev/null
  cmake --build "$bdir" --target overlay kvstore kvtier_store -j"${JOBS:-2}"
  cmake --install "$bdir" --prefix "$out" --component runtime >/dev/null

  # The layout checks: no C runtime bundled, every library resolved.
  local tool f need bundled=()
  for f in "$out/lib/kvtier"/*; do [[ -e $f ]] && bundled+=("$f"); done
  for f in "${bundled[@]}"; do
    case $(basename "$f") in
    ld-linux* | libc.so* | libm.so* | libstdc++* | libgcc_s*)
      die "$f: the C/C++ runtime must not be bundled"
      ;;
    esac
  done
  for tool in overlay kvstore; do
    [[ -x $out/bin/$tool ]] || die "$out/bin/$tool: not installed"
    if ldd "$out/bin/$tool" | grep -q 'not found'; then
      die "$out/bin/$tool: unresolved libraries: $(ldd "$out/bin/$tool" | grep 'not found' | tr -s ' \t' ' ')"
    fi
    ! ldd "$out/bin/$tool" | grep -q 'libstdc++' || die "$out/bin/$tool: still loads libstdc++"
    env -i "$out/bin/$tool" --help >/dev/null || die "$out/bin/$tool does not run"
  done
  local store=$out/lib/kvtier/libkvtier_store.so
  [[ -f $store ]] || die "$store: not installed"
  ! ldd "$store" | grep -qE 'not found|libstdc\+\+' || die "$store: not portable: $(ldd "$store" | tr -s ' \t\n' ' ')"
  need=$(glibc_required "$out/bin/overlay" "$out/bin/kvstore" "${bundled[@]}")
  [[ -n $need ]] || die "cannot read the glibc symbol versions of the tools (objdump)"
  printf '%s\n' "$need" >"$out/share/kvtier/GLIBC_REQUIRED"
  log "installed overlay and kvstore into $out ($((${#bundled[@]})) bundled libraries; needs glibc >= $need)"
}

case ${1:-} in
packages) printf '%s\n' "${BUILD_PACKAGES[@]}" ;;
install-packages)
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${BUILD_PACKAGES[@]}"
  rm -rf /var/lib/apt/lists/*
  ;;
build)
  shift
  build "$@"
  ;;
-h | --help) help_text "$0" ;;
--version) print_version "$0" ;;
*) die "expected a subcommand: packages, install-packages or build (see --help)" ;;
esac
