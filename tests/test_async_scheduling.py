"""Asynchronous scheduling (vLLM 0.33's default, `cluster.async_scheduling`), by hand.

Linear profile: a step costs 10 ms + 1 ms per prefill token, of which `host_step_s` = 4 ms
is host work (`StepCostModel.host_time`). Synchronous steps run back to back. Asynchronous
ones: step M is planned when step M-2 ends (steps N and N+1 back to back on an idle engine),
its host work runs from max(planned, host free) for 4 ms, and its GPU part (the other 6 ms
of a decode step) from max(end of M-1, host work done). See `lmsim.engine.instance`.
"""

from __future__ import annotations

import pytest

from conftest import LINEAR, make_config, make_trace
from lmsim.cli.profile import build_new
from lmsim.profile.tables import TableCostModel
from lmsim.study.compose import build_simulation

HOST = {**LINEAR, "per_decode_seq_s": 0.0, "host_step_s": 0.004}


def _simulate(trace, async_scheduling: bool, stop_at_s: float | None = None, **cluster):
    config = make_config(
        cluster={"profile": HOST, "async_scheduling": async_scheduling, "admission": "first_chunk", **cluster}
    )
    simulation = build_simulation(config, trace)
    return simulation, simulation.run(stop_at_s=stop_at_s)


def test_an_arrival_during_step_n_first_runs_in_step_n_plus_2():
    """A (16-token prompt, 1,000 outputs) alone; B (16 tokens, 2 outputs) arrives at 47 ms.

    Synchronous: the prefill ends at 0.010 + 0.016 = 0.026 s, decode steps every 10 ms
    (0.036, 0.046, 0.056, ...). B arrives during step 3, which ends at 0.056; step 4 prefills
    it beside A's decode (0.026 s): first token at 0.082, TTFT 35 ms.

    Asynchronous: the prefill again ends at 0.026 (an idle engine overlaps nothing). Step 1
    is planned at 0 beside it, its host work done at 0.008, its GPU part from 0.026: 0.032.
    Step 2 is planned at 0.026 (step 0's end), host 0.026-0.030, GPU from 0.032: 0.038; from
    then on a step ends every 6 ms (0.044, 0.050, 0.056), its 4 ms of host work hidden in the
    step before. B arrives during step 4 (0.044-0.050), after step 5 was planned (at 0.044),
    so it joins step 6, planned at 0.050: host 0.050-0.054 (host free since 0.048), GPU from
    step 5's end 0.056 for 0.022 s: first token at 0.078, TTFT 31 ms."""
    trace = make_trace([0.0, 0.047], [16, 16], [1000, 2])
    _, sync = _simulate(trace, False)
    _, overlapped = _simulate(trace, True)
    b_sync, b_async = sync.requests.iloc[1], overlapped.requests.iloc[1]
    assert b_sync.first_scheduled_at == pytest.approx(0.056)
    assert b_sync.first_token_at == pytest.approx(0.082)
    assert b_async.first_scheduled_at == pytest.approx(0.050)
    assert b_async.first_token_at == pytest.approx(0.078)
    assert b_async.ttft_s == pytest.approx(0.031) and b_sync.ttft_s == pytest.approx(0.035)
    # A's decode steps: 10 ms synchronous, 6 ms once the pipeline is full
    a = overlapped.requests.iloc[0]
    assert sync.requests.iloc[0].first_token_at == a.first_token_at == pytest.approx(0.026)
    assert a.tpot_s < sync.requests.iloc[0].tpot_s


def _held_one_step_longer(async_scheduling: bool, stop_at_s: float | None = None):
    """10 blocks. A (96 tokens: 6 blocks, 3 outputs), C (16 tokens, 100 outputs) and B (64
    tokens: 4 blocks) arrive together; A and C prefill in step 0 (112 tokens: 0.122 s), B
    waits (3 blocks free). Decode step 1 gives A its 7th block and C its 2nd: 1 free. A
    samples its last token in step 2."""
    trace = make_trace([0.0, 0.0, 0.0], [96, 16, 64], [3, 100, 2])
    return _simulate(trace, async_scheduling, stop_at_s, num_gpu_blocks=10)


def test_a_request_finishing_in_step_n_holds_its_blocks_while_n_plus_1_is_planned():
    """Synchronous: steps 1, 2 end at 0.132, 0.142; A's blocks come back at 0.142 and step
    3 prefills B beside C's decode (0.074 s): first token at 0.216.

    Asynchronous: steps 1 and 2 are planned at 0 as one run (ending 0.128 and 0.134, as in
    the test above); step 3 is planned at 0.128 while step 2 computes A's last token, so A
    still holds its 7 blocks: only C decodes in step 3 (ends 0.140) and B waits. At 0.134 A
    finishes and step 4 is planned with B: host 0.134-0.138, GPU from 0.140 for 0.070 s:
    first token at 0.210."""
    _, sync = _held_one_step_longer(False)
    _, overlapped = _held_one_step_longer(True)
    assert sync.requests.finished_at.iloc[0] == pytest.approx(0.142)
    assert sync.requests.first_scheduled_at.iloc[2] == pytest.approx(0.142)
    assert sync.requests.first_token_at.iloc[2] == pytest.approx(0.216)
    assert overlapped.requests.finished_at.iloc[0] == pytest.approx(0.134)
    assert overlapped.requests.first_scheduled_at.iloc[2] == pytest.approx(0.134)
    assert overlapped.requests.first_token_at.iloc[2] == pytest.approx(0.210)


def test_the_plan_of_step_n_plus_1_sees_the_blocks_of_a_request_finishing_in_n():
    """Stopped at 0.130, after step 3 was planned (0.128) and before step 2 ends (0.134):
    A is out of the decode batch but running and holding 7 blocks, C holds 2, 1 is free,
    and B waits."""
    simulation, _ = _held_one_step_longer(True, stop_at_s=0.130)
    scheduler = simulation.instances[0].scheduler
    a, c = scheduler.running
    assert a.request_id == 0 and a.retiring and not a.decoding and a.held_blocks == 7
    assert c.decoding and scheduler.num_decoding == 1
    assert scheduler.cache.num_free_blocks == 1
    assert [r.request_id for r in scheduler.waiting] == [2]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_kv_events_of_a_step_planned_ahead_are_published_when_the_step_in_flight_ends(fast_forward):
    """vLLM takes the KV cache manager's events in `update_from_output`: a step planned while
    another runs publishes with that one's end. Request 0 (32 prompt tokens, 40 outputs,
    continued by request 1 whose ids name its output blocks 3 and 4): its prompt blocks are
    stored by step 0, planned on an idle engine: published at its end, 0.042. Block 3 fills
    in decode step 16 (position 47), planned while step 15 runs: published when step 15
    ends. Decode steps end every 6 ms once the pipeline is full: step 1 at 0.048 (host 4 ms
    hidden behind the prefill), step k at 0.042 + 0.006 k, so step 15 at 0.132 and step 31
    (publishing block 4) at 0.228."""
    config = make_config(
        cluster={"profile": HOST, "async_scheduling": True},
        simulation={"fast_forward": fast_forward},
    )
    trace = make_trace([0.0, 10.0], [32, 80], [40, 1], [[1, 2], [1, 2, 3, 4, 5]], parent_id=[-1, 0])
    simulation = build_simulation(config, trace)
    log: list[tuple[int, bool, float]] = []
    simulation.policy.ctx.subscribe_kv_events(lambda i, h, stored, t: log.append((h, stored, t)))
    simulation.run(stop_at_s=1.0)
    assert [(h, stored) for h, stored, _ in log] == [(1, True), (2, True), (3, True), (4, True)]
    assert [t for *_, t in log] == pytest.approx([0.042, 0.042, 0.132, 0.228], abs=1e-12)


def test_a_host_overlap_profile_leaves_no_host_part_to_overlap_again():
    """SGLang's overlap scheduler (`step.host_overlap`) already prices a step as max(host,
    GPU), so async scheduling must not subtract the host part a second time: host_time is 0
    there, and the synchronous profile built for the same model and GPU reports its cpu_s."""
    overlapped, _ = build_new("qwen3-30b-a3b", "h20", engine="sglang-0.4")
    synchronous, _ = build_new("qwen3-30b-a3b", "h20")
    assert TableCostModel(overlapped).host_time(8, 8) == 0.0
    assert TableCostModel(synchronous).host_time(8, 8) > 0.0
