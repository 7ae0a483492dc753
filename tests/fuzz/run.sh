#!/usr/bin/env bash
# Builds the libFuzzer targets with clang + ASan and runs each for a while on
# its committed seed corpus (new inputs go to build/fuzz/corpus, not to the
# repository). Fails on any crash; the reproducer is left in build/fuzz/.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET]     (default 60; tests/run.sh passes 30)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SECONDS_PER_TARGET=${1:-60}
BUILD="$ROOT/build/fuzz"

CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DSWARM_BUILD_FUZZ=ON \
  -DSWARM_SANITIZE_ADDRESS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSWARM_BUILD_TESTS=OFF -DSWARM_BUILD_BENCH=OFF -DSWARM_PCH=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target safetensors_fuzz assembler_fuzz job_config_fuzz

# The targets run side by side (each single-threaded; on two cores three
# of them take SECONDS_PER_TARGET of wall time instead of three times it).
TARGETS="safetensors assembler job_config"
declare -A pids
for target in $TARGETS; do
  work="$BUILD/corpus/$target"
  mkdir -p "$work"
  echo "=== fuzz $target for ${SECONDS_PER_TARGET}s"
  (cd "$BUILD" && exec "./tests/fuzz/${target}_fuzz" -max_total_time="$SECONDS_PER_TARGET" \
        -print_final_stats=1 -artifact_prefix="$BUILD/${target}-" \
        "$work" "$ROOT/tests/fuzz/corpus/$target" >"$BUILD/$target.log" 2>&1) &
  pids[$target]=$!
done
failed=0
for target in $TARGETS; do
  if wait "${pids[$target]}"; then
    echo "fuzz $target: $(grep -E "^stat::number_of_executed_units|Done [0-9]+ runs" "$BUILD/$target.log" | tail -1)"
  else
    echo "fuzz target $target FAILED; see $BUILD/$target.log"
    tail -40 "$BUILD/$target.log"
    failed=1
  fi
done
exit $failed
