"""`lmsim profile fit` and the other CLI handlers: recover a known profile from noisy steps."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import pytest
import yaml

from lmsim.cli.profile import cmd_fit, cmd_generate, cmd_plot, cmd_show
from lmsim.errors import ProfileError
from lmsim.profile.analytic import decode_step_seconds, prefill_seconds
from lmsim.profile.fit import COLUMNS, read_measurements
from lmsim.profile.tables import load_table_profile, read_profile, write_profile

TRUTH = "h20/qwen3-30b-a3b"


def synthetic_steps(model, n: int, rng: np.random.Generator, noise: float) -> list[tuple]:
    """Engine-like steps: decode-only, prefill-only and mixed, priced by `model` plus noise."""
    rows = []
    for _ in range(n):
        kind = rng.choice(["decode", "prefill", "mixed"], p=[0.5, 0.25, 0.25])
        q = c = b = ctx = 0
        if kind != "decode":
            q = int(2 ** rng.uniform(4, 13))
            c = int(rng.choice([0, int(2 ** rng.uniform(7, 15))]))
        if kind != "prefill":
            b = int(2 ** rng.uniform(0, 8))
            ctx = b * int(2 ** rng.uniform(7, 13.5))
        t = model.step_time([(q, c)] if q else [], b, ctx) * float(np.exp(rng.normal(0, noise)))
        rows.append((q, c, b, ctx, t))
    return rows


def write_csv(path: Path, rows) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        w.writerows(rows)
    return path


def distorted_base(tmp_path: Path) -> Path:
    """The true profile with every component wrong by 10-30%: what a fit must undo."""
    data = read_profile(TRUTH)
    data.dense_s = data.dense_s * 1.3
    data.moe_s = data.moe_s * 0.8
    data.cpu_s = data.cpu_s * 1.2
    data.pa = data.pa * 1.25
    data.da = data.da * 0.75
    data.meta["step"] = dict(data.meta["step"], fixed_s=data.fixed_s * 0.9)
    data.name = "test/distorted"
    write_profile(data, tmp_path / "base")
    return tmp_path / "base"


def test_fit_recovers_known_profile_within_5_percent(tmp_path, capsys):
    truth = load_table_profile(TRUTH)
    rng = np.random.default_rng(2024)
    meas = write_csv(tmp_path / "steps.csv", synthetic_steps(truth, 3000, rng, noise=0.02))
    base_dir = distorted_base(tmp_path)
    out = tmp_path / "fitted"
    rc = cmd_fit(argparse.Namespace(measurements=meas, base=str(base_dir), out=out, name=None, overwrite=False))
    assert rc == 0
    printed = capsys.readouterr().out
    assert "fitted" in printed and "base" in printed
    fitted, base = load_table_profile(out), load_table_profile(base_dir)

    # Held-out steps drawn the same way, without noise.
    held = synthetic_steps(truth, 1000, np.random.default_rng(99), noise=0.0)
    err_fit = [abs(fitted.step_time([(q, c)] if q else [], b, x) / t - 1) for q, c, b, x, t in held]
    err_base = [abs(base.step_time([(q, c)] if q else [], b, x) / t - 1) for q, c, b, x, t in held]
    assert np.median(err_base) > 0.08  # the distortion is real
    # The worst held-out steps (5.9%) sit at 560-660 tokens, where vLLM's fused-MoE tile
    # (64 rows above 128 tokens) puts a kink in the MoE time that the distortion (dense x 1.3,
    # MoE x 0.8 in one token-keyed component) turns into one a smooth correction can't follow.
    assert np.median(err_fit) < 0.015 and np.max(err_fit) < 0.065
    # The section 6 style figures inside the measured range come back within 5%.
    for tokens in (512, 1024, 2048, 4096, 8192):
        for cached in (0, 8192):
            assert prefill_seconds(fitted, tokens, cached) == pytest.approx(
                prefill_seconds(truth, tokens, cached), rel=0.05)
    for batch in (1, 8, 32, 64, 128, 256):
        for ctx in (1024, 8192):
            assert decode_step_seconds(fitted, batch, ctx) == pytest.approx(
                decode_step_seconds(truth, batch, ctx), rel=0.05)
    prov = yaml.safe_load((out / "profile.yaml").read_text())["provenance"]
    assert prov["base_profile"] == "test/distorted"
    assert prov["fit_error"]["fitted"]["median_abs_rel_err"] < 0.02
    # Facts (memory, KV) are carried over unchanged.
    assert fitted.num_kv_blocks(16, 0.9) == truth.num_kv_blocks(16, 0.9)


def test_fit_of_the_true_profile_changes_little(tmp_path):
    truth = load_table_profile(TRUTH)
    meas = write_csv(tmp_path / "s.csv", synthetic_steps(truth, 800, np.random.default_rng(5), 0.01))
    cmd_fit(argparse.Namespace(measurements=meas, base=TRUTH, out=tmp_path / "f", name="x/y", overwrite=False))
    fitted = load_table_profile(tmp_path / "f")
    assert fitted.name == "x/y"
    for b in (1, 16, 128):
        assert decode_step_seconds(fitted, b, 2048) == pytest.approx(decode_step_seconds(truth, b, 2048), rel=0.02)


def test_bad_measurements_name_file_and_column(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("prefill_tokens,cached_context,decode_count,step_s\n1,0,0,0.1\n")
    with pytest.raises(ProfileError, match=r"m\.csv: missing column 'decode_context'"):
        read_measurements(p)
    p.write_text(",".join(COLUMNS) + "\n10,0,0,0,abc\n")
    with pytest.raises(ProfileError, match=r"m\.csv: line 2 column 'step_s'"):
        read_measurements(p)
    p.write_text(",".join(COLUMNS) + "\n10,-1,0,0,0.1\n")
    with pytest.raises(ProfileError, match="cached_context"):
        read_measurements(p)


def test_generate_reproduces_the_shipped_tables(tmp_path):
    from lmsim.profile import PROFILES_DIR

    for name in ("h20/qwen2-7b", "h20/qwen3-30b-a3b"):
        rc = cmd_generate(argparse.Namespace(out=tmp_path, only=name, no_plot=True, overwrite=False))
        assert rc == 0
        for table in ("tokens.csv", "seqs.csv", "prefill_attention.csv", "decode_attention.csv"):
            assert (tmp_path / name / table).read_text() == (PROFILES_DIR / name / table).read_text()


def test_show_prints_facts_kv_and_tables(capsys):
    assert cmd_show(argparse.Namespace(name="h20/qwen3-30b-a3b")) == 0
    out = capsys.readouterr().out
    assert "280,144 tokens" in out
    assert "(a) prefill" in out and "(b) decode" in out
    assert "61.2*" in out  # 64 x 8k does not fit in the 280k-token pool


def test_plot_writes_png(tmp_path):
    out = tmp_path / "p.png"
    assert cmd_plot(argparse.Namespace(name="h20/qwen2-7b", out=out, overwrite=False)) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_register_cli_wires_subcommands():
    from lmsim.cli.profile import register_cli

    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["profile", "fit", "m.csv", "--base", "h20/qwen2-7b", "--out", "x"])
    assert args.func is cmd_fit and args.base == "h20/qwen2-7b"
    args = parser.parse_args(["profile", "show", "h20/qwen2-7b"])
    assert args.func is cmd_show


def test_untuned_estimator_can_load_another_model():
    """Section 5 of the issue: a Qwen2-7B profile may predict a Qwen3-30B-A3B cluster."""
    from lmsim.profile import load_cost_model

    engine, estimator = load_cost_model("h20/qwen3-30b-a3b"), load_cost_model("h20/qwen2-7b")
    assert engine.step_time((), 64, 64 * 2048) != estimator.step_time((), 64, 64 * 2048)
