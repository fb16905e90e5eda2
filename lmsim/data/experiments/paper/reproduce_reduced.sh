#!/usr/bin/env bash
# Reduced reproduction (issue 14): the open choices both ways, 3 seeds each, small sizes (see
# each YAML's header), then the claims tables with 95% intervals in runs/paper-reduced/claims.md.
# Resumable: rerunning skips complete runs. JOBS=2 by default; runs niced.
set -u
cd "$(dirname "$0")/../.."
JOBS=${JOBS:-2}
status=0
for exp in choices_bailian choices choices_hotspot dynamo_weight capacity_reading fig15_deployed llmd_noise; do
  start=$SECONDS
  nice lmsim sweep "experiments/paper/$exp.yaml" -j "$JOBS" "$@" || status=1
  echo "$exp: $((SECONDS - start)) s"
done
python experiments/paper/claims_reduced.py runs/paper-reduced > runs/paper-reduced/claims.md || status=1
echo "claims: runs/paper-reduced/claims.md; total: $SECONDS s"
exit $status
