"""Replicated verdicts (lmsim/study/replicates.py): paired relative differences over seeds."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lmsim.study.replicates import paired, relative_difference


def test_interval_by_hand() -> None:
    # Per-seed differences -10%, -20%, -30%: mean -20, sd 10, half-width 4.303·10/√3 = 24.84.
    d = relative_difference([90.0, 80.0, 70.0], [100.0, 100.0, 100.0])
    assert d.mean_pct == pytest.approx(-20.0)
    assert d.half_width_pct == pytest.approx(4.303 * 10 / math.sqrt(3))
    assert d.verdict == "tie"  # the interval [-44.8, 4.8] spans zero
    firm = relative_difference([79.0, 80.0, 81.0], [100.0, 100.0, 100.0])
    assert firm.verdict == "lower" and str(firm) == "-20% ± 2 (lower)"
    assert relative_difference([110.0, 111.0, 112.0], [100.0] * 3).verdict == "higher"
    assert relative_difference([1.0], [2.0]).verdict == "tie"  # one seed: no interval


def test_paired_matches_rows_by_seed() -> None:
    frame = pd.DataFrame({
        "router.policy": ["a", "a", "b", "b"],
        "seed": [1, 0, 0, 1],
        "ttft_s_mean": [2.0, 1.0, 2.0, 4.0],
    })
    d = paired(frame, "ttft_s_mean", {"router.policy": "a"}, {"router.policy": "b"})
    assert d.n == 2 and d.mean_pct == pytest.approx(-50.0) and d.half_width_pct == 0.0
