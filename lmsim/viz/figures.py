"""`lmsim plot`: the paper's figure kinds, drawn from saved results only (a sweep directory
with `sweep.parquet`, or a single run directory); nothing here runs a simulation.

Kinds (seed figure in brackets):
  cdf      TTFT and TPOT CDFs per policy, one row of panels per workload/cluster [22]
  rate     mean and P99 TTFT/TPOT vs arrival rate, one line per policy [23, 26]
  param    mean and P99 TTFT/TPOT vs one swept hyperparameter [11, 12]
  error    CDF of the relative error of the predicted TTFT (runs that logged predictions) [16]
  hotspot  per-minute class popularity x/x̄ vs cache coverage |M|/|M̄| with the alarm windows,
           and TTFT/TPOT over time per policy [21]

Swept keys are split into series (router.*: one line each, labelled by policy and the swept
router params), the x axis (a rate key, or the plotted hyperparameter) and facets (every
other swept key: one row of panels per combination).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from lmsim.errors import LmsimError
from lmsim.outputs import check_output_file, is_signed_figure, save_figure
from lmsim.study.expand import format_value
from lmsim.study.index import INDEX_FILE, RATE_KEYS, read_index
from lmsim.study.rundir import COMPLETE_MARKER, is_complete

KINDS = ("cdf", "rate", "param", "error", "hotspot")
FORMATS = ("png", "svg", "pdf")
FIGURES_DIR = "figures"


class PlotError(LmsimError):
    """The results cannot support the requested figure."""


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


class SweepData:
    """Read-only access to a sweep (or single run) directory, with per-run caches."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if (self.root / INDEX_FILE).exists():
            self.index = read_index(self.root)
            self.keys: list[str] = list(self.index.attrs.get("sweep_keys", []))
        elif is_complete(self.root):
            summary = json.loads((self.root / COMPLETE_MARKER).read_text())
            row = {"run": "."}
            row.update({k: v for k, v in summary.items() if v is None or isinstance(v, (int, float, str))})
            self.index = pd.DataFrame([row])
            self.keys = []
        else:
            raise PlotError(f"{self.root}: neither a sweep directory (sweep.parquet) nor a complete run")
        if not len(self.index):
            raise PlotError(f"{self.root}: the sweep has no complete runs")
        self._requests: dict[str, pd.DataFrame] = {}
        self._events: dict[str, pd.DataFrame] = {}

    def run_dir(self, run: str) -> Path:
        return self.root if run == "." else self.root / run

    def requests(self, run: str) -> pd.DataFrame:
        if run not in self._requests:
            self._requests[run] = pq.read_table(self.run_dir(run) / "requests.parquet").to_pandas()
        return self._requests[run]

    def events(self, run: str) -> pd.DataFrame:
        if run not in self._events:
            path = self.run_dir(run) / "router_events.parquet"
            self._events[run] = pq.read_table(path).to_pandas() if path.exists() else pd.DataFrame()
        return self._events[run]

    # -- labels ---------------------------------------------------------------------------

    def varying(self, keys: list[str]) -> list[str]:
        return [k for k in keys if k in self.index and self.index[k].astype(str).nunique() > 1]

    def series_keys(self) -> list[str]:
        return [k for k in self.keys if k.startswith("router.")]

    def facet_keys(self, exclude: tuple[str, ...] = ()) -> list[str]:
        return self.varying([k for k in self.keys if not k.startswith("router.") and k not in exclude])

    def series_label(self, row: pd.Series) -> str:
        label = str(row.get("policy", "run"))
        for k in self.series_keys():
            if k != "router.policy" and k in row and pd.notna(row[k]):
                label += f" {_short(k)}={_fmt(row[k])}"
        return label

    def facets(self, exclude: tuple[str, ...] = ()) -> list[tuple[str, pd.DataFrame]]:
        keys = self.facet_keys(exclude)
        if not keys:
            return [("", self.index)]
        groups = []
        for values, frame in self.index.groupby(keys, sort=True, dropna=False):
            values = values if isinstance(values, tuple) else (values,)
            groups.append((" · ".join(_fmt(v) for v in values), frame))
        return groups


def _fmt(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return format_value(value)


def _finished(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[requests["status"].astype(str) == "finished"]


def _cdf(ax: Any, values: np.ndarray, label: str) -> None:
    values = np.sort(values[~np.isnan(values)])
    if len(values):
        ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=label)


# -- kinds -------------------------------------------------------------------------------


def plot_cdf(data: SweepData) -> plt.Figure:
    """Seed Figure 22: TTFT and TPOT CDFs, one line per policy, one row per workload."""
    facets = data.facets(exclude=RATE_KEYS) if len(data.varying(list(RATE_KEYS))) <= 1 else data.facets()
    fig, axes = plt.subplots(len(facets), 2, figsize=(10, 3.2 * len(facets)), squeeze=False)
    for (title, frame), row_axes in zip(facets, axes):
        for _, row in frame.sort_values("run").iterrows():
            done = _finished(data.requests(row["run"]))
            label = data.series_label(row)
            for ax, metric in zip(row_axes, ("ttft_s", "tpot_s")):
                _cdf(ax, done[metric].to_numpy(dtype=float), label)
        for ax, name in zip(row_axes, ("TTFT (s)", "TPOT (s)")):
            ax.set_xscale("log")
            ax.set_xlabel(name)
            ax.set_ylabel("CDF")
            ax.grid(alpha=0.3)
            if title:
                ax.set_title(title, fontsize=9)
        row_axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


_LATENCY_PANELS = (("ttft_s_mean", "mean TTFT (s)"), ("ttft_s_p99", "P99 TTFT (s)"),
                   ("tpot_s_mean", "mean TPOT (s)"), ("tpot_s_p99", "P99 TPOT (s)"))  # fmt: skip


def _lines_vs(data: SweepData, x_key: str, x_label: str, exclude: tuple[str, ...]) -> plt.Figure:
    facets = data.facets(exclude=exclude)
    fig, axes = plt.subplots(len(facets), 4, figsize=(15, 3.0 * len(facets)), squeeze=False)
    for (title, frame), row_axes in zip(facets, axes):
        frame = frame.assign(_series=[data.series_label(r) for _, r in frame.iterrows()])
        for label, lines in frame.groupby("_series", sort=True):
            lines = lines.sort_values(x_key)
            for ax, (metric, _) in zip(row_axes, _LATENCY_PANELS):
                ax.plot(lines[x_key].astype(float), lines[metric].astype(float), marker="o", ms=3, label=label)
        for ax, (_, name) in zip(row_axes, _LATENCY_PANELS):
            ax.set_xlabel(x_label)
            ax.set_ylabel(name)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
            if title:
                ax.set_title(title, fontsize=9)
        row_axes[-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _free(data: SweepData, key: str) -> bool:
    """True when `key` takes two or more values for some fixed setting of the other swept
    workload/cluster keys, i.e. it is an axis of its own and not, say, a per-trace rate
    zipped with the trace name."""
    others = [o for o in data.varying(data.keys) if o != key and not o.startswith("router.") and o not in RATE_KEYS]
    if key not in data.index:
        return False
    if not others:
        return data.index[key].astype(str).nunique() > 1
    return bool((data.index.groupby(others, dropna=False)[key].agg(lambda c: c.astype(str).nunique()) > 1).any())


def rate_key(data: SweepData) -> str:
    swept = [k for k in RATE_KEYS if k in data.keys and _free(data, k)]
    if not swept:
        raise PlotError(
            f"{data.root}: a rate plot needs a sweep over the arrival rate "
            f"({', '.join(RATE_KEYS)}) with at least two values"
        )
    return swept[0]


def plot_rate(data: SweepData) -> plt.Figure:
    """Seed Figures 23 and 26: mean and P99 TTFT/TPOT vs the arrival rate. The x axis is
    the swept rate key (a fraction of capacity for workload.load / time_scale)."""
    key = rate_key(data)
    return _lines_vs(data, key, _short(key) if key != "workload.rate" else "arrival rate (req/s)", (key,))


def param_key(data: SweepData, param: str | None = None) -> str:
    if param is not None:
        if param not in data.keys or not data.varying([param]):
            raise PlotError(f"{data.root}: --param {param!r} is not a swept key with two or more values")
        return param
    # Policy parameters first: they are what Figures 11 and 12 tune.
    candidates = sorted(data.varying(data.keys), key=lambda k: not k.startswith("router."))
    for k in candidates:
        if k == "router.policy" or k in RATE_KEYS:
            continue
        values = data.index[k].dropna()
        if pd.api.types.is_numeric_dtype(values) and values.nunique() > 1 and _free(data, k):
            return k
    raise PlotError(f"{data.root}: a parameter plot needs a numeric swept key (other than the rate) "
                    "with at least two values")  # fmt: skip


def plot_param(data: SweepData, param: str | None = None) -> plt.Figure:
    """Seed Figures 11 and 12: latency vs one swept hyperparameter, one row per workload."""
    key = param_key(data, param)
    saved = data.keys
    # The plotted key is the x axis, not a series: label lines by the other router keys.
    data.keys = [k for k in saved if k != key]
    try:
        return _lines_vs(data, key, _short(key), (key,))
    finally:
        data.keys = saved


def _prediction_runs(data: SweepData) -> list[str]:
    runs = []
    for run in sorted(data.index["run"]):
        req = data.requests(run)
        if "predicted_ttft_s" in req and req["predicted_ttft_s"].notna().any():
            runs.append(run)
    return runs


def plot_error(data: SweepData) -> plt.Figure:
    """Seed Figure 16: CDF of |predicted − simulated| / simulated TTFT per run."""
    runs = _prediction_runs(data)
    if not runs:
        raise PlotError(f"{data.root}: no run logged predicted TTFTs (predicted_ttft_s); "
                        "the error plot needs the llmd policy")  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 3.6))
    rows = data.index.set_index("run")
    facet_keys = data.facet_keys()
    for run in runs:
        req = _finished(data.requests(run))
        req = req[req["predicted_ttft_s"].notna() & (req["ttft_s"] > 0)]
        err = (np.abs(req["predicted_ttft_s"] - req["ttft_s"]) / req["ttft_s"]).to_numpy(dtype=float)
        row = rows.loc[run]
        label = data.series_label(row)
        if facet_keys:
            label += " · " + " · ".join(_fmt(row[k]) for k in facet_keys)
        _cdf(ax, err, label)
    ax.set_xscale("log")
    ax.set_xlabel("|predicted − simulated| / simulated TTFT")
    ax.set_ylabel("CDF")
    ax.axvline(0.2, color="grey", lw=0.8, ls="--")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _hotspot_runs(data: SweepData) -> list[str]:
    runs = []
    for _, row in data.index.iterrows():
        ev = data.events(row["run"])
        kinds = set(ev["kind"]) if "kind" in ev else set()
        if row.get("policy") == "lmetric_hotspot" or kinds & {"hotspot_alarm", "hotspot_clear", "hotspot_window"}:
            runs.append(row["run"])
    return sorted(runs)


def _alarm_windows(events: pd.DataFrame, end_s: float) -> list[tuple[float, float]]:
    """(start, end) of each period with at least one class alarmed."""
    if "kind" not in events:
        return []
    ev = events[events["kind"].isin(["hotspot_alarm", "hotspot_clear"])].sort_values("time_s", kind="stable")
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


def plot_hotspot(data: SweepData) -> plt.Figure:
    """Seed Figure 21. (a) per minute: x/x̄ of each trace class (class_id >= 0, from the
    arrivals) and, where the detector logged them, x/x̄ and |M|/|M̄| of the alarming class
    (`hotspot_window` events per window if present, else the values at each alarm onset and
    clear); alarm windows shaded. (b, c) per-minute mean TTFT and TPOT by arrival minute."""
    runs = _hotspot_runs(data)
    if not runs:
        raise PlotError(f"{data.root}: no run used lmetric_hotspot or logged hotspot events")
    fig, axes = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True)
    detector = runs[0]
    req = data.requests(detector)
    end_s = float(np.nanmax(req["arrived_at"])) if len(req) else 0.0
    ax = axes[0]
    minute = np.floor(req["arrived_at"].to_numpy(dtype=float) / 60.0)
    valid = ~np.isnan(minute)
    classes = req["class_id"].to_numpy(dtype=float, na_value=np.nan)
    counts = pd.Series(minute[valid]).value_counts().sort_index()
    for cls in sorted({int(c) for c in classes[valid] if pd.notna(c) and c >= 0}):
        share = pd.Series(minute[valid & (classes == cls)]).value_counts().reindex(counts.index, fill_value=0) / counts
        ratio = share / (1 - share).replace(0, np.nan)
        ax.plot(counts.index + 0.5, ratio, marker="o", ms=3, label=f"x/x̄ trace class {cls}")
    ev = data.events(detector)
    kinds = set(ev["kind"]) if "kind" in ev else set()
    source = "hotspot_window" if "hotspot_window" in kinds else "hotspot_alarm"
    pts = ev[ev["kind"] == source] if "kind" in ev else ev
    pts = pts[pts["x"].notna() & pts["m"].notna()] if len(pts) else pts
    if len(pts):
        t = pts["time_s"].astype(float) / 60.0
        x = pts["x"].astype(float)
        m = pts["m"].astype(float)
        n = pts["num_instances"].astype(float)
        ax.scatter(t, x / (1 - x), marker="^", color="C3", label=f"x/x̄ detector ({source})", zorder=3)
        ax.scatter(t, m / (n - m), marker="s", color="C2", label=f"|M|/|M̄| detector ({source})", zorder=3)
    else:
        ax.text(0.01, 0.9, "no hotspot alarm raised", transform=ax.transAxes, fontsize=8)
    windows = _alarm_windows(ev, end_s)
    for a in axes:
        for s, e in windows:
            a.axvspan(s / 60.0, e / 60.0, color="orange", alpha=0.2, lw=0)
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_ylabel("ratio")
    ax.set_title(f"(a) hotspot ratios, detector run {detector}", fontsize=9)
    ax.legend(fontsize=7)
    for a, metric, name in ((axes[1], "ttft_s", "(b) mean TTFT (s)"), (axes[2], "tpot_s", "(c) mean TPOT (s)")):
        for _, row in data.index.sort_values("run").iterrows():
            done = _finished(data.requests(row["run"]))
            per_min = done.groupby(np.floor(done["arrived_at"] / 60.0))[metric].mean()
            a.plot(per_min.index + 0.5, per_min.to_numpy(), marker="o", ms=3, label=data.series_label(row))
        a.set_ylabel(name)
        a.set_yscale("log")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    axes[2].set_xlabel("minute")
    fig.tight_layout()
    return fig


PLOTTERS: dict[str, Callable[..., plt.Figure]] = {
    "cdf": plot_cdf, "rate": plot_rate, "param": plot_param, "error": plot_error, "hotspot": plot_hotspot,
}  # fmt: skip


def supported_kinds(data: SweepData) -> list[str]:
    """The kinds these results can support, checked without drawing."""
    kinds = ["cdf"]
    checks: dict[str, Callable[[], Any]] = {
        "rate": lambda: rate_key(data),
        "param": lambda: param_key(data),
        "error": lambda: _prediction_runs(data),
        "hotspot": lambda: _hotspot_runs(data),
    }
    for kind, check in checks.items():
        try:
            if check():
                kinds.append(kind)
        except PlotError:
            continue
    return kinds


def make_figures(
    root: str | os.PathLike[str],
    kinds: list[str] | None = None,
    *,
    formats: tuple[str, ...] = ("png",),
    out: str | os.PathLike[str] | None = None,
    param: str | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """Draw the requested kinds (default: every kind the results support) into
    `out` (default DIR/figures/) as `<kind>.<format>`; returns the written paths. A file
    there that lmsim did not draw is replaced only with `overwrite`."""
    data = SweepData(root)
    for f in formats:
        if f not in FORMATS:
            raise PlotError(f"unknown figure format {f!r} (one of {', '.join(FORMATS)})")
    for k in kinds or []:
        if k not in KINDS:
            raise PlotError(f"unknown plot kind {k!r} (one of {', '.join(KINDS)})")
    wanted = list(kinds) if kinds else supported_kinds(data)
    out_dir = Path(out) if out else data.root / FIGURES_DIR
    for kind in wanted:  # refuse before drawing: nothing is written unless all may be
        for f in formats:
            check_output_file(out_dir / f"{kind}.{f}", overwrite=overwrite, ours=is_signed_figure)
    figures = []
    for kind in wanted:  # draw everything first: an unsupported kind writes nothing
        fig = plot_param(data, param) if kind == "param" else PLOTTERS[kind](data)
        figures.append((kind, fig))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, fig in figures:
        for f in formats:
            path = out_dir / f"{kind}.{f}"
            save_figure(fig, path, dpi=110)
            written.append(path)
        plt.close(fig)
    return written
