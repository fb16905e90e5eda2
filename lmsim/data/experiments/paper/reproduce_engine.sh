#!/usr/bin/env bash
# Figures 22 and 23 (loads 0.5 and 0.8) again under another engine at the same traffic:
# every point replays the arrival times of its runs/paper run (engine_compare.py prepare
# sets workload.time_scale from the run's recorded capacity, so nothing searches), then
# runs/paper-<engine>/compare.md holds the claims' numbers under both engines.
#   ENGINE=vllm-0.33 (default)  FIG23_LOADS=0.5,0.8 (or all)  LIMIT=N (a quick check)  JOBS=2
# Run reproduce.sh first. Results go under the current directory, as reproduce.sh's do.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
JOBS=${JOBS:-2}
ENGINE=${ENGINE:-vllm-0.33}
out="runs/paper-${ENGINE//[.-]/}"
extra=()
[ -n "${LIMIT:-}" ] && extra=(--limit "$LIMIT")
status=0
python -m lmsim.analysis.paper_engine_compare prepare runs/paper "$out" --set "cluster.engine=$ENGINE" \
  --fig23-loads "${FIG23_LOADS:-0.5,0.8}" "${extra[@]}" || exit 2
for fig in fig22 fig23; do
  [ -f "$out/$fig.yaml" ] || continue
  start=$SECONDS
  lmsim validate "$out/$fig.yaml" || exit 2
  lmsim sweep "$out/$fig.yaml" -j "$JOBS" || status=1
  echo "$fig under $ENGINE: $((SECONDS - start)) s"
  case $fig in
    fig22) kinds=(--kind cdf) ;;
    *) kinds=(--kind rate) ;;
  esac
  lmsim plot "$out/$fig" "${kinds[@]}" > /dev/null || status=1
done
if python -m lmsim.analysis.paper_engine_compare compare runs/paper "$out" --labels "default,$ENGINE" \
  --json "$out/compare.json" > "$out/.compare.md.tmp"; then
  mv "$out/.compare.md.tmp" "$out/compare.md"
else
  rm -f "$out/.compare.md.tmp"
  status=1
fi
echo "$out/compare.md; total: $SECONDS s"
exit $status
