#!/usr/bin/env bash
# Installs the dependencies, builds grove-node and runs every test. This is the one command that
# CI (.ci/run) and README.md use; it works from any directory. CI (a fresh Debian 12, 2 cores)
# passed 234ea97 in 31 min; a clean clone of d162681 on the development machine, no ccache, took
# 40m40s: (b) 8m26s build + 5m56s ctest, (c) 9m51s build + 6m20s ctest, (t) 5m57s build + 3m08s
# ctest, (d) fuzz slices 1m02s.
#
#   (a) scripts/install-deps.sh                     (apt is skipped when everything is installed)
#   (b) build/       RelWithDebInfo: build, ctest; a 3-minute soak (bench/soak.py: kills, stops,
#                    restarts, joins and trainer kills on 8 nodes, NoLoCo and DiLoCo in turn)
#   (c) build-asan/  clang, ASan + UBSan and libFuzzer's coverage (assertions on): build, ctest
#                    (all but labels netns, long)
#   (t) build-tsan/  GCC, ThreadSanitizer (assertions on): the unit and in-process test binaries
#                    only, ctest label unit (not: sim, one thread in virtual time; process, netns,
#                    trainer, other processes; fuzz); third-party libraries built without it are
#                    named in tests/tsan.supp
#   (d) build-asan/'s fuzz targets (libFuzzer): each for a short slice over a fresh copy of its
#                    seed corpus (in fuzz-corpus/); any crash fails the script
#
# Environment:
#   GROVE_TEST_QUICK=1       run (a) and (b) only, for local iteration
#   GROVE_TEST_ONLY=tsan     run (a) and (t) only
#   GROVE_FUZZ_SECONDS=N     seconds per fuzz target in (d) (default 10; the node's small
#                            stateless decoders in fuzz_short get a third of it)
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

readonly jobs=2
readonly fuzz_seconds=${GROVE_FUZZ_SECONDS:-10}
# One text or file in, no protocol core behind it: these cover their decoder within seconds, and a
# shorter slice keeps CI short.
readonly fuzz_short=" run_config checkpoint status trainer "
readonly quick=${GROVE_TEST_QUICK:-0}
readonly only=${GROVE_TEST_ONLY:-}
# Sanitizer builds keep assert() (RelWithDebInfo's default flags add -DNDEBUG), and compile
# with -Og and line tables only: with ASan + UBSan, GCC's -Og compiles the Asio-heavy files ~30%
# faster than -O1 (transport/host.cpp: 20 s against 28.5 s), and the sanitizer builds are the
# longest steps of CI.
readonly checked_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-Og -g1")

step() { printf '\n==== [%s] %s\n' "$(date '+%F %T')" "$*"; }

# A build directory configured with another generator or compiler cannot be reconfigured in
# place: drop its cache (the objects are rebuilt, mostly from ccache).
drop_stale_cache() {
  local dir=$1 pattern
  shift
  [[ -f "$dir/CMakeCache.txt" ]] || return 0
  for pattern in "$@"; do
    if ! grep -q -- "$pattern" "$dir/CMakeCache.txt"; then
      echo "test-all: $dir was configured differently (no '$pattern'); dropping its cache"
      rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
      return 0
    fi
  done
}

configure_and_build() {
  local dir=$1
  shift
  drop_stale_cache "$dir" '^CMAKE_GENERATOR:INTERNAL=Ninja$'
  cmake -S . -B "$dir" -G Ninja "$@"
  cmake --build "$dir" -j "$jobs"
}

started=$SECONDS
step "(a) install dependencies"
bash scripts/install-deps.sh

tsan() {
  step "(t) build-tsan/: configure and build (ThreadSanitizer)"
  drop_stale_cache build-tsan '^CMAKE_GENERATOR:INTERNAL=Ninja$'
  cmake -S . -B build-tsan -G Ninja "${checked_flags[@]}" \
    -DGROVE_TSAN=ON -DGROVE_BUILD_BENCH=OFF -DGROVE_WITH_TORCH=OFF
  cmake --build build-tsan -j "$jobs" --target transport_tests dht_tests optim_tests gossip_tests node_tests
  step "(t) build-tsan/: ctest -L unit"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" -L unit
}
if [[ "$only" == tsan ]]; then
  tsan
  step "all done in $((SECONDS - started)) s"
  exit 0
fi

step "(b) build/: configure and build (RelWithDebInfo)"
configure_and_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
step "(b) build/: ctest"
ctest --test-dir build --output-on-failure -j "$jobs"
step "(b) soak: 3 minutes of chaos on 8 nodes over emulated 100 Mbit/s, 20-80 ms links with 1% packet loss (bench/soak.py), after a 1-minute baseline"
/usr/bin/python3 bench/soak.py build/node/grove-node --minutes 3 --baseline-minutes 1 --seed 3

if [[ "$quick" == 1 ]]; then
  step "GROVE_TEST_QUICK=1: skipping the sanitizer build (c) and fuzzing (d)"
  step "all done in $((SECONDS - started)) s"
  exit 0
fi

step "(c) build-asan/: configure and build (clang, ASan + UBSan, libFuzzer targets)"
drop_stale_cache build-asan '^CMAKE_CXX_COMPILER:.*clang++' '^GROVE_FUZZ:BOOL=ON$' \
  '^CMAKE_GENERATOR:INTERNAL=Ninja$'
# One sanitizer build for the tests and the fuzz targets (clang's -Og is -O1): everything is
# compiled once, with ASan, UBSan and libFuzzer's coverage instrumentation.
CXX=clang++ cmake -S . -B build-asan -G Ninja "${checked_flags[@]}" \
  -DGROVE_SANITIZE=ON -DGROVE_FUZZ=ON -DGROVE_BUILD_BENCH=OFF -DGROVE_WITH_TORCH=OFF
cmake --build build-asan -j "$jobs"
step "(c) build-asan/: ctest (without the tests labelled netns or long: they run in (b))"
# The namespace tests (label netns: NAT routers, miniupnpd, Avahi) drive the same code paths as
# the loopback process tests, which do run here: relays, dial-backs, address-less peers; label
# long marks a second run of code another process test covers here (TrainerProcess.diloco).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE "netns|long"

tsan

work=fuzz-corpus  # git-ignored: working corpora, logs and crash artifacts
failed=()
found=0
for bin in build-asan/tests/fuzz/fuzz_*; do
  [[ -f "$bin" && -x "$bin" ]] || continue
  found=$((found + 1))
  name=${bin##*/fuzz_}
  seeds=tests/fuzz/corpus/$name
  if [[ ! -d "$seeds" ]]; then
    echo "test-all: no seed corpus $seeds for $bin" >&2
    exit 1
  fi
  rm -rf "${work:?}/$name" "$work/artifacts/$name"
  mkdir -p "$work/$name" "$work/artifacts/$name"
  cp -R "$seeds/." "$work/$name/"
  log=$work/$name.log
  seconds=$fuzz_seconds
  if [[ "$fuzz_short" == *" $name "* ]]; then seconds=$(((fuzz_seconds + 2) / 3)); fi
  step "(d) fuzz_$name for ${seconds} s over a copy of $seeds (log: $log)"
  if UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$bin" \
    -max_total_time="$seconds" -max_len=70000 -rss_limit_mb=2048 -timeout=25 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/$name/" "$work/$name" >"$log" 2>&1; then
    grep -E '^(Done|stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb))' \
      "$log" || true
  else
    tail -n 80 "$log"
    echo "test-all: fuzz_$name FAILED; reproducers:"
    ls -l "$work/artifacts/$name/"
    echo "  replay one with: $bin <reproducer>"
    failed+=("$name")
  fi
done
if ((found == 0)); then
  echo "test-all: no fuzz targets in build-asan/tests/fuzz" >&2
  exit 1
fi
if ((${#failed[@]})); then
  step "FAILED: fuzzers found crashes in: ${failed[*]}"
  exit 1
fi

step "all done in $((SECONDS - started)) s"
