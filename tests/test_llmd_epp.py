"""llm-d's EPP scorers (lmsim.policies.llmd_epp) against hand computations from their sources:
GIE's approximate prefix index, the precise scorer's min-max, the active-request, queue,
kv-cache and load-aware scorers, the weighted sum and the max-score pick, and the config."""

from __future__ import annotations

import hashlib

import pytest

from conftest import make_trace, simulate
from fakes import FakeContext, cluster_of, hashes, make_policy, make_request, route
from lmsim.errors import ConfigError
from lmsim.policies import POLICIES
from lmsim.policies.llmd_epp import (
    PRESETS,
    ApproxPrefixScorer,
    chained_hashes,
    chars_blocks,
    min_max_over_hits,
    token_blocks_as_chars,
)


def text_request(text: str, request_id: int | None = None):
    req = make_request(64, request_id=request_id)
    req.prompt_text = text  # the field helper `workloads` adds; set directly here
    return req


def epp(plugins, refs, ctx=None):
    return make_policy("llmd_epp", ctx, plugins=plugins,
                       schedulingProfiles=[{"name": "default", "plugins": refs}])


def prefix_only(ctx=None, **params):
    return epp([{"type": "prefix-cache-scorer", "parameters": params}, {"type": "max-score-picker"}],
               [{"pluginRef": "prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}], ctx)


def prefix_scores(policy, request, n=3):
    return policy.scorers[0][0].score(request, cluster_of(n))


# ---------------------------------------------------------------- text blocks and hashes
def test_character_blocks_as_gie_cuts_them():
    """GIE v1.0 hashPrompt: first block (whole, or the whole short prompt), then full blocks
    only, after truncating to maxPrefixBlocksToMatch x hashBlockSize bytes."""
    assert chars_blocks(b"abcdefghij", 4, 256) == [b"abcd", b"efgh"]  # "ij" is dropped
    assert chars_blocks(b"ab", 4, 256) == [b"ab"]
    assert chars_blocks(b"abcdefghij", 4, 1) == [b"abcd"]
    assert chars_blocks(b"abcdefgh", 4, 256) == [b"abcd", b"efgh"]


def test_hashes_are_chained_and_stable():
    a = chained_hashes([b"abcd", b"efgh"])
    b = chained_hashes([b"xxxx", b"efgh"])
    assert a[1] != b[1]  # same block, different prefix: a different name
    assert a == chained_hashes([b"abcd", b"efgh"])
    # blake2b-64 of b"abcd": the same on every machine and run (no str hash()).
    assert a[0] == int.from_bytes(hashlib.blake2b(b"abcd", digest_size=8).digest(), "little")


def test_token_requests_get_character_blocks_from_their_block_names():
    """64 tokens x 4 chars = 256 chars. hashBlockSize 64 -> 4 blocks, block k ends at token
    16(k+1), in engine block k: names (h_k, k). hashBlockSize 100 on 70 tokens (280 chars):
    2 blocks, ending at chars 100 and 200 -> tokens 25 and 50 -> engine blocks 1 and 3."""
    hs = hashes("sys", 4)
    req = make_request(64, hs)
    assert token_blocks_as_chars(req, 64, 256, 4.0, 16) == [(hs[k], k) for k in range(4)]
    req70 = make_request(70, hs)
    assert token_blocks_as_chars(req70, 100, 256, 4.0, 16) == [(hs[1], 0), (hs[3], 1)]
    # A block the trace does not name is the request's own.
    short = make_request(64, hs[:2], request_id=77)
    assert token_blocks_as_chars(short, 64, 256, 4.0, 16)[2:] == [("unique", 77, 2), ("unique", 77, 3)]


# ---------------------------------------------------------------- approximate prefix index
def test_approximate_prefix_hand_computed_scores_and_pick():
    """hashBlockSize 4. Pod 0 was sent "aaaabbbbcccc", pod 1 "aaaabbbbdddd". The query
    "aaaabbbbcccceeee" has 4 blocks: block 0 and 1 held by pods {0, 1}, block 2 by {0},
    block 3 by nobody -> counts 3, 2, 0 -> scores 3/4, 2/4, 0; pod 0 wins."""
    p = prefix_only(hashBlockSize=4)
    c = cluster_of(3)
    p.on_routed(text_request("aaaabbbbcccc"), 0)
    p.on_routed(text_request("aaaabbbbdddd"), 1)
    q = text_request("aaaabbbbcccceeee")
    assert prefix_scores(p, q) == [0.75, 0.5, 0.0]
    assert p.choose(q, c) == 0


def test_approximate_prefix_credits_any_holder_while_the_walk_goes_on():
    """GIE matchLongestPrefix walks while ANY pod holds the block and credits every holder:
    capacity 3, X = 4 blocks sent to pod 1 keeps x1..x3 (x0 evicted as least recent);
    the first 3 blocks of X sent to pod 0 keep x0..x2. Query X: x0 {0}; x1 {0,1}; x2 {0,1};
    x3 {1} -> pod 0: 3, pod 1: 3 -> 3/4 each, although pod 1 lacks block 0."""
    p = prefix_only(hashBlockSize=4, lruCapacityPerServer=3)
    p.on_routed(text_request("0000111122223333"), 1)
    p.on_routed(text_request("000011112222"), 0)
    assert prefix_scores(p, text_request("0000111122223333")) == [0.75, 0.75, 0.0]


def test_approximate_prefix_lru_capacity_evicts_least_recent_per_server():
    """Capacity 3 per server. Pod 0 is sent P = p0 p1, then Q = q0 q1: adding q1 evicts p0
    (least recent), so P no longer matches at all (the walk stops at block 0) while Q does.
    Pod 1's LRU is its own: sending it P keeps P whole there, and since pod 1 now carries the
    walk through p0, pod 0's leftover p1 is credited again (1 of 2 -> 0.5)."""
    p = prefix_only(hashBlockSize=4, lruCapacityPerServer=3)
    P, Q = "ppppPPPP", "qqqqQQQQ"
    p.on_routed(text_request(P), 0)
    assert prefix_scores(p, text_request(P)) == [1.0, 0.0, 0.0]
    p.on_routed(text_request(Q), 0)
    assert prefix_scores(p, text_request(P)) == [0.0, 0.0, 0.0]
    assert prefix_scores(p, text_request(Q)) == [1.0, 0.0, 0.0]
    p.on_routed(text_request(P), 1)
    assert prefix_scores(p, text_request(P)) == [0.5, 1.0, 0.0]
    assert list(p.scorers[0][0].index.lru[0]) == p.scorers[0][0].hashes(text_request(P))[1:] + \
        p.scorers[0][0].hashes(text_request(Q))


def test_approximate_prefix_truncates_to_max_prefix_blocks():
    """maxPrefixBlocksToMatch 2: only the first 8 bytes count, so two prompts that differ
    after them score 1.0 on each other's pod (indistinguishable, as GIE's comment says)."""
    p = prefix_only(hashBlockSize=4, maxPrefixBlocksToMatch=2)
    p.on_routed(text_request("aaaabbbbcccc"), 2)
    assert prefix_scores(p, text_request("aaaabbbbdddd")) == [0.0, 0.0, 1.0]


def test_approximate_prefix_on_token_traces_matches_shared_engine_blocks():
    """No text: 64 tokens at 4 chars -> 4 blocks of 64 chars = one engine block each. A
    request sharing 2 leading engine blocks with one sent to pod 2 scores 2/4 there."""
    p = prefix_only()
    p.on_routed(make_request(64, hashes("sys", 4)), 2)
    q = make_request(64, hashes("sys", 2) + hashes("other", 2, start=2))
    assert prefix_scores(p, q) == [0.0, 0.0, 0.5]


# ---------------------------------------------------------------- precise prefix scorer
@pytest.mark.parametrize(
    ("matched", "scores"),
    [
        ([2, 3, 5], [0.0, 1 / 3, 1.0]),  # the least hit among pods WITH a hit scores 0
        ([0, 3, 5], [0.0, 0.0, 1.0]),
        ([0, 4, 4], [0.0, 1.0, 1.0]),  # all hits equal -> 1.0 each
        ([0, 0, 7], [0.0, 0.0, 1.0]),  # a single hit -> 1.0
        ([0, 0, 0], [0.0, 0.0, 0.0]),  # no hit anywhere
    ],
)
def test_precise_min_max_over_pods_with_a_hit(matched, scores):
    assert min_max_over_hits(matched) == pytest.approx(scores)


def test_precise_scorer_reads_the_kv_view_in_blocks():
    """Pods hold 2, 5, 0 leading blocks of a 10-block prompt -> min-max over {2, 5}: 0, 1, 0.
    With prefix weight 2 and a queue scorer (waiting 0, 3, 0 -> 1, 0, 1): 1, 2, 1 -> pod 1."""
    req = make_request(160, hashes("sys", 10))
    c = cluster_of(3, num_waiting=[0, 3, 0])
    c.instances[0].blocks = set(req.block_hashes[:2])
    c.instances[1].blocks = set(req.block_hashes[:5])
    p = epp([{"type": "prefix-cache-scorer", "parameters": {"mode": "cache_tracking"}},
             {"type": "queue-scorer"}, {"type": "max-score-picker"}],
            [{"pluginRef": "prefix-cache-scorer", "weight": 2}, {"pluginRef": "queue-scorer"},
             {"pluginRef": "max-score-picker"}])
    assert p.totals(req, c) == [1.0, 2.0, 1.0]
    assert p.choose(req, c) == 1


# ---------------------------------------------------------------- load scorers
def active(ctx=None, **params):
    return epp([{"type": "active-request-scorer", "parameters": params}, {"type": "max-score-picker"}],
               [{"pluginRef": "active-request-scorer"}, {"pluginRef": "max-score-picker"}], ctx)


def test_active_request_counts_and_scores():
    """Sent 2, 1, 0 -> max 2 -> (2-2)/2, (2-1)/2, idle 1.0 = 0, 0.5, 1. One finishes on pod 0
    -> 1, 1, 0 -> 0, 0, 1."""
    p = active()
    c = cluster_of(3)
    reqs = [make_request(16) for _ in range(3)]
    for r, pod in zip(reqs, [0, 0, 1]):
        p.on_routed(r, pod)
    assert p.totals(make_request(16), c) == [0.0, 0.5, 1.0]
    p.on_finished(reqs[0])
    assert p.totals(make_request(16), c) == [0.0, 0.0, 1.0]
    p.on_finished(reqs[0])  # a second end of the same request changes nothing
    assert p.totals(make_request(16), c) == [0.0, 0.0, 1.0]


def test_active_request_idle_threshold_and_max_busy_score():
    """counts 3, 1, 0; idleThreshold 1 -> pods 1 and 2 idle (1.0); pod 0: (3-3)/3 x 0.5 = 0;
    counts 3, 2, 0 -> pod 1: (3-2)/3 x 0.5."""
    p = active(idleThreshold=1, maxBusyScore=0.5)
    for pod in [0, 0, 0, 1]:
        p.on_routed(make_request(16), pod)
    assert p.totals(make_request(16), cluster_of(3)) == [0.0, 1.0, 1.0]
    p.on_routed(make_request(16), 1)
    assert p.totals(make_request(16), cluster_of(3)) == pytest.approx([0.0, 0.5 / 3, 1.0])


def test_active_request_timeout_sweep_every_timeout():
    """requestTimeout 2m: the sweep runs at 120, 240, ...; it drops entries sent at least 120 s
    before. Sent at 0 and 100 to pod 0: at 120 the first goes, at 240 the second."""
    ctx = FakeContext()
    p = active(ctx, requestTimeout="2m")
    scorer = p.scorers[0][0]
    p.on_routed(make_request(16), 0)
    ctx.advance(100.0)
    p.on_routed(make_request(16), 0)
    ctx.advance(119.9)
    assert scorer.counts[0] == 2
    ctx.advance(120.0)
    assert scorer.counts[0] == 1
    ctx.advance(239.0)
    assert scorer.counts[0] == 1
    ctx.advance(240.0)
    assert scorer.counts[0] == 0


def test_active_request_released_at_response_headers_never_counts():
    """GIE <= v1.0 ran llm-d's hook on the response headers, which vLLM sends before
    scheduling: no later decision sees the request, every pod scores 1.0."""
    p = active(releaseAt="response_headers")
    for pod in [0, 0, 1]:
        p.on_routed(make_request(16), pod)
    assert p.totals(make_request(16), cluster_of(3)) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("ptype", "fields", "expected"),
    [
        ("queue-scorer", {"num_waiting": [0, 4, 2]}, [1.0, 0.0, 0.5]),
        ("queue-scorer", {"num_waiting": [3, 3, 3]}, [1.0, 1.0, 1.0]),
        ("kv-cache-scorer", {"kv_usage": [0.5, 0.1, 1.0]}, [0.5, 0.9, 0.0]),
        ("kv-cache-utilization-scorer", {"kv_usage": [0.25, 0.0, 0.75]}, [0.75, 1.0, 0.25]),
        ("load-aware-scorer", {"num_waiting": [0, 64, 200]}, [0.5, 0.25, 0.0]),
    ],
)
def test_load_scorers_hand_computed(ptype, fields, expected):
    p = epp([{"type": ptype}, {"type": "max-score-picker"}],
            [{"pluginRef": ptype}, {"pluginRef": "max-score-picker"}])
    assert p.totals(make_request(16), cluster_of(3, **fields)) == pytest.approx(expected)


# ---------------------------------------------------------------- weighted sum and pick
def test_estimate_prefix_with_load_weighted_sum_hand_computed():
    """active 1 + kv-cache 1 + prefix 2 (the A2 estimate config, hashBlockSize 4 here).
    prefix 3/4, 2/4, 0 (x2); active counts 2, 1, 0 -> 0, .5, 1; kv usage .5, .1, .2 -> .5, .9,
    .8. Totals 2.0, 2.4, 1.8 -> pod 1."""
    p = epp(
        [{"type": "active-request-scorer"}, {"type": "kv-cache-scorer"},
         {"type": "prefix-cache-scorer", "parameters": {"hashBlockSize": 4}},
         {"type": "max-score-picker"}],
        [{"pluginRef": "active-request-scorer", "weight": 1}, {"pluginRef": "kv-cache-scorer", "weight": 1},
         {"pluginRef": "prefix-cache-scorer", "weight": 2}, {"pluginRef": "max-score-picker"}],
    )
    c = cluster_of(3, kv_usage=[0.5, 0.1, 0.2])
    route_to = [(text_request("aaaabbbbcccc"), 0), (text_request("aaaabbbbdddd"), 1),
                (text_request("zzzz"), 0)]
    for r, pod in route_to:
        p.on_routed(r, pod)
    q = text_request("aaaabbbbcccceeee")
    assert p.totals(q, c) == pytest.approx([2.0, 2.4, 1.8])
    assert p.choose(q, c) == 1


def test_max_score_ties_are_seeded_uniform():
    c = cluster_of(3, num_waiting=[1, 0, 0])
    picks = {epp([{"type": "queue-scorer"}, {"type": "max-score-picker"}],
                 [{"pluginRef": "queue-scorer"}, {"pluginRef": "max-score-picker"}],
                 FakeContext(seed=s)).choose(make_request(16), c) for s in range(30)}
    assert picks == {1, 2}


def test_random_preset_spreads_over_every_pod_and_is_seeded():
    c = cluster_of(3)
    picks = [make_policy("llmd_epp", FakeContext(seed=4), preset="random").choose(make_request(16), c)
             for _ in range(2)]
    again = [make_policy("llmd_epp", FakeContext(seed=4), preset="random").choose(make_request(16), c)
             for _ in range(2)]
    assert picks == again
    p = make_policy("llmd_epp", FakeContext(seed=1), preset="random")
    assert {route(p, make_request(16), c) for _ in range(60)} == {0, 1, 2}


def test_every_preset_builds_with_the_a2_weights():
    weights = {name: [(type(s).__name__, w) for s, w in make_policy("llmd_epp", preset=name).scorers]
               for name in PRESETS}
    assert weights["random"] == []
    assert weights["epp-config"] == [("ApproxPrefixScorer", 2.0)]
    assert [(type(s).__name__, w) for s, w in make_policy("llmd_epp").scorers] == weights["epp-config"]
    assert weights["load"] == [("ActiveRequestScorer", 1.0), ("KvCacheUtilizationScorer", 1.0)]
    assert weights["estimate-prefix-cache_load"] == [
        ("ActiveRequestScorer", 1.0), ("KvCacheUtilizationScorer", 1.0), ("ApproxPrefixScorer", 2.0)]
    assert weights["precise-prefix-cache_load"] == [
        ("PrecisePrefixScorer", 2.0), ("KvCacheUtilizationScorer", 1.0), ("ActiveRequestScorer", 1.0)]
    est = make_policy("llmd_epp", preset="estimate-prefix-cache_load").scorers[2][0]
    assert isinstance(est, ApproxPrefixScorer)
    assert (est.block, est.max_blocks, est.capacity) == (256, 256, 2200)
    # llm-d v0.3 reads `prefix-cache-scorer` as GIE's approximate scorer, `mode` ignored.
    v03 = make_policy("llmd_epp", preset="precise-prefix-cache_load@v0.3").scorers[0][0]
    assert (type(v03).__name__, v03.block, v03.max_blocks, v03.capacity) == (
        "ApproxPrefixScorer", 64, 256, 31250)
    # Every A2 build released the active-request count on the response headers.
    for name in ("load", "estimate-prefix-cache_load", "precise-prefix-cache_load"):
        (act,) = [s for s, _ in make_policy("llmd_epp", preset=name).scorers
                  if type(s).__name__ == "ActiveRequestScorer"]
        assert act.release == "response_headers", name


def test_a_pasted_epp_file_is_accepted_whole():
    """The A2 'load' config as llm-d's YAML, apiVersion and kind included."""
    cfg = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "active-request-scorer"}, {"type": "kv-cache-scorer"},
                    {"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 1}},
                    {"type": "single-profile-handler"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "active-request-scorer", "weight": 1},
            {"pluginRef": "kv-cache-scorer", "weight": 1}, {"pluginRef": "max-score-picker"}]}],
    }
    assert len(POLICIES.create("llmd_epp", cfg).scorers) == 2


# ---------------------------------------------------------------- bad config
_PICK = {"type": "max-score-picker"}
_PICK_REF = {"pluginRef": "max-score-picker"}


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"plugins": [{"type": "prefix-scorer"}, _PICK], "schedulingProfiles": [
            {"name": "d", "plugins": [_PICK_REF]}]},
         "plugins[0]: unknown plugin type 'prefix-scorer' (known: prefix-cache-scorer"),
        ({"plugins": [{"type": "prefix-cache-scorer", "parameters": {"blockSize": 64}}, _PICK],
          "schedulingProfiles": [{"name": "d", "plugins": [{"pluginRef": "prefix-cache-scorer"}, _PICK_REF]}]},
         "plugins[0]: prefix-cache-scorer has no parameter 'blockSize' (known: charsPerToken, hashBlockSize"),
        ({"plugins": [{"type": "prefix-cache-scorer", "parameters": {"hashBlockSize": 0}}, _PICK],
          "schedulingProfiles": [{"name": "d", "plugins": [{"pluginRef": "prefix-cache-scorer"}, _PICK_REF]}]},
         "plugins[0]: param 'hashBlockSize' must be >= 1, got 0"),
        ({"plugins": [{"type": "queue-scorer"}, _PICK],
          "schedulingProfiles": [{"name": "d", "plugins": [{"pluginRef": "queue"}, _PICK_REF]}]},
         "pluginRef 'queue' names no plugin in 'plugins'"),
        ({"plugins": [{"type": "queue-scorer"}], "schedulingProfiles": [
            {"name": "d", "plugins": [{"pluginRef": "queue-scorer"}]}]},
         "has no picker"),
        ({"plugins": [{"type": "active-request-scorer", "parameters": {"requestTimeout": "soon"}}, _PICK],
          "schedulingProfiles": [{"name": "d", "plugins": [{"pluginRef": "active-request-scorer"}, _PICK_REF]}]},
         "param 'requestTimeout' must be a duration like '2m' or '30s', got 'soon'"),
        ({"plugins": [{"type": "queue-scorer"}, _PICK], "schedulingProfiles": [
            {"name": "d", "plugins": [{"pluginRef": "queue-scorer", "weight": -1}, _PICK_REF]}]},
         "weight' must be >= 0, got -1"),
        ({"preset": "fastest"}, "param 'preset' must be one of epp-config|random|load|"),
        ({"plugins": [_PICK]}, "needs both 'plugins' and 'schedulingProfiles' (the EPP config), or 'preset'"),
    ],
)
def test_bad_epp_config_is_one_line(params, needle):
    with pytest.raises(ConfigError) as err:
        POLICIES.create("llmd_epp", params)
    msg = str(err.value)
    assert msg.startswith("policy 'llmd_epp': ") and "\n" not in msg
    assert needle in msg


# ---------------------------------------------------------------- end to end
def test_estimate_preset_keeps_a_shared_prefix_on_one_instance_in_a_run():
    """Three requests of one 40-block prefix 1 s apart on 3 idle instances: the first lands
    anywhere (all scores tie), the next two follow it (prefix 2 x 1.0 beats the load terms,
    at most 1 + 1 apart). Deterministic for a seed."""
    shared = list(range(1, 41))
    trace = make_trace([0.0, 1.0, 2.0], [656, 656, 656], [4, 4, 4],
                       hashes=[[*shared, 100 + k] for k in range(3)])
    sections = {"cluster": {"num_instances": 3},
                "router": {"policy": "llmd_epp", "params": {"preset": "estimate-prefix-cache_load"}}}
    pods = simulate(trace, **sections).requests["instance_id"].tolist()
    assert len(set(pods)) == 1
    assert simulate(trace, **sections).requests["instance_id"].tolist() == pods


def test_the_readme_example_is_the_a2_estimate_config():
    """The README's `llmd_epp` YAML block builds, with the estimate preset's scorers and weights
    (the preset also releases the active-request count at the headers, as A2's build did)."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M) if "llmd_epp" in b]
    router = yaml.safe_load(block)["router"]
    pasted = POLICIES.create(router["policy"], router["params"])
    preset = make_policy("llmd_epp", preset="estimate-prefix-cache_load")
    assert [(type(s).__name__, w) for s, w in pasted.scorers] == [
        (type(s).__name__, w) for s, w in preset.scorers]


def test_the_approximate_scorer_reads_the_prompt_text_in_a_run():
    """Four 160-token prompts whose trace names no block (so token blocks never match), texts
    A, B, A, B of 640 characters: with llm-d's sample config (prefix weight 2 only) the third
    request follows the first and the fourth the second, because their texts match."""
    a, b = "a" * 320 + "x" * 320, "b" * 640
    trace = make_trace([0.0, 1.0, 2.0, 3.0], [160] * 4, [4] * 4, text_id=[0, 1, 0, 1])
    trace.prompt_texts = (a, b)
    pods = simulate(trace, cluster={"num_instances": 3},
                    router={"policy": "llmd_epp"}).requests["instance_id"].tolist()
    assert pods[2] == pods[0] and pods[3] == pods[1]
    blind = make_trace([0.0, 1.0, 2.0, 3.0], [160] * 4, [4] * 4)  # no text: no match to follow
    seeds = {tuple(simulate(blind, cluster={"num_instances": 3}, seed=s,
                            router={"policy": "llmd_epp"}).requests["instance_id"].tolist())
             for s in range(6)}
    assert any(p[2] != p[0] or p[3] != p[1] for p in seeds)
