"""Shared machinery of the synthetic workload generators: length distributions, arrival
processes, chained block-id construction and assembly into a canonical `Trace`.

Generators describe requests in *generation order* (session by session) as `Plan`
columns; `build_trace` turns a plan into chained hash ids, sorts rows by arrival (stable)
and cuts the result to the requested window or request count.

Bit-identical on every machine: numpy's vectorized `exp`/`power` loops differ in their last
bits between numpy builds and CPUs (on this project's AVX-512 machine numpy 1.26.4 and
2.4.6 disagree on 8,238 of 200,000 lognormal draws `9 * exp(1.3 z)`, and each disagrees
with the C library on thousands more), which moved the Coder generator's arrival times
and think times between numpy versions. Generators therefore take exponentials and powers
through `exp` and `zipf_weights` below (the C library, one value at a time), sum weights
with `math.fsum`, and emit times on a one-microsecond grid (`on_time_grid`), so a residual
last-bit difference between C libraries would have to straddle a half-microsecond to show.
Every generator class carries a `version`: bump it whenever its output changes, since the
capacity cache keys generated workloads by (name, version, parameters, seed).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.trace import Trace

_NORMAL = statistics.NormalDist()
_BIG = np.int64(1) << np.int64(40)  # key stride per chain; no request has 2^40 blocks
# Blocks expanded at once by chained_ids: its per-block temporaries cost ~80 bytes a
# block, so 2^22 peaked at +340 MB over the ids themselves; 2^18 keeps that at ~20 MB
# for the same CPU time (the per-chunk work is vectorized).
_CHUNK_BLOCKS = 1 << 18


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


Z99 = 2.3263478740408408  # standard normal 99th percentile
Z90 = 1.2815515655446004


def split_lognormal_sigmas(mean: float, p50: float, p99: float) -> tuple[float, float]:
    """(sigma_lo, sigma_hi) of a split lognormal with median p50 whose upper half has the
    given p99 and whose mean is `mean`. Three published numbers, three parameters: the
    upper sigma comes from p99 alone, the lower one is found by bisection on the mean."""
    hi = math.log(p99 / p50) / Z99

    def mean_of(lo: float) -> float:
        return p50 * (math.exp(lo * lo / 2) * _phi(-lo) + math.exp(hi * hi / 2) * _phi(hi))

    # a wider lower half pulls mass toward 0, so mean_of decreases in lo; a target out of
    # reach gets the nearest end
    a, b = 0.0, 5.0
    if not mean_of(b) <= mean <= mean_of(a):
        return (a if mean > mean_of(a) else b), hi
    for _ in range(60):
        mid = (a + b) / 2
        if mean_of(mid) > mean:
            a = mid
        else:
            b = mid
    return (a + b) / 2, hi


MICROSECONDS = 1_000_000


def exp(x: np.ndarray | float) -> np.ndarray:
    """Element-wise e**x through the C library's `exp` (see the module docstring: numpy's
    SIMD loops are not reproducible across builds). About 0.15 us per value."""
    flat = np.asarray(x, dtype=np.float64)
    out = np.fromiter(map(math.exp, flat.ravel().tolist()), dtype=np.float64, count=flat.size)
    return out.reshape(flat.shape)


def on_time_grid(t: np.ndarray) -> np.ndarray:
    """Times rounded to whole microseconds: a count of microseconds divided by 10^6, i.e.
    the double nearest to the decimal time (multiply, rint and divide are correctly rounded
    IEEE operations, so this is the same everywhere)."""
    return np.rint(np.asarray(t, dtype=np.float64) * MICROSECONDS) / MICROSECONDS


def split_lognormal(
    rng: np.random.Generator, median: float, sigma_lo: float, sigma_hi: float, size: int
) -> np.ndarray:
    z = rng.standard_normal(size)
    return median * exp(np.where(z < 0, sigma_lo, sigma_hi) * z)


def lengths_from_targets(
    rng: np.random.Generator, mean: float, p50: float, p99: float, size: int,
    *, lo: int = 1, hi: int | None = None,
) -> np.ndarray:
    """Integer token counts whose mean/p50/p99 match the targets (before clipping)."""
    s_lo, s_hi = split_lognormal_sigmas(mean, p50, p99)
    x = np.rint(split_lognormal(rng, p50, s_lo, s_hi, size)).astype(np.int64)
    return np.clip(x, lo, hi if hi is not None else np.iinfo(np.int64).max)


def stratified_lognormal(k: int, median: float, sigma: float) -> np.ndarray:
    """k lognormal sizes at fixed quantiles, spread over popularity ranks by a golden-ratio
    sequence. Seed-independent on purpose: with Zipf popularity the few top-ranked sizes
    dominate the statistics, and random draws would make calibration depend on the seed."""
    u = np.modf((np.arange(k) + 1) * 0.6180339887498949)[0]
    u = np.clip(u, 0.5 / k, 1 - 0.5 / k)
    z = np.array([_NORMAL.inv_cdf(float(x)) for x in u])
    return np.maximum(np.rint(median * exp(sigma * z)), 1).astype(np.int64)


def zipf_weights(k: int, alpha: float) -> np.ndarray:
    w = np.array([1.0 / math.pow(r, alpha) for r in range(1, k + 1)])
    return w / math.fsum(w.tolist())


def poisson_times(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    """Homogeneous Poisson arrivals in [start, end)."""
    if rate <= 0 or end <= start:
        return np.zeros(0)
    n = rng.poisson(rate * (end - start))
    return np.sort(rng.uniform(start, end, n))


def quantize(times: np.ndarray, tick_s: float) -> np.ndarray:
    """Round arrivals down to a tick, as the Kimi traces' ~3 s timestamp grid does."""
    return np.floor(times / tick_s) * tick_s if tick_s > 0 else times


@dataclass
class Plan:
    """Requests in generation order. A *chain* is a run of consecutive requests each of
    which re-sends (a prefix of) the previous one's blocks; a chain starts from a shared
    prefix (`chain_prefix_base`, `chain_prefix_blocks`: ids base .. base+k-1)."""

    arrival: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    chain: np.ndarray  # chain index, non-decreasing
    keep: np.ndarray  # leading blocks inherited from the previous request or the prefix
    chain_prefix_base: np.ndarray
    chain_prefix_blocks: np.ndarray
    session: np.ndarray | None = None
    parent: np.ndarray | None = None  # generation-order index, -1 if none
    class_id: np.ndarray | None = None
    after: np.ndarray | None = None  # generation-order index, -1 if none
    delay: np.ndarray | None = None
    first_fresh_id: int = 0  # ids below this are reserved for shared prefixes
    meta: dict[str, str] = field(default_factory=dict)


def chained_ids(
    plan: Plan, block_size: int, rows_sel: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Hash ids for every request of a plan, vectorized.

    Request r (turn t of chain c) has ids[j] = ids of turn t-1 at j for j < keep_t, else a
    fresh id. With keep non-decreasing along a chain, the owner of position j is the last
    turn u <= t with keep_u <= j; before the first turn, a virtual turn with keep 0 owns
    the shared prefix. Only the rows in `rows_sel` (default all) are expanded, so warm-up
    rows outside a window cost O(1) each."""
    n = len(plan.input_tokens)
    nblocks = -(-plan.input_tokens // block_size)
    keep = np.minimum(plan.keep, nblocks)
    fresh = nblocks - keep
    fresh_base = plan.first_fresh_id + np.concatenate(([0], np.cumsum(fresh)[:-1]))
    sel = np.arange(n, dtype=np.int64) if rows_sel is None else rows_sel
    offsets = np.zeros(len(sel) + 1, dtype=np.int64)
    np.cumsum(nblocks[sel], out=offsets[1:])
    chain = plan.chain.astype(np.int64)
    turn_keys = chain * _BIG + keep
    if np.any(np.diff(turn_keys) < 0):
        raise ValueError("keep must be non-decreasing within a chain")
    # int32 while every id fits (half the memory of the trace's largest array: a 1M-request
    # agent trace has 57M ids; see Trace.compact), widened at the first chunk that does not
    values = np.empty(int(offsets[-1]), dtype=np.int32)
    int32 = np.iinfo(np.int32)
    # Expand a slice of rows at a time: the per-block temporaries of a million-request trace
    # would otherwise cost several times the size of the ids themselves.
    start = 0
    while start < len(sel):
        stop = int(np.searchsorted(offsets, offsets[start] + _CHUNK_BLOCKS, side="right")) - 1
        stop = min(max(stop, start + 1), len(sel))
        lo, hi = int(offsets[start]), int(offsets[stop])
        local = np.repeat(np.arange(start, stop, dtype=np.int64), nblocks[sel[start:stop]])
        rows = sel[local]
        pos = np.arange(lo, hi, dtype=np.int64) - offsets[local]
        owner = np.searchsorted(turn_keys, chain[rows] * _BIG + pos, side="right") - 1
        owner = np.minimum(owner, rows)
        # a turn of an earlier chain, or none at all, means the virtual prefix turn owns it
        virtual = (owner < 0) | (chain[np.maximum(owner, 0)] != chain[rows])
        o = np.maximum(owner, 0)
        ids = np.where(
            virtual,
            plan.chain_prefix_base[chain[rows]] + pos,
            fresh_base[o] + (pos - keep[o]),
        )
        if values.dtype == np.int32 and len(ids) and (ids.min() < int32.min or ids.max() > int32.max):
            values = values.astype(np.int64)
        values[lo:hi] = ids
        start = stop
    return offsets, values


def build_trace(
    plan: Plan, *, block_size: int, start_s: float, end_s: float | None,
    num_requests: int | None, source: str,
) -> Trace:
    """Chained ids, then keep rows with start_s <= arrival (< end_s), sorted by arrival and
    re-based so that start_s becomes 0, optionally the first num_requests."""
    plan.arrival = on_time_grid(plan.arrival)
    if plan.delay is not None:
        plan.delay = on_time_grid(plan.delay)
    inside = plan.arrival >= start_s
    if end_s is not None:
        inside &= plan.arrival < end_s
    rows = np.flatnonzero(inside)
    rows = rows[np.argsort(plan.arrival[rows], kind="stable")]
    if num_requests is not None:
        rows = rows[:num_requests]
    # Ids are expanded directly in output order (rows outside the window get none), so the
    # largest array of a big trace is built once and never copied.
    offsets, values = chained_ids(plan, block_size, rows)
    full = Trace(
        arrival_s=plan.arrival, input_tokens=plan.input_tokens,
        output_tokens=plan.output_tokens,
        hash_offsets=np.zeros(len(plan.arrival) + 1, dtype=np.int64),
        hash_values=np.zeros(0, dtype=np.int64),
        block_size=block_size, session_id=plan.session, parent_id=plan.parent,
        class_id=plan.class_id, after_id=plan.after, delay_s=plan.delay, source=source,
        meta=dict(plan.meta),
    )  # fmt: skip
    out = full.take(rows)
    out.hash_offsets, out.hash_values = offsets, values
    out.arrival_s = out.arrival_s - start_s
    if out.session_id is not None:
        # dense session numbers in order of first appearance
        _, first, inv = np.unique(out.session_id, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        out.session_id = rank[inv]
    return out


def horizon(num_requests: int | None, duration_s: float | None, rate: float) -> float:
    """Length of generated time needed: duration_s, or enough for num_requests with margin;
    one hour when neither is given."""
    if num_requests is not None and duration_s is not None:
        raise ConfigError("give only one of num_requests and duration_s")
    if num_requests is None and duration_s is None:
        duration_s = 3600.0
    if rate <= 0:
        raise ConfigError(f"rate must be > 0, got {rate}")
    if duration_s is not None:
        if duration_s <= 0:
            raise ConfigError(f"duration_s must be > 0, got {duration_s}")
        return float(duration_s)
    if num_requests is None or num_requests < 1:
        raise ConfigError(f"num_requests must be >= 1, got {num_requests}")
    return num_requests / rate * 1.25 + 60.0
