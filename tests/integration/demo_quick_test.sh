#!/usr/bin/env bash
# The demo in --quick mode (3 sites, 3 rounds, small shards, mTLS) as a test:
# the swarm's best model must beat the mean local-only model, and
# best.safetensors must reload and reproduce the reported accuracy (with
# --no-central: the central baseline is not compared, and takes a third of
# the baselines' time).
#   demo_quick_test.sh SOURCE_DIR BUILD_DIR [mlp|pytorch|mlp-dp|mlp-opt]
# With pytorch the sites' trainers are the PyTorch CNN (launch mode over the
# trainer link); without python3-torch it exits 77 (skipped) saying why.
# With mlp-dp the demo runs with --dp-epsilon 3: every site must print its
# epsilon spent over the 3 rounds, above 0 and within 3 (the swarm is not
# compared with the sites alone: with so little data and DP-SGD noise either
# may win).
# With mlp-opt the demo runs with --server-optimizer momentum --prox-mu 0.01
# (issue 35): the demo must say so, and the final models must carry no
# optimizer state (no "swarm.server_optimizer." tensor in best.safetensors
# or last.safetensors).
set -euo pipefail
SOURCE=$1
BUILD=$2
TRAINER=${3:-mlp}
DP=()
OPT=()
if [ "$TRAINER" = mlp-dp ]; then
  TRAINER=mlp
  DP=(--dp-epsilon 3)
elif [ "$TRAINER" = mlp-opt ]; then
  TRAINER=mlp
  OPT=(--server-optimizer momentum --prox-mu 0.01)
fi
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
      --workspace "$WORK/demo" --base-port "$PORT" --no-central "${DP[@]}" "${OPT[@]}" >"$OUT" 2>&1; then
  echo "demo.sh --quick failed:"; tail -40 "$OUT"; exit 1
fi
best=$(sed -n 's/^swarm best model *\([0-9.]*\)$/\1/p' "$OUT")
mean=$(sed -n 's/^mean of sites alone *\([0-9.]*\)$/\1/p' "$OUT")
echo "swarm best $best, mean local-only $mean"
if [ -z "$best" ] || [ -z "$mean" ]; then
  echo "the demo printed no table:"; tail -40 "$OUT"; exit 1
fi
if [ "${#DP[@]}" -gt 0 ]; then
  # Every site's epsilon, from its accountant, beside the table.
  sites=$(sed -n 's/^site-[0-9]* *\([0-9.]*\) (delta 1e-05) over 3 round(s)$/\1/p' "$OUT")
  echo "epsilon spent per site: $(echo $sites)"
  if [ "$(echo "$sites" | grep -c .)" -ne 3 ]; then
    echo "FAIL: the demo did not print the 3 sites' epsilon:"; tail -20 "$OUT"; exit 1
  fi
  for eps in $sites; do
    if ! awk -v e="$eps" 'BEGIN { exit !(e > 0 && e <= 3) }'; then
      echo "FAIL: a site spent epsilon $eps, not in (0, 3]"; exit 1
    fi
  done
elif ! awk -v b="$best" -v m="$mean" 'BEGIN { exit !(b > m) }'; then
  echo "FAIL: the swarm's best model ($best) does not beat the mean local-only model ($mean)"
  exit 1
fi
if [ "${#OPT[@]}" -gt 0 ]; then
  if ! grep -q '^server optimizer: momentum' "$OUT"; then
    echo "FAIL: the demo does not say it ran server momentum:"; tail -20 "$OUT"; exit 1
  fi
  for final in "$WORK/demo/best.safetensors" \
               "$WORK/demo/site-1/workspace/fashion-demo/last.safetensors"; do
    if [ ! -s "$final" ]; then
      echo "FAIL: no $final"; exit 1
    fi
    if grep -aq 'swarm\.server_optimizer\.' "$final"; then
      echo "FAIL: $final carries the server optimizer's state"; exit 1
    fi
  done
  echo "server momentum ran; best and last carry no optimizer state: ok"
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
