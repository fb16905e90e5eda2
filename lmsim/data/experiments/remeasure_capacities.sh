#!/usr/bin/env bash
# Re-measure every capacity the bundled experiments need (sweeps expanded) and rewrite
# experiments/capacity.json with exactly those entries. Run after any change to the engine,
# a profile, a generator or the capacity criterion. About 25 minutes on this project's
# shared 2-core machine, most of it the Coder search (see lmsim/study/capacity.py).
set -eu
cd "$(dirname "$0")/.."
start=$SECONDS
nice lmsim capacity --bundle --refresh experiments/*.yaml experiments/traces/*.yaml experiments/paper/*.yaml \
  experiments/bench/*.yaml
echo "re-measured in $((SECONDS - start)) s"
