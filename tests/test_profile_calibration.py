"""The shipped H20 profiles: the step priced by hand from the fitted constants, the
costmodel.md section 6 style tables pinned to the current form, KV capacity and monotonicity.
Everything goes through the table predictor.

The constants below are those `lmsim profile calibrate` wrote into
lmsim/data/hardware/gpus/h20.yaml (fit split of the measurement table); the hand arithmetic
uses them, and `test_h20_constants_are_the_ones_priced_by_hand` pins them, so a refit shows
up here as a reviewed change rather than a silent one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmsim.profile.analytic import (
    AnalyticModel,
    decode_step_seconds,
    efficiency_for,
    prefill_seconds,
)
from lmsim.profile.hardware import load_gpu
from lmsim.profile.tables import load_table_profile

QWEN2, QWEN3 = "h20/qwen2-7b", "h20/qwen3-30b-a3b"
H20 = {  # lmsim/data/hardware/gpus/h20.yaml, efficiency
    "gemm_mfu": 0.7008, "weight_stream_eff": 1.0, "roofline_n": 2.0, "gemm_launch_s": 3e-06,
    "kv_read_eff": 0.8158, "attn_launch_per_layer_s": 2.389e-05, "engine_kv_half_units": 5.856,
    "layer_fixed_s": 1.565e-05, "cpu_base_s": 0.0007881,
}
# The decode kernel table (kernel rows only; engine steps use kv_read_eff and the engine term).
H20_KV_TABLE = ((0.7988, 1.379, 1.22), (0.9242, 1.035, 0.8822), (1.083, 0.9917, 0.8907))


def test_h20_constants_are_the_ones_priced_by_hand():
    eff = efficiency_for(load_gpu("h20"))
    for key, value in H20.items():
        assert getattr(eff, key) == pytest.approx(value, rel=1e-9), key
    assert eff.kv_eff_batch == (1.0, 16.0, 256.0) and eff.kv_eff_context == (4096.0, 32768.0, 131072.0)
    assert eff.kv_eff_values == (H20_KV_TABLE,)


def test_qwen2_decode_step_by_hand():
    """Qwen2-7B on H20, one decode at context 1024 (28 layers, 4 KV heads x 128):

    * fixed: 28 x (layer kernels 15.65 + attention launch 23.89 us) = 1.1071 ms;
    * dense GEMMs, W = 28 x 233.05M = 6.5254e9 parameters, M padded to 64 rows:
      compute 2 x 6.5254e9 x 64 / (148e12 x 0.7008) = 8.053 ms, weights 2 x 6.5254e9 / 4e12
      = 3.263 ms, smooth roofline (n = 2) sqrt(8.053^2 + 3.263^2) = 8.689 ms, plus 4 x 28
      GEMM launches of 3 us = 0.336 ms: 9.025 ms;
    * lm_head 152064 x 3584 = 5.450e8: sqrt(0.6726^2 + 0.2725^2) + 0.003 = 0.7287 ms,
      sampling 0.1 + 0.003 ms, host 0.7881 + 0.006 ms: 1.6258 ms;
    * decode attention per layer: 1024 x 2,048 B = 2.097 MB at 4e12 x 0.8158 = 0.6427 us,
      times the engine term 1 + 5.856 / (1 x 4) = 2.464: 1.584 us, smoothed with its compute
      (4 x 28 x 128 x 1024 / (148e12 x 0.5) = 0.198 us): 1.596 us, x 28 = 0.0447 ms.

    Total 1.1071 + 9.025 + 1.6258 + 0.0447 = 11.80 ms."""
    m = load_table_profile(QWEN2)
    parts = m.components((), 1, 1024)
    assert parts["fixed"] * 1e3 == pytest.approx(28 * (15.65 + 23.89) / 1e3, rel=1e-3)
    dense = math.hypot(8.053, 3.263) + 0.336
    assert parts["tokens"] * 1e3 == pytest.approx(dense, rel=2e-3)
    assert parts["seqs"] * 1e3 == pytest.approx(math.hypot(0.6726, 0.2725) + 0.003 + 0.103 + 0.7941, rel=2e-3)
    assert parts["decode_attention"] * 1e3 == pytest.approx(
        28 * math.hypot(0.6427 * (1 + 5.856 / 4), 0.198) / 1e3, rel=3e-3)
    assert m.step_time((), 1, 1024) * 1e3 == pytest.approx(11.80, rel=2e-3)


def test_decode_at_long_context_batch1_is_priced_with_the_engine_term():
    """The issue's headline: batch-1 decode at 100k context. Per layer the KV read is
    100,000 x 2,048 B = 204.8 MB at 4e12 x 0.8158 = 62.76 us, times the engine term 2.464 =
    154.6 us, smoothed with its compute (4 x 28 x 128 x 1e5 / 74e12 = 19.4 us) = 155.8 us;
    x 28 layers = 4.36 ms on top of the 11.76 ms at no context: 16.1 ms. The engine reads the
    KV at an effective 204.8 MB x 28 / 4.36 ms = 1.31 TB/s (the bare kernel at 3.26 TB/s);
    the data say about 1.0 TB/s in SGLang 0.4.6 (issue 23)."""
    m = load_table_profile(QWEN2)
    at_100k = decode_step_seconds(m, 1, 100_000) * 1e3
    assert at_100k - decode_step_seconds(m, 1, 1) * 1e3 == pytest.approx(28 * 0.1558, rel=0.01)
    assert at_100k == pytest.approx(16.12, rel=0.003)


SEC6_PREFILL = {  # ms: tokens 512, 1024, 2048, 4096, 8192 (engine only, budget 8192)
    (QWEN2, 0): (68.9, 134.7, 268.6, 545.5, 1135.3),
    (QWEN2, 8192): (81.2, 159.2, 317.5, 643.0, 1329.5),
    (QWEN3, 0): (47.2, 72.8, 130.8, 266.4, 609.3),
    (QWEN3, 8192): (71.3, 120.7, 226.5, 457.3, 989.8),
}
SEC6_DECODE = {  # ms: batch 1, 8, 32, 64, 128, 256
    (QWEN2, 1024): (11.80, 12.00, 12.67, 13.56, 23.73, 44.58),
    (QWEN2, 8192): (12.12, 13.23, 17.06, 22.17, 40.78, 78.50),
    (QWEN3, 1024): (7.47, 14.61, 25.05, 28.61, 33.06, 46.73),
    (QWEN3, 8192): (8.01, 16.74, 32.67, 43.56, 62.67, 105.65),
}
SEC6_MIXED = {  # ms: (decodes at ctx 2048, chunk tokens) -> (Qwen2-7B, Qwen3-30B-A3B)
    (64, 0): (14.79, 30.75), (64, 512): (80.02, 54.83), (64, 2048): (279.74, 138.68),
    (64, 8128): (1136.83, 611.27), (200, 0): (39.22, 44.34), (200, 2048): (304.60, 156.08),
}


@pytest.mark.parametrize("key", list(SEC6_PREFILL), ids=lambda k: f"{k[0]}-{k[1]}")
def test_section6a_prefill(key):
    model = load_table_profile(key[0])
    for tokens, expected in zip((512, 1024, 2048, 4096, 8192), SEC6_PREFILL[key]):
        assert prefill_seconds(model, tokens, key[1]) * 1e3 == pytest.approx(expected, rel=0.002)


@pytest.mark.parametrize("key", list(SEC6_DECODE), ids=lambda k: f"{k[0]}-{k[1]}")
def test_section6b_decode(key):
    model = load_table_profile(key[0])
    for batch, expected in zip((1, 8, 32, 64, 128, 256), SEC6_DECODE[key]):
        assert decode_step_seconds(model, batch, key[1]) * 1e3 == pytest.approx(expected, rel=0.002)


def test_section6e_mixed_steps():
    models = load_table_profile(QWEN2), load_table_profile(QWEN3)
    for (b, q), expected in SEC6_MIXED.items():
        chunks = [(q, 0)] if q else []
        for model, ms in zip(models, expected):
            assert model.step_time(chunks, b, b * 2048) * 1e3 == pytest.approx(ms, rel=0.002)


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
