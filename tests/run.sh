#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test.
#
#   tests/run.sh            release build + full suite, then the full suite under
#                           AddressSanitizer+UBSan, then the concurrency tests
#                           under ThreadSanitizer, then each fuzz target for 60 s
#   tests/run.sh --quick    release build + full suite only
#
# Build trees: build/release, build/asan, build/tsan, build/fuzz. Exits non-zero on any
# failure.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

QUICK=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    *) echo "unknown argument: $arg (expected --quick)" >&2; exit 2 ;;
  esac
done

source "$ROOT/tests/install_deps.sh"
swarm_install_packages "${SWARM_PACKAGES[@]}"

JOBS=$(nproc)

build_and_test() {
  local name=$1; shift
  local ctest_args=$1; shift
  echo "=== [$name] configure + build"
  cmake -S "$ROOT" -B "$ROOT/build/$name" -G Ninja "$@" >/dev/null
  cmake --build "$ROOT/build/$name" -j "$JOBS"
  echo "=== [$name] ctest"
  (cd "$ROOT/build/$name" && ctest --output-on-failure -j "$JOBS" $ctest_args)
}

build_and_test release "" -DCMAKE_BUILD_TYPE=Release
if [ "$QUICK" -eq 0 ]; then
  build_and_test asan "" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSWARM_SANITIZE_ADDRESS=ON -DSWARM_BUILD_BENCH=OFF
  build_and_test tsan "-L concurrency" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSWARM_SANITIZE_THREAD=ON -DSWARM_BUILD_BENCH=OFF
  echo "=== fuzz"
  bash "$ROOT/tests/fuzz/run.sh" "${SWARM_FUZZ_SECONDS:-60}"
fi
echo "=== all tests passed"
