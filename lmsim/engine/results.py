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
    END_REASONS,
    FAILED,
    FINISHED,
    FLEET_REJECT_REASONS,
    FLEET_STATUS_NAMES,
    NO_INSTANCE,
    NOT_ARRIVED,
    REJECT_REASONS,
    REJECTED,
    STATUS_NAMES,
    UNFINISHED,
)

LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
# Identifiers that may be unknown: pandas' nullable Int64 in memory, int64 with nulls on
# disk, never float64 with NaN (see study/rundir.py). Unknown is always null.
NULLABLE_INT_COLUMNS = (
    "instance_id", "cached_tokens", "session_id", "class_id", "prefill_instance_id", "kv_transfer_bytes",
    "kv_hit_tokens_host", "kv_hit_tokens_disk", "kv_load_bytes", "stage",
)
# The columns only a disaggregated cluster's requests have (engine/metrics.py HandoffRecords),
# after `instance_id` (there: the decode instance).
HANDOFF_COLUMNS = ("prefill_instance_id", "prefill_done_at", "kv_transfer_start_at", "kv_transfer_s", "kv_transfer_bytes")


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
    # instances starting, stopping and crashing (lmsim.engine.fleet); None without a fleet
    fleet_events: pd.DataFrame | None = None

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
        statuses, reasons = (FLEET_STATUS_NAMES, FLEET_REJECT_REASONS) if rec.fleet else (STATUS_NAMES, REJECT_REASONS)
        first_token_at, finished_at = rec.first_token_at, rec.finished_at
        if getattr(sim, "frontend", None) is not None:
            # what the client sees: every token arrives the streaming delay late
            first_token_at = first_token_at + sim.frontend.stream_s
            finished_at = finished_at + sim.frontend.stream_s
        ttft = first_token_at - rec.arrived_at
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out > 1, (finished_at - first_token_at) / (out - 1), np.nan)
        requests = pd.DataFrame(
            {
                "request_id": np.arange(len(trace), dtype=np.int64),
                "arrived_at": rec.arrived_at,
                "routed_at": rec.routed_at,
                "first_scheduled_at": rec.first_scheduled_at,
                "first_token_at": first_token_at,
                "finished_at": finished_at,
                "instance_id": nullable_int(rec.instance_id),
                "input_tokens": np.array(trace.input_tokens),  # a writable frame: cached traces are read-only
                "output_tokens": out,
                "cached_tokens": nullable_int(rec.cached_tokens),
                "num_preemptions": rec.num_preemptions,
                "lookup_tokens": rec.lookup_tokens,
                "lookup_hit_tokens": rec.lookup_hit_tokens,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": finished_at - rec.arrived_at,
                "queue_s": rec.first_scheduled_at - rec.arrived_at,
                "predicted_ttft_s": predicted,
                "session_id": nullable_int(trace.column("session_id")),
                "class_id": nullable_int(trace.column("class_id")),
                "status": pd.Categorical.from_codes(  # codes are the status numbers 0..3 (4: failed)
                    rec.status.astype(np.int64), categories=list(statuses.values())
                ),
                "reject_reason": pd.Categorical.from_codes(
                    rec.reject_reason.astype(np.int64) - 1, categories=list(reasons.values())
                ),
            },
            # the recorder's and trace's arrays become the columns as they are: copying them
            # into consolidated blocks cost ~180 MB at the peak of a 1M-request replay
            copy=False,
        )
        if rec.handoffs is not None:
            h = rec.handoffs
            at = requests.columns.get_loc("instance_id") + 1
            for k, name in enumerate(HANDOFF_COLUMNS):
                values = getattr(h, name)
                requests.insert(at + k, name, nullable_int(values) if name in NULLABLE_INT_COLUMNS else values)
        if rec.kv_tiers:  # after reject_reason: the columns of a run without tiers keep their places
            requests["kv_hit_tokens_host"] = nullable_int(rec.kv_hit_tokens_host)
            requests["kv_hit_tokens_disk"] = nullable_int(rec.kv_hit_tokens_disk)
            requests["kv_load_bytes"] = nullable_int(rec.kv_load_bytes)
            requests["kv_load_s"] = rec.kv_load_s
        if trace.stage is not None:  # a load ladder's stage (lmsim.engine.stages)
            requests["stage"] = nullable_int(trace.stage)
        fleet = getattr(sim, "fleet", None)
        if fleet is not None:  # last: the columns of a run without a fleet keep their places
            for rid, n in fleet.retries.items():
                rec.retries[rid] = n
            requests["retries"] = rec.retries
            requests["end_reason"] = pd.Categorical.from_codes(  # code 0: none (null)
                rec.end_reason.astype(np.int64) - 1, categories=list(END_REASONS.values())
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
        itl = (
            np.concatenate([np.frombuffer(i.itl_gaps, dtype=np.float64) for i in sim.instances]),
            np.concatenate([np.frombuffer(i.itl_counts, dtype=np.uint32) for i in sim.instances]),
        )
        summary = summarize(
            requests, rec.status, slo=sim.config.output.slo.model_dump(), num_instances=len(sim.instances),
            itl=itl,
        )
        if rec.handoffs is not None:
            summary.update(handoff_summary(requests, rec.status, sim.disagg.num_local_prefills))
        if len(sim.pools) > 1:
            summary.update(pool_busy_fractions(sim))
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
        if sim.kv_tiers:
            from lmsim.engine.kv_tiers import tier_summary

            summary.update(tier_summary(sim, requests))
        if trace.stage is not None:
            from lmsim.engine.stages import across_stages, stage_summary

            summary.update(across_stages(stage_summary(requests)))
        summary["requests_per_wall_s"] = (
            summary["num_finished"] / wall_time_s if wall_time_s > 0 else None
        )
        if fleet is not None:
            summary["fleet"] = fleet.summary(
                float(sim.last_activity_s), int((rec.status == FAILED).sum()),
                int(((rec.status == REJECTED) & (rec.reject_reason == NO_INSTANCE)).sum()),
            )
            return cls(requests, instances, events, summary, sim.config.to_dict(), fleet.events_frame())
        return cls(requests, instances, events, summary, sim.config.to_dict())


def summarize(
    requests: pd.DataFrame,
    status: np.ndarray,
    *,
    slo: dict[str, float] | None = None,
    num_instances: int | None = None,
    itl: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The run's summary (README "Metric glossary" gives every formula). `slo` holds the
    `ttft_s`/`tpot_s` targets (default: the config's, 2 s and 100 ms); `num_instances`
    counts idle instances in the load balance (default: the highest routed id + 1); `itl`
    is the engine's record of inter-token gaps, (gaps, how many tokens waited each), whose
    statistics become `itl_s_*` (null without it)."""
    # only the columns the statistics read: a row mask over the whole frame copies all of it
    finished = requests.loc[status == FINISHED, [*LATENCY_METRICS, "output_tokens"]]
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
    summary.update(inter_token_latency(*itl) if itl is not None else _no_itl())
    cached = requests["cached_tokens"]
    admitted = cached.notna().to_numpy()
    input_total = requests["input_tokens"].to_numpy()[admitted].sum()
    cached_total = cached.to_numpy(dtype=np.int64, na_value=0)[admitted].sum()
    first = float(cached_total / input_total) if input_total else 0.0
    summary["prefix_hit_ratio_first_admission"] = first
    if "kv_hit_tokens_host" in requests:  # lower tiers: the tokens they served at first admission
        for tier in ("host", "disk"):
            hits = requests[f"kv_hit_tokens_{tier}"].to_numpy(dtype=np.int64, na_value=0)[admitted].sum()
            summary[f"prefix_hit_ratio_first_admission_{tier}"] = float(hits / input_total) if input_total else 0.0
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
    summary.update(_throughput_and_goodput(requests, status, slo or {"ttft_s": 2.0, "tpot_s": 0.1}))
    summary.update(_load_balance(requests, num_instances))
    return summary


def handoff_summary(requests: pd.DataFrame, status: np.ndarray, num_local_prefills: int) -> dict[str, Any]:
    """A disaggregated run's KV transfers, over finished requests that had one."""
    done = status == FINISHED
    seconds = requests["kv_transfer_s"].to_numpy(dtype=float)[done]
    moved = requests["kv_transfer_bytes"].to_numpy(dtype=float, na_value=np.nan)[done]
    had = ~np.isnan(seconds)
    seconds, moved = seconds[had], moved[had]
    return {
        "num_kv_transfers": int(had.sum()),
        "kv_transfer_s_mean": float(seconds.mean()) if len(seconds) else None,
        "kv_transfer_s_p90": float(np.percentile(seconds, 90)) if len(seconds) else None,
        "kv_transfer_bytes_mean": float(moved.mean()) if len(moved) else None,
        "num_prefilled_on_decode": int(num_local_prefills),
    }


def pool_busy_fractions(sim: Any) -> dict[str, Any]:
    """Per pool, the share of the run its instances spent computing steps."""
    span = float(sim.last_activity_s)
    out: dict[str, Any] = {}
    for pool in sim.pools:
        busy = sum(sim.instances[i].busy_time_s for i in pool.instance_ids)
        out[f"busy_fraction_{pool.name}"] = busy / (span * pool.num_instances) if span > 0 else None
    return out


def pooled_percentile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """`np.percentile(np.repeat(values, counts), q)` (linear interpolation between the two
    closest ranks, numpy's default) without expanding the population: `values` sorted
    ascending, `counts` > 0."""
    cumulative = np.cumsum(counts, dtype=np.int64)
    n = int(cumulative[-1])
    position = (n - 1) * (q / 100.0)
    below = int(np.floor(position))
    fraction = position - below
    # the value at 0-based rank r is the first whose cumulative count exceeds r
    lo, hi = np.searchsorted(cumulative, [below, min(below + 1, n - 1)], side="right")
    a, b = float(values[lo]), float(values[hi])
    # numpy's _lerp: from the nearer end, so equal neighbours give exactly their value
    return a + (b - a) * fraction if fraction < 0.5 else b - (b - a) * (1.0 - fraction)


def _no_itl() -> dict[str, Any]:
    return {f"itl_s_{k}": None for k in ("mean", "p50", "p90", "p99")}


def inter_token_latency(gaps: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    """ITL as vLLM's benchmark_serving reports it: every gap between consecutive output
    tokens, pooled over requests (`np.mean` and `np.percentile` of the list of all of them).
    The engine records the gaps exactly (see `Instance._record_step_gaps`), each with how
    many tokens waited it; entries are put in one canonical order first, so the result does
    not depend on the order they were recorded in (fast-forward on or off)."""
    keep = counts > 0
    gaps, counts = gaps[keep], counts[keep].astype(np.int64)
    if not len(gaps):
        return _no_itl()
    order = np.lexsort((counts, gaps))
    gaps, counts = gaps[order], counts[order]
    out: dict[str, Any] = {"itl_s_mean": float((gaps * counts).sum() / counts.sum())}
    for q in (50, 90, 99):
        out[f"itl_s_p{q}"] = pooled_percentile(gaps, counts, q)
    return out


def _throughput_and_goodput(requests: pd.DataFrame, status: np.ndarray, slo: dict[str, float]) -> dict[str, Any]:
    """Rates over the serving span: first arrival to last finish (vLLM's benchmark
    duration). SLO attainment counts every request that arrived (an unfinished or rejected
    one misses its SLO); a one-token request has no TPOT and meets the TPOT target."""
    done = status == FINISHED
    arrived = requests["arrived_at"].to_numpy(dtype=float, na_value=np.nan)[status != 0]
    finished_at = requests["finished_at"].to_numpy(dtype=float, na_value=np.nan)[done]
    span = float(finished_at.max() - np.nanmin(arrived)) if done.any() and len(arrived) else 0.0
    ttft = requests["ttft_s"].to_numpy(dtype=float, na_value=np.nan)
    tpot = requests["tpot_s"].to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        good = done & (ttft <= slo["ttft_s"]) & (np.isnan(tpot) | (tpot <= slo["tpot_s"]))
    num_arrived = int((status != 0).sum())
    output_tokens = float(requests["output_tokens"].to_numpy(dtype=float, na_value=np.nan)[done].sum())

    def rate(amount: float) -> float | None:
        return amount / span if span > 0 else None

    return {
        "duration_s": span,
        "request_throughput_per_s": rate(float(done.sum())),
        "output_token_throughput_per_s": rate(output_tokens),
        "slo_ttft_s": float(slo["ttft_s"]),
        "slo_tpot_s": float(slo["tpot_s"]),
        "slo_attainment": float(good.sum() / num_arrived) if num_arrived else None,
        "goodput_per_s": rate(float(good.sum())),
    }


def _load_balance(requests: pd.DataFrame, num_instances: int | None) -> dict[str, Any]:
    """max/mean over instances (idle ones included) of the requests routed to each and of
    their tokens (input + output): 1.0 is perfect balance."""
    instance = requests["instance_id"].to_numpy()
    routed = ~pd.isna(instance)
    routed &= np.where(routed, instance, -1).astype(float) >= 0
    ids = instance[routed].astype(np.int64)
    n = num_instances if num_instances is not None else (int(ids.max()) + 1 if len(ids) else 0)
    if not n or not len(ids):
        return {"instance_requests_max_over_mean": None, "instance_tokens_max_over_mean": None}
    input_tokens = requests["input_tokens"].to_numpy(dtype=float, na_value=np.nan)
    tokens = (input_tokens + requests["output_tokens"].to_numpy(dtype=float, na_value=np.nan))[routed]
    per_requests = np.bincount(ids, minlength=n)
    per_tokens = np.bincount(ids, weights=tokens, minlength=n)
    return {
        "instance_requests_max_over_mean": float(per_requests.max() / per_requests.mean()),
        "instance_tokens_max_over_mean": float(per_tokens.max() / per_tokens.mean()),
    }
