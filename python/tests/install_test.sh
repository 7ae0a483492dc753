#!/usr/bin/env bash
# pip install ./python in a fresh virtual environment, offline: Debian's
# setuptools (--no-build-isolation, --no-index), Debian's grpcio, protobuf and
# numpy through --system-site-packages. Then, from outside the source tree:
# `import swarm` comes from the venv, with its generated stubs, its
# __version__ is the daemon's release version, and the SDK's tests pass
# against the installed package.
#   install_test.sh SOURCE_DIR SWARM_CLIENT
set -euo pipefail
SRC=$1 CLIENT=$2
PY=/usr/bin/python3
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pip-install-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A copy of what the install reads, so that the build leaves nothing in the
# source tree.
mkdir -p "$TMP/src"
cp -r "$SRC/python" "$SRC/proto" "$SRC/CMakeLists.txt" "$TMP/src/"
"$PY" -m venv --system-site-packages "$TMP/venv"
"$TMP/venv/bin/pip" install --no-build-isolation --no-index --quiet \
  "$TMP/src/python" || fail "pip install ./python failed"

cd /
unset PYTHONPATH
where=$("$TMP/venv/bin/python" -c 'import swarm; print(swarm.__file__)')
case "$where" in
  "$TMP/venv/"*) ;;
  *) fail "import swarm found $where, not the venv's package" ;;
esac
version=$("$TMP/venv/bin/python" -c 'import swarm; print(swarm.__version__)')
daemon=$("$CLIENT" --version | sed -n 's/^swarm-client //p')
[ "$version" = "$daemon" ] || fail "swarm.__version__ $version, swarm-client $daemon"
"$TMP/venv/bin/python" -c 'from swarm._proto import trainer_link_pb2_grpc, swarm_pb2' \
  || fail "the generated stubs are not installed"

# The SDK's tests against the installed package (a copy of the tests alone:
# the source's swarm/ must not be importable).
mkdir "$TMP/tests"
cp "$SRC/python/tests/"*.py "$TMP/tests/"
(cd "$TMP/tests" && "$TMP/venv/bin/python" -m unittest -q sdk_test) \
  || fail "the SDK tests failed against the installed package"
echo "PASS: pip install ./python (swarm $version)"
