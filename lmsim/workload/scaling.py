"""Trace scaling: cut a trace to a time window or a request count, and re-time it to a
target mean rate while keeping the shape of its arrival process.

`limit(trace, n)` is `trace.head(n)`. Time scaling divides every gap from the first
arrival (and every closed-loop `delay_s`) by the factor, so bursts stay bursts, just
shorter; the order of rows never changes.
"""

from __future__ import annotations

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.trace import Trace


def time_scale(trace: Trace, factor: float) -> Trace:
    """Arrivals t -> t0 + (t - t0) / factor; delay_s / factor. factor > 1 speeds up."""
    if not np.isfinite(factor) or factor <= 0:
        raise ConfigError(f"time-scale factor must be > 0, got {factor}")
    if trace.stage is not None:
        # a ladder's stages carry their own rates (and its barrier its own timing)
        raise ConfigError("a staged workload (a load ladder) is not re-timed: set the rates in its stages "
                          "instead of workload.rate / time_scale / load")
    out = trace.replace()
    if len(out):
        t0 = out.arrival_s[0]
        out.arrival_s = t0 + (out.arrival_s - t0) / factor
    if out.delay_s is not None:
        out.delay_s = out.delay_s / factor
    out.meta["time_scale"] = repr(float(factor) * float(trace.meta.get("time_scale", 1.0)))
    return out


def mean_rate(trace: Trace) -> float:
    """Requests per second over the span (as `trace stats` reports it)."""
    span = float(trace.arrival_s[-1] - trace.arrival_s[0]) if len(trace) else 0.0
    if span <= 0:
        raise ConfigError("a trace needs at least two distinct arrival times to have a rate")
    return len(trace) / span


def scale_to_rate(trace: Trace, rate_per_s: float) -> Trace:
    """Time-scale so that the mean rate (requests / span) becomes rate_per_s."""
    if not np.isfinite(rate_per_s) or rate_per_s <= 0:
        raise ConfigError(f"target rate must be > 0, got {rate_per_s}")
    return time_scale(trace, rate_per_s / mean_rate(trace))


def window(trace: Trace, start_s: float, end_s: float) -> Trace:
    """Rows with start_s <= arrival < end_s, re-based so start_s becomes 0. Closed-loop
    links to rows outside the window become -1 (those rows arrive at their estimate)."""
    if end_s <= start_s:
        raise ConfigError(f"window end {end_s} must be after its start {start_s}")
    if trace.stage is not None and start_s > 0:
        # a ladder's stages are timed from their own starts (and by its barrier)
        raise ConfigError("a staged workload (a load ladder) is not cut by start_s: drop stages from its generator instead")
    rows = np.flatnonzero((trace.arrival_s >= start_s) & (trace.arrival_s < end_s))
    out = trace.take(rows)
    out.arrival_s = out.arrival_s - start_s
    return out


def limit(trace: Trace, n: int) -> Trace:
    if n < 0:
        raise ConfigError(f"request limit must be >= 0, got {n}")
    return trace.head(n)
