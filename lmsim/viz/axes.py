"""Axis conventions shared by every figure: log scale only across decades, plain ticks,
latencies in ms or, past a few seconds, in s; a linear axis of a non-negative quantity starts
at zero; tick labels never overlap (declutter_ticks measures them as drawn); legends
readable. The rules are written down in docs/explanation/figures.md."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

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


def set_scale(
    ax: Any, axis: str, values: Any, *, log: bool | None = None, per_tick_unit: float = 1.0, from_zero: bool = True
) -> None:
    """Log scale only where the positive data spans decades (or as `log` says, so panels
    of one column share a scale type); ticks as plain numbers of data / `per_tick_unit`.
    Call it after drawing: a linear axis then starts at zero (`from_zero`, every quantity
    these figures draw is non-negative), so a reader never meets an axis that cuts off the
    zero of a latency or runs below it."""
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
        if from_zero:
            # the drawn data's top plus a 5% margin of the new span (autoscale's margin was
            # of the data's own span: a flat line at 200 got 200.5, and touched the frame)
            top = ax.dataLim.x1 if axis == "x" else ax.dataLim.y1
            top = max(top if np.isfinite(top) else 0.0, values.max() if len(values) else 0.0)
            (ax.set_xlim if axis == "x" else ax.set_ylim)(0.0, top * 1.05 if top > 0 else 1.0)


def latency_unit(values_ms: Any) -> tuple[str, float]:
    """("ms", 1) or, when the data reaches SECONDS_FROM_MS, ("s", 1000): the unit of a
    latency axis drawn from values in ms, and the ms per unit."""
    values = np.asarray(values_ms, dtype=float)
    values = values[np.isfinite(values)]
    return ("s", 1000.0) if len(values) and values.max() >= SECONDS_FROM_MS else ("ms", 1.0)


def latency_axis(ax: Any, axis: str, values_ms: Any, *, log: bool | None = None, unit_of: Any = None) -> str:
    """Scale a latency axis whose data is in ms (see set_scale) with ticks in its unit
    (latency_unit of `unit_of`, by default of the data: panels that share a range pass the
    whole column's values); returns the unit for the axis label."""
    unit, per_unit = latency_unit(values_ms if unit_of is None else unit_of)
    set_scale(ax, axis, values_ms, log=log, per_tick_unit=per_unit)
    return unit


# Tick labels closer than this (pixels at the figure's dpi, about half a 10 pt digit) read as
# one: "5001000" touched, and "1000 2000" with 2 px between still read as one number.
TICK_LABEL_GAP_PX = 5.0


def drawn_tick_labels(axis: Any) -> list[Any]:
    """The tick labels `axis` draws (as of the last draw): non-empty, visible, inside the view."""
    low, high = sorted(axis.get_view_interval())
    span = (high - low) * 1e-9
    labels = []
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        loc = tick.get_loc()
        if loc is None or not (low - span <= loc <= high + span):
            continue
        for label in (tick.label1, tick.label2):
            if label.get_visible() and label.get_text().strip():
                labels.append(label)
    return labels


def overlapping_tick_labels(axis: Any, renderer: Any, gap: float = TICK_LABEL_GAP_PX) -> list[tuple[str, str]]:
    """Pairs of `axis`'s drawn tick labels whose boxes, grown by `gap` / 2 px, overlap."""
    boxes = [(label.get_text(), label.get_window_extent(renderer).padded(gap / 2)) for label in drawn_tick_labels(axis)]
    return [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:] if box_a.overlaps(box_b)]


def _thin(axis: Any, shown: int) -> None:
    """Fewer ticks on `axis`: a log axis first drops the 2 and 5 of each decade, then labels
    every other decade; a linear one asks for fewer bins."""
    if axis.get_scale() == "log":
        locator = axis.get_major_locator()
        subs = getattr(locator, "_subs", None)
        if subs is not None and len(np.atleast_1d(subs)) > 1:
            axis.set_major_locator(LogLocator(base=10, subs=(1.0,)))
        else:
            axis.set_major_locator(LogLocator(base=10, subs=(1.0,), numticks=max(2, shown // 2 + 1)))
    else:
        axis.set_major_locator(MaxNLocator(nbins=max(2, shown - 2), steps=[1, 2, 2.5, 5, 10]))


def declutter_ticks(fig: Any, rounds: int = 4) -> None:
    """Thin the ticks of every axis whose labels, as drawn, overlap (measured, since whether
    "500" and "1000" collide depends on the panel's width, the font and the decades shown),
    until none do. Call it last, after the layout."""
    for _ in range(rounds):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        crowded = [axis for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) if overlapping_tick_labels(axis, renderer)]
        if not crowded:
            return
        for axis in crowded:
            before = axis.get_major_locator()
            _thin(axis, len(drawn_tick_labels(axis)))
            low, high = sorted(axis.get_view_interval())
            if sum(low <= loc <= high for loc in axis.get_major_locator()()) < 2:
                axis.set_major_locator(before)  # never thinned to fewer than two ticks in view


def panel_title(ax: Any, title: str, width: int = 60) -> None:
    """A panel title wrapped to the panel: long titles would otherwise run into the next
    panel's (the canary's cluster sizes and sample flags made two titles overlap)."""
    ax.set_title(textwrap.fill(title, width=width, break_long_words=False), fontsize=9)
