"""`TableCostModel._mixed_run` (a fast-forwarded decode run of mixed KV lengths under the
`longest` form, `lmsim.profile.decode_batch`) against the slow, obvious pricing it replaces:
every step on its own, its decode-table cell found by bisecting both grids and built fresh
from the table, no cache, no row index, no cell walk, no numpy. Equal floats, not close ones:
the engine's results (tests/golden.py) depend on the bits."""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmsim.profile.tables import _NUMPY_SPAN, TableCostModel, load_table_profile, read_profile

TINY = Path(__file__).parent / "fixtures" / "profiles" / "tiny"


def mixed_step_reference(model: TableCostModel, batch: int, context: int, longest: int) -> float:
    """One decode step of `batch` sequences, KV lengths summing to `context`, the longest
    `longest` (mixed: longest * batch > context): the fixed part at `batch`, plus the table's
    cell (i, j) around (context / longest, context), clamped to the grid as `_lerp` clamps,
    read as its bilinear polynomial (`_mixed_cell`, computed afresh here)."""
    bx, xs = model._da_b, model._da_c
    b = max(context / longest, bx[0])
    c = max(context, xs[0])
    i = min(bisect_right(bx, b) - 1, len(bx) - 2)
    j = min(bisect_right(xs, c) - 1, len(xs) - 2)
    return _step_in_cell(model, batch, c, b, i, j)


def _step_in_cell(model: TableCostModel, batch: int, context: float, at_batch: float, i: int, j: int) -> float:
    a0, b0, da, db, y0, dy = model._mixed_cell(i, j)
    return model._decode_row(batch)[0] + ((a0 + b0 * context) + (da + db * context) * ((at_batch - y0) / dy))


def mixed_run_reference(model: TableCostModel, batch: int, context: int, longest: int, steps: int) -> list[float]:
    """The run step by step: every length grows by one a step, so the context by `batch`
    and the longest by 1."""
    return [mixed_step_reference(model, batch, context + k * batch, longest + k) for k in range(steps)]


def _table(batches: list[float], contexts: list[float], seed: int) -> TableCostModel:
    """The tiny profile with a decode table on the given grids: times rising along both axes
    (as measured ones do), irregular enough that no two cells share a polynomial."""
    rng = np.random.default_rng(seed)
    steps = rng.uniform(1e-5, 1e-3, size=(len(batches), len(contexts)))
    da = np.cumsum(np.cumsum(steps, axis=0), axis=1)
    return TableCostModel(dataclasses.replace(
        read_profile(TINY), da_b=np.array(batches), da_c=np.array(contexts), da=da))


# Grids that exercise every branch: an integer batch grid (rows found by index), a fractional
# one (found by bisection), one starting above batch 1 and a context grid starting above 0
# (steps held below the grid), small enough that runs leave it above (extrapolated).
GRIDS = {
    "integer": ([1.0, 2.0, 3.0, 5.0, 8.0, 13.0], [0.0, 50.0, 120.0, 400.0, 1000.0, 3000.0]),
    "fractional": ([1.0, 1.5, 2.25, 4.0, 9.5], [0.0, 75.5, 300.25, 2000.0]),
    "above one": ([2.0, 3.0, 6.0], [64.0, 256.0, 1024.0, 4096.0]),
}


@pytest.mark.parametrize("grid", sorted(GRIDS))
@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kv=st.lists(st.integers(1, 900), min_size=2, max_size=16),
    steps=st.integers(1, 3 * _NUMPY_SPAN),
)
def test_a_mixed_run_equals_its_steps_priced_one_by_one(grid, seed, kv, steps):
    model = _table(*GRIDS[grid], seed=seed)
    b, c0, m0 = len(kv), sum(kv), max(kv)
    if m0 * b == c0:
        kv[0] += 1  # equal lengths are not a mixed batch
        c0, m0 = sum(kv), max(kv)
    assert model.decode_run_durations(b, c0, steps, m0) == mixed_run_reference(model, b, c0, m0, steps)


@pytest.mark.parametrize(("grid", "kv", "steps", "axis", "point", "seed"), [
    # [100, 4, 4]: C = 108 + 3k reaches column 120 at the last of 5 steps (batch 1.08 -> 1.15)
    ("integer", [100, 4, 4], 5, "context", 120.0, 44),
    # [10, 3, 3]: C/M = (16 + 3k)/(10 + k) reaches row 2 exactly at the last of 5 steps
    ("integer", [10, 3, 3], 5, "batch", 2.0, 4),
    # [10, 1, 1]: C/M = (12 + 3k)/(10 + k) reaches row 1.5 exactly at the last of 3 steps
    ("fractional", [10, 1, 1], 3, "batch", 1.5, 120),
    # [21, 7, 7, 7]: C/M = (42 + 4k)/(21 + k) reaches row 2.25 exactly at the last of 4 steps
    ("fractional", [21, 7, 7, 7], 4, "batch", 2.25, 10),
])
def test_a_run_whose_last_step_lands_on_a_grid_point(grid, kv, steps, axis, point, seed):
    """A run is priced in one go when its last step is still in its first cell; a last step
    exactly on the next column or row is in the next cell (a grid point belongs to the cell
    above it, as `bisect_right` places it). Both cells' polynomials meet there, so they differ
    only in rounding: each case's seed draws a table where the cell below gives other bits."""
    model = _table(*GRIDS[grid], seed=seed)
    b, c0, m0 = len(kv), sum(kv), max(kv)
    last_c, last_m = c0 + (steps - 1) * b, m0 + steps - 1
    assert (last_c if axis == "context" else last_c / last_m) == point
    run = model.decode_run_durations(b, c0, steps, m0)
    assert run == mixed_run_reference(model, b, c0, m0, steps)
    i = bisect_right(model._da_b, last_c / last_m) - 1
    j = bisect_right(model._da_c, last_c) - 1
    below = (i - 1, j) if axis == "batch" else (i, j - 1)
    assert run[-1] != _step_in_cell(model, b, last_c, last_c / last_m, *below)
    assert model.decode_run_durations(b, c0, steps - 1, m0) == run[:-1]  # all in the first cell


@pytest.mark.parametrize("name", ["h20/qwen3-30b-a3b", "h100/qwen2-7b"])
@settings(max_examples=150, deadline=None)
@given(
    kv=st.lists(st.integers(1, 200_000), min_size=2, max_size=300),
    steps=st.integers(1, 400),
)
def test_a_mixed_run_on_a_shipped_profile_equals_its_steps(name, kv, steps):
    model = load_table_profile(name)
    b, c0, m0 = len(kv), sum(kv), max(kv)
    if m0 * b == c0:
        return
    run = model.decode_run_durations(b, c0, steps, m0)
    assert run == mixed_run_reference(model, b, c0, m0, steps)
    assert run == [model.step_time((), b, c0 + k * b, m0 + k) for k in range(steps)]


def test_the_reference_prices_a_hand_checked_step():
    """The bulk-plus-shortfall table da(B, C) = R*C + T*C/B on rows B = 1, 2, 4 and columns
    0 and 10^6 (R = 1e-8, T = 2e-8 s/token). Lengths 300 + 100 + 100: C = 500, M = 300, so
    batch C/M = 5/3, 2/3 of the way from row 1, (R + T) * 500 = 15 us, to row 2,
    (R + T/2) * 500 = 10 us: 15 - 2/3 * 5 = 11.667 us. Plus the tiny profile's fixed part at
    batch 3: 1 ms + tokens(3) 10 ms + seqs(3) 2 ms + 2 ms x 2/99."""
    R, T = 1e-8, 2e-8
    contexts = np.array([0.0, 1e6])
    batches = np.array([1.0, 2.0, 4.0])
    da = np.array([[R * c + T * c / b for c in contexts] for b in batches])
    model = TableCostModel(dataclasses.replace(read_profile(TINY), da_b=batches, da_c=contexts, da=da))
    fixed = 0.001 + 0.010 + 0.002 + 0.002 * 2 / 99
    assert mixed_step_reference(model, 3, 500, 300) == pytest.approx(fixed + 1.5e-5 - 5e-6 * 2 / 3, rel=1e-12)
    assert model.decode_run_durations(3, 500, 1, 300) == [mixed_step_reference(model, 3, 500, 300)]
