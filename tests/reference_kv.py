"""The block-by-block prefix cache and global index that `lmsim.engine.kv_cache` replaced:
the slow, obvious reference its run-at-a-time implementation is proven equal to
(tests/test_kv_equivalence.py). Kept as it was, apart from its name."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from lmsim.engine.kv_cache import leading_matches

KVListener = Callable[[int, int, bool], None]


class ReferenceGlobalIndex:
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


class ReferencePrefixCache:
    """The block pool and prefix cache of one instance. Plain Python, no SimPy."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        instance_id: int = 0,
        index: ReferenceGlobalIndex | None = None,
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
