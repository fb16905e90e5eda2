#!/usr/bin/env bash
# Reproduce every seed experiment, then the figures and the report (2 cores: -j 2).
# Resumable: rerunning skips complete runs. Capacities come from experiments/capacity.json.
set -u
cd "$(dirname "$0")/../.."
JOBS=${JOBS:-2}
status=0
for fig in fig11 fig12 fig15 fig19 fig21 fig22 fig23 fig26 canary; do
  start=$SECONDS
  lmsim sweep "experiments/paper/$fig.yaml" -j "$JOBS" "$@" || status=1
  lmsim plot "runs/paper/$fig" || status=1
  echo "$fig: $((SECONDS - start)) s"
done
lmsim report runs/paper || status=1
echo "total: $SECONDS s"
exit $status
