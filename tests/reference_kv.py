"""The block-by-block prefix cache and global index that `lmsim.engine.kv_cache` replaced
(as of i13's KV semantics: duplicates are cache entries, content-free blocks are freed to the
front): the slow, obvious reference its run-at-a-time implementation is proven equal to in
tests/test_kv_equivalence.py. Kept as it was, apart from its name and vLLM 0.11's free-queue
order (`free_queue_order="release"`): every freed block queued at the back in release
order, a content-free one as a fresh `AnonBlock` in the queue."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from lmsim.engine.kv_cache import ANON, leading_matches

KVListener = Callable[[int, int, bool], None]


class AnonBlock:
    """A freed content-free block waiting in the free queue (release order only)."""


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
    """The block pool and prefix cache of one instance. Plain Python, no SimPy.

    Keys: a block without cached content is `ANON`; a block that is a cache entry for hash
    h has key h when it is the only live block carrying h when it was registered, and a
    fresh negative key below `ANON` otherwise (a duplicate copy; `_dup_hash` names its hash).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        instance_id: int = 0,
        index: ReferenceGlobalIndex | None = None,
        listeners: list[KVListener] | None = None,
        free_queue_order: str = "content_free_first",
    ) -> None:
        self._release_order = free_queue_order == "release"
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_total_blocks = num_blocks
        self.block_size = block_size
        self.instance_id = instance_id
        self._index = index
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
        copies = self._copies
        limit = min(max_blocks, len(hashes))
        for j in range(limit):
            if hashes[j] not in copies:
                return j
        return limit

    def num_free_among(self, hashes: Sequence[int], count: int) -> int:
        """How many of the first `count` hashes are served by a block in the free queue (a
        hit on them uses up a free block). A hit is served by the oldest entry of its hash
        (vLLM `BlockHashToBlockMap.get_one_block`), even if a younger copy is in use."""
        free, copies = self._free, self._copies
        return sum(1 for j in range(count) if copies[hashes[j]][0] in free)

    def free_entries(self, limit: int) -> list[int]:
        """Hashes of the first `limit` cache entries in the free queue: the next ones an
        allocation beyond the content-free blocks evicts, in order."""
        out = []
        for key in self._free:
            if len(out) >= limit:
                break
            out.append(ANON if isinstance(key, AnonBlock) else self.hash_of(key))
        return out

    def free_queue(self) -> list[int]:
        return [ANON if isinstance(key, AnonBlock) else key for key in self._free]

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
        popitem = self._free.popitem
        evicted = [key for key, _ in (popitem(last=False) for _ in range(count - take))]
        evicted = [key for key in evicted if not isinstance(key, AnonBlock)]
        self.num_evictions += len(evicted)
        index = self._index
        holders = index._holders if index is not None else None
        mask = ~(1 << self.instance_id)
        copies, dup_hash = self._copies, self._dup_hash
        listeners = self._listeners
        for key in evicted:
            h = key if key >= 0 else dup_hash.pop(key)
            entries = copies[h]
            entries.remove(key)
            if not entries:
                del copies[h]
                if holders is not None:
                    left = holders[h] & mask
                    if left:
                        holders[h] = left
                    else:
                        del holders[h]
            # vLLM emits BlockRemoved for every evicted copy, even when another remains.
            for listener in listeners:
                listener(self.instance_id, h, False)

    def register(self, block_hash: int) -> int:
        """A block just filled with content `block_hash`: make it a cache entry. Returns its
        key."""
        keys = [ANON]
        self.register_range((block_hash,), keys, 0, 1)
        return keys[0]

    def register_range(self, hashes: Sequence[int], keys: list[int], first: int, last: int) -> None:
        """`register` blocks first..last-1 of a request in place in `keys` (one call per
        chunk: the per-block work is the simulator's hottest loop).

        A block computed while its hash is already cached is a duplicate and becomes a
        second entry of that hash (vLLM `BlockHashToBlockMap.insert` keeps every copy, and
        `BlockPool.cache_full_blocks` emits BlockStored for it), so evicting one copy does
        not lose the prefix."""
        ref, copies = self._ref, self._copies
        index = self._index
        holders = index._holders if index is not None else None
        bit = 1 << self.instance_id
        listeners = self._listeners
        for j in range(first, last):
            h = hashes[j]
            entries = copies.get(h)
            if entries is None:
                key = h
                copies[h] = [h]
                if holders is not None:
                    holders[h] = holders.get(h, 0) | bit
            else:
                key = self._next_dup
                self._next_dup -= 1
                self._dup_hash[key] = h
                entries.append(key)
            ref[key] = 1
            for listener in listeners:
                listener(self.instance_id, h, True)
            keys[j] = key

    def release(self, keys: Sequence[int], extra_anonymous: int = 0) -> None:
        """Release a request's blocks: `extra_anonymous` unnamed tail blocks and `keys`, tail
        first (vLLM `KVCacheManager.free` frees in reverse order). A block whose last
        holder leaves goes to the front of the free queue if it carries no cache entry
        (reused first) and to the back if it does (LRU), as vLLM 0.33's
        `BlockPool.free_blocks` does; vLLM 0.11 appended both at the back."""
        plain = extra_anonymous
        ref, free = self._ref, self._free
        if self._release_order:
            for _ in range(plain):
                free[AnonBlock()] = None
            plain = 0
        for key in reversed(keys):
            if key == ANON:
                if self._release_order:
                    free[AnonBlock()] = None
                else:
                    plain += 1
                continue
            count = ref[key] - 1
            if count:
                ref[key] = count
            else:
                del ref[key]
                free[key] = None
        self._plain_free += plain
