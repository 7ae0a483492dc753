#!/bin/bash
# The operator container: waits (at most SWARM_WAIT_SECONDS, default 120)
# until every site of the job answers its health check, starts the job, and
# follows it until it ends. Exit 0 when every site is done.
set -euo pipefail
JOB=${SWARM_JOB:-/etc/swarm/job.json}
WAIT=${SWARM_WAIT_SECONDS:-120}
ADDRESSES=$(sed -n 's/.*"address": *"\([^"]*\)".*/\1/p' "$JOB")
deadline=$((SECONDS + WAIT))
for address in $ADDRESSES; do
  until swarmctl health --site "$address" --timeout-ms 2000 >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "operator: site $address not healthy after ${WAIT}s:" >&2
      swarmctl health --site "$address" --timeout-ms 2000 || true
      exit 1
    fi
    sleep 1
  done
  echo "operator: $address is serving"
done
swarmctl start --job "$JOB"
exec swarmctl status --job "$JOB" --watch --changes-only --interval-ms 1000
