"""Routers for disaggregated clusters (issue 25): each request gets a prefill instance (or
none: then its decode instance prefills it, a conditional bypass) and a decode instance.

A `DisaggPolicy` answers `choose_pair(request, cluster) -> (prefill_id | None, decode_id |
None)` with global instance ids; a decode id of None means "choose when the prefill is done"
(the policy param `decode_choice: after_prefill`), asked through `choose_decode`. Its
hooks: `on_routed_pair`, `on_decode_chosen`, `on_prefill_done(leg)` (the prefill instance
computed the prompt), and the colocated hooks `on_first_token`/`on_finished` for the
request's decode side. The engine's side of the lifecycle is `lmsim.engine.disagg`.

The families compose colocated policies over one role's instances: `_Side` binds a
registered policy to a context and a view restricted to that role, so every colocated
policy can route a prefill pool or a decode pool unchanged. Its ids are role-local
(0..n_role-1 over the role's allocated instances, in id order; `ctx.num_instances` is
n_role); its view lists the role's routable instances under those ids (`PoolView`), and
`choose` answers a position in that list, which `_Side` maps back to the global id.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, Protocol

from lmsim.engine.request import Request
from lmsim.errors import ConfigError
from lmsim.policies._common import check_bool, check_choice, check_number
from lmsim.policies.base import POLICIES, ClusterView, InstanceView, Policy, RouterContext
from lmsim.policies.routed_prefix import RoutedPrefixLRU

DECODE_CHOICES = ("at_arrival", "after_prefill")


class DisaggContext(RouterContext, Protocol):
    """A RouterContext over the whole disaggregated cluster, plus its two roles."""

    prefill_ids: list[int]
    decode_ids: list[int]

    def side(self, role: str) -> RouterContext:
        """A context over one role's instances (role-local ids 0..n-1), its own seeded
        stream."""
        ...


class DisaggPolicy(Policy):
    """Base of the disaggregated policies (see the module docstring)."""

    disaggregated = True

    def bind(self, ctx: DisaggContext) -> None:  # type: ignore[override]
        self.ctx = ctx

    def choose(self, request: Request, cluster: ClusterView) -> int:
        raise RuntimeError(f"policy {self.registry_name} routes a disaggregated cluster: use choose_pair")

    def choose_pair(self, request: Request, cluster: ClusterView) -> tuple[int | None, int | None]:
        raise NotImplementedError

    def choose_decode(self, request: Request, cluster: ClusterView) -> int:
        raise NotImplementedError

    def on_routed_pair(self, request: Request, prefill_id: int | None, decode_id: int | None) -> None:
        pass

    def on_decode_chosen(self, request: Request, decode_id: int) -> None:
        pass

    def on_prefill_done(self, leg: Request) -> None:
        pass


class LocalView:
    """An instance view under its role-local id: everything else is the wrapped view's."""

    __slots__ = ("_view", "cost_model", "instance_id", "max_num_batched_tokens", "max_num_seqs", "pool", "role")

    def __init__(self, view: InstanceView, local_id: int) -> None:
        self._view = view
        self.instance_id = local_id
        # fixed for the run: copied once instead of forwarded at every read
        self.pool = view.pool
        self.role = view.role
        self.cost_model = view.cost_model
        self.max_num_batched_tokens = view.max_num_batched_tokens
        self.max_num_seqs = view.max_num_seqs

    def __getattr__(self, name: str) -> Any:
        if name == "_view":  # not set yet (a copy being built): no view to ask
            raise AttributeError(name)
        return getattr(self._view, name)

    def cached_prefix_tokens(self, request: Request) -> int:
        return self._view.cached_prefix_tokens(request)

    def queued_prefills(self) -> list[tuple[int, int]]:
        return self._view.queued_prefills()

    def step_in_flight(self) -> tuple[float, list[int]]:
        return self._view.step_in_flight()

    def kv_load_time_s(self, host_tokens: int, disk_tokens: int) -> float:
        return self._view.kv_load_time_s(host_tokens, disk_tokens)


# The load fields, read through to the wrapped view (a property is cheaper than __getattr__).
for _field in (
    "num_running", "num_waiting", "batch_size", "num_prefilling", "pending_prefill_tokens", "total_tokens",
    "decode_context_tokens", "kv_usage", "num_free_blocks", "num_total_blocks",
):
    setattr(LocalView, _field, property(attrgetter(f"_view.{_field}")))


class PoolView:
    """A ClusterView over the listed instances of one role, each under its role-local id.

    `local` maps a global instance id of the role to its role-local id; `wrapped` keeps the
    `LocalView`s between decisions (keyed by local id, remade when the underlying view
    object changes, e.g. a new scrape)."""

    __slots__ = ("_cluster", "_positions", "block_size", "instances")

    def __init__(self, cluster: ClusterView, local: dict[int, int], wrapped: dict[int, LocalView]) -> None:
        self._cluster = cluster
        self.block_size = cluster.block_size
        positions: list[int] = []
        instances: list[LocalView] = []
        for k, v in enumerate(cluster.instances):
            i = local.get(v.instance_id)
            if i is None:
                continue
            w = wrapped.get(i)
            if w is None or w._view is not v:
                w = wrapped[i] = LocalView(v, i)
            positions.append(k)
            instances.append(w)
        self._positions = positions  # where each listed instance is in the cluster's list
        self.instances = instances

    @property
    def now(self) -> float:
        return self._cluster.now

    def cached_prefix_tokens(self, request: Request) -> list[int]:
        full = self._cluster.cached_prefix_tokens(request)
        return [full[k] for k in self._positions]


class _OneLookup:
    """The cluster view of one decision: both sides share one prefix lookup (the cluster
    view's, or `lookup(request, cluster)` when the policy keeps its own index), one entry
    per listed instance."""

    def __init__(
        self, cluster: ClusterView, lookup: Callable[[Request, ClusterView], list[int]] | None = None
    ) -> None:
        self._cluster = cluster
        self._lookup = lookup
        self.instances = cluster.instances
        self.block_size = cluster.block_size
        self._memo: tuple[int, list[int]] | None = None

    @property
    def now(self) -> float:
        return self._cluster.now

    def cached_prefix_tokens(self, request: Request) -> list[int]:
        if self._memo is None or self._memo[0] != request.request_id:
            lookup = self._lookup
            hits = self._cluster.cached_prefix_tokens(request) if lookup is None else lookup(request, self._cluster)
            self._memo = (request.request_id, hits)
        return self._memo[1]

    def cached_on(self, request: Request, instance_id: int) -> int:
        """The prefix hit on the listed instance with that global id."""
        for k, v in enumerate(self.instances):
            if v.instance_id == instance_id:
                return self.cached_prefix_tokens(request)[k]
        raise KeyError(f"instance {instance_id} is not listed")


class _Side:
    """A colocated policy routing within one role's instances."""

    def __init__(self, role: str, name: str, params: dict[str, Any] | None, param: str) -> None:
        self.role = role
        try:
            cls = POLICIES.get(name)
            if getattr(cls, "disaggregated", False):
                raise ValueError(f"{name!r} is itself a disaggregated policy")
            self.policy = POLICIES.create(name, params or {})
        except (ConfigError, ValueError) as exc:
            raise ValueError(f"param {param!r}: {exc}") from None
        self.ids: list[int] = []  # global id by role-local id
        self._local: dict[int, int] = {}
        self._wrapped: dict[int, LocalView] = {}

    def bind(self, ctx: DisaggContext) -> None:
        side = ctx.side(self.role)
        self.ids = list(ctx.prefill_ids if self.role == "prefill" else ctx.decode_ids)
        self._local = {g: k for k, g in enumerate(self.ids)}
        self.policy.bind(side)

    def view(self, cluster: ClusterView) -> PoolView:
        return PoolView(cluster, self._local, self._wrapped)

    def choose(self, request: Request, cluster: ClusterView) -> int:
        """The global id of the instance the side policy picks among the role's listed ones."""
        view = self.view(cluster)
        k = self.policy.choose(request, view)
        if not 0 <= k < len(view.instances):
            raise RuntimeError(f"policy {self.policy.registry_name} chose invalid {self.role} instance {k!r}")
        return self.ids[view.instances[int(k)].instance_id]

    def routed(self, request: Request, instance_id: int) -> None:
        self.policy.on_routed(request, self._local[instance_id])

    def first_token(self, request: Request) -> None:
        self.policy.on_first_token(request)

    def finished(self, request: Request) -> None:
        self.policy.on_finished(request)


class _TwoSides(DisaggPolicy):
    """The plumbing shared by the families: a prefill side and a decode side."""

    prefill: _Side
    decode: _Side

    def bind(self, ctx: DisaggContext) -> None:  # type: ignore[override]
        super().bind(ctx)
        self.prefill.bind(ctx)
        self.decode.bind(ctx)

    def choose_decode(self, request: Request, cluster: ClusterView) -> int:
        return self.decode.choose(request, _OneLookup(cluster))

    def on_routed_pair(self, request: Request, prefill_id: int | None, decode_id: int | None) -> None:
        if prefill_id is not None:
            self.prefill.routed(request, prefill_id)
        if decode_id is not None:
            self.decode.routed(request, decode_id)

    def on_decode_chosen(self, request: Request, decode_id: int) -> None:
        self.decode.routed(request, decode_id)

    def on_prefill_done(self, leg: Request) -> None:
        self.prefill.first_token(leg)
        self.prefill.finished(leg)

    def on_first_token(self, request: Request) -> None:
        self.decode.first_token(request)

    def on_finished(self, request: Request) -> None:
        self.decode.finished(request)


@POLICIES.register("pd")
class PD(_TwoSides):
    """Any two registered policies: one picks the prefill instance, one the decode instance.

    `prefill_policy` picks the prefill instance among the prefill pool(s), `decode_policy`
    the decode instance among the decode pool(s), each bound to a view and context of its role only (its own profile, limits and seeded
    stream). The prefill side hears of a request at routing and when its prefill is done
    (its first token and its end: the leg's); the decode side at routing, at the client's
    first token and at its end.

    This is how Dynamo's frontend and llm-d's scheduler are built (a prefill router and a
    decode router, `dynamo_disagg`; a prefill and a decode scheduling profile, `llmd_pd`)
    with the two routers left open: `prefill_policy: lmetric` puts LMetric's score
    (P-token × BS, `lmetric`, over the prefill instances' queued prefill and batch) on the
    prefill choice, which is where its KV term has something to find: only prefill instances
    compute prompts. The decode instance is chosen at arrival, after the prefill instance
    (`decode_choice: at_arrival`, as llm-d does), or when the prefill is done
    (`after_prefill`, as Dynamo does with vLLM workers).

    Params: prefill_policy="vllm", prefill_params={}, decode_policy="vllm", decode_params={},
      decode_choice="at_arrival" (| after_prefill).
    """

    def __init__(
        self,
        *,
        prefill_policy: str = "vllm",
        prefill_params: dict[str, Any] | None = None,
        decode_policy: str = "vllm",
        decode_params: dict[str, Any] | None = None,
        decode_choice: str = "at_arrival",
    ) -> None:
        self.prefill = _Side("prefill", prefill_policy, prefill_params, "prefill_policy")
        self.decode = _Side("decode", decode_policy, decode_params, "decode_policy")
        self.decode_choice = check_choice("decode_choice", decode_choice, DECODE_CHOICES)

    def choose_pair(self, request: Request, cluster: ClusterView) -> tuple[int | None, int | None]:
        view = _OneLookup(cluster)
        p = self.prefill.choose(request, view)
        d = self.decode.choose(request, view) if self.decode_choice == "at_arrival" else None
        return p, d


@POLICIES.register("dynamo_disagg")
class DynamoDisagg(_TwoSides):
    """NVIDIA Dynamo's disaggregated router: a KV-aware prefill router, a load-only decode router.

    Both are the `dynamo` KV-router cost (policies.md §3) with the overrides Dynamo applies.
    Sources: `ai-dynamo/dynamo` `lib/llm/src/kv_router/prefill_router/mod.rs`
    (`PrefillRouter::generate`, `build_decode_router_override`) and
    `prefill_router/conditional_bypass.rs` (`select_decode_worker_for_conditional_disagg`),
    whose options are those of `ai-dynamo` 1.6.1's frontend (`--router-conditional-disagg`,
    `--router-conditional-disagg-config`, `dynamo/common/configuration/groups/kv_router_args.py`).

    * Prefill router: "always disables active block tracking" (docs.nvidia.com/dynamo,
      "Disaggregated Serving", v1.6.x): cost = prefill_load_scale · (pending prefill tokens
      + isl − overlap)/B over the prefill instances (`dynamo` with track_active_blocks off).
    * Decode router: `build_decode_router_override` sets overlap_score_credit 0,
      assume_kv_reuse false and track_prefill_tokens false on the decode leg, so the cost is
      the worker's active decode blocks plus the request's own: load balancing
      (peer_research §A.3, "Disaggregated").
    * When the decode worker is chosen (`decode_choice`): `generate` routes the prefill leg
      first; a vLLM prefill worker returns no bootstrap address, so Dynamo waits for the
      prefill to complete (`PrefillOutcome::Completed`) and only then routes the decode leg
      through the decode router, which picks the worker as the load is then. Default
      `after_prefill`, Dynamo with vLLM workers (lmsim's engine is vLLM's). SGLang and
      TensorRT-LLM prefill workers return a bootstrap address: the prefill runs in the
      background and the decode worker is chosen at once, `at_arrival`. Against Dynamo's
      mocker with its KV router (`benchmarks/against_dynamo_disagg.py --router kv`, Kimi
      conversation trace, 4P+12D): mean TPOT 8.487 vs 8.489 ms after the prefill, 8.706 vs
      8.487 ms (+2.6%) at arrival; mean TTFT within 0.2% either way.
    * Conditional bypass (`conditional_disagg`, off by default as Dynamo's experimental
      frontend flag is): before any prefill, Dynamo asks its decode router which worker it
      would pick for the request with the request's own router settings, i.e. the decode
      router's base config: overlap credit 1, KV reuse and prefill tracking on (no decode
      override yet), so the pick goes to the decode worker that caches the prefix. The
      `IslBoundingPolicy` (`lib/kv-router/src/conditional_disagg.rs`) then bypasses the
      prefill pool, prefilling on that worker, iff eff_isl = prompt − cached tokens there
      is < `eff_isl_threshold` (2048) and eff_isl / prompt < `eff_isl_ratio_threshold`
      (0.7). The bypassed request is booked on that worker with the base config. Otherwise
      the request takes the normal path, and its decode leg is routed with
      `build_decode_router_override(existing, conditional_disagg_enabled)`, which with the
      flag on keeps the overlap credit (assume_kv_reuse and prefill tracking still off): the
      decode choice is KV-aware too. A load-only peek (the earlier lmsim) finds a prefix that
      lives on one decode worker only by chance (1 in N). On the study's traces
      (experiments/beyond/routers_disaggregated.yaml with `conditional_disagg: true`, at
      arrival) the bypass count moves little, chatbot 10P:6D 1,339 -> 1,420 of 2,000,
      agent 3,066 -> 3,101 of 4,000, toolagent 692 -> 691, coder 8 -> 7: their shared
      prefixes sit on every decode worker. Dynamo's offline replay cannot show either: its
      decode workers publish no KV events and it bypasses nothing (ai-dynamo 1.6.1,
      `router_mode="kv_router"`, `KvRouterConfig(conditional_disagg_enabled=True)`).

    Params: overlap_score_weight=1.0, temperature=0.0 (both routers),
      decode_choice="after_prefill" (| at_arrival), conditional_disagg=False,
      eff_isl_threshold=2048, eff_isl_ratio_threshold=0.7.
    Not modelled: the PrefillLoad/IslOrLoad bypass policies and the decode-busy veto; with
      prefill tracking off Dynamo still counts a decode worker's booked prefill load (the
      bypassed requests') and drops only the new request's own, where `dynamo` drops the
      booked load (it matters only with `conditional_disagg`).
    """

    # What `build_decode_router_override` sets on a decode leg; the bypass peek runs without it.
    DECODE_OVERRIDE = {"assume_kv_reuse": False, "track_prefill_tokens": False}

    def __init__(
        self,
        *,
        overlap_score_weight: float = 1.0,
        temperature: float = 0.0,
        decode_choice: str = "after_prefill",
        conditional_disagg: bool = False,
        eff_isl_threshold: int = 2048,
        eff_isl_ratio_threshold: float = 0.7,
    ) -> None:
        common = {"overlap_score_weight": overlap_score_weight, "temperature": temperature}
        self.prefill = _Side("prefill", "dynamo", {**common, "track_active_blocks": False}, "overlap_score_weight")
        # the decode router's base config; the decode legs' override is applied per decision
        self.decode = _Side("decode", "dynamo", common, "overlap_score_weight")
        self.decode_choice = check_choice("decode_choice", decode_choice, DECODE_CHOICES)
        self.conditional = check_bool("conditional_disagg", conditional_disagg)
        self.eff_isl_threshold = check_number("eff_isl_threshold", eff_isl_threshold, lo=0, integer=True)
        self.eff_isl_ratio = check_number("eff_isl_ratio_threshold", eff_isl_ratio_threshold, lo=0)
        self.leg_override = {**self.DECODE_OVERRIDE, **({} if self.conditional else {"overlap_score_credit": 0.0})}

    def bypasses(self, request: Request, decode_overlap_tokens: int, block_size: int) -> bool:
        """IslBoundingPolicy::should_bypass_remote_prefill (overlap as whole blocks)."""
        overlap_blocks = decode_overlap_tokens // block_size
        eff_isl = max(0, request.input_tokens - overlap_blocks * block_size)
        if eff_isl >= self.eff_isl_threshold:
            return False
        return eff_isl / max(request.input_tokens, 1) < self.eff_isl_ratio

    def _decode_leg(self, request: Request, view: ClusterView) -> int:
        with self.decode.policy.overridden(**self.leg_override):
            return self.decode.choose(request, view)

    def choose_pair(self, request: Request, cluster: ClusterView) -> tuple[int | None, int | None]:
        view = _OneLookup(cluster)
        if self.conditional:
            peek = self.decode.choose(request, view)  # base config: overlap credit 1
            if self.bypasses(request, view.cached_on(request, peek), view.block_size):
                return None, peek
        p = self.prefill.choose(request, view)
        return p, (self._decode_leg(request, view) if self.decode_choice == "at_arrival" else None)

    def choose_decode(self, request: Request, cluster: ClusterView) -> int:
        return self._decode_leg(request, _OneLookup(cluster))

    def on_routed_pair(self, request: Request, prefill_id: int | None, decode_id: int | None) -> None:
        if prefill_id is None:  # bypassed: booked as the peek priced it
            self.decode.routed(request, decode_id)  # type: ignore[arg-type]
            return
        self.prefill.routed(request, prefill_id)
        if decode_id is not None:
            self.on_decode_chosen(request, decode_id)

    def on_decode_chosen(self, request: Request, decode_id: int) -> None:
        with self.decode.policy.overridden(**self.leg_override):
            self.decode.routed(request, decode_id)


@POLICIES.register("llmd_pd")
class LlmdPD(_TwoSides):
    """llm-d's P/D scheduler: the decode pod first, a prefill pod only if enough is uncached there.

    In `llm-d/llm-d-inference-scheduler` @520af478,
    `pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler.go`
    `Pick` (L246-320), the decode profile runs first (L264) and picks the decode endpoint;
    the prefill profile runs only if the prefill decider approves for that endpoint
    (L297-300). `prefix_based_pd_decider.go::disaggregate` (L99-149): no P/D when
    `nonCachedTokens` is 0 (its default, L54) or the prompt is shorter than it; else P/D iff
    the prompt tokens not cached on the chosen decode endpoint (prompt − matched blocks ×
    block size, L135-143) are at least `nonCachedTokens`. Otherwise the decode endpoint
    prefills the request itself. Both endpoints are chosen when the request arrives.

    Both profiles score as the sample config `deploy/config/pd-epp-config.yaml`: a role
    filter, `prefix-cache-scorer` weight 2 (`maxPrefixBlocksToMatch: 256`) and
    `queue-scorer` weight 1, max score wins (`llmd_scorer` with w_prefix 2, w_queue 1, w_kv
    0); its `nonCachedTokens: 16` is the default here. llm-d estimates the prompt length as
    characters / 4 (L23); lmsim knows the tokens.

    The prefix match (`prefix_index`): `approximate` (default) is llm-d's default producer,
    the approximate index of where it routed each prompt (`lmsim.policies.routed_prefix.RoutedPrefixLRU`:
    the first `max_prefix_blocks` hashes recorded on the decode and the prefill endpoint at
    routing, one LRU per endpoint of `index_capacity_blocks`, default each endpoint's KV
    blocks, llm-d's `autoTune`; no eviction feedback, no engine cap on the hit). `router`
    follows the router's `kv_view` instead (`events` is llm-d's precise scorer, `exact` an
    oracle).

    Params: non_cached_tokens=16 (0: never disaggregate, llm-d's code default),
      w_prefix=2.0, w_queue=1.0, w_kv=0.0, max_prefix_blocks=256,
      prefix_index="approximate" (| router), index_capacity_blocks=None (>= 1).
    """

    def __init__(
        self,
        *,
        non_cached_tokens: int = 16,
        w_prefix: float = 2.0,
        w_queue: float = 1.0,
        w_kv: float = 0.0,
        max_prefix_blocks: int = 256,
        prefix_index: str = "approximate",
        index_capacity_blocks: int | None = None,
    ) -> None:
        self.non_cached = check_number("non_cached_tokens", non_cached_tokens, lo=0, integer=True)
        scorers = {"w_prefix": w_prefix, "w_queue": w_queue, "w_kv": w_kv, "max_prefix_blocks": max_prefix_blocks}
        self.prefill = _Side("prefill", "llmd_scorer", scorers, "w_prefix")
        self.decode = _Side("decode", "llmd_scorer", scorers, "w_prefix")
        self.max_blocks = int(max_prefix_blocks)
        self.prefix_index = check_choice("prefix_index", prefix_index, ("approximate", "router"))
        self.index_capacity = None if index_capacity_blocks is None else check_number(
            "index_capacity_blocks", index_capacity_blocks, lo=1, integer=True)
        self.index: RoutedPrefixLRU | None = None
        self._capacity: dict[int, int] = {}  # global id -> index capacity, from its first listing

    def bind(self, ctx: DisaggContext) -> None:  # type: ignore[override]
        super().bind(ctx)
        if self.prefix_index == "approximate":
            self.index = RoutedPrefixLRU(ctx.num_instances)

    def _indexed(self, request: Request, cluster: ClusterView) -> list[int]:
        """The routing-history index's hit of each listed instance (the walk goes on while
        any instance, listed or not, holds the block, as llm-d's index keeps an endpoint's
        entries until its LRU evicts them)."""
        assert self.index is not None
        bsz = self.ctx.block_size
        blocks = self.index.matched_blocks(request.block_hashes[: self.max_blocks])
        return [blocks[v.instance_id] * bsz for v in cluster.instances]

    def disaggregates(self, request: Request, decode_hit_tokens: int) -> bool:
        n = self.non_cached
        isl = request.input_tokens
        return n > 0 and isl >= n and isl - decode_hit_tokens >= n

    def choose_pair(self, request: Request, cluster: ClusterView) -> tuple[int | None, int | None]:
        view = _OneLookup(cluster, self._indexed if self.index is not None else None)
        if self.index is not None:
            capacity = self._capacity
            for v in cluster.instances:
                if v.instance_id not in capacity:
                    capacity[v.instance_id] = self.index_capacity or v.num_total_blocks
        d = self.decode.choose(request, view)
        if not self.disaggregates(request, view.cached_on(request, d)):
            return None, d
        return self.prefill.choose(request, view), d

    def on_routed_pair(self, request: Request, prefill_id: int | None, decode_id: int | None) -> None:
        super().on_routed_pair(request, prefill_id, decode_id)
        if self.index is not None:
            hashes = request.block_hashes[: self.max_blocks]
            for where in (decode_id, prefill_id):  # PreRequest: the primary (decode) profile, then prefill
                if where is not None:
                    self.index.insert(hashes, where, self._capacity[where])


def disaggregated_policy_names() -> list[str]:
    return [n for n in POLICIES.names() if getattr(POLICIES.get(n), "disaggregated", False)]


def colocated_policy_names() -> list[str]:
    return [n for n in POLICIES.names() if not getattr(POLICIES.get(n), "disaggregated", False)]


def check_policy_shape(name: str, disaggregated: bool, *, where: str) -> None:
    """One line when `name` does not route this shape of cluster (ConfigError)."""
    cls = POLICIES.get(name, where=where)
    if disaggregated and not getattr(cls, "disaggregated", False):
        raise ConfigError(
            f"{where}: {name!r} routes a colocated cluster, and this one has prefill and decode pools: "
            f"use a disaggregated policy ({', '.join(disaggregated_policy_names())}; "
            f"pd with prefill_policy: {name} puts {name} on the prefill choice)"
        )
    if not disaggregated and getattr(cls, "disaggregated", False):
        raise ConfigError(
            f"{where}: {name!r} routes prefill and decode pools, and this cluster has none "
            "(give cluster.pools the roles prefill and decode, or use a colocated policy)"
        )


__all__ = [
    "DisaggContext", "DisaggPolicy", "LocalView", "PoolView", "check_policy_shape", "colocated_policy_names",
    "disaggregated_policy_names",
]
