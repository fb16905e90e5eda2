"""A4: llm-d kv-cache-manager "medium-scale-frequent-evictions" (llm-d/llm-d-kv-cache-manager@85e7a4a4
benchmarking/medium-scale-frequent-evictions/README.md; points.csv A4) replayed in lmsim.

    python benchmarks/real_clusters/a4_llmd_frequent_evictions.py [--stages N] [--routers a,b]

The cluster: 4 pods of Llama-3.1-70B-Instruct, TP=2 (H100 assumed; GPU not stated), "a KVCache
of 40k tokens" per pod as the report states (the pool is set to 40,000 tokens). The workload
(`harness.llmd_ladder`): shared_prefix 60 groups x 1 prompt, system 3,500 + question 256,
output 20 (ignore_eos), constant stages 2, 5, 8, 10, 12, 15, 20 req/s x 50 s, no warm-up
stage; one cycle of users is 1.25x the cluster's KV, so every router thrashes. Nothing scaled.

Routers: the report's EndpointPickerConfigs (`CONFIGS`), all weights 1: random-routing;
load = queue + kv-cache; estimate = those + prefix-cache-scorer (hashBlockSize 64,
maxPrefixBlocksToMatch 256, lruCapacityPerServer 31,250); precise = prefix-cache-scorer
mode cache_tracking + kv-cache + queue.

Real per-stage numbers (output tok/s, TTFT mean) are transcribed from the report's per-QPS
tables (`REAL`); points.csv holds the summaries; their output tok/s is the plain mean of these.
The point of the case (cluster_benchmarks README): a simulator must not over-predict routing
gains under thrashing (the real precise gains ~10% over the rest).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

CASE = "A4"
SOURCE = "medium-scale-frequent-evictions/README.md"
STAGES = tuple((rate, 50) for rate in (2, 5, 8, 10, 12, 15, 20))
CONFIGS = {
    "precise-prefix-cache": harness.epp_config(("prefix-cache-scorer", {"mode": "cache_tracking"}),
                                               ("kv-cache-scorer", None), ("queue-scorer", None)),
    "estimate-prefix-cache": harness.epp_config(("queue-scorer", None), ("kv-cache-scorer", None), ("prefix-cache-scorer", {
        "hashBlockSize": 64, "maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250})),
    "load": harness.epp_config(("queue-scorer", None), ("kv-cache-scorer", None)),
    "random-routing": harness.EPP_RANDOM,
}
ROUTERS = {name: {"policy": "llmd_epp", "params": config} for name, config in CONFIGS.items()}

# Per-QPS tables (rates 2..20): (output tok/s, TTFT mean s) per router.
REAL = {
    "precise-prefix-cache": ((31.2, 4.988), (47.0, 8.417), (66.8, 22.308), (65.4, 30.473), (63.9, 35.035),
                             (60.4, 38.792), (63.5, 38.095)),
    "estimate-prefix-cache": ((34.8, 4.491), (38.3, 14.197), (59.3, 31.786), (58.1, 36.131), (58.6, 37.995),
                              (57.0, 42.164), (58.9, 41.715)),
    "load": ((32.4, 6.527), (48.8, 18.657), (58.5, 32.227), (54.9, 38.835), (55.1, 41.399), (57.3, 41.565),
             (57.6, 43.130)),
    "random-routing": ((31.4, 4.969), (50.9, 14.940), (48.3, 34.728), (56.5, 35.171), (54.2, 38.846), (51.7, 38.873),
                       (55.4, 41.779)),
}


def real_table():
    labels = [f"{rate:g}" for rate, _ in STAGES]
    rows = harness.points(SOURCE)
    for router, stages in REAL.items():
        # the summary's output tok/s is the plain mean of the stages; its TTFT mean is not
        # (31.9 s for precise vs 25.4 s over stages: a mean over requests), so only the former
        summary = harness.point(rows, router=router, metric="output_tok_per_s")
        assert abs(sum(s[0] for s in stages) / len(stages) - summary) < 0.1, router
    return harness.long_table(
        (label, router, metric, value) for router, rows in REAL.items() for label, (tput, ttft) in zip(labels, rows)
        for metric, value in (("throughput", tput), ("ttft", ttft)))


def main(argv=None) -> harness.Comparison:
    stages, routers, labels = harness.ladder_selection(argv, __doc__, STAGES, ROUTERS, warmup=False)
    real = real_table()
    real = real[real.stage.isin(labels) & real.router.isin(routers)]
    return harness.run_llmd_case(
        CASE, routers, real, labels, "stages as the source ran them; KV 40,000 tokens per pod as stated ('40k')",
        model="llama-3.1-70b", gpu="h100", tp=2, kv_tokens_per_pod=40_000, num_pods=4,
        groups=60, per_group=1, system_len=3500, question_len=256, output_len=20, stages=stages, warmup=False)


if __name__ == "__main__":
    main()
