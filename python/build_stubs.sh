#!/usr/bin/env bash
# Generates the SDK's gRPC stubs from proto/ into OUT/swarm/_proto and copies
# the SDK next to them, so that OUT can go on PYTHONPATH:
#   python/build_stubs.sh OUT
# Needs protoc and grpc_python_plugin (Debian: protobuf-compiler,
# protobuf-compiler-grpc). CMake runs it at build time (target swarm_python).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROTO_DIR=$(cd "$HERE/../proto" && pwd)
OUT=${1:?usage: build_stubs.sh OUT}
PLUGIN=$(command -v grpc_python_plugin || true)
if [ -z "$PLUGIN" ]; then
  echo "build_stubs.sh: grpc_python_plugin not found (apt-get install protobuf-compiler-grpc)" >&2
  exit 1
fi
mkdir -p "$OUT/swarm/_proto"
cp "$HERE"/swarm/*.py "$OUT/swarm/"
protoc --proto_path="$PROTO_DIR" --python_out="$OUT/swarm/_proto" \
  --grpc_python_out="$OUT/swarm/_proto" --plugin=protoc-gen-grpc_python="$PLUGIN" \
  "$PROTO_DIR/swarm.proto" "$PROTO_DIR/trainer_link.proto"
# The generated modules import each other as top-level modules; make the
# imports package-relative.
sed -i -e 's/^import swarm_pb2 as/from . import swarm_pb2 as/' \
  -e 's/^import trainer_link_pb2 as/from . import trainer_link_pb2 as/' \
  "$OUT"/swarm/_proto/*.py
rm -f "$OUT/swarm/_proto/swarm_pb2_grpc.py"
echo '"""Generated from proto/ by build_stubs.sh; do not edit."""' > "$OUT/swarm/_proto/__init__.py"
