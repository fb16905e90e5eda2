"""llm-d's approximate prefix index, kept by a policy that routes as llm-d does."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class RoutedPrefixLRU:
    """llm-d's approximate prefix index (`approx-prefix-cache-producer`): where the scheduler
    sent each prompt, one LRU of block hashes per instance, no TTL and no eviction feedback.

    `llm-d/llm-d-inference-scheduler`,
    `pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/`: `PreRequest`
    (plugin.go) adds the request's hashes to its decode endpoint and, in P/D, its prefill
    endpoint; `indexer.go::Add` keeps one LRU per endpoint sized at its GPU KV blocks
    (`makeserver`, `autoTune` on by default; else `defaultLRUCapacityPerServer` 31,250,
    types.go), evicting the least recently added hash from that endpoint only;
    `matchLongestPrefix` walks the prompt's hashes until one no endpoint holds and counts,
    per endpoint, the hashes it holds along the way (not necessarily a leading run)."""

    def __init__(self, num_instances: int) -> None:
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_instances)]
        self._holders: dict[int, int] = {}  # hash -> bitmask of instances

    def insert(self, hashes: Sequence[int], instance_id: int, capacity: int) -> None:
        lru, bit = self._lru[instance_id], 1 << instance_id
        holders = self._holders
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        while len(lru) > capacity:
            old, _ = lru.popitem(last=False)
            mask = holders[old] & ~bit
            if mask:
                holders[old] = mask
            else:
                del holders[old]

    def matched_blocks(self, hashes: Sequence[int]) -> list[int]:
        counts = [0] * len(self._lru)
        holders = self._holders
        for h in hashes:
            mask = holders.get(h, 0)
            if not mask:
                break
            while mask:
                low = mask & -mask
                counts[low.bit_length() - 1] += 1
                mask ^= low
        return counts


__all__ = ["RoutedPrefixLRU"]
