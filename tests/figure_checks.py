"""Checks on what a figure draws, shared by the figure tests: they read the artists of a
rendered matplotlib figure, not the code that made it, so a defect a reader would see on a
PNG (a band out of the data, a log axis fed negative values, tick labels run together, an
axis below zero) fails a test whichever code path brought it back."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.collections import PolyCollection


def bands(ax: Any) -> list[np.ndarray]:
    """The vertices (data coordinates) of every filled band (fill_between) on `ax`."""
    out = []
    for collection in ax.collections:
        if isinstance(collection, PolyCollection):
            for path in collection.get_paths():
                out.append(np.asarray(path.vertices, dtype=float))
    return out


def visible_tick_labels(axis: Any, renderer: Any) -> list[tuple[str, Any]]:
    """(text, window box) of each tick label `axis` drew: non-empty and inside the view
    (written here, not imported, so the check does not share the figure code's mistakes)."""
    low, high = sorted(axis.get_view_interval())
    eps = (high - low) * 1e-9
    out = []
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        if not low - eps <= tick.get_loc() <= high + eps:
            continue
        for label in (tick.label1, tick.label2):
            if label.get_visible() and label.get_text().strip():
                out.append((label.get_text(), label.get_window_extent(renderer)))
    return out


def overlapping_labels(fig: Any) -> list[tuple[str, str]]:
    """Pairs of tick labels of one axis whose drawn boxes overlap ("500" and "1000" read
    as "5001000")."""
    if not hasattr(fig.canvas, "get_renderer"):  # a figure closed after saving
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    clashes = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            boxes = visible_tick_labels(axis, renderer)
            for i, (a, box_a) in enumerate(boxes):
                for b, box_b in boxes[i + 1:]:
                    if box_a.overlaps(box_b):
                        clashes.append((a, b))
    return clashes


def log_axis_problems(fig: Any) -> list[str]:
    """A log axis fed a non-positive value by a line or a band (matplotlib hides it, and
    the band turns into a slab down to the axis floor)."""
    problems = []
    for i, ax in enumerate(fig.axes):
        for which, column in (("x", 0), ("y", 1)):
            if (ax.get_xscale() if which == "x" else ax.get_yscale()) != "log":
                continue
            values = [line.get_xydata()[:, column] for line in ax.get_lines()]
            values += [v[:, column] for v in bands(ax)]
            for v in values:
                v = v[np.isfinite(v)]
                if len(v) and v.min() <= 0:
                    problems.append(f"axes {i} {which}: {v.min():g}")
    return problems


def assert_readable(fig: Any) -> None:
    """No overlapping tick labels, nothing non-positive on a log axis, every band inside
    its axes' limits."""
    assert overlapping_labels(fig) == []
    assert log_axis_problems(fig) == []
    for ax in fig.axes:
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        for v in bands(ax):
            assert x0 <= v[:, 0].min() and v[:, 0].max() <= x1, (ax.get_title(), v[:, 0].min(), x0)
            assert y0 <= v[:, 1].min() and v[:, 1].max() <= y1, (ax.get_title(), v[:, 1].min(), y0)
