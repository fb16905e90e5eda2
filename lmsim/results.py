"""A finished run's tables and summary, and their run directory on disk.

A run directory holds `requests.parquet`, `instances.parquet`, `router_events.parquet`,
`summary.json`, the resolved `config.yaml` and, optionally, `cdf.png`. It is written to a
temporary sibling directory and renamed into place, so a reader never sees a half-written
run, and an existing run is replaced only once the new one is complete.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from .metrics import FINISHED, REJECTED, STATUS_NAMES, UNFINISHED

if TYPE_CHECKING:
    from .simulation import Simulation

COMPLETE_MARKER = "summary.json"  # written last: a run directory with it is complete
LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")


@dataclass
class Results:
    requests: pd.DataFrame
    instances: pd.DataFrame
    router_events: pd.DataFrame
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_simulation(cls, sim: Simulation, wall_time_s: float) -> Results:
        rec = sim.recorder
        trace = sim.trace
        events = pd.DataFrame(sim.router_events)
        predicted = rec.predicted_ttft_s.copy()
        if len(events) and "kind" in events:
            pred = events[events["kind"] == "ttft_prediction"]
            if len(pred) and {"request_id", "predicted_ttft_s"} <= set(pred.columns):
                predicted[pred["request_id"].to_numpy(dtype=np.int64)] = pred["predicted_ttft_s"].to_numpy()
        out = trace.output_tokens
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
                "instance_id": rec.instance_id,
                "input_tokens": trace.input_tokens,
                "output_tokens": out,
                "cached_tokens": rec.cached_tokens,
                "num_preemptions": rec.num_preemptions,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": rec.finished_at - rec.arrived_at,
                "queue_s": rec.first_scheduled_at - rec.arrived_at,
                "predicted_ttft_s": predicted,
                "session_id": trace.column("session_id"),
                "class_id": trace.column("class_id"),
                "status": pd.Categorical(
                    [STATUS_NAMES[int(s)] for s in rec.status], categories=list(STATUS_NAMES.values())
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
        summary.update(
            {
                "sim_time_s": float(sim.last_activity_s),
                "wall_time_s": wall_time_s,
                "router_us_per_decision": sim.router.us_per_decision,
                "num_steps": sum(i.num_steps for i in sim.instances),
                "num_step_events": sum(i.num_events for i in sim.instances),
                "num_preemptions": int(rec.num_preemptions.sum()),
                "num_evictions": sum(i.cache.num_evictions for i in sim.instances),
                "kv_blocks_per_instance": sim.num_blocks,
                "policy": sim.config.router.policy,
            }
        )
        summary["requests_per_wall_s"] = (
            summary["num_finished"] / wall_time_s if wall_time_s > 0 else None
        )
        return cls(requests, instances, events, summary, sim.config.to_dict())

    # -- disk ----------------------------------------------------------------------------

    def save(self, run_dir: str | os.PathLike[str], *, figure: bool = True) -> Path:
        run_dir = Path(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = run_dir.with_name(f".{run_dir.name}.tmp-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        pq.write_table(_to_arrow(self.requests), tmp / "requests.parquet")
        pq.write_table(pa.Table.from_pandas(self.instances, preserve_index=False), tmp / "instances.parquet")
        pq.write_table(
            pa.Table.from_pandas(_flatten_events(self.router_events), preserve_index=False),
            tmp / "router_events.parquet",
        )
        (tmp / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        if figure:
            from .plots import plot_run_cdf

            plot_run_cdf(self.requests, tmp / "cdf.png", title=self.config.get("name", ""))
        (tmp / COMPLETE_MARKER).write_text(json.dumps(_jsonable(self.summary), indent=2) + "\n")
        if run_dir.exists():
            old = run_dir.with_name(f".{run_dir.name}.old-{os.getpid()}")
            os.replace(run_dir, old)
            os.replace(tmp, run_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, run_dir)
        return run_dir

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> Results:
        run_dir = Path(run_dir)
        requests = pq.read_table(run_dir / "requests.parquet").to_pandas()
        instances = pq.read_table(run_dir / "instances.parquet").to_pandas()
        events_path = run_dir / "router_events.parquet"
        events = pq.read_table(events_path).to_pandas() if events_path.exists() else pd.DataFrame()
        summary = json.loads((run_dir / COMPLETE_MARKER).read_text())
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        return cls(requests, instances, events, summary, config)


def is_complete(run_dir: str | os.PathLike[str]) -> bool:
    return (Path(run_dir) / COMPLETE_MARKER).exists()


def summarize(requests: pd.DataFrame, status: np.ndarray) -> dict[str, Any]:
    finished = requests[status == FINISHED]
    summary: dict[str, Any] = {
        "num_requests": len(requests),
        "num_finished": int((status == FINISHED).sum()),
        "num_unfinished": int((status == UNFINISHED).sum()),
        "num_rejected": int((status == REJECTED).sum()),
        "num_not_arrived": int((status == 0).sum()),
    }
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
    admitted = requests["cached_tokens"].to_numpy() >= 0
    input_total = requests["input_tokens"].to_numpy()[admitted].sum()
    cached_total = requests["cached_tokens"].to_numpy()[admitted].sum()
    summary["prefix_hit_ratio"] = float(cached_total / input_total) if input_total else 0.0
    return summary


def _to_arrow(requests: pd.DataFrame) -> pa.Table:
    """NaN timestamps and -1 ids become nulls: "never happened" is not a number."""
    columns = {}
    for name in requests.columns:
        col = requests[name]
        if name == "status":
            columns[name] = pa.array(col.astype(str).to_numpy(), type=pa.string())
        elif col.dtype.kind == "f":
            values = col.to_numpy()
            columns[name] = pa.array(values, mask=np.isnan(values), type=pa.float64())
        elif name in ("instance_id", "cached_tokens", "session_id", "class_id"):
            values = col.to_numpy()
            columns[name] = pa.array(values, mask=values < 0, type=pa.int64())
        else:
            columns[name] = pa.array(col.to_numpy())
    return pa.table(columns)


def _flatten_events(events: pd.DataFrame) -> pd.DataFrame:
    if not len(events):
        return pd.DataFrame({"time_s": pd.Series([], dtype=float), "kind": pd.Series([], dtype=str)})
    out = events.copy()
    for name in out.columns:
        if out[name].dtype == object and name != "kind":
            out[name] = out[name].map(lambda v: json.dumps(v) if isinstance(v, (list, dict, tuple)) else v)
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return None if math.isnan(f) else f
    return value
