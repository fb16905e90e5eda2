#!/usr/bin/env bash
# Reproduce every seed experiment, then the figures, the report and the claims table's
# numbers (2 cores: -j 2). Resumable: rerunning skips complete runs. Capacities come from
# experiments/capacity.json. Each sweep's figures are drawn in the background while the
# next sweep runs (a sweep's last points leave a core idle); the report waits for them and
# reuses their PNGs. verdicts.py then writes runs/paper/verdicts.md (every number the
# README's claims table quotes, and how each moved since verdicts_before.json) and
# runs/paper/verdicts.json. Results go to runs/paper/ under the current directory (never
# beside this script, which may be inside an installed package).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
JOBS=${JOBS:-2}
status=0
plots=()
for fig in fig11 fig12 fig15 fig19 fig21 fig22 fig23 fig26 canary; do
  start=$SECONDS
  lmsim sweep "$here/$fig.yaml" -j "$JOBS" "$@" || status=1
  echo "$fig: $((SECONDS - start)) s (figures drawing in the background)"
  # Figures 22 and 23 sweep llm-d's noise_rel (deployed vs oracle): no plot against it
  case $fig in
    fig22) kinds=(--kind cdf,error) ;;
    fig23) kinds=(--kind cdf,rate,error) ;;
    *) kinds=() ;;
  esac
  lmsim plot "runs/paper/$fig" "${kinds[@]}" > /dev/null &
  plots+=("$!:$fig")
done
for entry in "${plots[@]}"; do
  wait "${entry%%:*}" || { echo "plot ${entry#*:} failed"; status=1; }
done
echo "figures: runs/paper/*/figures; $SECONDS s"
lmsim report runs/paper || status=1
mkdir -p runs/paper
# written beside, then renamed: a failed run leaves the previous verdicts.md whole
if python -m lmsim.analysis.paper_verdicts runs/paper --json runs/paper/verdicts.json \
  --before "$here/verdicts_before.json" > runs/paper/.verdicts.md.tmp; then
  mv runs/paper/.verdicts.md.tmp runs/paper/verdicts.md
else
  rm -f runs/paper/.verdicts.md.tmp
  status=1
fi
echo "claims numbers: runs/paper/verdicts.md; total: $SECONDS s"
exit $status
