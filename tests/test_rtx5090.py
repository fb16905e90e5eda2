"""The shipped RTX 5090 (lmsim/data/hardware/gpus/rtx5090.yaml): its fitted constants, a decode
step priced by hand, and the calibration path that fitted it (a GPU with end-to-end rows and
no kernel rows of its own, fitted after the shared engine constants)."""

from __future__ import annotations

import pytest
import yaml

from lmsim.profile.analytic import AnalyticModel
from lmsim.profile.calibrate import GroupFit, late_engine_gpus
from lmsim.profile.hardware import GPUS_DIR, load_engines, load_gpu


def test_rtx5090_is_shipped_with_its_fitted_gemm_constants_and_the_l40s_kernels():
    """`profile calibrate` fitted gemm_mfu and weight_stream_eff on the card's own end-to-end
    rows (measurements.csv, gpu rtx5090) and lent the L40S's kernel groups: the attention and
    MoE constants are the L40S's, the GEMM ones are not."""
    rtx, l40s = load_gpu("rtx5090"), load_gpu("l40s")
    assert rtx.efficiency["weight_stream_eff"] == 0.8233
    assert rtx.efficiency["gemm_mfu"] == 1.0  # at the fit's bound: see the yaml's header
    assert rtx.efficiency["weight_stream_eff"] != l40s.efficiency["weight_stream_eff"]
    for key in ("attn_mfu", "kv_read_eff", "attn_launch_per_layer_s", "moe_mfu", "roofline_n"):
        assert rtx.efficiency[key] == l40s.efficiency[key], key
    calibration = yaml.safe_load((GPUS_DIR / "rtx5090.yaml").read_text())["calibration"]
    assert calibration["engine"]["own_fit"].startswith("gemm_mfu, weight_stream_eff on its 5")
    assert {calibration[g]["borrowed_from"] for g in ("gemm", "prefill", "decode", "moe")} == {"l40s"}


def test_a_loan_of_a_loan_keeps_the_first_lenders_moe_exponent():
    """The L40S borrows A100's MoE constants with A100's roofline exponent (2.374); the RTX
    5090 borrows them from the L40S and must keep 2.374, not take the L40S's own GEMM exponent
    (11.52), which those MoE constants were never fitted with."""
    rtx, l40s, a100 = (load_gpu(g).efficiency for g in ("rtx5090", "l40s", "a100"))
    assert rtx["moe_roofline_n"] == l40s["moe_roofline_n"] == a100["roofline_n"] == 2.374
    assert rtx["roofline_n"] == 11.52


def test_rtx5090_qwen3_4b_decode_step_by_hand():
    """Qwen3-4B (36 layers, hidden 2560, 32 q / 8 KV heads of 128, MLP 9728, vocab 151,936) at
    batch 1, context 1024, vLLM v1 on the RTX 5090 (1,792 GB/s; weight_stream_eff 0.8233, so
    1.792e12 x 0.8233 = 1.4753536e12 B/s):

    * dense GEMMs: 2560 x (4096 + 2 x 1024) + 4096 x 2560 + 2560 x 2 x 9728 + 9728 x 2560
      = 100,925,440 weights a layer, x 36 = 3,633,315,840; one row reads 2560 + 4096 + 2560
      + 9728 = 18,944 inputs and writes 6144 + 2560 + 19,456 + 2560 = 30,720 outputs a layer:
      2 B x (3,633,315,840 + 36 x 49,664) = 7,270,207,488 B / 1.4753536e12 = 4.92778 ms,
      + 4 x 36 launches x 0.1 us = 4.94218 ms (the compute side, 2 x W x 64 rows / 209.5e12
      = 2.22 ms, adds 0.001% through the smooth roofline, n = 11.52);
    * lm_head: 2 B x (151,936 x 2560 + 2560 + 151,936) = 778,221,312 B / 1.4753536e12
      = 0.52748 ms, + 0.1 us launch + sampling 0.1 + 0.003 ms = 0.63058 ms;
    * fixed: 36 x (15.37 + 7.253 us) = 0.81443 ms;
    * host: 0.5495 ms (vLLM v1) + 6 us a sequence + 0.05 us a token = 0.55555 ms;
    * decode attention: 1024 x 147,456 B (2 x 36 x 8 x 128 x 2 B) = 151.0 MB at
      0.8234 x 1.792e12, x the engine term 1 + 3.641 / 8 = 1.455: 0.1489 ms, + 36 x 8 x
      16.37 ns per (sequence, KV head) = 0.0047 ms: 0.1536 ms.

    Synchronous step 0.81443 + 4.94218 + 0.63058 + 0.1536 + 0.55555 = 7.0963 ms; with async
    scheduling (vLLM 0.19 and later, engine vllm-v1-async) the host part hides under the GPU:
    6.5407 ms. B2's real TPOT p50 at 1 req/s, 1024-token prompts, is 6.65 ms.
    """
    m = AnalyticModel.build("rtx5090", "qwen3-4b")
    assert float(m.dense(1)) == pytest.approx(4.94218e-3, rel=1e-4)
    assert float(m.lm_head(1)) == pytest.approx(0.63058e-3, rel=1e-4)
    assert m.fixed() == pytest.approx(0.81443e-3, rel=1e-4)
    assert float(m.host(1, 1)) == pytest.approx(0.55555e-3, rel=1e-4)
    assert float(m.decode_attention(1, 1024)) == pytest.approx(0.1536e-3, rel=0.02)
    assert m.step_time((), 1, 1024) == pytest.approx(7.0963e-3, rel=1e-3)
    asynchronous = AnalyticModel.build("rtx5090", "qwen3-4b", engine="vllm-v1-async")
    assert asynchronous.step_time((), 1, 1024) == pytest.approx(6.5407e-3, rel=1e-3)


def test_vllm_019_and_later_rows_are_priced_with_async_scheduling():
    """vLLM turned async scheduling on by default (PR 27614): a row naming vLLM 0.19 or a
    0.2x release is priced max(host, GPU); vLLM 0.10-0.18 rows and unversioned ones stay
    synchronous, as before."""
    engines = load_engines()
    assert engines.for_text("vLLM 0.19.1").key == "vllm-v1-async"
    assert engines.for_text("vLLM 0.22.1").key == "vllm-v1-async"
    assert engines.for_text("vLLM 0.19.1").host_overlap is True
    for text in ("vLLM 0.14.0 (vllm_default: RowParallelLinear, tp 1)", "vLLM (version not stated)",
                 "vLLM 0.14.0-0.24.0 (vllm_default: RowParallelLinear, tp 1)", "vLLM 0.6.3"):
        assert engines.for_text(text).key != "vllm-v1-async", text


def _fit(rows: int, donor: str | None = None) -> GroupFit:
    return GroupFit("g", "group", rows, {}, 0.0, borrowed_from=donor)


def test_only_a_gpu_without_kernel_rows_of_its_own_is_fitted_after_the_shared_engine_constants():
    """H20 has its own decode rows; the L40S borrows its MoE group but fits 2 rows of it; the
    RTX 5090 borrows every group with no row of its own: only it joins late, so its few end-to-end
    rows cannot move the engine constants every other GPU is priced with."""
    fits = {
        "h20": {"decode": _fit(9), "moe": _fit(0, "h100")},
        "l40s": {"gemm": _fit(13), "moe": _fit(2, "a100")},
        "rtx5090": {"gemm": _fit(0, "l40s"), "prefill": _fit(0, "l40s"), "moe": _fit(0, "l40s")},
        "h800": {"gemm": _fit(0, "h100")},
    }
    assert late_engine_gpus(fits, ["h20", "l40s", "rtx5090"]) == ["rtx5090"]
    assert late_engine_gpus(fits, ["h20"]) == []  # h800 has no end-to-end rows: not in the engine fit at all


def test_calibrate_only_names_a_gpu_it_fits_or_exits_2_before_fitting(capsys):
    """`--only` is checked before the ~30 s fit starts: an unknown key is one line and exit 2."""
    from lmsim.cli import main

    assert main(["profile", "calibrate", "--write", "--only", "rtx5090,b300"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lmsim: error: --only: unknown GPU 'b300' (known: h20, h100, h200, h800, a100, l40s, rtx5090)"]
