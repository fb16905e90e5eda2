"""Mixed fleets (issue 25): one model served by pools of different GPUs, every pool with role
`both`. Cost-based policies price each instance with its own profile and limits.

Two linear pools: `slow` = 10 ms + 1 ms per prefill token, `fast` = 10 ms + 0.5 ms per
prefill token (0.1 ms per decode sequence each)."""

from __future__ import annotations

import pytest

from conftest import LINEAR, make_config, make_trace
from lmsim.policies.disagg import colocated_policy_names
from lmsim.study.compose import build_simulation

SLOW = dict(LINEAR)
FAST = {**LINEAR, "per_prefill_token_s": 0.0005}


def mixed(slow: int = 1, fast: int = 1, **fast_fields):
    return {
        "pools": [
            {"name": "slow", "num_instances": slow, "profile": SLOW},
            {"name": "fast", "num_instances": fast, "profile": FAST, **fast_fields},
        ],
    }


@pytest.mark.parametrize("seed", range(6))
def test_llmd_sends_a_request_to_the_faster_pool(seed):
    # Both instances idle; llmd's estimates: slow 10 + 100 x 1 = 110 ms, fast 10 + 100 x 0.5
    # = 60 ms, so the fast instance (id 1) wins on every seed. Priced with the first pool's
    # profile both would be 110 ms and a seeded coin would decide.
    trace = make_trace([0.0], [100], [1])
    cfg = make_config(cluster=mixed(), router={"policy": "llmd"}, seed=seed)
    r = build_simulation(cfg, trace).run()
    req = r.requests.iloc[0]
    assert req.instance_id == 1
    assert req.ttft_s == pytest.approx(0.060)


def test_llmd_uses_each_pools_batch_limit():
    # The fast pool's budget is 40 tokens: 100 tokens take 3 steps there (10 + 20, 10 + 20,
    # 10 + 10 ms = 80 ms), still faster than the slow pool's one step of 110 ms. With a
    # 20-token budget it takes 5 steps (5 x 10 + 50 = 100 ms) and still wins; with 10, 10
    # steps (100 + 50 = 150 ms) and the slow pool wins.
    trace = make_trace([0.0], [100], [1])
    for budget, where, ttft in ((40, 1, 0.080), (20, 1, 0.100), (10, 0, 0.110)):
        cfg = make_config(cluster=mixed(max_num_batched_tokens=budget), router={"policy": "llmd"})
        req = build_simulation(cfg, trace).run().requests.iloc[0]
        assert (req.instance_id, req.ttft_s) == (where, pytest.approx(ttft))


def test_views_carry_each_instances_pool_and_profile():
    trace = make_trace([0.0], [100], [1])
    sim = build_simulation(make_config(cluster=mixed(2, 1, max_num_seqs=7)), trace)
    views = sim.router.cluster.instances
    assert [v.pool for v in views] == ["slow", "slow", "fast"]
    assert [v.cost_model.per_prefill_token_s for v in views] == [0.001, 0.001, 0.0005]
    assert [v.max_num_seqs for v in views] == [1024, 1024, 7]
    assert sim.policy.ctx.cost_models[2] is views[2].cost_model


COLOCATED = colocated_policy_names()


@pytest.mark.parametrize("policy", COLOCATED)
def test_every_colocated_policy_runs_on_a_mixed_fleet(policy):
    blocks = [list(range(1, 7)), list(range(1, 9)), list(range(20, 26)), list(range(1, 7))]
    trace = make_trace([0.0, 0.01, 0.02, 0.03] * 3, [100, 130, 100, 110] * 3, [5, 3, 8, 2] * 3, blocks * 3)
    r = build_simulation(make_config(cluster=mixed(2, 2), router={"policy": policy}), trace).run()
    assert r.requests.status.astype(str).eq("finished").all()
    assert set(r.requests.instance_id) <= {0, 1, 2, 3}


def test_preble_prices_a_prefix_share_on_each_gpus_own_profile():
    # One 128-token segment routed to both GPUs (2 misses, allocated to 2): each GPU carries
    # 2 x T_g / 2 = T_g, with T_slow = 10 + 128 x 1 = 138 ms and T_fast = 10 + 64 = 74 ms.
    from fakes import FakeContext, cluster_of, hashes, make_policy, make_request
    from lmsim.profile import load_cost_model

    ctx = FakeContext(2)
    ctx.cost_models = [load_cost_model(SLOW), load_cost_model(FAST)]
    p = make_policy("preble", ctx, rebalance=False)
    c = cluster_of(2, ctx=ctx)
    for g in (0, 1):
        req = make_request(160, hashes("sys", 8) + hashes(("r", g), 2, start=8))
        p.choose(req, c)
        p.on_routed(req, g)
    node = p._match_insert(hashes("sys", 8))[1][0]
    assert node.alloc == [0, 1]
    assert (p.share(node, 0), p.share(node, 1)) == (pytest.approx(0.138), pytest.approx(0.074))
