#!/usr/bin/env bash
# KV tiers experiments (issue 26): hit ratio and TTFT vs host-tier size on the four study
# traces, the routers with and without a host tier, and write-through vs on-eviction stores.
# Rates: half of each trace's no-tier capacity as `lmsim capacity` reports it now (shipped or
# cached), so a re-calibration moves them with it. Resumable: rerunning skips complete runs.
# JOBS=2 by default, runs niced; results under $OUT (default runs/beyond), figures and
# `lmsim compare` tables under experiments/beyond/figures/tiers/. About 12 minutes on 2 cores.
set -u
cd "$(dirname "$0")/../.."
JOBS=${JOBS:-2}
OUT=${OUT:-runs/beyond}
FIG=experiments/beyond/figures/tiers
status=0
TRACES="chatbot agent toolagent coder"
declare -A REQUESTS=([chatbot]=20000 [agent]=40000 [toolagent]=8000 [coder]=3000)  # the study's workloads
declare -A LIMIT=([chatbot]=3000 [agent]=8000 [toolagent]=1500 [coder]=300)  # replayed: minutes on 2 cores
for t in $TRACES; do
  rate=$(lmsim capacity "experiments/traces/$t.yaml" | sed -n 's/.*load 0.5 = \([0-9.e+-]*\) req\/s.*/\1/p')
  if [ -z "$rate" ]; then echo "run_tiers: no capacity for $t" >&2; status=1; continue; fi
  echo "$t: rate $rate req/s"
  for exp in tiers_size tiers_ranking; do
    start=$SECONDS
    nice lmsim sweep "experiments/beyond/$exp.yaml" -j "$JOBS" --no-progress --out "$OUT/$exp/$t" \
      --set "workload.generator.name=$t" --set "workload.generator.params.num_requests=${REQUESTS[$t]}" \
      --set "workload.limit=${LIMIT[$t]}" --set "workload.rate=$rate" || status=1
    echo "$exp/$t: $((SECONDS - start)) s"
  done
done
start=$SECONDS
nice lmsim sweep experiments/beyond/tiers_store.yaml -j "$JOBS" --no-progress --out "$OUT/tiers_store" || status=1
echo "tiers_store: $((SECONDS - start)) s"
for exp in tiers_size tiers_ranking; do
  dirs=()
  for t in $TRACES; do dirs+=("$OUT/$exp/$t"); done
  lmsim plot "${dirs[@]}" --kind tiers --format png,pdf --out "$FIG/$exp" --overwrite || status=1
  lmsim compare "${dirs[@]}" > "$FIG/$exp/compare.txt" || status=1
done
lmsim plot "$OUT/tiers_store" --kind tiers --format png,pdf --out "$FIG/tiers_store" --overwrite || status=1
lmsim compare "$OUT/tiers_store" > "$FIG/tiers_store/compare.txt" || status=1
echo "figures and tables: $FIG; total: $SECONDS s"
exit $status
