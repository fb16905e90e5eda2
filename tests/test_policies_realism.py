"""The TTFT estimator against hand computations, and the router-state ViewAdapter."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import FakeContext, FakeInstance, cluster_of, make_request
from lmsim.engine.views import ViewAdapter
from lmsim.policies.predictive import estimate_ttft
from lmsim.profile import LinearCostModel

LIN = LinearCostModel(
    step_base_s=0.01, per_prefill_token_s=1e-4, per_decode_seq_s=1e-3, per_context_token_s=1e-6
)


# ---------------------------------------------------------------- estimate_ttft
def test_estimate_ttft_idle_instance_hand_computed():
    idle = FakeInstance(0)
    # 100 uncached + 32 cached, budget 64: chunk (64, 32) then (36, 96).
    step1 = 0.01 + 64e-4 + 1e-6 * (32 + 64)
    step2 = 0.01 + 36e-4 + 1e-6 * (96 + 36)
    assert estimate_ttft(idle, 100, 32, LIN, 64, 256) == pytest.approx(step1 + step2, rel=1e-12)


def test_estimate_ttft_with_decodes_and_queue_hand_computed():
    inst = FakeInstance(0, num_running=2, num_waiting=1, decode_context_tokens=200,
                        queue=[(50, 0)])
    # step 1: 2 decodes, queued (50, 0), ours (12, 0) of 30
    step1 = 0.01 + 62e-4 + 2e-3 + 1e-6 * (200 + 50 + 12)
    # step 2: 3 decodes (old ones grew by 1 each; the queued one joined at 50 + 1), ours (18, 12)
    step2 = 0.01 + 18e-4 + 3e-3 + 1e-6 * ((200 + 2 + 51) + 30)
    assert estimate_ttft(inst, 30, 0, LIN, 64, 256) == pytest.approx(step1 + step2, rel=1e-12)


def test_estimate_ttft_gives_up_at_the_first_step_past_the_limit():
    inst = FakeInstance(0, num_running=1, num_waiting=1, queue=[(200, 0)])
    # Budget 64, 1 decode: the queued prompt takes 63, 63, 63 then its last 11 beside ours.
    s1 = 0.01 + 63e-4 + 1e-3 + 1e-6 * (0 + 63)
    s2 = 0.01 + 63e-4 + 1e-3 + 1e-6 * (1 + 126)
    s3 = 0.01 + 63e-4 + 1e-3 + 1e-6 * (2 + 189)
    full = estimate_ttft(inst, 30, 0, LIN, 64, 256)
    assert full > s1 + s2 + s3
    # A limit inside step 2 stops the replay at its end; a limit at or above the answer
    # changes nothing, so the verdict "TTFT <= limit" is the same either way.
    assert estimate_ttft(inst, 30, 0, LIN, 64, 256, give_up_above=s1 + 1e-6) == pytest.approx(
        s1 + s2, rel=1e-12
    )
    assert estimate_ttft(inst, 30, 0, LIN, 64, 256, give_up_above=full) == full
    assert estimate_ttft(inst, 30, 0, LIN, 64, 256, give_up_above=0.0) == pytest.approx(s1, rel=1e-12)


def test_estimate_ttft_partial_prefill_is_already_admitted():
    inst = FakeInstance(0, num_running=1, num_prefilling=1, queue=[(10, 54)])
    # max_num_seqs 2: the partial prefill runs without a new slot, ours takes the second.
    got = estimate_ttft(inst, 20, 0, LIN, 64, 2)
    want = 0.01 + 30e-4 + 1e-6 * ((54 + 10) + 20)
    assert got == pytest.approx(want, rel=1e-12)


def test_estimate_ttft_waits_for_the_step_in_flight():
    inst = FakeInstance(0, num_running=3, num_prefilling=1, decode_context_tokens=200,
                        queue=[(40, 24)])
    step = (0.004, [40])  # 4 ms left; the running step finishes the partial prefill
    # After it: 3 decodes, context 200 + 2 (the two decodes grew) + 65 (the new decode).
    want = 0.004 + 0.01 + 30e-4 + 3e-3 + 1e-6 * (267 + 30)
    assert estimate_ttft(inst, 30, 0, LIN, 64, 256, step) == pytest.approx(want, rel=1e-12)
    # Ignoring it re-plans the partial prefill from scratch (here: two steps, higher).
    assert estimate_ttft(inst, 30, 0, LIN, 64, 256) == pytest.approx(
        (0.01 + 62e-4 + 2e-3 + 1e-6 * (200 + 64 + 22)) + (0.01 + 8e-4 + 3e-3 + 1e-6 * (267 + 30)),
        rel=1e-12)
    # Mid decode step, ignoring it lets the request join a step under way: low by 4 ms.
    decoding = FakeInstance(0, num_running=2, decode_context_tokens=200, in_flight=(0.004, []))
    aware = estimate_ttft(decoding, 30, 0, LIN, 64, 256, decoding.in_flight)
    naive = estimate_ttft(decoding, 30, 0, LIN, 64, 256)
    assert aware - naive == pytest.approx(0.004 + 2e-6, rel=1e-9)


def test_estimate_ttft_one_token_chunk_is_priced_as_a_decode():
    got = estimate_ttft(FakeInstance(0), 1, 144, LIN, 64, 256)
    assert got == pytest.approx(0.01 + 1e-3 + 1e-6 * 145, rel=1e-12)


def test_estimate_ttft_blocked_forever_is_infinite():
    full = FakeInstance(0, num_running=2, decode_context_tokens=10)
    assert math.isinf(estimate_ttft(full, 10, 0, LIN, 64, 2))  # no slot ever frees
    assert math.isinf(estimate_ttft(full, 10, 0, LIN, 2, 256))  # decodes use the whole budget



@settings(max_examples=400, deadline=None)
@given(
    running=st.integers(0, 12),
    prefilling=st.integers(0, 3),
    waiting=st.integers(0, 2),
    dctx=st.integers(0, 5000),
    uncached=st.integers(1, 200),
    cached=st.sampled_from([0, 16, 64]),
    done=st.lists(st.integers(0, 80), min_size=0, max_size=5),
    remaining=st.sampled_from([None, 0.0, 0.0123]),
    budget=st.sampled_from([8, 64, 256]),
    max_seqs=st.sampled_from([4, 256]),
)
def test_estimate_shortcut_equals_the_step_loop(
    running, prefilling, waiting, dctx, uncached, cached, done, remaining, budget,
    max_seqs,
):
    """The one-step shortcut gives the loop's bits, or leaves the case to the loop."""
    import lmsim.policies.predictive as predictive

    prefilling = min(prefilling, running)
    queue = [(30 + 7 * k, 16 * k) for k in range(prefilling + waiting)]
    inst = FakeInstance(0, num_running=running, num_prefilling=prefilling, num_waiting=waiting,
                        decode_context_tokens=dctx, queue=queue)
    in_flight = None if remaining is None else (remaining, done[: len(queue)])
    fast = estimate_ttft(inst, uncached, cached, LIN, budget, max_seqs, in_flight)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(predictive, "_alone_in_first_step", lambda *args: None)
        loop = estimate_ttft(inst, uncached, cached, LIN, budget, max_seqs, in_flight)
    assert fast == loop


# ---------------------------------------------------------------- ViewAdapter
def test_adapter_exact_is_the_cluster_itself():
    a = ViewAdapter()
    a.bind(FakeContext())
    c = cluster_of()
    assert a.wrap(c) is c


def test_approximate_view_diverges_after_eviction():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    a = ViewAdapter(kv_view="approximate")
    a.bind(ctx)
    req = make_request(160)
    view = a.wrap(c)
    assert view.cached_prefix_tokens(req) == [0, 0, 0]
    a.on_routed(req, 1)
    c.instances[1].blocks = set(req.block_hashes)  # the engine cached it...
    again = make_request(160, req.block_hashes)
    assert c.cached_prefix_tokens(again) == view.cached_prefix_tokens(again) == [0, 144, 0]
    c.instances[1].blocks.clear()  # ...then evicted it: the exact view knows
    assert c.cached_prefix_tokens(again) == [0, 0, 0]
    assert a.wrap(c).cached_prefix_tokens(again) == [0, 144, 0]  # the router still believes
    assert view.instances[1].cached_prefix_tokens(again) == 144
    ctx.advance(121.0)  # until its TTL runs out
    assert view.cached_prefix_tokens(make_request(160, req.block_hashes)) == [0, 0, 0]


def test_approximate_view_without_ttl_keeps_a_prefix_like_sglangs_tree():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    a = ViewAdapter(kv_view="approximate", approx_ttl_s=None)
    a.bind(ctx)
    req = make_request(160)
    a.on_routed(req, 1)
    ctx.advance(3600.0)  # an hour later, with no eviction pressure, SGLang still matches it
    assert a.wrap(c).cached_prefix_tokens(make_request(160, req.block_hashes)) == [0, 144, 0]


def test_approximate_view_lru_capacity():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    a = ViewAdapter(kv_view="approximate", approx_capacity_blocks=10)
    a.bind(ctx)
    old, new = make_request(160), make_request(160)
    a.on_routed(old, 0)
    a.on_routed(new, 2)
    view = a.wrap(c)
    assert view.cached_prefix_tokens(make_request(160, old.block_hashes)) == [0, 0, 0]
    assert view.cached_prefix_tokens(make_request(160, new.block_hashes)) == [0, 0, 144]


def test_event_view_is_exact_but_delayed():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx)
    a = ViewAdapter(kv_view="events", kv_event_delay_s=0.05)
    a.bind(ctx)
    req = make_request(64)
    view = a.wrap(c)
    for h in req.block_hashes[:2]:
        ctx.emit_kv(2, h, True)
    ctx.advance(0.04)
    assert view.cached_prefix_tokens(make_request(64, req.block_hashes)) == [0, 0, 0]
    ctx.advance(0.05)
    assert view.cached_prefix_tokens(make_request(64, req.block_hashes)) == [0, 0, 32]
    ctx.emit_kv(2, req.block_hashes[0], False)  # eviction of the first block
    ctx.advance(0.08)
    assert view.cached_prefix_tokens(make_request(64, req.block_hashes)) == [0, 0, 32]
    ctx.advance(0.11)
    assert view.cached_prefix_tokens(make_request(64, req.block_hashes)) == [0, 0, 0]


def test_scraped_load_is_stale_until_the_next_scrape():
    ctx = FakeContext()
    c = cluster_of(ctx=ctx, num_running=[1, 2, 3])
    a = ViewAdapter(load_view="scraped", scrape_interval_s=0.1)
    a.bind(ctx)
    view = a.wrap(c)
    c.instances[0].num_running = 9
    c.instances[0].queue = [(5, 0)]
    ctx.advance(0.05)
    view = a.wrap(c)
    assert [v.num_running for v in view.instances] == [1, 2, 3]
    assert [v.batch_size for v in view.instances] == [1, 2, 3]
    assert view.instances[0].queued_prefills() == []
    ctx.advance(0.1)
    view = a.wrap(c)
    assert view.instances[0].num_running == 9 and view.instances[0].queued_prefills() == [(5, 0)]
    # KV stays exact in this mode.
    req = make_request(64)
    c.instances[1].blocks = set(req.block_hashes)
    assert view.cached_prefix_tokens(req) == [0, 48, 0]
    assert view.instances[1].cached_prefix_tokens(req) == 48


def test_adapter_rejects_bad_modes():
    with pytest.raises(ValueError, match=re.escape("'kv_view' must be one of exact|approximate")):
        ViewAdapter(kv_view="fuzzy")
    with pytest.raises(ValueError, match="param 'scrape_interval_s' must be > 0, got 0"):
        ViewAdapter(load_view="scraped", scrape_interval_s=0)


def test_policy_runs_on_an_adapted_view():
    from fakes import make_policy, route

    ctx = FakeContext()
    c = cluster_of(ctx=ctx, num_running=[2, 2, 2])
    a = ViewAdapter(kv_view="approximate", load_view="scraped")
    a.bind(ctx)
    p = make_policy("lmetric", ctx)
    first = make_request(160)
    choice = route(p, first, a.wrap(c))
    a.on_routed(first, choice)
    follow = make_request(160, first.block_hashes)
    assert p.choose(follow, a.wrap(c)) == choice  # the router's own index says it is cached
