"""Axis conventions shared by every figure: log scale only across decades, plain ticks."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

# A panel gets a log axis only when its data spans at least this ratio (1.5 decades);
# narrower ranges read better, and without "8.3×10⁰" ticks, on a linear axis.
LOG_SPAN = 30.0


def plain_number(value: float, _pos: Any = None) -> str:
    """Ticks as plain numbers: 0.5, 20, 500, 10k (never 8.3×10⁰)."""
    if abs(value) >= 10000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def set_scale(ax: Any, axis: str, values: np.ndarray) -> None:
    """Log scale only where the positive data spans decades; ticks as plain numbers."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    target = ax.xaxis if axis == "x" else ax.yaxis
    if len(values) and values.max() / values.min() >= LOG_SPAN:
        setter("log")
        decades = np.log10(values.max() / values.min())
        target.set_major_locator(LogLocator(base=10, subs=(1.0,) if decades > 2.5 else (1.0, 2.0, 5.0)))
        target.set_major_formatter(FuncFormatter(plain_number))
        target.set_minor_formatter(NullFormatter())
    else:
        setter("linear")
        target.set_major_formatter(FuncFormatter(plain_number))


def panel_title(ax: Any, title: str, width: int = 60) -> None:
    """A panel title wrapped to the panel: long titles would otherwise run into the next
    panel's (the canary's cluster sizes and sample flags made two titles overlap)."""
    ax.set_title(textwrap.fill(title, width=width, break_long_words=False), fontsize=9)
