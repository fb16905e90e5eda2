"""B2: openinfer's vLLM rate sweep on one RTX 5090 (openinfer-project/openinfer@6de49081
docs/benchmarks/qwen3-4b-serving-vllm-rtx5090.md; points.csv B2) replayed in lmsim.

    python benchmarks/real_clusters/b2_openinfer_rtx5090.py

The server: vLLM 0.22.1 (V1, lmsim's engine), Qwen3-4B BF16 TP1 on one RTX 5090 32 GB,
`--max-model-len 8192 --gpu-memory-utilization 0.9 --no-enable-prefix-caching`. The profile is
`profile new --model qwen3-4b --gpu rtx5090`: the shipped RTX 5090 (datasheet facts; its BF16
GEMM efficiencies fitted by `profile calibrate` on six public vLLM rows of other runs, never
on this case's numbers; kernel constants lent by the L40S; lmsim/data/hardware/gpus/rtx5090.yaml).
vLLM 0.22.1 schedules asynchronously by default (vllm-project/vllm PR 27614, "Enable async
scheduling by default"), so `async_scheduling` is on: the host part of a step overlaps the
GPU part of the one before (measured synchronous too: docs/explanation/real-clusters.md, B2).
vLLM's batch defaults for a card under 70 GiB (`EngineArgs.get_batch_defaults`, OpenAI
server): max_num_batched_tokens 2,048, max_num_seqs 256. The KV pool is lmsim's at 0.9 (the
source does not report it).

The client: `vllm bench serve --dataset-name random --random-input-len 1024
--random-output-len 128 --ignore-eos --seed 42 --burstiness 1.0`, num_prompts = 60 x QPS, QPS
in {1, 2, 4, 8, 10, 12, 16}: the generator `random` with those settings, one run per QPS (a
"stage"). The 8-request warm-up is left out (it warms CUDA graphs, which a simulator does
not have). Nothing is scaled down.

One router ("none"), so no ranking: the case checks the saturation stage and the ratios.
Metrics as vllm bench reports them: TTFT p50, output tok/s = output tokens / (last end -
first send); TPOT p50 rides along. Saturation uses the throughput rule as well (output tok/s <
0.9 x QPS x 128): vllm bench's duration is the sending window (60 s) plus one request's drain.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

CASE = "B2"
SOURCE = "openinfer-project/openinfer"
QPS = (1, 2, 4, 8, 10, 12, 16)
GPU = "rtx5090"


def real_table():
    rows = harness.points(SOURCE)
    names = {"ttft_p50": "ttft", "output_tok_per_s": "throughput", "tpot_p50": "tpot"}
    return harness.long_table(
        (str(r.rate_qps), "none", names[r.metric], r.value / 1000 if r.unit == "ms" else r.value)
        for r in rows.itertuples() if r.metric in names)


def simulate():
    out = []
    for qps in QPS:
        results = harness.run({
            "name": f"{CASE}-{qps}", "seed": 42,
            "workload": {"generator": {"name": "random", "params": {
                "num_requests": 60 * qps, "input_len": 1024, "output_len": 128, "rate": qps, "burstiness": 1.0}}},
            "cluster": {"num_instances": 1, "profile": harness.profile("qwen3-4b", GPU, 1),
                        "enable_prefix_caching": False, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
                        "max_model_len": 8192, "async_scheduling": True},
            "router": {"policy": "round_robin"}, "frontend": {},
        })
        req = results.requests
        span = float(req.finished_at.max() - req.arrived_at.min())
        out += [(str(qps), "none", "ttft", float(np.percentile(req.ttft_s, 50))),
                (str(qps), "none", "throughput", float(req.output_tokens.sum() / span)),
                (str(qps), "none", "tpot", float(np.percentile(req.tpot_s.dropna(), 50)))]
    return harness.long_table(out)


def main(argv=None) -> harness.Comparison:
    start = time.perf_counter()
    stages = [str(q) for q in QPS]
    comparison = harness.compare(CASE, real_table(), simulate(), stages,
                                 offered={str(q): q * 128.0 for q in QPS})
    comparison.notes.append("TTFT = p50 (the source's); one router, so no ranking; saturation by TTFT or throughput")
    harness.report(comparison, time.perf_counter() - start)
    return comparison


if __name__ == "__main__":
    main()
