"""The block pool and prefix cache, on exact small states, and the global prefix index
against a brute-force scan of every instance."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lmsim.engine.kv_cache import ANON, GlobalPrefixIndex, PrefixCache, engine_block_hashes


def test_allocation_takes_never_used_blocks_before_evicting_cached_ones():
    cache = PrefixCache(6, 16)
    keys = cache.allocate(2)
    a = [cache.register(10), cache.register(11)]
    assert a == [10, 11] and len(keys) == 2
    cache.release(a)
    assert cache.num_free_blocks == 6
    cache.allocate(4)  # the four never-used blocks
    assert cache.match([10, 11], 2) == 2  # still cached
    cache.allocate(1)  # now the head of the free queue: 11 (released first, tail first)
    assert cache.match([10, 11], 2) == 1
    assert cache.contains(10) and not cache.contains(11)


def test_release_order_puts_a_requests_tail_first():
    # A request holding [1, 2, 3] releases 3, then 2, then 1: allocation evicts 3 first, so the
    # shared prefix [1, 2] survives longest.
    cache = PrefixCache(3, 16)
    cache.allocate(3)
    keys = [cache.register(h) for h in (1, 2, 3)]
    cache.release(keys)
    cache.allocate(1)
    assert [cache.contains(h) for h in (1, 2, 3)] == [True, True, False]
    cache.allocate(1)
    assert [cache.contains(h) for h in (1, 2, 3)] == [True, False, False]


def test_freed_blocks_without_content_go_to_the_front_of_the_free_queue():
    # vLLM 0.33 BlockPool.free_blocks: 4 blocks. A request holds cache entries 1, 2 and two
    # content-free blocks (a partial block and a decode block). Released, the queue is
    # [anon, anon][2, 1]: the next two allocations take the content-free blocks and
    # evict nothing; only the third evicts (2, the tail entry). Appending the content-free
    # blocks at the back (vLLM 0.11) would evict 2 and 1 first.
    cache = PrefixCache(4, 16)
    keys = cache.allocate(4)
    keys[0], keys[1] = cache.register(1), cache.register(2)
    cache.release(keys[:3], extra_anonymous=1)
    cache.allocate(2)
    assert cache.num_evictions == 0 and cache.match([1, 2], 2) == 2
    cache.allocate(1)
    assert cache.num_evictions == 1 and cache.match([1, 2], 2) == 1


def test_hits_take_references_and_duplicates_are_cache_entries_too():
    cache = PrefixCache(8, 16)
    cache.allocate(2)
    a = [cache.register(1), cache.register(2)]
    b = cache.touch([1, 2], 2)  # a hit on in-use blocks only bumps reference counts
    assert b == [1, 2] and cache.refcount(1) == 2 and cache.num_free_blocks == 6
    cache.allocate(1)
    dup = cache.register(2)  # computed again while cached: a second entry of hash 2
    assert dup < ANON and cache.refcount(2) == 2 and cache.refcount(dup) == 1
    assert cache.num_copies(2) == 2 and cache.hash_of(dup) == 2
    cache.release(b)
    cache.release(a)
    cache.release([dup])
    assert cache.num_free_blocks == 8
    assert cache.check(0, {}) == []


def test_evicting_the_first_copy_keeps_the_prefix_cached():
    # 5 blocks. A holds [1, 2]; B hits 1 and recomputes 2 (say its hit was capped): a
    # duplicate. A is released, then B: the queue is [2 content-free][A's 2, B's 2, 1].
    # Evicting A's copy leaves hash 2 cached through B's copy (with one entry per hash,
    # the prefix would have been lost with the first eviction).
    cache = PrefixCache(5, 16)
    cache.allocate(3)
    a = [cache.register(1), cache.register(2)]
    b = [*cache.touch([1], 1), cache.register(2)]
    cache.release(a)  # entries 2, 1 (A's) go to the back; B still holds 1 and its dup of 2
    cache.release(b)  # dup 2 to the back, 1 drops to refcount 0 and joins the back
    assert cache.num_free_blocks == 5 and cache.num_copies(2) == 2
    cache.allocate(2)  # the two content-free blocks: nothing evicted
    assert cache.num_evictions == 0
    cache.allocate(1)  # evicts A's copy of 2 (released first)
    assert cache.num_evictions == 1 and cache.contains(2) and cache.match([1, 2], 2) == 2
    cache.allocate(1)  # evicts B's copy of 2: now the hash is gone
    assert not cache.contains(2) and cache.match([1, 2], 2) == 1


def test_a_hit_is_served_by_the_oldest_copy_even_when_a_younger_one_is_in_use():
    # vLLM get_one_block returns the first copy inserted: if it is free, the hit consumes
    # a free block although another copy of the same content is in use.
    cache = PrefixCache(4, 16)
    cache.allocate(2)
    first = cache.register(7)
    second = cache.register(7)
    cache.release([first])
    assert cache.num_free_among([7], 1) == 1
    assert cache.touch([7], 1) == [first] and cache.num_free_blocks == 2
    cache.release([first, second])
    assert cache.check(0, {}) == []


def test_touching_a_free_cached_block_takes_it_out_of_the_free_queue():
    cache = PrefixCache(4, 16)
    cache.allocate(2)
    cache.release([cache.register(7), cache.register(8)])
    assert cache.num_free_among([7, 8], 2) == 2
    cache.touch([7, 8], 1)
    assert cache.num_free_blocks == 3 and cache.refcount(7) == 1
    cache.allocate(3)  # pops the 2 never-used blocks, then 8 (7 is in use)
    assert cache.contains(7) and not cache.contains(8)


def test_engine_hashes_from_larger_and_smaller_trace_blocks():
    ids = np.array([5, 9], dtype=np.int64)
    # Mooncake-style 512-token ids: 32 engine blocks each, keyed id*32 + position.
    hashes = engine_block_hashes(ids, 512, 1000, 16)
    assert len(hashes) == 62  # 1000 // 16 full engine blocks
    assert hashes[0] == 5 * 32 and hashes[31] == 5 * 32 + 31 and hashes[32] == 9 * 32
    # 8-token trace blocks: an engine block is known when both halves are.
    assert engine_block_hashes(np.array([1, 2, 3, 4, 5]), 8, 40, 16) == [2, 4]
    # Same size, partial last block is not hashed.
    assert engine_block_hashes(np.array([1, 2, 3]), 16, 40, 16) == [1, 2]


ops = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 12), min_size=1, max_size=6), st.booleans()),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_global_index_matches_a_brute_force_scan(operations):
    """Random admit/release sequences on 4 small caches sharing one index: the index's
    one-pass match lengths equal each cache's own block-by-block match, for every prefix."""
    index = GlobalPrefixIndex(4)
    caches = [PrefixCache(10, 16, i, index) for i in range(4)]
    held: list[list[tuple[PrefixCache, list[int]]]] = [[] for _ in range(4)]
    for inst, chain, release in operations:
        cache = caches[inst]
        hashes = [sum(chain[: j + 1]) * 100 + j for j in range(len(chain))]  # chained ids
        if release and held[inst]:
            c, keys = held[inst].pop(0)
            c.release(keys)
            continue
        hit = cache.match(hashes, len(hashes))
        need = len(hashes) - hit + cache.num_free_among(hashes, hit)
        if need > cache.num_free_blocks:
            continue
        keys = cache.touch(hashes, hit)
        cache.allocate(len(hashes) - hit)
        keys += [cache.register(h) for h in hashes[hit:]]
        held[inst].append((cache, keys))
        probe = hashes
        assert index.match_blocks(probe, len(probe)) == [c.match(probe, len(probe)) for c in caches]
    for _, chain, _ in operations:
        probe = [sum(chain[: j + 1]) * 100 + j for j in range(len(chain))]
        for cap in (0, 1, len(probe)):
            assert index.match_blocks(probe, cap) == [c.match(probe, cap) for c in caches]
