#!/usr/bin/env bash
# Installs the Debian packages Swarm needs to build, test and run, when missing.
# Runs `apt-get update` at most once. Needs root (or sudo) only if something is
# missing.
set -euo pipefail

SWARM_PACKAGES=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libssl-dev libgtest-dev libgmock-dev
  libeigen3-dev zlib1g-dev nlohmann-json3-dev libxxhash-dev
  python3 python3-numpy dataset-fashion-mnist
  python3-grpcio python3-protobuf
  # pip install ./python (offline: Debian's setuptools, a venv with the
  # system's packages).
  python3-setuptools python3-venv python3-pip
  libmicrohttpd-dev
  # The metrics integration test runs a real Prometheus server (its own port
  # and storage in a temporary folder; the packaged service is not used).
  prometheus
  # The report test renders the job report in headless Chromium.
  chromium
  # The network fault tests (tests/faults): namespaces, veth, tbf, drops.
  iproute2 iptables
)
# Only for the PyTorch example (deploy/local/demo.sh --trainer pytorch); the
# tests do not need it.
SWARM_TORCH_PACKAGES=(python3-torch)

swarm_install_packages() {
  local missing=()
  local pkg
  for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    return 0
  fi
  echo "Installing missing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  swarm_install_packages "${SWARM_PACKAGES[@]}" "$@"
fi
