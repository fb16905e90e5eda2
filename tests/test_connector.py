"""The KV connector seam (lmsim/engine/connector.py) with a hand-built connector, on the
linear profile: step = 10 ms + 1 ms per prefill token + 0.1 ms per decode sequence.

Load before admission: the request's external blocks are allocated, it waits while others
run, then only the rest is computed. Hold on finish: a finished request's blocks stay in use
until the connector releases them."""

from __future__ import annotations

import pytest

from conftest import make_config, make_trace
from lmsim.engine.clock import ARRIVAL, schedule_at
from lmsim.study.compose import build_simulation


class FixedDelayConnector:
    """Loads every prompt block a request lacks (up to its whole prompt) for requests in
    `load_ids`, `delay_s` after admission; holds `hold_ids` until `release_at` (or at once
    when they finish later)."""

    def __init__(self, sim, *, load_ids=(), delay_s=0.5, hold_ids=(), release_at=1.0):
        self.sim, self.load_ids, self.delay_s = sim, set(load_ids), delay_s
        self.hold_ids, self.release_at = set(hold_ids), release_at
        self.loads: list[tuple[int, int, int, float]] = []

    def external_blocks(self, scheduler, request, local_hit_blocks):
        if request.request_id not in self.load_ids or request.kv_external_blocks:
            return 0
        return request.input_tokens // scheduler.block_size - local_hit_blocks

    def start_load(self, scheduler, request, first_block, num_blocks):
        env = self.sim.env
        self.loads.append((request.request_id, first_block, num_blocks, env.now))
        instance = self.sim.instances[request.instance_id]
        schedule_at(env, env.now + self.delay_s, ARRIVAL, lambda _e: instance.external_ready(request))

    def admitted(self, scheduler, request, hit_blocks):
        pass

    def hold_on_finish(self, scheduler, request):
        if request.request_id not in self.hold_ids:
            return False
        instance = self.sim.instances[request.instance_id]
        at = max(self.sim.env.now, self.release_at)
        schedule_at(self.sim.env, at, ARRIVAL, lambda _e: instance.release_held(request))
        return True


def run(trace, cluster=None, **connector):
    sim = build_simulation(make_config(cluster=cluster or {}), trace)
    conn = FixedDelayConnector(sim, **connector)
    for instance in sim.instances:
        instance.scheduler.connector = conn
    return sim.run(), conn


def test_a_loaded_request_computes_only_its_last_token_after_the_load():
    # 160 tokens = 10 whole blocks, all loaded: 0.5 s of load, then the last token is
    # recomputed (10 + 1 ms) -> first token at 0.511; two decodes of 10.1 ms follow.
    r, conn = run(make_trace([0.0], [160], [3], [list(range(1, 11))]), load_ids=[0])
    req = r.requests.iloc[0]
    assert conn.loads == [(0, 0, 10, 0.0)]
    assert req.ttft_s == pytest.approx(0.511)
    assert req.finished_at == pytest.approx(0.511 + 2 * 0.0101)
    assert (req.cached_tokens, req.first_scheduled_at) == (0, 0.0)


def test_a_partial_last_block_is_computed_after_the_load():
    # 170 tokens: 10 whole blocks loaded, the 10 remaining tokens computed: 10 + 10 ms.
    r, _ = run(make_trace([0.0], [170], [1], [list(range(1, 11))]), load_ids=[0])
    assert r.requests.iloc[0].ttft_s == pytest.approx(0.5 + 0.020)


def test_others_run_while_a_load_is_in_flight_and_loaded_blocks_become_cache_entries():
    # A loads for 0.5 s; B (100 tokens, arrives at 0.1) runs meanwhile: 0.1 + 0.110.
    # C arrives at 1.0 with A's prompt: it hits A's 9 loaded blocks (capped below 160).
    blocks = list(range(1, 11))
    trace = make_trace([0.0, 0.1, 1.0], [160, 100, 160], [1, 1, 1], [blocks, [50, 51, 52, 53, 54, 55], blocks])
    r, _ = run(trace, load_ids=[0])
    a, b, c = (r.requests.iloc[i] for i in range(3))
    assert b.ttft_s == pytest.approx(0.110)
    assert a.ttft_s == pytest.approx(0.511)
    assert c.cached_tokens == 144
    assert c.ttft_s == pytest.approx(0.010 + 0.016)


def test_held_blocks_keep_a_request_that_needs_them_waiting_until_released():
    # 20 blocks. A (160 tokens = 10 blocks, 1 output) ends at 0.17 but is held until 1.0;
    # B (240 tokens = 15 blocks) cannot fit before then: first token at 1.0 + 0.25.
    trace = make_trace([0.0, 0.0], [160, 240], [1, 1])
    r, _ = run(trace, cluster={"num_gpu_blocks": 20}, hold_ids=[0], release_at=1.0)
    a, b = r.requests.iloc[0], r.requests.iloc[1]
    assert a.finished_at == pytest.approx(0.170)
    assert b.first_scheduled_at == pytest.approx(1.0)
    assert b.ttft_s == pytest.approx(1.25)


def test_without_the_hold_the_same_request_starts_when_the_first_ends():
    trace = make_trace([0.0, 0.0], [160, 240], [1, 1])
    r, _ = run(trace, cluster={"num_gpu_blocks": 20})
    assert r.requests.iloc[1].first_scheduled_at == pytest.approx(0.170)


def test_a_load_waits_for_room_and_counts_in_the_waiting_queue():
    # 12 blocks: A (160 tokens, 10 blocks, 5 outputs) runs; B would load 10 blocks and
    # needs them free: it waits until A finishes at 0.17 + 4 x 10.1 ms, then loads 0.5 s.
    trace = make_trace([0.0, 0.01], [160, 160], [5, 1], [list(range(1, 11)), list(range(21, 31))])
    r, conn = run(trace, cluster={"num_gpu_blocks": 12}, load_ids=[1])
    a_end = 0.170 + 4 * 0.0101
    assert r.requests.iloc[0].finished_at == pytest.approx(a_end)
    assert conn.loads[0][3] == pytest.approx(a_end)
    assert r.requests.iloc[1].first_token_at == pytest.approx(a_end + 0.5 + 0.011)


@pytest.mark.parametrize("kwargs", [
    {"load_ids": [0, 2], "delay_s": 0.05},
    {"hold_ids": [0, 1], "release_at": 0.3},
])
def test_fast_forward_changes_nothing_with_a_connector(kwargs):
    # long decodes so that runs form while loads land and holds are released
    blocks = [list(range(1, 11)), [50, 51, 52, 53, 54, 55], list(range(1, 11)), list(range(60, 70))]
    trace = make_trace([0.0, 0.02, 0.03, 0.2], [160, 100, 160, 160], [60, 80, 40, 30], blocks)
    results = []
    for ff in (True, False):
        sim = build_simulation(make_config(cluster={"num_gpu_blocks": 40}, simulation={"fast_forward": ff, "check": True}), trace)
        conn = FixedDelayConnector(sim, **kwargs)
        for instance in sim.instances:
            instance.scheduler.connector = conn
        results.append(sim.run().requests)
    assert results[0].equals(results[1])
    assert results[0].status.astype(str).eq("finished").all()
