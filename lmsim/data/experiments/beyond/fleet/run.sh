#!/usr/bin/env bash
# The fleet-over-time experiments (issue 36): a compressed day under a fixed fleet, an HPA
# and Dynamo's SLA planner; the study's routers under one crash at peak; start-up time
# against what the planner saves. Their figures and RESULTS.md. About 15 minutes on 2
# cores. Resumable: rerunning skips complete runs (pass --rerun through "$@" after an
# engine change).
set -u
cd "$(dirname "$0")/../../.."
JOBS=${JOBS:-2}
FIGURES=experiments/beyond/fleet/figures
status=0
for exp in day_fixed day_hpa day_planner; do
  lmsim run "experiments/beyond/fleet/$exp.yaml" --overwrite > /dev/null || status=1
done
for exp in crash startup; do
  lmsim sweep "experiments/beyond/fleet/$exp.yaml" -j "$JOBS" --no-progress "$@" > /dev/null || status=1
done
mkdir -p "$FIGURES"
for exp in day_fixed day_hpa day_planner; do
  lmsim plot "runs/beyond/fleet/$exp" --kind fleet --format png --out "$FIGURES/$exp" --overwrite > /dev/null || status=1
done
python -m lmsim.analysis.fleet_tables runs/beyond/fleet > experiments/beyond/fleet/RESULTS.md || status=1
echo "figures: $FIGURES; tables: experiments/beyond/fleet/RESULTS.md; total $SECONDS s"
exit $status
