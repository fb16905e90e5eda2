"""lmsim side by side with Dynamo's Rust mocker on the same trace and cluster.

    python benchmarks/against_dynamo.py [--trace JSONL] [--peer-python PATH] [--repeats 3]

Run it with the project's Python (lmsim importable). Dynamo runs in a separate interpreter,
`--peer-python` (default `$LMSIM_PEER_DYNAMO_PYTHON` or ../venvs/peer-dynamo/bin/python beside the checkout),
where `ai-dynamo-runtime==1.6.1` and `ai-dynamo==1.6.1 --no-deps` are installed; this script
installs nothing and touches no network. When that interpreter cannot import
`dynamo.replay`, only lmsim is timed.

Both sides replay the same Mooncake-format file (default: the Kimi conversation trace, first
40 minutes) on 16 workers of `--kv-tokens` KV tokens each (16-token blocks), 8,192 batched
tokens and 1,024 sequences, prefix caching and chunked prefill on. Router pairs:
Dynamo `round_robin` against lmsim `round_robin`, Dynamo `kv_router` against lmsim `dynamo`
(the same cost function, overlap weight 1). The step-time models differ (Dynamo's default
mocker model, lmsim's H20/Qwen3-30B-A3B profile), so the simulated schedules differ; this
compares simulator speed on the same traffic, not outputs.

Each run is a fresh child process; the two simulators alternate, `--repeats` times, and the
best run of each counts (the machine is shared: best-of-N is the least noisy figure).
Timed: Dynamo's `run_trace_replay` call (trace parsing included) and lmsim's
`Simulation.run()` plus, separately, lmsim's trace loading and cluster construction; both
as wall time and as the process's CPU time (all threads). On a shared machine the CPU-time
ratio is the steadier one: wall time there mostly measures the other jobs.

    python benchmarks/against_dynamo.py --outputs [--seeds 0,1,2] [--profile NAME]

compares outputs instead of speed: the prefix-cache hit ratio, and mean TTFT and TPOT, of
one mocker replay per router against lmsim at each seed with `cluster.cache_generated_blocks`
on (vLLM) and off. The profile defaults to `h100/qwen2-7b` there, whose step times are close
to the mocker's default timing model, so TTFT is comparable too (on the default H20 profile
requests live longer, and load-aware routing moves hits). What each side counts:

* the mocker (`aisimulate-core` 0.13, which ai-dynamo 1.6.1 runs; `RequestSequence`,
  `VllmKvManager.finalize_lease_computed_prefix`, `TraceCollector`) hashes every full block
  of prompt and output; output tokens are synthetic per request (`synthetic_output_token`,
  from the request id and position), so an output block is a cache entry that no other
  request can hit: a follow-up turn, whose prompt the trace builds from its own hash ids,
  never hits its predecessor's answer. Its `prefix_cache_reused_ratio` is the sum over
  completed requests of the largest hit of any admission, over their prompt tokens;
* lmsim's `prefix_hit_ratio` is the sum of hits over every admission (a resumed request
  counts again, its outputs included) over the tokens looked up, so the two agree exactly
  when nothing is preempted; its first-admission ratio is the mocker's without resumes.
  With `cache_generated_blocks` off, lmsim caches prompt blocks only: output blocks are
  freed as content-free blocks (reused first) where the mocker's age in the LRU queue.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from peer_harness import DEFAULT_PEER, DEFAULT_TRACE, cell, peer_available, run_json, trace_missing

PAIRS = (("round_robin", "round_robin"), ("kv_router", "dynamo"))
SPEED_PROFILE = "h20/qwen3-30b-a3b"
OUTPUTS_PROFILE = "h100/qwen2-7b"  # step times close to the mocker's default model

# Runs inside the peer interpreter; prints one JSON line.
DYNAMO_CHILD = r"""
import json, sys, time
from dynamo.replay import run_trace_replay
a = json.loads(sys.argv[1])
started, cpu = time.perf_counter(), time.process_time()
report = run_trace_replay(
    [a["trace"]],
    extra_engine_args={"engine": {
        "num_gpu_blocks": a["num_blocks"],
        "block_size": a["block_size"],
        "max_num_batched_tokens": a["max_batched"],
        "max_num_seqs": a["max_seqs"],
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
    }},
    num_workers=a["workers"],
    router_mode=a["router"],
    trace_format="mooncake",
    trace_block_size=a["trace_block_size"],
)
wall, cpu = time.perf_counter() - started, time.process_time() - cpu
s = report.summary
print(json.dumps({
    "wall_s": wall,
    "cpu_s": cpu,
    "reported_wall_s": float(s.get("wall_time_ms", 0.0)) / 1000.0,
    "num_requests": s.get("num_requests", s.get("completed_requests")),
    "hit": s.get("prefix_cache_reused_ratio"),
    "hit_first": s.get("first_admission_prefix_cache_reused_ratio"),
    "ttft_s": s["mean_ttft_ms"] / 1000.0 if s.get("mean_ttft_ms") is not None else None,
    "tpot_ms": s.get("mean_tpot_ms"),
}))
"""


def lmsim_child(a: dict) -> dict:
    """One lmsim replay in this (the project's) interpreter."""
    import time

    from lmsim.config import validate
    from lmsim.study.compose import build_simulation
    from lmsim.study.experiment import load_workload_trace

    started = time.perf_counter()
    config = validate(
        {
            "name": f"against-dynamo-{a['router']}",
            "seed": a.get("seed", 0),
            "workload": {"trace": a["trace"], "format": "mooncake"},
            "cluster": {
                "num_instances": a["workers"],
                "profile": a.get("profile", SPEED_PROFILE),
                "num_gpu_blocks": a["num_blocks"],
                "block_size": a["block_size"],
                "max_num_batched_tokens": a["max_batched"],
                "max_num_seqs": a["max_seqs"],
                "cache_generated_blocks": a.get("cache_generated_blocks", True),
            },
            "router": {"policy": a["router"]},
            "output": {"figures": False},
        },
        where="against_dynamo",
    )
    trace = load_workload_trace(config)
    sim = build_simulation(config, trace)
    setup = time.perf_counter() - started
    cpu = time.process_time()
    results = sim.run()
    s = results.summary
    return {
        "wall_s": s["wall_time_s"],
        "cpu_s": time.process_time() - cpu,
        "setup_s": setup,
        "num_requests": s["num_requests"],
        "num_finished": s["num_finished"],
        "hit": s["prefix_hit_ratio"],
        "hit_first": s["prefix_hit_ratio_first_admission"],
        "ttft_s": s["ttft_s_mean"],
        "tpot_ms": None if s["tpot_s_mean"] is None else s["tpot_s_mean"] * 1000.0,
        "preemptions": s.get("num_preemptions"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=DEFAULT_TRACE)
    p.add_argument("--peer-python", default=DEFAULT_PEER)
    p.add_argument(
        "--lmsim-python",
        default=sys.executable,
        help="interpreter for the lmsim runs (default: this one), e.g. to time another checkout",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--kv-tokens", type=int, default=280_000, help="KV tokens per worker")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batched", type=int, default=8192)
    p.add_argument("--max-seqs", type=int, default=1024)
    p.add_argument("--pairs", default="round_robin,kv_router", help="Dynamo router modes to run")
    p.add_argument(
        "--outputs", action="store_true",
        help="compare hit ratio and mean TTFT/TPOT (lmsim with generated-block caching on and off)",
    )
    p.add_argument("--seeds", default="0,1,2", help="lmsim seeds for --outputs")
    p.add_argument(
        "--profile", default=None,
        help=f"lmsim profile (default {SPEED_PROFILE}; {OUTPUTS_PROFILE} with --outputs)",
    )
    p.add_argument("--lmsim-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.lmsim_child:
        print(json.dumps(lmsim_child(json.loads(args.lmsim_child))))
        return 0
    if trace_missing(args.trace, "against_dynamo"):
        return 2

    common = {
        "trace": str(Path(args.trace).resolve()),
        "workers": args.workers,
        "num_blocks": args.kv_tokens // args.block_size,
        "block_size": args.block_size,
        "max_batched": args.max_batched,
        "max_seqs": args.max_seqs,
        "trace_block_size": 512,
    }
    have_peer = peer_available(args.peer_python)
    wanted = set(args.pairs.split(","))
    if args.outputs:
        common["profile"] = args.profile or OUTPUTS_PROFILE
        seeds = [int(x) for x in args.seeds.split(",")]
        return compare_outputs(args, common, have_peer, wanted, seeds)
    common["profile"] = args.profile or SPEED_PROFILE
    if not have_peer:
        print(f"Dynamo not importable with {args.peer_python}: timing lmsim only")
    print(
        f"trace {Path(args.trace).name}; {args.workers} workers x {common['num_blocks']} blocks of "
        f"{args.block_size} tokens; {args.max_batched} batched tokens; best of {args.repeats}, alternating"
    )
    print(
        f"{'router':24} {'dynamo s':>9} {'lmsim s':>9} {'ratio':>6} {'dynamo cpu':>10} "
        f"{'lmsim cpu':>9} {'ratio':>6} {'lmsim setup s':>13}"
    )
    for dyn_router, lm_router in PAIRS:
        if dyn_router not in wanted:
            continue
        dyn_runs, lm_runs = [], []
        for _ in range(args.repeats):
            if have_peer:
                dyn_runs.append(
                    run_json([args.peer_python, "-c", DYNAMO_CHILD, json.dumps({**common, "router": dyn_router})])
                )
            lm_runs.append(
                run_json([args.lmsim_python, __file__, "--lmsim-child", json.dumps({**common, "router": lm_router})])
            )
        errors = [r["error"] for r in dyn_runs + lm_runs if "error" in r]
        if errors:
            print(f"{dyn_router}/{lm_router}: error: {errors[0]}")
            continue
        cells = []
        for key in ("wall_s", "cpu_s"):
            lm = min(r[key] for r in lm_runs)
            dyn = min((r[key] for r in dyn_runs), default=None)
            cells.append(f"{cell(dyn, 9 if key == 'wall_s' else 10, '.2f')} {lm:9.2f} {cell(dyn and lm / dyn, 6, '.2f')}")
        setup = min(r["setup_s"] for r in lm_runs)
        print(f"{dyn_router + '/' + lm_router:24} {cells[0]} {cells[1]} {setup:13.2f}")
        detail = {"dynamo": dyn_runs, "lmsim": lm_runs}
        print(f"{'':24} runs: {json.dumps(detail)}", flush=True)
    return 0


def compare_outputs(
    args: argparse.Namespace, common: dict, have_peer: bool, wanted: set[str], seeds: list[int]
) -> int:
    """One mocker replay per router against lmsim per seed, generated-block caching on and
    off: hit ratio (all admissions, first admissions), mean TTFT and TPOT."""
    if not have_peer:
        print(f"Dynamo not importable with {args.peer_python}: lmsim only")
    print(
        f"trace {Path(args.trace).name}; {args.workers} workers x {common['num_blocks']} blocks of "
        f"{args.block_size} tokens; lmsim profile {common['profile']}, seeds {args.seeds}"
    )
    print(f"{'router':12} {'side':32} {'hit':>7} {'hit 1st':>7} {'TTFT s':>7} {'TPOT ms':>7}")

    def row(router: str, side: str, runs: list[dict]) -> None:
        cells = []
        for key, fmt in (("hit", ".4f"), ("hit_first", ".4f"), ("ttft_s", ".3f"), ("tpot_ms", ".2f")):
            values = [r[key] for r in runs if r.get(key) is not None]
            cells.append(f"{sum(values) / len(values):7{fmt}}" if values else f"{'-':>7}")
        print(f"{router:12} {side:32} {' '.join(cells)}", flush=True)

    for dyn_router, lm_router in PAIRS:
        if dyn_router not in wanted:
            continue
        if have_peer:
            dyn = run_json([args.peer_python, "-c", DYNAMO_CHILD, json.dumps({**common, "router": dyn_router})])
            if "error" in dyn:
                print(f"{dyn_router}: error: {dyn['error']}")
            else:
                row(dyn_router, "dynamo mocker", [dyn])
        for on in (True, False):
            runs = [
                run_json([args.lmsim_python, __file__, "--lmsim-child", json.dumps(
                    {**common, "router": lm_router, "seed": seed, "cache_generated_blocks": on}
                )])
                for seed in seeds
            ]
            errors = [r["error"] for r in runs if "error" in r]
            if errors:
                print(f"{lm_router}: error: {errors[0]}")
                continue
            side = f"lmsim {lm_router}, generated {'on' if on else 'off'}"
            row(lm_router, side, runs)
            print(f"{'':12} per seed: {json.dumps([round(r['hit'], 4) for r in runs])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
