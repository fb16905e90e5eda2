"""Replicated verdicts: a difference between two arms of a sweep, measured at every seed of a
`seeds:` sweep, summarised as its mean with a 95% confidence interval, and called a tie when
the interval spans zero.

The difference is paired: at each seed both arms replay the same generated workload, so the
relative difference `(a − b)/b` is taken per seed first and the interval is Student's t over
those per-seed values (n − 1 degrees of freedom). Two seeds give a very wide interval (t =
12.7), three a wide one (t = 4.30): a verdict from three seeds is only as firm as its interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (beyond: normal).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(dof: int) -> float:
    if dof < 1:
        return math.inf
    return _T975[dof - 1] if dof <= len(_T975) else 1.960


@dataclass(frozen=True)
class Difference:
    """Mean relative difference of arm a vs arm b in percent, its 95% half-width, n seeds."""

    mean_pct: float
    half_width_pct: float
    n: int

    @property
    def low(self) -> float:
        return self.mean_pct - self.half_width_pct

    @property
    def high(self) -> float:
        return self.mean_pct + self.half_width_pct

    @property
    def verdict(self) -> str:
        """'lower' / 'higher' (a vs b) when the interval excludes zero, else 'tie'."""
        if not self.n or math.isnan(self.mean_pct) or self.low <= 0 <= self.high:
            return "tie"
        return "lower" if self.high < 0 else "higher"

    def __str__(self) -> str:
        if not self.n:
            return "n/a"
        hw = "?" if math.isinf(self.half_width_pct) else f"{self.half_width_pct:.0f}"
        return f"{self.mean_pct:+.0f}% ± {hw} ({self.verdict})"


def relative_difference(a: list[float], b: list[float]) -> Difference:
    """Paired relative difference of `a` vs `b` (same order = same seed)."""
    if len(a) != len(b):
        raise ValueError(f"paired arms differ in length ({len(a)} vs {len(b)})")
    rel = [100.0 * (x - y) / y for x, y in zip(a, b) if y and not (math.isnan(x) or math.isnan(y))]
    n = len(rel)
    if not n:
        return Difference(math.nan, math.nan, 0)
    mean = sum(rel) / n
    if n == 1:
        return Difference(mean, math.inf, 1)
    sd = math.sqrt(sum((r - mean) ** 2 for r in rel) / (n - 1))
    return Difference(mean, t975(n - 1) * sd / math.sqrt(n), n)


def paired(frame: Any, metric: str, arm_a: dict[str, Any], arm_b: dict[str, Any],
           where: dict[str, Any] | None = None) -> Difference:
    """The difference of `metric` between the rows matching `arm_a` and `arm_b` (column ->
    value; NaN matches an unset column) within `where`, paired by the `seed` column."""

    def select(cond: dict[str, Any]) -> Any:
        mask = None
        for key, value in {**(where or {}), **cond}.items():
            col = frame[key]
            m = col.isna() if value is None else col == value
            mask = m if mask is None else mask & m
        rows = frame[mask] if mask is not None else frame
        return rows.set_index("seed")[metric]

    a, b = select(arm_a), select(arm_b)
    seeds = sorted(set(a.index) & set(b.index))
    return relative_difference([float(a[s]) for s in seeds], [float(b[s]) for s in seeds])
