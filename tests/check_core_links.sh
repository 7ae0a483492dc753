#!/usr/bin/env bash
# core_link_test: the linked binary of the core (the controller's simulation
# test: SwarmController, gatherer, learner, fake network) loads neither gRPC
# nor OpenSSL (libssl, nor libcrypto: the SHA-256 stream digest lives in
# security/). The configure step checks the targets; this checks what the
# linker actually produced.
set -euo pipefail
binary=$1
libs=$(ldd "$binary")
bad=$(grep -E 'libgrpc|libgpr|libssl\.|libcrypto\.' <<<"$libs" || true)
if [ -n "$bad" ]; then
  echo "FAIL: $binary links:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "ok: $(basename "$binary") links no gRPC, no libssl and no libcrypto ($(wc -l <<<"$libs") shared libraries)"
