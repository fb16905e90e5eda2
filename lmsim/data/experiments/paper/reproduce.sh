#!/usr/bin/env bash
# Reproduce every seed experiment, then the figures and the report (2 cores: -j 2).
# Resumable: rerunning skips complete runs. Capacities come from experiments/capacity.json.
# Each sweep's figures are drawn in the background while the next sweep runs (a sweep's
# last points leave a core idle); the report waits for them and reuses their PNGs.
# Results go to runs/paper/ under the current directory (never beside this script, which
# may be inside an installed package).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
JOBS=${JOBS:-2}
status=0
plots=()
for fig in fig11 fig12 fig15 fig19 fig21 fig22 fig23 fig26 canary; do
  start=$SECONDS
  lmsim sweep "$here/$fig.yaml" -j "$JOBS" "$@" || status=1
  echo "$fig: $((SECONDS - start)) s (figures drawing in the background)"
  lmsim plot "runs/paper/$fig" > /dev/null &
  plots+=("$!:$fig")
done
for entry in "${plots[@]}"; do
  wait "${entry%%:*}" || { echo "plot ${entry#*:} failed"; status=1; }
done
echo "figures: runs/paper/*/figures; $SECONDS s"
lmsim report runs/paper || status=1
echo "total: $SECONDS s"
exit $status
