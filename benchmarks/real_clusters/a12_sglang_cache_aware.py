"""A12: SGLang v0.4's cache-aware router (lm-sys/lm-sys.github.io@44576d5b
blog/2024-12-04-sglang-v0-4.md; the same numbers in sgl-project/sglang PR #2170; points.csv
A12) replayed in lmsim.

    python benchmarks/real_clusters/a12_sglang_cache_aware.py

The cluster: 8 x A100-80GB, Llama-3.1-8B-Instruct, `--dp-size 8` (8 engines of TP1),
SGLang 0.4 with the radix cache (`profile new --model llama-3.1-8b --gpu a100 --engine
sglang-0.4`; the KV pool is lmsim's at 0.9 utilization, the source does not report it).
The workload: `bench_serving --dataset-name generated-shared-prefix` with the script's
defaults (assumed by points.csv for Dec 2024: 64 groups x 16 prompts, system 2048, question
128, output 256, rate inf): the generator `generated_shared_prefix` with its defaults, every
request at t = 0. One load point, so no saturation stage; the ranking is of two routers.

Routers: the round-robin DP controller -> `round_robin`; the cache-aware router -> `sglang`
(sgl-router's cache-aware policy with its defaults).

Metrics: "throughput" = bench_serving's token/s, taken as total (input + output) tokens /
(last end - first send) (points.csv notes: 'likely total in+out'); `cache_hit_rate` = cached
prompt tokens / prompt tokens (SGLang's radix-cache hit rate), carried as an extra row.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

CASE = "A12"
SOURCE = "sglang-v0-4"
ROUTERS = {"round-robin DP controller": {"policy": "round_robin"},
           "sglang-router cache-aware": {"policy": "sglang", "view": {"kv_view": "approximate"}}}


def real_table():
    rows = harness.points(SOURCE)
    return harness.long_table(
        ("inf", r.router, {"throughput": "throughput", "cache_hit_rate": "cache_hit"}[r.metric],
         r.value / 100 if r.unit == "%" else r.value) for r in rows.itertuples())


def simulate():
    out = []
    for label, router in ROUTERS.items():
        results = harness.run({
            "name": f"{CASE}-{label}",
            "workload": {"generator": {"name": "generated_shared_prefix", "params": {}}},
            "cluster": {"num_instances": 8, "profile": harness.profile("llama-3.1-8b", "a100", 1, "sglang-0.4")},
            "router": router,
        })
        req = results.requests
        span = float(req.finished_at.max() - req.arrived_at.min())
        out += [("inf", label, "throughput", float((req.input_tokens.sum() + req.output_tokens.sum()) / span)),
                ("inf", label, "cache_hit", float(req.cached_tokens.astype(float).sum() / req.input_tokens.sum()))]
    return harness.long_table(out)


def main(argv=None) -> harness.Comparison:
    start = time.perf_counter()
    comparison = harness.compare(CASE, real_table(), simulate(), ["inf"])
    comparison.notes.append("one load point (rate inf); throughput = total tok/s; no TTFT published")
    harness.report(comparison, time.perf_counter() - start)
    return comparison


if __name__ == "__main__":
    main()
