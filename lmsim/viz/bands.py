"""Intervals over seeds, with one rule every figure states in its legend (docs/explanation/figures.md).

With fewer than MIN_SEEDS_FOR_CI seeds a band is the seeds' min–max: it says "every seed fell
in here" and cannot leave the data. From MIN_SEEDS_FOR_CI seeds it is the 95% Student-t
interval of the mean. Both are computed where the axis is:

- a per-load (or per-parameter) point on a log axis: the geometric mean and, with enough
  seeds, exp(mean ± t·sd / √n) of the logs, which is positive by construction;
- on a linear axis: the arithmetic mean and mean ± t·sd / √n, cut at zero for the
  non-negative quantities every figure draws (latencies, hit ratios);
- a CDF: pointwise on the quantile (y) axis, i.e. at each latency x the seeds' fractions
  F_i(x) of requests done by x, drawn over the x range the seeds' data cover only.

Why not the t interval at 3 seeds (the old figures): t(0.975, 2) = 4.30, so mean ± 4.3 · sd/√3
reached below zero whenever one seed of three sat far from the others. On the shipped
Figure 23 that drew ToolAgent's P99 TTFT band from 5 to 18 s at every load and pushed mean
TPOT axes below zero; on Figure 22 the quantile-axis (x) band of Coder's TTFT CDF, cut at 0,
became a slab from CDF 0 to 0.3 over the whole log axis, and the band of the maxima a line
at CDF 1.0 across every panel.
"""

from __future__ import annotations

import numpy as np

MIN_SEEDS_FOR_CI = 5

# Two-sided 95% Student-t quantiles by degrees of freedom (1..30; beyond, the normal 1.96).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t95(n: int) -> float:
    """The two-sided 95% Student-t quantile for the mean of `n` values (n - 1 degrees of freedom)."""
    return _T95[n - 2] if 2 <= n <= len(_T95) + 1 else 1.96


def band_words(counts: list[int] | set[int]) -> str | None:
    """What the band over these series' seed counts is, for a legend title: "min–max of 3
    seeds", "95% CI, 5 seeds", "min–max of 2-3 seeds"; None when no series has two seeds."""
    several = sorted({n for n in counts if n > 1})
    if not several:
        return None
    small = [n for n in several if n < MIN_SEEDS_FOR_CI]
    large = [n for n in several if n >= MIN_SEEDS_FOR_CI]

    def seeds(ns: list[int]) -> str:
        return f"{ns[0]} seeds" if len(ns) == 1 else f"{ns[0]}-{ns[-1]} seeds"

    words = []
    if small:
        words.append(f"min–max of {seeds(small)}")
    if large:
        words.append(f"95% CI, {seeds(large)}")
    return "band: " + "; ".join(words)


def point_interval(values: np.ndarray, *, log: bool) -> tuple[float, float, float]:
    """(centre, low, high) of one point's seed values on a log or linear axis (module
    docstring). Non-finite values, and on a log axis non-positive ones, are left out; with
    none left, all three are NaN."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    n = len(values)
    if n == 0:
        return (np.nan, np.nan, np.nan)
    space = np.log(values) if log else values
    centre = float(space.mean())
    if n < MIN_SEEDS_FOR_CI:
        low, high = float(space.min()), float(space.max())
    else:
        half = t95(n) * float(space.std(ddof=1)) / np.sqrt(n)
        low, high = centre - half, centre + half
    if log:
        return (float(np.exp(centre)), float(np.exp(low)), float(np.exp(high)))
    return (centre, max(low, 0.0), high)


# The x grid of a CDF over seeds: pooled quantiles at these levels, finer in the upper tail
# (where the P99 sits and the curves part) than a uniform grid of the same size.
_CDF_LEVELS = np.unique(np.concatenate([np.linspace(0.0, 1.0, 801), 1.0 - np.geomspace(0.05, 1e-5, 200)]))


def cdf_band(samples: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, centre, low, high) of the CDF over seeds: at each x of a grid spanning the pooled
    data (its quantiles, so every x is a value some seed produced), each seed's empirical
    CDF F_i(x) = (its values <= x) / its count; the centre is their mean (with equal counts,
    the pooled CDF), the band their min–max or, from MIN_SEEDS_FOR_CI seeds, the 95%
    interval of the mean cut to [0, 1]."""
    curves = [np.sort(np.asarray(s, dtype=float)) for s in samples if len(s)]
    pooled = np.concatenate(curves)
    x = np.unique(np.quantile(pooled, _CDF_LEVELS, method="inverted_cdf"))
    fractions = np.array([np.searchsorted(c, x, side="right") / len(c) for c in curves])
    centre = fractions.mean(axis=0)
    n = len(curves)
    if n < MIN_SEEDS_FOR_CI:
        low, high = fractions.min(axis=0), fractions.max(axis=0)
    else:
        half = t95(n) * fractions.std(axis=0, ddof=1) / np.sqrt(n)
        low, high = np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)
    return x, centre, low, high
