"""Open-loop arrival times as vLLM's benchmark client draws them: a request rate and a
burstiness.

vLLM's `bench serve` (vllm/benchmarks/serve.py, `get_request`; formerly
benchmarks/benchmark_serving.py) draws the gap before each request from a gamma
distribution with shape = burstiness and scale = 1 / (rate * burstiness), so the mean gap is
1/rate whatever the burstiness and the coefficient of variation is 1/sqrt(burstiness):
burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular, infinite a
constant gap of 1/rate. A rate of infinity sends every request at t = 0. The first request
waits its own gap (arrival i is the sum of gaps 0..i). With a fixed request count and no
ramp-up vLLM then stretches all arrival times by one factor so that the last request arrives
at exactly count/rate ("the sum of the gaps would be 1-2% off the target"); `rescale=True`
does the same.

The gamma draws come from numpy's `Generator.gamma` (scalar C code, not a vectorized loop)
and the times are put on the generators' one-microsecond grid, as every generator's are
(see `lmsim.workload.generators.base`).
"""

from __future__ import annotations

import math

import numpy as np

from lmsim.errors import ConfigError


def check_rate(rate: float, burstiness: float, *, where: str) -> tuple[float, float]:
    """The rate and burstiness as floats (YAML may give "inf"), or one line naming the bad one."""
    try:
        rate, burstiness = float(rate), float(burstiness)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: rate and burstiness must be numbers (or inf)") from None
    if math.isnan(rate) or rate <= 0:
        raise ConfigError(f"{where}: rate must be > 0 requests/s (inf: all at t=0), got {rate}")
    if math.isnan(burstiness) or burstiness <= 0:
        raise ConfigError(f"{where}: burstiness must be > 0 (1 = Poisson, inf = constant gaps), got {burstiness}")
    return rate, burstiness


def gamma_gaps(rng: np.random.Generator, n: int, rate: float, burstiness: float) -> np.ndarray:
    """n gaps with mean 1/rate and coefficient of variation 1/sqrt(burstiness)."""
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        return np.full(n, 1.0 / rate)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def arrivals_for_count(
    rng: np.random.Generator, n: int, rate: float, burstiness: float, *, rescale: bool = True
) -> np.ndarray:
    """Arrival times of n requests: cumulative gamma gaps, stretched (with `rescale`) so
    the last arrives at n/rate as vLLM's client does."""
    times = np.cumsum(gamma_gaps(rng, n, rate, burstiness))
    if rescale and n and math.isfinite(rate) and times[-1] > 0:
        times = times * ((n / rate) / times[-1])
    return times


def arrivals_for_duration(
    rng: np.random.Generator, duration_s: float, rate: float, burstiness: float
) -> np.ndarray:
    """Arrival times in [0, duration_s) of the same renewal process (never rescaled: the
    count is what the process gives). Gaps are drawn in fixed batches, so a longer
    duration extends a shorter one's arrivals instead of redrawing them."""
    if math.isinf(rate):
        raise ConfigError("rate inf puts every request at t=0: give num_requests, not duration_s")
    parts: list[np.ndarray] = []
    end = 0.0
    while end < duration_s:
        part = end + np.cumsum(gamma_gaps(rng, _BATCH, rate, burstiness))
        parts.append(part)
        end = float(part[-1])
    times = np.concatenate(parts) if parts else np.zeros(0)
    return times[times < duration_s]


_BATCH = 1 << 14
