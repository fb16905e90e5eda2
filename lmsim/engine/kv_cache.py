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

from collections import OrderedDict
from collections.abc import Callable, Sequence

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
    """block hash -> bitmask of the instances whose prefix cache holds it.

    Gives every instance's prefix-hit length in one pass over a request's blocks, instead of
    one lookup per instance per block.
    """

    def __init__(self, num_instances: int) -> None:
        self.num_instances = num_instances
        self._holders: dict[int, int] = {}

    def add(self, block_hash: int, instance_id: int) -> None:
        self._holders[block_hash] = self._holders.get(block_hash, 0) | (1 << instance_id)

    def remove(self, block_hash: int, instance_id: int) -> None:
        mask = self._holders[block_hash] & ~(1 << instance_id)
        if mask:
            self._holders[block_hash] = mask
        else:
            del self._holders[block_hash]

    def holders(self, block_hash: int) -> int:
        return self._holders.get(block_hash, 0)

    def match_blocks(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Leading blocks of `hashes[:max_blocks]` cached on each instance."""
        return leading_matches(hashes, max_blocks, self.num_instances, self._holders.get)


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
    """The block pool and prefix cache of one instance. Plain Python, no SimPy."""

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
        self._index = index
        self._listeners = listeners if listeners is not None else []
        self._pristine = num_blocks  # never-used blocks at the head of the free queue
        self._free: OrderedDict[int, None] = OrderedDict()
        self._in_use: dict[int, int] = {}  # hash -> reference count, hashed blocks only
        self._next_anon = -1
        self.num_evictions = 0

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self._pristine + len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._in_use or block_hash in self._free

    def match(self, hashes: Sequence[int], max_blocks: int) -> int:
        """Leading blocks of `hashes[:max_blocks]` present (in use or free). No side effects."""
        in_use, free = self._in_use, self._free
        limit = min(max_blocks, len(hashes))
        for j in range(limit):
            h = hashes[j]
            if h not in in_use and h not in free:
                return j
        return limit

    def num_free_among(self, hashes: Sequence[int], count: int) -> int:
        """How many of the first `count` hashes sit in the free queue (a hit on them uses up
        a free block)."""
        free = self._free
        return sum(1 for j in range(count) if hashes[j] in free)

    def refcount(self, block_hash: int) -> int:
        return self._in_use.get(block_hash, 0)

    # -- mutations -----------------------------------------------------------------------

    def touch(self, hashes: Sequence[int], count: int) -> list[int]:
        """Take a reference on the first `count` blocks (a prefix hit); returns their keys."""
        in_use, free = self._in_use, self._free
        for j in range(count):
            h = hashes[j]
            if h in in_use:
                in_use[h] += 1
            else:
                del free[h]
                in_use[h] = 1
        return list(hashes[:count])

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
        popitem = self._free.popitem
        evicted = [key for key, _ in (popitem(last=False) for _ in range(count - take)) if key >= 0]
        if evicted:
            self.num_evictions += len(evicted)
            index = self._index
            if index is not None:
                holders = index._holders
                mask = ~(1 << self.instance_id)
                for h in evicted:
                    left = holders[h] & mask
                    if left:
                        holders[h] = left
                    else:
                        del holders[h]
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
        """`register` blocks first..last-1 of a prompt in place in `keys` (one call per chunk:
        the per-block work is the simulator's hottest loop)."""
        in_use, free = self._in_use, self._free
        index = self._index
        holders = index._holders if index is not None else None
        bit = 1 << self.instance_id
        listeners = self._listeners
        for j in range(first, last):
            h = hashes[j]
            if h in in_use or h in free:
                keys[j] = self._next_anon
                self._next_anon -= 1
                continue
            in_use[h] = 1
            if holders is not None:
                holders[h] = holders.get(h, 0) | bit
            for listener in listeners:
                listener(self.instance_id, h, True)
            keys[j] = h

    def release(self, keys: Sequence[int], extra_anonymous: int = 0) -> None:
        """Release a request's blocks: `extra_anonymous` unnamed tail blocks first, then
        `keys` from last to first."""
        free = self._free
        anon = self._next_anon
        for key in range(anon, anon - extra_anonymous, -1):
            free[key] = None
        self._next_anon = anon - extra_anonymous
        in_use = self._in_use
        for key in reversed(keys):
            if key >= 0:
                ref = in_use[key] - 1
                if ref:
                    in_use[key] = ref
                else:
                    del in_use[key]
                    free[key] = None
            else:
                free[key] = None

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
        return problems
