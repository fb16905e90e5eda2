"""The run-at-a-time prefix cache and global index against the block-by-block reference
(tests/reference_kv.py): random sequences of the calls the scheduler makes (capped prefix
hits, chunked prefills that register as they go, duplicates computed twice, repeated hashes,
decode blocks, finishes and preemptions mid-prefill, evictions in the middle of a cached
prefix) must give the same answer to every call, the same evictions in the same order and
the same pool state after every step, under both free-queue orders (vLLM 0.33's content-free
blocks first, vLLM 0.11's release order)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_kv import ReferenceGlobalIndex, ReferencePrefixCache

from lmsim.engine.kv_cache import ANON, GlobalPrefixIndex, PrefixCache

NUM_INSTANCES = 2


def chain(path: list[int], repeat_at: int | None) -> list[int]:
    """Chained hashes: equal prefixes of `path` give equal hashes, as trace ids do. With
    `repeat_at`, one hash is repeated (traces with repeated ids exist)."""
    out, acc = [], 0
    for j, step in enumerate(path):
        acc = acc * 7 + step + 1
        out.append(acc % 997 * 64 + j)
    if repeat_at is not None and len(out) > 1:
        k = repeat_at % (len(out) - 1)
        out[k + 1] = out[k]
    return out


class Pair:
    """The same operations on the new cache and the reference, compared call by call."""

    def __init__(self, num_blocks: int, order: str = "content_free_first") -> None:
        self.new_events: list[tuple[int, int, bool]] = []
        self.ref_events: list[tuple[int, int, bool]] = []
        self.new_index = GlobalPrefixIndex(NUM_INSTANCES)
        self.ref_index = ReferenceGlobalIndex(NUM_INSTANCES)
        self.new = [
            PrefixCache(
                num_blocks, 16, i, self.new_index, [lambda *e: self.new_events.append(e)], free_queue_order=order
            )
            for i in range(NUM_INSTANCES)
        ]
        # Instance 0 compacts its free queue whenever a touch leaves a stale occurrence in
        # it; instance 1 keeps them (the default slack), so both paths are compared.
        self.new[0]._compact_slack = -(10**9)
        self.ref = [
            ReferencePrefixCache(
                num_blocks, 16, i, self.ref_index, [lambda *e: self.ref_events.append(e)], free_queue_order=order
            )
            for i in range(NUM_INSTANCES)
        ]

    def call(self, inst: int, name: str, *args):
        new_args = [list(a) if isinstance(a, list) else a for a in args]
        version, cached = self.new[inst].version, set(self.new[inst].cached_hashes)
        if name == "register_one":  # the one-block fast path; the reference registers a range
            hashes, keys, j = args
            got = self.new[inst].register_one(*new_args)
            want = self.ref[inst].register_range(hashes, keys, j, j + 1)
        else:
            got = getattr(self.new[inst], name)(*new_args)
            want = getattr(self.ref[inst], name)(*args)
        assert got == want, (name, args)
        if name in ("register_range", "register_one"):  # fill `keys` in place
            assert new_args[1] == args[1]
        # A match remembered under a version must still hold while the version is unchanged.
        if self.new[inst].version == version:
            assert self.new[inst].cached_hashes == cached, name
        assert all(c.version != version for c in self.new[:inst] + self.new[inst + 1 :])
        return want

    def assert_same_state(self, probes: list[list[int]]) -> None:
        assert self.new_events == self.ref_events
        for new, ref in zip(self.new, self.ref):
            assert new.num_free_blocks == ref.num_free_blocks
            assert new.num_evictions == ref.num_evictions
            assert new.refcounts() == ref._ref
            assert new.free_queue() == ref.free_queue()
            assert new.num_plain_free == ref._plain_free
            assert new.entries() == ref._copies
            assert new.free_entries(len(ref._free)) == ref.free_entries(len(ref._free))
            assert new._dup_hash == ref._dup_hash
            assert new._next_dup == ref._next_dup
            assert new.free_entries(5) == ref.free_entries(5)
            for p in probes:
                assert new.match(p, len(p)) == ref.match(p, len(p))
                assert [new.contains(h) for h in p] == [ref.contains(h) for h in p]
        for p in probes:
            for cap in (0, 1, len(p) - 1, len(p)):
                assert self.new_index.match_blocks(p, cap) == self.ref_index.match_blocks(p, cap)
            assert list(map(self.new_index.holders, p)) == list(map(self.ref_index.holders, p))


class Held:
    def __init__(self, inst: int, hashes: list[int], keys: list[int], computed: int) -> None:
        self.inst = inst
        self.hashes = hashes
        self.keys = keys
        self.computed = computed  # blocks filled so far
        self.decode_blocks = 0


op = st.tuples(
    st.sampled_from(["admit", "chunk", "decode", "release", "duplicate"]),
    st.integers(0, NUM_INSTANCES - 1),
    st.lists(st.integers(0, 2), min_size=1, max_size=9),  # prefix-tree path of a prompt
    st.integers(1, 5),  # chunk size in blocks / decode blocks
    st.integers(0, 30),  # which held request / cap trim
    st.one_of(st.none(), st.integers(0, 8)),  # repeated hash position
)


@pytest.mark.parametrize("order", ["content_free_first", "release"])
@settings(max_examples=300, deadline=None)
@given(st.integers(4, 24), st.lists(op, max_size=60))
def test_run_cache_equals_block_by_block_reference(order, num_blocks, operations):
    pair = Pair(num_blocks, order)
    held: list[Held] = []
    probes: list[list[int]] = []
    for kind, inst, path, size, pick, repeat_at in operations:
        hashes = chain(path, repeat_at)
        probes.append(hashes)
        if kind in ("admit", "duplicate"):
            # vLLM caps the hit so at least one token is computed; `pick` trims it further.
            cap = max(0, len(hashes) - 1 - pick % 3)
            hit = pair.call(inst, "match", hashes, cap)
            if kind == "duplicate":
                hit = 0  # admitted without its hit (e.g. scheduled before the twin registered)
            first = min(len(hashes) - hit, size)
            need = first + pair.call(inst, "num_free_among", hashes, hit)
            if need > pair.ref[inst].num_free_blocks:
                continue
            keys = pair.call(inst, "touch", hashes, hit)
            keys = keys + pair.call(inst, "allocate", first)
            pair.call(inst, "register_range", hashes, keys, hit, hit + first)
            held.append(Held(inst, hashes, keys, hit + first))
        elif kind == "chunk" and held:
            h = held[pick % len(held)]
            more = min(size, len(h.hashes) - h.computed)
            if more == 0 or more > pair.ref[h.inst].num_free_blocks:
                continue
            h.keys = h.keys + pair.call(h.inst, "allocate", more)
            if more == 1:  # a decode step filling one block takes the scheduler's fast path
                pair.call(h.inst, "register_one", h.hashes, h.keys, h.computed)
            else:
                pair.call(h.inst, "register_range", h.hashes, h.keys, h.computed, h.computed + more)
            h.computed += more
        elif kind == "decode" and held:
            h = held[pick % len(held)]
            if size > pair.ref[h.inst].num_free_blocks:
                continue
            pair.call(h.inst, "allocate_anonymous_run", size)
            h.decode_blocks += size
        elif kind == "release" and held:
            h = held.pop(pick % len(held))  # a finish, or a preemption part-way
            pair.call(h.inst, "release", h.keys, h.decode_blocks)
        pair.assert_same_state(probes[-6:])
        for i, cache in enumerate(pair.new):
            mine = [h for h in held if h.inst == i]
            refs: dict[int, int] = {}
            for h in mine:
                for k in h.keys:
                    if k != ANON:
                        refs[k] = refs.get(k, 0) + 1
            blocks = sum(len(h.keys) + h.decode_blocks for h in mine)
            assert cache.check(blocks, refs) == []
    for h in held:
        pair.call(h.inst, "release", h.keys, h.decode_blocks)
    pair.assert_same_state(probes)


@pytest.mark.parametrize("order", ["content_free_first", "release"])
@pytest.mark.parametrize("inst", range(NUM_INSTANCES))
def test_run_paths_that_random_sequences_rarely_reach(inst, order):
    """Hand-built sequences for the rare paths, on both instances (compacting and not): many
    stale occurrences evicted at once, a request whose shared blocks are not its leading
    ones, a key held twice by one request, and a repeated hash hit on a free block."""
    pair = Pair(12, order)
    step = 0

    def do(name, *args):
        nonlocal step
        out = pair.call(inst, name, *args)
        pair.assert_same_state([[1, 2, 3], [5, 5, 6], list(range(10, 19))])
        step += 1
        return out

    # Many stale occurrences in one evicted run: A's 9 entries are freed, B hits 7 of
    # them and is freed too; evicting everything skips A's 7 stale occurrences.
    # Then the same with a few stale occurrences.
    run = list(range(10, 19))
    for hits in (7, 2):
        a = do("allocate", 9)
        do("register_range", run, a, 0, 9)
        do("release", tuple(a))  # any sequence of keys
        b = do("touch", run, hits) + do("allocate", 1)
        do("register_range", run, b, hits, hits + 1)
        do("release", b)
        do("allocate", pair.ref[inst].num_free_blocks)
        do("release", [ANON] * 12)
    # Shared blocks in the middle: C holds entry 1; A computed 1 again (a duplicate),
    # 2 and 3; B hits 1 (C's, the oldest) and A's 2. A's release frees 3 and its
    # duplicate of 1 around the shared 2.
    c = do("allocate", 1)
    do("register_range", [1], c, 0, 1)
    a = do("allocate", 3)
    do("register_range", [1, 2, 3], a, 0, 3)
    b = do("touch", [1, 2, 3], 2)
    for keys in (a, b, c):
        do("release", keys)
    # A key held twice by one request: hash 5 twice in a prompt; B hits both on entry 5.
    a = do("allocate", 3)
    do("register_range", [5, 5, 6], a, 0, 3)
    b = do("touch", [5, 5, 6], 3)
    c = do("touch", [5, 5, 6], 2)
    e = do("allocate", 1)
    do("register_range", [5], e, 0, 1)  # a third entry of hash 5
    for keys in (b, a, c, e):
        do("release", keys)
    # The same, hit while free: the first hit takes entry 5 out of the queue.
    assert do("num_free_among", [5, 5, 6], 3) == 3
    b = do("touch", [5, 5, 6], 3)
    do("release", b)
    # Evict part of the first freed run (A's 3 and its duplicate of 1: entry 1 is the
    # only copy left), then everything.
    do("allocate", pair.ref[inst].num_plain_free + 1)
    do("allocate", 1)
    do("allocate", pair.ref[inst].num_free_blocks)
    assert step == 42


def test_release_order_queues_content_free_blocks_where_they_are_freed():
    """vLLM 0.11's free queue: every freed block at the back, tail first. A request holding
    [1, 2, unnamed, 3] plus 2 unnamed decode blocks frees them as: 2 decode blocks, 3, the
    unnamed one, 2, 1; allocating 4 blocks after the 8 never-used ones evicts nothing for
    the 2 content-free blocks and then 3, and the next allocation reuses the unnamed block
    before evicting 2. With vLLM 0.33's order the content-free blocks are reused first."""
    for order, queue in (("release", [ANON, ANON, 3, ANON, 2, 1]), ("content_free_first", [3, 2, 1])):
        pair = Pair(12, order)
        keys = pair.call(0, "allocate", 4)
        pair.call(0, "register_range", [1, 2, 7, 3], keys, 0, 2)
        pair.call(0, "register_range", [1, 2, 7, 3], keys, 3, 4)
        pair.call(0, "allocate_anonymous_run", 2)
        pair.call(0, "release", keys, 2)
        pair.assert_same_state([[1, 2, 3]])
        assert pair.new[0].free_queue() == queue
        pair.call(0, "allocate", pair.ref[0].num_plain_free + 3)
        pair.assert_same_state([[1, 2, 3]])
        assert pair.new[0].num_evictions == (1 if order == "release" else 3)
