"""lmsim's disaggregated serving side by side with Dynamo's mocker in disaggregated mode.

    python benchmarks/against_dynamo_disagg.py [--limit 300] [--prefill 2 --decode 2]
        [--trace JSONL] [--peer-python PATH] [--outputs-hit] [--decode-choice at_arrival]

Run it with the project's Python (lmsim importable). Dynamo runs in a separate interpreter,
`--peer-python` (default `$LMSIM_PEER_DYNAMO_PYTHON` or ../venvs/peer-dynamo/bin/python beside the checkout,
`ai-dynamo` 1.6.1, whose offline replay is AISimulate 0.13); this script installs nothing.

Both replay the same Mooncake file (default: the Kimi conversation trace, first 40 minutes;
`--limit N` keeps its first N rows) on P prefill and D decode workers of 17,500 blocks of
16 tokens, 8,192 batched tokens and `--max-seqs` sequences (1,024; the mocker's default is
256, so it is set on both sides), round robin on each pool, vLLM engine mode, and a KV
transfer of the whole prompt x 98,304 B/token (Qwen3-30B-A3B) at 50 GB/s:

| setting | Dynamo's mocker | lmsim |
|---|---|---|
| step model | default `polynomial` timing model | `{kind: polynomial}` profile (lmsim/profile/polynomial.py), `worker_type` prefill / decode per pool |
| transfer | `kv_transfer_bandwidth: 50`, `kv_transfer_bytes_per_token` on both pools, timing mode `full_prompt` (default) | `kv_transfer: {bandwidth_bytes_s: 50e9, latency_s: 0, sharing: none, tokens: full_prompt}` |
| handoff | vLLM mode: source-first | the same (engine/disagg.py) |
| decode choice | round robin over prefill completions (the per-request records show it) | `pd` with `decode_choice: after_prefill` (`--decode-choice`) |
| generated blocks | cached under synthetic ids no prompt can hit | not cached (`--outputs-hit` caches them as lmsim does by default) |

Printed: mean and p90 TTFT, mean TPOT per request (the mocker's `mean_tpot_ms`), TPOT per
output token (its `mean_itl_ms`, lmsim's `itl_s_mean`), the mean TPOT of the requests that
neither simulator preempted, the first-admission prefix hit ratio, the mean transfer time
(the mocker's reserved -> activated, which includes waiting for the decode worker's next
pass) and the preempted requests. The per-request records of both are matched by (arrival,
prompt, output) to name where they differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from peer_harness import (
    DEFAULT_PEER,
    DEFAULT_TRACE,
    cell,
    first_rows,
    peer_available,
    run_in_peer,
    trace_missing,
)

# Runs inside the peer interpreter: writes the summary and per-request records as JSON.
DYNAMO_CHILD = r"""
import json, sys
from dynamo.replay import run_trace_replay
a = json.loads(sys.argv[1])
base = {"num_gpu_blocks": a["num_blocks"], "block_size": a["block_size"], "max_num_batched_tokens": a["max_batched"],
        "max_num_seqs": a["max_seqs"], "enable_prefix_caching": True, "enable_chunked_prefill": True,
        "kv_transfer_bandwidth": a["bandwidth_gb_s"], "kv_transfer_bytes_per_token": a["bytes_per_token"]}
report = run_trace_replay(
    [a["trace"]],
    prefill_engine_args={"engine": {**base, "worker_type": "prefill"}},
    decode_engine_args={"engine": {**base, "worker_type": "decode"}},
    num_prefill_workers=a["prefill"], num_decode_workers=a["decode"], router_mode=a["router_mode"],
    trace_format="mooncake", trace_block_size=512, capture_per_request=True,
)
keys = ("completed_requests", "mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
        "first_admission_prefix_cache_reused_ratio")
json.dump({"summary": {k: report.summary.get(k) for k in keys}, "per_request": report.per_request}, open(a["out"], "w"))
"""


def lmsim_run(a: dict) -> tuple[dict, object]:
    """The lmsim replay in this interpreter: (summary, requests frame)."""
    from lmsim.config import ClusterConfig, validate
    from lmsim.study.compose import build_simulation
    from lmsim.study.experiment import load_workload_trace

    poly = {"kind": "polynomial"}
    cluster = {
        "profile": poly,
        "num_gpu_blocks": a["num_blocks"],
        "block_size": a["block_size"],
        "max_num_batched_tokens": a["max_batched"],
        "max_num_seqs": a["max_seqs"],
        "pools": [
            {"name": "prefill", "role": "prefill", "num_instances": a["prefill"],
             "profile": {**poly, "worker_type": "prefill", "kv_bytes_per_token": a["bytes_per_token"]}},
            {"name": "decode", "role": "decode", "num_instances": a["decode"], "profile": {**poly, "worker_type": "decode"}},
        ],
        "kv_transfer": {"bandwidth_bytes_s": a["bandwidth_gb_s"] * 1e9, "latency_s": 0.0, "sharing": "none",
                        "tokens": "full_prompt"},
    }
    # cluster.cache_generated_blocks (branch `naming`) switches output naming off in the
    # config; until it is merged, the replay's continuation table is emptied instead.
    has_switch = "cache_generated_blocks" in ClusterConfig.model_fields
    if has_switch:
        cluster["cache_generated_blocks"] = a["outputs_hit"]
    config = validate({
        "name": "against-dynamo-disagg",
        "workload": {"trace": a["trace"], "format": "mooncake"},
        "cluster": cluster,
        "router": ({"policy": "pd", "params": {"prefill_policy": "round_robin", "decode_policy": "round_robin",
                                               "decode_choice": a["decode_choice"]}}
                   if a["router"] == "round_robin" else
                   {"policy": "dynamo_disagg", "params": {"decode_choice": a["decode_choice"]}}),
        "output": {"figures": False},
    }, where="against_dynamo_disagg")
    trace = load_workload_trace(config)
    sim = build_simulation(config, trace)
    if not has_switch and not a["outputs_hit"]:
        sim._continuation[:] = -1
    results = sim.run()
    return results.summary, results.requests


def dynamo_run(a: dict, python: str) -> dict | None:
    if not peer_available(python):
        return None
    answer = run_in_peer(python, DYNAMO_CHILD, a)
    if "error" in answer:
        raise SystemExit(f"against_dynamo_disagg: the mocker failed: {answer['error']}")
    return json.loads(Path(a["out"]).read_text())


def compare(summary: dict, requests, peer: dict) -> list[tuple[str, float | None, float | None]]:
    import numpy as np
    import pandas as pd

    mine = requests[requests.status.astype(str) == "finished"]
    theirs = pd.DataFrame(peer["per_request"])
    theirs = theirs[theirs.terminal_status == "completed"]
    # rows matched by (arrival, prompt, output): the per-request records of both
    mine = mine.assign(_a=(1000 * mine.arrived_at).round(3)).sort_values(["_a", "input_tokens", "output_tokens"])
    theirs = theirs.assign(_a=theirs.arrival_time_ms.round(3)).sort_values(["_a", "input_length", "output_length"])
    matched = len(mine) == len(theirs) and (mine.input_tokens.to_numpy() == theirs.input_length.to_numpy()).all()
    their_tpot = ((theirs.last_token_ms - theirs.first_token_ms) / (theirs.output_length - 1)).to_numpy()
    my_tpot = 1000 * mine.tpot_s.to_numpy(dtype=float)
    calm = np.nan, np.nan
    if matched:
        quiet = (mine.num_preemptions.to_numpy() == 0) & (theirs.readmission_count.to_numpy() == 0)
        keep = quiet & ~np.isnan(my_tpot) & (theirs.output_length.to_numpy() > 1)
        calm = float(np.mean(my_tpot[keep])), float(np.mean(their_tpot[keep]))
    handoff = (theirs.destination_activated_ms - theirs.destination_reserved_ms).dropna()
    s, p = summary, peer["summary"]
    return [
        ("completed requests", s["num_finished"], p["completed_requests"]),
        ("mean TTFT ms", 1000 * s["ttft_s_mean"], p["mean_ttft_ms"]),
        ("p90 TTFT ms", 1000 * s["ttft_s_p90"], p["p90_ttft_ms"]),
        ("mean TPOT ms (per request)", 1000 * s["tpot_s_mean"], p["mean_tpot_ms"]),
        ("TPOT ms per output token", 1000 * s["itl_s_mean"], p["mean_itl_ms"]),
        ("mean TPOT ms, never preempted", *calm),
        ("prefix hit (first admission)", s["prefix_hit_ratio_first_admission"], p["first_admission_prefix_cache_reused_ratio"]),
        ("mean transfer ms", 1000 * s["kv_transfer_s_mean"], float(handoff.mean()) if len(handoff) else None),
        ("requests preempted", int((mine.num_preemptions > 0).sum()), int((theirs.readmission_count > 0).sum())),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=DEFAULT_TRACE)
    p.add_argument("--limit", type=int, default=None, help="keep the trace's first N rows")
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--num-blocks", type=int, default=17_500)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batched", type=int, default=8192)
    p.add_argument("--max-seqs", type=int, default=1024)
    p.add_argument("--bandwidth-gb-s", type=float, default=50.0)
    p.add_argument("--bytes-per-token", type=int, default=98_304)
    p.add_argument("--decode-choice", default="after_prefill", choices=("after_prefill", "at_arrival"))
    p.add_argument("--router", default="round_robin", choices=("round_robin", "kv"),
                   help="round robin on each pool, or Dynamo's KV router (lmsim: dynamo_disagg)")
    p.add_argument("--outputs-hit", action="store_true", help="cache generated blocks under names later prompts hit (lmsim's default)")
    p.add_argument("--peer-python", default=DEFAULT_PEER)
    args = p.parse_args(argv)
    if trace_missing(args.trace, "against_dynamo_disagg"):
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        trace = first_rows(args.trace, args.limit, tmp)
        a = {"trace": str(trace), "prefill": args.prefill, "decode": args.decode, "num_blocks": args.num_blocks,
             "block_size": args.block_size, "max_batched": args.max_batched, "max_seqs": args.max_seqs,
             "bandwidth_gb_s": args.bandwidth_gb_s, "bytes_per_token": args.bytes_per_token,
             "decode_choice": args.decode_choice, "outputs_hit": args.outputs_hit, "out": str(Path(tmp) / "peer.json"),
             "router": args.router, "router_mode": "round_robin" if args.router == "round_robin" else "kv_router"}
        summary, requests = lmsim_run(a)
        peer = dynamo_run(a, args.peer_python)
    rows_note = f"first {args.limit} rows of " if args.limit else ""
    print(f"{rows_note}{Path(args.trace).name}; {args.prefill}P+{args.decode}D x {args.num_blocks} blocks of "
          f"{args.block_size}; {args.max_batched} batched tokens, {args.max_seqs} seqs; "
          f"{'round robin' if args.router == 'round_robin' else 'KV router (dynamo_disagg)'}; "
          f"full-prompt transfer at {args.bandwidth_gb_s:g} GB/s; decode chosen {args.decode_choice.replace('_', ' ')}; "
          f"generated blocks {'cached' if args.outputs_hit else 'not hit'}")
    if peer is None:
        print(f"Dynamo not importable with {args.peer_python}: lmsim only")
        print(json.dumps({k: summary[k] for k in ("ttft_s_mean", "tpot_s_mean", "prefix_hit_ratio_first_admission")}))
        return 0
    print(f"{'':32} {'lmsim':>10} {'Dynamo':>10} {'diff':>8}")
    for name, mine, theirs in compare(summary, requests, peer):
        diff = "" if mine is None or theirs is None or not theirs else f"{100 * (mine - theirs) / theirs:+7.1f}%"
        print(f"{name:32} {cell(mine):>10} {cell(theirs):>10} {diff:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
