"""`lmsim profile check`, `profile new` and `profile predict` (issue 23): mechanics on a small
fixture table, hand-checkable numbers, every named model on every named GPU, and the shipped
check against the issue's bar."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from lmsim.cli import main
from lmsim.cli.profile import build_new, predict_answer, run_check
from lmsim.errors import ProfileError
from lmsim.profile.analytic import Kernels, end_to_end_seconds, prefill_seconds
from lmsim.profile.hardware import load_model, shard
from lmsim.profile.measurements import default_table, read_measurements, split_of
from lmsim.profile.tables import TableCostModel, load_table_profile, validate_profile

FIXTURE = Path(__file__).parent / "fixtures" / "measurements_small.csv"


def test_split_is_a_pure_function_of_the_id():
    # sha256(id)[0] % 3 == 0 -> check: pinned so the rule cannot drift.
    assert split_of("fx-h100-gemm-4096") == "check"
    assert split_of("h20-qwen3-30b-a3b-sglang-e2e-in1") == "fit"
    assert [r.split for r in read_measurements(FIXTURE)] == ["check", "fit", "fit", "check", "check"]


def test_check_predicts_each_row_the_way_its_kind_says():
    preds, summary = run_check([], FIXTURE)
    by_id = {p.row.id: p for p in preds}
    # GEMM 4096^3 on H100 (gpus/h100.yaml: gemm_mfu 0.775, weight_stream_eff 0.7723, n 2.993,
    # launch 1.194 us): compute 2 x 4096^3 / (989e12 x 0.775) = 179.31 us; memory, the weights
    # and the 4096 rows' inputs and outputs, 3 x 2 x 4096^2 B / (3.35e12 x 0.7723) = 38.91 us;
    # (179.31^2.993 + 38.91^2.993)^(1/2.993) = 179.93, + 1.194 = 181.12 us.
    compute, moved = 2 * 4096**3 / (989e12 * 0.775) * 1e6, 3 * 2 * 4096**2 / (3.35e12 * 0.7723) * 1e6
    n = 2.993
    hand = (compute**n + moved**n) ** (1 / n) + 1.194
    assert by_id["fx-h100-gemm-4096"].predicted == pytest.approx(hand, rel=2e-3)
    assert by_id["fx-h100-gemm-4096"].ratio == pytest.approx(hand / 200, rel=2e-3)
    # An end-to-end row goes through a table profile, as the simulator prices steps, built for
    # the engine the row names (SGLang: FlashInfer decode, host overlapped), not the shipped
    # vLLM v1 one.
    e2e = by_id["h20-qwen3-30b-a3b-sglang-e2e-in1"]
    assert e2e.profile == "h20/qwen3-30b-a3b (built, sglang-0.4)"
    sglang, _ = build_new("qwen3-30b-a3b", "h20", engine="sglang-0.4")
    assert sglang.meta["step"]["host_overlap"] is True
    assert e2e.predicted == pytest.approx(end_to_end_seconds(TableCostModel(sglang), 1, 2048))
    shipped = end_to_end_seconds(load_table_profile("h20/qwen3-30b-a3b"), 1, 2048)
    assert abs(e2e.predicted / shipped - 1) > 0.01  # the engine matters
    # No shipped A100 Qwen3-4B: built as `profile new` would, then priced through its tables.
    built = by_id["fx-a100-qwen3-4b-decode-b8"]
    assert built.profile == "a100/qwen3-4b (built)"
    data, _ = build_new("qwen3-4b", "a100")
    assert built.predicted == pytest.approx(TableCostModel(data).step_time((), 8, 8 * 4096) * 1e3)
    # A row lmsim cannot describe is reported, not dropped and not fatal.
    assert by_id["fx-unknown-model"].predicted is None
    assert "unknown model 'foo-9b'" in by_id["fx-unknown-model"].profile
    assert summary["all"]["rows"] == 5 and summary["all"]["answered"] == 4
    assert summary["in_scope"] == summary["all"]  # a table without a scope column: all in scope
    assert summary["fit"]["answered"] + summary["check"]["answered"] == 4
    assert summary["all"]["worst_id"] == "fx-a100-qwen3-4b-decode-b8"


def test_out_of_scope_rows_are_predicted_counted_apart_and_listed_with_all(tmp_path, capsys):
    text = FIXTURE.read_text().splitlines()
    scoped = [text[0], text[1], text[2] + ",scope"]
    for line in text[3:]:
        reason = ',"out: made up: a row lmsim does not model"' if line.startswith("fx-a100-qwen3-4b") else ","
        scoped.append(line + reason)
    table = tmp_path / "scoped.csv"
    table.write_text("\n".join(scoped) + "\n")
    preds, summary = run_check([], table)
    out = [p for p in preds if not p.row.in_scope]
    assert [p.row.id for p in out] == ["fx-a100-qwen3-4b-decode-b8"] and out[0].predicted is not None
    assert summary["all"]["answered"] == 4 and summary["in_scope"]["answered"] == 3
    assert summary["out_of_scope"]["answered"] == 1
    assert summary["fit"]["answered"] + summary["check"]["answered"] == 3
    assert main(["profile", "check", "--measurements", str(table)]) == 0
    printed = capsys.readouterr().out
    assert "fx-a100-qwen3-4b-decode-b8" not in printed.split("* outside")[0]
    assert "out of scope: 1 rows (listed with --all): 1 made up" in printed
    assert main(["profile", "check", "--measurements", str(table), "--all"]) == 0
    assert "out: made up: a row lmsim does not model" in capsys.readouterr().out
    # calibration leaves it out
    from lmsim.profile.measurements import read_measurements as read

    assert [r.id for r in read(table) if not r.in_scope] == ["fx-a100-qwen3-4b-decode-b8"]
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([*scoped[:3], scoped[3].rsplit(",", 1)[0] + ",maybe"]) + "\n")
    with pytest.raises(ProfileError, match=r"bad\.csv: line 4: column 'scope': empty \(in scope\) or 'out: <reason>'"):
        read(bad)


def test_check_with_a_profile_answers_only_its_rows(tmp_path, capsys):
    preds, _ = run_check(["h20/qwen3-30b-a3b"], FIXTURE)
    assert sorted(p.row.id for p in preds) == [
        "h20-infersim-decode-attn-32-4-128-b1-kv131072", "h20-qwen3-30b-a3b-sglang-e2e-in1"]
    assert main(["profile", "check", "h20/qwen3-30b-a3b", "--measurements", str(FIXTURE), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in out["rows"]} == {p.row.id for p in preds}
    assert out["summary"]["all"]["answered"] == 2
    assert main(["profile", "check", "--measurements", str(FIXTURE)]) == 0
    text = capsys.readouterr().out
    assert "fit: 2 rows" in text and "check: 2 rows" in text and "all: 4 rows" in text
    assert "in scope: 4 rows" in text


@pytest.mark.parametrize("gpu", ["a100", "h20", "h800"])
@pytest.mark.parametrize("model", ["qwen2.5-7b", "qwen3-4b", "llama-3-8b", "qwen3-30b-a3b"])
def test_profile_new_and_predict_for_the_issue_models_and_gpus(gpu, model):
    data, _ = build_new(model, gpu)
    table = TableCostModel(data)
    args = argparse.Namespace(prefill=None, decode_batch=None, request=[2048, 256], context=0, budget=8192)
    answer = predict_answer(table, args)
    assert 0 < answer["ttft_s"] < answer["e2e_s"] < 60
    assert answer["e2e_s"] == pytest.approx(answer["ttft_s"] + 255 * answer["tpot_mean_s"])
    assert table.num_kv_blocks(16, 0.9) > 0
    assert data.meta["provenance"]["inputs"]["model"] == model


@pytest.mark.parametrize(("argv", "says"), [
    (["profile", "new", "--model", "qwen9-999b", "--gpu", "h20"], "--model: unknown model 'qwen9-999b'"),
    (["profile", "new", "--model", "qwen3-4b", "--gpu", "b999"], "--gpu: unknown GPU 'b999'"),
    (["profile", "predict", "h20/qwen9-1b", "--request", "100", "10"], "unknown model 'qwen9-1b'"),
    (["profile", "predict", "b999/qwen3-4b", "--request", "100", "10"], "unknown GPU 'b999'"),
])
def test_unknown_model_or_gpu_is_one_line_naming_it(tmp_path, capsys, argv, says):
    if argv[1] == "new":
        argv = [*argv, "--out", str(tmp_path / "p")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err
    assert not (tmp_path / "p").exists()


def test_profile_new_writes_a_valid_profile_and_predict_reads_it(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["profile", "new", "--model", "qwen3-4b", "--gpu", "a100", "--out", str(out), "--no-plot"]) == 0
    assert validate_profile(out) == []
    meta = load_table_profile(out).data.meta
    # Qwen3-4B: 36 layers x (q 2560x4096 + kv 2x2560x1024 + o 4096x2560 + mlp 3x2560x9728 +
    # 2 norms + 2 QK norms x 128) + tied embedding 151936 x 2560 + final norm = 4,022,468,096
    # parameters, 2 B each; KV 2 x 36 x 8 x 128 x 2 = 147,456 B/token.
    assert meta["model"]["weight_bytes"] == 2 * 4_022_468_096
    assert meta["model"]["kv_bytes_per_token"] == 147_456
    capsys.readouterr()
    assert main(["profile", "predict", str(out), "--decode-batch", "4", "--context", "1000"]) == 0
    answer = json.loads(capsys.readouterr().out)
    model = load_table_profile(out)
    assert answer["step_s"] == model.step_time((), 4, 4000)
    assert set(answer["components"]) == {"fixed", "tokens", "seqs", "decode_attention", "prefill_attention"}


def test_predict_answers_by_hand_on_the_shipped_h20_profile(capsys):
    # test_profile_calibration.test_qwen2_decode_step_by_hand: 12.058 ms.
    assert main(["profile", "predict", "h20/qwen2-7b", "--decode-batch", "1", "--context", "1024"]) == 0
    assert json.loads(capsys.readouterr().out)["step_s"] * 1e3 == pytest.approx(12.058, rel=2e-3)
    # another engine builds the profile for it: SGLang overlaps the host's 1.13 ms with the GPU
    assert main(["profile", "predict", "h20/qwen2-7b", "--engine", "sglang-0.4", "--decode-batch", "1",
                 "--context", "1024"]) == 0
    sglang = json.loads(capsys.readouterr().out)
    assert sglang["source"] == "<built by profile new>" and sglang["step_s"] < 12.058e-3
    assert main(["profile", "predict", "h20/qwen2-7b", "--request", "1000", "100"]) == 0
    answer = json.loads(capsys.readouterr().out)
    model = load_table_profile("h20/qwen2-7b")
    assert answer["ttft_s"] == prefill_seconds(model, 1000)
    assert answer["e2e_s"] == pytest.approx(end_to_end_seconds(model, 1000, 100))
    assert main(["profile", "predict", "h20/qwen2-7b", "--prefill", "2048", "--context", "4096"]) == 0
    assert json.loads(capsys.readouterr().out)["step_s"] == model.step_time([(2048, 4096)], 0, 0)
    # an unshipped <gpu>/<model> name is built on the fly
    assert main(["profile", "predict", "l40s/qwen3-8b", "--decode-batch", "2", "--context", "10"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "<built by profile new>"


def test_config_json_dense_moe_and_tensor_parallel(tmp_path):
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
           "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 100,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(path)
    # per layer: q 64x64 + kv 2x64x32 + o 64x64 + 2 QK norms x 16 + 2 norms x 64 + router 64x8
    # + 8 experts x 3 x 64 x 32; then 2 embeddings 100 x 64 and the final norm.
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 32 + 128 + 64 * 8 + 8 * 3 * 64 * 32
    assert m.weight_bytes == 2 * (2 * per_layer + 2 * 100 * 64 + 64)
    assert (m.experts, m.experts_per_token, m.moe_intermediate_size, m.intermediate_size) == (8, 2, 32, 0)
    rank = shard(m, 2)
    assert (rank.attention_heads, rank.kv_heads, rank.moe_intermediate_size, rank.vocab_size) == (2, 1, 16, 50)
    with pytest.raises(ProfileError, match="divide the 4 attention heads"):
        shard(m, 3)
    del cfg["num_hidden_layers"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(ProfileError, match=r"config\.json: missing field 'num_hidden_layers'"):
        load_model(path)


def test_tensor_parallel_prices_the_all_reduce():
    """Two all-reduces per layer of T x hidden x 2 B: at TP 2 on H800 (200 GB/s per direction,
    achieved 0.7, latency 10 us) 8192 tokens of Llama-3-8B move 8192 x 4096 x 2 = 67.1 MB per
    all-reduce: 10 us + 2 x 1/2 x 67.1e6 / 140e9 = 489.3 us; x 64 = 31.3 ms."""
    one = build_new("llama-3-8b", "h800", 2)[1]
    m = one.model
    inputs, outputs = m.dense_activations_per_layer
    comm = float(one.dense(8192)) - float(one.kernels.gemm(8192, m.layers * m.dense_params_per_layer,
                                                           launches=4 * m.layers, inputs_per_row=m.layers * inputs,
                                                           outputs_per_row=m.layers * outputs))
    assert comm * 1e3 == pytest.approx(64 * (10e-6 + 67.108864e6 / 140e9) * 1e3, rel=1e-6)


def test_gemm_memory_side_moves_weights_and_activation_rows():
    """H800 FP8, M=128, N=7168, K=2048, hard knee, 50% of peak and of bandwidth: the kernel
    moves 7168 x 2048 x 1 B of weights + 128 x 2048 x 1 B of inputs + 128 x 7168 x 2 B of
    outputs = 14,680,064 + 262,144 + 1,835,008 = 2^24 B, 16,777,216 / (3.35e12 x 0.5) =
    10.016 us, above the compute 2 x 128 x 7168 x 2048 / (1.979e15 x 0.5) = 3.80 us. The
    weights-only form moves 14,680,064 B: 8.764 us."""
    k = Kernels.named("h800")
    eff = replace(k.eff, roofline_n=None, gemm_mfu_fp8=0.5, weight_stream_eff_fp8=0.5, gemm_launch_fp8_s=0.0)
    both = Kernels(k.gpu, eff).gemm(128, 7168.0 * 2048, fp8=True, inputs_per_row=2048, outputs_per_row=7168)
    assert float(both) * 1e6 == pytest.approx(2**24 / 1.675e12 * 1e6, rel=1e-12)
    alone = Kernels(k.gpu, replace(eff, gemm_moves_activations=False)).gemm(
        128, 7168.0 * 2048, fp8=True, inputs_per_row=2048, outputs_per_row=7168)
    assert float(alone) * 1e6 == pytest.approx(14_680_064 / 1.675e12 * 1e6, rel=1e-12)


def test_gemm_memory_side_switch_must_be_a_boolean():
    from lmsim.profile.analytic import Efficiency

    assert Efficiency.from_mapping({"gemm_moves_activations": False}, "spec").gemm_moves_activations is False
    with pytest.raises(ProfileError, match=r"^my GPU spec: field 'efficiency.gemm_moves_activations' must be "
                                           r"true or false, got 'yes'$"):
        Efficiency.from_mapping({"gemm_moves_activations": "yes"}, "my GPU spec")


def test_dense_activations_per_layer_by_hand():
    """Llama-3-8B (hidden 4096, 32 q / 8 KV heads of 128, MLP 14,336): a token reads the
    hidden state in QKV (4096), the attention output in O (4096), the hidden state again in
    the fused gate-up (4096) and the MLP state in down (14,336); it writes q+k+v (4096 + 2 x 1024), the hidden (4096), gate and up (2 x 14,336)
    and the hidden (4096). At TP 2 every sharded width halves."""
    m = load_model("llama-3-8b")
    assert m.dense_activations_per_layer == (4096 + 4096 + 4096 + 14336, 6144 + 4096 + 28672 + 4096)
    assert shard(m, 2).dense_activations_per_layer == (4096 + 2048 + 4096 + 7168, 3072 + 4096 + 14336 + 4096)


SHIPPED_TABLE = default_table()


def _shipped_summary():
    preds, summary = run_check([], SHIPPED_TABLE)
    long_h20 = [p for p in preds if p.row.gpu == "h20" and p.row.kind == "e2e_b1"
                and (p.row.get("input_tokens") or 0) >= 30_000 and p.ratio is not None]
    return summary, long_h20


@pytest.mark.skipif(not SHIPPED_TABLE.is_file(), reason="no measurement table shipped in this checkout")
def test_shipped_check_does_not_regress():
    """The level the shipped form reached when it was fitted (profiles/README.md); a change
    that loses ground fails here."""
    summary, long_h20 = _shipped_summary()
    s = summary["in_scope"]
    assert summary["all"]["answered"] >= 0.95 * summary["all"]["rows"]
    assert summary["out_of_scope"]["rows"] == 38  # each with its reason in the scope column
    assert s["within_10pct"] >= 443  # 443 of 501 (88.4%) when fitted (437 of 495 before the RTX 5090's 6 rows)
    assert summary["check"]["within_10pct"] >= 144  # 144 of 174 rows never fitted on
    assert all(math.isfinite(p.ratio) for p in long_h20)


@pytest.mark.skipif(not SHIPPED_TABLE.is_file(), reason="no measurement table shipped in this checkout")
def test_shipped_check_meets_the_issue_bar():
    """Issue 23: at least 85% of the in-scope public points within 10%, none beyond 25%, and
    every H20 long-context end-to-end row (prompts of 30k tokens and more) within 10%."""
    summary, long_h20 = _shipped_summary()
    assert summary["in_scope"]["share_within_10pct"] >= 0.85
    assert summary["in_scope"]["beyond_25pct"] == 0
    assert len(long_h20) == 20
    assert all(abs(p.ratio - 1) <= 0.10 for p in long_h20)
