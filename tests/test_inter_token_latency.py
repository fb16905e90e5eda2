"""Inter-token latency from the engine's record of every gap between consecutive output
tokens (README "Metric glossary"), by hand on the linear profile (10 ms + 1 ms per prefill
token + 0.1 ms per decode per step), synchronous scheduling (`engine: vllm-0.11`)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_config, make_trace
from lmsim.study.compose import build_simulation


def _run(trace, fast_forward: bool, **cluster):
    config = make_config(cluster={"engine": "vllm-0.11", **cluster}, simulation={"fast_forward": fast_forward})
    simulation = build_simulation(config, trace)
    return simulation, simulation.run()


def test_itl_percentiles_are_those_of_every_gap():
    """A (100-token prompt, 4 outputs) alone: prefill 0.110 s, decode step 1 ends at
    0.1201. B (50 tokens, 3 outputs) arrives at 0.115 and is prefilled in step 2 beside A's
    decode (0.01 + 0.050 + 0.0001 = 0.0601 s, ends 0.1802); step 3 decodes both (0.0102,
    ends 0.1904: A's last token); step 4 decodes B alone (0.0101, ends 0.2005).

    Gaps: A 0.0101, 0.0601 (stretched by B's prefill chunk), 0.0102; B 0.0102, 0.0101.
    Sorted: 0.0101, 0.0101, 0.0102, 0.0102, 0.0601. Mean 0.1007 / 5 = 0.02014; p50 at rank 2
    = 0.0102; p90 at rank 3.6 = 0.0102 + 0.6 x 0.0499 = 0.04014; p99 at rank 3.96 =
    0.0102 + 0.96 x 0.0499 = 0.058104. (Per-request TPOT weighted by tokens, as lmsim
    reported before, would say p90 = A's TPOT (0.1904 - 0.110) / 3 = 0.0268.)"""
    trace = make_trace([0.0, 0.115], [100, 50], [4, 3])
    summaries = [_run(trace, ff)[1].summary for ff in (True, False)]
    for s in summaries:
        assert s["itl_s_mean"] == pytest.approx(0.02014)
        assert s["itl_s_p50"] == pytest.approx(0.0102)
        assert s["itl_s_p90"] == pytest.approx(0.04014)
        assert s["itl_s_p99"] == pytest.approx(0.058104)
    itl = [{k: v for k, v in s.items() if k.startswith("itl")} for s in summaries]
    assert itl[0] == itl[1]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_preempted_request_waits_from_its_last_token_to_its_next(fast_forward):
    """8 blocks of 16 tokens. A (64-token prompt: 4 blocks, 40 outputs) and B (48 tokens:
    3 blocks, 40 outputs) prefill together (112 tokens: 0.122 s). At their first decode
    each needs a new block (A at position 64, B at 48) and 1 is free: A, first in running
    order, takes it, and B, the newest, is preempted with 1 token. B needs 4 blocks for its
    49 tokens and only gets them when A finishes, 39 decode steps of 0.0101 s later
    (0.5159 s). A's two later blocks (positions 80 and 96) took B's two tail blocks, freed
    tail first, so B's first prompt block is still cached: its recompute computes 49 - 16
    = 33 tokens (0.010 + 0.033 s) and samples its second token at 0.5589 s. So B's gap
    across the preemption is 0.5589 - 0.122 = 0.4369 s, the largest recorded; 39 gaps
    each, and every request's gaps add up to its first-to-last-token span."""
    simulation, r = _run(make_trace([0.0, 0.0], [64, 48], [40, 40]), fast_forward, num_gpu_blocks=8)
    gaps = np.frombuffer(simulation.instances[0].itl_gaps)
    counts = np.frombuffer(simulation.instances[0].itl_counts, dtype=np.uint32)
    assert r.summary["num_preemptions"] == 1
    assert r.requests.first_token_at.tolist() == pytest.approx([0.122, 0.122])
    assert gaps.max() == pytest.approx(0.4369)
    assert counts.sum() == 39 + 39
    spans = (r.requests.finished_at - r.requests.first_token_at).sum()
    assert gaps @ counts == pytest.approx(spans)
    assert r.summary["itl_s_mean"] == pytest.approx(spans / 78)
