"""Time-varying traffic: `workload.rate_schedule` re-times any trace or generated workload
so its arrival rate follows a schedule (a ramp, a step, a day).

The schedule is a rate multiplier m(T) > 0 on the *output* timeline T (the times the
replay sees, the ones `at_s` and `peak_at_s` refer to). It is applied as a time warp of
the arrivals, after `time_scale` / `rate` / `load` have set the workload's own rate:
an arrival at t (seconds from time 0 of the scaled trace) moves to the T with

    Lambda(T) = integral_0^T m(u) du = t

so inside a stretch where m is constant every inter-arrival gap is divided by m, and in
general the local rate is the workload's own rate times m(T). Lambda is strictly
increasing (m > 0), so the warp is monotone: the order of rows, ties, sessions and
closed-loop links never change, and the number of requests is the same (a schedule
changes when they arrive, never how many there are; to change the count, change the
workload's length or its rate).

Shapes:

- `piecewise`: m(T) = multiplier of the last segment with at_s <= T (the first at 0).
- `linear`: m is interpolated linearly between the segment points (at_s, multiplier) and
  held at the last multiplier after the last point.
- `diurnal`: a raised cosine with period `period_s` between `low` (the trough) and `high`
  (the peak, at `peak_at_s` and every period after):
  m(T) = low + (high - low) * (1 + cos(2 pi (T - peak_at_s) / period_s)) / 2.
  Its mean over any whole period is (low + high) / 2, so a day of output time holds
  period_s * (low + high) / 2 seconds of the scaled workload. With peak_at_s =
  period_s / 2 it is the curve of Dynamo's planner benchmark load, ai-dynamo/dynamo
  benchmarks/sin_load_generator/sin_synth.py (README: request_rate(t) = (min + max) / 2 +
  (max - min) / 2 * sin(2 pi t / period - pi / 2), the minimum at t = 0), as a multiplier
  of any workload rather than a generator of its own.

Closed-loop rows (`after_id` >= 0) keep their `delay_s`: it is a user's think time after
the previous turn finished, a property of the user and not of the arrival process, so a
busier hour does not make people think faster. Only their open-loop estimate
(`arrival_s`) is warped. `time_scale`, by contrast, divides `delay_s` too: it re-times
the whole workload, while a schedule changes how many users arrive when. A staged
workload (a load ladder) is refused, as `time_scale` refuses it: its stages carry rates.

Everything is closed-form or a fixed-iteration bisection on numpy arrays: deterministic
on any machine.
"""

from __future__ import annotations

import math

import numpy as np

from lmsim.config import RateScheduleConfig
from lmsim.errors import ConfigError
from lmsim.workload.trace import Trace

# 64 halvings of a bracket no wider than the trace's span reach float64 resolution
_BISECTION_STEPS = 64


def apply_rate_schedule(trace: Trace, schedule: RateScheduleConfig) -> Trace:
    """`trace` with every arrival t moved to Lambda^-1(t) (see the module docstring)."""
    if trace.stage is not None:
        raise ConfigError("workload.rate_schedule: a staged workload (a load ladder) is not re-timed: "
                          "set the rates in its stages instead")
    out = trace.replace()
    if len(out):
        out.arrival_s = warp_times(out.arrival_s, schedule)
    out.meta["rate_schedule"] = schedule.shape
    return out


def warp_times(t: np.ndarray, schedule: RateScheduleConfig) -> np.ndarray:
    """Output times T = Lambda^-1(t) of input times t >= 0 (vectorized)."""
    t = np.asarray(t, dtype=np.float64)
    if schedule.shape == "diurnal":
        return _invert_by_bisection(t, schedule)
    at, mult = _segment_points(schedule)
    if schedule.shape == "piecewise":
        return _invert_piecewise(t, at, mult)
    return _invert_linear(t, at, mult)


def multiplier(times: np.ndarray, schedule: RateScheduleConfig) -> np.ndarray:
    """m(T) at output times T: the rate relative to the workload's own."""
    T = np.asarray(times, dtype=np.float64)
    if schedule.shape == "diurnal":
        low, high, period, peak = _diurnal(schedule)
        return low + (high - low) * 0.5 * (1.0 + np.cos(2.0 * math.pi * (T - peak) / period))
    at, mult = _segment_points(schedule)
    if schedule.shape == "piecewise":
        return mult[np.maximum(np.searchsorted(at, T, side="right") - 1, 0)]
    return np.interp(T, at, mult)


def cumulative(times: np.ndarray, schedule: RateScheduleConfig) -> np.ndarray:
    """Lambda(T) = integral_0^T m(u) du: the input time an output time T corresponds to."""
    T = np.asarray(times, dtype=np.float64)
    if schedule.shape == "diurnal":
        low, high, period, peak = _diurnal(schedule)
        w = 2.0 * math.pi / period
        swing = (high - low) * 0.5
        return low * T + swing * (T + (np.sin(w * (T - peak)) - math.sin(-w * peak)) / w)
    at, mult = _segment_points(schedule)
    starts = _segment_starts(at, mult, schedule.shape)
    k = np.maximum(np.searchsorted(at, T, side="right") - 1, 0)
    dt = T - at[k]
    if schedule.shape == "piecewise":
        return starts[k] + mult[k] * dt
    slope = _slopes(at, mult)
    return starts[k] + mult[k] * dt + 0.5 * slope[k] * dt * dt


# -- shapes -------------------------------------------------------------------------------


def _segment_points(schedule: RateScheduleConfig) -> tuple[np.ndarray, np.ndarray]:
    assert schedule.segments  # the config validates sorted segments from at_s 0
    at = np.array([s.at_s for s in schedule.segments], dtype=np.float64)
    mult = np.array([s.multiplier for s in schedule.segments], dtype=np.float64)
    return at, mult


def _slopes(at: np.ndarray, mult: np.ndarray) -> np.ndarray:
    """d m / dT of each linear piece; the last (held) piece is flat."""
    slope = np.zeros(len(at))
    slope[:-1] = np.diff(mult) / np.diff(at)
    return slope


def _segment_starts(at: np.ndarray, mult: np.ndarray, shape: str) -> np.ndarray:
    """Lambda at each segment's start."""
    widths = np.diff(at)
    if shape == "piecewise":
        areas = mult[:-1] * widths
    else:
        areas = 0.5 * (mult[:-1] + mult[1:]) * widths
    starts = np.zeros(len(at))
    np.cumsum(areas, out=starts[1:])
    return starts


def _invert_piecewise(t: np.ndarray, at: np.ndarray, mult: np.ndarray) -> np.ndarray:
    starts = _segment_starts(at, mult, "piecewise")
    k = np.maximum(np.searchsorted(starts, t, side="right") - 1, 0)
    return at[k] + (t - starts[k]) / mult[k]


def _invert_linear(t: np.ndarray, at: np.ndarray, mult: np.ndarray) -> np.ndarray:
    """Solve starts[k] + m_k x + slope_k x^2 / 2 = t for x >= 0 in segment k; written as
    2 r / (m_k + sqrt(m_k^2 + 2 slope_k r)) so a flat piece (slope 0) needs no special case
    and nothing cancels."""
    starts = _segment_starts(at, mult, "linear")
    slope = _slopes(at, mult)
    k = np.maximum(np.searchsorted(starts, t, side="right") - 1, 0)
    r = t - starts[k]
    m, a = mult[k], slope[k]
    root = np.sqrt(np.maximum(m * m + 2.0 * a * r, 0.0))
    return at[k] + 2.0 * r / (m + root)


def _diurnal(schedule: RateScheduleConfig) -> tuple[float, float, float, float]:
    assert schedule.low is not None and schedule.high is not None
    assert schedule.period_s is not None and schedule.peak_at_s is not None
    return schedule.low, schedule.high, schedule.period_s, schedule.peak_at_s


def _invert_by_bisection(t: np.ndarray, schedule: RateScheduleConfig) -> np.ndarray:
    """Lambda is increasing with slope between low and high, so T lies in
    [t / high, t / low]; a fixed number of halvings keeps the result the same everywhere."""
    low, high, _, _ = _diurnal(schedule)
    lo, hi = t / high, t / low
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        below = cumulative(mid, schedule) < t
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def describe_schedule(schedule: RateScheduleConfig, trace: Trace) -> str:
    """One console line: the schedule and the span of the arrivals it produced."""
    if schedule.shape == "diurnal":
        what = (f"diurnal x{schedule.low:g}..x{schedule.high:g}, peak at {schedule.peak_at_s:g} s, "
                f"period {schedule.period_s:g} s")  # fmt: skip
    else:
        points = ", ".join(f"x{s.multiplier:g} at {s.at_s:g} s" for s in schedule.segments or ())
        what = f"{schedule.shape} {points}"
    span = f"{trace.arrival_s[0]:.4g}-{trace.arrival_s[-1]:.4g} s" if len(trace) else "none"
    return f"rate schedule {what}: arrivals over {span}"
