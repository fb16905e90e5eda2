"""What a run cost and what it bought, from its saved results only: GPU-hours provisioned
per pool and GPU type, their price, cost per million output tokens, goodput, and SLO
attainment and latency percentiles per time window.

Definitions (every number is recomputable by hand from the run directory):

- Run span: time 0 to the run's end, `summary.sim_time_s` (the last engine activity), or
  the last arrival/finish when the summary lacks it. Instances are paid for over it.
- Provisioned: with `fleet_events.parquet`, an instance is provisioned from its `start`
  (model load begins) to its `stop` or `crash`, starting, warming and draining included
  (a cloud bills a machine from boot to release). An instance whose first row is not a
  `start` (one already up at t = 0, whose first row is e.g. `active` at 0 or a `drain`
  later) is provisioned from 0; a `restart` after a crash opens a new interval like a
  `start`; an interval still open at the end closes at the run's end. Instances with no
  row are not counted. Without fleet events (a fixed fleet), every instance of every pool
  is provisioned for the whole run span.
- GPU-hours: provisioned seconds x GPUs per instance / 3600, summed per (pool, GPU). GPUs
  per instance come from the `gpus` column of the events, or for a fixed fleet from
  `fleet.pools.<pool>.gpus_per_instance` if set, else the profile's tensor-parallel size.
- Price: `cost.gpu_price_per_hour[<gpu key>]` of the run's config, else the shipped table
  (`lmsim list prices`; lmsim/data/hardware/gpu_prices.yaml). A GPU with neither is one
  clear error naming the pool.
- Cost per million output tokens: total cost / (output tokens of finished requests / 1e6);
  tokens of requests that did not finish bought nothing a user received.
- Good request: finished, TTFT <= output.slo.ttft_s and TPOT <= output.slo.tpot_s (a
  one-token request has no TPOT and meets that target), as the summary's `slo_attainment`.
  Goodput: good requests / run span (per second).
- Windows of `cost.window_s` (default 60 s) by arrival time: requests that arrived in the
  window, how many were good (attainment = good / arrived; a rejected, failed or
  unfinished request misses its SLO), and P50/P99 of TTFT and TPOT over the finished ones
  (numpy's linear-interpolation percentile).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmsim.errors import ConfigError

FLEET_EVENTS = "fleet_events.parquet"
FLEET_EVENT_COLUMNS = ("time_s", "instance_id", "pool", "gpu", "gpus", "event")
# rows that open a provisioned interval when none is open / that close one
OPENING_EVENTS = ("start", "restart")
CLOSING_EVENTS = ("stop", "crash")
# rows that end an instance's time in the router's view (to count active replicas)
LEAVING_ACTIVE = ("drain", "stop", "crash")
DEFAULT_WINDOW_S = 60.0


@dataclass
class FleetCost:
    """`pools`: one row per (pool, gpu): gpu_hours, usd_per_gpu_hour, price_source,
    cost_usd. `windows`: one row per window (see the module docstring). `totals`: the
    run-level numbers."""

    pools: pd.DataFrame
    windows: pd.DataFrame
    totals: dict[str, Any]


# -- entry points --------------------------------------------------------------------------


def fleet_cost(run_dir: str | os.PathLike[str]) -> FleetCost:
    """Cost and SLO numbers of a saved run directory."""
    import pyarrow.parquet as pq
    import yaml

    run_dir = Path(run_dir)
    requests = pq.read_table(run_dir / "requests.parquet").to_pandas()
    summary = json.loads((run_dir / "summary.json").read_text())
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    events = read_fleet_events(run_dir)
    return compute_fleet_cost(requests, summary, config, events)


def read_fleet_events(run_dir: str | os.PathLike[str]) -> pd.DataFrame | None:
    """The run's fleet_events.parquet, or None when the run had a fixed fleet."""
    path = Path(run_dir) / FLEET_EVENTS
    if not path.exists():
        return None
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pandas()


def compute_fleet_cost(
    requests: pd.DataFrame,
    summary: dict[str, Any],
    config: dict[str, Any],
    fleet_events: pd.DataFrame | None = None,
) -> FleetCost:
    end = run_end(requests, summary)
    cost_cfg = config.get("cost") or {}
    overrides = {str(k).lower(): float(v) for k, v in (cost_cfg.get("gpu_price_per_hour") or {}).items()}
    window_s = float(cost_cfg.get("window_s") or DEFAULT_WINDOW_S)
    if fleet_events is not None:
        intervals = provisioned_intervals(fleet_events, end)
    else:
        intervals = fixed_fleet_intervals(config, end)
    pools = _priced_pools(intervals, overrides)
    slo = (config.get("output") or {}).get("slo") or {}
    ttft_slo, tpot_slo = float(slo.get("ttft_s", 2.0)), float(slo.get("tpot_s", 0.1))
    good = good_requests(requests, ttft_slo, tpot_slo)
    finished = _status(requests) == "finished"
    output_tokens = float(requests["output_tokens"].to_numpy(dtype=float)[finished].sum())
    cost = float(pools["cost_usd"].sum())
    arrived = _status(requests) != "not_arrived"
    totals = {
        "run_span_s": end,
        "gpu_hours": float(pools["gpu_hours"].sum()),
        "cost_usd": cost,
        "output_tokens": int(output_tokens),
        "usd_per_million_output_tokens": cost / (output_tokens / 1e6) if output_tokens > 0 else None,
        "num_good": int(good.sum()),
        "goodput_per_s": float(good.sum()) / end if end > 0 else None,
        "slo_attainment": float(good.sum() / arrived.sum()) if arrived.any() else None,
        "slo_ttft_s": ttft_slo,
        "slo_tpot_s": tpot_slo,
        "window_s": window_s,
        "fleet_events": fleet_events is not None,
    }
    return FleetCost(pools, window_stats(requests, window_s, ttft_slo, tpot_slo), totals)


# -- GPU-hours -----------------------------------------------------------------------------


def run_end(requests: pd.DataFrame, summary: dict[str, Any]) -> float:
    end = summary.get("sim_time_s")
    if end is not None and np.isfinite(end):
        return float(end)
    times = pd.concat([requests["arrived_at"], requests["finished_at"]]).to_numpy(dtype=float, na_value=np.nan)
    return float(np.nanmax(times)) if np.isfinite(times).any() else 0.0


def provisioned_intervals(events: pd.DataFrame, end: float) -> pd.DataFrame:
    """One row per provisioned interval: instance_id, pool, gpu, gpus, start_s, end_s."""
    missing = [c for c in FLEET_EVENT_COLUMNS if c not in events.columns]
    if missing:
        raise ConfigError(f"{FLEET_EVENTS}: missing column(s) {', '.join(missing)}")
    rows = []
    lifecycle = events[events["instance_id"] >= 0].sort_values(["instance_id", "time_s"], kind="stable")
    for instance_id, own in lifecycle.groupby("instance_id", sort=True):
        opened: float | None = None
        first = True
        for time_s, event in zip(own["time_s"].to_numpy(dtype=float), own["event"].astype(str)):
            if first and event not in OPENING_EVENTS:
                opened = 0.0  # up at t = 0
            first = False
            if event in OPENING_EVENTS and opened is None:
                opened = time_s
            elif event in CLOSING_EVENTS and opened is not None:
                rows.append((instance_id, opened, time_s))
                opened = None
        if opened is not None:
            rows.append((instance_id, opened, max(end, opened)))
    info = lifecycle.drop_duplicates("instance_id").set_index("instance_id")
    out = pd.DataFrame(rows, columns=["instance_id", "start_s", "end_s"])
    out["pool"] = info.loc[out["instance_id"], "pool"].astype(str).to_numpy()
    out["gpu"] = info.loc[out["instance_id"], "gpu"].astype(str).to_numpy()
    out["gpus"] = info.loc[out["instance_id"], "gpus"].to_numpy(dtype=np.int64)
    return out[["instance_id", "pool", "gpu", "gpus", "start_s", "end_s"]]


def fixed_fleet_intervals(config: dict[str, Any], end: float) -> pd.DataFrame:
    """Every instance of every pool over [0, end] (a run without fleet events)."""
    from lmsim.config import ClusterConfig
    from lmsim.profile.hardware import gpu_key, profile_gpu

    raw = dict(config.get("cluster") or {})
    if raw.get("pools"):
        raw.pop("num_instances", None)  # a saved config dumps the default beside the pools
    cluster = ClusterConfig.model_validate(raw)
    fleet_pools = ((config.get("fleet") or {}).get("pools")) or {}
    rows = []
    for spec in cluster.pool_specs():
        profile = spec.engine["profile"]
        key, tp = profile_gpu(profile)
        gpu = key or (gpu_key(str(profile)) if isinstance(profile, str) else None) or _unnamed_gpu(profile)
        gpus = (fleet_pools.get(spec.name) or {}).get("gpus_per_instance") or tp
        for instance_id in spec.instance_ids:
            rows.append((instance_id, spec.name, gpu, int(gpus), 0.0, end))
    return pd.DataFrame(rows, columns=["instance_id", "pool", "gpu", "gpus", "start_s", "end_s"])


def _unnamed_gpu(profile: Any) -> str:
    """What an unpriced profile's GPU is called in messages and overrides."""
    if isinstance(profile, dict):
        return f"{profile.get('kind', 'linear')}-profile"
    return str(profile)


def _priced_pools(intervals: pd.DataFrame, overrides: dict[str, float]) -> pd.DataFrame:
    from lmsim.profile.hardware import gpu_key
    from lmsim.shipped import gpu_price_per_hour, gpu_price_source

    seconds = (intervals["end_s"] - intervals["start_s"]).clip(lower=0) * intervals["gpus"]
    per = (
        intervals.assign(gpu_seconds=seconds)
        .groupby(["pool", "gpu"], sort=False)["gpu_seconds"]
        .sum()
        .reset_index()
    )
    prices, sources = [], []
    for pool, gpu in zip(per["pool"], per["gpu"]):
        key = gpu_key(gpu) or str(gpu).lower()
        if key in overrides or str(gpu).lower() in overrides:
            prices.append(overrides.get(key, overrides.get(str(gpu).lower())))
            sources.append("cost.gpu_price_per_hour in the experiment")
            continue
        try:
            prices.append(gpu_price_per_hour(key))
        except ConfigError:
            raise ConfigError(f"cost: pool {pool!r} runs on GPU {gpu!r}, which has no shipped price; "
                              f"set cost.gpu_price_per_hour: {{{key}: USD per GPU-hour}}") from None
        sources.append(gpu_price_source(key))
    per["gpu_hours"] = per.pop("gpu_seconds") / 3600.0
    per["usd_per_gpu_hour"] = np.asarray(prices, dtype=float)
    per["price_source"] = sources
    per["cost_usd"] = per["gpu_hours"] * per["usd_per_gpu_hour"]
    return per


# -- replicas over time --------------------------------------------------------------------


def replica_timeline(events: pd.DataFrame, end: float) -> pd.DataFrame:
    """Step series per pool: at each `time_s`, how many instances are `active` (in the
    router's view: from `active` to drain/stop/crash) and how many are `provisioned`
    (from start to stop/crash, as for GPU-hours). One row per (pool, change time), the
    counts holding until the pool's next row; a last row at `end`."""
    prov = provisioned_intervals(events, end)
    # an interval still open at the end closes there: no step, the last counts hold to `end`
    steps = [(r.pool, r.start_s, 0, 1) for r in prov.itertuples()]
    steps += [(r.pool, r.end_s, 0, -1) for r in prov.itertuples() if r.end_s < end]
    lifecycle = events[events["instance_id"] >= 0].sort_values(["instance_id", "time_s"], kind="stable")
    for _, own in lifecycle.groupby("instance_id", sort=True):
        pool = str(own["pool"].iloc[0])
        active_since: float | None = None
        for time_s, event in zip(own["time_s"].to_numpy(dtype=float), own["event"].astype(str)):
            if event == "active" and active_since is None:
                active_since = time_s
            elif event in LEAVING_ACTIVE and active_since is not None:
                steps += [(pool, active_since, 1, 0), (pool, time_s, -1, 0)]
                active_since = None
        if active_since is not None:
            steps.append((pool, active_since, 1, 0))
    frame = pd.DataFrame(steps, columns=["pool", "time_s", "d_active", "d_provisioned"])
    rows = []
    for pool, own in frame.groupby("pool", sort=True):
        per_time = own.groupby("time_s", sort=True)[["d_active", "d_provisioned"]].sum()
        counts = per_time.cumsum()
        times = [float(t) for t in counts.index if t < end]
        for t in times:
            rows.append((pool, t, int(counts.loc[t, "d_active"]), int(counts.loc[t, "d_provisioned"])))
        if times and times[-1] < end:
            last = rows[-1]
            rows.append((pool, end, last[2], last[3]))
    return pd.DataFrame(rows, columns=["pool", "time_s", "active", "provisioned"])


def fixed_replica_timeline(config: dict[str, Any], end: float) -> pd.DataFrame:
    """The flat timeline of a fixed fleet: every pool at its size from 0 to `end`."""
    intervals = fixed_fleet_intervals(config, end)
    counts = intervals.groupby("pool", sort=False).size()
    rows = [(pool, t, int(n), int(n)) for pool, n in counts.items() for t in (0.0, end)]
    return pd.DataFrame(rows, columns=["pool", "time_s", "active", "provisioned"])


# -- SLOs ----------------------------------------------------------------------------------


def _status(requests: pd.DataFrame) -> np.ndarray:
    return requests["status"].astype(str).to_numpy()


def good_requests(requests: pd.DataFrame, ttft_slo: float, tpot_slo: float) -> np.ndarray:
    done = _status(requests) == "finished"
    ttft = requests["ttft_s"].to_numpy(dtype=float, na_value=np.nan)
    tpot = requests["tpot_s"].to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        return done & (ttft <= ttft_slo) & (np.isnan(tpot) | (tpot <= tpot_slo))


def window_stats(requests: pd.DataFrame, window_s: float, ttft_slo: float, tpot_slo: float) -> pd.DataFrame:
    """One row per window [k w, (k + 1) w) from 0 to the last arrival: start_s, arrived,
    arrival_rate_per_s, good, slo_attainment, ttft/tpot p50/p99 (NaN where none finished)."""
    status = _status(requests)
    arrived = status != "not_arrived"
    at = requests["arrived_at"].to_numpy(dtype=float, na_value=np.nan)
    good = good_requests(requests, ttft_slo, tpot_slo)
    done = status == "finished"
    ttft = requests["ttft_s"].to_numpy(dtype=float, na_value=np.nan)
    tpot = requests["tpot_s"].to_numpy(dtype=float, na_value=np.nan)
    columns = ["start_s", "arrived", "arrival_rate_per_s", "good", "slo_attainment",
               "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"]  # fmt: skip
    if not arrived.any():
        return pd.DataFrame(columns=columns)
    index = np.floor(at[arrived] / window_s).astype(np.int64)
    count = int(index.max()) + 1
    which = np.full(len(requests), -1, dtype=np.int64)
    which[arrived] = index
    rows = []
    for k in range(count):
        inside = which == k
        n = int(inside.sum())
        finished = inside & done

        def pct(values: np.ndarray, q: float, finished: np.ndarray = finished) -> float:
            v = values[finished]
            v = v[~np.isnan(v)]
            return float(np.percentile(v, q)) if len(v) else float("nan")

        n_good = int((inside & good).sum())
        rows.append((k * window_s, n, n / window_s, n_good, n_good / n if n else float("nan"),
                     pct(ttft, 50), pct(ttft, 99), pct(tpot, 50), pct(tpot, 99)))  # fmt: skip
    return pd.DataFrame(rows, columns=columns)
