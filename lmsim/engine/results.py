"""A finished run's tables and summary, in memory.

`Results` is what the engine hands back; writing it to a run directory (and reading one
back) is the study layer's job (`lmsim.study.rundir`), so the engine never touches disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lmsim.engine.metrics import (
    FINISHED,
    NOT_ARRIVED,
    REJECT_REASONS,
    REJECTED,
    STATUS_NAMES,
    UNFINISHED,
)

LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
# Identifiers that may be unknown: pandas' nullable Int64 in memory, int64 with nulls on
# disk, never float64 with NaN (see study/rundir.py). Unknown is always null.
NULLABLE_INT_COLUMNS = ("instance_id", "cached_tokens", "session_id", "class_id")


def nullable_int(values: np.ndarray) -> pd.arrays.IntegerArray:
    """-1 (the engine's and the trace's "none") becomes null."""
    values = np.asarray(values, dtype=np.int64)
    return pd.arrays.IntegerArray(values, values < 0)


@dataclass
class Results:
    requests: pd.DataFrame
    instances: pd.DataFrame
    router_events: pd.DataFrame
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_simulation(cls, sim: Any, wall_time_s: float) -> Results:
        rec = sim.recorder
        trace = sim.trace
        events = pd.DataFrame(sim.router_events)
        predicted = rec.predicted_ttft_s.copy()
        if len(events) and "kind" in events:
            pred = events[events["kind"] == "ttft_prediction"]
            if len(pred) and {"request_id", "predicted_ttft_s"} <= set(pred.columns):
                predicted[pred["request_id"].to_numpy(dtype=np.int64)] = pred["predicted_ttft_s"].to_numpy()
        out = rec.output_tokens
        ttft = rec.first_token_at - rec.arrived_at
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out > 1, (rec.finished_at - rec.first_token_at) / (out - 1), np.nan)
        requests = pd.DataFrame(
            {
                "request_id": np.arange(len(trace), dtype=np.int64),
                "arrived_at": rec.arrived_at,
                "routed_at": rec.routed_at,
                "first_scheduled_at": rec.first_scheduled_at,
                "first_token_at": rec.first_token_at,
                "finished_at": rec.finished_at,
                "instance_id": nullable_int(rec.instance_id),
                "input_tokens": trace.input_tokens,
                "output_tokens": out,
                "cached_tokens": nullable_int(rec.cached_tokens),
                "num_preemptions": rec.num_preemptions,
                "lookup_tokens": rec.lookup_tokens,
                "lookup_hit_tokens": rec.lookup_hit_tokens,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": rec.finished_at - rec.arrived_at,
                "queue_s": rec.first_scheduled_at - rec.arrived_at,
                "predicted_ttft_s": predicted,
                "session_id": nullable_int(trace.column("session_id")),
                "class_id": nullable_int(trace.column("class_id")),
                "status": pd.Categorical.from_codes(  # codes are the status numbers 0..3
                    rec.status.astype(np.int64), categories=list(STATUS_NAMES.values())
                ),
                "reject_reason": pd.Categorical.from_codes(
                    rec.reject_reason.astype(np.int64) - 1, categories=list(REJECT_REASONS.values())
                ),
            }
        )
        instances = pd.DataFrame(
            rec.samples,
            columns=[
                "time_s",
                "instance_id",
                "num_running",
                "num_waiting",
                "num_prefilling",
                "kv_usage_frac",
                "pending_prefill_tokens",
                "total_tokens",
            ],
        )
        summary = summarize(requests, rec.status)
        summary["num_output_clipped"] = rec.num_output_clipped
        summary["max_model_len"] = sim.max_model_len
        summary.update(
            {
                "sim_time_s": float(sim.last_activity_s),
                "wall_time_s": wall_time_s,
                "router_us_per_decision": sim.router.us_per_decision,
                "num_steps": sum(i.num_steps for i in sim.instances),
                "num_step_events": sum(i.num_events for i in sim.instances),
                "num_preemptions": int(rec.num_preemptions.sum()),
                "outside_grid_steps": sum(i.scheduler.num_outside_grid for i in sim.instances),
                "num_evictions": sum(i.cache.num_evictions for i in sim.instances),
                "kv_blocks_per_instance": sim.num_blocks,
                "policy": sim.config.router.policy,
            }
        )
        summary["requests_per_wall_s"] = (
            summary["num_finished"] / wall_time_s if wall_time_s > 0 else None
        )
        return cls(requests, instances, events, summary, sim.config.to_dict())


def summarize(requests: pd.DataFrame, status: np.ndarray) -> dict[str, Any]:
    finished = requests[status == FINISHED]
    summary: dict[str, Any] = {
        "num_requests": len(requests),
        "num_finished": int((status == FINISHED).sum()),
        "num_unfinished": int((status == UNFINISHED).sum()),
        "num_rejected": int((status == REJECTED).sum()),
        "num_not_arrived": int((status == NOT_ARRIVED).sum()),
    }
    reasons = requests.get("reject_reason")
    for name in REJECT_REASONS.values():
        summary[f"num_rejected_{name}"] = int((reasons == name).sum()) if reasons is not None else 0
    for metric in LATENCY_METRICS:
        values = finished[metric].to_numpy(dtype=float)
        values = values[~np.isnan(values)]
        stats = {}
        if len(values):
            stats = {
                "mean": float(values.mean()),
                "p50": float(np.percentile(values, 50)),
                "p90": float(np.percentile(values, 90)),
                "p99": float(np.percentile(values, 99)),
            }
        for key in ("mean", "p50", "p90", "p99"):
            summary[f"{metric}_{key}"] = stats.get(key)
    cached = requests["cached_tokens"]
    admitted = cached.notna().to_numpy()
    input_total = requests["input_tokens"].to_numpy()[admitted].sum()
    cached_total = cached.to_numpy(dtype=np.int64, na_value=0)[admitted].sum()
    first = float(cached_total / input_total) if input_total else 0.0
    summary["prefix_hit_ratio_first_admission"] = first
    # vLLM's prefix-cache hit rate (0.11 `KVCacheManager.get_computed_blocks`): hits over
    # tokens looked up, resumed requests' lookups included (vLLM 0.11 counted them with the
    # rest; 0.33 records them separately as `preempted_*`). Runs saved before these
    # columns existed fall back to the first-admission ratio.
    if "lookup_tokens" in requests:
        looked = requests["lookup_tokens"].to_numpy().sum()
        hits = requests["lookup_hit_tokens"].to_numpy().sum()
        summary["prefix_hit_ratio"] = float(hits / looked) if looked else 0.0
    else:
        summary["prefix_hit_ratio"] = first
    return summary
