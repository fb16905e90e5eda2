"""The paged KV cache of one instance, with vLLM-v1 prefix caching, and the cluster-wide
index of which instance holds which block.

Model (costmodel.md §7, vLLM `block_pool.py` / `kv_cache_utils.py`):

* The pool has `num_total_blocks` blocks of `block_size` tokens. A block is in use (held by
  one or more requests, reference count >= 1) or free. Free blocks wait in one queue whose
  order is the eviction order; never-used blocks sit at its head.
* Every full block carries a hash (`lmsim.engine.block_names`: the trace's ids, the
  continuation's, or a synthetic name of its own) and becomes a prefix-cache entry the
  moment it is scheduled for computation; only partial blocks and never-used ones have
  no content. When its last holder
  releases it, it stays cached in the free queue until the queue hands it out again.
* A hit is the longest run of leading blocks present (in use or free). Hitting a free block
  takes it out of the free queue ("touch").
* Allocation pops from the head of the free queue, evicting whatever cache entry the popped
  block carried. A request's blocks are released tail first; blocks without content go to
  the front of the queue and cache entries to the back, so the queue is always
  [content-free blocks][cache entries, least recently released first], and shared prefixes
  outlive the suffixes built on them (vLLM 0.33 `BlockPool.free_blocks`). With
  `free_queue_order="release"` (vLLM 0.11, `free_block_queue.append_n` of every freed
  block) content-free blocks join the back in release order too, so the queue is
  [never-used blocks][freed blocks, least recently released first] and a content-free block
  freed after a cache entry is reused after that entry is evicted.
* A block computed while its hash is already cached is a duplicate and is a cache entry
  too: vLLM's `BlockHashToBlockMap` keeps every copy of a hash, serves hits from the oldest
  one, and evicting one copy leaves the hash cached while another remains.

Blocks are represented by keys, not ids: a content-free block's key is `ANON`; a cache
entry's key is its hash, or a fresh negative key for a second live copy of a hash. Only
the content-free free count, the cache entries in the free queue and the reference counts
of in-use cache entries are stored; which physical block is which never matters.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence, Set
from itertools import compress, count, filterfalse, groupby, islice, repeat, takewhile

import numpy as np

from lmsim.errors import TraceError

KVListener = Callable[[int, int, bool], None]  # (instance_id, block_hash, stored)


def engine_block_hashes(
    trace_ids: np.ndarray, trace_block_size: int, input_tokens: int, block_size: int
) -> list[int]:
    """Hashes of the prompt's full engine blocks that the trace identifies, in order.

    Trace ids are chained prefix ids: equal ids at position j mean equal content through
    that trace block. Mapping to engine blocks:

    * equal sizes: one id per engine block;
    * trace blocks r times larger (Mooncake: 512 = 32 x 16): engine block k lies inside
      trace block k // r and gets the key `id * r + k % r`, so two prompts share an engine
      block only if they share the whole trace block around it. Sharing inside a trace
      block whose ids differ is unknown, and is not invented;
    * trace blocks r times smaller: engine block k is identified by the id of the last trace
      block inside it, and exists only if all r of them are in the trace.

    Only full engine blocks are returned (vLLM never caches a partial block).
    """
    full = input_tokens // block_size
    n = len(trace_ids)
    if n == 0 or full == 0:
        return []
    if trace_block_size == block_size:
        return trace_ids[: min(full, n)].tolist()
    if trace_block_size % block_size == 0:
        r = trace_block_size // block_size
        k = np.arange(min(full, n * r), dtype=np.int64)
        return (trace_ids[k // r] * r + k % r).tolist()
    if block_size % trace_block_size == 0:
        r = block_size // trace_block_size
        count = min(full, n // r)
        return trace_ids[r - 1 : count * r : r].tolist()
    raise TraceError(
        f"trace block size {trace_block_size} and engine block size {block_size} "
        "must divide one another"
    )


class GlobalPrefixIndex:
    """Which instances' prefix caches hold which blocks: a view over the caches attached to it.

    Each cache keeps the set of hashes it holds; matching asks each cache for its leading
    run, at C speed (`PrefixCache.match`), so registration and eviction pay nothing for
    the index. Measured on the Kimi conversation trace (16 instances, 760 engine blocks per
    request): maintaining a hash -> instance-bitmask map cost a dict update per registered
    and per evicted block, more than all the matching it served.
    """

    def __init__(self, num_instances: int) -> None:
        self.num_instances = num_instances
        self._caches: list[PrefixCache | None] = [None] * num_instances

    def attach(self, cache: PrefixCache) -> None:
        self._caches[cache.instance_id] = cache

    def holders(self, block_hash: int) -> int:
        """Bitmask of the instances whose cache holds `block_hash`."""
        mask = 0
        for i, cache in enumerate(self._caches):
            if cache is not None and block_hash in cache._cached:
                mask |= 1 << i
        return mask

    def match_blocks(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Leading blocks of `hashes[:max_blocks]` cached on each instance."""
        return [0 if c is None else c.match(hashes, max_blocks) for c in self._caches]


def leading_matches(
    hashes: Sequence[int], max_blocks: int, num_instances: int, holders: Callable[[int, int], int]
) -> list[int]:
    """Per instance, how many leading blocks of `hashes[:max_blocks]` it holds, in one pass.
    `holders(h, 0)` is the bitmask of instances holding block h (0 if none); any index of
    block holders (exact, approximate, delayed) can be matched this way."""
    limit = min(max_blocks, len(hashes))
    lengths = [limit] * num_instances
    mask = (1 << num_instances) - 1
    for j in range(limit):
        held = holders(hashes[j], 0) & mask
        if held != mask:
            dropped = mask & ~held
            while dropped:
                low = dropped & -dropped
                lengths[low.bit_length() - 1] = j
                dropped ^= low
            mask = held
            if not mask:
                break
    return lengths


ANON = -1  # the key of a block without cached content (never used, partial, or not yet filled)


class PrefixCache:
    """The block pool and prefix cache of one instance. Plain Python, no SimPy.

    Keys: a block without cached content is `ANON`; a block that is a cache entry for hash
    h has key h when it is the only live block carrying h when it was registered, and a
    fresh negative key below `ANON` otherwise (a duplicate copy; `_dup_hash` names its hash).

    Representation: the state the module docstring describes, kept so that a request's
    whole run of blocks is matched, registered, touched, released and evicted with C-level
    set, dict-view and list operations (a Python step per block only for a duplicate copy
    or a key held twice by one request):

    * `_cached`: the hashes with at least one entry; `_odd`: hash -> its entries, oldest
      first, only for the hashes whose entries are not exactly `[hash]` (duplicates);
    * `_used`: the in-use entries (reference count >= 1); `_extra`: key -> reference count
      - 1, only for entries held more than once;
    * the free queue's cache entries are `_segments`, the lists of keys freed by each
      release in order (tail first), consumed from `_head` in `_segments[0]` (under the
      release order, a run of content-free blocks queued among them is an int segment, its
      length, so taking them costs no per-block work). A touch takes
      an entry out of the middle of the queue lazily: its occurrence stays in its segment
      and `_stale[key]` counts it. Only the last occurrence of a key in the queue can be
      valid (a key re-enters the queue only at the back), so popping from the head skips
      an occurrence exactly when its key has stale occurrences left. The queue is
      compacted when stale occurrences outnumber the valid ones, so it stays O(free
      entries) in memory.

    `tests/reference_kv.py` keeps the block-by-block implementation this one is proven equal
    to, call by call, event by event and state by state (`tests/test_kv_equivalence.py`).
    Measured against the per-block dicts and OrderedDict free queue it replaced (CPU time,
    best of 3, alternating): Kimi trace (760-block requests) 0.57x with round robin, 0.61x
    with the Dynamo policy; chatbot/lmetric 5,000 requests 0.92x. A full radix tree would
    still have to hand each request its per-block keys (the scheduler's API), and the
    per-block C-level work left here is 150-250 ns a block over its lifetime (allocate,
    register, release, evict; 760-block requests, micro benchmark), against 1,000-1,500 ns.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        instance_id: int = 0,
        index: GlobalPrefixIndex | None = None,
        listeners: list[KVListener] | None = None,
        free_queue_order: str = "content_free_first",
    ) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        if free_queue_order not in ("content_free_first", "release"):
            raise ValueError(f"free_queue_order must be content_free_first or release, got {free_queue_order!r}")
        # vLLM 0.11: freed content-free blocks queue at the back like cache entries, as
        # `ANON` occurrences in the segments (the count below is then never-used blocks).
        self._anon_in_queue = free_queue_order == "release"
        self.num_total_blocks = num_blocks
        self.block_size = block_size
        self.instance_id = instance_id
        self._listeners = listeners if listeners is not None else []
        # The free queue is [blocks without content][cache entries, least recently
        # released first]: content-free blocks are only ever put at the front and cache
        # entries at the back, so the first part is just a count.
        self._plain_free = num_blocks
        # lists of cache-entry keys; under the release order also ints, runs of content-free
        # blocks
        self._segments: deque[list[int] | int] = deque()
        self._head = 0
        self._num_free_entries = 0
        self._stale: Counter[int] = Counter()  # key -> its stale occurrences in the queue
        self._stale_total = 0
        self._compact_slack = _COMPACT_SLACK
        self._used: set[int] = set()
        self._extra: Counter[int] = Counter()
        self._cached: set[int] = set()
        # Changes whenever `_cached` may have changed; unique across caches, so a match
        # remembered with it stays valid exactly while the version does.
        self.version = next(_VERSIONS)
        self._odd: dict[int, list[int]] = {}
        self._dup_hash: dict[int, int] = {}  # duplicate key -> its hash
        self._next_dup = ANON - 1
        self.num_evictions = 0
        if index is not None:
            index.attach(self)

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self._plain_free + self._num_free_entries

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    @property
    def cached_hashes(self) -> Set[int]:
        """The hashes with at least one cache entry (read-only; for hot loops that test
        membership many times)."""
        return self._cached

    @property
    def has_listeners(self) -> bool:
        return bool(self._listeners)

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def num_copies(self, block_hash: int) -> int:
        entries = self._odd.get(block_hash)
        if entries is not None:
            return len(entries)
        return 1 if block_hash in self._cached else 0

    def hash_of(self, key: int) -> int:
        return key if key >= 0 else self._dup_hash[key]

    def match(self, hashes: Sequence[int], max_blocks: int) -> int:
        """Leading blocks of `hashes[:max_blocks]` present (in use or free). No side effects."""
        limit = min(max_blocks, len(hashes))
        if limit <= 0:
            return 0
        return len(list(takewhile(self._cached.__contains__, islice(hashes, limit))))

    def _oldest(self, hashes: Sequence[int], count: int) -> list[int]:
        """The keys serving the first `count` hashes: each hash's oldest entry (vLLM
        `BlockHashToBlockMap.get_one_block`), even if a younger copy is in use."""
        keys = hashes[:count]
        if not isinstance(keys, list):
            keys = list(keys)
        odd = self._odd
        if odd and not odd.keys().isdisjoint(keys):
            keys = [odd[h][0] if h in odd else h for h in keys]
        return keys

    def num_free_among(self, hashes: Sequence[int], count: int) -> int:
        """How many of the first `count` hashes are served by a block in the free queue (a
        hit on them uses up a free block). A hit is served by the oldest entry of its hash
        (vLLM `BlockHashToBlockMap.get_one_block`), even if a younger copy is in use."""
        if count <= 0:
            return 0
        keys = self._oldest(hashes, count)
        used = self._used
        held = used.intersection(keys)
        if len(held) == len(keys) or len(set(keys)) == len(keys):
            return len(keys) - len(held)
        return len(keys) - sum(map(used.__contains__, keys))  # a hash repeated in the run

    def _free_keys(self) -> Iterator[int]:
        """The cache entries of the free queue, in order, skipping stale occurrences (and
        under the release order an `ANON` for each content-free block)."""
        stale = self._stale
        skipped: dict[int, int] = {}
        first = True
        for segment in self._segments:
            if segment.__class__ is int:  # a run of content-free blocks
                yield from repeat(ANON, segment - (self._head if first else 0))
                first = False
                continue
            for key in islice(segment, self._head if first else 0, None):
                left = stale.get(key, 0) - skipped.get(key, 0)
                if left > 0:
                    skipped[key] = skipped.get(key, 0) + 1
                else:
                    yield key
            first = False

    def free_entries(self, limit: int) -> list[int]:
        """Hashes of the first `limit` cache entries in the free queue: the next ones an
        allocation beyond the content-free blocks evicts, in order (under the release
        order, freed content-free blocks among them are `ANON`)."""
        return [key if key == ANON else self.hash_of(key) for key in islice(self._free_keys(), max(limit, 0))]

    def free_queue(self) -> list[int]:
        """Keys of the cache entries in the free queue, head (next evicted) first (under
        the release order, with an `ANON` for each freed content-free block)."""
        return list(self._free_keys())

    def refcounts(self) -> dict[int, int]:
        """Reference count of every in-use cache entry, by key."""
        extra = self._extra
        return {key: 1 + extra.get(key, 0) for key in self._used}

    def entries(self) -> dict[int, list[int]]:
        """Keys of every cached hash's entries, oldest first."""
        odd = self._odd
        return {h: list(odd[h]) if h in odd else [h] for h in self._cached}

    @property
    def num_plain_free(self) -> int:
        """Free blocks without content: allocations take these before evicting anything."""
        return self._plain_free

    def refcount(self, key: int) -> int:
        if key not in self._used:
            return 0
        return 1 + self._extra.get(key, 0)

    # -- mutations -----------------------------------------------------------------------

    def touch(self, hashes: Sequence[int], count: int) -> list[int]:
        """Take a reference on the first `count` blocks (a prefix hit); returns their keys.
        Each hash is served by its oldest entry (vLLM `BlockPool.touch`)."""
        if count <= 0:
            return []
        keys = self._oldest(hashes, count)
        used = self._used
        # The order of the hits does not matter, only how often each key is hit: set
        # operations do it without a Python call per block.
        distinct = set(keys)
        held = used.intersection(distinct)
        if len(distinct) < len(keys):  # a key hit twice: its later hits hold it again
            extra = self._extra
            extra.update(keys)
            _decrement(extra, list(distinct - held))
        elif held:
            self._extra.update(held)  # Counter: one more holder each
        if len(held) == len(distinct):
            return keys
        taken = distinct - held if held else distinct
        used.update(taken)
        # Out of the free queue: their occurrences there go stale.
        self._stale.update(taken)
        self._stale_total += len(taken)
        self._num_free_entries -= len(taken)
        if self._stale_total > self._num_free_entries + self._compact_slack:
            self._compact()
        return keys

    def _compact(self) -> None:
        """Drop the stale occurrences from the free queue."""
        self._segments = deque(_runs(self.free_queue()))
        self._head = 0
        self._stale.clear()
        self._stale_total = 0

    def allocate(self, count: int) -> list[int]:
        """Pop `count` blocks from the head of the free queue; returns their keys (`ANON`).
        The caller checks `num_free_blocks` first."""
        if count > self.num_free_blocks:
            raise RuntimeError(f"allocating {count} blocks with {self.num_free_blocks} free")
        self.allocate_anonymous_run(count)
        return [ANON] * count

    def allocate_anonymous_run(self, count: int) -> None:
        """Allocate `count` blocks whose keys nobody needs (decode blocks are counted, not
        named). Content-free blocks go first; then cache entries are evicted, least
        recently released first (vLLM `BlockPool.get_new_blocks` pops the queue's head and
        `_maybe_evict_cached_block` drops that block, and only that copy, from the map)."""
        take = min(count, self._plain_free)
        self._plain_free -= take
        if count == take:
            return
        evicted = self._pop_free(count - take)
        if not evicted:  # only content-free blocks (release order)
            return
        self.num_evictions += len(evicted)
        self.version = next(_VERSIONS)
        odd = self._odd
        if not odd or (min(evicted) >= 0 and odd.keys().isdisjoint(evicted)):
            # Only entries that are the single copy of their hash: each eviction drops it.
            self._cached.difference_update(evicted)
            for listener in self._listeners:
                _consume(map(listener, repeat(self.instance_id), evicted, repeat(False)))
            return
        dup_hash, cached = self._dup_hash, self._cached
        for key in evicted:  # some hash has several copies: drop this one only
            h = key if key >= 0 else dup_hash.pop(key)
            entries = odd.get(h)
            if entries is None:
                cached.remove(h)
            else:
                entries.remove(key)
                if not entries:
                    del odd[h]
                    cached.remove(h)
                elif len(entries) == 1 and entries[0] == h:
                    del odd[h]
            # vLLM emits BlockRemoved for every evicted copy, even when another remains.
            for listener in self._listeners:
                listener(self.instance_id, h, False)

    def _pop_free(self, count: int) -> list[int]:
        """Take the first `count` free blocks off the queue, in order; returns the keys of the
        cache entries among them (the content-free runs of the release order evict
        nothing)."""
        out: list[int] = []
        segments, stale = self._segments, self._stale
        plain = 0
        while count:
            segment = segments[0]
            head = self._head
            if segment.__class__ is int:
                take = min(count, segment - head)
                plain += take
                count -= take
                if head + take == segment:
                    segments.popleft()
                    self._head = 0
                else:
                    self._head = head + take
                continue
            end = min(len(segment), head + count)
            run = segment[head:end]
            if stale and not stale.keys().isdisjoint(run):
                # A segment holds a key once, so each of its keys with stale occurrences
                # left is at a stale occurrence here.
                gone = stale.keys() & run
                _decrement(stale, list(gone))
                self._stale_total -= len(gone)
                if len(gone) <= 4:
                    for key in gone:
                        run.remove(key)
                else:
                    run = list(filterfalse(gone.__contains__, run))
            out += run
            count -= len(run)
            if end == len(segment):
                segments.popleft()
                self._head = 0
            else:
                self._head = end
        self._num_free_entries -= len(out) + plain
        return out

    def register(self, block_hash: int) -> int:
        """A block just filled with content `block_hash`: make it a cache entry. Returns its
        key."""
        keys = [ANON]
        self.register_range((block_hash,), keys, 0, 1)
        return keys[0]

    def register_range(self, hashes: Sequence[int], keys: list[int], first: int, last: int) -> None:
        """`register` blocks first..last-1 of a request in place in `keys` (one call per
        chunk).

        A block computed while its hash is already cached is a duplicate and becomes a
        second entry of that hash (vLLM `BlockHashToBlockMap.insert` keeps every copy, and
        `BlockPool.cache_full_blocks` emits BlockStored for it), so evicting one copy does
        not lose the prefix."""
        run = hashes[first:last]
        cached = self._cached
        before = len(cached)
        self.version = next(_VERSIONS)
        if cached.isdisjoint(run):
            cached.update(run)
            if len(cached) - before < len(run):  # a hash repeated in the run: undo
                cached.difference_update(run)
        if len(cached) - before == len(run):
            self._used.update(run)
            keys[first:last] = run
        else:
            used, odd = self._used, self._odd
            for j in range(first, last):  # duplicates: decide block by block
                h = hashes[j]
                if h not in cached:
                    key = h
                    cached.add(h)
                else:
                    key = self._next_dup
                    self._next_dup -= 1
                    self._dup_hash[key] = h
                    entries = odd.get(h)
                    if entries is None:
                        odd[h] = [h, key]
                    else:
                        entries.append(key)
                used.add(key)
                keys[j] = key
        for listener in self._listeners:
            _consume(map(listener, repeat(self.instance_id), run, repeat(True)))

    def register_one(self, hashes: Sequence[int], keys: list[int], j: int) -> None:
        """`register_range(hashes, keys, j, j + 1)` for the one block a decode step fills
        (most registrations on chatbot: 48k of 53k calls); the range path's slicing and set
        arithmetic cost more than the block itself. A duplicate takes the range path."""
        h = hashes[j]
        cached = self._cached
        if h in cached:
            self.register_range(hashes, keys, j, j + 1)
            return
        cached.add(h)
        self.version = next(_VERSIONS)
        self._used.add(h)
        keys[j] = h
        for listener in self._listeners:
            listener(self.instance_id, h, True)

    def release(self, keys: Sequence[int], extra_anonymous: int = 0) -> None:
        """Release a request's blocks: `extra_anonymous` unnamed tail blocks and `keys`, tail
        first (vLLM `KVCacheManager.free` frees in reverse order). A block whose last
        holder leaves goes to the front of the free queue if it carries no cache entry
        (reused first) and to the back if it does (LRU), as vLLM 0.33's
        `BlockPool.free_blocks` does; vLLM 0.11 appended both at the back, in release order
        (`free_queue_order="release"`)."""
        named = keys[::-1]
        if not isinstance(named, list):  # segments are lists: the queue edits them
            named = list(named)
        anonymous = named.count(ANON)
        if anonymous:
            named = list(filter(_ANON_NE, named))
        if self._anon_in_queue:
            self._release_in_order(keys, named, extra_anonymous + anonymous)
            return
        self._plain_free += extra_anonymous + anonymous
        if not named:
            return
        freed = self._release_named(keys, named)
        if freed:
            self._segments.append(freed)
            self._num_free_entries += len(freed)

    def _release_in_order(self, keys: Sequence[int], named: list[int], anonymous: int) -> None:
        """`release` under the release order: the content-free blocks queue at the back with
        the entries, in the order they are freed (the tail first)."""
        freed = self._release_named(keys, named) if named else []
        segments = self._segments
        if anonymous:
            tail = anonymous - (len(keys) - len(named))  # the unnamed blocks past `keys`
            if ANON not in keys[: len(named)]:
                # the request's content-free blocks are its last ones (the usual shape:
                # named blocks, then the partial and unnamed ones), released first
                segments.append(anonymous)
            else:
                if tail:
                    segments.append(tail)
                segments.extend(_runs(self._in_release_order(keys, freed)))
                self._num_free_entries += anonymous + len(freed)
                return
        if freed:
            segments.append(freed)
        self._num_free_entries += anonymous + len(freed)

    @staticmethod
    def _in_release_order(keys: Sequence[int], freed: list[int]) -> list[int]:
        """The freed named keys interleaved with the request's content-free blocks in the
        order its blocks are released (tail first); a key freed once though held twice is
        queued at its last release, the earliest position in `keys`."""
        left = Counter(freed)
        held = Counter(k for k in keys if k != ANON)
        out = []
        for key in reversed(keys):
            if key == ANON:
                out.append(key)
                continue
            held[key] -= 1
            if left[key] and held[key] == 0:
                left[key] -= 1
                out.append(key)
        return out

    def _release_named(self, keys: Sequence[int], named: list[int]) -> list[int]:
        """Drop this request's hold on its named blocks; returns those whose last holder it
        was, in release order (tail first)."""
        extra = self._extra
        # Blocks held by others too are usually the request's leading ones (its prefix hit),
        # so they are counted from the head, at the cost of the hit, and only the rest is
        # checked block by block.
        lead = len(list(takewhile(extra.__contains__, keys))) if extra else 0
        rest = named[: len(named) - lead] if lead else named
        if not extra or (
            extra.keys().isdisjoint(rest) and (lead < 2 or len(set(keys[:lead])) == lead)
        ):
            # Every other block has this request as its only holder (a key held twice
            # would be in `_extra`): the leading shared blocks, each held once, lose this
            # holder and stay in use; the rest go to the back of the queue, tail first.
            if lead:
                _decrement(extra, list(keys[:lead]))
            self._used.difference_update(rest)
            return rest
        if (shared := list(filter(extra.__contains__, named))) and len(set(shared)) == len(shared):
            freed = list(filterfalse(extra.__contains__, named))
            _decrement(extra, shared)
            self._used.difference_update(freed)
            return freed
        # a key held twice by this request: count down block by block
        used, freed = self._used, []
        for key in named:
            count = extra.get(key)
            if count:
                if count == 1:
                    del extra[key]
                else:
                    extra[key] = count - 1
            else:
                used.remove(key)
                freed.append(key)
        return freed

    # -- invariants ----------------------------------------------------------------------

    def check(self, held_blocks: int, held_refs: dict[int, int]) -> list[str]:
        """Problems with the pool given what the requests say they hold: `held_blocks` is the
        sum of blocks over requests, `held_refs` counts holders per cache-entry key."""
        problems = []
        used = self.num_total_blocks - self.num_free_blocks
        refs = self.refcounts()
        shared = sum(ref - 1 for ref in refs.values())
        if used != held_blocks - shared:
            problems.append(
                f"used blocks {used} != blocks held by requests {held_blocks} - shared {shared}"
            )
        if self._plain_free < 0 or self.num_free_blocks > self.num_total_blocks:
            problems.append(f"free blocks {self.num_free_blocks} out of range")
        queue = self.free_queue()
        free = [k for k in queue if k != ANON]  # the cache entries among the free blocks
        free_set = set(free)
        for key, ref in refs.items():
            if ref <= 0:
                problems.append(f"block {key} has reference count {ref}")
            if key in free_set:
                problems.append(f"block {key} is both free and in use")
        if held_refs != refs:
            problems.append("reference counts differ from the requests' block lists")
        if len(queue) != self._num_free_entries or len(free_set) != len(free):
            problems.append(f"free queue holds {len(queue)} blocks, counted {self._num_free_entries}")
        if len(free) != len(queue) and not self._anon_in_queue:
            problems.append("content-free blocks queued behind cache entries")
        entries = len(self._cached) + sum(len(v) - 1 for v in self._odd.values())
        if entries != len(refs) + len(free):
            problems.append(f"{entries} cache entries but {len(refs) + len(free)} hashed blocks")
        return problems


_VERSIONS = count(1)
_COMPACT_SLACK = 1024  # stale occurrences tolerated in the free queue beyond the valid ones
_ANON_NE = ANON.__ne__
_ANON_EQ = ANON.__eq__
_minus_one = (-1).__add__
_is_one = (1).__eq__


def _decrement(counts: dict[int, int], keys: list[int]) -> None:
    """Count each of the distinct `keys` down by one, dropping those that reach zero."""
    old = list(map(counts.__getitem__, keys))
    dict.update(counts, zip(keys, map(_minus_one, old)))
    if 1 in old:
        # dict's own __delitem__: Counter's is a Python method (a call per key)
        _consume(map(dict.__delitem__, repeat(counts), compress(keys, map(_is_one, old))))


def _runs(keys: list[int]) -> list[list[int] | int]:
    """Free-queue segments for `keys` in order: each run of `ANON`s as its length (a run of
    content-free blocks), each run of cache entries as a list."""
    out: list[list[int] | int] = []
    for anonymous, group in groupby(keys, _ANON_EQ):
        run = list(group)
        out.append(len(run) if anonymous else run)
    return out


def _consume(iterator: Iterator[object]) -> None:
    deque(iterator, maxlen=0)
