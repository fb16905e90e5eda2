"""Dynamo's planner inside its offline replay, side by side with lmsim's fleet autoscaler
(issue 36 item 6).

    python benchmarks/fleet/dynamo_planner.py [--cases NAMES] [--peer-python PATH]
        [--segments "0:2,300:6,600:12,900:20,1200:10,1500:3" --end 1800] [--no-lmsim]

Run it with the project's Python (lmsim importable). Dynamo runs in a separate interpreter,
`--peer-python` (default `$LMSIM_PEER_DYNAMO_PYTHON` or ../venvs/peer-dynamo/bin/python beside
the checkout; `ai-dynamo` 1.6.1). This script installs nothing.

The trace (`make_trace`): ChatBot-like single-turn requests, Poisson arrivals whose rate
steps up and down over 30 simulated minutes (default 2 -> 6 -> 12 -> 20 -> 10 -> 3 req/s,
5 minutes each, 15.9k requests), one of 8 system prompts of 1,024 tokens (Zipf 1.1) and a
user part (lognormal, median 900 tokens), output lognormal with median 300 tokens; written
as Mooncake JSONL (512-token hash ids) so both simulators read the same file.

The cluster: workers of 17,500 blocks of 16 tokens, 8,192 batched tokens and 256 sequences,
Dynamo's mocker default `polynomial` step model (lmsim: the `polynomial` profile with
`worker_type` per pool, the same closed forms, lmsim/profile/polynomial.py), round robin,
prefix caching on, worker start-up `--startup-s` (60 s: the mocker's `startup_time`), a P/D
handoff of the whole prompt x 98,304 B/token at 50 GB/s (as benchmarks/against_dynamo_disagg.py;
with the mocker's transfer left unset its handoff takes no time and skips the wait lmsim
models, 78.6 against lmsim's 92.1 ms mean TTFT on 1P+4D; set, 92.53 against 92.44).

Dynamo cases (each one `run_trace_replay(..., planner_config=...)` call; what its planner
does is in docs/explanation/dynamo-planner.md):

* `fixed-disagg` / `fixed-agg`: 1 prefill + 4 decode (4 aggregated) workers for the whole
  run, no planner (reference);
* `sla-disagg` / `sla-agg`: `optimization_target: sla` (TTFT/ITL targets, throughput scaling
  every `--throughput-interval-s` with the `--predictor` load predictor, Kalman by default:
  lmsim's `sla_planner` has the constant and Kalman ones, not Dynamo's default ARIMA). It
  is the case lmsim's `sla_planner` runs against (with `isl_from: --isl-from`, `finished`
  by default: Dynamo's replay averages a window's ISL over the requests completed in it).
  Its performance model needs AISimulate, which cannot be installed here: as shipped
  (`--dynamo-perf-model aisimulate`) every throughput decision is `model_not_ready` and the
  fleet stays at its initial size; with `--dynamo-perf-model polynomial` (default) the one
  native piece, the forward-pass time estimate, is the mocker's polynomial step model
  (benchmarks/peer_stubs.py says exactly what is replaced) and the rest of the planner runs
  as shipped;
* `load-disagg` / `load-agg`: `optimization_target: load`, Dynamo's FPM-driven load scaling
  every `--load-interval-s`: prefill scales up when a worker's queued prefill tokens reach
  `--prefill-up-tokens`, down when all are at or below `--prefill-down-tokens`; decode (and
  aggregated) workers scale on KV utilisation (scheduled + queued KV tokens / KV capacity)
  between `--kv-down-pct` and `--kv-up-pct`;
* `latency-disagg`: `optimization_target: latency`, the same loop with Dynamo's built-in
  thresholds (prefill queue >= context/10 up, == 0 down; decode KV > 40 % up, < 10 % down).
  lmsim has no such thresholds scaler: these cases' own trajectories are replayed through
  lmsim's fleet with the `schedule` autoscaler (`dynamo-fleet:<case>` rows), which separates
  the engine (start-up, drain, routing) from the planner.

Saved to benchmarks/fleet/results/: `dynamo_planner_summary.json` (per case: GPU-hours,
SLO attainment against the TTFT/ITL targets, latency means and p90s, scale events, wall
time of the Dynamo call), `dynamo_planner_trajectory.csv` (per planner tick: the active,
starting and draining workers per role) and the same for the lmsim half when lmsim has a
fleet and the `sla_planner` autoscaler (`lmsim_planner_*`; otherwise the script says that
lmsim lacks them and saves the Dynamo half only); `*_planner_decisions.csv`: every throughput
tick of the SLA planners (observed window, forecast, per-engine capacity, targets).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # this checkout's lmsim

from peer_harness import DEFAULT_PEER, cell, peer_available, run_in_peer
from peer_stubs import POLYNOMIAL_PERF_MODEL_SOURCE, STUB_SOURCE

RESULTS = Path(__file__).resolve().parent / "results"
CHECKOUT = Path(__file__).resolve().parents[2]
DEFAULT_SEGMENTS = "0:2,300:6,600:12,900:20,1200:10,1500:3"
ROLES = ("prefill", "decode", "agg")

# Runs inside the peer interpreter; prints one JSON line (the file `out` holds the details).
DYNAMO_CHILD = STUB_SOURCE + POLYNOMIAL_PERF_MODEL_SOURCE + r'''
import json, sys, time
from dynamo.replay import run_trace_replay
a = json.loads(sys.argv[1])
if a["perf_model"] == "polynomial":
    use_polynomial_perf_model(a["checkout"], a["num_blocks"] * a["block_size"])
engine = {"num_gpu_blocks": a["num_blocks"], "block_size": a["block_size"], "max_num_batched_tokens": a["max_batched"],
          "max_num_seqs": a["max_seqs"], "max_model_len": a["max_model_len"], "enable_prefix_caching": True,
          "enable_chunked_prefill": True}
launch = {"startup_time": a["startup_s"]}
transfer = {"kv_transfer_bandwidth": a["bandwidth_gb_s"], "kv_transfer_bytes_per_token": a["bytes_per_token"]}
kw = dict(trace_format="mooncake", trace_block_size=512, router_mode="round_robin", capture_per_request=True)
if a["planner"] is not None:
    kw["planner_config"] = a["planner"]
started = time.perf_counter()
if a["mode"] == "agg":
    report = run_trace_replay([a["trace"]], extra_engine_args={**launch, "engine": engine}, num_workers=a["decode"], **kw)
else:
    report = run_trace_replay(
        [a["trace"]],
        prefill_engine_args={**launch, "engine": {**engine, **transfer, "worker_type": "prefill"}},
        decode_engine_args={**launch, "engine": {**engine, **transfer, "worker_type": "decode"}},
        num_prefill_workers=a["prefill"], num_decode_workers=a["decode"], **kw)
wall = time.perf_counter() - started
planner = None if report.planner is None else report.planner.to_dict()
ticks = []
reasons = {}
if planner is not None:
    for t in planner["ticks"]:
        topo = t["topology"]
        diag = (t.get("effects") or {}).get("diagnostics") or {}
        for key in ("throughput_decision_reason", "load_decision_reason"):
            if diag.get(key):
                reasons.setdefault(key, {}).setdefault(diag[key], 0)
                reasons[key][diag[key]] += 1
        ticks.append({"time_s": t["at_ms"] / 1000.0,
                      **{f"{role}_{state}": topo[role][f"{state}_count"] for role in ("prefill", "decode")
                         for state in ("active", "starting", "draining")},
                      "target_prefill": t["runtime_decision"]["target_prefill"],
                      "target_decode": t["runtime_decision"]["target_decode"],
                      "predicted_num_req": diag.get("predicted_num_req"),
                      "traffic": (t.get("input") or {}).get("traffic"), "diagnostics": diag})
per_request = [{"arrival_ms": r.get("arrival_time_ms"), "ttft_ms": r.get("ttft_ms"), "itl_ms": r.get("itl_ms"),
                "output_length": r.get("output_length"), "status": r.get("terminal_status")}
               for r in (report.per_request or [])]
json.dump({"summary": report.summary, "ticks": ticks, "reasons": reasons, "per_request": per_request,
           "scaling_events": [] if planner is None else planner["scaling_events"],
           "lifecycle_operations": [] if planner is None else planner["lifecycle_operations"],
           "bootstrap": None if planner is None else planner["metadata"].get("bootstrap"),
           "wall_s": wall}, open(a["out"], "w"), default=str)
print(json.dumps({"wall_s": wall, "stubbed": bool(globals().get("AISIMULATE_STUBBED"))}))
'''


def parse_segments(text: str) -> list[tuple[float, float]]:
    """'0:2,300:6' -> [(0.0, 2.0), (300.0, 6.0)]: (start s, rate req/s), increasing starts."""
    segments = []
    for part in text.split(","):
        start, rate = part.split(":")
        segments.append((float(start), float(rate)))
    if [s for s, _ in segments] != sorted(s for s, _ in segments) or segments[0][0] != 0:
        raise SystemExit(f"dynamo_planner: --segments {text!r}: starts must increase from 0")
    return segments


def make_trace(path: Path, segments: list[tuple[float, float]], end_s: float, seed: int = 0) -> dict:
    """Write the ChatBot-like Mooncake JSONL; returns its request count and mean lengths.

    The rate is piecewise constant (Poisson within each segment). Prompt = one of 8 shared
    1,024-token system prompts (2 blocks of 512, Zipf 1.1 popularity) + a unique user part
    (lognormal, median 900, sigma 0.8, 64..8,000 tokens): mean input ~2.3k tokens, the
    ChatBot generator's 2,331. Output lognormal, median 300, sigma 0.6, 8..1,500 tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    bounds = [s for s, _ in segments[1:]] + [end_s]
    arrivals = []
    for (start, rate), stop in zip(segments, bounds):
        count = rng.poisson(rate * (stop - start))
        arrivals.append(np.sort(rng.uniform(start, stop, count)))
    times = np.concatenate(arrivals)
    # Dynamo's replay counts time from the first arrival, lmsim from the trace's zero: the
    # trace starts at 0 so the planners' intervals cover the same requests
    times = times - times[0] if len(times) else times
    n = len(times)
    weights = 1.0 / np.arange(1, 9) ** 1.1
    prompts = rng.choice(8, size=n, p=weights / weights.sum())
    user = np.clip(np.round(rng.lognormal(math.log(900), 0.8, n)), 64, 8000).astype(int)
    output = np.clip(np.round(rng.lognormal(math.log(300), 0.6, n)), 8, 1500).astype(int)
    next_id = 100
    with open(path, "w") as f:
        for i in range(n):
            isl = 1024 + int(user[i])
            blocks = -(-isl // 512)
            ids = [2 * int(prompts[i]) + 1, 2 * int(prompts[i]) + 2, *range(next_id, next_id + blocks - 2)]
            next_id += blocks - 2
            f.write(json.dumps({"timestamp": round(1000 * float(times[i]), 3), "input_length": isl,
                                "output_length": int(output[i]), "hash_ids": ids}) + "\n")
    return {"requests": n, "mean_input": float(1024 + user.mean()), "mean_output": float(output.mean())}


def planner_config(case: str, args: argparse.Namespace) -> dict | None:
    """Dynamo PlannerConfig for a case (dynamo/planner/config/planner_config.py), or None."""
    if case.startswith("fixed"):
        return None
    target = case.split("-")[0]
    config = {
        "environment": "virtual", "backend": "mocker", "mode": case.split("-")[1],
        "optimization_target": target, "ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms,
        "load_adjustment_interval_seconds": args.load_interval_s,
        "throughput_adjustment_interval_seconds": args.throughput_interval_s,
        "load_predictor": args.predictor, "max_gpu_budget": args.gpu_budget, "min_endpoint": 1,
        "prefill_engine_num_gpu": 1, "decode_engine_num_gpu": 1,
        # no files, ports or dashboards from an offline run
        "report_interval_hours": None, "live_dashboard_port": 0, "control_api_port": 0,
    }
    if target == "load":
        config.update(prefill_scale_up_queue_tokens=args.prefill_up_tokens,
                      prefill_scale_down_queue_tokens=args.prefill_down_tokens,
                      decode_scale_up_kv_rate=args.kv_up_pct, decode_scale_down_kv_rate=args.kv_down_pct)
    return config


def slo_attainment(rows: list[dict], ttft_ms: float, itl_ms: float) -> dict:
    """Share of requests meeting TTFT <= target, ITL (mean inter-token gap of the request)
    <= target, and both; unfinished requests count as misses."""
    n = len(rows)
    if not n:
        return {"ttft": None, "itl": None, "both": None}

    def ok_ttft(r):
        return r["ttft_ms"] is not None and r["ttft_ms"] <= ttft_ms

    def ok_itl(r):
        return (r["itl_ms"] is None and r["ttft_ms"] is not None) or (r["itl_ms"] is not None and r["itl_ms"] <= itl_ms)

    return {"ttft": sum(map(ok_ttft, rows)) / n, "itl": sum(map(ok_itl, rows)) / n,
            "both": sum(ok_ttft(r) and ok_itl(r) for r in rows) / n}


def dynamo_case(case: str, args: argparse.Namespace, trace: Path, tmp: Path) -> dict:
    """One Dynamo replay; returns its summary row and its trajectory rows."""
    mode = case.split("-")[-1]
    a = {"trace": str(trace), "mode": mode, "prefill": args.prefill, "decode": args.decode,
         "num_blocks": args.num_blocks, "block_size": 16, "max_batched": args.max_batched,
         "max_seqs": args.max_seqs, "max_model_len": args.max_model_len, "startup_s": args.startup_s,
         "bandwidth_gb_s": args.bandwidth_gb_s, "bytes_per_token": args.bytes_per_token, "planner": planner_config(case, args),
         "out": str(tmp / f"{case}.json"), "perf_model": args.dynamo_perf_model, "checkout": str(CHECKOUT)}
    if case.startswith("fixed"):
        a["prefill"], a["decode"] = args.fixed_prefill, args.fixed_decode
    if mode == "agg":
        a["decode"] = args.fixed_agg if case.startswith("fixed") else args.decode
    started = time.perf_counter()
    answer = run_in_peer(args.peer_python, DYNAMO_CHILD, a)
    outer = time.perf_counter() - started
    if "error" in answer:
        return {"case": case, "error": answer["error"], "wall_s": outer}
    got = json.loads(Path(a["out"]).read_text())
    s = got["summary"]
    slo = slo_attainment(got["per_request"], args.ttft_ms, args.itl_ms)
    events = got["scaling_events"]
    row = {
        "case": case, "side": "dynamo", "mode": mode,
        "gpu_hours": s.get("gpu_hours"),
        "prefill_worker_s": s.get("prefill_worker_seconds"), "decode_worker_s": s.get("decode_worker_seconds"),
        "completed": s.get("completed_requests"), "requests": s.get("num_requests"),
        "ttft_ms_mean": s.get("mean_ttft_ms"), "ttft_ms_p90": s.get("p90_ttft_ms"),
        "itl_ms_mean": s.get("mean_itl_ms"), "itl_ms_p90": s.get("p90_itl_ms"),
        "slo_ttft": slo["ttft"], "slo_itl": slo["itl"], "slo_both": slo["both"],
        "scale_events": len(events), "decision_reasons": got["reasons"], "bootstrap": got["bootstrap"],
        "aisimulate_stubbed": answer.get("stubbed"), "perf_model": args.dynamo_perf_model,
        "replay_wall_s": got["wall_s"], "process_wall_s": outer,
    }
    trajectory = [{"side": "dynamo", "case": case, **t} for t in got["ticks"]]
    decisions = [dynamo_decision(case, t) for t in got["ticks"] if t.get("traffic")]
    if not trajectory:  # a fixed fleet: its two ends
        end = (s.get("duration_ms") or 0) / 1000.0
        n_p = 0 if mode == "agg" else a["prefill"]
        trajectory = [{"side": "dynamo", "case": case, "time_s": t, "prefill_active": n_p, "decode_active": a["decode"],
                       "prefill_starting": 0, "decode_starting": 0, "prefill_draining": 0, "decode_draining": 0}
                      for t in (0.0, end)]
    row["events"] = [{"at_s": e["at_s"], "role": e["component"], "from": e["from_count"], "to": e["to_count"]}
                     for e in events]
    return {"row": row, "trajectory": trajectory, "decisions": decisions}


DECISION_KEYS = ["side", "case", "time_s", "observed_num_req", "observed_isl", "observed_osl", "predicted_num_req",
                 "predicted_isl", "predicted_osl", "engine_rps_prefill", "engine_rps_decode", "target_prefill",
                 "target_decode", "reason"]


def dynamo_decision(case: str, tick: dict) -> dict:
    """One throughput tick of Dynamo's planner: the traffic window it was handed, the
    forecast, the per-engine capacity and the targets when it scaled (diagnostics of the
    report's tick; aggregated: engine_rps_decode and target_decode are the workers')."""
    diag, traffic = tick["diagnostics"], tick["traffic"]
    scaled = diag.get("throughput_decision_reason") == "scale"
    return {"side": "dynamo", "case": case, "time_s": tick["time_s"], "observed_num_req": traffic.get("num_req"),
            "observed_isl": traffic.get("isl"), "observed_osl": traffic.get("osl"),
            **{k: diag.get(k) for k in ("predicted_num_req", "predicted_isl", "predicted_osl",
                                        "engine_rps_prefill", "engine_rps_decode")},
            "target_prefill": (0 if case.endswith("-agg") else tick["target_prefill"]) if scaled else None,
            "target_decode": tick["target_decode"] if scaled else None,
            "reason": diag.get("throughput_decision_reason")}


def lmsim_decisions(case: str, events) -> list[dict]:
    """lmsim sla_planner's decisions (its `sla_planner` router events) in dynamo_decision's
    columns; a target only when it scaled."""
    rows = []
    agg = case.endswith("-agg")
    for event in events[events.kind == "sla_planner"].to_dict(orient="records"):
        e = {k: (None if v != v else v) for k, v in event.items()}  # NaN: not recorded at this tick
        num = e.get
        target_d = num("target_default") if agg else num("target_decode")
        rows.append({"side": "lmsim", "case": case, "time_s": e["time_s"],
                     **{k: num(k) for k in ("predicted_num_req", "predicted_isl", "predicted_osl")},
                     "engine_rps_prefill": num("engine_rps") if agg else num("prefill_engine_rps"),
                     "engine_rps_decode": num("engine_rps") if agg else num("decode_engine_rps"),
                     "target_prefill": (0 if target_d is not None else None) if agg else num("target_prefill"),
                     "target_decode": target_d, "reason": "scale" if target_d is not None else "no_change"})
    return rows


# ---------------------------------------------------------------- the lmsim half


def lmsim_missing(autoscaler: str = "sla_planner") -> str | None:
    """Why lmsim cannot run the planner side, or None when it can: it needs the `fleet`
    engine (lmsim.engine.fleet) and the autoscaler (`sla_planner`, or `schedule` to replay
    Dynamo's own trajectory) in lmsim.autoscalers, FLEET_DESIGN.md; they land from the
    `fleet` and `scalers` branches."""
    try:
        from lmsim.autoscalers import AUTOSCALERS
    except ImportError:
        return "lmsim.autoscalers is not on this tree (the fleet/scalers branches are not merged)"
    try:
        import lmsim.engine.fleet  # noqa: F401
    except ImportError:
        return "lmsim.engine.fleet is not on this tree (the fleet branch is not merged)"
    names = list(AUTOSCALERS.names()) if hasattr(AUTOSCALERS, "names") else list(AUTOSCALERS)
    if autoscaler not in names:
        return f"lmsim has no {autoscaler!r} autoscaler (registered: {', '.join(names) or 'none'})"
    return None


def dynamo_schedule(row: dict, args: argparse.Namespace) -> dict[str, list[list[float]]]:
    """Dynamo's decided replica targets per lmsim pool, as the `schedule` autoscaler's
    `replicas` ([[time_s, count], ...]): the initial counts, then each scaling event's target
    at its tick. Replaying them in lmsim separates the engine (same fleet decisions, lmsim's
    start-up, drain and routing) from the planner (lmsim's own decisions)."""
    if row["mode"] == "agg":
        schedule = {"default": [[0.0, args.decode]]}
    else:
        schedule = {"prefill": [[0.0, args.prefill]], "decode": [[0.0, args.decode]]}
    for event in row.get("events", []):
        pool = "default" if event["role"] == "agg" else event["role"]
        schedule[pool].append([float(event["at_s"]), int(event["to"])])
    return schedule


def lmsim_config(case: str, args: argparse.Namespace, trace: Path, out_dir: Path,
                 schedule: dict[str, list[list[float]]] | None = None) -> dict:
    """The lmsim experiment matching a Dynamo planner case (FLEET_DESIGN.md sections).

    Same trace, KV size, batch limits, step model (`polynomial`, the mocker's closed forms),
    round robin, start-up time; `sla_planner` params carry the planner's targets, intervals
    and predictor, named as Dynamo's PlannerConfig names them. The coordinator checks the
    param names against lmsim/autoscalers/sla_planner.py after the merge. With `schedule`
    (from `dynamo_schedule`) the `schedule` autoscaler replays Dynamo's decisions instead,
    checked at Dynamo's load interval."""
    mode = case.split("-")[-1]
    poly = {"kind": "polynomial"}
    cluster: dict = {"profile": poly, "num_gpu_blocks": args.num_blocks, "block_size": 16,
                     "max_num_batched_tokens": args.max_batched, "max_num_seqs": args.max_seqs,
                     "max_model_len": args.max_model_len}
    fixed = case.startswith("fixed")
    if mode == "agg":
        cluster["num_instances"] = args.fixed_agg if fixed else args.decode
        pools = {"default": {"min_replicas": 1, "max_replicas": args.gpu_budget, "startup_s": args.startup_s}}
        router = {"policy": "round_robin"}
    else:
        n_p, n_d = (args.fixed_prefill, args.fixed_decode) if fixed else (args.prefill, args.decode)
        cluster["pools"] = [
            {"name": "prefill", "role": "prefill", "num_instances": n_p,
             "profile": {**poly, "worker_type": "prefill", "kv_bytes_per_token": args.bytes_per_token}},
            {"name": "decode", "role": "decode", "num_instances": n_d, "profile": {**poly, "worker_type": "decode"}},
        ]
        pools = {name: {"min_replicas": 1, "max_replicas": args.gpu_budget - 1, "startup_s": args.startup_s}
                 for name in ("prefill", "decode")}
        # the mocker's transfer: the whole prompt at the bandwidth, no latency, no sharing
        cluster["kv_transfer"] = {"bandwidth_bytes_s": args.bandwidth_gb_s * 1e9, "latency_s": 0.0, "sharing": "none",
                                  "tokens": "full_prompt"}
        # the mocker admits a landed request in the decode worker's next pass (fidelity.md)
        cluster["kv_connector_poll"] = "instant"
        router = {"policy": "pd", "params": {"prefill_policy": "round_robin", "decode_policy": "round_robin",
                                             "decode_choice": "after_prefill"}}
    config = {
        "name": f"dynamo-planner-{case}", "seed": 0,
        "workload": {"trace": str(trace), "format": "mooncake"},
        "cluster": cluster, "router": router,
        "output": {"dir": str(out_dir), "figures": False,
                   "slo": {"ttft_s": args.ttft_ms / 1000.0, "tpot_s": args.itl_ms / 1000.0}},
    }
    if schedule is not None:
        config["fleet"] = {"pools": pools}
        config["autoscaler"] = {"name": "schedule", "interval_s": float(args.load_interval_s),
                                "params": {"replicas": schedule}}
        config["cost"] = {"window_s": 60.0}
    elif not fixed:
        config["fleet"] = {"pools": pools}
        config["autoscaler"] = {
            "name": "sla_planner", "interval_s": float(args.throughput_interval_s), "metrics_delay_s": 0.0,
            "params": {"mode": mode, "ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms,
                       "load_predictor": args.predictor, "max_gpu_budget": args.gpu_budget,
                       "min_endpoint": 1, "isl_from": args.isl_from},
        }
        config["cost"] = {"window_s": 60.0}
    return config


def lmsim_case(case: str, args: argparse.Namespace, trace: Path, tmp: Path,
               schedule: dict[str, list[list[float]]] | None = None) -> dict:
    """One lmsim run of the case (or of Dynamo's trajectory for it, with `schedule`); its
    summary row and trajectory rows (from fleet_events). The row's case is
    `dynamo-fleet:<case>` for a replayed trajectory."""
    import numpy as np
    import pandas as pd

    from lmsim.config import validate
    from lmsim.study.compose import build_simulation
    from lmsim.study.experiment import load_workload_trace

    label = case if schedule is None else f"dynamo-fleet:{case}"
    config = validate(lmsim_config(case, args, trace, tmp / f"lmsim-{case}", schedule), where="dynamo_planner")
    started = time.perf_counter()
    sim = build_simulation(config, load_workload_trace(config))
    results = sim.run()
    wall = time.perf_counter() - started
    requests = results.requests
    ttft = 1000 * requests.ttft_s.to_numpy(dtype=float)
    itl = 1000 * requests.tpot_s.to_numpy(dtype=float)
    done = requests.status.astype(str).to_numpy() == "finished"
    rows = [{"ttft_ms": None if not ok or np.isnan(t) else t, "itl_ms": None if np.isnan(i) else i}
            for ok, t, i in zip(done, ttft, itl)]
    slo = slo_attainment(rows, args.ttft_ms, args.itl_ms)
    s = results.summary
    fleet = s.get("fleet") or {}
    # summary.fleet (lmsim/engine/fleet.py): provisioned GPU-seconds, start of start-up to end of drain
    gpu_s = float(fleet["gpu_seconds"]) if "gpu_seconds" in fleet else None
    trajectory = []
    events = getattr(results, "fleet_events", None)
    if isinstance(events, pd.DataFrame) and len(events):
        trajectory = trajectory_from_events(events, label)
    if case.startswith("fixed"):  # a fixed fleet: every instance for the whole run, as Dynamo counts it
        pools = config.cluster.pools or []
        n_p = sum(pool.num_instances for pool in pools if pool.role == "prefill")
        n_d = sum(pool.num_instances for pool in pools if pool.role != "prefill") if pools else config.cluster.num_instances
        end = float(s["duration_s"])
        gpu_s = (n_p + n_d) * end
        trajectory = [{"side": "lmsim", "case": label, "time_s": t, "prefill_active": n_p, "decode_active": n_d,
                       "prefill_starting": 0, "decode_starting": 0, "prefill_draining": 0, "decode_draining": 0}
                      for t in (0.0, end)]
    return {"row": {"case": label, "side": "lmsim", "gpu_hours": None if gpu_s is None else gpu_s / 3600.0,
                    "completed": s.get("num_finished"), "requests": s.get("num_requests"),
                    "ttft_ms_mean": 1000 * (s.get("ttft_s_mean") or 0), "ttft_ms_p90": 1000 * (s.get("ttft_s_p90") or 0),
                    "itl_ms_mean": 1000 * (s.get("itl_s_mean") or 0), "itl_ms_p90": 1000 * (s.get("itl_s_p90") or 0),
                    "slo_ttft": float(slo["ttft"]), "slo_itl": float(slo["itl"]), "slo_both": float(slo["both"]),
                    "scale_events": None if not isinstance(events, pd.DataFrame) else int((events.event == "scale").sum()),
                    "run_wall_s": wall},
            "trajectory": trajectory,
            "decisions": lmsim_decisions(label, results.router_events) if schedule is None and case.startswith("sla") else []}


def trajectory_from_events(events, case: str) -> list[dict]:
    """Active/starting/draining counts per pool after each lifecycle event (FLEET_DESIGN.md:
    `start` begins loading, `active` joins the router, `drain` leaves it, `stop` ends)."""
    state: dict[int, tuple[str, str]] = {}
    rows = []
    for t, iid, pool, event in events.sort_values("time_s", kind="stable")[["time_s", "instance_id", "pool", "event"]].itertuples(index=False):
        if iid < 0:
            continue
        role = "decode" if pool in ("decode", "default") else str(pool)
        after = {"start": "starting", "restart": "starting", "warm": "starting", "active": "active",
                 "drain": "draining", "stop": "stopped", "crash": "stopped"}.get(event)
        if after is None:
            continue
        state[int(iid)] = (role, after)
        counts = {f"{r}_{st}": 0 for r in ("prefill", "decode") for st in ("active", "starting", "draining")}
        for r, st in state.values():
            if st != "stopped":
                counts[f"{r}_{st}"] += 1
        rows.append({"side": "lmsim", "case": case, "time_s": float(t), **counts})
    return rows


# ---------------------------------------------------------------- output


def save(rows: list[dict], trajectory: list[dict], prefix: str, meta: dict, decisions: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    if decisions:  # the SLA planner's throughput ticks: what it saw, forecast, sized and decided
        with open(RESULTS / f"{prefix}_decisions.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=DECISION_KEYS, extrasaction="ignore")
            w.writeheader()
            for d in decisions:
                w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()})
    (RESULTS / f"{prefix}_summary.json").write_text(json.dumps({"meta": meta, "cases": rows}, indent=1, default=str) + "\n")
    if trajectory:
        keys = ["side", "case", "time_s"] + [f"{r}_{s}" for r in ("prefill", "decode")
                                              for s in ("active", "starting", "draining")] + [
            "target_prefill", "target_decode", "predicted_num_req"]
        with open(RESULTS / f"{prefix}_trajectory.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            for t in trajectory:
                w.writerow({k: (round(v, 3) if isinstance(v, float) else v) for k, v in t.items()})


def steps(trajectory: list[dict], case: str, side: str) -> str:
    """The replica trajectory as 't:PxD' at each change of the active counts."""
    at: dict[float, tuple[int, int]] = {}
    for t in trajectory:  # the last state at each time (several events can share one)
        if t["case"] == case and t["side"] == side:
            at[float(t["time_s"])] = (int(t.get("prefill_active", 0)), int(t.get("decode_active", 0)))
    out, last = [], None
    for time_s, now in at.items():
        if now != last:
            out.append(f"{time_s:.0f}s:{now[0]}P{now[1]}D" if now[0] else f"{time_s:.0f}s:{now[1]}")
            last = now
    return " ".join(out)


def print_table(rows: list[dict], trajectory: list[dict]) -> None:
    print(f"{'side':7} {'case':28} {'GPU-h':>7} {'SLO both':>8} {'TTFT ok':>8} {'ITL ok':>8} {'TTFT ms':>8} "
          f"{'ITL ms':>7} {'events':>6} {'wall s':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r.get('side', 'dynamo'):7} {r['case']:28} error: {r['error']}")
            continue
        wall = r.get("replay_wall_s", r.get("run_wall_s"))
        print(f"{r['side']:7} {r['case']:28} {cell(r['gpu_hours'], 7, '.3f')} {cell(r['slo_both'], 8, '.3f')} "
              f"{cell(r['slo_ttft'], 8, '.3f')} {cell(r['slo_itl'], 8, '.3f')} {cell(r['ttft_ms_mean'], 8, '.1f')} "
              f"{cell(r['itl_ms_mean'], 7, '.2f')} {cell(r['scale_events'], 6)} {cell(wall, 7, '.1f')}")
    print("replica trajectory (time: active prefill x decode, or aggregated workers):")
    for r in rows:
        if "error" not in r:
            print(f"  {r['side']:7} {r['case']:28} {steps(trajectory, r['case'], r['side'])}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="fixed-disagg,sla-disagg,load-disagg,latency-disagg,fixed-agg,sla-agg,load-agg")
    p.add_argument("--segments", default=DEFAULT_SEGMENTS, help="start_s:rate,... (req/s, piecewise constant)")
    p.add_argument("--end", type=float, default=1800.0, help="last arrival before this, s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", help="use this Mooncake JSONL instead of generating one")
    p.add_argument("--ttft-ms", type=float, default=500.0, help="TTFT target (planner and SLO attainment)")
    p.add_argument("--itl-ms", type=float, default=25.0, help="ITL target (planner and SLO attainment)")
    p.add_argument("--load-interval-s", type=int, default=10)
    p.add_argument("--throughput-interval-s", type=int, default=60)
    p.add_argument("--predictor", default="kalman", choices=("constant", "kalman"),
                   help="load predictor of the SLA planner on both sides (lmsim's sla_planner has these two; "
                   "Dynamo's default is arima)")
    p.add_argument("--dynamo-perf-model", default="polynomial", choices=("polynomial", "aisimulate"),
                   help="the SLA planner's forward-pass model: polynomial (AISimulate's native model replaced by "
                   "the mocker's step model, benchmarks/peer_stubs.py) or aisimulate (as shipped; without the "
                   "wheel every throughput decision is model_not_ready)")
    p.add_argument("--isl-from", default="finished", choices=("finished", "routed"),
                   help="lmsim sla_planner's ISL window: the requests finished in it (as Dynamo's offline replay "
                   "averages it) or those routed in it (sla_planner's default)")
    p.add_argument("--gpu-budget", type=int, default=16)
    p.add_argument("--startup-s", type=float, default=60.0, help="worker start-up (model load) time, s")
    p.add_argument("--prefill", type=int, default=1, help="initial prefill workers of planner cases")
    p.add_argument("--decode", type=int, default=1, help="initial decode (or aggregated) workers of planner cases")
    p.add_argument("--fixed-prefill", type=int, default=1)
    p.add_argument("--fixed-decode", type=int, default=4)
    p.add_argument("--fixed-agg", type=int, default=4)
    p.add_argument("--prefill-up-tokens", type=int, default=8192)
    p.add_argument("--prefill-down-tokens", type=int, default=1024)
    p.add_argument("--kv-up-pct", type=float, default=40.0)
    p.add_argument("--kv-down-pct", type=float, default=15.0)
    p.add_argument("--num-blocks", type=int, default=17_500)
    p.add_argument("--max-batched", type=int, default=8192)
    p.add_argument("--max-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=16_384,
                   help="context length; Dynamo's latency/throughput targets scale prefill on queue / context length")
    p.add_argument("--bandwidth-gb-s", type=float, default=50.0,
                   help="P/D KV transfer bandwidth (the mocker's kv_transfer_bandwidth, GB/s)")
    p.add_argument("--bytes-per-token", type=int, default=98_304, help="KV bytes a transfer moves per token")
    p.add_argument("--peer-python", default=DEFAULT_PEER)
    p.add_argument("--no-lmsim", action="store_true", help="Dynamo half only")
    p.add_argument("--no-dynamo", action="store_true", help="lmsim half only (keeps the saved Dynamo results)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    for case in cases:
        if case.split("-")[0] not in ("fixed", "sla", "load", "latency", "throughput") or case.split("-")[-1] not in ("agg", "disagg"):
            print(f"dynamo_planner: --cases: unknown case {case!r} (TARGET-MODE, TARGET fixed/sla/load/latency/throughput, "
                  "MODE agg/disagg)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.trace:
            trace, trace_info = Path(args.trace).resolve(), {"file": args.trace}
        else:
            trace = tmp / "stepped_chatbot.jsonl"
            trace_info = make_trace(trace, parse_segments(args.segments), args.end, args.seed)
        meta = {"trace": trace_info, "segments": args.segments, "end_s": args.end, "ttft_ms": args.ttft_ms,
                "itl_ms": args.itl_ms, "startup_s": args.startup_s, "load_interval_s": args.load_interval_s,
                "throughput_interval_s": args.throughput_interval_s, "predictor": args.predictor,
                "gpu_budget": args.gpu_budget, "num_blocks": args.num_blocks, "max_batched": args.max_batched,
                "max_seqs": args.max_seqs, "max_model_len": args.max_model_len,
                "kv_transfer": f"{args.bandwidth_gb_s:g} GB/s x {args.bytes_per_token} B/token, full prompt", "step_model": "polynomial (mocker default)", "router": "round_robin",
                "dynamo_perf_model": args.dynamo_perf_model, "lmsim_isl_from": args.isl_from}
        print(f"trace: {json.dumps(trace_info)}; SLO TTFT <= {args.ttft_ms:g} ms, ITL <= {args.itl_ms:g} ms; "
              f"start-up {args.startup_s:g} s", flush=True)
        rows, trajectory, decisions = [], [], []
        if args.no_dynamo:
            print("Dynamo half skipped (--no-dynamo)")
        elif not peer_available(args.peer_python):
            print(f"Dynamo not importable with {args.peer_python}: Dynamo half skipped")
        else:
            for case in cases:
                got = dynamo_case(case, args, trace, tmp)
                if "row" in got:
                    rows.append(got["row"])
                    trajectory += got["trajectory"]
                    decisions += got["decisions"]
                else:
                    rows.append({"side": "dynamo", **got})
                print(f"  dynamo {case}: {rows[-1].get('error') or 'done'} "
                      f"({rows[-1].get('process_wall_s', rows[-1].get('wall_s', 0)):.1f} s wall)", flush=True)
            if not args.no_save:
                save(rows, trajectory, "dynamo_planner", meta, decisions)
        lm_rows, lm_traj, lm_decisions = [], [], []
        why = "skipped (--no-lmsim)" if args.no_lmsim else lmsim_missing()
        if why:
            print(f"lmsim planner cases not run: {why}" + ("" if args.no_lmsim else "; fixed-fleet cases only"))
        for case in cases:
            # lmsim's sla_planner is Dynamo's `sla` target; the load/latency targets (Dynamo's
            # FPM thresholds) are compared through their replayed trajectories below
            if args.no_lmsim or case.split("-")[0] in ("load", "latency", "throughput") or (
                    why and not case.startswith("fixed")):
                continue
            try:
                got = lmsim_case(case, args, trace, tmp)
            except Exception as exc:  # a param name the merged autoscaler does not take: say which case
                lm_rows.append({"side": "lmsim", "case": case, "error": f"{type(exc).__name__}: {exc}"})
                print(f"  lmsim {case}: {lm_rows[-1]['error']}", flush=True)
                continue
            lm_rows.append(got["row"])
            lm_traj += got["trajectory"]
            lm_decisions += got["decisions"]
            print(f"  lmsim {case}: done ({got['row']['run_wall_s']:.1f} s wall)", flush=True)
        # Dynamo's own trajectories replayed through lmsim's fleet (the `schedule` scaler)
        why_schedule = "skipped (--no-lmsim)" if args.no_lmsim else lmsim_missing("schedule")
        planner_rows = [r for r in rows if "error" not in r and r.get("events")]
        if not planner_rows and args.no_dynamo and (RESULTS / "dynamo_planner_summary.json").is_file():
            saved = json.loads((RESULTS / "dynamo_planner_summary.json").read_text())["cases"]
            planner_rows = [r for r in saved if r["case"] in cases and r.get("events")]
        if why_schedule:
            print(f"lmsim replays of Dynamo's trajectories not run: {why_schedule}")
        for row in [] if why_schedule else planner_rows:
            try:
                got = lmsim_case(row["case"], args, trace, tmp, schedule=dynamo_schedule(row, args))
            except Exception as exc:  # e.g. a P/D policy that cannot yet route a subset
                lm_rows.append({"side": "lmsim", "case": f"dynamo-fleet:{row['case']}",
                                "error": f"{type(exc).__name__}: {exc}"})
                print(f"  lmsim dynamo-fleet:{row['case']}: {lm_rows[-1]['error']}", flush=True)
                continue
            lm_rows.append(got["row"])
            lm_traj += got["trajectory"]
            print(f"  lmsim dynamo-fleet:{row['case']}: done ({got['row']['run_wall_s']:.1f} s wall)", flush=True)
        if lm_rows and not args.no_save:
            save(lm_rows, lm_traj, "lmsim_planner", {**meta, "lmsim_missing": why, "lmsim_missing_schedule": why_schedule},
                 lm_decisions)
    print_table(rows + lm_rows, trajectory + lm_traj)
    return 0


if __name__ == "__main__":
    sys.exit(main())
