"""Fast-forward equivalence: planning runs of decode-only steps as one event must give the
same results, bit for bit, as stepping one at a time, for every policy on every generator.

Sensitivity: `test_equivalence_check_catches_one_shifted_boundary` breaks fast-forward on
purpose (it moves a single intermediate step boundary of one run by 1 ns, which shifts every
later time on that instance) and asserts the comparison below sees the difference. If that
test ever passes with the mutation in place, the equivalence test has lost its teeth.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import make_config, make_trace, simulate
from lmsim.engine.instance import Instance
from lmsim.policies.disagg import colocated_policy_names
from lmsim.study.compose import build_simulation
from lmsim.study.rundir import requests_table
from lmsim.workload.generators import generate
from lmsim.workload.scaling import scale_to_rate

GENERATORS = {
    "chatbot": {"num_requests": 60},
    "agent": {"num_requests": 80},
    "toolagent": {"num_requests": 40},
    "coder": {"num_requests": 40},
    "hotspot": {"num_requests": 40},
}
RATE = {"chatbot": 12.0, "agent": 40.0, "toolagent": 4.0, "coder": 3.0, "hotspot": 3.0}


def _trace(name: str):
    trace = scale_to_rate(generate(name, GENERATORS[name], seed=3), RATE[name])
    # Long outputs only add identical decode steps; capping them keeps the one-step-at-a-time
    # reference fast while leaving plenty of multi-step runs to compare.
    trace.output_tokens = np.minimum(trace.output_tokens, 96)
    return trace


def _requests_bytes(trace, policy: str, fast_forward: bool, engine: str | None = None) -> bytes:
    config = make_config(
        cluster={"num_instances": 4, "profile": "h20/qwen3-30b-a3b", "num_gpu_blocks": 6000, "engine": engine},
        router={"policy": policy},
        simulation={"fast_forward": fast_forward, "check": False},
    )
    results = build_simulation(config, trace).run()
    buffer = io.BytesIO()
    pq.write_table(requests_table(results.requests), buffer)
    return buffer.getvalue()


TRACES: dict[str, object] = {}


def trace_for(name: str):
    if name not in TRACES:
        TRACES[name] = _trace(name)
    return TRACES[name]


@pytest.mark.parametrize("engine", ["vllm-0.11", "vllm-0.33"])
@pytest.mark.parametrize("generator", sorted(GENERATORS))
@pytest.mark.parametrize("policy", colocated_policy_names())
def test_fast_forward_gives_identical_requests(generator: str, policy: str, engine: str):
    trace = trace_for(generator)
    on = _requests_bytes(trace, policy, True, engine)
    off = _requests_bytes(trace, policy, False, engine)
    assert on == off


def test_fast_forward_actually_skips_events():
    trace = trace_for("chatbot")
    config = make_config(
        cluster={"num_instances": 4, "profile": "h20/qwen3-30b-a3b", "num_gpu_blocks": 6000},
        router={"policy": "lmetric"},
        simulation={"check": False},
    )
    on = build_simulation(config, trace).run().summary
    off_cfg = config.model_copy(update={"simulation": config.simulation.model_copy(update={"fast_forward": False})})
    off = build_simulation(off_cfg, trace).run().summary
    assert on["num_steps"] == off["num_steps"]  # the same steps happen...
    assert off["num_step_events"] == off["num_steps"]  # ...one event each without it...
    assert on["num_step_events"] < off["num_steps"] / 3  # ...and far fewer events with it


def test_equivalence_check_catches_one_shifted_boundary(monkeypatch):
    """The mutation: the first multi-step run planned anywhere gets its second step 1 ns
    longer. Everything else is untouched."""
    original = Instance._start_step
    state = {"mutated": False}

    def broken(self):
        started = original(self)
        newest = self._inflight[-1] if self._inflight else None
        if newest is not None and newest.plan.num_steps > 2 and not state["mutated"]:
            state["mutated"] = True
            plan = newest.plan
            plan.durations[1] += 1e-9
            t = newest.starts[0]
            times = [t]
            for d in plan.durations:
                t = t + d
                times.append(t)
            newest.starts = newest.ends = times
            from lmsim.engine.clock import STEP_END, schedule_at

            newest.event = schedule_at(self.env, times[-1], STEP_END, self._step_end)
        return started

    trace = trace_for("chatbot")
    good_on = _requests_bytes(trace, "vllm", True, "vllm-0.11")
    monkeypatch.setattr(Instance, "_start_step", broken)
    bad_on = _requests_bytes(trace, "vllm", True, "vllm-0.11")
    assert state["mutated"]
    assert bad_on != good_on


@pytest.mark.parametrize(("output_tokens", "events"), [(1000, 6), (5000, 8)])
def test_uncut_runs_double_their_cap(output_tokens: int, events: int):
    """One request alone decodes in runs of 64, 128, 256, ... steps (the cap doubles after
    each run that reached it uncut). 1,000 tokens: the prefill step, then 64 + 128 + 256 +
    512 = 960 decode steps at the cap and a last run of 39 that ends at the finish: 6
    events. 5,000 tokens: 1 + (64 + ... + 2048 = 4032) + 967: 8 events. With a fixed cap
    of 64 they would be 17 and 80."""
    trace = make_trace([0.0], [100], [output_tokens])
    summary = simulate(trace).summary
    assert summary["num_steps"] == output_tokens
    assert summary["num_step_events"] == events


def test_a_cut_run_resets_the_cap():
    """An arrival at 3 s (about step 297 of 10.1 ms decode steps) cuts the 256-step run in
    flight. Events: the prefill, runs of 64 and 128, the cut run (4); the step that
    prefills the newcomer beside the decode (5); the step where it samples its second and
    last token (6); then the first request's ~700 remaining steps in runs that start again
    from 64: 64, 128, 256 and a last run that ends at the finish (10)."""
    alone = simulate(make_trace([0.0], [100], [1000])).summary["num_step_events"]
    with_arrival = simulate(make_trace([0.0, 3.0], [100, 100], [1000, 2])).summary
    assert with_arrival["num_steps"] == 1000
    assert with_arrival["num_step_events"] == 10 > alone


def _cache_after_refilling_an_evicted_block(fast_forward: bool):
    """8 blocks of 16 tokens. Request 0 leaves its 7 prompt blocks (hashes 50..56) cached
    in the free queue, head 56, then 55; one block stays content-free. Request 1 (one
    prompt block, 40 outputs, continued by request 2 so its output blocks are named 98 and
    55) then decodes alone: its block 1 evicts 56 and fills as 98, its block 2 evicts 55
    and later fills as 55 again, block 3 evicts 54. Stepping, 55 is gone when it is
    refilled, so it comes back as a fresh entry keyed 55. Fast-forwarded, those decode
    steps are one run whose evictions are deferred, and the refill must apply them first
    or it would find 55 still cached and make a duplicate copy. (vLLM 0.33's free-queue
    order, content-free blocks first.)"""
    trace = make_trace(
        [0.0, 10.0, 100.0],
        [112, 16, 67],
        [1, 40, 1],
        [[50, 51, 52, 53, 54, 55, 56], [100], [100, 98, 55, 77]],
        parent_id=[-1, -1, 1],
    )
    config = make_config(
        cluster={"num_gpu_blocks": 8, "free_queue_order": "content_free_first"},
        simulation={"fast_forward": fast_forward},
    )
    simulation = build_simulation(config, trace)
    summary = simulation.run(stop_at_s=50.0).summary
    cache = simulation.instances[0].cache
    return cache.free_queue(), cache.entries(), cache.num_evictions, summary["num_step_events"]


def test_deferred_evictions_are_applied_before_a_refill_of_an_evicted_hash():
    queue, entries, evictions, events = _cache_after_refilling_an_evicted_block(True)
    # Released tail first: the content-free partial block to the front, 55, 98, 100 last.
    assert queue == [53, 52, 51, 50, 55, 98, 100]
    assert entries[55] == [55]
    assert evictions == 3
    assert events == 3  # request 0's step, request 1's prefill, one run of 39 decode steps
    assert _cache_after_refilling_an_evicted_block(False)[:3] == (queue, entries, evictions)


# -- router views that read instances between step boundaries ----------------------------


def _scraped_snapshot(fast_forward: bool) -> dict:
    """One request (32 prompt tokens, 1,000 outputs) on the linear profile; the router
    scrapes load every 0.1 s. The prefill step takes 0.010 + 32 x 0.001 = 0.042 s, each
    decode step 0.010 + 0.0001 = 0.0101 s, so by the scrape at 0.4 s 35 decode steps have
    completed ((0.4 - 0.042) / 0.0101 = 35.4): 36 tokens sampled, 32 + 36 = 68 tokens in
    context, and the 36th decode step (started at 0.042 + 35 x 0.0101 = 0.3955 s) has its
    KV slot: 68 tokens = 5 blocks of 1,000."""
    config = make_config(
        router={"policy": "round_robin", "view": {"load_view": "scraped", "scrape_interval_s": 0.1}},
        simulation={"fast_forward": fast_forward},
    )
    simulation = build_simulation(config, make_trace([0.0], [32], [1000]))
    simulation.run(stop_at_s=0.45)
    return simulation.adapter._snapshots[0]


def test_a_scrape_reads_an_instance_brought_up_to_date():
    on, off = _scraped_snapshot(True), _scraped_snapshot(False)
    assert on == off
    assert on["total_tokens"] == on["decode_context_tokens"] == 68
    assert on["num_free_blocks"] == 1000 - 5


def _kv_event_log(fast_forward: bool) -> list[tuple[int, bool, float]]:
    """Request 0 (32 prompt tokens = blocks 1, 2; 40 outputs) is continued by request 1,
    whose ids name its output blocks 3 and 4. Its prompt blocks are stored when the prefill
    step is scheduled and published when that step ends (vLLM `Scheduler.update_from_output`
    takes the KV cache manager's events and publishes them): 0.042 s. Output block 3 (tokens
    32-47) fills in the decode step that computes position 47, decode step 16, which ends
    at 0.042 + 16 x 0.0101 = 0.2036 s; block 4 in decode step 32, ending at 0.3652 s. Those
    decode steps are one fast-forwarded run applied when it ends (0.4359 s), which must not
    change their stamps."""
    config = make_config(cluster={"engine": "vllm-0.11"}, simulation={"fast_forward": fast_forward})
    trace = make_trace([0.0, 10.0], [32, 80], [40, 1], [[1, 2], [1, 2, 3, 4, 5]], parent_id=[-1, 0])
    simulation = build_simulation(config, trace)
    log: list[tuple[int, bool, float]] = []
    simulation.policy.ctx.subscribe_kv_events(lambda i, h, stored, t: log.append((h, stored, t)))
    simulation.run(stop_at_s=1.0)
    return log


def test_kv_events_carry_the_time_their_step_published_them():
    on, off = _kv_event_log(True), _kv_event_log(False)
    assert on == off
    assert [(h, stored) for h, stored, _ in on] == [(1, True), (2, True), (3, True), (4, True)]
    assert [t for *_, t in on] == pytest.approx([0.042, 0.042, 0.2036, 0.3652], abs=1e-12)


def test_a_truncated_runs_old_end_after_the_instance_went_idle_is_ignored(monkeypatch):
    """A step may get cheaper when a request joins (the shipped tables' small-batch decode
    term prices a batch of 2 below a batch of 1 at the same total context), so a truncated
    run's original end can come after everything it held has finished.

    Steps cost 10 ms with one sequence and 4 ms with two. A (16-token prompt, 10 outputs):
    prefill 0-0.010, then a fast-forwarded run of its 9 decode steps planned to end at 0.100.
    B (16 tokens, 1 output) arrives at 0.045: the run keeps the steps planned by then (the
    last one ends at 0.050), B's prefill runs beside A's 6th token (0.050-0.054) and A's
    other 4 steps end at 0.054 + 0.040 = 0.094. The run's old end at 0.100 then finds the
    instance idle; it crashed the engine (an empty in-flight queue) before it was ignored."""
    import lmsim.engine.simulation as simulation_module
    from lmsim.profile.base import LinearCostModel

    class CheaperWhenTwo(LinearCostModel):
        def step_time(self, prefill_chunks, num_decodes, decode_context_tokens):
            return 0.010 if num_decodes + len(prefill_chunks) == 1 else 0.004

        def decode_run_times(self, num_decodes, first_context_tokens, num_steps):
            return np.full(num_steps, 0.010 if num_decodes == 1 else 0.004)

    monkeypatch.setattr(simulation_module, "load_cost_model", lambda spec: CheaperWhenTwo(step_base_s=0.010))
    trace = make_trace([0.0, 0.045], [16, 16], [10, 1])
    # the invariant checks hold steps to "a request alone is the cheapest", which this model breaks
    config = make_config(simulation={"check": False})
    records = build_simulation(config, trace).run().requests.set_index("request_id")
    assert records.loc[1, "finished_at"] == pytest.approx(0.054)
    assert records.loc[0, "finished_at"] == pytest.approx(0.094)
