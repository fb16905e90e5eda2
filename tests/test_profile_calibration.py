"""The shipped H20 profiles against costmodel.md: section 5 public data, section 6 tables,
KV capacity and monotonicity. Everything goes through the table predictor."""

from __future__ import annotations

import numpy as np
import pytest

from lmsim.profile.analytic import (
    AnalyticModel,
    decode_step_seconds,
    prefill_seconds,
)
from lmsim.profile.tables import load_table_profile

QWEN2, QWEN3 = "h20/qwen2-7b", "h20/qwen3-30b-a3b"


def test_section5_headline_numbers():
    m = load_table_profile(QWEN3)
    assert prefill_seconds(m, 1024) * 1e3 == pytest.approx(73, rel=0.01)  # measured 78 ms
    assert prefill_seconds(m, 65536) == pytest.approx(15.6, rel=0.01)  # measured 15.2 s


SEC6_PREFILL = {  # (a), ms: tokens 512, 1024, 2048, 4096, 8192
    (QWEN2, 0): (60, 117, 231, 469, 979),
    (QWEN2, 8192): (73, 142, 282, 570, 1180),
    (QWEN3, 0): (44, 73, 133, 266, 607),
    (QWEN3, 8192): (70, 123, 232, 465, 1001),
}
SEC6_DECODE = {  # (b), ms: batch 1, 8, 32, 64, 128, 256
    (QWEN2, 1024): (11.0, 11.2, 11.8, 12.7, 21.9, 40.1),
    (QWEN2, 8192): (11.1, 12.2, 15.7, 20.4, 37.4, 71.1),
    (QWEN3, 1024): (7.4, 13.8, 23.3, 26.5, 30.6, 40.9),
    (QWEN3, 8192): (7.6, 15.5, 29.9, 39.8, 57.1, 94.0),
}
SEC6_MIXED = {  # (e), ms: (decodes at ctx 2048, chunk tokens) -> (Qwen2-7B, Qwen3-30B-A3B)
    (64, 0): (13.8, 28.4), (64, 512): (69.7, 52.0), (64, 2048): (240.8, 140.2),
    (64, 8128): (980.5, 608.3), (200, 0): (35.7, 40.8), (200, 2048): (262.5, 156.6),
}


@pytest.mark.parametrize("key", list(SEC6_PREFILL), ids=lambda k: f"{k[0]}-{k[1]}")
def test_section6a_prefill(key):
    model = load_table_profile(key[0])
    for tokens, expected in zip((512, 1024, 2048, 4096, 8192), SEC6_PREFILL[key]):
        assert prefill_seconds(model, tokens, key[1]) * 1e3 == pytest.approx(expected, rel=0.03)


@pytest.mark.parametrize("key", list(SEC6_DECODE), ids=lambda k: f"{k[0]}-{k[1]}")
def test_section6b_decode(key):
    model = load_table_profile(key[0])
    for batch, expected in zip((1, 8, 32, 64, 128, 256), SEC6_DECODE[key]):
        assert decode_step_seconds(model, batch, key[1]) * 1e3 == pytest.approx(expected, rel=0.03)


def test_section6e_mixed_steps():
    models = load_table_profile(QWEN2), load_table_profile(QWEN3)
    for (b, q), expected in SEC6_MIXED.items():
        chunks = [(q, 0)] if q else []
        for model, ms in zip(models, expected):
            assert model.step_time(chunks, b, b * 2048) * 1e3 == pytest.approx(ms, rel=0.03)


def test_section6c_kv_capacity():
    # 0.9 * 95.58 GiB - weights - 3.0 / 3.5 GiB, in 16-token blocks of 56 / 96 KiB per token
    q2 = load_table_profile(QWEN2).num_kv_blocks(16, 0.9)
    q3 = load_table_profile(QWEN3).num_kv_blocks(16, 0.9)
    assert q2 * 16 == pytest.approx(1.29e6, rel=0.005)
    assert q3 * 16 == pytest.approx(280e3, rel=0.005)
    assert (q2, q3) == (80_555, 17_509)  # the exact block counts of costmodel.md 3.3


@pytest.mark.parametrize("name", [QWEN2, QWEN3, "h100/qwen3-30b-a3b", "h200/qwen2-7b"])
def test_table_matches_formula_within_one_percent(name):
    table, formula = load_table_profile(name), AnalyticModel.named(name)
    rng = np.random.default_rng(11)
    for _ in range(3000):
        chunks = [(int(2 ** rng.uniform(1, 17)), int(2 ** rng.uniform(0, 17)) - 1)
                  for _ in range(int(rng.integers(0, 3)))]
        batch = int(rng.integers(0, 1025)) if rng.random() < 0.8 else 0
        ctx = batch * int(2 ** rng.uniform(0, 17))
        if not chunks and batch == 0:
            batch, ctx = 1, 1
        assert table.step_time(chunks, batch, ctx) == pytest.approx(
            formula.step_time(chunks, batch, ctx), rel=0.01)


@pytest.mark.parametrize("name", [QWEN2, QWEN3])
def test_monotone_in_tokens_batch_and_context(name):
    m = load_table_profile(name)
    tokens = np.unique(np.round(np.geomspace(1, 200_000, 400)).astype(int))
    for cached in (0, 1000, 8192, 100_000):
        t = [m.step_time([(int(q), cached)], 0, 0) for q in tokens]
        assert np.all(np.diff(t) >= 0)
        c = [m.step_time([(512, int(cc))], 0, 0) for cc in tokens]
        assert np.all(np.diff(c) >= 0)
    for per_seq in (1, 1024, 8192, 65536):
        t = [m.step_time((), int(b), int(b) * per_seq) for b in range(1, 1200)]
        assert np.all(np.diff(t) >= 0)
    for b in (1, 7, 64, 300, 1024):
        t = m.decode_run_times(b, b, 2000)
        assert np.all(np.diff(t) >= 0)
        ctx = [m.step_time([(256, 0)], b, int(c)) for c in np.geomspace(b, b * 200_000, 300)]
        assert np.all(np.diff(ctx) >= 0)
    # adding decodes to a step with a prefill chunk never makes it cheaper
    t = [m.step_time([(2048, 4096)], b, b * 2048) for b in range(0, 600)]
    assert np.all(np.diff(t) >= 0)
