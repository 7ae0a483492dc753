#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test.
#
#   tests/run.sh            release build + full suite, then the full suite under
#                           AddressSanitizer+UBSan, then the concurrency tests
#                           under ThreadSanitizer, then each fuzz target for 30 s,
#                           then the deploy stage (tests/deploy/run.sh: the
#                           container image, the compose swarm and the generated
#                           Kubernetes manifests under Podman; as root, else it
#                           prints SKIP and the reason)
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
# PyTorch for demo_pytorch_quick_test (the CNN as an external trainer).
swarm_install_packages "${SWARM_TORCH_PACKAGES[@]}"

JOBS=$(nproc)

# build_and_test NAME "CTEST ARGS" "TARGETS (empty: all)" CMAKE_ARGS...
build_and_test() {
  local name=$1; shift
  local ctest_args=$1; shift
  local targets=$1; shift
  echo "=== [$name] configure + build"
  local build_start=$SECONDS
  cmake -S "$ROOT" -B "$ROOT/build/$name" -G Ninja "$@" >/dev/null
  if [ -n "$targets" ]; then
    # shellcheck disable=SC2086
    cmake --build "$ROOT/build/$name" -j "$JOBS" --target $targets
  else
    cmake --build "$ROOT/build/$name" -j "$JOBS"
  fi
  echo "=== [$name] build: $((SECONDS - build_start))s"
  echo "=== [$name] ctest"
  local start=$SECONDS
  if [ -n "$ctest_args" ]; then
    # shellcheck disable=SC2086
    (cd "$ROOT/build/$name" && ctest --output-on-failure -j "$JOBS" $ctest_args)
  else
    (cd "$ROOT/build/$name" && ctest --output-on-failure -j "$JOBS" -LE faults)
    echo "=== [$name] ctest (all but faults): $((SECONDS - start))s"
    # The fault tests' six shards side by side: they mostly wait on the
    # network and on timers (tests/faults/CMakeLists.txt).
    local faults_start=$SECONDS
    (cd "$ROOT/build/$name" && ctest --output-on-failure -j 6 -L faults)
    echo "=== [$name] ctest (faults): $((SECONDS - faults_start))s"
  fi
  echo "=== [$name] ctest: $((SECONDS - start))s"
}

# ThreadSanitizer runs the concurrency tests of our own threading (the
# aggregators' worker threads, the controller over thread pools and the fake
# network). Tests whose threads live inside gRPC (label "grpc") are left out
# there: Debian's gRPC and Abseil are not built with TSan, so it reports
# races inside them that it cannot see the synchronization of.
TSAN_TARGETS="fedavg_test coordinate_aggregator_test aggregator_test \
  simulation_test trainer_link_test metrics_test site_metrics_test report_test \
  task_runner_test"

# Compile time is most of this script's time on a 2-core machine, and most of
# it goes to the tests' own code (GoogleTest's macros) at -O2/-O3. The tests'
# code is built at -O1 (-Og under ASan), the libraries they test at the
# stage's own level: Release -O3 as users build it; -O1 under ASan, the level
# its documentation recommends. Measured on the 2-core machine: the ASan
# build took 936 s at -O2 everywhere, 506 s so.
build_and_test release "" "" -DCMAKE_BUILD_TYPE=Release \
  -DSWARM_TEST_CODE_OPTIMIZATION=-O1
if [ "$QUICK" -eq 0 ]; then
  build_and_test asan "" "" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" \
    -DSWARM_TEST_CODE_OPTIMIZATION=-Og \
    -DSWARM_SANITIZE_ADDRESS=ON -DSWARM_BUILD_BENCH=OFF
  # (ThreadSanitizer builds a few targets only; at -O1 its tests ran 60%
  # longer and the build took no less.)
  build_and_test tsan "-L concurrency -LE grpc" "$TSAN_TARGETS" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSWARM_SANITIZE_THREAD=ON -DSWARM_BUILD_BENCH=OFF
  echo "=== fuzz"
  bash "$ROOT/tests/fuzz/run.sh" "${SWARM_FUZZ_SECONDS:-30}"
  echo "=== deploy (container image, compose, Kubernetes manifests; Podman)"
  deploy_start=$SECONDS
  bash "$ROOT/tests/deploy/run.sh" "$ROOT/build/release"
  echo "=== deploy stage: $((SECONDS - deploy_start))s"
fi
echo "=== all tests passed"
