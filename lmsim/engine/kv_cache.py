"""The paged KV cache of one instance, with vLLM-v1 prefix caching, and the cluster-wide
index of which instance holds which block.

Model (costmodel.md §7, vLLM `block_pool.py` / `kv_cache_utils.py`):

* The pool has `num_total_blocks` blocks of `block_size` tokens. A block is in use (held by
  one or more requests, reference count >= 1) or free. Free blocks wait in one queue whose
  order is the eviction order; never-used blocks sit at its head.
* A full block whose content the trace identifies carries a hash and becomes a
  prefix-cache entry the moment it is scheduled for computation. When its last holder
  releases it, it stays cached in the free queue until the queue hands it out again.
* A hit is the longest run of leading blocks present (in use or free). Hitting a free block
  takes it out of the free queue ("touch").
* Allocation pops from the head of the free queue, evicting whatever cache entry the popped
  block carried. A request's blocks are released tail first; blocks without content go to
  the front of the queue and cache entries to the back, so the queue is always
  [content-free blocks][cache entries, least recently released first], and shared prefixes
  outlive the suffixes built on them (vLLM 0.33 `BlockPool.free_blocks`).
* A block computed while its hash is already cached is a duplicate and is a cache entry
  too: vLLM's `BlockHashToBlockMap` keeps every copy of a hash, serves hits from the oldest
  one, and evicting one copy leaves the hash cached while another remains.

Blocks are represented by keys, not ids: a content-free block's key is `ANON`; a cache
entry's key is its hash, or a fresh negative key for a second live copy of a hash. Only
the content-free free count, the cache entries in the free queue and the reference counts
of in-use cache entries are stored; which physical block is which never matters.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice, repeat, starmap, takewhile
from operator import itemgetter

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


ANON = -1  # the key of a block without cached content (never used, decode tail, partial)


class PrefixCache:
    """The block pool and prefix cache of one instance. Plain Python, no SimPy.

    Keys: a block without cached content is `ANON`; a block that is a cache entry for hash
    h has key h when it is the only live block carrying h when it was registered, and a
    fresh negative key below `ANON` otherwise (a duplicate copy; `_dup_hash` names its hash).

    Matching, registration and eviction work on a request's whole run of blocks with C-level
    iteration (`takewhile`, dict views, `map`) instead of a Python loop per block; a run with
    duplicate copies takes the block-by-block path, so the semantics hold exactly.
    `tests/reference_kv.py` keeps the block-by-block implementation this one is proven equal
    to. Touch and release stay loops: their C-level versions (several passes over the run)
    measured slower than one Python pass (CPU time, 760-block Kimi requests).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        instance_id: int = 0,
        index: GlobalPrefixIndex | None = None,
        listeners: list[KVListener] | None = None,
    ) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_total_blocks = num_blocks
        self.block_size = block_size
        self.instance_id = instance_id
        self._listeners = listeners if listeners is not None else []
        # The free queue is [blocks without content][cache entries, least recently
        # released first]: content-free blocks are only ever put at the front and cache
        # entries at the back, so the first part is just a count.
        self._plain_free = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict()
        self._ref: dict[int, int] = {}  # key -> reference count, in-use cache entries only
        self._copies: dict[int, list[int]] = {}  # hash -> keys of its entries, oldest first
        self._dup_hash: dict[int, int] = {}  # duplicate key -> its hash
        self._next_dup = ANON - 1
        self.num_evictions = 0
        if index is not None:
            index.attach(self)

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self._plain_free + len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._copies

    def num_copies(self, block_hash: int) -> int:
        return len(self._copies.get(block_hash, ()))

    def hash_of(self, key: int) -> int:
        return key if key >= 0 else self._dup_hash[key]

    def match(self, hashes: Sequence[int], max_blocks: int) -> int:
        """Leading blocks of `hashes[:max_blocks]` present (in use or free). No side effects."""
        limit = min(max_blocks, len(hashes))
        if limit <= 0:
            return 0
        return len(list(takewhile(self._copies.__contains__, islice(hashes, limit))))

    def num_free_among(self, hashes: Sequence[int], count: int) -> int:
        """How many of the first `count` hashes are served by a block in the free queue (a
        hit on them uses up a free block). A hit is served by the oldest entry of its hash
        (vLLM `BlockHashToBlockMap.get_one_block`), even if a younger copy is in use."""
        if count <= 0:
            return 0
        oldest = map(_first, map(self._copies.__getitem__, islice(hashes, count)))
        return sum(map(self._free.__contains__, oldest))

    def free_entries(self, limit: int) -> list[int]:
        """Hashes of the first `limit` cache entries in the free queue: the next ones an
        allocation beyond the content-free blocks evicts, in order."""
        return [self.hash_of(key) for key in islice(self._free, max(limit, 0))]

    @property
    def num_plain_free(self) -> int:
        """Free blocks without content: allocations take these before evicting anything."""
        return self._plain_free

    def refcount(self, key: int) -> int:
        return self._ref.get(key, 0)

    # -- mutations -----------------------------------------------------------------------

    def touch(self, hashes: Sequence[int], count: int) -> list[int]:
        """Take a reference on the first `count` blocks (a prefix hit); returns their keys.
        Each hash is served by its oldest entry (vLLM `BlockPool.touch`)."""
        ref, free, copies = self._ref, self._free, self._copies
        keys = []
        for j in range(count):
            key = copies[hashes[j]][0]
            if key in ref:
                ref[key] += 1
            else:
                del free[key]
                ref[key] = 1
            keys.append(key)
        return keys

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
        evicted = list(map(_first, starmap(self._free.popitem, repeat(_FROM_HEAD, count - take))))
        self.num_evictions += len(evicted)
        copies = self._copies
        if not self._dup_hash or (
            min(evicted) >= 0 and max(map(len, map(copies.__getitem__, evicted))) == 1
        ):
            # Only entries that are the single copy of their hash: each eviction drops it.
            _consume(map(copies.__delitem__, evicted))
            for listener in self._listeners:
                for h in evicted:
                    listener(self.instance_id, h, False)
            return
        dup_hash = self._dup_hash
        for key in evicted:  # some hash has several copies: drop this one only
            h = key if key >= 0 else dup_hash.pop(key)
            entries = copies[h]
            entries.remove(key)
            if not entries:
                del copies[h]
            # vLLM emits BlockRemoved for every evicted copy, even when another remains.
            for listener in self._listeners:
                listener(self.instance_id, h, False)

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
        copies, ref = self._copies, self._ref
        if len(dict.fromkeys(run)) == len(run) and copies.keys().isdisjoint(run):
            copies.update(zip(run, map(list, zip(run))))
            ref.update(dict.fromkeys(run, 1))
            keys[first:last] = run
        else:
            for j in range(first, last):  # duplicates: decide block by block
                h = hashes[j]
                entries = copies.get(h)
                if entries is None:
                    key = h
                    copies[h] = [h]
                else:
                    key = self._next_dup
                    self._next_dup -= 1
                    self._dup_hash[key] = h
                    entries.append(key)
                ref[key] = 1
                keys[j] = key
        for listener in self._listeners:
            for h in run:
                listener(self.instance_id, h, True)

    def release(self, keys: Sequence[int], extra_anonymous: int = 0) -> None:
        """Release a request's blocks: `extra_anonymous` unnamed tail blocks and `keys`, tail
        first (vLLM `KVCacheManager.free` frees in reverse order). A block whose last
        holder leaves goes to the front of the free queue if it carries no cache entry
        (reused first) and to the back if it does (LRU), as vLLM 0.33's
        `BlockPool.free_blocks` does; vLLM 0.11 appended both at the back."""
        plain = extra_anonymous
        ref, free = self._ref, self._free
        for key in reversed(keys):
            if key == ANON:
                plain += 1
                continue
            count = ref[key] - 1
            if count:
                ref[key] = count
            else:
                del ref[key]
                free[key] = None
        self._plain_free += plain

    # -- invariants ----------------------------------------------------------------------

    def check(self, held_blocks: int, held_refs: dict[int, int]) -> list[str]:
        """Problems with the pool given what the requests say they hold: `held_blocks` is the
        sum of blocks over requests, `held_refs` counts holders per cache-entry key."""
        problems = []
        used = self.num_total_blocks - self.num_free_blocks
        shared = sum(ref - 1 for ref in self._ref.values())
        if used != held_blocks - shared:
            problems.append(
                f"used blocks {used} != blocks held by requests {held_blocks} - shared {shared}"
            )
        if self._plain_free < 0 or self.num_free_blocks > self.num_total_blocks:
            problems.append(f"free blocks {self.num_free_blocks} out of range")
        for key, ref in self._ref.items():
            if ref <= 0:
                problems.append(f"block {key} has reference count {ref}")
            if key in self._free:
                problems.append(f"block {key} is both free and in use")
        if held_refs != self._ref:
            problems.append("reference counts differ from the requests' block lists")
        entries = sum(len(v) for v in self._copies.values())
        if entries != len(self._ref) + len(self._free):
            problems.append(f"{entries} cache entries but {len(self._ref) + len(self._free)} hashed blocks")
        return problems


_FROM_HEAD = (False,)  # OrderedDict.popitem(last=False)
_first = itemgetter(0)
_ANON_NE = ANON.__ne__
_plus_one = (1).__add__
_minus_one = (-1).__add__
_is_one = (1).__eq__
_above_one = (1).__lt__


def _consume(iterator: Iterator[object]) -> None:
    deque(iterator, maxlen=0)
