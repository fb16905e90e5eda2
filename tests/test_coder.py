"""The Coder workload: the comparison statistics on a hand-made trace, the generator's
block-id rule, sub-agents and context window, the generator against real-session
statistics (a committed fixture of derived numbers), and the real sessions themselves
when ../shared is present (skipped otherwise)."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from lmsim.errors import TraceError
from lmsim.workload.compare import (
    compare,
    format_comparison,
    session_samples,
    split_tolerance,
    statistics,
    verdicts,
)
from lmsim.workload.formats import load_trace
from lmsim.workload.generators import coder as coder_module
from lmsim.workload.generators import generate
from lmsim.workload.trace import Trace

FIXTURE = Path(__file__).parent / "fixtures" / "coder_real_stats.json"
REPO = Path(__file__).resolve().parents[1]


def real_trace_path() -> Path | None:
    """The shared WEKA file: $LMSIM_SHARED_DIR or the checkout's sibling `shared/`."""
    for base in (os.environ.get("LMSIM_SHARED_DIR"), REPO.parent / "shared"):
        if base:
            p = Path(base) / "traces" / "weka-claude-code" / "claude_code_traces.jsonl.gz"
            if p.exists():
                return p
    return None


def hand_trace() -> Trace:
    """Two sessions, 64-token blocks, rows in arrival order:
    0 s0 main (128 tok, ids 1 2)      3 s1 sub-agent (128, ids 20 21; after row 1)
    1 s1 main (64, id 10)             4 s0 main shrinks to 64 (id 1)
    2 s0 main grows to 192 (1 2 3)    5 s1 main grows to 128 (10 11)"""
    ids = [[1, 2], [10], [1, 2, 3], [20, 21], [1], [10, 11]]
    offsets = np.concatenate(([0], np.cumsum([len(x) for x in ids])))
    return Trace(
        arrival_s=np.array([0.0, 1, 2, 3, 10, 12]),
        input_tokens=np.array([128, 64, 192, 128, 64, 128]),
        output_tokens=np.array([10, 5, 20, 15, 30, 8]),
        hash_offsets=offsets, hash_values=np.concatenate(ids), block_size=64,
        session_id=np.array([0, 1, 0, 1, 0, 1]),
        parent_id=np.array([-1, -1, 0, -1, 2, 1]),
        after_id=np.array([-1, -1, 0, 1, 2, 1]),
        delay_s=np.array([0.0, 0, 5, 1, 7, 2]),
    )  # fmt: skip


def test_statistics_by_hand():
    s = statistics(session_samples(hand_trace()))
    assert s["input_p50"] == 128
    assert s["start_input_p50"] == 96  # sessions open at 128 and 64
    assert s["growth_p50"] == 64  # rows 2 and 5 grow by 64; row 4 shrinks
    assert s["compaction_share"] == pytest.approx(1 / 3)
    assert s["compaction_ratio_p50"] == pytest.approx(64 / 192)
    assert s["output_p50"] == 12.5
    assert s["think_s_p50"] == 3.5  # delays 5, 1, 7, 2
    assert s["requests_per_session_p50"] == 3
    # session 0 sends 6 ids, 3 distinct; session 1 sends 5, 4 distinct
    assert s["miss_ratio_p50"] == pytest.approx((0.5 + 0.8) / 2)
    assert s["miss_ratio_all"] == pytest.approx(7 / 11)
    assert s["subagent_session_share"] == 0.5
    assert s["subagent_row_share"] == pytest.approx(1 / 6)
    assert s["subagent_concurrency_p50"] == 2  # main chain open 1..12 s, sub-agent at 3 s


def test_compare_and_tolerance():
    a = session_samples(hand_trace())
    tol = split_tolerance(a, splits=20)
    # halves of one session each: input p50 is 128 in s0 (128,192,64) and s1 (64,128,128)
    assert tol["input_p50"] == 1.0
    rows = compare(a, a, tol)
    assert all(r.ratio == 1.0 for r in rows if not math.isnan(r.ratio))
    assert all(verdicts(rows).values())
    text = format_comparison(rows, "A", "A")
    assert "13 of 13 statistics indistinguishable" in text


def test_generator_block_rule_and_subagents():
    t = generate("coder", {"num_sessions": 200, "block_size": 64, "max_context_tokens": None}, seed=3)
    assert t.meta["generator_version"] == str(coder_module.VERSION) == "3"
    p = t.parent_id
    rows = np.flatnonzero(p >= 0)
    grows = rows[t.input_tokens[rows] >= t.input_tokens[p[rows]]]
    for r in grows:
        # the prompt starts with every complete block of the previous prompt; the ids
        # after it stand for the previous output and the append
        keep = t.input_tokens[p[r]] // 64
        np.testing.assert_array_equal(t.hash_ids(r)[:keep], t.hash_ids(p[r])[:keep])
        assert len(t.hash_ids(r)) > keep or t.input_tokens[r] < (keep + 1) * 64
    sub_first = np.flatnonzero((p < 0) & (t.after_id >= 0))
    assert len(sub_first) > 0  # sub-agents spawned by a parent step
    assert (t.session_id[t.after_id[sub_first]] == t.session_id[sub_first]).all()
    assert (t.delay_s[sub_first] == 0.5).all()
    parent_ids = {int(t.hash_ids(int(a))[0]) for a in t.after_id[sub_first]}
    assert not parent_ids & {int(t.hash_ids(int(r))[0]) for r in sub_first}  # own prefix


def test_window_compacts():
    capped = generate("coder", {"num_sessions": 40, "max_context_tokens": 65536}, seed=1)
    free = generate("coder", {"num_sessions": 40, "max_context_tokens": None}, seed=1)
    assert capped.input_tokens.max() <= 65536
    assert free.input_tokens.max() > 65536
    assert len(capped) == len(free)  # the window changes sizes, not the steps


def test_generator_against_real_fixture():
    """Seeds 0 and 1 against the committed statistics of the 572 real sessions, with the
    split-half tolerance. Input quantiles and the aggregate miss ratio are known to be
    outside (see the issue note); everything else must be inside."""
    ref = json.loads(FIXTURE.read_text())
    known_off = {"input", "miss_ratio", "miss_ratio_all", "compaction_share"}
    for seed in (0, 1):
        # miss ratios are not checked here, so coarse blocks keep the id arrays small
        g = statistics(session_samples(generate(
            "coder", {"num_sessions": 600, "block_size": 4096, "max_context_tokens": None}, seed=seed)))
        for key, want in ref["statistics"].items():
            stat = key.rsplit("_p", 1)[0] if key[-1].isdigit() else key
            if stat in known_off or stat.startswith("subagent"):
                continue
            r = g[key] / want if want else 1.0
            assert max(r, 1 / r) <= ref["tolerance"][key], (seed, key, g[key], want)


def test_claude_code_error_names_line_and_request(tmp_path: Path):
    ok = {"id": "a", "block_size": 64, "requests": [{"t": 0, "in": 64, "out": 1, "hash_ids": [1]}]}
    bad = {"id": "b", "block_size": 64, "requests": [
        {"t": 0, "in": 64, "out": 1, "hash_ids": [1]},
        {"t": 5, "type": "subagent", "duration_ms": 1000, "requests": [
            {"t": 0, "in": "x", "out": 1, "hash_ids": [1]}]}]}
    path = tmp_path / "s.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(ok) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=r"s.jsonl.gz: line 2: requests\[1\].requests\[0\]: in must be an integer"):
        load_trace(path)
    bad["requests"][1]["requests"][0]["in"] = 0
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(ok) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=r"line 2: requests\[1\].requests\[0\]: in must be >= 1, got 0"):
        load_trace(path)


def test_subagent_starts_at_its_start(tmp_path: Path):
    sess = {"id": "a", "block_size": 64, "requests": [
        {"t": 0, "in": 64, "out": 1, "hash_ids": [1]},
        {"t": 50, "type": "subagent", "duration_ms": 40000, "requests": [
            {"t": 0, "in": 64, "out": 1, "hash_ids": [1]}, {"t": 6, "in": 64, "out": 1, "hash_ids": [1]}]},
        {"t": 60, "in": 128, "out": 1, "hash_ids": [1, 2]}]}  # fmt: skip
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(sess) + "\n")
    t = load_trace(path)
    np.testing.assert_allclose(t.arrival_s, [0, 10, 16, 60])  # logged at 50 s, ran 40 s


@pytest.mark.slow
def test_real_sessions_fit_half_check_other_half():
    """Fit on one random half of the real sessions, generate, compare with the other half."""
    path = real_trace_path()
    if path is None:
        pytest.skip("../shared/traces/weka-claude-code is not here")
    from lmsim.workload.generators.coder_fit import fit_coder, save_calibration

    real = load_trace(path)
    ns = len(np.unique(real.session_id))
    half = np.zeros(ns, dtype=bool)
    half[np.random.default_rng(0).permutation(ns)[: ns // 2]] = True
    samples = session_samples(real)
    tol = split_tolerance(samples)
    cal = Path(os.environ.get("TMPDIR", "/tmp")) / "coder_half.json"
    save_calibration(fit_coder(real, half), cal)
    gen = session_samples(generate("coder", {"num_sessions": 600, "block_size": 64,
                                             "max_context_tokens": None, "calibration": str(cal)}, seed=0))
    other = statistics(samples, ~half)
    mine = statistics(gen)
    inside = {k: max(mine[k] / other[k], other[k] / mine[k]) <= tol[k]
              for k in other if other[k] and mine[k] and not math.isnan(other[k])}
    assert sum(inside.values()) >= 0.8 * len(inside), inside
