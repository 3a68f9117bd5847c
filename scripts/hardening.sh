#!/usr/bin/env bash
# Hardening run (docs/HARDENING.md): a clang AddressSanitizer +
# UndefinedBehaviorSanitizer build of every C++ test and the libFuzzer
# targets in build-hardening/, the whole ctest suite under the sanitizers,
# then each fuzzer for FUZZ_SECONDS over its seed corpus.
#
#   scripts/hardening.sh                         build, test, fuzz (what CI runs)
#   scripts/hardening.sh build|test|fuzz         one stage
#   FUZZ_SECONDS=600 scripts/hardening.sh fuzz   the longer run (10 min per fuzzer)
#   FUZZ_TARGETS="chunk_header store_manifest" scripts/hardening.sh fuzz
#
# A fuzzer that crashes leaves its reproducer in build-hardening/fuzz/<target>/
# and this script exits 1; replay it with
#   build-hardening/tests/fuzz/fuzz_<target> <reproducer>
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${HARDENING_BUILD_DIR:-build-hardening}
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
JOBS=${JOBS:-2}
STAGE=${1:-all}
FUZZ_DIR="$BUILD_DIR/tests/fuzz"

# Sanitizer reports must fail the run and carry a stack.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ASAN_BASE="abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"

# LeakSanitizer stops the world through ptrace; where that is forbidden (some
# containers, or under a debugger) it aborts every run with a fatal error
# instead of reporting leaks. Probe once and run without it there, saying so.
lsan_works() {
  local probe="$BUILD_DIR/lsan-probe"
  mkdir -p "$BUILD_DIR"
  if [ ! -x "$probe" ]; then
    printf 'int main(){return 0;}\n' | clang -x c -fsanitize=address -o "$probe" - 2>/dev/null || return 1
  fi
  ASAN_OPTIONS=detect_leaks=1 "$probe" 2>/dev/null
}

configure_and_build() {
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    # -O1: sanitizer builds at -O2 cost CI minutes for no extra findings;
    # no NDEBUG so asserts stay on.
    CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
      -DKVTIER_SANITIZE=ON -DKVTIER_FUZZ=ON >/dev/null
  fi
  cmake --build "$BUILD_DIR" -j"$JOBS"
}

run_tests() {
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS"
}

# One fuzzer for FUZZ_SECONDS; its verdict lines go to its own report file
# (fuzzers run $JOBS at a time; the reports are printed in target order).
fuzz_one() {
  local name=$1 bin work artifacts log dict f
  bin="$FUZZ_DIR/fuzz_$name"
  work="$BUILD_DIR/fuzz/$name/corpus"        # inputs found this run (not committed)
  artifacts="$BUILD_DIR/fuzz/$name/"         # crash-*, leak-*, timeout-* reproducers
  log="$BUILD_DIR/fuzz/$name/last-run.log"
  mkdir -p "$work"
  dict=()
  [ -f "tests/fuzz/dict/$name.dict" ] && dict=(-dict="tests/fuzz/dict/$name.dict")
  if timeout $((FUZZ_SECONDS + 120)) "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts" "${dict[@]}" \
    "$work" "tests/fuzz/corpus/$name" >"$log" 2>&1; then
    printf 'fuzz %-18s ok   %8s runs, %5s edges, %ss\n' "$name" \
      "$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")" \
      "$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)" "$FUZZ_SECONDS"
    return 0
  fi
  echo "fuzz $name FAILED; last lines of $log:"
  tail -n 40 "$log"
  for f in "$artifacts"crash-* "$artifacts"leak-* "$artifacts"timeout-* "$artifacts"oom-*; do
    [ -f "$f" ] && echo "reproduce: $bin $f"
  done
  return 1
}

run_fuzzers() {
  local status=0 targets=${FUZZ_TARGETS:-} name bin running=0 reports
  if [ -z "$targets" ]; then
    for bin in "$FUZZ_DIR"/fuzz_*; do
      [ -x "$bin" ] && targets+=" ${bin##*/fuzz_}"
    done
  fi
  [ -n "$targets" ] || { echo "hardening: no fuzzers in $FUZZ_DIR (clang build?)" >&2; return 1; }
  reports=$(mktemp -d)
  for name in $targets; do
    if ((running >= JOBS)); then
      wait -n || status=1
      running=$((running - 1))
    fi
    fuzz_one "$name" >"$reports/$name" 2>&1 &
    running=$((running + 1))
  done
  while ((running > 0)); do
    wait -n || status=1
    running=$((running - 1))
  done
  for name in $targets; do cat "$reports/$name"; done
  rm -rf "$reports"
  return $status
}

set_asan_options() {
  [ -z "${ASAN_OPTIONS:-}" ] || return 0
  if lsan_works; then
    export ASAN_OPTIONS="detect_leaks=1:$ASAN_BASE"
  else
    echo "hardening: LeakSanitizer cannot run here (ptrace restricted?); leak checks off" >&2
    export ASAN_OPTIONS="detect_leaks=0:$ASAN_BASE"
  fi
}

status=0
case "$STAGE" in
  build) configure_and_build ;;
  test) set_asan_options && { run_tests || status=1; } ;;
  fuzz) set_asan_options && { run_fuzzers || status=1; } ;;
  all)
    configure_and_build
    set_asan_options
    run_tests || status=1
    run_fuzzers || status=1
    ;;
  *)
    echo "usage: scripts/hardening.sh [build|test|fuzz|all]" >&2
    exit 2
    ;;
esac
exit $status
