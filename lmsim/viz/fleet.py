"""The `fleet` figure kind: a run's fleet over time, from its saved results only
(requests.parquet, config.yaml, summary.json and fleet_events.parquet when present).

One column per run (at most MAX_RUNS), three panels:
  (a) replicas per pool over time: active (in the router's view, solid) and provisioned
      (starting, warming and draining included: what is paid for, dashed), as steps, with
      the arrival rate per `cost.window_s` window on a second axis (grey);
  (b) P50 and P99 TTFT per window (by arrival time);
  (c) P50 and P99 TPOT per window.
Scale decisions (`scale` rows) are dotted vertical lines, crashes red ones, in every panel.
A run without fleet events is drawn as a fixed fleet (flat replica lines), so the kind also
shows the latency over time of any run it is asked for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml

from lmsim.fleet_cost import (
    DEFAULT_WINDOW_S,
    FLEET_EVENTS,
    fixed_replica_timeline,
    read_fleet_events,
    replica_timeline,
    run_end,
    window_stats,
)
from lmsim.viz.axes import LEGEND_FONTSIZE, declutter_ticks, latency_axis
from lmsim.viz.runs import PlotError, RunSet

MAX_RUNS = 4
SCALE_COLOR, CRASH_COLOR = "0.35", "tab:red"


def fleet_runs(data: RunSet) -> list[str]:
    """Runs worth a fleet figure by default: those with fleet events or a `cost:` section."""
    runs = []
    for run in data.index["run"]:
        config = data.configs.get(run, {})
        if (data.run_dir(run) / FLEET_EVENTS).exists() or any(k.startswith("cost.") for k in config):
            runs.append(run)
    return runs


def plot_fleet(data: RunSet) -> plt.Figure:
    runs = fleet_runs(data) or list(data.index["run"])
    if not runs:
        raise PlotError(f"{data.root}: no run to draw")
    shown = runs[:MAX_RUNS]
    fig, axes = plt.subplots(3, len(shown), figsize=(6.5 * len(shown), 8.5), sharex="col", squeeze=False)
    for col, run in enumerate(shown):
        draw_run(axes[:, col], data.run_dir(run), title=run if len(data.index) > 1 else None)
    more = f" (first {MAX_RUNS} of {len(runs)} runs)" if len(runs) > MAX_RUNS else ""
    fig.suptitle(data.title(data.index[data.index["run"].isin(shown)]) + more, fontsize=10)
    fig.tight_layout()
    declutter_ticks(fig)
    return fig


def draw_run(axes: Any, run_dir: Path, *, title: str | None = None) -> None:
    import pyarrow.parquet as pq

    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    summary = json.loads((run_dir / "summary.json").read_text())
    requests = pq.read_table(run_dir / "requests.parquet").to_pandas()
    events = read_fleet_events(run_dir)
    end = run_end(requests, summary)
    cost = config.get("cost") or {}
    window_s = float(cost.get("window_s") or DEFAULT_WINDOW_S)
    slo = (config.get("output") or {}).get("slo") or {}
    windows = window_stats(requests, window_s, float(slo.get("ttft_s", 2.0)), float(slo.get("tpot_s", 0.1)))
    timeline = replica_timeline(events, end) if events is not None else fixed_replica_timeline(config, end)
    rate_axis = _replicas(axes[0], timeline, windows, window_s)
    for ax, metric, name in ((axes[1], "ttft", "TTFT"), (axes[2], "tpot", "TPOT")):
        _latency(ax, windows, window_s, metric, name)
    if events is not None:
        _mark_events(axes, events)
    lines, labels = axes[0].get_legend_handles_labels()
    more, more_labels = rate_axis.get_legend_handles_labels()
    axes[0].legend(lines + more, labels + more_labels, fontsize=LEGEND_FONTSIZE, loc="upper left", ncol=2)
    for ax in axes[1:]:
        ax.legend(fontsize=LEGEND_FONTSIZE, loc="best")
    axes[0].set_title(f"(a) replicas per pool{f' — {title}' if title else ''}", fontsize=9)
    axes[2].set_xlabel("time (s)")


def _replicas(ax: Any, timeline: pd.DataFrame, windows: pd.DataFrame, window_s: float) -> Any:
    """Replica steps on `ax`, the arrival rate on a twin axis (returned)."""
    counts = []
    for k, (pool, own) in enumerate(timeline.groupby("pool", sort=True)):
        color = f"C{k % 10}"
        ax.step(own["time_s"], own["active"], where="post", color=color, label=f"{pool}: active")
        ax.step(own["time_s"], own["provisioned"], where="post", color=color, ls="--", alpha=0.8,
                label=f"{pool}: provisioned")  # fmt: skip
        counts.extend([own["active"].max(), own["provisioned"].max()])
    # headroom above the lines for the legend (it lists the twin axis's rate too)
    ax.set_ylim(0, max(counts, default=1) * 1.6 + 0.5)
    ax.set_ylabel("replicas")
    ax.grid(alpha=0.3)
    rate = ax.twinx()
    if len(windows):
        # the last window's level holds to its end
        starts = np.append(windows["start_s"].to_numpy(dtype=float), windows["start_s"].iloc[-1] + window_s)
        rates = windows["arrival_rate_per_s"].to_numpy(dtype=float)
        rate.step(starts, np.append(rates, rates[-1]), where="post", color="0.6", lw=1,
                  label=f"arrival rate ({window_s:g} s windows)")  # fmt: skip
        rate.set_ylim(0, rates.max() * 1.6)
    rate.set_ylabel("arrivals (req/s)", color="0.4")
    return rate


def _latency(ax: Any, windows: pd.DataFrame, window_s: float, metric: str, name: str) -> None:
    values = []
    for q, ls in (("p50", "-"), ("p99", "--")):
        column = f"{metric}_{q}_s"
        if column in windows and len(windows):
            ms = windows[column].to_numpy(dtype=float) * 1000.0
            ax.plot(windows["start_s"] + window_s / 2, ms, ls=ls, marker="o", ms=3, color="C0" if q == "p50" else "C3",
                    label=f"{q.upper()} {name}")  # fmt: skip
            values.append(ms)
    unit = latency_axis(ax, "y", np.concatenate(values) if values else np.array([]))
    ax.set_ylabel(f"{name} ({unit})")
    ax.set_title(f"({'b' if metric == 'ttft' else 'c'}) {name} per {window_s:g} s window, by arrival", fontsize=9)
    ax.grid(alpha=0.3)


def _mark_events(axes: Any, events: pd.DataFrame) -> None:
    """Dotted grey lines at scale decisions, red at crashes (labelled once, in panel a);
    a scale decision's target ("pool→n") is written at the foot of panel a (the legend
    holds its top)."""
    kinds = events["event"].astype(str)
    for event, color, ls, label in (("scale", SCALE_COLOR, ":", "scale decision"), ("crash", CRASH_COLOR, "-", "crash")):
        times = sorted(set(events.loc[kinds == event, "time_s"].astype(float)))
        for ax in axes:
            for i, t in enumerate(times):
                ax.axvline(t, color=color, ls=ls, lw=1, alpha=0.8, label=label if (i == 0 and ax is axes[0]) else None)
    if "target" in events:
        scale = events[(kinds == "scale") & events["target"].notna()]
        for row in scale.itertuples():
            axes[0].annotate(f"{row.pool}→{int(row.target)}", (float(row.time_s), 0.0), xycoords=("data", "axes fraction"),
                             xytext=(2, 3), textcoords="offset points", fontsize=7, color=SCALE_COLOR)  # fmt: skip


# -- the report's section ---------------------------------------------------------------------


def fleet_cost_html(data: RunSet) -> str | None:
    """The `fleet & cost` section of `lmsim report`: one row per (run, pool, GPU) with
    GPU-hours, price and cost, and the run's cost per million output tokens, goodput and
    SLO attainment; the price sources below. None when no run has fleet events or a
    `cost:` section (the reports of other runs stay as they were). A run whose GPU has no
    price shows the reason in its row instead of failing the report."""
    import html

    from lmsim.errors import LmsimError
    from lmsim.fleet_cost import fleet_cost

    runs = fleet_runs(data)
    if not runs:
        return None
    rows, sources = [], {}
    for run in runs:
        try:
            cost = fleet_cost(data.run_dir(run))
        except LmsimError as exc:
            rows.append({"run": run, "pool": "-", "GPU": "-", "note": str(exc)})
            continue
        t = cost.totals
        for p in cost.pools.itertuples():
            sources[p.price_source] = None
            rows.append({
                "run": run, "pool": p.pool, "GPU": p.gpu, "GPU-hours": f"{p.gpu_hours:.4g}",
                "$/GPU-hour": f"{p.usd_per_gpu_hour:.2f}", "cost $": f"{p.cost_usd:.4g}",
                "run cost $": f"{t['cost_usd']:.4g}",
                "$/M out tok": "-" if t["usd_per_million_output_tokens"] is None else f"{t['usd_per_million_output_tokens']:.4g}",
                "goodput req/s": "-" if t["goodput_per_s"] is None else f"{t['goodput_per_s']:.4g}",
                "SLO attained": "-" if t["slo_attainment"] is None else f"{t['slo_attainment']:.3f}",
                "span s": f"{t['run_span_s']:.1f}", "fleet events": "yes" if t["fleet_events"] else "no (fixed fleet)",
            })  # fmt: skip
    table = pd.DataFrame(rows).fillna("").to_html(index=False, border=0, escape=True)
    notes = "".join(f"<li>{html.escape(s)}</li>" for s in sources)
    return ("<h3>fleet &amp; cost</h3><p>GPU-hours provisioned (start to stop or crash; a fixed fleet: every "
            "instance for the run span) x price per GPU-hour; goodput and SLO attainment against output.slo "
            "(lmsim.fleet_cost).</p>" + table + (f"<p>prices:</p><ul>{notes}</ul>" if notes else ""))
