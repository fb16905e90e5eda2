"""Axis conventions shared by every figure: log scale only across decades, plain ticks,
latencies in ms or, past a few seconds, in s; legends readable."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

# A panel gets a log axis only when its data spans at least this ratio (1.5 decades);
# narrower ranges read better, and without "8.3×10⁰" ticks, on a linear axis.
LOG_SPAN = 30.0
# A latency axis whose data reaches this many ms is labelled in seconds: ticks of
# "140k ms" or "2000k ms" read worse than "140 s" and "2000 s", and below 5 s the ms
# ticks never reach the "k" abbreviation (plain_number writes 10k and up).
SECONDS_FROM_MS = 5000.0
LEGEND_FONTSIZE = 9


def plain_number(value: float, _pos: Any = None) -> str:
    """Ticks as plain numbers: 0.5, 20, 500, 10k (never 8.3×10⁰)."""
    if abs(value) >= 10000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _positive(values: Any) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[np.isfinite(values) & (values > 0)]


def wants_log(values: Any) -> bool:
    """True when the positive data spans LOG_SPAN or more."""
    values = _positive(values)
    return bool(len(values) and values.max() / values.min() >= LOG_SPAN)


def set_scale(ax: Any, axis: str, values: Any, *, log: bool | None = None, per_tick_unit: float = 1.0) -> None:
    """Log scale only where the positive data spans decades (or as `log` says, so panels
    of one column share a scale type); ticks as plain numbers of data / `per_tick_unit`."""
    values = _positive(values)
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    target = ax.xaxis if axis == "x" else ax.yaxis
    formatter = FuncFormatter(lambda v, pos: plain_number(v / per_tick_unit, pos))
    if wants_log(values) if log is None else (log and len(values)):
        setter("log")
        decades = np.log10(values.max() / values.min())
        target.set_major_locator(LogLocator(base=10, subs=(1.0,) if decades > 2.5 else (1.0, 2.0, 5.0)))
        target.set_major_formatter(formatter)
        target.set_minor_formatter(NullFormatter())
    else:
        setter("linear")
        target.set_major_formatter(formatter)


def latency_unit(values_ms: Any) -> tuple[str, float]:
    """("ms", 1) or, when the data reaches SECONDS_FROM_MS, ("s", 1000): the unit of a
    latency axis drawn from values in ms, and the ms per unit."""
    values = np.asarray(values_ms, dtype=float)
    values = values[np.isfinite(values)]
    return ("s", 1000.0) if len(values) and values.max() >= SECONDS_FROM_MS else ("ms", 1.0)


def latency_axis(ax: Any, axis: str, values_ms: Any, *, log: bool | None = None) -> str:
    """Scale a latency axis whose data is in ms (see set_scale) with ticks in its unit
    (latency_unit); returns the unit for the axis label."""
    unit, per_unit = latency_unit(values_ms)
    set_scale(ax, axis, values_ms, log=log, per_tick_unit=per_unit)
    return unit


def panel_title(ax: Any, title: str, width: int = 60) -> None:
    """A panel title wrapped to the panel: long titles would otherwise run into the next
    panel's (the canary's cluster sizes and sample flags made two titles overlap)."""
    ax.set_title(textwrap.fill(title, width=width, break_long_words=False), fontsize=9)
