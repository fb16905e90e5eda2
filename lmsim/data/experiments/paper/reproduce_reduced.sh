#!/usr/bin/env bash
# Reduced reproduction (issue 14): the open choices both ways, 3 seeds each, small sizes (see
# each YAML's header), then the claims tables with 95% intervals in runs/paper-reduced/claims.md.
# Resumable: rerunning skips complete runs. JOBS=2 by default; runs niced. Results go to
# runs/paper-reduced/ under the current directory (never beside this script).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
JOBS=${JOBS:-2}
status=0
for exp in choices_bailian choices choices_llmd_deployed choices_hotspot dynamo_weight capacity_reading fig15_deployed llmd_noise; do
  start=$SECONDS
  nice lmsim sweep "$here/$exp.yaml" -j "$JOBS" "$@" || status=1
  echo "$exp: $((SECONDS - start)) s"
done
python -m lmsim.analysis.paper_claims_reduced runs/paper-reduced > runs/paper-reduced/claims.md || status=1
echo "claims: runs/paper-reduced/claims.md; total: $SECONDS s"
exit $status
