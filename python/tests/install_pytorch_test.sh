#!/usr/bin/env bash
# The PyTorch example (examples/pytorch-fashion-mnist/train.py) as a site's
# trainer with only the SDK that `pip install ./python` put into a fresh
# virtual environment (no PYTHONPATH, run from outside the source tree):
# `swarmctl init --local 2 --learner external`, the printed site commands,
# one attached CNN trainer per site on a small shard, 2 rounds; the job must
# end done on both sites, BEST and LAST fetched, the best model's validation
# accuracy well above chance.
#   install_pytorch_test.sh SOURCE_DIR SWARMCTL SWARM_MLP
# Exits 77 (skipped), saying why, without python3-torch or the data set.
set -euo pipefail
SRC=$1 CTL=$2 MLP=$3
PY=/usr/bin/python3
DATA=/usr/share/datasets/fashion-mnist
if ! "$PY" -c "import torch, grpc" 2>/dev/null; then
  echo "SKIP: $PY cannot import torch and grpc (install python3-torch python3-grpcio; tests/run.sh does)"
  exit 77
fi
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: no Fashion-MNIST in $DATA (install dataset-fashion-mnist; tests/run.sh does)"
  exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pip-pytorch-XXXXXX")
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for log in "$TMP"/trial/sites/*/daemon.log "$TMP"/trainer-*.log; do
    [ -f "$log" ] && { echo "--- $log" >&2; tail -15 "$log" >&2; }
  done
  echo "kept $TMP" >&2
  trap - EXIT
  cleanup
  exit 1
}

# The install, as docs/trainers.md shows it (offline: Debian's setuptools).
SECONDS=0
mkdir -p "$TMP/src"
cp -r "$SRC/python" "$SRC/proto" "$SRC/CMakeLists.txt" "$TMP/src/"
"$PY" -m venv --system-site-packages "$TMP/venv"
"$TMP/venv/bin/pip" install --no-build-isolation --no-index --quiet \
  "$TMP/src/python" || fail "pip install ./python failed"
cp "$SRC/examples/pytorch-fashion-mnist/train.py" "$TMP/train.py"
cd /
unset PYTHONPATH
where=$("$TMP/venv/bin/python" -c 'import swarm, swarm.torch; print(swarm.__file__)')
case "$where" in
  "$TMP/venv/"*) ;;
  *) fail "import swarm found $where, not the venv's package" ;;
esac

installed=$SECONDS
# A 2-site trial with external (attach-mode) trainers; each site's learner
# params name its shard (4,000 training images between the two sites).
"$CTL" init --local 2 --learner external --rounds 2 --job-id torch-venv \
  --out "$TMP/trial" >"$TMP/init.txt" || fail "swarmctl init failed"
for i in 1 2; do
  site="$TMP/trial/sites/site-$i"
  "$MLP" shard --site-index $((i - 1)) --sites 2 --partition iid \
    --max-train-samples 4000 --out "$site/shard.txt" >/dev/null ||
    fail "swarm-mlp shard failed"
  "$PY" - "$site/site.json" "$site/shard.txt" <<'EOF'
import json, sys
path, shard = sys.argv[1], sys.argv[2]
config = json.load(open(path))
config["learner"]["params"] = {"shard_file": shard, "epochs": "2", "lr": "0.05"}
json.dump(config, open(path, "w"), indent=1)
EOF
done
# The printed site commands, as printed (each ends in '&').
grep '^  .*swarm-client --config' "$TMP/init.txt" >"$TMP/sites.sh"
[ "$(wc -l <"$TMP/sites.sh")" -eq 2 ] || fail "init printed no site commands: $(cat "$TMP/init.txt")"
# shellcheck disable=SC1091
source "$TMP/sites.sh"
PIDS+=($(jobs -p))
for i in 1 2; do
  sock="$TMP/trial/sites/site-$i/workspace/trainer/link.sock"
  for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || fail "site-$i made no trainer socket $sock"
  SWARM_TRAINER_SOCKET="$sock" OMP_NUM_THREADS=1 \
    "$TMP/venv/bin/python" "$TMP/train.py" >"$TMP/trainer-$i.log" 2>&1 &
  PIDS+=($!)
done
began=$SECONDS
# The printed admin commands, as printed.
sed -n '/^Then run the job from this machine:/,$p' "$TMP/init.txt" | grep '^  ' \
  >"$TMP/admin.sh"
timeout 120 bash -e "$TMP/admin.sh" >"$TMP/admin.out" 2>&1 ||
  fail "the printed admin commands failed: $(tail -20 "$TMP/admin.out")"
grep -q "done on every site" "$TMP/admin.out" || fail "the job did not finish: $(tail -20 "$TMP/admin.out")"
for i in 1 2; do
  grep -q "training / .* validation images" "$TMP/trainer-$i.log" ||
    fail "the trainer of site-$i did not train: $(tail -5 "$TMP/trainer-$i.log")"
done
ran=$SECONDS
# The best model's validation accuracy, as the example measured it on the
# sites' validation images (well above chance, 0.1, after one round).
accuracy=$(sed -n 's/.*job torch-venv: done (best metric \([0-9.]*\)).*/\1/p' \
  "$TMP/trial/sites/site-1/daemon.log")
awk -v a="${accuracy:-0}" 'BEGIN { exit !(a > 0.3) }' ||
  fail "the swarm's best CNN scored validation accuracy ${accuracy:-none} (want > 0.3)"
[ -s "$TMP/trial/best.safetensors" ] && [ -s "$TMP/trial/last.safetensors" ] ||
  fail "BEST and LAST were not fetched"
# A site alone by DP-SGD at a given ε (the example's --dp-epsilon, through
# the installed swarm.dp): it must spend at most that ε, and not nothing.
# (A shard of 450 images: per-example gradients cost ~9 ms each.)
"$MLP" shard --site-index 0 --sites 2 --partition iid --max-train-samples 1000 \
  --out "$TMP/dp-shard.txt" >/dev/null || fail "swarm-mlp shard failed"
(cd / && OMP_NUM_THREADS=1 "$TMP/venv/bin/python" "$TMP/train.py" --baseline \
   --shard "$TMP/dp-shard.txt" --epochs 1 --dp-epsilon 2 \
   >"$TMP/dp.out" 2>&1) || fail "train.py --baseline --dp-epsilon 2 failed: $(tail -5 "$TMP/dp.out")"
spent=$(sed -n 's/^dp_epsilon=\([0-9.]*\) .*/\1/p' "$TMP/dp.out")
awk -v e="${spent:-0}" 'BEGIN { exit !(e > 0.5 && e <= 2.0) }' ||
  fail "train.py --dp-epsilon 2 spent epsilon ${spent:-none} (want in (0.5, 2]): $(tail -3 "$TMP/dp.out")"
echo "PASS: the PyTorch example on the pip-installed SDK (best CNN: validation" \
  "accuracy $accuracy; install ${installed}s, daemons and trainers" \
  "$((began - installed))s, job $((ran - began))s; alone by DP-SGD:" \
  "epsilon $spent of 2)"
cleanup
rm -rf "$TMP"
