#!/usr/bin/env bash
# The local swarm demo: N sites on this machine, each holding only its own
# non-IID shard of Fashion-MNIST, learn one MLP together with no central
# server; then the swarm's best model is compared with each site training
# alone and with one model trained centrally on all the data.
#
#   deploy/local/demo.sh [--sites 4] [--rounds 20] [--alpha 0.5] [--epochs 1]
#                        [--lr 0.05] [--base-port 17400] [--workspace DIR]
#                        [--no-baselines] [--no-central] [--insecure] [--quick]
#                        [--bin-dir BUILD_DIR] [--trainer mlp|pytorch]
#                        [--lr-decay D] [--dp-epsilon E]
#                        [--server-optimizer none|momentum|adam|yogi]
#                        [--prox-mu MU]
#
# --no-central: the baselines are the sites alone only (no model trained on
# all the data; that takes about a third of the baselines' time).
#
# --trainer pytorch: each site's learner is an external trainer, a small CNN in
# PyTorch (examples/pytorch-fashion-mnist/train.py) that the daemon launches
# over the trainer link, on the same shard the MLP would use (default 12
# rounds; the baselines are the same CNN alone and centrally). Its learning
# rate decays by --lr-decay (default 0.9) per round, and per epoch in the
# baselines.
#
# --dp-epsilon E: every site trains with DP-SGD (the built-in MLP's
# dp_target_epsilon E over the job's rounds, delta 1e-5 per site, clip norm
# 1), so that each site's training data is (E, 1e-5)-differentially private
# (docs/privacy.md); the table is followed by every site's epsilon spent, and
# the baselines train with DP-SGD at the same epsilon (--trainer mlp only).
#
# For sites whose data differ strongly (e.g. --alpha 0.1: each site sees
# mostly two or three classes), plain FedAvg drifts; two remedies
# (docs/server-optimizers.md says which to use when, with measurements):
# --server-optimizer NAME: the aggregator steps the global model with a
# server optimizer (the job's server_optimizer: momentum = FedAvgM, adam =
# FedAdam, yogi = FedYogi; none = plain FedAvg, the default), at the job's
# default server learning rate and betas; its state travels with the global
# model from aggregator to aggregator.
# --prox-mu MU: FedProx, the job's learner param prox_mu: every site's local
# training is pulled towards the round's global model with weight MU (>= 0;
# 0, the default, is plain local SGD). The PyTorch trainer honours it too.
#
# On a fresh Debian 12 machine it installs what is missing (apt-get),
# builds, provisions certificates (mTLS), starts the site daemons on loopback,
# runs the job with live progress, and prints the comparison table. Outputs
# (under the workspace, default build/demo): best.safetensors, rounds.csv,
# the job report (report/report.html, .csv, .json: swarmctl report), every
# site's logs and workspace.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

SITES=4
ROUNDS=20
BASE_PORT=17400
ALPHA=0.5
EPOCHS=1
LR=0.05
LR_DECAY=""
WORKSPACE="$ROOT/build/demo"
BASELINES=1
CENTRAL=1
INSECURE=0
MAX_TRAIN=0
BIN_DIR=""
TRAINER=mlp
ROUNDS_SET=0
DP_EPSILON=""
DP_DELTA=1e-5
SERVER_OPT=none
PROX_MU=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sites) SITES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; ROUNDS_SET=1; shift 2 ;;
    --trainer) TRAINER=$2; shift 2 ;;
    --alpha) ALPHA=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --lr) LR=$2; shift 2 ;;
    --lr-decay) LR_DECAY=$2; shift 2 ;;
    --dp-epsilon) DP_EPSILON=$2; shift 2 ;;
    --server-optimizer) SERVER_OPT=$2; shift 2 ;;
    --prox-mu) PROX_MU=$2; shift 2 ;;
    --base-port) BASE_PORT=$2; shift 2 ;;
    --workspace) WORKSPACE=$2; shift 2 ;;
    --no-baselines) BASELINES=0; shift ;;
    --no-central) CENTRAL=0; shift ;;
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    --insecure) INSECURE=1; shift ;;
    --quick) SITES=3; ROUNDS=3; ROUNDS_SET=1; MAX_TRAIN=12000; shift ;;
    -h|--help) sed -n '2,/^set -e/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$TRAINER" in
  mlp) [ -z "$LR_DECAY" ] || { echo "demo.sh: --lr-decay is for --trainer pytorch" >&2; exit 2; } ;;
  pytorch) [ "$ROUNDS_SET" -eq 1 ] || ROUNDS=12; LR_DECAY=${LR_DECAY:-0.9} ;;
  *) echo "demo.sh: --trainer must be mlp or pytorch" >&2; exit 2 ;;
esac
if [ -n "$DP_EPSILON" ]; then
  [ "$TRAINER" = mlp ] || { echo "demo.sh: --dp-epsilon is for --trainer mlp" >&2; exit 2; }
  if ! awk -v e="$DP_EPSILON" 'BEGIN { exit !(e ~ /^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$/ && e + 0 > 0) }'; then
    echo "demo.sh: --dp-epsilon must be a number > 0 (got '$DP_EPSILON')" >&2; exit 2
  fi
fi
case "$SERVER_OPT" in
  none|momentum|adam|yogi) ;;
  *) echo "demo.sh: --server-optimizer must be none, momentum, adam or yogi (got '$SERVER_OPT')" >&2; exit 2 ;;
esac
if ! awk -v m="$PROX_MU" 'BEGIN { exit !(m ~ /^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$/) }'; then
  echo "demo.sh: --prox-mu must be a number >= 0 (got '$PROX_MU')" >&2; exit 2
fi
case "$SITES" in ''|*[!0-9]*) echo "demo.sh: --sites must be a number" >&2; exit 2 ;; esac
case "$ROUNDS" in ''|*[!0-9]*) echo "demo.sh: --rounds must be a number" >&2; exit 2 ;; esac
if [ "$SITES" -lt 1 ] || [ "$ROUNDS" -lt 1 ]; then
  echo "demo.sh: --sites and --rounds must be at least 1" >&2; exit 2
fi

# 1. Install what is missing and build (--bin-dir: use a build tree as it is,
# as the tests do).
if [ -n "$BIN_DIR" ]; then
  BUILD="$BIN_DIR"
else
  source "$ROOT/tests/install_deps.sh"
  swarm_install_packages "${SWARM_PACKAGES[@]}"
  if [ "$TRAINER" = pytorch ]; then
    swarm_install_packages "${SWARM_TORCH_PACKAGES[@]}"
  fi
  BUILD="$ROOT/build/release"
  echo "=== building (build/release)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" --target swarm-client swarmctl swarm-mlp swarm_python
fi
PYTHON=/usr/bin/python3
CNN="$ROOT/examples/pytorch-fashion-mnist/train.py"
if [ "$TRAINER" = pytorch ] && ! "$PYTHON" -c "import torch, grpc" 2>/dev/null; then
  echo "demo.sh: --trainer pytorch needs python3-torch and python3-grpcio (run without --bin-dir to install them)" >&2
  exit 1
fi
CLIENT="$BUILD/cli/swarm-client"
CTL="$BUILD/cli/swarmctl"
MLP="$BUILD/learner/swarm-mlp"

# 2. A fresh workspace; the daemons are stopped whatever happens.
rm -rf "$WORKSPACE"
mkdir -p "$WORKSPACE"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# DP-SGD (--dp-epsilon): the learner picks sigma for E over the job's rounds
# (the daemon adds dp_rounds and the site's delta).
DP_PARAMS=""
[ -z "$DP_EPSILON" ] || DP_PARAMS=", \"dp_target_epsilon\": \"$DP_EPSILON\""
learner_params() {  # site index
  cat <<EOF
      "sites": "$SITES", "site_index": "$1", "partition": "dirichlet",
      "alpha": "$ALPHA", "data_seed": "1", "seed": "1", "epochs": "$EPOCHS",
      "lr": "$LR", "max_train_samples": "$MAX_TRAIN"$DP_PARAMS
EOF
}

# 3. The job: every site trains and may aggregate; site i listens on
# BASE_PORT + i.
SITES_JSON=""
for ((i = 0; i < SITES; i++)); do
  [ -n "$SITES_JSON" ] && SITES_JSON+=", "
  SITES_JSON+="{\"name\": \"site-$((i + 1))\", \"address\": \"127.0.0.1:$((BASE_PORT + i))\"}"
done
# --server-optimizer and --prox-mu: the job's server_optimizer and its
# learner param prox_mu (every site's, external trainers' too).
JOB_EXTRA=""
if [ "$SERVER_OPT" != none ]; then
  JOB_EXTRA+="
  \"server_optimizer\": \"SERVER_OPTIMIZER_$(echo "$SERVER_OPT" | tr '[:lower:]' '[:upper:]')\","
fi
if awk -v m="$PROX_MU" 'BEGIN { exit !(m + 0 > 0) }'; then
  JOB_EXTRA+="
  \"learner_params\": {\"prox_mu\": \"$PROX_MU\"},"
fi
JOB="$WORKSPACE/job.json"
cat >"$JOB" <<EOF
{
  "job_id": "fashion-demo",$JOB_EXTRA
  "sites": [$SITES_JSON],
  "num_rounds": $ROUNDS,
  "seed": 2026,
  "metric_name": "accuracy",
  "wait_after_min_responses_ms": 60000,
  "round_timeout_ms": 600000,
  "max_concurrent_submissions": 2,
  "keep_round_models": true
}
EOF

# 4. Certificates (mTLS): a project CA, one identity per site, one admin.
TLS_FLAGS=()
if [ "$INSECURE" -eq 1 ]; then
  TLS_FLAGS=(--insecure)
else
  "$CTL" provision --out "$WORKSPACE/pki" --job "$JOB" --admin demo-admin >/dev/null
  export SWARM_TLS_DIR="$WORKSPACE/pki/admins/demo-admin"
  echo "=== provisioned certificates in $WORKSPACE/pki (mTLS)"
fi

echo "=== starting $SITES sites"
for ((i = 0; i < SITES; i++)); do
  site="site-$((i + 1))"
  dir="$WORKSPACE/$site"
  mkdir -p "$dir"
  tls_line=""
  [ "$INSECURE" -eq 0 ] && tls_line="\"tls_dir\": \"$WORKSPACE/pki/sites/$site\","
  if [ "$TRAINER" = pytorch ]; then
    # The CNN trains on the shard the MLP would use.
    "$MLP" shard --site-index "$i" --sites "$SITES" --partition dirichlet \
      --alpha "$ALPHA" --data-seed 1 --max-train-samples "$MAX_TRAIN" \
      --out "$dir/shard.txt" >/dev/null
    cat >"$dir/site.json" <<EOF
{
  "name": "$site",
  "listen_address": "127.0.0.1:$((BASE_PORT + i))",
  "workspace": "$dir/workspace",
  $tls_line
  "learner": {"kind": "external", "params": {
      "shard_file": "$dir/shard.txt", "epochs": "$EPOCHS", "lr": "$LR",
      "lr_decay": "$LR_DECAY", "seed": "1"}},
  "trainer": {"mode": "launch", "command": ["$PYTHON", "$CNN"],
              "env": {"PYTHONPATH": "$BUILD/python", "OMP_NUM_THREADS": "1"}}
}
EOF
  else
    privacy_line=""
    [ -z "$DP_EPSILON" ] || privacy_line="\"privacy\": {\"delta\": $DP_DELTA},"
    cat >"$dir/site.json" <<EOF
{
  "name": "$site",
  "listen_address": "127.0.0.1:$((BASE_PORT + i))",
  "workspace": "$dir/workspace",
  $tls_line
  $privacy_line
  "learner": {"kind": "mlp", "params": {
$(learner_params "$i")
  }}
}
EOF
  fi
  "$CLIENT" --config "$dir/site.json" "${TLS_FLAGS[@]}" >"$dir/stdout" 2>"$dir/log" &
  PIDS+=($!)
done
for ((i = 0; i < SITES; i++)); do
  dir="$WORKSPACE/site-$((i + 1))"
  for _ in $(seq 1 600); do
    if grep -q "^listening on " "$dir/stdout" 2>/dev/null; then break; fi
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
      echo "site-$((i + 1)) did not start (port $((BASE_PORT + i)) taken? try --base-port):" >&2
      tail -5 "$dir/log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "  site-$((i + 1)) on 127.0.0.1:$((BASE_PORT + i))"
done

# 5. Run it, with live progress.
DP_NOTE=""
[ -z "$DP_EPSILON" ] || DP_NOTE=", DP-SGD epsilon=$DP_EPSILON delta=$DP_DELTA per site"
[ "$SERVER_OPT" = none ] || DP_NOTE+=", server optimizer $SERVER_OPT"
awk -v m="$PROX_MU" 'BEGIN { exit !(m + 0 > 0) }' && DP_NOTE+=", FedProx mu=$PROX_MU"
echo "=== running the swarm job ($ROUNDS rounds, non-IID alpha=$ALPHA$DP_NOTE)"
START=$(date +%s.%N)
"$CTL" start --job "$JOB" "${TLS_FLAGS[@]}"
"$CTL" status --job "$JOB" --watch --interval-ms 1000 --changes-only "${TLS_FLAGS[@]}"
END=$(date +%s.%N)
SWARM_SECONDS=$(awk -v a="$START" -v b="$END" 'BEGIN { printf "%.1f", b - a }')
echo "swarm job finished in ${SWARM_SECONDS}s"
# --dp-epsilon: every site's epsilon spent, from its accountant (status).
SITE_EPSILONS=()
if [ -n "$DP_EPSILON" ]; then
  STATUS_OUT=$("$CTL" status --job "$JOB" "${TLS_FLAGS[@]}" 2>&1 || true)
  for ((i = 0; i < SITES; i++)); do
    eps=$(printf "%s\n" "$STATUS_OUT" |
          sed -n "s/^ *site-$((i + 1)): privacy spent: epsilon \([0-9.]*\) (delta \([^)]*\)) over \([0-9]*\) round.*/\1 (delta \2) over \3 round(s)/p" |
          head -1)
    SITE_EPSILONS+=("${eps:-none reported}")
  done
fi

# 6. Per-round CSV: the model each round produced, where it was aggregated,
# the trainers' mean validation accuracy of the round's input model, and the
# test accuracy of the round's output.
CSV="$WORKSPACE/rounds.csv"
echo "round,aggregator,mean_validation_accuracy,test_accuracy" >"$CSV"
accuracy_of() {
  if [ "$TRAINER" = pytorch ]; then
    "$PYTHON" "$CNN" --evaluate "$1"
  else
    "$MLP" evaluate --model "$1"
  fi | sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p'
}
metadata_of() {  # file key
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    print(json.loads(f.read(n)).get("__metadata__", {}).get(sys.argv[2], ""))
EOF
}
for ((r = 1; r <= ROUNDS; r++)); do
  file=$(ls "$WORKSPACE"/site-*/workspace/fashion-demo/rounds/round-$(printf %06d "$r").safetensors 2>/dev/null | head -1)
  [ -z "$file" ] && continue
  printf "%d,%s,%s,%s\n" "$((r - 1))" "$(metadata_of "$file" aggregator)" \
    "$(metadata_of "$file" input_score)" "$(accuracy_of "$file")" >>"$CSV"
done
# The job report from every site's per-round history, with the test
# accuracy of each round's aggregate from rounds.csv.
REPORT_DIR="$WORKSPACE/report"
"$CTL" report --job "$JOB" --out "$REPORT_DIR" --test-metric "$CSV" \
  --test-column test_accuracy "${TLS_FLAGS[@]}"
BEST="$WORKSPACE/best.safetensors"
cp "$WORKSPACE/site-1/workspace/fashion-demo/best.safetensors" "$BEST"
BEST_ACC=$(accuracy_of "$BEST")

# 7. Baselines with the same budget: each site alone on its shard, and one
# model on all the data, for rounds x epochs epochs.
BUDGET=$((ROUNDS * EPOCHS))
LOCAL_ACCS=()
CENTRAL_ACC="-"
if [ "$BASELINES" -eq 1 ]; then
  echo "=== baselines: $BUDGET epochs each"
  common=(--sites "$SITES" --partition dirichlet --alpha "$ALPHA" --data-seed 1 --seed 1
          --lr "$LR" --epochs "$BUDGET" --max-train-samples "$MAX_TRAIN")
  # --dp-epsilon: the baselines spend the same epsilon in one run.
  [ -z "$DP_EPSILON" ] || common+=(--dp-target-epsilon "$DP_EPSILON" --dp-rounds 1
                                   --dp-delta "$DP_DELTA")
  cnn=(--baseline --lr "$LR" --lr-decay "${LR_DECAY:-1}" --epochs "$BUDGET" --seed 1)
  if [ "$TRAINER" = pytorch ]; then
    # The sites' CNNs train side by side (one thread each).
    for ((i = 0; i < SITES; i++)); do
      "$PYTHON" "$CNN" "${cnn[@]}" --shard "$WORKSPACE/site-$((i + 1))/shard.txt" \
        >"$WORKSPACE/site-$((i + 1))/baseline.out" 2>/dev/null &
      PIDS+=($!)
    done
    wait "${PIDS[@]: -$SITES}" || true
  fi
  for ((i = 0; i < SITES; i++)); do
    if [ "$TRAINER" = pytorch ]; then
      acc=$(sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' "$WORKSPACE/site-$((i + 1))/baseline.out")
    else
      acc=$("$MLP" train --site-index "$i" "${common[@]}" 2>/dev/null |
            sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p')
    fi
    LOCAL_ACCS+=("$acc")
    echo "  site-$((i + 1)) alone: $acc"
  done
  if [ "$CENTRAL" -eq 0 ]; then
    :  # --no-central: the sites alone only (a third of the baselines' time)
  elif [ "$TRAINER" = pytorch ]; then
    # All the training data the sites hold between them (the same subset
    # with --quick), nothing held out.
    "$MLP" shard --site-index 0 --sites 1 --partition iid --validation-fraction 0 \
      --max-train-samples "$MAX_TRAIN" --out "$WORKSPACE/central-shard.txt" >/dev/null
    CENTRAL_ACC=$("$PYTHON" "$CNN" "${cnn[@]}" --shard "$WORKSPACE/central-shard.txt" \
                    --threads "$(nproc)" 2>/dev/null |
                  sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p')
  else
    CENTRAL_ACC=$("$MLP" train --central "${common[@]}" 2>/dev/null |
                  sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p')
  fi
  [ "$CENTRAL" -eq 0 ] || echo "  central: $CENTRAL_ACC"
fi

# 8. The table.
echo
MODEL_NAME="MLP"
[ "$TRAINER" = pytorch ] && MODEL_NAME="PyTorch CNN"
echo "=== Fashion-MNIST test accuracy, $MODEL_NAME ($SITES sites, non-IID alpha=$ALPHA, $ROUNDS rounds x $EPOCHS epoch(s)$DP_NOTE)"
printf "%-34s %s\n" "model" "test accuracy"
printf "%-34s %s\n" "swarm best model" "$BEST_ACC"
if [ "$BASELINES" -eq 1 ]; then
  sum=0
  for ((i = 0; i < SITES; i++)); do
    printf "%-34s %s\n" "site-$((i + 1)) alone ($BUDGET epochs)" "${LOCAL_ACCS[$i]}"
    sum=$(awk -v s="$sum" -v a="${LOCAL_ACCS[$i]}" 'BEGIN { print s + a }')
  done
  printf "%-34s %.4f\n" "mean of sites alone" "$(awk -v s="$sum" -v n="$SITES" 'BEGIN { print s / n }')"
  if [ "$CENTRAL" -eq 1 ]; then
    printf "%-34s %s\n" "central, all data ($BUDGET epochs)" "$CENTRAL_ACC"
  fi
fi
if [ -n "$DP_EPSILON" ]; then
  echo
  printf "%-34s %s\n" "site" "epsilon spent in the swarm job"
  for ((i = 0; i < SITES; i++)); do
    printf "%-34s %s\n" "site-$((i + 1))" "${SITE_EPSILONS[$i]}"
  done
fi
echo
echo "server optimizer: $SERVER_OPT$([ "$SERVER_OPT" = none ] && echo " (plain FedAvg)" || echo " (job defaults for its learning rate and betas)")"
echo "FedProx mu:       $PROX_MU$(awk -v m="$PROX_MU" 'BEGIN { exit !(m + 0 > 0) }' || echo " (off)")"
echo "swarm job time: ${SWARM_SECONDS}s"
echo "best model:     $BEST"
echo "per-round CSV:  $CSV"
echo "job report:     $REPORT_DIR/report.html"
echo "site logs:      $WORKSPACE/site-*/log"
