"""The README's quick start: the bundled experiment runs, and twice gives byte-identical
per-request results."""

from __future__ import annotations

import json
from pathlib import Path

from lmsim.cli import main

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"


def test_quickstart_runs_and_is_deterministic(tmp_path: Path, capsys) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["run", str(QUICKSTART), "--out", str(first)]) == 0
    assert main(["run", str(QUICKSTART), "--out", str(second), "--no-figure"]) == 0
    out = capsys.readouterr().out
    assert "quickstart: policy vllm, 1000/1000 finished" in out
    assert (first / "requests.parquet").read_bytes() == (second / "requests.parquet").read_bytes()
    assert (first / "instances.parquet").read_bytes() == (second / "instances.parquet").read_bytes()
    assert (first / "cdf.png").exists() and not (second / "cdf.png").exists()
    summary = json.loads((first / "summary.json").read_text())
    assert summary["num_requests"] == 1000 and summary["num_finished"] == 1000
    for key in ("ttft_s_mean", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_s_mean", "e2e_s_p99",
                "prefix_hit_ratio", "sim_time_s", "wall_time_s"):
        assert summary[key] is not None
