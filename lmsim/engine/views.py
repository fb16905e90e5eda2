"""Router-state realism: what the router believes about the instances (policies.md §0).

`ViewAdapter` sits between the engine's exact `ClusterView` and a policy. Two independent
switches:

* `kv_view` — where `cached_prefix_tokens` comes from:
  - `exact` (default): the instances' true prefix caches, at decision time;
  - `approximate`: the router's own index of the prompts it routed (block hash -> instance ->
    last routed time), expired after `approx_ttl_s` and LRU-bounded to
    `approx_capacity_blocks` hashes; it never hears about engine evictions (SGLang, AIBrix,
    llm-d approx, Dynamo `--no-kv-events`). The 120 s TTL is Dynamo's and llm-d's; SGLang's
    radix tree has no TTL and keeps a prefix until its size-bounded LRU trims it, so model
    SGLang with `approx_ttl_s: null` (capacity-bounded only; Dynamo's
    `router_approximate_cache_policy: lru` is the same);
  - `events`: a replica of the caches built from the instances' KV stored/removed events,
    each applied `kv_event_delay_s` after the instance published it (Dynamo / llm-d
    precise). vLLM publishes the events of a step when it processes the step's output
    (`Scheduler.update_from_output`), so an event is stamped with the end of the step that
    scheduled the block, and a delay of 0 still shows a block only once its step is done.
    With lower KV tiers the replica also keeps the host-memory ("cpu") and disk events,
    which carry their medium as vLLM's connector events do (`BlockStored.medium`) and are
    stamped when a copy lands or a tier evicts (lmsim.engine.kv_tiers); Dynamo and llm-d
    index them per medium the same way.
* `load_view` — the per-instance load fields (`num_running`, `num_waiting`, `batch_size`,
  `pending_prefill_tokens`, `kv_usage`, `queued_prefills()`, ...):
  - `exact` (default): live at decision time;
  - `scraped`: a snapshot refreshed every `scrape_interval_s` (Prometheus-style scraping).

`metrics_path` sets the load view in one setting: the path from an engine's load gauges to
the router's scheduler (engine gauge update, scrape, scheduler refresh) as one refresh
period, named by router family (`METRICS_PATHS`) or given in seconds. It stands for
`load_view: scraped` with that `scrape_interval_s` (or `exact` where the family's router
keeps its load signals itself), so it cannot be combined with those two.

With both switches exact, `wrap` returns the engine's view itself: zero overhead.
When the engine's view lists only the routable instances (a fleet whose instances start,
drain or fail), every answer here is per listed instance too: the indexes keep every
allocated instance by id and are cut to the listed ones, snapshots are kept by instance id,
and the proxies are remade when the listed instances change.
Router-local counters (in-flight requests, Dynamo's active blocks) are not affected: policies
keep those themselves, exact at dispatch, as the real routers do.

Approximate and event views apply the engine's cap (a hit covers at most
`(input_tokens - 1) // block_size` blocks) so that modes differ only in what they know.
`cached_prefix_tokens_by_tier` (GPU, host, disk tokens per instance) follows `kv_view` too;
the approximate index knows only where prompts were sent, so it reports no lower-tier hits.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from lmsim.engine.kv_cache import leading_matches
from lmsim.engine.request import Request
from lmsim.routing import (
    ClusterView,
    InstanceView,
    RouterContext,
    capped_blocks,
    check_choice,
    check_number,
)

_LOAD_FIELDS = (
    "num_running",
    "num_waiting",
    "batch_size",
    "num_prefilling",
    "pending_prefill_tokens",
    "total_tokens",
    "decode_context_tokens",
    "kv_usage",
    "num_free_blocks",
    "num_total_blocks",
)


# Router family -> refresh period of the load it reads (s), None where the router counts
# its own load at dispatch (exact).
METRICS_PATHS: dict[str, float | None] = {
    "exact": None,
    # Gateway API Inference Extension / llm-d EPP: pods' /metrics are re-read every
    # `--refreshMetricsInterval`, 50 ms by default and at least (runserver
    # DefaultRefreshMetricsInterval, MinRefreshMetricsInterval); vLLM V1 updates the gauges
    # it serves with every engine step's stats (PrometheusStatLogger.record), so the step
    # adds nothing on top.
    "llm-d": 0.05,
    # vLLM production-stack router: engine stats scraped every `--engine-stats-interval`,
    # 30 s by default (vllm_router parser).
    "vllm-production-stack": 30.0,
    # Dynamo's KV router and SGLang's router count in-flight work (active blocks, running
    # requests) themselves at dispatch: their load is exact; their cache view is `kv_view`.
    "dynamo": None,
    "sglang": None,
}


def resolve_metrics_path(path: Any, load_view: str | None, scrape_interval_s: float | None) -> tuple[str, float]:
    """(load_view, scrape_interval_s) from `metrics_path` (a family or seconds), or from
    the two explicit settings (defaults: exact, 0.1 s) when it is None."""
    if path is None:
        return load_view or "exact", 0.1 if scrape_interval_s is None else scrape_interval_s
    if load_view is not None or scrape_interval_s is not None:
        raise ValueError("metrics_path sets load_view and scrape_interval_s: give one or the other, not both")
    if isinstance(path, str):
        if path not in METRICS_PATHS:
            raise ValueError(f"param 'metrics_path' must be seconds or one of {'|'.join(METRICS_PATHS)}, got {path!r}")
        period = METRICS_PATHS[path]
    else:
        period = check_number("metrics_path", path, lo=0)
    return ("exact", 0.1) if not period else ("scraped", float(period))


class ApproxPrefixIndex:
    """The router's record of where it sent each prompt block; no eviction feedback."""

    def __init__(self, num_instances: int, ttl_s: float, capacity_blocks: int) -> None:
        self.n = num_instances
        self.ttl_s = ttl_s
        self.capacity = capacity_blocks
        # hash -> {instance: last routed time}; OrderedDict order is LRU over hashes.
        self._entries: OrderedDict[int, dict[int, float]] = OrderedDict()

    def insert(self, hashes: Sequence[int], instance_id: int, now: float) -> None:
        entries = self._entries
        for h in hashes:
            e = entries.get(h)
            if e is None:
                entries[h] = {instance_id: now}
            else:
                e[instance_id] = now
                entries.move_to_end(h)
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def match_tokens(self, request: Request, block_size: int, now: float) -> list[int]:
        limit = min(len(request.block_hashes), capped_blocks(request, block_size))
        entries = self._entries
        horizon = now - self.ttl_s

        def holders(h: int, _none: int = 0) -> int:
            e = entries.get(h)
            if not e:
                return 0
            mask = 0
            for i, t in e.items():
                if t >= horizon:  # lazily expired: an idle entry older than the TTL is gone
                    mask |= 1 << i
            return mask

        return [b * block_size for b in leading_matches(request.block_hashes, limit, self.n, holders)]


class EventPrefixIndex:
    """A replica of the instances' caches from KV events, each visible `delay_s` after it
    was published.

    Events arrive stamped with their publication time, which can lie ahead of the clock
    (a step's events are known when it is scheduled, published when it ends) and need not
    come in stamp order across instances (one instance's fast-forwarded run is applied
    lazily, after another instance's later events), so they wait in a heap ordered by
    visibility time and arrival; one instance's events keep their order."""

    def __init__(self, num_instances: int, delay_s: float) -> None:
        self.n = num_instances
        self.delay_s = delay_s
        self._holders: dict[int, int] = {}  # the GPU caches
        self._tier_holders: dict[str, dict[int, int]] = {"cpu": {}, "disk": {}}
        self._pending: list[tuple[float, int, int, int, bool, str | None]] = []
        self._seq = 0

    def on_event(self, instance_id: int, block_hash: int, stored: bool, published_at: float) -> None:
        self._seq += 1
        heapq.heappush(
            self._pending, (published_at + self.delay_s, self._seq, instance_id, block_hash, stored, None)
        )

    def on_tier_event(self, instance_id: int, block_hash: int, stored: bool, published_at: float, medium: str) -> None:
        self._seq += 1
        heapq.heappush(
            self._pending, (published_at + self.delay_s, self._seq, instance_id, block_hash, stored, medium)
        )

    def _apply(self, instance_id: int, block_hash: int, stored: bool, medium: str | None = None) -> None:
        holders = self._holders if medium is None else self._tier_holders[medium]
        bit = 1 << instance_id
        if stored:
            holders[block_hash] = holders.get(block_hash, 0) | bit
        else:
            mask = holders.get(block_hash, 0) & ~bit
            if mask:
                holders[block_hash] = mask
            else:
                holders.pop(block_hash, None)

    def catch_up(self, now: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= now:
            _, _, iid, h, stored, medium = heapq.heappop(pending)
            self._apply(iid, h, stored, medium)

    def match_tokens(self, request: Request, block_size: int, now: float) -> list[int]:
        self.catch_up(now)
        limit = min(len(request.block_hashes), capped_blocks(request, block_size))
        blocks = leading_matches(request.block_hashes, limit, self.n, self._holders.get)
        return [b * block_size for b in blocks]

    def match_tokens_by_tier(self, request: Request, block_size: int, now: float) -> list[tuple[int, int, int]]:
        """Per instance: its GPU prefix, then the blocks continuing it in host memory, then
        those continuing that on disk (Dynamo's `query_lower_tiers` walk), in tokens."""
        gpu = self.match_tokens(request, block_size, now)
        hashes = request.block_hashes
        stop = min(len(hashes), request.input_tokens // block_size)
        cpu, disk = self._tier_holders["cpu"], self._tier_holders["disk"]
        out = []
        for i, g in enumerate(gpu):
            bit = 1 << i
            j = g // block_size
            while j < stop and cpu.get(hashes[j], 0) & bit:
                j += 1
            k = j
            while k < stop and disk.get(hashes[k], 0) & bit:
                k += 1
            out.append((g, (j - g // block_size) * block_size, (k - j) * block_size))
        return out


def _listed(by_id: list[Any], base: ClusterView) -> list[Any]:
    """An index's answer for every allocated instance, cut to those `base` lists, by
    position (all of them: as it is)."""
    instances = base.instances
    if len(instances) == len(by_id):
        return by_id
    return [by_id[v.instance_id] for v in instances]


class _InstanceProxy:
    """An instance as the router sees it: load from a snapshot (scraped mode) or the live
    view, and the prefix hit from the adapter's KV view (at its position in the list)."""

    def __init__(self, adapter: ViewAdapter, live: InstanceView, snapshot: dict | None, position: int) -> None:
        self._adapter = adapter
        self._live = live
        self._snap = snapshot
        self._position = position
        self.instance_id = live.instance_id

    def __getattr__(self, name: str) -> Any:
        snap = self._snap
        if snap is not None and name in snap:
            return snap[name]
        return getattr(self._live, name)

    def queued_prefills(self) -> list[tuple[int, int]]:
        if self._snap is not None:
            return list(self._snap["queued_prefills"])
        return self._live.queued_prefills()

    def step_in_flight(self) -> tuple[float, list[int]]:
        if self._snap is not None:
            return self._snap["step_in_flight"]
        return self._live.step_in_flight()

    def cached_prefix_tokens(self, request: Request) -> int:
        return self._adapter._cached_vector(request)[self._position]


class _AdaptedCluster:
    def __init__(self, adapter: ViewAdapter, base: ClusterView) -> None:
        self._adapter = adapter
        self._base = base
        self.block_size = base.block_size
        self.instances: list[Any] = []

    @property
    def now(self) -> float:
        return self._base.now

    def cached_prefix_tokens(self, request: Request) -> list[int]:
        return list(self._adapter._cached_vector(request))

    @property
    def has_kv_tiers(self) -> bool:
        return bool(getattr(self._base, "has_kv_tiers", False))

    def cached_prefix_tokens_by_tier(self, request: Request) -> list[tuple[int, int, int]]:
        return list(self._adapter._by_tier_vector(request))


class ViewAdapter:
    """Turns the engine's exact cluster view into the router's view (see module docstring).

    Call order: `bind(ctx)` once, then per request `wrap(cluster)` -> policy -> `on_routed`.
    """

    def __init__(
        self,
        *,
        kv_view: str = "exact",
        kv_event_delay_s: float = 0.05,
        approx_ttl_s: float | None = 120.0,
        approx_capacity_blocks: int = 200000,
        load_view: str | None = None,
        scrape_interval_s: float | None = None,
        metrics_path: str | float | None = None,
    ) -> None:
        load_view, scrape_interval_s = resolve_metrics_path(metrics_path, load_view, scrape_interval_s)
        self.kv_view = check_choice("kv_view", kv_view, ("exact", "approximate", "events"))
        self.kv_event_delay_s = check_number("kv_event_delay_s", kv_event_delay_s, lo=0)
        # None: no TTL, entries live until the LRU capacity pushes them out (SGLang).
        self.approx_ttl_s = (
            float("inf") if approx_ttl_s is None
            else check_number("approx_ttl_s", approx_ttl_s, lo=0, lo_open=True)
        )
        self.approx_capacity_blocks = check_number(
            "approx_capacity_blocks", approx_capacity_blocks, lo=1, integer=True
        )
        self.load_view = check_choice("load_view", load_view, ("exact", "scraped"))
        self.scrape_interval_s = check_number(
            "scrape_interval_s", scrape_interval_s, lo=0, lo_open=True
        )
        self.ctx: RouterContext | None = None
        self.approx: ApproxPrefixIndex | None = None
        self.events: EventPrefixIndex | None = None
        self._base: ClusterView | None = None
        self._wrapped: _AdaptedCluster | None = None
        self._snapshots: dict[int, dict] | None = None  # instance id -> its last scrape
        self._memo: tuple[int, float, list[int]] | None = None
        self._tier_memo: tuple[int, float, list[tuple[int, int, int]]] | None = None

    @property
    def is_exact(self) -> bool:
        return self.kv_view == "exact" and self.load_view == "exact"

    def bind(self, ctx: RouterContext) -> None:
        self.ctx = ctx
        if self.kv_view == "approximate":
            self.approx = ApproxPrefixIndex(
                ctx.num_instances, self.approx_ttl_s, self.approx_capacity_blocks
            )
        elif self.kv_view == "events":
            self.events = EventPrefixIndex(ctx.num_instances, self.kv_event_delay_s)
            ctx.subscribe_kv_events(self.events.on_event)
            subscribe_tiers = getattr(ctx, "subscribe_tier_kv_events", None)
            if subscribe_tiers is not None:
                subscribe_tiers(self.events.on_tier_event)
        if self.load_view == "scraped":
            ctx.every(self.scrape_interval_s, self._scrape)

    def _scrape(self, now: float) -> None:
        if self._base is None:
            return  # nothing routed yet: the first wrap takes the first snapshot
        snaps = {}
        for v in self._base.instances:
            snap = {f: getattr(v, f) for f in _LOAD_FIELDS}
            snap["queued_prefills"] = tuple(v.queued_prefills())
            snap["step_in_flight"] = v.step_in_flight()  # as of the scrape, like the rest
            snaps[v.instance_id] = snap
        self._snapshots = snaps
        self._rebuild()

    def _rebuild(self) -> None:
        """One proxy per instance the base view lists now; an instance listed after the last
        scrape reads its live load until the next one."""
        assert self._base is not None and self._wrapped is not None
        snaps = self._snapshots
        self._wrapped.instances = [
            _InstanceProxy(self, v, snaps.get(v.instance_id) if snaps is not None else None, k)
            for k, v in enumerate(self._base.instances)
        ]

    def wrap(self, cluster: ClusterView) -> ClusterView:
        if self.is_exact:
            return cluster
        if cluster is not self._base:
            self._base = cluster
            self._wrapped = _AdaptedCluster(self, cluster)
            if self.load_view == "scraped":
                self._scrape(cluster.now)  # first snapshot; later ones come from ctx.every
            else:
                self._rebuild()
        wrapped = self._wrapped
        assert wrapped is not None
        listed = cluster.instances
        proxies = wrapped.instances
        if len(proxies) != len(listed) or any(p._live is not v for p, v in zip(proxies, listed)):
            self._rebuild()  # the routable instances changed since the last decision
        return wrapped  # type: ignore[return-value]

    def _remember(self, slot: str, request: Request, match: Any) -> Any:
        """`match(request, base, now)`, kept in `slot` while the request and the time are the
        same (a policy asks several times per decision)."""
        base = self._base
        assert base is not None
        now = base.now
        memo = getattr(self, slot)
        if memo is not None and memo[0] == request.request_id and memo[1] == now:
            return memo[2]
        out = match(request, base, now)
        setattr(self, slot, (request.request_id, now, out))
        return out

    def _cached_vector(self, request: Request) -> list[int]:
        return self._remember("_memo", request, self._match_gpu)

    def _match_gpu(self, request: Request, base: ClusterView, now: float) -> list[int]:
        if self.approx is not None:
            return _listed(self.approx.match_tokens(request, base.block_size, now), base)
        if self.events is not None:
            return _listed(self.events.match_tokens(request, base.block_size, now), base)
        return base.cached_prefix_tokens(request)

    def _by_tier_vector(self, request: Request) -> list[tuple[int, int, int]]:
        return self._remember("_tier_memo", request, self._match_tiers)

    def _match_tiers(self, request: Request, base: ClusterView, now: float) -> list[tuple[int, int, int]]:
        if self.approx is not None:
            return [(c, 0, 0) for c in self._cached_vector(request)]
        if self.events is not None:
            base.catch_up_kv_tiers()  # type: ignore[attr-defined]  # the tiers' events due by now
            return _listed(self.events.match_tokens_by_tier(request, base.block_size, now), base)
        return base.cached_prefix_tokens_by_tier(request)

    def on_routed(self, request: Request, instance_id: int) -> None:
        if self.approx is not None:
            assert self.ctx is not None
            self.approx.insert(request.block_hashes, instance_id, self.ctx.now())
            self._memo = None
            self._tier_memo = None
