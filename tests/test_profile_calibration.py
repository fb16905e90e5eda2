"""The shipped H20 profiles: the step priced by hand from the fitted constants, the
costmodel.md section 6 style tables pinned to the current form, KV capacity and monotonicity.
Everything goes through the table predictor.

The constants below are those `lmsim profile calibrate` wrote into
lmsim/data/hardware/gpus/h20.yaml and lmsim/data/hardware/engines.yaml (fit split of the
measurement table); the hand arithmetic
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
    end_to_end_seconds,
    prefill_seconds,
    tabulate,
)
from lmsim.profile.hardware import load_engine, load_gpu
from lmsim.profile.tables import TableCostModel, load_table_profile

QWEN2, QWEN3 = "h20/qwen2-7b", "h20/qwen3-30b-a3b"
H20 = {  # lmsim/data/hardware/gpus/h20.yaml, efficiency
    "gemm_mfu": 0.7428, "weight_stream_eff": 0.6397, "roofline_n": 2.0, "gemm_launch_s": 3e-06,
    "kv_read_eff": 0.8448, "attn_launch_per_layer_s": 2.398e-05, "engine_kv_half_units": 3.641,
    "layer_fixed_s": 1.537e-05, "attn_mfu": 0.9475, "attn_half_kv": 360.7,
}
# lmsim/data/hardware/engines.yaml, fitted: the host time of each engine
ENGINE_CPU = {"vllm-v1": 0.0005495, "sglang-0.4": 0.001124}
SGLANG_CUDA_CORE_EFF = 0.1283


def test_h20_constants_are_the_ones_priced_by_hand():
    eff = efficiency_for(load_gpu("h20"))
    for key, value in H20.items():
        assert getattr(eff, key) == pytest.approx(value, rel=1e-9), key
    assert eff.kv_eff_heads == (4.0, 8.0)  # one decode-kernel plane per KV-head layout with rows
    assert eff.kv_eff_batch == (1.0, 16.0, 256.0) and eff.kv_eff_context == (4096.0, 32768.0, 131072.0)
    for key, cpu in ENGINE_CPU.items():
        assert efficiency_for(load_gpu("h20"), load_engine(key)).cpu_base_s == pytest.approx(cpu, rel=1e-9)
    sglang = efficiency_for(load_gpu("h20"), load_engine("sglang-0.4"))
    assert sglang.decode_cuda_core_eff == pytest.approx(SGLANG_CUDA_CORE_EFF, rel=1e-9)


def test_qwen2_decode_step_by_hand():
    """Qwen2-7B on H20 (vLLM v1), one decode at context 1024 (28 layers, 28 q / 4 KV heads x 128):

    * fixed: 28 x (layer kernels 15.37 + attention launch 23.98 us) = 1.1018 ms;
    * dense GEMMs, W = 28 x 233.05M = 6.5254e9 parameters, M padded to 64 rows:
      compute 2 x 6.5254e9 x 64 / (148e12 x 0.7428) = 7.598 ms; memory: the weights 2 x
      6.5254e9 B and one row of activations, 28 x (29,696 in + 49,664 out) x 2 B = 4.444 MB
      (QKV, O, gate-up, down: in 3584 + 3584 + 3584 + 18,944, out 4608 + 3584 + 37,888 +
      3584), at 4e12 x 0.6397: 5.102 ms; smooth roofline (n = 2) hypot = 9.152 ms, plus 4 x
      28 GEMM launches of 3 us = 0.336 ms: 9.488 ms;
    * lm_head 152064 x 3584 = 5.450e8 (one row: 3584 in, 152,064 out): hypot(0.6346, 0.4261)
      + 0.003 = 0.7673 ms, sampling 0.1 + 0.003 ms, host (vLLM v1) 0.5495 + 0.006 ms:
      1.4258 ms;
    * decode attention per layer: the KV read, 1024 x 2,048 B = 2.097 MB at 4e12 x 0.8448 =
      0.6206 us, times the engine term 1 + 3.641 / (1 x 4) = 1.9103: 1.1855 us; the compute
      FA3 runs with the 7-head query group padded to a 64-row tile, 4 x 4 x 64 x 128 x 1024 /
      (148e12 x 0.9475) = 0.957 us; hypot 1.524 us, x 28 = 0.0427 ms.

    Total 1.1018 + 9.488 + 1.4258 + 0.0427 = 12.058 ms."""
    m = load_table_profile(QWEN2)
    parts = m.components((), 1, 1024)
    assert parts["fixed"] * 1e3 == pytest.approx(28 * (15.37 + 23.98) / 1e3, rel=1e-3)
    assert parts["tokens"] * 1e3 == pytest.approx(math.hypot(7.598, 5.102) + 0.336, rel=2e-3)
    assert parts["seqs"] * 1e3 == pytest.approx(math.hypot(0.6346, 0.4261) + 0.003 + 0.103 + 0.5555, rel=2e-3)
    assert parts["decode_attention"] * 1e3 == pytest.approx(
        28 * math.hypot(0.6206 * (1 + 3.641 / 4), 0.957) / 1e3, rel=3e-3)
    assert m.step_time((), 1, 1024) * 1e3 == pytest.approx(12.058, rel=2e-3)


def test_decode_at_long_context_batch1_is_priced_with_the_engine_term():
    """The issue's headline: batch-1 decode at 100k context. Per layer the KV read is
    100,000 x 2,048 B = 204.8 MB at 4e12 x 0.8448 = 60.61 us, times the engine term 1.9103 =
    115.77 us; the padded-tile compute 4 x 4 x 64 x 128 x 1e5 / (148e12 x 0.9475) = 93.47 us;
    hypot 148.8 us, x 28 layers = 4.166 ms on top of the 12.02 ms at no context: 16.18 ms.
    The engine reads the KV at an effective 204.8 MB x 28 / 4.166 ms = 1.38 TB/s (the bare
    FlashInfer kernel: 2.8-3.0 TB/s; SGLang 0.4.6 on H20: about 1.0-1.4, issue 23)."""
    m = load_table_profile(QWEN2)
    at_100k = decode_step_seconds(m, 1, 100_000) * 1e3
    assert at_100k - decode_step_seconds(m, 1, 1) * 1e3 == pytest.approx(28 * 0.1488, rel=0.01)
    assert at_100k == pytest.approx(16.18, rel=0.003)


def test_sglang_long_context_decode_step_and_request_by_hand():
    """Qwen3-8B on H20 as SGLang 0.4.6 runs it (FlashInfer; GQA group 4, so the CUDA-core
    decode kernel; host work overlapped). One decode at context 65,536, per layer of 36:
    the KV read 65,536 x 8 x 128 x 4 B = 268.4 MB at 4e12 x 0.8448 = 79.43 us, times the
    engine term 1 + 3.641 / 8 = 1.455: 115.6 us; the CUDA cores compute 4 x 32 x 128 x 65,536
    FLOPs at 0.1283 x 44 TFLOPS: 190.2 us; hypot 222.6 us, x 36 = 8.01 ms of attention.

    The request the Qwen3 speed benchmark ran (63,488-token prompt, 2,048 generated; 58.89 s
    measured): 8 prefill chunks of at most 8,192 tokens, 16.61 s, then 2,047 decode steps
    whose time grows linearly with the context, so they average the step at the middle
    context 64,512, 20.46 ms: 16.61 + 2,047 x 0.02046 = 58.48 s, 0.993 of the measurement."""
    model = AnalyticModel.build("h20", "qwen3-8b", 1, "sglang-0.4")
    per_layer = float(model.kernels.decode_attention(1, 65_536, 32, 8, 128, path="cuda_core")) - 2.398e-05
    assert per_layer * 1e6 == pytest.approx(math.hypot(79.43 * (1 + 3.641 / 8), 190.2), rel=2e-3)
    assert float(model.decode_attention(1, 65_536)) * 1e3 == pytest.approx(36 * 0.2226, rel=3e-3)
    table = TableCostModel(tabulate(model, date="-"))
    ttft = prefill_seconds(table, 63_488)
    middle = table.step_time((), 1, 63_489 + 1_023)
    assert ttft == pytest.approx(16.61, rel=1e-3) and middle * 1e3 == pytest.approx(20.46, rel=1e-3)
    e2e = end_to_end_seconds(table, 63_488, 2_048)
    assert e2e == pytest.approx(ttft + 2_047 * middle, rel=1e-4)
    assert e2e == pytest.approx(58.48, rel=1e-3)
    assert e2e / 58.89 == pytest.approx(1.0, abs=0.10)


def test_tiny_model_pays_the_larger_of_host_and_gpu():
    """Qwen3-0.6B on H20 under SGLang's overlap scheduler: a batch-1 decode at context 1 costs
    max(host, GPU). Host: 1.124 + 0.006 ms = 1.130 ms. GPU: 28 x (15.37 + 23.98) us = 1.102 ms
    of per-layer kernels; GEMMs (0.4404e9 parameters in the layers, 64-row tile; one row of
    28 x (7,168 + 12,288) activations) hypot(0.5128, 0.3447) + 4 x 28 x 3 us = 0.954 ms;
    lm_head (tied 151,936 x 1,024) hypot(0.1811, 0.1217) + 0.003 = 0.221 ms; sampling
    0.103 ms; attention over one token: nanoseconds. About 2.38 ms of GPU time, which hides
    the host's 1.13 ms. Added instead (vLLM v1 semantics) the step would be 3.5 ms; the
    benchmark measured 2.42 ms per token (4.947 s / 2,048)."""
    model = AnalyticModel.build("h20", "qwen3-0.6b", 1, "sglang-0.4")
    host = float(model.host(1, 1))
    assert host * 1e3 == pytest.approx(1.124 + 0.006, rel=1e-3)
    step = model.step_time((), 1, 1)
    gpu = step  # the GPU part wins
    assert gpu > host
    assert step * 1e3 == pytest.approx(1.102 + math.hypot(0.5128, 0.3447) + 0.336 + math.hypot(0.1811, 0.1217)
                                       + 0.003 + 0.103, rel=2e-3)
    assert step * 1e3 == pytest.approx(2.42, rel=0.02)
    table = TableCostModel(tabulate(model, date="-"))
    assert table.step_time((), 1, 1) == pytest.approx(step, rel=1e-3)


SEC6_PREFILL = {  # ms: tokens 512, 1024, 2048, 4096, 8192 (engine only, budget 8192)
    (QWEN2, 0): (65.3, 127.4, 254.0, 516.3, 1076.9),
    (QWEN2, 8192): (77.5, 151.9, 302.9, 613.8, 1271.2),
    (QWEN3, 0): (59.8, 87.9, 143.3, 275.7, 613.9),
    (QWEN3, 8192): (83.9, 135.9, 239.1, 466.7, 994.4),
}
SEC6_DECODE = {  # ms: batch 1, 8, 32, 64, 128, 256
    (QWEN2, 1024): (12.06, 12.35, 13.36, 14.70, 24.79, 46.06),
    (QWEN2, 8192): (12.36, 14.20, 20.57, 29.07, 53.47, 103.36),
    (QWEN3, 1024): (8.06, 17.57, 31.60, 36.60, 42.41, 70.52),
    (QWEN3, 8192): (8.57, 20.74, 43.97, 61.24, 91.57, 168.75),
}
SEC6_MIXED = {  # ms: (decodes at ctx 2048, chunk tokens) -> (Qwen2-7B, Qwen3-30B-A3B)
    (64, 0): (16.76, 40.12), (64, 512): (77.56, 68.54), (64, 2048): (266.29, 153.86),
    (64, 8128): (1080.17, 618.64), (200, 0): (43.09, 76.68), (200, 2048): (293.62, 176.93),
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


def test_decode_kernel_table_applies_only_to_the_head_layouts_it_was_fitted_on():
    """H200's decode-kernel table has one plane, fitted on its 32q/4kv rows (h200.yaml:
    kv_read_eff 0.9125, multiplier 0.6968 at batch 1 and 32k context), so a 4-KV-head kernel
    reads KV at 0.9125 x 0.6968 = 0.6358 of HBM bandwidth there. A 32q/8kv kernel is another
    layout (vLLM's FlashInfer runs 8 KV heads' groups of 4 on CUDA cores, 4 KV heads' groups of
    8 on tensor cores), so it gets the fitted constant alone, 0.9125; borrowing the 4-head
    plane priced h200's 8-head batch-1 rows 24-25% slow."""
    from lmsim.profile.analytic import Kernels

    k = Kernels.named("h200")
    assert k.eff.kv_eff_heads == (4.0,)
    assert float(k.kv_kernel_eff(np.array(1.0), np.array(32768.0), 4)) == pytest.approx(0.9125 * 0.6968, rel=1e-9)
    assert float(k.kv_kernel_eff(np.array(1.0), np.array(32768.0), 8)) == pytest.approx(0.9125, rel=1e-9)
    # H20 has planes for 4 and 8 KV heads: 6 heads lies between them and interpolates
    h20 = Kernels.named("h20")
    vals = np.asarray(h20.eff.kv_eff_values)
    mid = float(h20.kv_kernel_eff(np.array(1.0), np.array(4096.0), 6))
    assert mid == pytest.approx(h20.eff.kv_read_eff * (vals[0, 0, 0] + vals[1, 0, 0]) / 2, rel=1e-9)


def test_fused_moe_streams_expert_weights_at_its_own_efficiency():
    """One token of Qwen3-30B-A3B touches k = 8 experts of 3 x 2048 x 768 = 4,718,592
    parameters: 8 x 4,718,592 x 2 B = 75.50 MB. On A100 (2.039e12 B/s) under the hard knee,
    with moe_stream_eff 0.5 the read takes 75.50e6 / (2.039e12 x 0.5) = 74.05 us (the compute,
    8 experts x 16-row tiles, is about 11 us); unset, the dense GEMMs' weight_stream_eff
    (0.8 here) applies: 46.28 us."""
    from dataclasses import replace

    from lmsim.profile.analytic import Kernels

    gpu = load_gpu("a100")
    base = replace(efficiency_for(gpu), roofline_n=None, moe_launch_s=0.0, weight_stream_eff=0.8,
                   moe_mfu=0.36, moe_half_rows=1.0)
    params = 3 * 2048 * 768
    own = Kernels(gpu, replace(base, moe_stream_eff=0.5)).moe(np.array(1.0), 128, 8, params)
    dense = Kernels(gpu, replace(base, moe_stream_eff=None)).moe(np.array(1.0), 128, 8, params)
    assert float(own) * 1e6 == pytest.approx(8 * params * 2 / (2.039e12 * 0.5) * 1e6, rel=1e-9)
    assert float(own) * 1e6 == pytest.approx(74.05, rel=1e-3)
    assert float(dense) * 1e6 == pytest.approx(46.28, rel=1e-3)


def test_a_borrowed_moe_group_keeps_the_exponent_it_was_fitted_with():
    """L40S has no memory-bound fused_moe fit rows, so it borrows A100's MoE constants; it
    borrows the roofline exponent they were fitted with (A100's n) too, not its own GEMMs'.
    The same one token on A100 as above, with the smooth roofline: read 75.50e6 / (2.039e12 x
    0.5) = 74.05 us against a compute of about 11 us: the knee gives 74.05; the smooth form adds
    more the smaller n is, and with moe_roofline_n set the GPU's roofline_n no longer matters."""
    from dataclasses import replace

    from lmsim.profile.analytic import Kernels

    l40s, a100 = load_gpu("l40s").efficiency, load_gpu("a100").efficiency
    assert l40s["moe_roofline_n"] == a100["roofline_n"] != l40s["roofline_n"]
    gpu = load_gpu("a100")
    base = replace(efficiency_for(gpu), moe_launch_s=0.0, moe_stream_eff=0.5, moe_mfu=0.36, moe_half_rows=1.0)
    params = 3 * 2048 * 768
    knee = Kernels(gpu, replace(base, roofline_n=None)).moe(np.array(1.0), 128, 8, params)
    assert float(knee) * 1e6 == pytest.approx(74.05, rel=1e-3)  # the read dominates the knee
    own_n = Kernels(gpu, replace(base, roofline_n=9.0, moe_roofline_n=2.0)).moe(np.array(1.0), 128, 8, params)
    gpu_n = Kernels(gpu, replace(base, roofline_n=2.0, moe_roofline_n=None)).moe(np.array(1.0), 128, 8, params)
    assert float(own_n) == float(gpu_n)
    steep = Kernels(gpu, replace(base, roofline_n=9.0, moe_roofline_n=None)).moe(np.array(1.0), 128, 8, params)
    assert float(knee) < float(steep) < float(own_n)  # n = 9 is nearly the knee; n = 2 adds more


def test_the_fp8_group_alternative_exponent_prices_and_fits():
    """The alternative form measured and not adopted (profiles/README.md, 'Which form won'):
    an FP8 GEMM priced with its own roofline exponent. H800, M = 512 over a 7168 x 2048 weight,
    with no launch, MFU 0.5 and stream efficiency 0.5: compute 2 x 14.68e6 x 512 / (1979e12 x
    0.5) = 15.19 us, weights 14.68e6 B / (3.35e12 x 0.5) = 8.764 us. n = 1 adds them: 23.95 us;
    n = 2 takes hypot: 17.54 us; unset, the GPU's own n applies. `fit_group(extra=...)` fits it."""
    from dataclasses import replace

    from lmsim.profile.analytic import Kernels
    from lmsim.profile.calibrate import ALTERNATIVES, PARAMS, fit_group
    from lmsim.profile.measurements import Measurement

    gpu = load_gpu("h800")
    base = replace(efficiency_for(gpu), gemm_launch_fp8_s=0.0, gemm_mfu_fp8=0.5, weight_stream_eff_fp8=0.5)
    w = 7168 * 2048
    added = Kernels(gpu, replace(base, roofline_n_fp8=1.0)).gemm(np.array(512.0), w, fp8=True)
    assert float(added) * 1e6 == pytest.approx(15.19 + 8.764, rel=1e-3)
    hyp = Kernels(gpu, replace(base, roofline_n_fp8=2.0)).gemm(np.array(512.0), w, fp8=True)
    assert float(hyp) * 1e6 == pytest.approx(math.hypot(15.19, 8.764), rel=1e-3)
    unset = Kernels(gpu, replace(base, roofline_n_fp8=None)).gemm(np.array(512.0), w, fp8=True)
    gpus_n = Kernels(gpu, replace(base, roofline_n_fp8=base.roofline_n)).gemm(np.array(512.0), w, fp8=True)
    assert float(unset) == float(gpus_n)
    assert "roofline_n_fp8" not in {p[0] for p in PARAMS["gemm_fp8"]}  # not the shipped form

    # rows made by the additive form are fitted back to n near 1 only when the exponent is free
    truth = replace(base, roofline_n_fp8=1.0)
    rows = [Measurement(id=f"m{m}", source="s", gpu="h800", model="", engine="DeepGEMM", dtype="fp8",
                        kind="kernel_gemm", unit="us", condition="",
                        measured=float(Kernels(gpu, truth).gemm(np.array(float(m)), w, fp8=True, inputs_per_row=2048,
                                                                outputs_per_row=7168)) * 1e6,
                        values={"gemm_m": m, "gemm_n": 7168, "gemm_k": 2048, "tp": 1})
            for m in (64, 256, 512, 1024, 4096, 16384)]
    start = replace(base, roofline_n_fp8=None)
    fitted = fit_group("h800", "gemm_fp8", rows, start, only=("roofline_n_fp8",), extra=ALTERNATIVES["gemm_fp8"])
    assert fitted.values["roofline_n_fp8"] == pytest.approx(1.0, abs=0.02)
    assert fitted.rms_log < 1e-3
