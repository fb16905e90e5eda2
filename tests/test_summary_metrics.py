"""The serving metrics of `summarize` (README "Metric glossary"), on traces small enough to
check by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lmsim.engine.metrics import FINISHED, REJECTED, UNFINISHED
from lmsim.engine.results import pooled_percentile, summarize


def _requests() -> tuple[pd.DataFrame, np.ndarray]:
    # r0: 11 tokens, first token at 1.0, done at 2.0 -> TPOT 0.1 s (10 gaps)
    # r1: 3 tokens, first at 3.0, done at 4.0      -> TPOT 0.5 s (2 gaps)
    # r2: 1 token, done at 6.0 (TTFT 5 s)          -> no TPOT
    # r3: rejected; r4 unfinished (routed to instance 1)
    arrived = np.array([0.0, 1.0, 1.0, 2.0, 3.0])
    first = np.array([1.0, 3.0, 6.0, np.nan, np.nan])
    done = np.array([2.0, 4.0, 6.0, np.nan, np.nan])
    out = np.array([11, 3, 1, 5, 5])
    tpot = np.array([0.1, 0.5, np.nan, np.nan, np.nan])
    frame = pd.DataFrame({
        "arrived_at": arrived, "first_token_at": first, "finished_at": done,
        "first_scheduled_at": arrived, "instance_id": [0, 0, 1, -1, 1],
        "input_tokens": [100, 20, 40, 10, 10], "output_tokens": out,
        "cached_tokens": [0, 10, 0, -1, 0], "ttft_s": first - arrived, "tpot_s": tpot,
        "e2e_s": done - arrived, "queue_s": np.zeros(5),
    })  # fmt: skip
    return frame, np.array([FINISHED, FINISHED, FINISHED, REJECTED, UNFINISHED])


def test_throughput_goodput_and_slo_attainment() -> None:
    requests, status = _requests()
    s = summarize(requests, status, slo={"ttft_s": 2.5, "tpot_s": 0.2}, num_instances=3)
    assert s["duration_s"] == 6.0  # first arrival 0 -> last finish 6
    assert s["request_throughput_per_s"] == pytest.approx(3 / 6)
    assert s["output_token_throughput_per_s"] == pytest.approx(15 / 6)
    # r0 meets both (TTFT 1, TPOT 0.1); r1 misses TPOT; r2 misses TTFT; r3, r4 never finish.
    assert s["slo_attainment"] == pytest.approx(1 / 5)
    assert s["goodput_per_s"] == pytest.approx(1 / 6)
    assert (s["slo_ttft_s"], s["slo_tpot_s"]) == (2.5, 0.2)
    # A one-token request has no TPOT and passes that target: r2 with a loose TTFT target.
    loose = summarize(requests, status, slo={"ttft_s": 10.0, "tpot_s": 0.2}, num_instances=3)
    assert loose["slo_attainment"] == pytest.approx(2 / 5)


def test_itl_is_pooled_over_tokens() -> None:
    """The engine's record of gaps: 10 of 0.1 s (r0) and 2 of 0.5 s (r1), given as three
    entries (0.1 twice, split 4 + 6). Mean (1.0 + 1.0) / 12 (per-request TPOT mean is 0.3);
    percentiles of the 12 pooled gaps, linearly interpolated as np.percentile does: p50 at
    rank 5.5 (0.1), p90 at 9.9 (0.1 + 0.9 x 0.4 = 0.46), p99 at 10.89 (0.5)."""
    requests, status = _requests()
    itl = (np.array([0.1, 0.5, 0.1]), np.array([4, 2, 6], dtype=np.uint32))
    s = summarize(requests, status, num_instances=3, itl=itl)
    assert s["itl_s_mean"] == pytest.approx(2.0 / 12)
    assert s["tpot_s_mean"] == pytest.approx(0.3)
    assert s["itl_s_p50"] == 0.1 and s["itl_s_p99"] == 0.5
    assert s["itl_s_p90"] == pytest.approx(0.46)
    assert summarize(requests, status, num_instances=3)["itl_s_p50"] is None  # no record, no ITL


def test_pooled_percentile_matches_the_repeated_population() -> None:
    rng = np.random.default_rng(1)
    values = np.sort(rng.random(20))
    values[5] = values[6]  # equal neighbours
    counts = rng.integers(1, 5, 20)
    pooled = np.repeat(values, counts)
    for q in (0, 1, 37.5, 50, 90, 99, 100):
        assert pooled_percentile(values, counts, q) == pytest.approx(np.percentile(pooled, q), rel=1e-15, abs=0)


def test_load_balance_counts_idle_instances() -> None:
    requests, status = _requests()
    s = summarize(requests, status, num_instances=3)
    # requests per instance: [2, 2, 0] -> max/mean = 2 / (4/3); the rejected one is not routed
    assert s["instance_requests_max_over_mean"] == pytest.approx(1.5)
    # tokens: instance 0: 111 + 23 = 134, instance 1: 41 + 15 = 56, instance 2: 0
    assert s["instance_tokens_max_over_mean"] == pytest.approx(134 / (190 / 3))
