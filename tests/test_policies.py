"""Each policy on a hand-built 3-instance state, picking what its policies.md section says,
including cases where a naive implementation would differ (ties, thresholds crossed by
exactly one, empty instances)."""

from __future__ import annotations

import math

import pytest

from fakes import (
    BLOCK,
    FakeContext,
    cluster_of,
    hashes,
    make_policy,
    make_request,
    route,
)
from lmsim.errors import ConfigError
from lmsim.policies import POLICIES


def request_with_prefix(tag, shared_blocks, total_tokens, **kw):
    """A request whose first `shared_blocks` blocks are stream `tag`, the rest unique."""
    req = make_request(total_tokens, **kw)
    n = total_tokens // BLOCK
    req.block_hashes = hashes(tag, shared_blocks) + req.block_hashes[shared_blocks:n]
    return req


def seeds_choices(name, cluster, request, n_seeds=40, **params):
    return {make_policy(name, FakeContext(seed=s), **params).choose(request, cluster)
            for s in range(n_seeds)}


# ---------------------------------------------------------------- registry / bad input
def test_every_issue_policy_is_registered():
    for name in ["vllm", "bailian", "dynamo", "aibrix", "llmd", "llmd_scorer", "sglang",
                 "preble", "polyserve", "lmetric", "lmetric_hotspot", "round_robin",
                 "random", "least_tokens"]:
        assert name in POLICIES.names()


@pytest.mark.parametrize(
    ("name", "params", "needle"),
    [
        ("bailian", {"lambda": 1.5}, "policy 'bailian': param 'lambda' must be in [0, 1], got 1.5"),
        ("bailian", {"lambda": "high"}, "param 'lambda' must be a number, got 'high'"),
        ("bailian", {"normalize": "sum"}, "param 'normalize' must be one of max|minmax"),
        ("aibrix", {"imbalance_abs_count": -1}, "param 'imbalance_abs_count' must be >= 0"),
        ("aibrix", {"imbalance_abs_count": 2.5}, "must be an integer"),
        ("sglang", {"balance_abs_threshold": -3}, "param 'balance_abs_threshold' must be >= 0"),
        ("sglang", {"cache_threshold": 2}, "param 'cache_threshold' must be in [0, 1]"),
        ("vllm", {"w_wait": -4}, "policy 'vllm': param 'w_wait' must be >= 0, got -4"),
        ("vllm", {"stale_view_s": True}, "param 'stale_view_s' must be a number, got True"),
        ("dynamo", {"temperature": -0.1}, "param 'temperature' must be >= 0"),
        ("dynamo", {"track_active_blocks": "yes"}, "must be true or false"),
        ("lmetric", {"p_token": "total"}, "param 'p_token' must be one of request|instance_total"
         .replace("request|instance_total", "instance_total|request")),
        ("lmetric_hotspot", {"window_s": 0}, "param 'window_s' must be > 0, got 0"),
        ("lmetric_hotspot", {"top_k": 0}, "param 'top_k' must be >= 1"),
        ("llmd", {"noise_rel": -1}, "param 'noise_rel' must be >= 0"),
        ("polyserve", {"default_slo_class": 3}, "param 'default_slo_class' must be in [0, 0]"),
        ("polyserve", {"slo_classes": [{"ttft_s": 1}]}, "param 'slo_classes' entries"),
        ("preble", {"th_bal": 0.5}, "param 'th_bal' must be >= 1"),
    ],
)
def test_bad_parameters_give_one_line(name, params, needle):
    with pytest.raises(ConfigError) as err:
        POLICIES.create(name, params)
    msg = str(err.value)
    assert needle in msg
    assert f"'{name}'" in msg
    assert "\n" not in msg


def test_unknown_policy_and_parameter():
    with pytest.raises(ConfigError, match="unknown policy 'lmetrik'; did you mean 'lmetric'"):
        POLICIES.create("lmetrik", {})
    with pytest.raises(ConfigError, match="has no parameter 'lamda'; did you mean 'lambda'"):
        POLICIES.create("bailian", {"lamda": 0.5})
    # The YAML spelling of a keyword parameter is accepted, the Python spelling is not.
    assert POLICIES.create("bailian", {"lambda": 0.5}).lam == 0.5
    with pytest.raises(ConfigError, match="has no parameter 'lambda_'"):
        POLICIES.create("bailian", {"lambda_": 0.5})


# ---------------------------------------------------------------- vllm (§1)
def test_vllm_jsq_tie_goes_to_first_minimum():
    c = cluster_of(num_running=[3, 1, 2], num_waiting=[0, 1, 0])  # BS 3, 2, 2
    assert make_policy("vllm").choose(make_request(64), c) == 1


def test_vllm_dp_real_weights_waiting_four_times():
    c = cluster_of(num_running=[0, 5, 3], num_waiting=[2, 0, 1])
    assert make_policy("vllm").choose(make_request(64), c) == 0  # 2, 5, 4
    assert make_policy("vllm", w_wait=4).choose(make_request(64), c) == 1  # 8, 5, 7


def test_vllm_start_index_breaks_ties_from_there():
    c = cluster_of()
    assert make_policy("vllm", start_index=2).choose(make_request(64), c) == 2


def test_vllm_stale_view_with_optimistic_increment():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = make_policy("vllm", ctx, stale_view_s=0.1)
    # Engine state never changes below; only the local +1 spreads the requests.
    assert [route(p, make_request(64), c) for _ in range(4)] == [0, 1, 2, 0]
    c.instances[1].num_running = 10  # not visible until the next publication
    ctx.advance(0.05)
    assert route(p, make_request(64), c) == 1
    ctx.advance(0.1)  # publication: counts replaced by the engine's (0, 10, 0)
    assert p.choose(make_request(64), c) == 0


# ---------------------------------------------------------------- bailian (§2)
def test_bailian_hand_computed():
    c = cluster_of(num_running=[4, 0, 2])
    c.cached_override = [128, 0, 64]  # input 160: hit 0.8, 0, 0.4
    # max-norm BS 1, 0, .5 -> 0.44, 0.70, 0.57 (min-max is the same here: min is 0)
    assert make_policy("bailian", normalize="max").choose(make_request(160), c) == 0
    assert make_policy("bailian").choose(make_request(160), c) == 0


def test_bailian_max_and_minmax_normalisations_differ():
    c = cluster_of(num_running=[10, 8, 9])
    c.cached_override = [0, 0, 32]
    req = make_request(160)
    # max: 1.0, 0.9, 0.85 ; minmax: 1.0, 0.5, 0.65
    assert make_policy("bailian", lambda_=0.5, normalize="max").choose(req, c) == 2
    assert make_policy("bailian", lambda_=0.5).choose(req, c) == 1  # min-max, the default


def test_bailian_all_idle_does_not_divide_by_zero():
    c = cluster_of()
    c.cached_override = [0, 32, 0]
    for norm in ("max", "minmax"):
        assert make_policy("bailian", normalize=norm).choose(make_request(160), c) == 1


def test_bailian_ties_are_random_or_first():
    c = cluster_of()
    assert seeds_choices("bailian", c, make_request(160)) == {0, 1, 2}
    assert seeds_choices("bailian", c, make_request(160), tie_break="first") == {0}


# ---------------------------------------------------------------- dynamo (§3)
def test_dynamo_cost_uses_router_local_prefill_and_blocks():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = make_policy("dynamo", ctx)
    a = make_request(640)  # 40 unique blocks
    p.on_routed(a, 0)  # routed without a prior choose: fully uncached
    b = request_with_prefix("sys", 8, 160)
    c.instances[0].blocks = set(b.block_hashes[:8])  # instance 0 caches 8 of b's 10 blocks
    # (640 + 32)/16 + 40 + 10 = 92 ; 160/16 + 0 + 10 = 20 ; 20
    assert p.logits(b, c) == [92.0, 20.0, 20.0]
    assert seeds_choices("dynamo", c, b) <= {0, 1, 2}
    assert p.choose(b, c) in (1, 2)  # a naive max-overlap router would pick 0
    p.on_first_token(a)  # prefill released at the first token
    assert p.logits(b, c)[0] == 2 + 40 + 10
    p.on_finished(a)  # blocks released at completion
    assert p.logits(b, c) == [12.0, 20.0, 20.0]
    assert p.choose(b, c) == 0


def test_dynamo_shared_active_blocks_count_once():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = make_policy("dynamo", ctx)
    first = request_with_prefix("sys", 10, 160)
    p.on_routed(first, 1)
    twin = request_with_prefix("sys", 10, 160)  # same 10 blocks, nothing cached yet
    # worker 1: (160 + 160)/16 + 10 active + 0 new ; others: 10 + 0 + 10
    assert p.logits(twin, c) == [20.0, 30.0, 20.0]
    half = request_with_prefix("sys", 4, 160)
    assert p.logits(half, c)[1] == 20 + 10 + 6


def test_dynamo_temperature_sampling_follows_softmax():
    ctx = FakeContext(seed=1)
    p = make_policy("dynamo", ctx, temperature=1.0)
    draws = [p._select([0.0, 5.0, 5.0]) for _ in range(4000)]
    share0 = draws.count(0) / len(draws)
    assert share0 == pytest.approx(1 / (1 + 2 * math.exp(-1)), abs=0.03)
    assert {p._select([3.0, 3.0, 3.0]) for _ in range(200)} == {0, 1, 2}


# ---------------------------------------------------------------- aibrix (§4)
def _aibrix_with_loads(loads, ctx=None):
    ctx = ctx or FakeContext()
    p = make_policy("aibrix", ctx)
    for i, n in enumerate(loads):
        for _ in range(n):
            p.on_routed(make_request(32), i)
    return p


def test_aibrix_imbalance_threshold_is_strict():
    req = request_with_prefix("sys", 8, 160)
    c = cluster_of()
    c.instances[0].blocks = set(req.block_hashes[:8])
    # range 8 == threshold: no filter; mean 4, sample sd 4 -> gate 8: instance 0 passes.
    assert _aibrix_with_loads([8, 0, 4]).choose(req, c) == 0
    # range 9 > 8: only the minimum-load pod stays; it has no match -> it gets the request.
    assert _aibrix_with_loads([9, 0, 4]).choose(req, c) == 1


def test_aibrix_std_gate_skips_the_best_match_when_too_loaded():
    req = request_with_prefix("sys", 8, 160)
    c = cluster_of()
    c.instances[0].blocks = set(req.block_hashes[:8])
    c.instances[2].blocks = set(req.block_hashes[:4])
    # loads 5, 0, 1: mean 2, sd sqrt(7) -> gate 4.65; instance 0 fails, 2 passes.
    assert _aibrix_with_loads([5, 0, 1]).choose(req, c) == 2


def test_aibrix_no_match_goes_to_a_random_least_loaded_pod():
    c = cluster_of()
    choices = {_aibrix_with_loads([3, 1, 1], FakeContext(seed=s)).choose(make_request(160), c)
               for s in range(30)}
    assert choices == {1, 2}


def test_aibrix_inflight_decrements_on_finish():
    p = _aibrix_with_loads([0, 0, 0])
    r = make_request(32)
    p.on_routed(r, 2)
    p.on_finished(r)
    p.on_finished(r)  # a duplicate completion must not drift the counter
    assert p.inflight.counts == [0, 0, 0]


# ---------------------------------------------------------------- llmd (§5)
def test_llmd_picks_lowest_estimated_ttft_and_records_it():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    req = request_with_prefix("sys", 9, 160)
    c.instances[0].blocks = set(req.block_hashes)  # idle and cached: 16 tokens to compute
    c.instances[0].num_running = 0
    c.instances[2].num_running = 1
    c.instances[2].decode_context_tokens = 100
    c.instances[2].blocks = set(req.block_hashes)
    p = make_policy("llmd", ctx)
    assert route(p, req, c) == 0  # 1 (idle, uncached) and 2 (cached, one decode) are slower
    kind, fields = ctx.events[-1]
    assert kind == "ttft_prediction" and fields["instance_id"] == 0
    assert fields["predicted_ttft_s"] == pytest.approx(0.01 + 16e-4)


def test_llmd_queue_outweighs_cache():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    req = request_with_prefix("sys", 9, 160)
    c.instances[0].blocks = set(req.block_hashes)
    c.instances[0].num_waiting = 2
    c.instances[0].queue = [(4000, 0), (4000, 0)]
    c.instances[1].num_running = 3
    c.instances[1].decode_context_tokens = 3000
    assert make_policy("llmd", ctx).choose(req, c) == 2  # the empty instance


def test_llmd_untuned_profile_and_noise_are_deterministic():
    c = cluster_of(num_running=[1, 0, 2], decode_context_tokens=[100, 0, 300])
    req = make_request(160)
    untuned = {"kind": "linear", "step_base_s": 0.0, "per_decode_seq_s": -1.0}
    p = make_policy("llmd", FakeContext(), estimator_profile=untuned)
    assert p.cost_model.step_base_s == 0.0
    assert p.choose(req, c) == 2  # the wrong model prefers the busiest instance
    a = make_policy("llmd", FakeContext(seed=3), noise_rel=0.5).predict(req, c)
    b = make_policy("llmd", FakeContext(seed=3), noise_rel=0.5).predict(req, c)
    assert a == b and a != make_policy("llmd").predict(req, c)


def test_llmd_scorer_weights_3_2_2():
    c = cluster_of(num_waiting=[0, 4, 2], kv_usage=[0.5, 0.1, 0.2])
    req = request_with_prefix("sys", 10, 160)
    c.instances[1].blocks = set(req.block_hashes)  # capped at 9 of 10 blocks
    c.instances[2].blocks = set(req.block_hashes[:5])
    # prefix 0, .9, .5 (x3); queue 1, 0, .5 (x2); kv .5, .9, .8 (x2) -> 3.0, 4.5, 4.1
    assert make_policy("llmd_scorer").choose(req, c) == 1
    assert make_policy("llmd_scorer", w_prefix=0).choose(req, c) == 0  # 3.0, 1.8, 2.6


def test_llmd_scorer_equal_queues_score_one_not_nan():
    c = cluster_of(num_waiting=[3, 3, 3], kv_usage=[0.3, 0.2, 0.4])
    assert make_policy("llmd_scorer").choose(make_request(160), c) == 1


# ---------------------------------------------------------------- sglang (§6)
def _sglang_with_loads(loads, ctx=None):
    p = make_policy("sglang", ctx or FakeContext())
    for i, n in enumerate(loads):
        for _ in range(n):
            p.on_routed(make_request(16, []), i)
    return p


def test_sglang_imbalance_needs_both_abs_and_rel():
    req = request_with_prefix("sys", 8, 160)
    c = cluster_of()
    c.instances[0].blocks = set(req.block_hashes[:8])
    # 200 - 135 = 65 > 64 but 200 <= 1.5 * 135: not imbalanced -> cache wins (an OR would balance)
    assert _sglang_with_loads([200, 135, 150]).choose(req, c) == 0
    # 70 - 0 > 64 and 70 > 0: imbalanced -> first minimum load
    assert _sglang_with_loads([70, 0, 0]).choose(req, c) == 1


def test_sglang_match_rate_must_exceed_threshold():
    req = request_with_prefix("sys", 3, 160)
    c = cluster_of()
    c.instances[2].blocks = set(req.block_hashes[:3])  # 48/160 = 0.3, not > 0.3
    p = _sglang_with_loads([0, 0, 0])
    p.on_routed(make_request(64), 0)  # tree sizes 64, 0, 0 tokens
    p.on_routed(make_request(64), 2)
    assert p.choose(req, c) == 1  # miss -> smallest tree
    c.instances[2].blocks = set(req.block_hashes[:4])  # 0.4 > 0.3
    assert p.choose(req, c) == 2


def test_sglang_tree_eviction_and_min_load_miss_policy():
    ctx = FakeContext()
    p = make_policy("sglang", ctx, max_tree_size=64, eviction_interval_secs=1.0)
    p.on_routed(make_request(160), 0)
    assert p.tree_tokens(0) == 160
    ctx.advance(1.0)
    assert p.tree_tokens(0) == 64
    q = make_policy("sglang", miss_policy="min_load")
    q.on_routed(make_request(16), 1)
    q.on_routed(make_request(16), 0)
    assert q.choose(make_request(160), cluster_of()) == 2


# ---------------------------------------------------------------- preble (§7)
def test_preble_exploits_when_hit_exceeds_new_tokens():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = make_policy("preble", ctx)
    a = request_with_prefix("sys", 8, 160)
    assert route(p, a, c) == 0  # explore, all idle: lowest id
    b = request_with_prefix("sys", 8, 160)  # 128 matched > 32 new: exploit GPU 0
    assert route(p, b, c) == 0  # although GPUs 1 and 2 are idle
    short = request_with_prefix("sys", 2, 160)  # 32 matched < 128 new: explore
    assert route(p, short, c) == 1
    half = request_with_prefix("sys", 5, 160)  # 80 vs 80: not more -> explore
    assert route(p, half, c) == 2


def test_preble_load_cost_counts_misses_and_live_requests():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = make_policy("preble", ctx)
    a = make_request(160)
    route(p, a, c)
    t = ctx.cost_model.step_time([(160, 0)], 0, 0)
    assert p.load_cost(0) == pytest.approx(t + 45 * 0.15)
    p.on_finished(a)
    assert p.load_cost(0) == pytest.approx(t)
    ctx.advance(181.0)
    p.choose(make_request(32), c)  # expires the window
    assert p.load_cost(0) == 0.0


def test_preble_rebalances_prefixes_away_from_a_heavy_gpu():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = make_policy("preble", ctx, rebalance_after_per_gpu=0)
    for k in range(4):  # four independent prefixes, two requests each, all forced onto GPU 0
        for _ in range(2):  # Preble only moves prefixes with >= 2 requests in the window
            req = request_with_prefix(("p", k), 8, 160)
            p.choose(req, c)
            p.on_routed(req, 0)
    assert p.moves > 0
    assert p.prefill_load[0] < 4 * ctx.cost_model.step_time([(128, 0)], 0, 0)
    moved = [k for k in range(4) if p._match_insert(hashes(("p", k), 8))[1][0].alloc != [0]]
    assert moved
    follow = request_with_prefix(("p", moved[0]), 8, 160)  # exploits the new home
    assert p.choose(follow, c) != 0


# ---------------------------------------------------------------- polyserve (§8)
def _polyserve(ctx):
    return make_policy(
        "polyserve", ctx,
        slo_classes=[{"ttft_s": 1.0, "tpot_s": 0.02}, {"ttft_s": 0.5, "tpot_s": 0.05}],
        default_slo_class=1,
    )


def test_polyserve_packs_onto_most_loaded_feasible_instance():
    ctx = FakeContext()
    p = _polyserve(ctx)
    assert p.bins == [[0], [1, 2]]  # tight TPOT bin first
    c = cluster_of(ctx=ctx, num_running=[0, 3, 5])
    req = make_request(160)  # unlabelled -> default class 1 (loose)
    assert p.choose(req, c) == 2  # a least-loaded policy would pick 1
    c.instances[2].num_waiting = 1
    c.instances[2].queue = [(20000, 0)]  # its TTFT now breaks the 0.5 s SLO
    assert p.choose(req, c) == 1


def test_polyserve_borrows_tighter_bin_then_falls_back():
    ctx = FakeContext()
    p = _polyserve(ctx)
    c = cluster_of(ctx=ctx, num_running=[0, 45, 45])  # TPOT 0.056 > 0.05 in the loose bin
    assert p.choose(make_request(160, slo_class=1), c) == 0
    c.instances[0].num_running = 45
    c.instances[1].num_running = 50
    assert p.choose(make_request(160, slo_class=1), c) == 2  # none feasible: lowest TTFT
    assert p.choose(make_request(160, slo_class=0), c) == 0  # own bin only


# ---------------------------------------------------------------- lmetric (§9a)
def test_lmetric_empty_instance_degeneracy_and_plus_one():
    c = cluster_of(num_running=[0, 2, 1])
    c.cached_override = [0, 144, 0]
    req = make_request(160)
    # 0 x 160 = 0 wins regardless of cache
    assert make_policy("lmetric", bs_plus_one=False).choose(req, c) == 0
    assert make_policy("lmetric").choose(req, c) == 1  # +1, the default: 160, 48, 320


def test_lmetric_p_token_variants():
    c = cluster_of(num_running=[2, 2, 3], pending_prefill_tokens=[1000, 0, 0])
    c.cached_override = [144, 0, 0]
    req = make_request(160)
    assert make_policy("lmetric").choose(req, c) == 1  # 2032, 320, 480
    assert make_policy("lmetric", p_token="request").choose(req, c) == 0  # 32, 320, 480


def test_lmetric_indicator_ablation_figure_19():
    # BS (R+Q): 2, 2, 3; total tokens: 9000, 100, 200; hits 144, 0, 0 of a 160-token prompt.
    c = cluster_of(num_running=[2, 2, 3], total_tokens=[9000, 100, 200])
    c.cached_override = [144, 0, 0]
    req = make_request(160)
    # P-token x BS: 16*2=32, 160*2=320, 160*3=480 -> 0
    assert make_policy("lmetric", p_token="request").choose(req, c) == 0
    # P-token x total tokens: 16*9000=144000, 160*100=16000, 160*200=32000 -> 1
    assert make_policy("lmetric", p_token="request", load_indicator="total_tokens").choose(req, c) == 1
    # miss ratio x BS: 0.1*2=0.2, 1*2=2, 1*3=3 -> 0
    assert make_policy("lmetric", kv_indicator="miss_ratio").choose(req, c) == 0
    # miss ratio x total tokens: 0.1*9000=900, 100, 200 -> 1
    assert make_policy("lmetric", kv_indicator="miss_ratio", load_indicator="total_tokens").choose(req, c) == 1


def test_lmetric_tie_breaks():
    c = cluster_of(num_running=[1, 1, 1])
    req = make_request(160)
    assert seeds_choices("lmetric", c, req) == {0, 1, 2}
    assert seeds_choices("lmetric", c, req, tie_break="first") == {0}
    p = make_policy("lmetric", tie_break="rotate")
    assert [p.choose(req, c) for _ in range(4)] == [0, 1, 2, 0]


def test_lmetric_inflight_batch_size():
    c = cluster_of(num_running=[0, 9, 9])
    p = make_policy("lmetric", bs_source="inflight", bs_plus_one=True)
    route(p, make_request(160), c)
    assert p.choose(make_request(160), c) == 1  # engine says 0 is idle; router counts 1


# ---------------------------------------------------------------- lmetric_hotspot (§9c-d)
def _hotspot(ctx, **kw):
    kw.setdefault("warmup_s", 0.0)
    return make_policy("lmetric_hotspot", ctx, prefix_depth_blocks=2, top_k=1,
                       min_window_requests=4, refresh_s=0.001, bs_plus_one=True, **kw)


def test_hotspot_waits_one_window_before_alarming():
    # The same hot-class traffic as below, but with the default warm-up of one window (1 s):
    # no alarm in the first second, an alarm once a full window of traffic has been seen.
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = _hotspot(ctx, window_s=1.0, warmup_s=None)
    c.instances[0].blocks = set(hashes("hot", 2))
    for k in range(6):
        ctx.advance(k * 0.01)
        route(p, request_with_prefix("hot", 2, 160), c)
    assert p.alarms == []
    ctx.advance(1.0)
    for _ in range(4):
        route(p, request_with_prefix("hot", 2, 160), c)
    assert len(p.alarms) == 1 and p.alarms[0]["time"] >= 1.0


def test_hotspot_alarm_filters_the_cached_instances():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = _hotspot(ctx)
    hot = hashes("hot", 2)
    c.instances[0].blocks = set(hot)
    picks = []
    for k in range(6):
        ctx.advance(k * 0.01)
        picks.append(route(p, request_with_prefix("hot", 2, 160), c))
    # Before the window holds 4 requests plain LMetric follows the cache; then x = 1 > 0
    # violates Eq. 2 and instance 0 (M) is filtered out.
    assert picks[:3] == [0, 0, 0]
    assert 0 not in picks[3:]
    assert len(p.alarms) == 1
    alarm = p.alarms[0]
    assert alarm["m"] == 1 and alarm["x"] == 1.0 and alarm["class_id"] == hot[1]
    assert ctx.events[0][0] == "hotspot_alarm"


def test_hotspot_equality_is_not_a_violation():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = _hotspot(ctx)
    hot = hashes("hot", 2)
    c.instances[0].blocks = set(hot)
    route(p, request_with_prefix("hot", 2, 160), c)  # class tracked from now on
    for _ in range(4):
        route(p, make_request(160), c)
    ctx.advance(0.01)
    # 2 of 6 requests: x/(1-x) = 1/2 == |M|/|M̄| = 1/2 -> Eq. 2 holds, no filtering.
    assert p.choose(request_with_prefix("hot", 2, 160), c) == 0
    assert p.alarms == []


def test_hotspot_class_id_and_window_expiry():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = _hotspot(ctx, class_by="class_id", window_s=1.0)
    c.instances[0].blocks = set(hashes("hot", 2))
    for k in range(5):
        ctx.advance(k * 0.01)
        route(p, request_with_prefix("hot", 2, 160, class_id=7), c)
    assert p.alarms and p.alarms[0]["class_id"] == 7
    ctx.advance(5.0)  # the window empties: too few requests to alarm
    assert route(p, request_with_prefix("hot", 2, 160, class_id=7), c) == 0
    assert ctx.events[-1][0] == "hotspot_clear"


# ---------------------------------------------------------------- simple baselines
def test_simple_baselines():
    c = cluster_of(total_tokens=[50, 10, 10])
    assert make_policy("least_tokens").choose(make_request(16), c) == 1
    rr = make_policy("round_robin")
    assert [rr.choose(make_request(16), c) for _ in range(4)] == [0, 1, 2, 0]
    assert seeds_choices("random", c, make_request(16)) == {0, 1, 2}


def test_preble_allocation_expires_with_the_window():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = make_policy("preble", ctx)
    a = request_with_prefix("sys", 8, 160)
    assert route(p, a, c) == 0
    ctx.advance(181.0)  # the prefix leaves the 3-minute window
    b = request_with_prefix("sys", 8, 160)
    p.choose(b, c)
    assert p.expired >= 1
    node = p._match_insert(hashes("sys", 8))[1][0]
    assert node.alloc == []  # forgotten: b is explored, not pinned to GPU 0
    ctx2 = FakeContext()
    keep = make_policy("preble", ctx2, expire_allocations=False)
    c2 = cluster_of(ctx=ctx2)
    route(keep, request_with_prefix("sys", 8, 160), c2)
    ctx2.advance(181.0)
    keep.choose(request_with_prefix("sys", 8, 160), c2)
    assert keep._match_insert(hashes("sys", 8))[1][0].alloc == [0]


def test_preble_move_cost_adds_decode_of_live_requests():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    p = make_policy("preble", ctx, rebalance=False)
    req = request_with_prefix(("p", 0), 8, 160)
    route(p, req, c)
    node = p._match_insert(hashes(("p", 0), 8))[1][0]
    t = ctx.cost_model.step_time([(128, 0)], 0, 0)
    # one live request: 45 output tokens x 0.15 s initial TPOT on top of the prefill share
    assert p.node_cost(node, 0) == pytest.approx(p.share(node, 0) + 45 * 0.15)
    assert p.share(node, 0) == pytest.approx(t)
    flat = make_policy("preble", FakeContext(), rebalance_decode=False)
    assert flat.node_cost(node, 0) == p.share(node, 0)
