"""Routers that see lower KV tiers (issue 26): the cluster view's (GPU, host, disk) overlap
under the exact and events KV views, the tier terms of `dynamo`, `llmd_scorer` and `lmetric`
by hand, and connector composition (MultiConnector)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import LINEAR, make_config, make_trace
from lmsim.engine.connector import MultiConnector, attach_connector
from lmsim.engine.request import Request
from lmsim.policies import POLICIES
from lmsim.policies.base import Policy
from lmsim.profile.base import LinearCostModel
from lmsim.study.compose import build_simulation

A, B = list(range(1, 11)), list(range(100, 115))
EVICT = make_trace([0.0, 1.0, 2.0], [160, 240, 160], [1, 1, 1], [A, B, A])
TIERS = {"host": {"capacity_blocks": 100, "read_bytes_s": 1e9, "write_bytes_s": 1e9}, "kv_bytes_per_token": 1000}


class Recording(Policy):
    """Routes to instance 0 and records each decision's (GPU, host, disk) view."""

    def __init__(self):
        self.seen = []

    def choose(self, request, cluster):
        self.seen.append(cluster.cached_prefix_tokens_by_tier(request))
        return 0


@pytest.mark.parametrize("view", [{}, {"kv_view": "events", "kv_event_delay_s": 0.0}])
def test_the_view_reports_gpu_then_host_overlap(view):
    # At A2's arrival (2.0) A's first block is on the GPU and the 9 others in host memory.
    cfg = make_config(cluster={"num_gpu_blocks": 16, "kv_tiers": TIERS}, router={"policy": "round_robin", "view": view})
    sim = build_simulation(cfg, EVICT)
    policy = Recording()
    policy.bind(sim.policy.ctx)
    sim.router.policy = sim.policy = policy
    sim.run()
    assert policy.seen == [[(0, 0, 0)], [(0, 0, 0)], [(16, 144, 0)]]


def test_without_tiers_the_view_reports_gpu_only():
    sim = build_simulation(make_config(cluster={"num_gpu_blocks": 16}), EVICT)
    request = Request(9, 0.0, 160, 1, A)
    assert not sim.router.cluster.has_kv_tiers
    assert sim.router.cluster.cached_prefix_tokens_by_tier(request) == [(0, 0, 0)]


def fake_cluster(by_tier, load_s=(0.0, 0.0), pending=(0, 0), waiting=(0, 0)):
    cost = LinearCostModel(**{k: v for k, v in LINEAR.items() if k != "kind"})
    instances = [
        SimpleNamespace(
            instance_id=i, batch_size=0, num_waiting=waiting[i], kv_usage=0.0,
            pending_prefill_tokens=pending[i], total_tokens=0, cost_model=cost, max_num_batched_tokens=8192,
            kv_load_time_s=lambda h, d, s=load_s[i]: s,
        )
        for i in range(len(by_tier))
    ]
    return SimpleNamespace(
        instances=instances, block_size=16, now=0.0, has_kv_tiers=True,
        cached_prefix_tokens_by_tier=lambda r: list(by_tier),
        cached_prefix_tokens=lambda r: [g for g, _, _ in by_tier],
    )


def bound(name, **params):
    policy = POLICIES.create(name, params)
    policy.bind(SimpleNamespace(rng=np.random.default_rng(0), block_size=16, max_num_batched_tokens=8192,
                                max_num_seqs=1024, cost_model=None, num_instances=2))
    return policy


def test_dynamo_credits_host_at_075_and_disk_at_025_beyond_the_device_prefix():
    # 160 tokens = 10 blocks. Instance 0: 1 device block + 9 host blocks; instance 1: 2 device
    # blocks + 8 disk blocks. Prefill term (blocks): 0: (160 − 16)/16 − 0.75·9 = 2.25;
    # 1: (160 − 32)/16 − 0.25·8 = 6; both add the request's 10 new active blocks.
    request = Request(0, 0.0, 160, 1, A)
    cluster = fake_cluster([(16, 144, 0), (32, 0, 128)])
    dynamo = bound("dynamo")
    assert dynamo.logits(request, cluster) == [12.25, 16.0]
    assert dynamo.choose(request, cluster) == 0
    dynamo.on_routed(request, 0)
    # active prefill: 160 − (16 + 108) rounded up to whole blocks (7.75 -> 8) = 32
    assert dynamo.active_prefill[0] == 32
    replay = bound("dynamo", disk_cache_hit_weight=0.0)  # the mocker's router ignores disk
    assert replay.logits(request, cluster) == [12.25, 18.0]


def test_llmd_scorer_weights_host_blocks_at_08():
    scorer = bound("llmd_scorer")
    request = Request(0, 0.0, 160, 1, A)
    cluster = fake_cluster([(16, 144, 0), (32, 0, 128)])
    # 1 + 0.8 x 9 = 8.2 and 2 + 1.0 x 8 (disk: llm-d's weight for an unlisted medium) = 10
    assert scorer._matched_blocks(request, cluster, 10) == pytest.approx([8.2, 10.0])
    assert bound("llmd_scorer", disk_weight=0.5)._matched_blocks(request, cluster, 10) == pytest.approx([8.2, 6.0])


def test_lmetric_prices_tier_tokens_by_their_load_time():
    # Instance 0: 16 GPU + 144 host tokens. Computing the 144 at context 16 on the linear
    # profile takes 10 + 144 ms = 0.154 s; a load of 0.077 s is half of that, so they count
    # as 72 prefill tokens: P0 = 0 + 160 − 16 − 72 = 72. Instance 1 holds nothing: P1 = 160.
    lmetric = bound("lmetric")
    request = Request(0, 0.0, 160, 1, A)
    cluster = fake_cluster([(16, 144, 0), (0, 0, 0)], load_s=(0.077, 0.0))
    cached, by_tier = [16, 0], cluster.cached_prefix_tokens_by_tier(request)
    p, bs = lmetric.factors(request, cluster, cached, by_tier)
    assert p == pytest.approx([72.0, 160.0]) and bs == [1, 1]
    # a load slower than recomputing is priced as a miss: P0 = 160 − 16
    slow = fake_cluster([(16, 144, 0), (0, 0, 0)], load_s=(0.5, 0.0))
    assert lmetric.factors(request, slow, cached, by_tier)[0] == pytest.approx([144.0, 160.0])


def test_tier_aware_policies_run_end_to_end_and_differ_from_gpu_only_routing():
    trace = make_trace([0.0, 1.0, 2.0, 2.5], [160, 240, 160, 160], [1, 1, 1, 1], [A, B, A, A])
    for policy in ("dynamo", "lmetric", "llmd_scorer"):
        cfg = make_config(cluster={"num_instances": 2, "num_gpu_blocks": 16, "kv_tiers": TIERS},
                          router={"policy": policy})
        r = build_simulation(cfg, trace).run()
        assert (r.requests.status.astype(str) == "finished").all()


# -- connector composition -----------------------------------------------------------------


class Offer:
    def __init__(self, blocks, hold=False):
        self.blocks, self.hold, self.loads, self.finished = blocks, hold, [], []

    def external_blocks(self, scheduler, request, local_hit_blocks):
        return self.blocks

    def start_load(self, scheduler, request, first_block, num_blocks):
        self.loads.append((request.request_id, first_block, num_blocks))

    def admitted(self, scheduler, request, hit_blocks):
        pass

    def hold_on_finish(self, scheduler, request):
        self.finished.append(request.request_id)
        return self.hold


def test_multi_connector_loads_from_the_first_that_offers_and_tells_all_of_a_finish():
    first, second = Offer(0), Offer(3, hold=True)
    multi = MultiConnector([first, second])
    request = Request(7, 0.0, 160, 1, A)
    assert multi.external_blocks(None, request, 2) == 3
    multi.start_load(None, request, 2, 3)
    assert (first.loads, second.loads) == ([], [(7, 2, 3)])
    assert multi.hold_on_finish(None, request) is True
    assert first.finished == second.finished == [7]
    with pytest.raises(RuntimeError):
        MultiConnector([Offer(1, hold=True), Offer(1, hold=True)]).hold_on_finish(None, request)


def test_attach_connector_composes():
    scheduler = SimpleNamespace(connector=None)
    a, b, c = Offer(0), Offer(0), Offer(0)
    attach_connector(scheduler, a)
    assert scheduler.connector is a
    attach_connector(scheduler, b)
    attach_connector(scheduler, c)
    assert isinstance(scheduler.connector, MultiConnector) and scheduler.connector.connectors == [a, b, c]


def test_tiers_behind_another_connector_load_what_it_does_not_offer():
    # A P/D-like connector that offers nothing here, then the tiers: the host hit still loads.
    cfg = make_config(cluster={"num_gpu_blocks": 16, "kv_tiers": TIERS})
    sim = build_simulation(cfg, EVICT)
    scheduler = sim.instances[0].scheduler
    tiers = scheduler.connector
    scheduler.connector = None
    attach_connector(scheduler, Offer(0))
    attach_connector(scheduler, tiers)
    r = sim.run()
    assert r.requests.iloc[2].ttft_s == pytest.approx(144_000 / 1e9 + 0.011, abs=1e-12)
