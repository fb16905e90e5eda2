"""Host memory and disk below the GPU KV cache (lmsim/engine/kv_tiers.py), numbers by hand.

Profile (conftest LINEAR): step = 10 ms + 1 ms per prefill token + 0.1 ms per decode
sequence. KV: 1,000 bytes per token, so a 16-token block is 16,000 bytes.

The eviction scenario used throughout, on a 16-block GPU pool: A (160 tokens = blocks 1..10,
one output) runs at 0; B (240 tokens = 15 other blocks) at 1.0 needs 15 blocks, so A's blocks
are evicted tail first and only A's first block stays; A2 (A's prompt again) at 2.0 hits that
one block on the GPU (16 tokens) and finds the other 9 (144 tokens, 144,000 bytes) below.
Recomputing them costs a 10 + 144 ms step; loading them 144,000 B / bandwidth, and then the
last token is recomputed (vLLM recomputes it when everything is loaded): a 10 + 1 ms step.
"""

from __future__ import annotations

import pytest

from conftest import make_config, make_trace
from lmsim.engine.clock import SAMPLE, schedule_at
from lmsim.engine.kv_tiers import BlockStore
from lmsim.study.compose import build_simulation

A, B = list(range(1, 11)), list(range(100, 115))
EVICT = make_trace([0.0, 1.0, 2.0], [160, 240, 160], [1, 1, 1], [A, B, A])


def tiers(host=100, read=1e9, write=1e9, **extra):
    return {"host": {"capacity_blocks": host, "read_bytes_s": read, "write_bytes_s": write},
            "kv_bytes_per_token": 1000, **extra}


def run(trace, kv_tiers=None, blocks=16, **sim):
    cluster = {"num_gpu_blocks": blocks}
    if kv_tiers is not None:
        cluster["kv_tiers"] = kv_tiers
    s = build_simulation(make_config(cluster=cluster, simulation={"check": True, **sim}), trace)
    return s, s.run()


def test_a_prefix_evicted_from_the_gpu_and_found_in_host_memory_costs_its_load_time():
    _, plain = run(EVICT)
    _, r = run(EVICT, tiers())
    a2 = r.requests.iloc[2]
    assert plain.requests.iloc[2].ttft_s == pytest.approx(0.010 + 0.144)
    # 144,000 B at 1e9 B/s = 0.144 ms, then the last token: 11 ms
    assert a2.ttft_s == pytest.approx(144_000 / 1e9 + 0.011, abs=1e-12)
    assert (a2.cached_tokens, a2.kv_hit_tokens_host, a2.kv_hit_tokens_disk) == (16, 144, 0)
    assert a2.kv_load_bytes == 144_000 and a2.kv_load_s == pytest.approx(144e-6, abs=1e-12)
    s = r.summary
    assert s["prefix_hit_ratio_first_admission_host"] == pytest.approx(144 / 560)
    assert (s["kv_num_loads"], s["kv_load_bytes_host"], s["kv_h2d_bytes"]) == (1, 144_000, 144_000)
    # stored: A's 10 blocks, B's 15, A2's last block is already there: 25 x 16,000 B
    assert s["kv_offload_bytes_host"] == 25 * 16_000
    assert s["kv_d2h_busy_s"] == pytest.approx(25 * 16_000 / 1e9)


def test_a_disk_hit_costs_the_disk_read_and_then_the_host_copy():
    # host memory of 15 blocks: B's 15 push A out of it; the disk (100 blocks, 1e8 B/s,
    # 1 ms first byte) still has A: 1 ms + 144,000 B / 1e8 + 144,000 B / 1e9 + 11 ms
    disk = {"capacity_blocks": 100, "read_bytes_s": 1e8, "write_bytes_s": 1e8, "latency_s": 0.001}
    _, r = run(EVICT, tiers(host=15, disk=disk))
    a2 = r.requests.iloc[2]
    assert a2.ttft_s == pytest.approx(0.001 + 144_000 / 1e8 + 144_000 / 1e9 + 0.011, abs=1e-12)
    assert (a2.kv_hit_tokens_host, a2.kv_hit_tokens_disk) == (0, 144)
    assert a2.kv_load_bytes == 2 * 144_000  # read from disk, then across to the GPU
    _, host_hit = run(EVICT, tiers())
    assert a2.ttft_s > host_hit.requests.iloc[2].ttft_s
    assert r.summary["prefix_hit_ratio_first_admission_disk"] == pytest.approx(144 / 560)


def test_a_block_enters_host_memory_when_its_copy_lands_and_disk_after_that():
    # A's prefill step ends at 0.170; its 10 blocks (160,000 B) take 0.16 s at 1e6 B/s to
    # reach host memory (0.33), and 0.16 s more to reach the disk (0.49).
    disk = {"capacity_blocks": 100, "read_bytes_s": 1e6, "write_bytes_s": 1e6, "latency_s": 0.0}
    trace = make_trace([0.0], [160], [1], [A])
    sim = build_simulation(make_config(cluster={"num_gpu_blocks": 16, "kv_tiers": tiers(write=1e6, disk=disk)}), trace)
    tier = sim.kv_tiers[0]
    seen = {}

    def probe(_e, t):
        tier.catch_up(t)
        seen[t] = (tier.host.leading(A, 0, 10), tier.disk.leading(A, 0, 10))

    for t in (0.169, 0.329, 0.331, 0.489, 0.491):
        schedule_at(sim.env, t, SAMPLE, lambda e, t=t: probe(e, t))
    sim.run()
    assert seen == {0.169: (0, 0), 0.329: (0, 0), 0.331: (10, 0), 0.489: (10, 0), 0.491: (10, 10)}


def test_in_step_load_stalls_the_batch_by_the_load_time():
    # 20 GPU blocks. C (50 tokens, 60 outputs) decodes from 1.5; by 2.0 its KV has taken
    # every block A left on the GPU, so A2 loads all 10 blocks (160,000 B: 0.16 ms) from
    # host memory. before_admission, C's decode steps are untouched by the load; in_step,
    # the step that admits A2 is 0.16 ms longer for everyone in it, C included.
    trace = make_trace([0.0, 1.0, 1.5, 2.0], [160, 240, 50, 160], [1, 1, 60, 1], [A, B, [300, 301, 302], A])
    _, before = run(trace, tiers(), blocks=20)
    _, inside = run(trace, tiers(load="in_step"), blocks=20)
    a2 = inside.requests.iloc[3]
    assert (a2.cached_tokens, a2.kv_hit_tokens_host) == (0, 160)
    assert a2.kv_load_s == pytest.approx(160_000 / 1e9, abs=1e-12)
    c0, c1 = before.requests.iloc[2], inside.requests.iloc[2]
    assert c1.finished_at - c0.finished_at == pytest.approx(160_000 / 1e9, abs=1e-12)


def test_a_host_tier_of_zero_blocks_is_no_tier():
    _, plain = run(EVICT)
    sim, zero = run(EVICT, tiers(host=0))
    assert sim.kv_tiers == {}
    assert zero.requests.equals(plain.requests)
    unpinned = {"wall_time_s", "router_us_per_decision", "requests_per_wall_s"}
    assert {k: v for k, v in zero.summary.items() if k not in unpinned} == {
        k: v for k, v in plain.summary.items() if k not in unpinned
    }


def test_stores_alone_change_no_timing():
    # 64 GPU blocks: nothing is evicted, every hit is on the GPU; copying every block to host
    # memory moves bytes but no request's times. (170-token prompts: the GPU hit covers all
    # 10 full blocks, so the tiers have nothing to add.)
    trace = make_trace([0.0, 1.0, 2.0], [170, 240, 170], [1, 1, 1], [A, B, A])
    _, plain = run(trace, blocks=64)
    _, tiered = run(trace, tiers(), blocks=64)
    assert tiered.requests[plain.requests.columns].equals(plain.requests)
    assert tiered.summary["kv_num_loads"] == 0 and tiered.summary["kv_offload_bytes_host"] > 0


def test_the_tiers_supply_the_last_full_block_that_the_gpu_hit_leaves_out():
    # A2's 160 tokens are 10 full blocks, all on the GPU, but a GPU hit stops at 9 so that a
    # token is computed (16 tokens, a 26 ms step). vLLM's connector may offer the 10th block
    # (it has it in host memory): 16,000 B load, then 1 token recomputed (11 ms).
    _, plain = run(EVICT, blocks=64)
    _, tiered = run(EVICT, tiers(), blocks=64)
    assert plain.requests.iloc[2].ttft_s == pytest.approx(0.026)
    a2 = tiered.requests.iloc[2]
    assert (a2.cached_tokens, a2.kv_hit_tokens_host) == (144, 16)
    assert a2.ttft_s == pytest.approx(16_000 / 1e9 + 0.011, abs=1e-12)


def test_on_eviction_copies_only_what_the_gpu_evicts():
    # B evicts A's 9 tail blocks, copied; A2 finds them, and the 9 GPU blocks its load needs
    # evict 9 of B's, copied too: 18 x 16,000 B
    _, r = run(EVICT, tiers(store="on_eviction"))
    assert r.summary["kv_offload_bytes_host"] == 18 * 16_000
    assert r.requests.iloc[2].kv_hit_tokens_host == 144
    _, none = run(EVICT, tiers(store="on_eviction"), blocks=64)
    assert none.summary["kv_offload_bytes_host"] == 0


def test_prompt_scope_skips_generated_blocks():
    # Row 0 (160 tokens, 40 outputs) is continued by row 1 (its parent): its output blocks are
    # named 11 and 12. Row 1 (208 tokens = 13 blocks) hits 12 on the GPU and adds block 13.
    # Stored: all = 10 + 2 + 1 blocks, prompt = 10 + 1.
    trace = make_trace([0.0, 5.0], [160, 208], [40, 1], [A, [*A, 11, 12, 13]], parent_id=[-1, 0])
    _, everything = run(trace, tiers(), blocks=64)
    _, prompt = run(trace, tiers(store_scope="prompt"), blocks=64)
    assert everything.summary["kv_offload_bytes_host"] == 13 * 16_000
    assert prompt.summary["kv_offload_bytes_host"] == 11 * 16_000


def test_block_store_is_lru_touched_on_hit():
    store = BlockStore(3)
    assert store.insert([1, 2, 3]) == []
    store.touch([1])
    assert store.insert([4]) == [2]  # 1 was touched: 2 is the least recent
    assert store.order() == [3, 1, 4]
    assert store.leading([3, 1, 9, 4], 0, 4) == 2


MIXED = make_trace(
    [0.0, 0.02, 0.05, 0.3, 0.32, 0.6, 0.61, 0.9],
    [160, 240, 100, 160, 250, 170, 100, 240],
    [40, 30, 60, 20, 10, 30, 25, 5],
    [A, B, [50, 51, 52, 53, 54, 55], A, [*B, 116], [*A, 12], [50, 51, 52, 53, 54, 55], B],
)


@pytest.mark.parametrize("kv", [
    tiers(host=30),
    tiers(host=12, disk={"capacity_blocks": 60, "read_bytes_s": 5e7, "write_bytes_s": 5e7}),
    tiers(host=20, store="on_eviction", sharing="fair", read=2e7, write=2e7),
    tiers(host=40, store_scope="prompt", load="in_step", sharing="none"),
])
def test_fast_forward_changes_nothing_with_tiers(kv):
    runs = [run(MIXED, kv, blocks=30, fast_forward=ff)[1] for ff in (True, False)]
    assert runs[0].requests.equals(runs[1].requests)
    assert (runs[0].requests.status.astype(str) == "finished").all()
    keys = [k for k in runs[0].summary if k.startswith(("kv_", "prefix_hit"))]
    assert {k: runs[0].summary[k] for k in keys} == {k: runs[1].summary[k] for k in keys}
    assert runs[0].summary["kv_num_loads"] > 0


def test_a_preempted_request_waits_behind_loaded_ones_so_a_small_pool_drains():
    """150 GPU blocks, two instances, a minute of chatbot traffic: requests preempted after
    producing output used to go back to the very front of the queue, ahead of loaded requests
    holding blocks; once nothing ran, the head waited for those blocks forever (empty steps
    until the drain limit). Behind them, every request finishes."""
    from test_sweep import tiny_experiment

    from lmsim.config import validate
    from lmsim.study.experiment import load_workload_trace

    raw = tiny_experiment()
    raw["cluster"] = {**raw["cluster"], "num_gpu_blocks": 150, "kv_tiers": tiers(host=2000)}
    raw["simulation"] = {"drain_limit_s": 100, "check": True}
    cfg = validate(raw, where="test")
    r = build_simulation(cfg, load_workload_trace(cfg)).run()
    assert r.summary["num_unfinished"] == 0 and r.summary["num_preemptions"] > 0
    assert r.summary["kv_num_loads"] > 0


# -- host-memory recency as vLLM's OffloadingConnector keeps it (issue 34, item 5) ---------

P4 = [900, 901, 902, 903]  # a 4-block prefix every request below shares


def test_every_lookup_refreshes_the_request_s_blocks_so_a_prefix_hot_on_the_gpu_stays_below():
    """OffloadingConnectorScheduler.get_num_new_matched_tokens touches all of a request's
    blocks in the host LRU at every lookup, the ones the GPU hits too. A 64-block GPU pool
    (nothing is evicted there) over a 12-block host tier: R0 = the prefix + 1 block (80
    tokens) stores 5 blocks; R1..R5 (the prefix + 2 blocks of their own, 96 tokens, 1 s
    apart) each hit the prefix on the GPU and store their 2 blocks: 15 blocks for a 12-block
    tier, so R4 and R5 evict 3. Each lookup refreshed the prefix, so the least recent are
    R0's own block and R1's two; before issue 34 nothing refreshed it (a GPU hit never
    touched host memory) and the prefix's first 3 blocks aged out."""
    rows = [[*P4, 1000]] + [[*P4, 1000 + 10 * i, 1001 + 10 * i] for i in range(1, 6)]
    trace = make_trace([float(i) for i in range(6)], [80] + [96] * 5, [1] * 6, rows)
    sim, r = run(trace, tiers(host=12), blocks=64)
    host = sim.kv_tiers[0].host
    assert r.summary["kv_host_evictions"] == 3
    assert all(h in host for h in P4)
    assert not any(h in host for h in (1000, 1010, 1011))


def test_gpu_hit_blocks_the_host_has_lost_are_stored_again():
    """vLLM stores a request's blocks from its first one (`_get_reqs_to_store` starts at
    block 0; `prepare_store` skips those host memory has). Host tier of 6 blocks, GPU of 64:
    R0 (the 4-block prefix, 64 tokens) stores 4 blocks; X (6 blocks of its own) stores 6,
    evicting the prefix from host memory while the GPU keeps it; R1 (the prefix + 1 block)
    hits it on the GPU, and its step stores the prefix again with its new block: 4 + 6 + 5
    blocks x 16,000 B copied (before issue 34: 4 + 6 + 1, and the prefix stayed lost)."""
    trace = make_trace([0.0, 1.0, 2.0], [64, 96, 80], [1, 1, 1],
                       [P4, list(range(950, 956)), [*P4, 960]])
    sim, r = run(trace, tiers(host=6), blocks=64)
    assert r.summary["kv_offload_bytes_host"] == (4 + 6 + 5) * 16_000
    assert all(h in sim.kv_tiers[0].host for h in [*P4, 960])


def test_a_store_that_does_not_fit_is_skipped_whole():
    """`LRUOffloadingManager.prepare_store` returns None when it cannot evict enough ready
    blocks, and the store is skipped, not cut. Host tier of 12 blocks: A's 10 are stored;
    B's 15 cannot fit even with A's evicted, so host memory keeps A and none of B (before
    issue 34 B's copy evicted A and left B's last 12 blocks); A2 then loads A's 9 blocks
    past its 1-block GPU hit from host memory: 144,000 B at 1e9 B/s, then its last token
    (11 ms)."""
    sim, r = run(EVICT, tiers(host=12))
    tier = sim.kv_tiers[0]
    assert sorted(tier.host.order()) == A  # (in the order A2's lookup refreshed them)
    assert tier.host.num_skipped == 15
    a2 = r.requests.iloc[2]
    assert (a2.cached_tokens, a2.kv_hit_tokens_host) == (16, 144)
    assert a2.ttft_s == pytest.approx(144_000 / 1e9 + 0.011, abs=1e-12)
    assert r.summary["kv_offload_bytes_host"] == 10 * 16_000


def test_block_store_prepare_store_reserves_room_and_spares_blocks_in_use():
    store = BlockStore(4)
    assert store.prepare_store([1, 2, 3]) == ([1, 2, 3], [])
    assert store.leading([1, 2, 3], 0, 3) == 0  # being stored: not readable yet
    store.complete_store([1, 2])
    assert store.leading([1, 2, 3], 0, 3) == 2
    store.pin([1])  # a load reads 1
    assert store.prepare_store([4, 5]) == ([4, 5], [2])  # 1 is read, 3 is being stored: 2 goes
    assert store.prepare_store([6, 7]) is None  # nothing else is evictable: skipped whole
    assert store.order() == [1, 3, 4, 5]
    store.touch([4, 5])  # walked backwards: 4 ends most recent
    assert store.order() == [1, 3, 5, 4]
