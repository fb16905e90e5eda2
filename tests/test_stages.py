"""inference-perf's load ladder: arrival shapes per stage and the stage barrier."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_trace, simulate
from lmsim.engine.stages import StageBarrier, across_stages, stage_summary
from lmsim.errors import ConfigError
from lmsim.workload.ladder import Stage, ladder, parse_stages, stage_meta, stage_offsets


def test_even_stage_is_evenly_spaced():
    """rate 4 for 2 s: int(4 x 2) = 8 requests at (i + 1) x 2 / 8 = 0.25, 0.5, ..., 2.0."""
    times = stage_offsets(np.random.default_rng(0), "even", Stage(4.0, 2.0))
    assert times.tolist() == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]


def test_constant_stage_is_inference_perfs_rescaled_exponential_gaps():
    """inference-perf's ConstantLoadTimer: n = int(2.5 x 4) = 10 exponential gaps rescaled
    to sum to the duration, so the last request lands at exactly 4 s and the gaps are not
    all equal."""
    times = stage_offsets(np.random.default_rng(1), "constant", Stage(2.5, 4.0))
    assert len(times) == 10
    assert times[-1] == pytest.approx(4.0, abs=1e-12)
    gaps = np.diff(np.concatenate(([0.0], times)))
    assert (gaps > 0).all() and gaps.std() > 0.05


def test_poisson_stage_fills_one_second_slots():
    """PoissonLoadTimer: per 1 s slot k ~ Poisson(rate) requests, the k-th at the slot's
    end; exactly int(rate x duration) = int(3 x 5) = 15 are kept. The same draws by hand:
    k for each slot from the same generator, then k exponential gaps."""
    rng = np.random.default_rng(7)
    times = stage_offsets(rng, "poisson", Stage(3.0, 5.0))
    assert len(times) == 15
    by_hand = np.random.default_rng(7)
    slot, ends = 0, []
    while sum(len(e) for e in ends) < 15:
        k = int(by_hand.poisson(3.0))
        if k:
            g = by_hand.exponential(1.0 / k, k)
            ends.append(slot + np.cumsum(g / g.sum()))
        slot += 1
    assert times == pytest.approx(np.concatenate(ends)[:15], abs=1e-12)
    full_slots = np.concatenate(ends)[:15]
    # each complete slot ends with a request at a whole second
    whole = [t for t in full_slots if abs(t - round(t)) < 1e-9 and t > 0]
    assert len(whole) >= 1


def test_ladder_nominal_schedule():
    """Stages 2 req/s x 1 s and 1 req/s x 2 s, interval 1 s, even: stage 0 at 0.5, 1.0;
    stage 1 nominally starts at 1 + 1 = 2 s: requests at 3.0, 4.0."""
    arrival, stage, starts = ladder(np.random.default_rng(0), "even", [Stage(2, 1), Stage(1, 2)], 1.0)
    assert arrival.tolist() == [0.5, 1.0, 3.0, 4.0]
    assert stage.tolist() == [0, 0, 1, 1]
    assert starts == [0.0, 2.0]


def test_stage_specs_are_checked():
    with pytest.raises(ConfigError, match=r"stages\[1\].rate must be"):
        parse_stages([{"rate": 1, "duration": 5}, {"rate": 0, "duration": 5}], where="generator shared_prefix")
    with pytest.raises(ConfigError, match=r"stages\[0\] sends int\(rate x duration\) = 0"):
        parse_stages([{"rate": 0.1, "duration": 5}], where="g")


def _staged_trace(barrier: bool = True):
    # stage 0: offsets 0.0 and 0.1; stage 1 (nominal start 2.0): offset 0.5
    trace = make_trace([0.0, 0.1, 2.5], [10, 10, 10], [2, 2, 2], stage=[0, 0, 1], session_id=[0, 1, 2])
    trace.meta.update(stage_meta([0.0, 2.0], 1.0, barrier))
    return trace


def test_barrier_starts_the_next_stage_after_the_last_request_plus_interval():
    """One instance, linear steps (10 ms + 1 ms per prefill token + 0.1 ms per decode):
    request 0 at 0.0 prefills 10 tokens in 0.020 s (first token) and decodes its second
    token in 0.0101 s: done at 0.0301; request 1 at 0.1 is done at 0.1301. Stage 1 starts
    1 s (the interval) later, at 1.1301, and its request (offset 0.5) arrives at 1.6301
    instead of its nominal 2.5; it is done at 1.6301 + 0.0301 = 1.6602."""
    res = simulate(_staged_trace())
    r = res.requests
    assert r["finished_at"].tolist() == pytest.approx([0.0301, 0.1301, 1.6602], abs=1e-9)
    assert r["arrived_at"].tolist() == pytest.approx([0.0, 0.1, 1.6301], abs=1e-9)
    assert r["stage"].tolist() == [0, 0, 1]


def test_without_the_barrier_stages_keep_their_nominal_times():
    res = simulate(_staged_trace(barrier=False))
    assert res.requests["arrived_at"].tolist() == pytest.approx([0.0, 0.1, 2.5], abs=1e-9)


def test_a_slow_request_holds_the_next_stage():
    """Request 1 of stage 0 generates 100 tokens: 0.020 + 99 x 0.0101 = 1.0199 s after
    0.1, done at 1.1199; stage 1 starts at 2.1199 and its request arrives at 2.6199."""
    trace = make_trace([0.0, 0.1, 2.5], [10, 10, 10], [2, 100, 2], stage=[0, 0, 1], session_id=[0, 1, 2])
    trace.meta.update(stage_meta([0.0, 2.0], 1.0, True))
    res = simulate(trace)
    assert res.requests["arrived_at"].iloc[2] == pytest.approx(2.6199, abs=1e-9)


def test_stage_summary_is_per_stage_as_inference_perf_reports():
    """Stage 0: 2 requests, 4 output tokens over 0.0 .. 0.1301: 4 / 0.1301 tok/s; TTFT
    0.020 each; ITL mean = decode time / gaps = (0.0101 + 0.0101) / 2 = 0.0101; over SSE
    lines (data + empty line a token: 3 gaps a request) 0.0202 / 6."""
    res = simulate(_staged_trace())
    table = stage_summary(res.requests)
    s0 = table.iloc[0]
    assert s0["num_requests"] == 2
    assert s0["output_token_throughput_per_s"] == pytest.approx(4 / 0.1301)
    assert s0["ttft_s_mean"] == pytest.approx(0.020)
    assert s0["itl_s_mean"] == pytest.approx(0.0101)
    # as inference-perf times vLLM's SSE lines: 2 x 0.0101 of decode over 2 x (2 x 2 - 1) gaps
    assert s0["itl_s_mean_sse_lines"] == pytest.approx(0.0202 / 6)
    s1 = table.iloc[1]
    assert s1["output_token_throughput_per_s"] == pytest.approx(2 / 0.0301)
    summary = across_stages(table)
    assert summary["stages_mean_output_token_throughput_per_s"] == pytest.approx((4 / 0.1301 + 2 / 0.0301) / 2)
    assert res.summary["num_stages"] == 2


def test_barrier_skips_stages_left_empty():
    trace = make_trace([0.0, 9.0], [10, 10], [2, 2], stage=[0, 2])
    trace.meta.update(stage_meta([0.0, 4.0, 8.0], 1.0, True))
    barrier = StageBarrier.from_trace(trace)
    assert barrier.start() == [(0.0, 0)]
    assert barrier.on_done(0, 5.0) == [(7.0, 1)]  # starts at 5 + 1, offset 9 - 8 = 1
    assert not barrier.pending


def test_a_ladder_is_not_re_timed():
    from lmsim.workload.scaling import time_scale

    with pytest.raises(ConfigError, match="set the rates in its stages"):
        time_scale(_staged_trace(), 2.0)


def test_a_ladder_is_not_cut_by_start_time():
    from lmsim.workload.scaling import window

    with pytest.raises(ConfigError, match="not cut by start_s"):
        window(_staged_trace(), 1.0, 10.0)
    assert len(window(_staged_trace(), 0.0, 1.0)) == 2  # an end cut keeps stage offsets


def test_closed_loop_rows_are_not_released_twice():
    """Row 1 follows row 0 (after_id) inside stage 0: it arrives once, when row 0 is done
    (0.0301, no think time), not also by the barrier; stage 1 waits only for row 0 (its
    open-loop rows): it starts at 1.0301 and row 2 (offset 0.5) arrives at 1.5301."""
    trace = make_trace([0.0, 0.1, 2.5], [10, 10, 10], [2, 2, 2], stage=[0, 0, 1], session_id=[0, 0, 1],
                       after_id=[-1, 0, -1], delay_s=[0.0, 0.0, 0.0])
    trace.meta.update(stage_meta([0.0, 2.0], 1.0, True))
    res = simulate(trace)
    assert res.summary["num_finished"] == 3
    assert res.requests["arrived_at"].tolist() == pytest.approx([0.0, 0.0301, 1.5301], abs=1e-9)
