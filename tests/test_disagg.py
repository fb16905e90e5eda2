"""Prefill/decode disaggregation (lmsim/engine/disagg.py), hand-computed on the linear
profile: a step costs 10 ms + 1 ms per prefill token + 0.1 ms per decode sequence, and a
token's KV is 1 MB (kv_bytes_per_token 1e6). The link moves 1 GB/s after 2 ms.

One request of 160 tokens (10 whole blocks), 3 outputs, on 1 prefill + 1 decode instance:
prefill 10 + 160 = 170 ms; the decode instance admits it at once and receives its 10
blocks = 160 tokens x 1 MB = 160 MB in 2 + 160 = 162 ms; it then computes the last token
(vLLM recomputes it to sample), 10 + 1 = 11 ms: first token at 0.170 + 0.162 + 0.011 =
0.343 s; two decodes of 10.1 ms end it at 0.3632 s."""

from __future__ import annotations

import pytest

from conftest import LINEAR, make_config, make_trace
from lmsim.errors import ConfigError
from lmsim.study.compose import build_simulation

PROFILE = {**LINEAR, "kv_bytes_per_token": 1e6}
LINK = {"bandwidth_bytes_s": 1e9, "latency_s": 0.002, "sharing": "fair"}


def blocks(tag: int, n: int = 10) -> list[int]:
    return [tag * 1000 + j for j in range(n)]


def pd_config(prefill=1, decode=1, *, transfer=None, policy=None, prefill_pool=None, decode_pool=None, **sections):
    cluster = {
        "profile": PROFILE,
        "pools": [
            {"name": "prefill", "role": "prefill", "num_instances": prefill, **(prefill_pool or {})},
            {"name": "decode", "role": "decode", "num_instances": decode, **(decode_pool or {})},
        ],
        "kv_transfer": {**LINK, **(transfer or {})},
    }
    router = policy or {"policy": "pd", "params": {"prefill_policy": "round_robin", "decode_policy": "round_robin"}}
    return make_config(cluster=cluster, router=router, **sections)


def run(trace, **kwargs):
    return build_simulation(pd_config(**kwargs), trace).run()


def test_one_request_through_prefill_transfer_and_first_decode_step():
    r = run(make_trace([0.0], [160], [3], [blocks(1)]))
    req = r.requests.iloc[0]
    assert (req.prefill_instance_id, req.instance_id) == (0, 1)
    assert req.prefill_done_at == pytest.approx(0.170)
    assert req.kv_transfer_start_at == pytest.approx(0.170)
    assert req.kv_transfer_s == pytest.approx(0.162)
    assert req.kv_transfer_bytes == 160_000_000
    assert req.ttft_s == pytest.approx(0.343)
    assert req.finished_at == pytest.approx(0.343 + 2 * 0.0101)
    # the prefill instance's admission facts are the request's
    assert (req.first_scheduled_at, req.cached_tokens) == (0.0, 0)
    s = r.summary
    assert (s["num_kv_transfers"], s["kv_transfer_s_mean"], s["kv_transfer_bytes_mean"]) == (
        1, pytest.approx(0.162), 160e6)
    assert s["num_prefilled_on_decode"] == 0


def test_the_partial_last_block_is_read_not_recomputed_on_the_decode_instance():
    """vLLM's decode side reads every prompt token past its hit (NixlConnector
    `get_num_new_matched_tokens`), whole blocks as NIXL moves them, and computes only the
    last token. 170 tokens: prefill 180 ms; 11 blocks (10 whole + the partial one) = 176
    tokens x 1 MB move in 2 + 176 = 178 ms; the decode instance computes 1 token: 11 ms.
    (Before issue 34: 10 blocks in 162 ms, then 10 tokens recomputed in 20 ms.)"""
    r = run(make_trace([0.0], [170], [1], [blocks(1)]))
    req = r.requests.iloc[0]
    assert req.kv_transfer_bytes == 176_000_000
    assert req.ttft_s == pytest.approx(0.180 + 0.178 + 0.011)


def test_full_prompt_prices_every_prompt_token():
    # the mocker's default: 170 tokens x 1 MB = 170 MB in 2 + 170 ms; then the last token
    r = run(make_trace([0.0], [170], [1], [blocks(1)]), transfer={"tokens": "full_prompt"})
    req = r.requests.iloc[0]
    assert (req.kv_transfer_bytes, req.kv_transfer_s) == (170_000_000, pytest.approx(0.172))
    assert req.ttft_s == pytest.approx(0.180 + 0.172 + 0.011)


def test_only_the_blocks_the_decode_instance_lacks_move():
    # A (160 tokens) leaves its 10 blocks cached on the decode instance; B shares 6 of them
    # and has 4 of its own: 4 blocks = 64 MB move in 2 + 64 ms. B's prefill hit on the
    # prefill instance is 6 blocks (96 tokens): prefill 10 + 64 ms.
    a, b = blocks(1), blocks(1, 6) + blocks(2, 4)
    r = run(make_trace([0.0, 1.0], [160, 160], [1, 1], [a, b]))
    req = r.requests.iloc[1]
    assert (req.cached_tokens, req.kv_transfer_bytes) == (96, 64_000_000)
    assert req.ttft_s == pytest.approx(0.074 + 0.066 + 0.011)


@pytest.mark.parametrize(("prompt", "ttft"), [
    # 170 tokens: D's hit is A's 10 blocks, the partial 11th is read: 16 MB in 2 + 16 ms;
    # B's prefill hits 160 tokens on P: 10 + 10 ms; then 1 token on D: 11 ms
    (170, 0.020 + 0.018 + 0.011),
    # A's own 160 tokens: D's hit stops a block short (a token must be computed), so the
    # last whole block is read: 16 MB; B's prefill computes its last block on P: 10 + 16 ms
    (160, 0.026 + 0.018 + 0.011),
])
def test_a_decode_instance_that_caches_the_prompt_still_reads_one_block(prompt, ttft):
    """vLLM's decode side always reads at least one block (its prefix hit is capped below
    the prompt's length, so `get_num_new_matched_tokens` counts at least one token); lmsim
    before issue 34 moved 0 bytes and recomputed the partial block (20 ms for 170 tokens)."""
    a = blocks(1)
    r = run(make_trace([0.0, 1.0], [160, prompt], [1, 1], [a, a]))
    req = r.requests.iloc[1]
    assert (req.kv_transfer_bytes, req.kv_transfer_s) == (16_000_000, pytest.approx(0.018))
    assert req.ttft_s == pytest.approx(ttft)


def test_backpressure_the_prefill_instance_holds_kv_until_decode_has_room():
    # Decode pool of 12 blocks, prefill pool of 20 with a 160-token budget (one prompt per
    # step). A (160 tokens, 20 outputs) fills the
    # decode instance (179 tokens of KV = 12 blocks) from its first token at 0.343 s to its
    # end at 0.343 + 19 x 10.1 ms = 0.5349 s. B (prefilled 0.170-0.340) waits for room
    # there while the prefill instance holds its 10 blocks; C cannot even start its prefill
    # until A's transfer frees A's blocks (0.332 s, inside B's prefill step): 0.340 s.
    trace = make_trace([0.0, 0.0, 0.0], [160, 160, 160], [20, 1, 1], [blocks(1), blocks(2), blocks(3)])
    r = run(trace, prefill_pool={"num_gpu_blocks": 20, "max_num_batched_tokens": 160}, decode_pool={"num_gpu_blocks": 12})
    a, b, c = (r.requests.iloc[i] for i in range(3))
    a_end = 0.343 + 19 * 0.0101
    assert a.finished_at == pytest.approx(a_end)
    assert b.prefill_done_at == pytest.approx(0.340)
    assert b.kv_transfer_start_at == pytest.approx(a_end)
    assert b.first_token_at == pytest.approx(a_end + 0.162 + 0.011)
    assert c.first_scheduled_at == pytest.approx(0.340)
    assert c.prefill_done_at == pytest.approx(0.510)
    assert c.kv_transfer_start_at == pytest.approx(b.first_token_at)
    assert c.first_token_at == pytest.approx(b.first_token_at + 0.173)


@pytest.mark.parametrize(("sharing", "second"), [
    ("none", 0.162),  # each at full bandwidth, as alone (the mocker)
    ("fifo", 0.162 + 0.160),  # the second waits for the first on the shared NIC
    ("fair", 0.162 + 0.160),  # both at half rate, then the second alone (equal sizes: same end)
])
def test_two_transfers_from_one_prefill_instance_share_its_nic(sharing, second):
    # Two prefill instances? no: one prefill instance with a 320-token budget prefills A and
    # B in one step (10 + 320 = 330 ms) and both move to two decode instances at once over
    # its one NIC: fair shares 0.5 GB/s each, both land after 2 + 320 ms; fifo lands A at
    # 162 ms and B at 322 ms; none lands both at 162 ms.
    trace = make_trace([0.0, 0.0], [160, 160], [1, 1], [blocks(1), blocks(2)])
    r = run(trace, decode=2, transfer={"sharing": sharing})
    a, b = r.requests.iloc[0], r.requests.iloc[1]
    assert (a.instance_id, b.instance_id) == (1, 2)
    assert (a.prefill_done_at, b.prefill_done_at) == (pytest.approx(0.330), pytest.approx(0.330))
    first, last = sorted([a.kv_transfer_s, b.kv_transfer_s])
    if sharing == "fair":
        assert (first, last) == (pytest.approx(0.322), pytest.approx(0.322))
    else:
        assert (first, last) == (pytest.approx(0.162), pytest.approx(second))


def test_after_prefill_chooses_the_decode_instance_when_the_prefill_is_done():
    # Decode 0 (id 1) is busy with A when B's prefill ends; least_tokens then picks decode 1
    # (id 2). At arrival both decode instances were idle (id 1 would have won the tie).
    trace = make_trace([0.0, 0.0], [160, 160], [40, 1], [blocks(1), blocks(2)])
    policy = {"policy": "pd", "params": {"prefill_policy": "round_robin", "decode_policy": "least_tokens"}}
    after = {"policy": "pd", "params": {**policy["params"], "decode_choice": "after_prefill"}}
    r = run(trace, prefill=2, decode=2, policy=after, prefill_pool={"max_num_batched_tokens": 160})
    a, b = r.requests.iloc[0], r.requests.iloc[1]
    assert (a.instance_id, b.instance_id) == (2, 3)
    at_arrival = run(trace, prefill=2, decode=2, policy=policy, prefill_pool={"max_num_batched_tokens": 160})
    assert list(at_arrival.requests.instance_id) == [2, 2]


def test_llmd_pd_prefills_locally_when_the_decode_instance_caches_enough():
    # B repeats A's prompt with 10 more tokens: on A's decode instance only 10 tokens are
    # uncached (< nonCachedTokens 16), so B is prefilled there (10 + 10 ms, no transfer).
    a = blocks(1)
    trace = make_trace([0.0, 1.0], [160, 170], [1, 1], [a, a])
    r = run(trace, policy={"policy": "llmd_pd"})
    first, second = r.requests.iloc[0], r.requests.iloc[1]
    assert (first.prefill_instance_id, first.instance_id) == (0, 1)
    assert second.instance_id == 1 and second.prefill_instance_id is pd_na()
    assert pd_isnull(second.kv_transfer_s)
    assert second.ttft_s == pytest.approx(0.020)
    assert r.summary["num_prefilled_on_decode"] == 1


def test_dynamo_disagg_bypasses_only_when_its_conditional_rule_is_on():
    # B: 170 tokens, 160 cached on its decode instance: eff_isl = 10 < 2048 and 10/170 < 0.7
    a = blocks(1)
    trace = make_trace([0.0, 1.0], [160, 170], [1, 1], [a, a])
    on = run(trace, policy={"policy": "dynamo_disagg", "params": {"conditional_disagg": True}})
    off = run(trace, policy={"policy": "dynamo_disagg"})
    assert pd_isnull(on.requests.iloc[1].prefill_instance_id)
    assert off.requests.iloc[1].prefill_instance_id == 0


def pd_isnull(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def pd_na():
    import pandas as pd

    return pd.NA


POLICIES = [
    {"policy": "pd"},
    {"policy": "pd", "params": {"prefill_policy": "lmetric", "decode_policy": "llmd"}},
    {"policy": "pd", "params": {"prefill_policy": "preble", "decode_policy": "dynamo"}},
    {"policy": "dynamo_disagg"},
    {"policy": "dynamo_disagg", "params": {"conditional_disagg": True}},
    {"policy": "llmd_pd"},
]


def _busy_trace():
    import numpy as np

    rng = np.random.default_rng(7)
    n = 60
    arrivals = np.sort(rng.uniform(0, 1.5, n)).tolist()
    inputs = rng.integers(20, 400, n).tolist()
    outputs = rng.integers(1, 60, n).tolist()
    prefixes = [blocks(int(rng.integers(3)), 8)[: int(rng.integers(0, 9))] for _ in range(n)]
    hashes = [p + blocks(100 + k, 20)[: max(0, i // 16 - len(p))] for k, (p, i) in enumerate(zip(prefixes, inputs))]
    return make_trace(arrivals, inputs, outputs, hashes)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p['policy']}-{p.get('params', {})}")
@pytest.mark.parametrize("sharing", ["fair", "fifo", "none"])
def test_fast_forward_changes_nothing_and_invariants_hold(policy, sharing):
    trace = _busy_trace()
    out = []
    for ff in (True, False):
        cfg = pd_config(2, 3, transfer={"sharing": sharing}, policy=policy, decode_pool={"num_gpu_blocks": 120},
                        prefill_pool={"num_gpu_blocks": 200, "max_num_batched_tokens": 256},
                        simulation={"fast_forward": ff, "check": True})
        out.append(build_simulation(cfg, trace).run())
    assert out[0].requests.equals(out[1].requests)
    assert out[0].requests.status.astype(str).eq("finished").all()


def test_a_disaggregated_cluster_refuses_a_colocated_policy_and_vice_versa():
    trace = make_trace([0.0], [160], [1])
    with pytest.raises(ConfigError, match=r"router.policy: 'vllm' routes a colocated cluster, and this one has prefill and decode pools"):
        build_simulation(pd_config(policy={"policy": "vllm"}), trace)
    with pytest.raises(ConfigError, match=r"router.policy: 'pd' routes prefill and decode pools, and this cluster has none"):
        build_simulation(make_config(router={"policy": "pd"}), trace)


def test_a_prefill_profile_must_state_its_kv_bytes():
    with pytest.raises(ConfigError, match=r"cluster.pools.prefill.profile: a prefill pool's profile must state kv_bytes_per_token"):
        build_simulation(make_config(cluster={"profile": LINEAR, "pools": [
            {"name": "prefill", "role": "prefill", "num_instances": 1},
            {"name": "decode", "role": "decode", "num_instances": 1}]}, router={"policy": "pd"}), make_trace([0.0], [16], [1]))


def test_the_decode_choice_is_the_routers_not_the_clusters():
    with pytest.raises(ConfigError, match=r"cluster.kv_transfer.decode_choice: .*set router.params.decode_choice"):
        build_simulation(pd_config(transfer={"decode_choice": "after_prefill"}), make_trace([0.0], [16], [1]))
    with pytest.raises(ConfigError, match=r"router.params: .*'decode_choice' must be one of at_arrival\|after_prefill"):
        build_simulation(pd_config(policy={"policy": "dynamo_disagg", "params": {"decode_choice": "later"}}),
                   make_trace([0.0], [16], [1]))


def test_dynamo_conditional_bypass_asks_the_decode_router_with_its_overlap_credit():
    """Dynamo peeks its decode router with the request's own settings (overlap credit 1) and
    bypasses on the worker it picks (`select_decode_worker_for_conditional_disagg`).

    A (160 tokens, 10 blocks) and C (80 tokens, 5 blocks), both long-running, sit on the two
    decode instances X and Y (the decode router books A on one, then C on the other). B at
    1 s repeats A's 10 blocks plus 10 tokens (170). Decode cost in blocks = prefill term
    (tokens to compute)/16 + active blocks + B's 10 new blocks:
    with credit: X 10/16 + 10 + 10 = 20.6, Y 170/16 + 5 + 10 = 25.6 -> X, where B's
    eff_isl = 170 - 160 = 10 < 2048 and 10/170 < 0.7: bypass, B prefilled on X.
    Load only (the old peek): X 170/16 + 20, Y 170/16 + 15 -> Y, which caches nothing of B:
    eff_isl 170, no bypass."""
    trace = make_trace([0.0, 0.001, 1.0], [160, 80, 170], [200, 200, 1], [blocks(1), blocks(2, 5), blocks(1)])
    r = run(trace, decode=2, policy={"policy": "dynamo_disagg", "params": {"conditional_disagg": True}})
    a, c, b = (r.requests.iloc[i] for i in range(3))
    assert a.instance_id != c.instance_id
    assert pd_isnull(b.prefill_instance_id) and b.instance_id == a.instance_id
    assert r.summary["num_prefilled_on_decode"] == 1


def test_dynamo_disagg_chooses_the_decode_worker_when_the_prefill_is_done():
    """Dynamo with vLLM workers routes the decode leg once the prefill has completed
    (`PrefillRouter::generate`, `PrefillOutcome::Completed`); `decode_choice: at_arrival`
    picks both up front (SGLang/TRT-LLM bootstrap, llm-d).

    One prefill instance, transfers as if alone (`sharing: none`). A (160 tokens, 2 outputs) prefills 0-0.170 and decodes on X until
    0.343 + 0.0101 = 0.353; C (80 tokens, 200 outputs) prefills 0.170-0.260 and goes to the
    other decode instance Y (X holds A's 10 booked blocks). B (160 tokens) arrives at 0.300:
    at arrival X costs 10 + 10 blocks and Y 5 + 10 -> Y; its prefill ends at 0.470, after A
    left X: X 0 + 10, Y 5 + 10 -> X."""
    trace = make_trace([0.0, 0.001, 0.300], [160, 80, 160], [2, 200, 1], [blocks(1), blocks(2, 5), blocks(3)])
    alone = {"sharing": "none"}
    after = run(trace, decode=2, transfer=alone, policy={"policy": "dynamo_disagg"})
    a, c, b = (after.requests.iloc[i] for i in range(3))
    assert a.finished_at == pytest.approx(0.343 + 0.0101)
    assert b.prefill_done_at == pytest.approx(0.470)
    assert a.instance_id != c.instance_id and b.instance_id == a.instance_id
    arrival = run(trace, decode=2, transfer=alone,
                  policy={"policy": "dynamo_disagg", "params": {"decode_choice": "at_arrival"}})
    a, c, b = (arrival.requests.iloc[i] for i in range(3))
    assert a.instance_id != c.instance_id and b.instance_id == c.instance_id


def test_llmd_pd_matches_prefixes_in_its_routing_history_index_by_default():
    """llm-d's default prefix producer records a prompt on its endpoints when it routes it
    (`approximateprefix` `PreRequest`), before any KV exists there. B (A's 10 blocks + 10
    tokens) arrives at 0.010 while A is still prefilling: the index credits the decode
    instance with 160 tokens, 10 uncached < 16, so B is prefilled there at once: 10 + 170
    ms (the engine holds nothing of A yet), TTFT 0.180. The router's exact view
    (`prefix_index: router`) sees nothing cached there: B goes to the prefill instance."""
    trace = make_trace([0.0, 0.010], [160, 170], [1, 1], [blocks(1), blocks(1)])
    r = run(trace, policy={"policy": "llmd_pd"})
    b = r.requests.iloc[1]
    assert pd_isnull(b.prefill_instance_id) and b.instance_id == 1
    assert b.ttft_s == pytest.approx(0.180)
    exact = run(trace, policy={"policy": "llmd_pd", "params": {"prefix_index": "router"}})
    assert exact.requests.iloc[1].prefill_instance_id == 0


def test_llmd_routing_history_index_is_one_lru_per_endpoint_and_counts_as_llmd_walks():
    """indexer.go: each endpoint's LRU evicts its own oldest hash; matchLongestPrefix walks
    until a hash nobody holds and counts, per endpoint, the hashes it holds on the way.
    Instance 0 (capacity 2) is given 1, 2, 3 and keeps 2, 3; instance 1 holds 1, 2. Walking
    1, 2, 3: instance 0 holds 2 and 3 (2, though not a leading run), instance 1 holds 1, 2."""
    from lmsim.policies.routed_prefix import RoutedPrefixLRU

    index = RoutedPrefixLRU(2)
    index.insert([1, 2, 3], 0, capacity=2)
    index.insert([1, 2], 1, capacity=10)
    assert index.matched_blocks([1, 2, 3]) == [2, 2]
    assert index.matched_blocks([4, 1]) == [0, 0]
