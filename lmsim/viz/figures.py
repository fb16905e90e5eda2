"""`lmsim plot`: the paper's figure kinds, drawn from saved results only (a sweep directory
with `sweep.parquet`, or a single run directory); nothing here runs a simulation.

Kinds (seed figure in brackets):
  cdf      TTFT and TPOT CDFs per policy, one row of panels per workload/cluster [22]
  rate     mean and P99 TTFT/TPOT vs arrival rate, one line per policy [23, 26]
  param    mean and P99 TTFT/TPOT vs one swept hyperparameter [11, 12]
  error    CDF of the relative error of the predicted TTFT (runs that logged predictions) [16]
  hotspot  per-minute class popularity x/x̄ vs cache coverage |M|/|M̄| with the alarm windows,
           and TTFT/TPOT over time per policy [21]
  fleet    replicas per pool over time (active, provisioned) with the arrival rate, and P50/P99
           TTFT/TPOT per window, scale decisions and crashes marked (lmsim.viz.fleet); by
           default for runs with fleet events or a `cost:` section, on request for any run
  tiers    hit ratio at first admission (GPU; host + disk) and mean/P99 TTFT vs a swept KV
           tier capacity (`cluster.kv_tiers.host.capacity_gb`, ...; 0 = no tier), one line per
           policy: a capacity sweep, or a router ranking with and without a tier [issue 26]

Swept keys are split into series (router.*: one line each, labelled by policy and the swept
router params), the x axis (a rate key, or the plotted hyperparameter) and facets (every
other swept key: one row of panels per combination).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from lmsim.outputs import (
    FIGURE_DIR_MARKER,
    FIGURE_FORMATS,
    check_output_file,
    is_signed_figure,
    save_figure,
)
from lmsim.study.index import RATE_KEYS
from lmsim.viz.axes import (
    LEGEND_FONTSIZE,
    declutter_ticks,
    latency_axis,
    panel_title,
    set_scale,
    wants_log,
)
from lmsim.viz.axes import plain_number as _plain
from lmsim.viz.bands import band_words, cdf_band, point_interval, t95
from lmsim.viz.runs import SEED_KEY, PlotError, RunSet, as_text, short_key
from lmsim.viz.style import VARIANT_LINESTYLES, policy_style
from lmsim.viz.titles import policy_words

KINDS = ("cdf", "rate", "param", "error", "hotspot", "tiers", "fleet")
FORMATS = FIGURE_FORMATS
FIGURES_DIR = "figures"
SweepData = RunSet  # the name earlier callers use
__all__ = ["FORMATS", "KINDS", "PlotError", "RunSet", "SweepData", "make_figures", "supported_kinds", "t95"]

def _finished(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[requests["status"].astype(str) == "finished"]


# A policy drawn at this many values of one numeric parameter in a panel is a sweep: its lines
# take one sequential scale of the policy's colour (light = low, dark = high), not dash styles.
SWEEP_MIN_LINES = 3


def _sweep_values(data: RunSet, frame: pd.DataFrame) -> dict[str, float]:
    """Series label -> its value of the one numeric router parameter that a policy sweeps
    in `frame` (SWEEP_MIN_LINES or more lines of that policy differing in that key alone)."""
    by_policy: dict[str, list[tuple[str, pd.DataFrame]]] = {}
    for label, runs in _grouped(data, frame):
        by_policy.setdefault(data.policy(runs.iloc[0]), []).append((label, runs))
    values: dict[str, float] = {}
    for series in by_policy.values():
        if len(series) < SWEEP_MIN_LINES:
            continue
        runs = frame[frame["run"].isin(pd.concat([r for _, r in series])["run"])]
        if any(policy_words(data.policy(row), data.configs[row["run"]])[1] for _, row in runs.iterrows()):
            continue  # named variants (llm-d oracle / deployed) are not points of a sweep
        keys = [k for k in data.varying(data.series_keys()) if k != "router.policy" and k in runs
                and as_text(runs[k]).nunique() > 1]  # fmt: skip
        if len(keys) != 1 or not pd.api.types.is_numeric_dtype(runs[keys[0]].dropna()):
            continue
        per_line = {label: pd.to_numeric(r[keys[0]], errors="coerce").dropna().unique() for label, r in series}
        if all(len(v) == 1 for v in per_line.values()):
            values.update({label: float(v[0]) for label, v in per_line.items()})
    return values


def _shades(color: str, n: int) -> list[str]:
    """`n` shades of `color` from light to dark: one sequential scale that still reads as
    the policy's colour."""
    from matplotlib.colors import LinearSegmentedColormap, to_hex, to_rgb

    rgb = np.array(to_rgb(color))
    scale = LinearSegmentedColormap.from_list("sweep", [rgb + (1 - rgb) * 0.6, rgb, rgb * 0.45])
    return [to_hex(scale(v)) for v in (np.linspace(0.0, 1.0, n) if n > 1 else [0.5])]


def _line_style(data: RunSet, frame: pd.DataFrame) -> dict[str, tuple[str, str, Any]]:
    """Series label -> (colour, marker, linestyle): the policy's colour and marker, and a
    distinct linestyle for each variant of one policy drawn in the same panels (`frame`:
    e.g. two lambdas, llm-d deployed and oracle), in label order so a variant's line does
    not depend on where the experiment lists it; one variant per panel (a per-trace tuned
    lambda) stays solid. A policy swept over one numeric parameter (_sweep_values) gets
    solid lines in shades of its colour, light to dark by the parameter's value."""
    styles: dict[str, tuple[str, str, Any]] = {}
    variants: dict[str, int] = {}
    sweep = _sweep_values(data, frame)
    swept: dict[str, list[str]] = {}
    for label, runs in _series(data, frame):
        policy = data.policy(runs.iloc[0])
        style = policy_style(policy)
        if label in sweep:
            swept.setdefault(policy, []).append(label)
            continue
        n = variants.get(policy, 0)
        variants[policy] = n + 1
        styles[label] = (style.color, style.marker, VARIANT_LINESTYLES[n % len(VARIANT_LINESTYLES)])
    for policy, labels in swept.items():
        labels = sorted(labels, key=lambda lb: sweep[lb])
        for label, shade in zip(labels, _shades(policy_style(policy).color, len(labels))):
            styles[label] = (shade, policy_style(policy).marker, "-")
    return styles


def _grouped(data: RunSet, frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    frame = frame.assign(_series=[data.series_label(r) for _, r in frame.iterrows()])
    return list(frame.groupby("_series", sort=True))


def _series(data: RunSet, frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(label, runs) per series, in the policy registry's order so legends line up; a
    policy's swept parameter (_sweep_values) in increasing order."""
    from lmsim.viz.style import POLICY_STYLES

    order = list(POLICY_STYLES)
    groups = _grouped(data, frame)
    sweep = _sweep_values(data, frame)

    def rank(item: tuple[str, pd.DataFrame]) -> tuple[int, float, str]:
        policy = data.policy(item[1].iloc[0])
        return (order.index(policy) if policy in order else len(order), sweep.get(item[0], 0.0), item[0])

    return sorted(groups, key=rank)


def _seed_counts(data: RunSet, frame: pd.DataFrame) -> dict[str, int]:
    """Series label -> how many seeds its points average (1 without a seed sweep)."""
    if not data.has_seeds():
        return {label: 1 for label, _ in _series(data, frame)}
    seeds = as_text(frame[SEED_KEY])
    return {label: int(seeds[runs.index].nunique()) for label, runs in _series(data, frame)}


def _legend_label(label: str, counts: dict[str, int]) -> str:
    """The series label, plus its number of seeds when the panel's series do not all
    average the same number (the study repeats llm-d as deployed and LMetric only)."""
    n = counts.get(label, 1)
    return f"{label}, {n} seeds" if n > 1 and len(set(counts.values())) > 1 else label


def _seed_samples(data: RunSet, runs: pd.DataFrame, metric: str) -> list[np.ndarray]:
    """One array per run (seed) of the finished requests' `metric`, in ms, NaNs dropped."""
    samples = []
    for run in runs["run"]:
        values = _finished(data.requests(run))[metric].to_numpy(dtype=float, na_value=np.nan) * 1000.0
        values = values[~np.isnan(values)]
        if len(values):
            samples.append(values)
    return samples


# -- kinds -------------------------------------------------------------------------------

_CDF_METRICS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))
_CDF_CENTRE = "mean of the seeds' CDFs"
# A CDF legend whose longest label has more characters goes beside the row: inside, it
# covered the panel's curves and its CDF tick labels (fig19's four lmetric indicator pairs).
CDF_LEGEND_INSIDE_CHARS = 40
_POINT_CENTRE = "mean of seeds (geometric on log axes)"


def _legend(ax: Any, counts: dict[str, int], centre: str, **kw: Any) -> None:
    """The panel's legend; when some series is over several seeds its title says what the
    line and the band are (bands.band_words: "min–max of 3 seeds", "95% CI, 5 seeds")."""
    band = band_words(list(counts.values()))
    title = f"{centre};\n{band}" if band else None
    ax.legend(fontsize=LEGEND_FONTSIZE, title=title, title_fontsize=LEGEND_FONTSIZE, **kw)


def _column_logs(panels: list[tuple[Any, int, str, np.ndarray]]) -> dict[int, bool]:
    """Column -> log scale, one scale type per column, so a metric is not linear in one row
    and logarithmic in the next (log where any row of the column spans decades)."""
    log: dict[int, bool] = {}
    for _, column, _, values in panels:
        log[column] = log.get(column, False) or wants_log(values)
    return log


def _latency_axes(panels: list[tuple[Any, int, str, np.ndarray]], axis: str, *, share: bool = False) -> None:
    """Scale each latency panel (axes, column, label, data in ms): ms or s by its own data,
    one scale type per column (_column_logs); with `share`, every panel of a column spans
    the column's whole data range in one unit, so rows compare at a glance."""
    log = _column_logs(panels)
    columns: dict[int, np.ndarray] = {}
    for _, column, _, values in panels:
        columns[column] = np.concatenate([columns.get(column, np.array([])), np.asarray(values, dtype=float)])
    for ax, column, label, values in panels:
        whole = columns[column]
        unit = latency_axis(ax, axis, values, log=log[column], unit_of=whole if share else None)
        if share:
            _span(ax, axis, whole, log[column])
        (ax.set_xlabel if axis == "x" else ax.set_ylabel)(f"{label} ({unit})")


def _span(ax: Any, axis: str, values: np.ndarray, log: bool) -> None:
    """Limits that just hold `values` (a 5% margin, in log space on a log axis; from zero
    on a linear one)."""
    values = values[np.isfinite(values) & ((values > 0) if log else (values >= 0))]
    if not len(values):
        return
    low, high = float(values.min()), float(values.max())
    if log:
        margin = (high / low) ** 0.03 if high > low else 1.5
        limits = (low / margin, high * margin)
    else:
        limits = (0.0, high * 1.03 if high > 0 else 1.0)
    (ax.set_xlim if axis == "x" else ax.set_ylim)(*limits)


def plot_cdf(data: RunSet, metrics: tuple[tuple[str, str], ...] = _CDF_METRICS) -> plt.Figure:
    """Seed Figure 22: one row per trace/cluster/load, TTFT and TPOT CDFs side by side, one
    line per policy (its fixed colour), in ms. Every non-router key that varies is a row,
    so no two lines share a label. A series over several seeds is the mean of the seeds'
    CDFs with a band on the CDF axis (bands.cdf_band), both drawn only where data is. The
    panels of a metric share one x range (and unit)."""
    facets = data.facets()
    longest = max(len(_legend_label(label, _seed_counts(data, frame))) for _, frame in facets
                  for label, _ in _series(data, frame))  # fmt: skip
    beside = longest > CDF_LEGEND_INSIDE_CHARS
    # a legend beside the rows gets its own width (about 0.075 in per character at 9 pt)
    width = 4.6 * len(metrics) + (0.075 * longest + 0.6 if beside else 0.0)
    fig, axes = plt.subplots(len(facets), len(metrics), figsize=(width, 3.1 * len(facets)), squeeze=False)
    panels = []
    for (title, frame), row_axes in zip(facets, axes):
        styles = _line_style(data, frame)
        counts = _seed_counts(data, frame)
        for column, (ax, (metric, name)) in enumerate(zip(row_axes, metrics)):
            plotted = []
            for label, runs in _series(data, frame):
                samples = _seed_samples(data, runs, metric)
                if not samples:
                    continue
                color, _, ls = styles[label]
                if len(samples) == 1:
                    x = np.sort(samples[0])
                    y = np.arange(1, len(x) + 1) / len(x)
                    ax.plot(x, y, color=color, ls=ls, lw=1.4, label=_legend_label(label, counts))
                else:
                    x, y, low, high = cdf_band(samples)
                    ax.plot(x, y, color=color, ls=ls, lw=1.4, label=_legend_label(label, counts))
                    ax.fill_between(x, low, high, color=color, alpha=0.2, lw=0)
                plotted.extend(samples)
            panels.append((ax, column, name, np.concatenate(plotted) if plotted else np.array([])))
            ax.set_ylabel("CDF")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            panel_title(ax, title)
        if beside:
            _legend(row_axes[-1], counts, _CDF_CENTRE, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
        else:
            _legend(row_axes[-1], counts, _CDF_CENTRE, loc="lower right")
    _latency_axes(panels, "x", share=True)
    fig.tight_layout()
    declutter_ticks(fig)
    return fig


_LATENCY_PANELS = (("ttft_s_mean", "mean TTFT"), ("ttft_s_p99", "P99 TTFT"),
                   ("tpot_s_mean", "mean TPOT"), ("tpot_s_p99", "P99 TPOT"))  # fmt: skip


def _interval_line(ax: Any, points: pd.DataFrame, style: tuple[str, str, Any], label: str, *, log: bool) -> np.ndarray:
    """One series against x (`points`: its runs' `_x` and `_y`): at each x the centre of its
    runs' values and, where x has several runs (seeds), their band, both computed where the
    axis is (bands.point_interval: geometric on a log axis, min–max under 5 seeds); returns
    every value drawn (centres and band ends), for the axis range."""
    rows = []
    for x, ys in points.dropna(subset=["_x"]).groupby("_x", sort=True)["_y"]:
        values = ys.to_numpy(dtype=float)
        rows.append((float(x), *point_interval(values, log=log), int(np.isfinite(values).sum())))
    if not rows:
        return np.array([])
    x, centre, low, high, count = (np.array(c) for c in zip(*rows))
    color, marker, ls = style
    ax.plot(x, centre, color=color, marker=marker, ls=ls, ms=4, lw=1.3, label=label)
    if (count > 1).any():
        ax.fill_between(x, low, high, color=color, alpha=0.2, lw=0)
    return np.concatenate([centre, low, high])


def _label_panel(ax: Any, x_label: str, y_label: str, title: str) -> None:
    ax.xaxis.set_major_formatter(FuncFormatter(_plain))
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    panel_title(ax, title, width=45)


def _lines_vs(data: RunSet, x_key: str, x_label: str, exclude: tuple[str, ...]) -> plt.Figure:
    """Seed Figure 23's layout: one row per trace, mean and P99 TTFT and TPOT against x;
    with seeds, their mean and band (_interval_line). Whether a column is log is decided
    from every run's value before drawing, so the bands are computed in the axis's space."""
    facets = data.facets(exclude=exclude)
    fig, axes = plt.subplots(len(facets), 4, figsize=(15, 3.0 * len(facets)), squeeze=False)
    cells = []  # (axes, column, name, [(label, points)])
    for (_, frame), row_axes in zip(facets, axes):
        for column, (ax, (metric, name)) in enumerate(zip(row_axes, _LATENCY_PANELS)):
            series = [(label, pd.DataFrame({"_x": lines[x_key].astype(float), "_y": lines[metric].astype(float) * 1000.0}))
                      for label, lines in _series(data, frame)]  # fmt: skip
            cells.append((ax, column, name, series))
    log = _column_logs([(ax, column, name, np.concatenate([p["_y"].to_numpy() for _, p in series]) if series else np.array([]))
                        for ax, column, name, series in cells])  # fmt: skip
    panels = []
    cell = iter(cells)
    for (title, frame), row_axes in zip(facets, axes):
        styles = _line_style(data, frame)
        counts = _seed_counts(data, frame)
        for ax, column, name, series in (next(cell) for _ in row_axes):
            plotted = []
            for label, points in series:
                if points["_x"].isna().all() and points["_y"].notna().any():
                    # A policy without the plotted parameter: its value as a reference line.
                    level = point_interval(points["_y"].to_numpy(), log=log[column])[0]
                    ax.axhline(level, color=styles[label][0], ls=":", lw=1.3, label=f"{label} (no {x_label})")
                    plotted.append(np.array([level]))
                    continue
                plotted.append(_interval_line(ax, points, styles[label], _legend_label(label, counts), log=log[column]))
            panels.append((ax, column, name, np.concatenate(plotted) if plotted else np.array([])))
            ax.xaxis.set_major_formatter(FuncFormatter(_plain))
            ax.set_xlabel(x_label)
            ax.grid(alpha=0.3)
            panel_title(ax, title, width=36)  # 4 panels and a legend in 15 in: 45 ran into the next title
        # Beside the row, not on it: lines fill every corner of these panels somewhere.
        _legend(row_axes[-1], counts, _POINT_CENTRE, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    _latency_axes(panels, "y")
    fig.tight_layout()
    declutter_ticks(fig)
    return fig


def _free(data: RunSet, key: str) -> bool:
    """True when `key` takes two or more values for some fixed setting of the other
    workload/cluster keys, i.e. it is an axis of its own and not, say, a per-trace rate
    zipped with the trace name."""
    others = [o for o in data.varying(data.keys)
              if o != key and not o.startswith("router.") and o not in RATE_KEYS and o != SEED_KEY]  # fmt: skip
    if key not in data.index:
        return False
    if not others:
        return as_text(data.index[key]).nunique() > 1
    return bool((data.index.groupby(others, dropna=False)[key].agg(lambda c: as_text(c).nunique()) > 1).any())


_RATE_LABELS = {"workload.load": "load (fraction of capacity)", "workload.rate": "arrival rate (req/s)",
                "workload.time_scale": "time scale", "workload.generator.params.rate": "arrival rate (req/s)"}  # fmt: skip


def rate_key(data: RunSet) -> str:
    swept = [k for k in RATE_KEYS if k in data.keys and _free(data, k)]
    if not swept:
        raise PlotError(
            f"{data.root}: a rate plot needs a sweep over the arrival rate "
            f"({', '.join(RATE_KEYS)}) with at least two values"
        )
    return swept[0]


def plot_rate(data: RunSet) -> plt.Figure:
    """Seed Figures 23 and 26: mean and P99 TTFT/TPOT vs the arrival rate or load."""
    key = rate_key(data)
    return _lines_vs(data, key, _RATE_LABELS[key], (key,))


def param_key(data: RunSet, param: str | None = None) -> str:
    if param is not None:
        if param not in data.keys or not data.varying([param]):
            raise PlotError(f"{data.root}: --param {param!r} is not a swept key with two or more values")
        return param
    # Policy parameters first: they are what Figures 11 and 12 tune.
    candidates = sorted(data.varying(data.keys), key=lambda k: not k.startswith("router."))
    for k in candidates:
        if k in ("router.policy", SEED_KEY) or k in RATE_KEYS:
            continue
        values = data.index[k].dropna()
        if pd.api.types.is_numeric_dtype(values) and values.nunique() > 1 and _free(data, k):
            return k
    raise PlotError(f"{data.root}: a parameter plot needs a numeric swept key (other than the rate) "
                    "with at least two values")  # fmt: skip


def plot_param(data: RunSet, param: str | None = None) -> plt.Figure:
    """Seed Figures 11 and 12: latency vs one swept hyperparameter, one row per workload."""
    key = param_key(data, param)
    saved = data.keys
    # The plotted key is the x axis, not a series: label lines by the other router keys.
    data.keys = [k for k in saved if k != key]
    try:
        return _lines_vs(data, key, short_key(key), (key,))
    finally:
        data.keys = saved


def _prediction_runs(data: RunSet) -> list[str]:
    runs = []
    for run in sorted(data.index["run"]):
        req = data.requests(run)
        if "predicted_ttft_s" in req and req["predicted_ttft_s"].notna().any():
            runs.append(run)
    return runs


ERROR_FLOOR = 1e-4


def plot_error(data: RunSet) -> plt.Figure:
    """Seed Figure 16: CDF of |predicted − simulated| / simulated TTFT per run."""
    runs = _prediction_runs(data)
    if not runs:
        raise PlotError(f"{data.root}: no run logged predicted TTFTs (predicted_ttft_s); "
                        "the error plot needs the llmd policy")  # fmt: skip
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    rows = data.index.set_index("run", drop=False)
    facets = data.facet_keys()
    plotted = []
    for i, run in enumerate(runs):
        req = _finished(data.requests(run))
        req = req[req["predicted_ttft_s"].notna() & (req["ttft_s"] > 0)]
        err = np.sort((np.abs(req["predicted_ttft_s"] - req["ttft_s"]) / req["ttft_s"]).to_numpy(dtype=float, na_value=np.nan))
        # Exact predictions differ by float rounding (1e-16); drawn at the floor, they do not
        # stretch the axis over twelve empty decades.
        err = np.maximum(err, ERROR_FLOOR)
        row = rows.loc[run]
        label = data.series_label(row)
        if data.has_seeds():  # one line per run: say which draw
            label += f", seed {data.configs[run].get(SEED_KEY, 0)}"
        if facets:
            label += " · " + data.title(data.index[data.index["run"] == run])
        style = policy_style(data.policy(row))
        if len(err):
            ax.plot(err, np.arange(1, len(err) + 1) / len(err), color=style.color,
                    ls=VARIANT_LINESTYLES[i % len(VARIANT_LINESTYLES)], label=label)  # fmt: skip
            plotted.append(err)
    set_scale(ax, "x", np.concatenate(plotted) if plotted else np.array([]))
    ax.set_xlabel(f"|predicted − simulated| / simulated TTFT (below {ERROR_FLOOR:g} drawn at {ERROR_FLOOR:g})")
    ax.set_ylabel("CDF")
    ax.axvline(0.2, color="grey", lw=0.8, ls="--")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_FONTSIZE)
    fig.tight_layout()
    declutter_ticks(fig)
    return fig


def _hotspot_runs(data: RunSet) -> list[str]:
    runs = []
    for _, row in data.index.iterrows():
        ev = data.events(row["run"])
        kinds = set(ev["kind"]) if "kind" in ev else set()
        if data.policy(row) == "lmetric_hotspot" or kinds & {"hotspot_alarm", "hotspot_clear", "hotspot_window"}:
            runs.append(row["run"])
    return sorted(runs)


def _alarm_windows(events: pd.DataFrame, end_s: float, class_id: Any = None) -> list[tuple[float, float]]:
    """(start, end) of each period with at least one class alarmed (or `class_id` alarmed)."""
    if "kind" not in events:
        return []
    ev = events[events["kind"].isin(["hotspot_alarm", "hotspot_clear"])].sort_values("time_s", kind="stable")
    if class_id is not None:
        ev = ev[ev["class_id"] == class_id]
    active: set[Any] = set()
    windows, start = [], None
    for _, e in ev.iterrows():
        if e["kind"] == "hotspot_alarm":
            if not active:
                start = float(e["time_s"])
            active.add(e["class_id"])
        else:
            active.discard(e["class_id"])
            if not active and start is not None:
                windows.append((start, float(e["time_s"])))
                start = None
    if start is not None:
        windows.append((start, end_s))
    return windows


def alarming_class(events: pd.DataFrame) -> Any:
    """The detector class that alarmed most often (ties: the earliest); None without alarms."""
    if "kind" not in events:
        return None
    alarms = events[events["kind"] == "hotspot_alarm"]
    if not len(alarms):
        return None
    counts = alarms.groupby("class_id", sort=False)["time_s"].agg(["count", "min"])
    return counts.sort_values(["count", "min"], ascending=[False, True]).index[0]


def plot_hotspot(data: RunSet) -> plt.Figure:
    """Seed Figure 21. (a) for the class that raised the alarm: its popularity x/x̄ and its
    cache coverage |M|/|M̄| per detector window (`hotspot_window` events), alarm windows
    shaded; (b, c) per-minute mean TTFT and TPOT (ms) by arrival minute, per policy."""
    runs = _hotspot_runs(data)
    if not runs:
        raise PlotError(f"{data.root}: no run used lmetric_hotspot or logged hotspot events")
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    detector = runs[0]
    # Only the runs that replay the detector run's workload on its cluster at its load.
    facet_keys = data.facet_keys()
    same = data.index
    for k in facet_keys:
        value = data.index.loc[data.index["run"] == detector, k].iloc[0]
        same = same[as_text(same[k]) == as_text(pd.Series([value])).iloc[0]]
    req = data.requests(detector)
    end_s = float(np.nanmax(req["arrived_at"])) if len(req) else 0.0
    ev = data.events(detector)
    cls = alarming_class(ev)
    ax = axes[0]
    windows: list[tuple[float, float]] = []
    if cls is not None:
        pts = ev[(ev["kind"] == "hotspot_window") & (ev["class_id"] == cls)]
        if not len(pts):  # an older run without per-window logs: the alarm onsets
            pts = ev[(ev["kind"] == "hotspot_alarm") & (ev["class_id"] == cls)]
        pts = pts[pts["x"].notna() & pts["m"].notna()].sort_values("time_s")
        t = pts["time_s"].astype(float) / 60.0
        x, m, n = (pts[c].astype(float) for c in ("x", "m", "num_instances"))
        # Black and grey: these are the class's ratios, not policies (whose colours are fixed).
        ax.plot(t, x / (1 - x), marker="^", color="black", label="class popularity x/x̄")
        ax.plot(t, m / (n - m), marker="s", color="grey", ls="--", label="cache coverage |M|/|M̄|")
        windows = _alarm_windows(ev, end_s, cls)
        for i, (start, _) in enumerate(windows):  # a short alarm is a sliver of shade: mark its onset
            ax.axvline(start / 60.0, color="darkorange", lw=1.2, label="alarm raised" if i == 0 else None)
        set_scale(ax, "y", np.concatenate([(x / (1 - x)).to_numpy(), (m / (n - m)).to_numpy()]))
        ax.set_title("(a) the class that raised the alarm (shaded: alarm on)", fontsize=9)
        ax.legend(fontsize=LEGEND_FONTSIZE)
    else:
        ax.text(0.02, 0.5, "the detector raised no alarm", transform=ax.transAxes, fontsize=9)
        ax.set_title("(a) hotspot ratios of the alarming class", fontsize=9)
    for a in axes:
        for s, e in windows:
            a.axvspan(s / 60.0, e / 60.0, color="orange", alpha=0.25, lw=0)
    ax.set_ylabel("ratio")
    ax.grid(alpha=0.3)
    styles = _line_style(data, same)
    panels = ((axes[1], "ttft_s", "mean TTFT", "(b)"), (axes[2], "tpot_s", "mean TPOT", "(c)"))
    for a, metric, name, tag in panels:
        plotted = []
        for label, runs_of in _series(data, same):
            for run in runs_of["run"]:
                done = _finished(data.requests(run))
                per_min = done.groupby(np.floor(done["arrived_at"] / 60.0))[metric].mean() * 1000.0
                color, marker, ls = styles[label]
                a.plot(per_min.index + 0.5, per_min.to_numpy(), color=color, marker=marker, ls=ls, ms=3, label=label)
                plotted.append(per_min.to_numpy())
        a.set_ylabel(f"{name} ({latency_axis(a, 'y', np.concatenate(plotted) if plotted else np.array([]))})")
        a.set_title(f"{tag} {name} per arrival minute", fontsize=9)
        a.grid(alpha=0.3)
        a.legend(fontsize=LEGEND_FONTSIZE)
    axes[2].set_xlabel("minute of the run")
    fig.suptitle(data.title(same), fontsize=10)
    fig.tight_layout()
    declutter_ticks(fig)
    return fig


def tier_key(data: RunSet) -> str:
    """The swept tier capacity (the first, if several are)."""
    swept = [k for k in data.keys if "kv_tiers" in k and ".capacity_" in k and _free(data, k)]
    if not swept:
        raise PlotError(
            f"{data.root}: a tiers plot needs a sweep over a KV tier capacity "
            "(cluster.kv_tiers.host.capacity_gb or capacity_blocks) with at least two values"
        )
    return swept[0]


_TIER_PANELS = (
    ("gpu", "GPU hit ratio, 1st admission"), ("lower", "host + disk hit ratio, 1st admission"),
    ("ttft_s_mean", "mean TTFT (ms)"), ("ttft_s_p99", "P99 TTFT (ms)"),
)  # fmt: skip


def plot_tiers(data: RunSet) -> plt.Figure:
    """Hit ratios by tier and TTFT against the swept tier capacity, one row per workload,
    one line per policy (over seeds, their mean and band: _interval_line). A run without tiers (capacity 0)
    found nothing below the GPU: its lower-tier ratio is 0."""
    key = tier_key(data)
    tier = "disk" if ".disk." in key else "host"
    unit = "GB" if key.endswith("capacity_gb") else "blocks"
    x_label = f"{tier} tier per instance ({unit})"
    facets = data.facets(exclude=(key,))
    fig, axes = plt.subplots(len(facets), len(_TIER_PANELS), figsize=(15, 3.0 * len(facets)), squeeze=False)
    for (title, frame), row_axes in zip(facets, axes):
        styles = _line_style(data, frame)

        def column(name: str, frame: pd.DataFrame = frame) -> pd.Series:
            if name not in frame:
                return pd.Series(0.0, index=frame.index)
            return pd.to_numeric(frame[name], errors="coerce").astype(float)

        values = {
            "gpu": column("prefix_hit_ratio_first_admission"),
            "lower": column("prefix_hit_ratio_first_admission_host").fillna(0.0)
            + column("prefix_hit_ratio_first_admission_disk").fillna(0.0),
            "ttft_s_mean": column("ttft_s_mean") * 1000.0,
            "ttft_s_p99": column("ttft_s_p99") * 1000.0,
        }
        for ax, (metric, name) in zip(row_axes, _TIER_PANELS):
            series = [(label, pd.DataFrame({"_x": column(key, lines).fillna(0.0), "_y": values[metric].loc[lines.index]}))
                      for label, lines in _series(data, frame)]  # fmt: skip
            log = metric.startswith("ttft") and wants_log(np.concatenate([p["_y"].to_numpy() for _, p in series]))
            plotted = [_interval_line(ax, points, styles[label], label, log=log) for label, points in series]
            set_scale(ax, "y", np.concatenate(plotted) if plotted else np.array([]), log=log)
            _label_panel(ax, x_label, name, title)
        _legend(row_axes[-1], _seed_counts(data, frame), _POINT_CENTRE,
                loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # fmt: skip
    fig.tight_layout()
    declutter_ticks(fig)
    return fig


def _plot_fleet(data: RunSet) -> plt.Figure:
    from lmsim.viz.fleet import plot_fleet

    return plot_fleet(data)


def _fleet_runs(data: RunSet) -> list[str]:
    from lmsim.viz.fleet import fleet_runs

    return fleet_runs(data)


PLOTTERS: dict[str, Callable[..., plt.Figure]] = {
    "cdf": plot_cdf, "rate": plot_rate, "param": plot_param, "error": plot_error, "hotspot": plot_hotspot,
    "tiers": plot_tiers, "fleet": _plot_fleet,
}  # fmt: skip



def supported_kinds(data: RunSet) -> list[str]:
    """The kinds these results can support, checked without drawing."""
    kinds = ["cdf"]
    checks: dict[str, Callable[[], Any]] = {
        "rate": lambda: rate_key(data),
        "param": lambda: param_key(data),
        "error": lambda: _prediction_runs(data),
        "hotspot": lambda: _hotspot_runs(data),
        "tiers": lambda: tier_key(data),
        "fleet": lambda: _fleet_runs(data),
    }
    for kind, check in checks.items():
        try:
            if check():
                kinds.append(kind)
        except PlotError:
            continue
    return kinds


def make_figures(
    root: str | os.PathLike[str] | list[str | os.PathLike[str]],
    kinds: list[str] | None = None,
    *,
    formats: tuple[str, ...] = FORMATS,
    out: str | os.PathLike[str] | None = None,
    param: str | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """Draw the requested kinds (default: every kind the results support) of any set of
    run and sweep directories into `out` (default: DIR/figures/ for one directory) as
    `<kind>.<format>`; returns the written paths. A file there that lmsim did not draw is
    replaced only with `overwrite`."""
    data = RunSet(root)
    for f in formats:
        if f not in FORMATS:
            raise PlotError(f"unknown figure format {f!r} (one of {', '.join(FORMATS)})")
    for k in kinds or []:
        if k not in KINDS:
            raise PlotError(f"unknown plot kind {k!r} (one of {', '.join(KINDS)})")
    if out is None and len(data.roots) > 1:
        raise PlotError("several directories given: name the figure directory with --out")
    wanted = list(kinds) if kinds else supported_kinds(data)
    out_dir = Path(out) if out else data.root / FIGURES_DIR
    for kind in wanted:  # refuse before drawing: nothing is written unless all may be
        for f in formats:
            check_output_file(out_dir / f"{kind}.{f}", overwrite=overwrite, ours=is_signed_figure)
    figures = []
    for kind in wanted:  # draw everything first: an unsupported kind writes nothing
        fig = plot_param(data, param) if kind == "param" else PLOTTERS[kind](data)
        figures.append((kind, fig))
    if out is not None:
        _check_figure_dir(out_dir, [f"{kind}.{f}" for kind, _ in figures for f in formats])
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, fig in figures:
        for f in formats:
            path = out_dir / f"{kind}.{f}"
            save_figure(fig, path, dpi=150, bbox_inches="tight")  # keeps legends placed outside
            written.append(path)
        plt.close(fig)
    return written


def _check_figure_dir(out_dir: Path, names: list[str]) -> None:
    """Figures replace only files lmsim wrote: a same-named file in a directory lmsim did
    not create (no marker) is the user's, and the command stops before writing anything."""
    if out_dir.is_dir() and not (out_dir / FIGURE_DIR_MARKER).exists():
        clashes = [n for n in names if (out_dir / n).exists()]
        if clashes:
            raise PlotError(f"{out_dir}: {clashes[0]} exists and was not written by lmsim; choose another --out")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / FIGURE_DIR_MARKER).touch()
