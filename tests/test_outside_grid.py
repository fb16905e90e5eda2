"""Steps outside a profile's grid are counted (summary.json `outside_grid_steps`) and warned
about once, never extrapolated silently; the count is exact under fast-forward."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from conftest import make_trace, simulate
from lmsim.profile.tables import ProfileGridWarning, load_table_profile

TINY = str(Path(__file__).parent / "fixtures" / "profiles" / "tiny")
# tiny's grids: tokens 1..1024, seqs 1..100, decode batch 1..10 over total context 0..10000,
# prefill chunks 10..100 over cached context 0..1000.


def test_outside_grid_names_the_axis():
    m = load_table_profile(TINY)
    assert m.outside_grid([(50, 0)], 0, 0) is None
    assert "prefill chunk tokens 200" in m.outside_grid([(200, 0)], 0, 0)
    assert "prefill chunk tokens 5" in m.outside_grid([(5, 0)], 0, 0)  # held below the grid
    assert "decode batch 11" in m.outside_grid((), 11, 100)
    assert "decode total context 10001" in m.outside_grid((), 2, 10001)


def test_decode_run_counts_only_the_steps_past_the_grid():
    m = load_table_profile(TINY)
    # Batch 4 from context 9988: steps attend 9988, 9992, ..., inside while k <= 3, so 6 of 10 are past 10000.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert m.steps_outside_grid((), 4, 9988, 10) == 6
        assert m.steps_outside_grid((), 4, 100, 10) == 0
        assert m.steps_outside_grid((), 11, 100, 10) == 10
    for k in range(1, 12):  # the run count equals the sum of single-step counts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            singles = sum(m.steps_outside_grid((), 4, 9980 + 4 * i, 1) for i in range(k))
            assert m.steps_outside_grid((), 4, 9980, k) == singles


@pytest.mark.parametrize("fast_forward", [True, False])
def test_summary_counts_steps_outside_the_grid(fast_forward):
    # One request of 150 prompt tokens: with a 120-token budget its chunks are 120 (outside the
    # 10..100 chunk grid) then 30 (inside), then 4 decodes at batch 1 over 151..154 tokens.
    trace = make_trace([0.0], [150], [5])
    cluster = {"profile": TINY, "num_gpu_blocks": 100, "max_num_batched_tokens": 120}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = simulate(trace, cluster=cluster, simulation={"fast_forward": fast_forward, "check": True})
    assert res.summary["outside_grid_steps"] == 1
    assert sum(issubclass(w.category, ProfileGridWarning) for w in caught) <= 1


def test_inside_the_grid_counts_nothing():
    trace = make_trace([0.0, 0.1], [50, 60], [5, 8])
    res = simulate(trace, cluster={"profile": TINY, "num_gpu_blocks": 100})
    assert res.summary["outside_grid_steps"] == 0


@pytest.mark.parametrize("batch", [0, 1, 4, 10, 11, 200])
def test_inside_grid_shortcut_agrees_with_the_full_count(batch):
    """`_inside_grid` only says 'nothing to count' where the full count says 0."""
    m = load_table_profile(TINY)
    m._warned_outside = True  # silence: this test counts, it does not read warnings
    chunk_sets = [(), [(50, 0)], [(5, 0)], [(100, 1000)], [(101, 10)], [(50, 1001)], [(60, 10), (60, 10)]]
    for chunks in chunk_sets:
        for context in (0, 1, 500, 9990, 10000, 10001):
            for steps in (1, 3, 10):
                if chunks and steps > 1:
                    continue
                if not chunks and not batch:
                    continue
                count = m.steps_outside_grid(chunks, batch, context, steps)
                if m._inside_grid(chunks, batch, context, steps):
                    assert count == 0
                # the reference: outside_grid asked about every step the call covers
                singles = sum(
                    1 for k in range(steps) if m.outside_grid(chunks, batch, context + k * batch)
                )
                assert count == singles, (chunks, batch, context, steps)
