#!/usr/bin/env bash
# Every experiment of experiments/beyond (disaggregated serving, issue 25), its figures and
# the tables of RESULTS.md. About 5 minutes on 2 cores (-j 2). Resumable: rerunning skips
# complete runs; after an engine or cost-model change, delete runs/beyond (or pass
# --rerun to lmsim sweep through "$@") and run again, then copy the new figures over.
# Rates are fixed (half of the shipped colocated capacities), so nothing searches a capacity.
set -u
cd "$(dirname "$0")/../.."
JOBS=${JOBS:-2}
FIGURES=experiments/beyond/figures
status=0
for exp in split routers_colocated routers_disaggregated; do
  start=$SECONDS
  lmsim sweep "experiments/beyond/$exp.yaml" -j "$JOBS" --no-progress "$@" || status=1
  echo "$exp: $((SECONDS - start)) s"
done
mkdir -p "$FIGURES"
# TTFT/TPOT against the number of prefill GPUs (of 16), the colocated cluster under vllm
# as the dotted reference line, one row per trace.
lmsim plot runs/beyond/split runs/beyond/routers_colocated --kind param \
  --param cluster.pools.0.num_instances --format png --out "$FIGURES/split" --overwrite > /dev/null || status=1
# TTFT and TPOT CDFs of every router, colocated and disaggregated, one row per trace.
lmsim plot runs/beyond/routers_colocated --kind cdf --format png --out "$FIGURES/routers_colocated" --overwrite > /dev/null || status=1
lmsim plot runs/beyond/routers_disaggregated --kind cdf --format png --out "$FIGURES/routers_disaggregated" --overwrite > /dev/null || status=1
python -m lmsim.analysis.beyond_tables runs/beyond > experiments/beyond/RESULTS.md || status=1
echo "figures: $FIGURES; tables: experiments/beyond/RESULTS.md; total $SECONDS s"
exit $status
