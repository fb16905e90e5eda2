"""Preble's E2 global scheduler (policies.md §7)."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

from lmsim.engine.request import Request
from lmsim.policies._common import (
    check_bool,
    check_number,
    estimator_cost_models,
    id_bound,
    listed_ids,
)
from lmsim.policies.base import POLICIES, ClusterView, Policy, RouterContext


class _Node:
    """A radix-tree segment of block hashes. `context` is the tokens before it."""

    __slots__ = ("alloc", "children", "context", "contrib", "hashes", "last_seen", "live", "misses",
                 "parent", "ttfts", "window")

    def __init__(self, hashes: list[int], parent: _Node | None, context: int) -> None:
        self.hashes = hashes
        self.parent = parent
        self.context = context
        self.children: dict[int, _Node] = {}
        self.alloc: list[int] = []  # GPUs the prefix is allocated to, in allocation order
        self.misses = 0  # window requests that had to compute this segment
        # prefill-cost share currently added to each GPU in alloc, per cost-model group of
        # the GPUs (one group unless a mixed fleet prices pools differently); () = none
        self.contrib: tuple[float, ...] = ()
        self.window = 0  # requests in the window whose prompt covers this segment
        self.last_seen = -1.0  # when a request last covered it
        self.live = 0  # live requests whose important node this is
        self.ttfts: dict[int, deque[tuple[float, float]]] = {}  # gpu -> (t, ttft) in window


@POLICIES.register("preble")
class Preble(Policy):
    """Preble E2 as in its released global scheduler (policies.md §7).

    State: a global radix tree over the block hashes of every prompt routed. Per node: the
    GPUs it is allocated to and its windowed misses (requests that computed it).
    `load_cost(g) = Σ_{n allocated to g} misses_H(n)·T_prefill(n)/|alloc(n)|
    + live_requests(g)·median_output_len·median_TPOT(g)`; `misses_H·T` equals Preble's
    `miss_rate·count_H·T`. T_prefill is lmsim's step-cost model pricing the segment as one
    prefill chunk (Preble ships a Mistral-7B/A6000 regression), each GPU's with its own
    profile in a mixed fleet (`estimator_profile` prices every GPU with one).

    E2: if the matched prefix is longer than the new part (hit ratio > 50 %) exploit: the
    GPUs of the nearest allocated ancestor, the only one or the cheapest. Otherwise explore:
    the cheapest GPU overall. The routed GPU is then added to every node on the path.

    Rebalancing (after `rebalance_after_per_gpu × N` routed requests): while the heaviest GPU
    costs ≥ `th_bal` × the lightest, move its cheapest important prefix (own tokens exceed its
    context, allocated to it alone) with its subtree to the lightest, stopping when a move
    would overshoot. Hot-prefix replication: if the heaviest GPU has exactly one movable prefix
    and that prefix's mean TTFT there in the second half of the window is ≥
    `ttft_overload_factor` × the first half, add the lightest GPU to its allocation.

    Params: window_s=180, th_bal=1.5, rebalance=True, rebalance_after_per_gpu=50,
      replicate=True, ttft_overload_factor=2.0, default_output_len=45, initial_tpot_s=0.15,
      include_request_prefill=False (the paper's P_i term: add this request's own prefill cost
      on each GPU, from the router's KV view), estimator_profile=None (engine's profile),
      expire_allocations=True (a prefix's GPU allocation clears when no request in the last
      `window_s` covered it, as Preble's window does; False keeps allocations forever, the
      earlier lmsim behaviour), rebalance_decode=True (a prefix's move cost is its prefill share
      plus the decode cost of its live requests; False: prefill only), min_window_requests=2
      (only prefixes with at least this many window requests are moved; Preble ignores
      one-off prefixes).
    Tie-break: the lowest GPU id among equal costs (Preble takes `min` over its GPU list).
    GPUs are the instances the router lists (routable now; `lmsim.routing`): exploit skips an
    allocation to a GPU not listed (the nearest ancestor allocated to a listed one counts),
    rebalancing and its `rebalance_after_per_gpu × N` count are over the listed GPUs. Preble
    has a fixed GPU set; its state per GPU is kept by instance id so it survives a change.
    Deviations: block-hash tree instead of token ids; the eviction term M_i is off (as in
    Preble's default path); live requests count on their own GPU, not per tree node; one
    heavy/light pair per rebalancing attempt, attempted after every routing decision; output
    length and TPOT are learned from finished requests (`num_output_done`, timestamps), the
    way Preble records them; the tree is never pruned (expired segments keep their node but
    lose their allocation). Moving a prefix moves its decode cost only in the rebalancer's
    own running totals: live requests stay on their GPU, so `load_cost` sees the move as the
    prefill share until they finish.
    """

    def __init__(
        self,
        *,
        window_s: float = 180.0,
        th_bal: float = 1.5,
        rebalance: bool = True,
        rebalance_after_per_gpu: int = 50,
        replicate: bool = True,
        ttft_overload_factor: float = 2.0,
        default_output_len: int = 45,
        initial_tpot_s: float = 0.15,
        include_request_prefill: bool = False,
        estimator_profile: str | dict | None = None,
        expire_allocations: bool = True,
        rebalance_decode: bool = True,
        min_window_requests: int = 2,
    ) -> None:
        self.window_s = check_number("window_s", window_s, lo=0, lo_open=True)
        self.th_bal = check_number("th_bal", th_bal, lo=1)
        self.rebalance = check_bool("rebalance", rebalance)
        self.rebalance_after = check_number(
            "rebalance_after_per_gpu", rebalance_after_per_gpu, lo=0, integer=True
        )
        self.replicate = check_bool("replicate", replicate)
        self.overload = check_number("ttft_overload_factor", ttft_overload_factor, lo=1)
        self.out_len = check_number("default_output_len", default_output_len, lo=1, integer=True)
        self.tpot0 = check_number("initial_tpot_s", initial_tpot_s, lo=0, lo_open=True)
        self.include_prefill = check_bool("include_request_prefill", include_request_prefill)
        self.estimator_profile = estimator_profile
        self.expire_allocations = check_bool("expire_allocations", expire_allocations)
        self.rebalance_decode = check_bool("rebalance_decode", rebalance_decode)
        self.min_window_requests = check_number(
            "min_window_requests", min_window_requests, lo=1, integer=True
        )
        self.root = _Node([], None, 0)
        self._misses: deque[tuple[float, _Node]] = deque()
        self._seen: deque[tuple[float, _Node]] = deque()  # (t, node) per request and segment
        self.expired = 0
        self.prefill_load: list[float] = []
        self.live: list[int] = []
        self.tpots: list[deque[float]] = []
        self.tpot_med: list[float] = []
        self.out_lens: deque[int] = deque(maxlen=200)
        self.out_med = float(default_output_len)
        self.routed = 0
        self._req: dict[int, tuple[int, _Node | None]] = {}  # request -> (gpu, important node)
        self._pending: tuple[int, list[_Node], _Node | None] | None = None
        self._listed: Sequence[int] = []  # the GPU ids listed at the last decision
        self.moves = 0
        self.replications = 0

    # ---- setup -------------------------------------------------------------------------
    def bind(self, ctx: RouterContext) -> None:
        super().bind(ctx)
        models = estimator_cost_models(ctx, self.estimator_profile)
        # GPUs priced alike form a group: a segment's prefill time is computed once per group
        self._models: list[Any] = []
        self._group: list[int] = []
        for model in models:
            k = next((j for j, m in enumerate(self._models) if m is model), len(self._models))
            if k == len(self._models):
                self._models.append(model)
            self._group.append(k)
        self.cost_model: Any = self._models[0]
        self._ensure(ctx.num_instances)

    def _ensure(self, n: int) -> None:
        while len(self.live) < n:
            self.prefill_load.append(0.0)
            self.live.append(0)
            self.tpots.append(deque(maxlen=200))
            self.tpot_med.append(self.tpot0)

    # ---- load accounting ---------------------------------------------------------------
    def _t_prefill(self, tokens: int, context: int, group: int = 0) -> float:
        if tokens <= 0:
            return 0.0
        return self._models[group].step_time([(tokens, context)], 0, 0)

    def share(self, node: _Node, g: int) -> float:
        """The prefill-cost share of `node` currently counted on GPU g's load."""
        return node.contrib[self._group[g]] if node.contrib else 0.0

    def _withdraw(self, node: _Node) -> None:
        if node.contrib:
            for g in node.alloc:
                self.prefill_load[g] -= node.contrib[self._group[g]]

    def _update_contrib(self, node: _Node) -> None:
        """Re-apply the node's prefill-cost share to the GPUs it is allocated to, each
        priced with its own cost model (`misses × T_prefill / |alloc|`)."""
        self._withdraw(node)
        if node.misses and node.alloc:
            bsz = self.ctx.block_size
            tokens = len(node.hashes) * bsz
            n = len(node.alloc)
            node.contrib = tuple(
                node.misses * self._t_prefill(tokens, node.context, k) / n for k in range(len(self._models))
            )
        else:
            node.contrib = ()
        if node.contrib:
            for g in node.alloc:
                self.prefill_load[g] += node.contrib[self._group[g]]

    def load_cost(self, g: int) -> float:
        return self.prefill_load[g] + self.live[g] * self.out_med * self.tpot_med[g]

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        misses = self._misses
        while misses and misses[0][0] <= horizon:
            _, node = misses.popleft()
            node.misses -= 1
            self._update_contrib(node)
        seen = self._seen
        while seen and seen[0][0] <= horizon:
            _, node = seen.popleft()
            node.window -= 1
            if self.expire_allocations and node.last_seen <= horizon and node.alloc:
                # Preble forgets where a prefix lives once no request in the window used it,
                # so a returning prefix is explored afresh instead of pinned to a stale GPU.
                self._withdraw(node)
                node.alloc = []
                node.contrib = ()
                self.expired += 1

    # ---- radix tree --------------------------------------------------------------------
    def _match_insert(self, hashes: list[int]) -> tuple[int, list[_Node]]:
        """Blocks matched before insertion, and the path of nodes covering `hashes` after it
        (the last one new when something was unmatched)."""
        bsz = self.ctx.block_size
        node, j, path = self.root, 0, []
        n = len(hashes)
        while j < n:
            child = node.children.get(hashes[j])
            if child is None:
                leaf = _Node(hashes[j:], node, j * bsz)
                node.children[hashes[j]] = leaf
                path.append(leaf)
                return j, path
            seg = child.hashes
            k = 0
            while k < len(seg) and j + k < n and seg[k] == hashes[j + k]:
                k += 1
            if k < len(seg):
                self._split(child, k)
            path.append(child)
            j += k
            node = child
        return j, path

    def _split(self, node: _Node, k: int) -> None:
        """Cut `node` after k blocks; the node keeps its identity as the head."""
        bsz = self.ctx.block_size
        tail = _Node(node.hashes[k:], node, node.context + k * bsz)
        tail.children = node.children
        for c in tail.children.values():
            c.parent = tail
        tail.alloc = list(node.alloc)
        tail.window, tail.last_seen = node.window, node.last_seen
        node.hashes = node.hashes[:k]
        node.children = {tail.hashes[0]: tail}
        self._update_contrib(node)  # its segment got shorter

    def _important(self, path: list[_Node]) -> _Node | None:
        """The nearest node, going up from the leaf, whose own tokens exceed its context."""
        bsz = self.ctx.block_size
        for node in reversed(path):
            if len(node.hashes) * bsz > node.context:
                return node
        return path[0] if path else None

    # ---- routing -----------------------------------------------------------------------
    def choose(self, request: Request, cluster: ClusterView) -> int:
        ids = listed_ids(cluster, self.ctx.num_instances)
        self._ensure(id_bound(ids))
        self._listed = ids
        n = len(ids)
        now = cluster.now
        self._expire(now)
        bsz = cluster.block_size
        matched_blocks, path = self._match_insert(list(request.block_hashes))
        matched = matched_blocks * bsz
        new = request.input_tokens - matched
        costs = [self.load_cost(g) for g in ids]  # by position
        if self.include_prefill:
            cached = cluster.cached_prefix_tokens(request)
            group = self._group
            costs = [
                c + self._t_prefill(request.input_tokens - h, h, group[g])
                for g, c, h in zip(ids, costs, cached)
            ]
        choice = -1
        if matched > new:  # exploit: more cached than new tokens
            # every GPU listed: positions are ids
            position = None if type(ids) is range else {g: k for k, g in enumerate(ids)}
            for node in reversed(path):  # a new leaf has no allocation yet, so it is skipped
                # a GPU that is not listed now does not hold the prefix for routing: the
                # nearest ancestor allocated to a listed one does
                listed = node.alloc if position is None else [position[g] for g in node.alloc if g in position]
                if listed:
                    choice = listed[0] if len(listed) == 1 else min(listed, key=lambda k: (costs[k], k))
                    break
        if choice < 0:  # explore
            choice = min(range(n), key=lambda k: (costs[k], k))
        self._pending = (request.request_id, path, self._important(path))
        return choice

    def on_routed(self, request: Request, instance_id: int) -> None:
        g = instance_id
        self._ensure(g + 1)
        now = self.ctx.now()
        path: list[_Node] = []
        important = None
        if self._pending is not None and self._pending[0] == request.request_id:
            _, path, important = self._pending
        for node in path:
            node.window += 1
            node.last_seen = now
            self._seen.append((now, node))
            if g not in node.alloc:
                node.misses += 1
                self._misses.append((now, node))
                node.alloc.append(g)
                self._update_contrib(node)
        self.live[g] += 1
        if important is not None:
            important.live += 1
        self._req[request.request_id] = (g, important)
        self.routed += 1
        if self.rebalance and self.routed >= self.rebalance_after * len(self._listed):
            self._rebalance(now)

    # ---- post-assignment adjustment ------------------------------------------------------
    def _movable(self, g: int) -> list[_Node]:
        out = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if (
                node.alloc == [g]
                and node.window >= self.min_window_requests
                and len(node.hashes) * self.ctx.block_size > node.context
            ):
                out.append(node)
        return out

    def node_cost(self, node: _Node, g: int) -> float:
        """What moving `node` off GPU g takes from it: its prefill share plus the decode cost
        of its live requests (Preble's rebalancer prices prefill and decode)."""
        if not self.rebalance_decode:
            return self.share(node, g)
        return self.share(node, g) + node.live * self.out_med * self.tpot_med[g]

    def _move(self, node: _Node, src: int, dst: int) -> None:
        stack = [node]
        while stack:
            x = stack.pop()
            stack.extend(x.children.values())
            if src in x.alloc:
                self._withdraw(x)
                x.alloc = [dst if a == src else a for a in x.alloc]
                if x.alloc.count(dst) > 1:
                    x.alloc = list(dict.fromkeys(x.alloc))
                x.contrib = ()
                self._update_contrib(x)

    def _rebalance(self, now: float) -> None:
        """Between the GPUs listed at the last decision (prefixes move only to a GPU the
        router can send them to)."""
        ids = self._listed
        if len(ids) < 2:
            return
        costs = {g: self.load_cost(g) for g in ids}
        heavy = max(ids, key=lambda g: (costs[g], -g))
        light = min(ids, key=lambda g: (costs[g], g))
        if costs[heavy] <= 0 or costs[heavy] < self.th_bal * costs[light]:
            return
        movable = sorted(self._movable(heavy), key=lambda x: self.node_cost(x, heavy))
        if len(movable) == 1:
            node = movable[0]
            if self.replicate and self._ttft_overloaded(node, heavy, now):
                node.alloc.append(light)
                self._update_contrib(node)
                self.replications += 1
            return
        hv, lt = costs[heavy], costs[light]
        for node in movable:
            c = self.node_cost(node, heavy)
            if c <= 0:
                continue
            if lt + c > hv - c or hv < self.th_bal * lt:
                break  # the move would overshoot, or the pair is balanced
            self._move(node, heavy, light)
            self.moves += 1
            hv, lt = hv - c, lt + c

    def _ttft_overloaded(self, node: _Node, g: int, now: float) -> bool:
        obs = node.ttfts.get(g)
        if not obs:
            return False
        horizon, mid = now - self.window_s, now - self.window_s / 2
        while obs and obs[0][0] <= horizon:
            obs.popleft()
        first = [x for t, x in obs if t <= mid]
        second = [x for t, x in obs if t > mid]
        if not first or not second:
            return False
        return sum(second) / len(second) >= self.overload * (sum(first) / len(first))

    # ---- observations ------------------------------------------------------------------
    def on_first_token(self, request: Request) -> None:
        rec = self._req.get(request.request_id)
        if rec is None or rec[1] is None or request.first_token_at is None:
            return
        g, node = rec
        node.ttfts.setdefault(g, deque()).append(
            (request.first_token_at, request.first_token_at - request.arrived_at)
        )

    def on_finished(self, request: Request) -> None:
        rec = self._req.pop(request.request_id, None)
        if rec is None:
            return
        g = rec[0]
        self.live[g] -= 1
        if rec[1] is not None:
            rec[1].live -= 1
        n_out = request.num_output_done
        if n_out > 0:
            self.out_lens.append(n_out)
            self.out_med = float(statistics.median(self.out_lens))
        if n_out > 1 and request.first_token_at is not None and request.finished_at is not None:
            self.tpots[g].append((request.finished_at - request.first_token_at) / (n_out - 1))
            self.tpot_med[g] = float(statistics.median(self.tpots[g]))
