"""Scaling: time-scaling divides gaps, rate targeting, windows and limits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmsim.errors import ConfigError
from lmsim.workload.scaling import limit, scale_to_rate, time_scale, window
from lmsim.workload.trace import Trace


def make(arrivals, after=None, delay=None) -> Trace:
    n = len(arrivals)
    return Trace(np.asarray(arrivals, dtype=float), np.full(n, 16), np.full(n, 2),
                 np.arange(n + 1), np.arange(n), 16, after_id=after, delay_s=delay)  # fmt: skip


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(0, 1000, allow_nan=False), min_size=2, max_size=30),
    st.floats(0.1, 20),
)
def test_time_scale_divides_every_gap(gaps, k):
    arr = 5.0 + np.cumsum(gaps)
    t = make(arr)
    s = time_scale(t, k)
    np.testing.assert_allclose(np.diff(s.arrival_s), np.diff(arr) / k, rtol=1e-9, atol=1e-9)
    assert s.arrival_s[0] == arr[0]
    np.testing.assert_array_equal(s.hash_values, t.hash_values)  # order kept


def test_time_scale_delays_and_rate():
    t = make([0.0, 10.0, 30.0, 100.0], after=np.array([-1, 0, 1, -1]), delay=np.array([0, 4.0, 8.0, 0]))
    s = time_scale(t, 2.0)
    assert s.arrival_s.tolist() == [0.0, 5.0, 15.0, 50.0]
    assert s.delay_s.tolist() == [0.0, 2.0, 4.0, 0.0]
    assert s.after_id.tolist() == [-1, 0, 1, -1]
    r = scale_to_rate(t, 0.4)  # 4 requests / 100 s = 0.04/s -> x10
    assert r.arrival_s[-1] == pytest.approx(10.0)
    with pytest.raises(ConfigError):
        time_scale(t, 0)


def test_window_and_limit():
    t = make([0.0, 10.0, 30.0, 100.0], after=np.array([-1, 0, 1, 2]))
    w = window(t, 10.0, 100.0)
    assert w.arrival_s.tolist() == [0.0, 20.0]
    assert w.after_id.tolist() == [-1, 0]  # the link to row 0 is outside the window
    assert limit(t, 2).arrival_s.tolist() == [0.0, 10.0]
