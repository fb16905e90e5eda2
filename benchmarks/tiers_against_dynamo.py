"""lmsim's KV tiers side by side with Dynamo's mocker's host (and disk) tiers: per-tier hit
ratios at first admission and mean TTFT on the same Mooncake trace and cluster.

    python benchmarks/tiers_against_dynamo.py [--limit 300] [--workers 4] [--gpu-blocks 17500]
        [--host-blocks 70000] [--disk-blocks 0] [--routers round_robin,kv_router]
        [--step-model mocker|PROFILE] [--trace JSONL] [--peer-python PATH]

Run it with the project's Python (lmsim importable). The mocker (ai-dynamo 1.6.1 =
AISimulate 0.13, `dynamo.replay.run_trace_replay`) runs in `--peer-python` (default
`$LMSIM_PEER_DYNAMO_PYTHON` or ../venvs/peer-dynamo/bin/python beside the checkout); nothing is installed.
Both read the first `--limit` rows of the Kimi conversation trace (copied to a temporary
file, removed afterwards).

Mocker-parity settings on both sides (peer_research.md §A.2, §C.2):
* engine: vLLM mode, 16-token blocks, `--gpu-blocks` per worker, 8,192 batched tokens and
  1,024 sequences set explicitly (the mocker's default max_num_seqs is 256), prefix caching
  and chunked prefill on; KV 98,304 B/token (Qwen3-30B-A3B), the mocker's
  `kv_cache_bytes_per_token`.
* host tier: mocker `native_host_offload {num_host_blocks, d2h/h2d 32 GB/s, 0 latency}`;
  lmsim `kv_tiers: {host: {capacity_blocks, 32e9 B/s both ways, latency 0}, store:
  write_through, store_scope: prompt, load: before_admission, sharing: fifo}` (the mocker
  offloads prompt blocks only, through private FIFO lanes, and delays admission by the load).
* disk (`--disk-blocks`): mocker `g3_offload {worker_local, num_g3_blocks}` at its defaults
  (10 GB/s, 0.1 ms); lmsim `disk` at the same.
* generated blocks never hit: the mocker names output tokens synthetically (xxh3 of the
  request id), lmsim names them by the continuation. lmsim's `cluster.cache_generated_blocks:
  false` (branch `naming`) turns that off; where the field does not exist yet this script
  clears the engine's continuation map instead, which is the same thing for this trace.
* routers: mocker `round_robin` vs lmsim `round_robin`; mocker `kv_router` with
  `KvRouterConfig()` vs lmsim `dynamo` with `disk_cache_hit_weight: 0` (the replay router
  credits host blocks at 0.75 and ignores disk ones).
* step times: `--step-model mocker` (default) prices lmsim's steps with the mocker's own
  polynomial (AISimulate `perf_model.rs`, peer_research.md §A.3: prefill ms =
  4.209989e-7 T^2 + 1.518344e-2 T + 16.50142 over the batch's new tokens T, decode ms =
  max(1, -25.74 u^2 + 54.01 u + 5.74) with u the decodes' KV tokens over the pool, a mixed
  step the sum), a model local to this script and not an lmsim profile, so TTFTs compare
  like with like; a profile name uses that profile instead.

`--repeats N` runs each side N times (lmsim with seeds 0..N-1; the mocker's KV router breaks
ties at random, unseeded, so its runs differ) and prints each run and the means.

Hit ratios are over completed requests' input tokens, as `replay_runs.py` sums the mocker's
`first_admission_g1_reused_input_tokens` and `first_admission_host_reused_input_tokens` (the
latter includes disk-promoted blocks: lmsim's column is host + disk).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from peer_harness import DEFAULT_PEER, DEFAULT_TRACE, first_rows, run_in_peer, trace_missing

KV_BYTES_PER_TOKEN = 98_304
HOST_BYTES_S = 32e9  # the mocker's d2h/h2d_bandwidth_gbps default, GB/s (decimal)
DISK_BYTES_S, DISK_LATENCY_S = 10e9, 1e-4  # its g3_offload defaults

DYNAMO_CHILD = r"""
import json, sys
from dynamo.replay import run_trace_replay
from dynamo.llm import KvRouterConfig
a = json.loads(sys.argv[1])
engine = {"num_gpu_blocks": a["gpu_blocks"], "block_size": 16, "max_num_batched_tokens": 8192,
          "max_num_seqs": 1024, "enable_prefix_caching": True, "enable_chunked_prefill": True,
          "kv_cache_bytes_per_token": a["kv_bytes"]}
if a["host_blocks"]:
    engine["native_host_offload"] = {"num_host_blocks": a["host_blocks"]}
if a["disk_blocks"]:
    engine["g3_offload"] = {"scope": "worker_local", "num_g3_blocks": a["disk_blocks"]}
kw = {"router_config": KvRouterConfig()} if a["router"] == "kv_router" else {}
rep = run_trace_replay([a["trace"]], extra_engine_args={"engine": engine}, num_workers=a["workers"],
                       router_mode=a["router"], trace_format="mooncake", trace_block_size=512,
                       capture_per_request=True, **kw)
ok = [r for r in rep.per_request if r["terminal_status"] == "completed"]
tokens = sum(r["input_length"] for r in ok)
def first_g1(r):  # the per-tier fields exist only with a host tier: else the first admission's
    if r.get("first_admission_g1_reused_input_tokens") is not None:
        return r["first_admission_g1_reused_input_tokens"]
    return r["admission_history"][0]["reused_input_tokens"] if r.get("admission_history") else 0
g1 = sum(first_g1(r) for r in ok)
lower = sum(r.get("first_admission_host_reused_input_tokens") or 0 for r in ok)
print(json.dumps({"completed": len(ok), "requests": len(rep.per_request), "gpu": g1 / tokens,
                  "lower": lower / tokens, "ttft_ms": sum(r["ttft_ms"] for r in ok) / len(ok)}))
"""


class MockerPolynomial:
    """The mocker's default step time (AISimulate 0.13 `engine/common/perf_model.rs`,
    `polynomial_prefill_time` + `polynomial_decode_time`, vLLM mode adds them in a mixed
    step), with the StepCostModel methods the engine calls. Only this script uses it."""

    name = "mocker-polynomial"
    max_model_len = None
    kv_bytes_per_token = KV_BYTES_PER_TOKEN

    def __init__(self, pool_tokens: int) -> None:
        self.pool_tokens = pool_tokens

    def step_time(self, prefill_chunks, num_decodes: int, decode_context_tokens: int) -> float:
        new = sum(q for q, _ in prefill_chunks)
        ms = 0.0
        if new:
            ms += 4.209989e-07 * new * new + 1.518344e-02 * new + 1.650142e01
        if num_decodes:
            u = min(1.0, decode_context_tokens / self.pool_tokens)
            ms += max(1.0, -25.74 * u * u + 54.01 * u + 5.74)
        return ms / 1000.0

    def decode_run_times(self, num_decodes: int, context0: int, steps: int) -> np.ndarray:
        return np.array([self.step_time([], num_decodes, context0 + k * num_decodes) for k in range(steps)])

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float) -> None:
        return None


def lmsim_side(a: dict) -> dict:
    import lmsim.engine.simulation as simulation
    from lmsim.config import ClusterConfig, validate
    from lmsim.study.compose import make_policy
    from lmsim.study.experiment import load_workload_trace

    tiers: dict = {}
    if a["host_blocks"]:
        tiers = {
            "host": {"capacity_blocks": a["host_blocks"], "read_bytes_s": HOST_BYTES_S,
                     "write_bytes_s": HOST_BYTES_S, "latency_s": 0.0},
            "store": "write_through", "store_scope": "prompt", "load": "before_admission",
            "sharing": "fifo", "kv_bytes_per_token": a["kv_bytes"],
        }
        if a["disk_blocks"]:
            tiers["disk"] = {"capacity_blocks": a["disk_blocks"], "read_bytes_s": DISK_BYTES_S,
                             "write_bytes_s": DISK_BYTES_S, "latency_s": DISK_LATENCY_S}
    cluster = {
        "num_instances": a["workers"], "profile": a["step_model"] if a["step_model"] != "mocker" else "h20/qwen3-30b-a3b",
        "num_gpu_blocks": a["gpu_blocks"], "block_size": 16, "max_num_batched_tokens": 8192, "max_num_seqs": 1024,
        **({"kv_tiers": tiers} if tiers else {}),
    }
    naming_switch = "cache_generated_blocks" in ClusterConfig.model_fields
    if naming_switch:
        cluster["cache_generated_blocks"] = False
    policy = {"policy": "round_robin"} if a["router"] == "round_robin" else {
        "policy": "dynamo", "params": {"disk_cache_hit_weight": 0.0}}
    config = validate({"name": "tiers-vs-mocker", "seed": a.get("seed", 0), "workload": {"trace": a["trace"], "format": "mooncake"},
                       "cluster": cluster, "router": policy, "output": {"figures": False}}, where="tiers_against_dynamo")
    trace = load_workload_trace(config)
    if a["step_model"] == "mocker":
        model = MockerPolynomial(a["gpu_blocks"] * 16)
        simulation.load_cost_model = lambda spec: model
    sim = simulation.Simulation(config, trace, make_policy(config))
    if not naming_switch:
        sim._continuation[:] = -1  # outputs get no names: no request hits another's answer
    r = sim.run()
    req = r.requests[r.requests.status.astype(str) == "finished"]
    tokens = float(req.input_tokens.sum())
    lower = 0.0
    if "kv_hit_tokens_host" in req:
        lower = float(req.kv_hit_tokens_host.sum() + req.kv_hit_tokens_disk.sum())
    return {"completed": len(req), "requests": len(r.requests), "gpu": float(req.cached_tokens.sum()) / tokens,
            "lower": lower / tokens, "ttft_ms": float(req.ttft_s.mean()) * 1000.0,
            "naming": "cache_generated_blocks" if naming_switch else "continuations cleared"}


def peer_side(python: str, a: dict) -> dict:
    return run_in_peer(python, DYNAMO_CHILD, a)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=DEFAULT_TRACE)
    p.add_argument("--limit", type=int, default=300, help="first N rows of the trace")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--gpu-blocks", type=int, default=17_500)
    p.add_argument("--host-blocks", type=int, default=70_000, help="per worker; 0 runs without tiers")
    p.add_argument("--disk-blocks", type=int, default=0, help="per worker, below the host tier")
    p.add_argument("--routers", default="round_robin,kv_router")
    p.add_argument("--step-model", default="mocker", help="'mocker' (its polynomial) or an lmsim profile name")
    p.add_argument("--repeats", type=int, default=1, help="runs per side (lmsim seeds 0..N-1)")
    p.add_argument("--peer-python", default=DEFAULT_PEER)
    args = p.parse_args(argv)
    if trace_missing(args.trace, "tiers_against_dynamo"):
        return 2
    with tempfile.TemporaryDirectory(prefix="lmsim-tiers-") as tmp:
        path = first_rows(args.trace, args.limit, tmp)
        common = {"trace": str(path), "workers": args.workers, "gpu_blocks": args.gpu_blocks,
                  "host_blocks": args.host_blocks, "disk_blocks": args.disk_blocks, "kv_bytes": KV_BYTES_PER_TOKEN,
                  "step_model": args.step_model}
        print(f"{args.limit} rows of {Path(args.trace).name}; {args.workers} workers x {args.gpu_blocks} GPU blocks, "
              f"host {args.host_blocks} and disk {args.disk_blocks} blocks per worker; lmsim step model: {args.step_model}")
        print(f"{'router':12} {'side':7} {'done':>9} {'GPU hit':>8} {'lower hit':>9} {'total':>7} {'mean TTFT ms':>12}")
        naming = "?"
        for router in args.routers.split(","):
            sides = {
                "mocker": [peer_side(args.peer_python, {**common, "router": router}) for _ in range(args.repeats)],
                "lmsim": [lmsim_side({**common, "router": router, "seed": k}) for k in range(args.repeats)],
            }
            means = {}
            for side, rows in sides.items():
                for row in rows:
                    if "error" in row:
                        print(f"{router:12} {side:7} error: {row['error']}")
                        continue
                    naming = row.get("naming", naming)
                    print(f"{router:12} {side:7} {row['completed']:>4}/{row['requests']:<4} {row['gpu']:8.4f} "
                          f"{row['lower']:9.4f} {row['gpu'] + row['lower']:7.4f} {row['ttft_ms']:12.1f}")
                ok = [r for r in rows if "error" not in r]
                if ok:
                    means[side] = {k: sum(r[k] for r in ok) / len(ok) for k in ("gpu", "lower", "ttft_ms")}
                    if len(ok) > 1:
                        m = means[side]
                        print(f"{router:12} {side:7} {'mean':>9} {m['gpu']:8.4f} {m['lower']:9.4f} "
                              f"{m['gpu'] + m['lower']:7.4f} {m['ttft_ms']:12.1f}")
            if len(means) == 2:
                m, ls = means["mocker"], means["lmsim"]
                print(f"{'':12} {'diff':7} {'':9} {ls['gpu'] - m['gpu']:+8.4f} {ls['lower'] - m['lower']:+9.4f} "
                      f"{ls['gpu'] + ls['lower'] - m['gpu'] - m['lower']:+7.4f} {ls['ttft_ms'] - m['ttft_ms']:+12.1f}")
        print(f"(lmsim generated-block naming off via: {naming})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
