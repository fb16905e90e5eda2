"""SGLang router `cache_aware` (policies.md §6)."""

from __future__ import annotations

from collections import OrderedDict

from lmsim.engine.request import Request
from lmsim.policies._common import InflightCounter, check_choice, check_number, listed_ids, pick_min
from lmsim.policies.base import POLICIES, ClusterView, Policy, RouterContext, argmin_first


@POLICIES.register("sglang")
class SglangCacheAware(Policy):
    """SGLang's cache-aware router with the CLI / Python defaults (policies.md §6).

    `load` is the router's in-flight count. If `max − min > balance_abs_threshold` AND
    `max > balance_rel_threshold · min` (both strict), route to the first minimum-load worker.
    Otherwise, if the best match rate (longest cached prefix / prompt length) is
    `> cache_threshold`, route to the worker holding it (random among equal best, as the
    upstream map order is arbitrary); else to the worker with the smallest tree.

    The tree is tracked per worker as the set of prompt blocks the router sent it (tokens =
    blocks·16), refreshed on every routing and trimmed every `eviction_interval_secs` to
    `max_tree_size` by dropping least-recently-routed blocks, deepest first.

    Params: cache_threshold=0.3 in [0, 1], balance_abs_threshold=64 (>= 0),
      balance_rel_threshold=1.5 (>= 0), eviction_interval_secs=120 (> 0),
      max_tree_size=2**26 (>= 1), miss_policy="smallest_tree" | "min_load" (SGLang PR #14305).
    Deviations: SGLang matches characters in its own radix tree; here the match is in tokens
    from the router's KV view (set `kv_view: approximate` to get SGLang's no-eviction-feedback
    behaviour), and `max_tree_size` counts tokens, not characters.
    """

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_secs: float = 120.0,
        max_tree_size: int = 2**26,
        miss_policy: str = "smallest_tree",
    ) -> None:
        self.cache_threshold = check_number("cache_threshold", cache_threshold, lo=0, hi=1)
        self.abs_threshold = check_number("balance_abs_threshold", balance_abs_threshold, lo=0)
        self.rel_threshold = check_number("balance_rel_threshold", balance_rel_threshold, lo=0)
        self.eviction_interval = check_number(
            "eviction_interval_secs", eviction_interval_secs, lo=0, lo_open=True
        )
        self.max_tree_size = check_number("max_tree_size", max_tree_size, lo=1, integer=True)
        self.miss_policy = check_choice("miss_policy", miss_policy, ("smallest_tree", "min_load"))
        self.inflight = InflightCounter()
        self.trees: list[OrderedDict[int, None]] = []  # per instance id, LRU order of blocks

    def bind(self, ctx: RouterContext) -> None:
        super().bind(ctx)
        ctx.every(self.eviction_interval, self._evict)

    def _evict(self, now: float) -> None:
        limit = self.max_tree_size // self.ctx.block_size
        for tree in self.trees:
            while len(tree) > limit:
                tree.popitem(last=False)

    def tree_tokens(self, i: int) -> int:
        """Tokens in instance `i`'s tree (by instance id)."""
        return len(self.trees[i]) * self.ctx.block_size if i < len(self.trees) else 0

    def choose(self, request: Request, cluster: ClusterView) -> int:
        ids = listed_ids(cluster, self.ctx.num_instances)
        load = self.inflight.of(ids)
        lo, hi = min(load), max(load)
        if hi - lo > self.abs_threshold and hi > self.rel_threshold * lo:
            return argmin_first(load)
        cached = cluster.cached_prefix_tokens(request)
        best = max(cached)
        if best / max(1, request.input_tokens) > self.cache_threshold:
            return pick_min([-c for c in cached], "random", self.ctx.rng)
        if self.miss_policy == "min_load":
            return argmin_first(load)
        trees = self.trees
        return argmin_first([len(trees[i]) if i < len(trees) else 0 for i in ids])

    def on_routed(self, request: Request, instance_id: int) -> None:
        self.inflight.routed(request, instance_id)
        while len(self.trees) <= instance_id:
            self.trees.append(OrderedDict())
        tree = self.trees[instance_id]
        # Reverse order: the root ends most recent, so LRU trimming removes leaves first.
        for h in reversed(request.block_hashes):
            tree[h] = None
            tree.move_to_end(h)

    def on_finished(self, request: Request) -> None:
        self.inflight.finished(request)
