"""What Dynamo's `replay_optimize` picks for a fixed-rate ChatBot-like load under a GPU budget
and TTFT/ITL bounds (issue 37 item 4), as JSON that `lmsim plan`'s answer can be set beside.

    python benchmarks/plan/dynamo_replay_optimize.py [--gpus 8] [--rate 16] [--duration-s 300]
        [--ttft-ms 500] [--itl-ms 25] [--mode disagg|agg|both] [--router both|round_robin|kv_router]
        [--peer-python PATH] [--json-only]

Run it with the project's Python. Dynamo runs in the peer interpreter (`--peer-python`,
default `$LMSIM_PEER_DYNAMO_PYTHON` or ../venvs/peer-dynamo/bin/python beside the checkout;
`ai-dynamo` 1.6.1). This script installs nothing.

What `dynamo.profiler.utils.replay_optimize` is (ai-dynamo 1.6.1, read for this script):
`optimize_dense_disagg_with_replay(spec)` / `optimize_dense_agg_with_replay(spec)` take a
`ReplayOptimizeSpec` (specs.py: engine = model, backend, base engine args per role;
hardware = `gpuSku`, `totalGpus`; workload = a trace file or synthetic ISL/OSL/rate; sla =
mean `ttft`, mean `itl` (the replay's `mean_tpot_ms`), `e2eLatency` and p95 variants;
router = `round_robin`, `kv_router` or `both` with sweeps of `overlapCredits` and
`prefillLoadScales`; objective = output throughput (default), mean TTFT or mean E2E).
search.py runs a block-coordinate descent of at most 3 rounds over Dynamo's offline replay:
(1) the TP pair (prefill_tp, decode_tp) at equal worker counts that fill the budget,
(2) the (prefill_workers, decode_workers) split among the states that use the most GPUs
(the "budget edge": it assumes the whole budget is spent), (3) the router mode, KV overlap
credit and prefill load scale. Each state is one replay (evaluate.py); a state is feasible
when every SLA bound holds and it fits the budget (penalty = sum of metric/bound - 1 over
violated bounds, +1 over budget); the best feasible state maximises the objective
(scoring.py `_pick_best_record`), else the least-violating one is returned as
`best_infeasible`. Output: `DenseReplayOptimizationResult` (best_feasible, best_infeasible,
evaluated_df, feasible_df).

What cannot run here, and what this script does instead: two steps of replay_optimize call
AISimulate (`aisimulate` 0.13, not installable here: see benchmarks/peer_stubs.py):
`aic._enumerate_dense_tp_candidates` (which TP sizes the GPU SKU's perf database has) and
`engine_args._build_candidate_engine_args` (every candidate's step times come from the AIS
perf model of model x GPU x TP). The script first calls replay_optimize unchanged and
records its error, then runs the same search code with those two hooks replaced: TP fixed at
1 (one GPU per worker) and the candidates' engine args left on the mocker's default
`polynomial` step model (disaggregated: a handoff of the whole prompt x 98,304 B/token at
50 GB/s, as benchmarks/fleet/dynamo_planner.py) (the closed forms lmsim's `polynomial` profile reproduces), so the
search, the feasibility gate and the ranking are Dynamo's own, over Dynamo's replay. The
answer is therefore "which P/D split (or how many aggregated workers) and which router
settings, out of a budget of N one-GPU workers", not a TP choice.

`dynamo_answer(...)` returns the JSON-ready answer; the CLI prints it (last line) and saves it
to benchmarks/plan/results/dynamo_replay_optimize.json with every evaluated state in
`dynamo_replay_optimize_states.csv`.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))

from dynamo_planner import make_trace
from peer_harness import DEFAULT_PEER, peer_available, run_in_peer
from peer_stubs import STUB_SOURCE

RESULTS = Path(__file__).resolve().parent / "results"

# Runs inside the peer interpreter; prints one JSON line.
DYNAMO_CHILD = STUB_SOURCE + r'''
import json, sys, time
a = json.loads(sys.argv[1])
from dynamo.mocker.config import normalize_mocker_config
from dynamo.profiler.utils.replay_optimize import (
    EngineSpec, HardwareSpec, ReplayOptimizeSpec, RouterSpec, SLASpec, WorkloadSpec,
    optimize_dense_agg_with_replay, optimize_dense_disagg_with_replay, aic, evaluate)

engine = {"num_gpu_blocks": a["num_blocks"], "block_size": a["block_size"], "max_num_batched_tokens": a["max_batched"],
          "max_num_seqs": a["max_seqs"], "enable_prefix_caching": True, "enable_chunked_prefill": True}
transfer = {"kv_transfer_bandwidth": a["bandwidth_gb_s"], "kv_transfer_bytes_per_token": a["bytes_per_token"]}
spec = ReplayOptimizeSpec(
    engine=EngineSpec(model=a["model"], backend="vllm",
                      baseEngineArgs={"engine": dict(engine)},
                      basePrefillEngineArgs={"engine": {**engine, **transfer}},
                      baseDecodeEngineArgs={"engine": {**engine, **transfer}}),
    hardware=HardwareSpec(gpuSku=a["gpu_sku"], totalGpus=a["gpus"]),
    workload=WorkloadSpec(traceFile=a["trace"], traceFormat="mooncake"),
    sla=SLASpec(ttft=a["ttft_ms"], itl=a["itl_ms"]),
    router=RouterSpec(mode=a["router"]),
    objective=a["objective"],
    maxParallelEvals=1,
)
optimize = {"disagg": optimize_dense_disagg_with_replay, "agg": optimize_dense_agg_with_replay}[a["mode"]]
out = {"mode": a["mode"]}
try:
    optimize(spec)
    out["unchanged"] = "ran"
except Exception as exc:  # what replay_optimize says without AISimulate
    out["unchanged"] = f"{type(exc).__name__}: {exc}"

# The two AISimulate hooks replaced (see the module docstring of dynamo_replay_optimize.py).
aic._enumerate_dense_tp_candidates = lambda backend, system: ([1], [1])
def _candidate(*, base_args, tp_size, worker_type, backend, system, model):
    payload = json.loads(json.dumps(base_args))
    payload.setdefault("engine", {}).update(backend=backend, worker_type=worker_type)
    payload["tensor_parallel_size"] = tp_size
    return normalize_mocker_config(payload)
evaluate._build_candidate_engine_args = _candidate
evaluate._build_agg_candidate_engine_args = (
    lambda *, base_args, tp_size, backend, system, model: _candidate(
        base_args=base_args, tp_size=tp_size, worker_type="aggregated", backend=backend, system=system, model=model))
started = time.perf_counter()
result = optimize(spec)
out["wall_s"] = time.perf_counter() - started
keep = ("prefill_tp", "decode_tp", "prefill_workers", "decode_workers", "tp", "workers", "router_mode",
        "overlap_score_credit", "prefill_load_scale", "total_gpus_used", "feasible", "violation_penalty", "score",
        "output_throughput_tok_s", "request_throughput_rps", "mean_ttft_ms", "p95_ttft_ms", "mean_tpot_ms",
        "p95_tpot_ms", "mean_itl_ms", "mean_e2e_latency_ms", "completed_requests", "duration_ms")
def clean(record):
    if record is None:
        return None
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in record.items() if k in keep}
out["best_feasible"] = clean(result.best_feasible)
out["best_infeasible"] = clean(result.best_infeasible)
out["evaluated"] = [clean(r) for r in result.evaluated_df.to_dict(orient="records")]
print(json.dumps(out, default=str))
'''


def dynamo_answer(*, gpus: int = 8, rate: float = 16.0, duration_s: float = 300.0, ttft_ms: float = 500.0,
                  itl_ms: float = 25.0, mode: str = "disagg", router: str = "both", objective: str = "throughput",
                  seed: int = 0,
                  num_blocks: int = 17_500, max_batched: int = 8192, max_seqs: int = 256,
                  bandwidth_gb_s: float = 50.0, bytes_per_token: int = 98_304,
                  gpu_sku: str = "h100_sxm", model: str = "Qwen/Qwen3-32B", trace: str | None = None,
                  peer_python: str = DEFAULT_PEER) -> dict:
    """Dynamo replay_optimize's choice for the case, as a JSON-ready dict.

    `answer` is the best feasible state (or, with none feasible, the least-violating one,
    flagged `feasible: false`): prefill/decode workers (or aggregated workers), GPUs, router
    settings and the replay's mean/p95 TTFT and TPOT. The trace is the ChatBot-like one of
    benchmarks/fleet/dynamo_planner.py at a single `rate` for `duration_s` (seed `seed`)
    unless `trace` names a Mooncake JSONL; `model` and `gpu_sku` only label the spec (the
    AIS perf model they would select cannot run here)."""
    if not peer_available(peer_python):
        return {"error": f"Dynamo not importable with {peer_python}"}
    with tempfile.TemporaryDirectory() as tmp:
        info = {"file": trace}
        if trace is None:
            trace = str(Path(tmp) / "chatbot_fixed_rate.jsonl")
            info = make_trace(Path(trace), [(0.0, rate)], duration_s, seed)
        a = {"trace": str(Path(trace).resolve()), "gpus": gpus, "ttft_ms": ttft_ms, "itl_ms": itl_ms, "mode": mode,
             "router": router, "objective": objective, "num_blocks": num_blocks, "block_size": 16, "max_batched": max_batched,
             "max_seqs": max_seqs, "gpu_sku": gpu_sku, "model": model,
             "bandwidth_gb_s": bandwidth_gb_s, "bytes_per_token": bytes_per_token}
        started = time.perf_counter()
        got = run_in_peer(peer_python, DYNAMO_CHILD, a)
        wall = time.perf_counter() - started
    if "error" in got:
        return {"error": got["error"], "process_wall_s": wall}
    best = got["best_feasible"] or got["best_infeasible"]
    answer = None
    if best is not None:
        if mode == "disagg":
            shape = {"prefill_workers": best["prefill_workers"], "decode_workers": best["decode_workers"],
                     "prefill_tp": best["prefill_tp"], "decode_tp": best["decode_tp"]}
        else:
            shape = {"workers": best["workers"], "tp": best["tp"]}
        answer = {**shape, "gpus": best["total_gpus_used"], "feasible": bool(best["feasible"]),
                  "router_mode": best["router_mode"], "overlap_score_credit": best["overlap_score_credit"],
                  "prefill_load_scale": best["prefill_load_scale"],
                  "ttft_ms_mean": best["mean_ttft_ms"], "ttft_ms_p95": best.get("p95_ttft_ms"),
                  "itl_ms_mean": best["mean_tpot_ms"], "itl_ms_p95": best.get("p95_tpot_ms"),
                  "output_tok_s": best["output_throughput_tok_s"], "request_rps": best.get("request_throughput_rps")}
    return {
        "source": "dynamo.profiler.utils.replay_optimize (ai-dynamo 1.6.1), AISimulate hooks replaced",
        "case": {"mode": mode, "gpu_budget": gpus, "rate_rps": rate, "duration_s": duration_s, "trace": info,
                 "slo": {"ttft_ms_mean": ttft_ms, "itl_ms_mean": itl_ms}, "router": router, "objective": objective,
                 "engine": {"num_gpu_blocks": num_blocks, "block_size": 16, "max_num_batched_tokens": max_batched,
                            "max_num_seqs": max_seqs, "step_model": "polynomial (mocker default)", "tp": 1,
                            "kv_transfer": None if mode == "agg" else
                            f"{bandwidth_gb_s:g} GB/s x {bytes_per_token} B/token, full prompt"}},
        "unchanged_run": got["unchanged"],
        "answer": answer,
        "states_evaluated": len(got["evaluated"]),
        "evaluated": got["evaluated"],
        "search_wall_s": got["wall_s"],
        "process_wall_s": wall,
    }


def dynamo_min_budget(*, max_gpus: int = 8, mode: str = "disagg", **case) -> dict:
    """The smallest GPU budget at which replay_optimize finds a feasible state.

    replay_optimize itself never spends less than its budget (it searches the budget edge,
    search.py), so "how few GPUs meet the SLO" is asked by running it at budgets 1 (2 for
    disaggregated), 2, ... `max_gpus` and stopping at the first feasible answer. Returns that
    answer with every budget's verdict in `budgets`."""
    budgets = []
    for gpus in range(2 if mode == "disagg" else 1, max_gpus + 1):
        got = dynamo_answer(gpus=gpus, mode=mode, **case)
        if "error" in got:
            return {**got, "budgets": budgets}
        answer = got["answer"] or {}
        budgets.append({"gpus": gpus, "feasible": answer.get("feasible"), "answer": answer,
                        "search_wall_s": got["search_wall_s"]})
        if answer.get("feasible"):
            return {**{k: v for k, v in got.items() if k != "evaluated"}, "budgets": budgets}
    return {"answer": None, "budgets": budgets, "note": f"no feasible state up to {max_gpus} GPUs"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=8, help="GPU budget (one GPU per worker)")
    p.add_argument("--rate", type=float, default=16.0, help="arrival rate, req/s")
    p.add_argument("--duration-s", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", help="a Mooncake JSONL instead of the generated ChatBot-like one")
    p.add_argument("--ttft-ms", type=float, default=500.0, help="mean TTFT bound")
    p.add_argument("--itl-ms", type=float, default=25.0, help="mean ITL (TPOT) bound")
    p.add_argument("--mode", default="both", choices=("disagg", "agg", "both"))
    p.add_argument("--router", default="both", choices=("both", "round_robin", "kv_router"))
    p.add_argument("--objective", default="throughput", choices=("throughput", "mean_ttft", "mean_e2e_latency"))
    p.add_argument("--min-gpus", action="store_true",
                   help="also find the smallest budget with a feasible state (one search per budget)")
    p.add_argument("--peer-python", default=DEFAULT_PEER)
    p.add_argument("--json-only", action="store_true", help="print only the JSON line")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.gpus < 1 or args.rate <= 0 or args.duration_s <= 0:
        print("dynamo_replay_optimize: --gpus, --rate and --duration-s must be positive", file=sys.stderr)
        return 2
    modes = ("disagg", "agg") if args.mode == "both" else (args.mode,)
    answers = {}
    for mode in modes:
        answers[mode] = dynamo_answer(gpus=args.gpus, rate=args.rate, duration_s=args.duration_s,
                                      ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, mode=mode, router=args.router,
                                      objective=args.objective, seed=args.seed, trace=args.trace,
                                      peer_python=args.peer_python)
        if not args.json_only:
            got = answers[mode]
            if "error" in got:
                print(f"{mode}: error: {got['error']}")
            else:
                print(f"{mode}: unchanged replay_optimize: {got['unchanged_run']}")
                print(f"{mode}: answer {json.dumps(got['answer'])} ({got['states_evaluated']} states, "
                      f"search {got['search_wall_s']:.1f} s wall)")
    if args.min_gpus:
        for mode in modes:
            smallest = dynamo_min_budget(max_gpus=args.gpus, mode=mode, rate=args.rate, duration_s=args.duration_s,
                                         ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, router=args.router,
                                         objective=args.objective, seed=args.seed, trace=args.trace,
                                         peer_python=args.peer_python)
            answers[f"{mode}_min_gpus"] = smallest
            if not args.json_only:
                print(f"{mode}: smallest feasible budget: {json.dumps(smallest.get('answer'))} "
                      f"(budgets tried: {[b['gpus'] for b in smallest.get('budgets', [])]})")
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        slim = {m: {k: v for k, v in a.items() if k != "evaluated"} for m, a in answers.items()}
        (RESULTS / "dynamo_replay_optimize.json").write_text(json.dumps(slim, indent=1, default=str) + "\n")
        rows = [{"mode": m, **r} for m, a in answers.items() for r in a.get("evaluated", [])]
        if rows:
            keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "mode", k))
            with open(RESULTS / "dynamo_replay_optimize_states.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(rows)
    print(json.dumps({m: {k: v for k, v in a.items() if k != "evaluated"} for m, a in answers.items()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
