#!/usr/bin/env bash
# The demo in --quick mode (3 sites, 3 rounds, small shards, mTLS) as a test:
# the swarm's best model must beat the mean local-only model, and
# best.safetensors must reload and reproduce the reported accuracy (with
# --no-central: the central baseline is not compared, and takes a third of
# the baselines' time).
#   demo_quick_test.sh SOURCE_DIR BUILD_DIR [mlp|pytorch]
# With pytorch the sites' trainers are the PyTorch CNN (launch mode over the
# trainer link); without python3-torch it exits 77 (skipped) saying why.
set -euo pipefail
SOURCE=$1
BUILD=$2
TRAINER=${3:-mlp}
if [ "$TRAINER" = pytorch ] && ! /usr/bin/python3 -c "import torch, grpc" 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 cannot import torch and grpc (install python3-torch python3-grpcio; tests/run.sh does)"
  exit 77
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/swarm-demo-test-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# Ten ports per run, apart for neighbouring PIDs (tests run side by side).
PORT=$((20000 + ($$ % 2000) * 10))
OUT="$WORK/demo.out"
if ! bash "$SOURCE/deploy/local/demo.sh" --quick --trainer "$TRAINER" --bin-dir "$BUILD" \
      --workspace "$WORK/demo" --base-port "$PORT" --no-central >"$OUT" 2>&1; then
  echo "demo.sh --quick failed:"; tail -40 "$OUT"; exit 1
fi
best=$(sed -n 's/^swarm best model *\([0-9.]*\)$/\1/p' "$OUT")
mean=$(sed -n 's/^mean of sites alone *\([0-9.]*\)$/\1/p' "$OUT")
echo "swarm best $best, mean local-only $mean"
if [ -z "$best" ] || [ -z "$mean" ]; then
  echo "the demo printed no table:"; tail -40 "$OUT"; exit 1
fi
if ! awk -v b="$best" -v m="$mean" 'BEGIN { exit !(b > m) }'; then
  echo "FAIL: the swarm's best model ($best) does not beat the mean local-only model ($mean)"
  exit 1
fi
if [ "$TRAINER" = pytorch ]; then
  again=$(/usr/bin/python3 "$SOURCE/examples/pytorch-fashion-mnist/train.py" \
          --evaluate "$WORK/demo/best.safetensors" |
          sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p')
else
  again=$("$BUILD/learner/swarm-mlp" evaluate --model "$WORK/demo/best.safetensors" |
          sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p')
fi
if [ "$again" != "$best" ]; then
  echo "FAIL: best.safetensors reloads at $again, the demo reported $best"
  exit 1
fi
echo "best.safetensors reloads at $again: ok"
