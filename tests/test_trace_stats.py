"""`trace stats` on hand-computable fixtures, and on the shared Kimi slice (traces.md §3.1)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from lmsim.cli.trace import cmd_stats, register_cli
from lmsim.workload.formats import load_trace
from lmsim.workload.stats import format_stats, trace_stats
from lmsim.workload.trace import Trace

SHARED = Path(__file__).resolve().parents[2] / "shared"


def five() -> Trace:
    ids = [[1, 2, 3], [1, 2, 4], [1, 2, 4, 5], [6, 7], [1, 2, 4, 5]]
    off = np.concatenate(([0], np.cumsum([len(x) for x in ids])))
    return Trace(
        arrival_s=np.array([0.0, 10.0, 30.0, 70.0, 130.0]),
        input_tokens=np.array([40, 40, 50, 20, 60]),
        output_tokens=np.array([1, 2, 3, 4, 5]),
        hash_offsets=off, hash_values=np.concatenate([np.array(x) for x in ids]), block_size=16,
    )  # fmt: skip


def test_five_request_fixture_by_hand():
    s = trace_stats(five())
    assert s["requests"] == 5 and s["span_s"] == 130.0
    assert s["rate_mean_per_s"] == pytest.approx(5 / 130)
    # full minutes [0,60) and [60,120) hold 3 and 1 requests; [120,130] is dropped
    assert (s["rate_per_min_mean"], s["rate_per_min_peak"], s["rate_per_min_min"]) == (2.0, 3, 1)
    assert s["rate_per_min_cv"] == pytest.approx(0.5)
    assert s["busiest_1s"] == 1
    assert s["blocks_total"] == 16 and s["blocks_distinct"] == 7
    # hits: r1 {1,2}, r2 {1,2,4}, r4 {1,2,4,5} -> 9 of 16 entries, all in leading runs
    assert s["ideal_hit_ratio"] == pytest.approx(9 / 16)
    assert s["prefix_hit_ratio"] == pytest.approx(9 / 16)
    assert s["prefix_hit_token_share"] == pytest.approx((32 + 48 + 60) / 210)
    assert s["hit_beyond_first_block"] == pytest.approx(6 / 16)
    assert s["continuation_share"] == pytest.approx(3 / 5)
    assert s["prefix_d1_distinct"] == 2 and s["prefix_d1_top1_share"] == pytest.approx(0.8)
    assert s["prefix_d1_top10_share"] == pytest.approx(1.0)
    assert s["prefix_d8_distinct"] == 0
    # gaps: block 1 and 2: 10, 20, 100; block 4: 20, 100; block 5: 100
    assert s["reuse_gap_p50_s"] == 20.0
    assert s["reuse_within_10s_share"] == pytest.approx(2 / 9)
    assert s["top10pct_block_reuse_share"] == pytest.approx(3 / 9)
    assert s["input_mean"] == 42.0 and s["output_p50"] == 3.0
    assert "ideal hit ratio" in format_stats(s)


def test_non_prefix_hit_differs_from_prefix_hit():
    t = Trace(np.array([0.0, 1.0]), np.array([32, 48]), np.array([1, 1]),
              np.array([0, 2, 5]), np.array([1, 2, 9, 8, 2]), 16)  # fmt: skip
    s = trace_stats(t)
    assert s["ideal_hit_ratio"] == pytest.approx(1 / 5)
    assert s["prefix_hit_ratio"] == 0.0
    assert np.isnan(s["rate_per_min_mean"])


def test_stats_count_linked_guessed_and_refused_continuations(tmp_path, capsys):
    # test_engine_fidelity's shared-prefix trace: row 5 -> 6 by parent_id; rows 1 -> 3 and
    # 2 -> 4 guessed by extension; row 0 (the system prompt alone, extended by both
    # conversations) refused.
    ids = [[1], [1, 2, 3], [1, 4, 5], [1, 2, 3, 6], [1, 4, 5, 7], [8, 9], [8, 9, 10]]
    offsets = np.concatenate(([0], np.cumsum([len(x) for x in ids])))
    trace = Trace(
        np.arange(7.0), np.array([16 * len(x) for x in ids]), np.full(7, 5), offsets,
        np.concatenate([np.array(x) for x in ids]), 16, parent_id=np.array([-1] * 6 + [5]),
    )
    s = trace_stats(trace)
    assert (s["continuations_linked"], s["continuations_inferred"], s["continuations_refused"]) == (1, 2, 1)
    path = tmp_path / "shared.parquet"
    trace.save(path)
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    assert cmd_stats(parser.parse_args(["trace", "stats", str(path)])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["guessed", "by", "prefix", "extension", "2"] for line in lines)
    assert any(line.split() == ["refused", "as", "ambiguous", "1"] for line in lines)


def test_stats_command_json(tmp_path, capsys):
    path = tmp_path / "five.parquet"
    five().save(path)
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    args = parser.parse_args(["trace", "stats", str(path), "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ideal_hit_ratio"] == pytest.approx(0.5625)
    assert cmd_stats(parser.parse_args(["trace", "stats", str(path)])) == 0


def test_kimi_shared_slice_matches_traces_md():
    src = SHARED / "traces" / "mooncake" / "conversation_trace.first40min.jsonl"
    if not src.exists():
        pytest.skip("../shared traces not available")
    s = trace_stats(load_trace(src))
    expected = {  # traces.md §3.1, "Shared (0-2,400 s)" column
        "requests": 7851, "rate_mean_per_s": 3.28, "rate_per_min_mean": 195.3,
        "rate_per_min_p50": 190, "rate_per_min_peak": 247, "rate_per_min_min": 144,
        "busiest_1s": 23, "input_mean": 12428, "input_p50": 7284, "input_p90": 27991,
        "input_p99": 89868, "input_share_gt_32k": 0.072, "output_mean": 347,
        "output_p50": 356, "output_p90": 606, "output_p99": 1168, "blocks_total": 194284,
        "blocks_distinct": 126103, "ideal_hit_ratio": 0.351, "prefix_hit_token_share": 0.358,
        "hit_beyond_first_block": 0.311, "prefix_hit_blocks_p50": 1, "prefix_hit_blocks_p90": 25,
        "prefix_hit_blocks_p99": 101, "continuation_share": 0.315, "reuse_gap_p50_s": 114,
        "reuse_gap_p80_s": 300, "reuse_gap_p90_s": 468, "reuse_gap_p99_s": 963,
        "reuse_within_10s_share": 0.119, "reuse_within_600s_share": 0.954,
        "top10pct_block_reuse_share": 0.757, "prefix_d1_distinct": 1, "prefix_d1_top1_share": 1.0,
        # no links or sessions: every continuation is a guess; 872 of the 2,971 candidates
        # ended their full blocks in the system prompt every row shares (trace.py)
        "continuations_linked": 0, "continuations_inferred": 2094, "continuations_refused": 877,
    }  # fmt: skip
    for key, want in expected.items():
        got = s[key]
        # the document rounds to the digits shown
        tol = 0.5 * 10 ** -max(0, len(str(want).split(".")[1]) if "." in str(want) else 0)
        assert abs(got - want) <= max(tol, 1e-9), (key, got, want)
    assert s["span_s"] == pytest.approx(2397, abs=1)
