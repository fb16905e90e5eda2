"""The paged KV cache of one instance, with vLLM-v1 prefix caching, and the cluster-wide
index of which instance holds which block.

Model (costmodel.md §7, vLLM `block_pool.py` / `kv_cache_utils.py`):

* The pool has `num_total_blocks` blocks of `block_size` tokens. A block is in use (held by
  one or more requests, reference count >= 1) or free. Free blocks wait in one queue whose
  order is the eviction order; never-used blocks sit at its head.
* A full prompt block whose content the trace identifies carries a hash and becomes a
  prefix-cache entry the moment it is scheduled for computation. When its last holder
  releases it, it stays cached in the free queue until the queue hands it out again.
* A hit is the longest run of leading blocks present (in use or free). Hitting a free block
  takes it out of the free queue ("touch").
* Allocation pops from the head of the free queue, evicting whatever cache entry the popped
  block carried. Released blocks are appended at the tail, a request's blocks in reverse
  order, so shared prefixes outlive the suffixes built on them.
* A block computed while its hash is already cached is a duplicate: it holds data but is
  not a cache entry (vLLM keeps the first block in its hash map).

Blocks are represented by keys, not ids: a hashed block's key is its hash (>= 0), any other
block gets a fresh negative key. Only keys in the free queue and reference counts of hashed
in-use blocks are stored; which physical block is which never matters to a simulation.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from itertools import compress, islice, repeat, starmap, takewhile
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


class PrefixCache:
    """The block pool and prefix cache of one instance. Plain Python, no SimPy.

    Every operation works on a request's whole run of blocks at once with C-level iteration
    (dict views, `map`, `compress`, `takewhile`) instead of a Python loop per block; runs
    that repeat a hash take the per-block path so the sequential semantics hold exactly.
    `tests/reference_kv.py` keeps the block-by-block implementation this one must match.
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
        self._pristine = num_blocks  # never-used blocks at the head of the free queue
        # The free queue in eviction order. (A plain dict, read from its head with islice,
        # measured no faster: its head accumulates deleted slots until it compacts.)
        self._free: OrderedDict[int, None] = OrderedDict()
        self._in_use: dict[int, int] = {}  # hash -> reference count, hashed blocks only
        self._cached: dict[int, None] = {}  # every hash held, in use or free (the prefix cache)
        self._next_anon = -1
        self.num_evictions = 0
        if index is not None:
            index.attach(self)

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self._pristine + len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def match(self, hashes: Sequence[int], max_blocks: int) -> int:
        """Leading blocks of `hashes[:max_blocks]` present (in use or free). No side effects."""
        limit = min(max_blocks, len(hashes))
        if limit <= 0:
            return 0
        return len(list(takewhile(self._cached.__contains__, islice(hashes, limit))))

    def num_free_among(self, hashes: Sequence[int], count: int) -> int:
        """How many of the first `count` hashes sit in the free queue (a hit on them uses up
        a free block)."""
        if count <= 0:
            return 0
        return sum(map(self._free.__contains__, islice(hashes, count)))

    def refcount(self, block_hash: int) -> int:
        return self._in_use.get(block_hash, 0)

    # -- mutations -----------------------------------------------------------------------

    def touch(self, hashes: Sequence[int], count: int) -> list[int]:
        """Take a reference on the first `count` blocks (a prefix hit); returns their keys."""
        run = list(hashes[:count]) if count > 0 else []
        if not run:
            return run
        in_use, free = self._in_use, self._free
        # Lazy iterators apply block by block, so a run repeating a hash counts it twice,
        # exactly as the loop would.
        _consume(map(free.__delitem__, compress(run, map(free.__contains__, run))))
        in_use.update(zip(run, map(_plus_one, map(in_use.get, run, repeat(0)))))
        return run

    def allocate(self, count: int) -> list[int]:
        """Pop `count` blocks from the head of the free queue; returns fresh anonymous keys.
        The caller checks `num_free_blocks` first."""
        if count > self.num_free_blocks:
            raise RuntimeError(f"allocating {count} blocks with {self.num_free_blocks} free")
        self.allocate_anonymous_run(count)
        keys = list(range(self._next_anon, self._next_anon - count, -1))
        self._next_anon -= count
        return keys

    def allocate_anonymous_run(self, count: int) -> None:
        """Allocate `count` blocks whose keys nobody needs (decode blocks are counted, not
        named: they are released as anonymous blocks)."""
        take = min(count, self._pristine)
        self._pristine -= take
        if count == take:
            return
        popped = starmap(self._free.popitem, repeat(_FROM_HEAD, count - take))
        evicted = list(filter(_is_hash, map(_first, popped)))
        if evicted:
            self.num_evictions += len(evicted)
            _consume(map(self._cached.__delitem__, evicted))
            for listener in self._listeners:
                for h in evicted:
                    listener(self.instance_id, h, False)

    def register(self, block_hash: int) -> int:
        """A block just filled with content `block_hash`: make it a cache entry, unless that
        hash is cached already (then it is a duplicate and stays anonymous). Returns its key."""
        keys = [0]
        self.register_range((block_hash,), keys, 0, 1)
        return keys[0]

    def register_range(self, hashes: Sequence[int], keys: list[int], first: int, last: int) -> None:
        """`register` blocks first..last-1 of a prompt in place in `keys` (one call per chunk)."""
        run = hashes[first:last]
        cached = self._cached
        fresh = dict.fromkeys(run)
        if len(fresh) == len(run) and cached.keys().isdisjoint(run):
            cached.update(fresh)
            self._in_use.update(dict.fromkeys(run, 1))
            keys[first:last] = run
            for listener in self._listeners:
                for h in run:
                    listener(self.instance_id, h, True)
            return
        for j in range(first, last):  # duplicates in the run: decide block by block
            h = hashes[j]
            if h in cached:
                keys[j] = self._next_anon
                self._next_anon -= 1
                continue
            cached[h] = None
            self._in_use[h] = 1
            for listener in self._listeners:
                listener(self.instance_id, h, True)
            keys[j] = h

    def release(self, keys: Sequence[int], extra_anonymous: int = 0) -> None:
        """Release a request's blocks: `extra_anonymous` unnamed tail blocks first, then
        `keys` from last to first."""
        free = self._free
        anon = self._next_anon
        if extra_anonymous > 0:
            free.update(dict.fromkeys(range(anon, anon - extra_anonymous, -1)))
            self._next_anon = anon - extra_anonymous
        in_use = self._in_use
        run = keys[::-1]
        if len(dict.fromkeys(run)) != len(run):
            for key in run:  # a key held twice: its reference count drops one by one
                if key >= 0:
                    ref = in_use[key] - 1
                    if ref:
                        in_use[key] = ref
                    else:
                        del in_use[key]
                        free[key] = None
                else:
                    free[key] = None
            return
        # Anonymous keys read 0 and a last reference 1: both go free, in release order.
        refs = list(map(in_use.get, run, repeat(0)))
        free.update(dict.fromkeys(compress(run, map(_below_two, refs))))
        _consume(map(in_use.__delitem__, compress(run, map(_is_one, refs))))
        shared = list(map(_above_one, refs))
        if any(shared):
            in_use.update(zip(compress(run, shared), map(_minus_one, compress(refs, shared))))

    # -- invariants ----------------------------------------------------------------------

    def check(self, held_blocks: int, held_hash_refs: dict[int, int]) -> list[str]:
        """Problems with the pool given what the requests say they hold: `held_blocks` is the
        sum of blocks over requests, `held_hash_refs` counts holders per hashed key."""
        problems = []
        used = self.num_total_blocks - self.num_free_blocks
        shared = sum(ref - 1 for ref in self._in_use.values())
        if used != held_blocks - shared:
            problems.append(
                f"used blocks {used} != blocks held by requests {held_blocks} - shared {shared}"
            )
        if self._pristine < 0 or self.num_free_blocks > self.num_total_blocks:
            problems.append(f"free blocks {self.num_free_blocks} out of range")
        for h, ref in self._in_use.items():
            if ref <= 0:
                problems.append(f"block {h} has reference count {ref}")
            if h in self._free:
                problems.append(f"block {h} is both free and in use")
        if held_hash_refs != self._in_use:
            problems.append("reference counts differ from the requests' block lists")
        if self._cached.keys() != self._in_use.keys() | {k for k in self._free if k >= 0}:
            problems.append("the prefix cache's hash set differs from its in-use and free blocks")
        return problems


_FROM_HEAD = (False,)  # OrderedDict.popitem(last=False)
_first = itemgetter(0)
_is_hash = (0).__le__  # hashed keys are >= 0, anonymous keys < 0
_plus_one = (1).__add__
_minus_one = (-1).__add__
_below_two = (2).__gt__
_is_one = (1).__eq__
_above_one = (1).__lt__


def _consume(iterator: Iterator[object]) -> None:
    deque(iterator, maxlen=0)
