"""Routers for disaggregated clusters (issue 25): each request gets a prefill instance (or
none: then its decode instance prefills it, a conditional bypass) and a decode instance.

A `DisaggPolicy` answers `choose_pair(request, cluster) -> (prefill_id | None, decode_id |
None)` with global instance ids; a decode id of None means "choose when the prefill is done"
(`cluster.kv_transfer.decode_choice: after_prefill`), asked through `choose_decode`. Its
hooks: `on_routed_pair`, `on_decode_chosen`, `on_prefill_done(leg)` (the prefill instance
computed the prompt), and the colocated hooks `on_first_token`/`on_finished` for the
request's decode side. The engine's side of the lifecycle is `lmsim.engine.disagg`.

The families compose colocated policies over one role's instances: `_Side` binds a
registered policy to a context and a view restricted to that role (positions 0..n-1 of the
role's instances, each with its own profile and limits), so every colocated policy can
route a prefill pool or a decode pool unchanged.
"""

from __future__ import annotations

from typing import Any, Protocol

from lmsim.engine.request import Request
from lmsim.errors import ConfigError
from lmsim.policies._common import check_bool, check_number
from lmsim.policies.base import POLICIES, ClusterView, Policy, RouterContext


class DisaggContext(RouterContext, Protocol):
    """A RouterContext over the whole disaggregated cluster, plus its two roles."""

    prefill_ids: list[int]
    decode_ids: list[int]
    decode_choice: str  # at_arrival | after_prefill

    def side(self, role: str) -> RouterContext:
        """A context over one role's instances (positions 0..n-1), its own seeded stream."""
        ...


class DisaggPolicy(Policy):
    """Base of the disaggregated policies (see the module docstring)."""

    disaggregated = True
    # A policy whose prefill decision reads the decode instance it picked (a bypass rule)
    # must pick the decode instance at arrival.
    decides_with_decode = False

    def bind(self, ctx: DisaggContext) -> None:  # type: ignore[override]
        self.ctx = ctx
        self.check_decode_choice(ctx.decode_choice, where="router.policy")

    def check_decode_choice(self, decode_choice: str, *, where: str) -> None:
        if decode_choice == "after_prefill" and self.decides_with_decode:
            raise ConfigError(
                f"{where}: {self.registry_name!r} as configured chooses the decode instance before "
                "the prefill instance; it needs cluster.kv_transfer.decode_choice: at_arrival"
            )

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


class PoolView:
    """A ClusterView over some of the cluster's instances, by position."""

    def __init__(self, cluster: ClusterView, ids: list[int]) -> None:
        self._cluster = cluster
        self._ids = ids
        self.instances = [cluster.instances[i] for i in ids]
        self.block_size = cluster.block_size

    @property
    def now(self) -> float:
        return self._cluster.now

    def cached_prefix_tokens(self, request: Request) -> list[int]:
        full = self._cluster.cached_prefix_tokens(request)
        return [full[i] for i in self._ids]


class _OneLookup:
    """The cluster view of one decision: both sides share one prefix lookup."""

    def __init__(self, cluster: ClusterView) -> None:
        self._cluster = cluster
        self.instances = cluster.instances
        self.block_size = cluster.block_size
        self._memo: tuple[int, list[int]] | None = None

    @property
    def now(self) -> float:
        return self._cluster.now

    def cached_prefix_tokens(self, request: Request) -> list[int]:
        if self._memo is None or self._memo[0] != request.request_id:
            self._memo = (request.request_id, self._cluster.cached_prefix_tokens(request))
        return self._memo[1]


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
        self.ids: list[int] = []
        self._local: dict[int, int] = {}

    def bind(self, ctx: DisaggContext) -> None:
        side = ctx.side(self.role)
        self.ids = list(ctx.prefill_ids if self.role == "prefill" else ctx.decode_ids)
        self._local = {g: k for k, g in enumerate(self.ids)}
        self.policy.bind(side)

    def view(self, cluster: ClusterView) -> PoolView:
        return PoolView(cluster, self.ids)

    def choose(self, request: Request, cluster: ClusterView) -> int:
        k = self.policy.choose(request, self.view(cluster))
        if not 0 <= k < len(self.ids):
            raise RuntimeError(f"policy {self.policy.registry_name} chose invalid {self.role} instance {k!r}")
        return self.ids[int(k)]

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
    compute prompts. The decode instance is chosen at arrival, after the prefill instance,
    or when the prefill is done (`cluster.kv_transfer.decode_choice: after_prefill`).

    Params: prefill_policy="vllm", prefill_params={}, decode_policy="vllm", decode_params={}.
    """

    def __init__(
        self,
        *,
        prefill_policy: str = "vllm",
        prefill_params: dict[str, Any] | None = None,
        decode_policy: str = "vllm",
        decode_params: dict[str, Any] | None = None,
    ) -> None:
        self.prefill = _Side("prefill", prefill_policy, prefill_params, "prefill_policy")
        self.decode = _Side("decode", decode_policy, decode_params, "decode_policy")

    def choose_pair(self, request: Request, cluster: ClusterView) -> tuple[int | None, int | None]:
        view = _OneLookup(cluster)
        p = self.prefill.choose(request, view)
        d = self.decode.choose(request, view) if self.ctx.decode_choice == "at_arrival" else None
        return p, d


@POLICIES.register("dynamo_disagg")
class DynamoDisagg(_TwoSides):
    """NVIDIA Dynamo's disaggregated router: a KV-aware prefill router, a load-only decode router.

    Both are the `dynamo` KV-router cost (policies.md §3) with the overrides Dynamo applies.

    * Prefill router: "always disables active block tracking" (docs.nvidia.com/dynamo,
      "Disaggregated Serving", v1.6.x): cost = prefill_load_scale · (pending prefill tokens
      + isl − overlap)/B over the prefill instances (`dynamo` with track_active_blocks off).
    * Decode router: `build_decode_router_override` in Dynamo's frontend sets
      overlap_score_credit 0, assume_kv_reuse false and track_prefill_tokens false, so the
      cost is the worker's active decode blocks plus the request's own: load balancing
      (peer_research §A.3, "Disaggregated").
    * Conditional bypass (off by default): `lib/kv-router/src/conditional_disagg.rs`
      (ai-dynamo/dynamo @088ca50b) `IslBoundingPolicy`: with eff_isl = prompt − (overlap
      blocks on the decode worker the decode router picked) × B, the request is prefilled on
      that decode worker iff eff_isl < `eff_isl_threshold` (2048,
      `DEFAULT_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD`) and eff_isl / prompt <
      `eff_isl_ratio_threshold` (0.7). Off by default as in Dynamo (the standard frontend
      does not expose it) and in its offline replay, where decode workers publish no KV
      events and nothing is ever bypassed (probe_destmissing.py). With it on the decode
      worker is chosen first, so it needs `decode_choice: at_arrival`.

    Params: overlap_score_weight=1.0, temperature=0.0 (both routers), conditional_disagg=False,
      eff_isl_threshold=2048, eff_isl_ratio_threshold=0.7.
    Not modelled: the PrefillLoad/IslOrLoad bypass policies and the decode-busy veto.
    """

    def __init__(
        self,
        *,
        overlap_score_weight: float = 1.0,
        temperature: float = 0.0,
        conditional_disagg: bool = False,
        eff_isl_threshold: int = 2048,
        eff_isl_ratio_threshold: float = 0.7,
    ) -> None:
        common = {"overlap_score_weight": overlap_score_weight, "temperature": temperature}
        self.prefill = _Side("prefill", "dynamo", {**common, "track_active_blocks": False}, "overlap_score_weight")
        self.decode = _Side(
            "decode", "dynamo",
            {**common, "overlap_score_credit": 0.0, "assume_kv_reuse": False, "track_prefill_tokens": False},
            "overlap_score_weight",
        )
        self.conditional = check_bool("conditional_disagg", conditional_disagg)
        self.decides_with_decode = self.conditional
        self.eff_isl_threshold = check_number("eff_isl_threshold", eff_isl_threshold, lo=0, integer=True)
        self.eff_isl_ratio = check_number("eff_isl_ratio_threshold", eff_isl_ratio_threshold, lo=0)

    def bypasses(self, request: Request, decode_overlap_tokens: int, block_size: int) -> bool:
        """IslBoundingPolicy::should_bypass_remote_prefill (overlap as whole blocks)."""
        overlap_blocks = decode_overlap_tokens // block_size
        eff_isl = max(0, request.input_tokens - overlap_blocks * block_size)
        if eff_isl >= self.eff_isl_threshold:
            return False
        return eff_isl / max(request.input_tokens, 1) < self.eff_isl_ratio

    def choose_pair(self, request: Request, cluster: ClusterView) -> tuple[int | None, int | None]:
        view = _OneLookup(cluster)
        if self.conditional:
            d = self.decode.choose(request, view)
            if self.bypasses(request, view.cached_prefix_tokens(request)[d], view.block_size):
                return None, d
            return self.prefill.choose(request, view), d
        p = self.prefill.choose(request, view)
        d = self.decode.choose(request, view) if self.ctx.decode_choice == "at_arrival" else None
        return p, d


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
    prefills the request itself.

    Both profiles score as the sample config `deploy/config/pd-epp-config.yaml`: a role
    filter, `prefix-cache-scorer` weight 2 (`maxPrefixBlocksToMatch: 256`) and
    `queue-scorer` weight 1, max score wins (`llmd_scorer` with w_prefix 2, w_queue 1, w_kv
    0); its `nonCachedTokens: 16` is the default here. llm-d estimates the prompt length as
    characters / 4 (L23); lmsim knows the tokens. The prefix match follows the router's
    `kv_view` (llm-d's default producer is the approximate index).

    Params: non_cached_tokens=16 (0: never disaggregate, llm-d's code default),
      w_prefix=2.0, w_queue=1.0, w_kv=0.0, max_prefix_blocks=256.
    """

    decides_with_decode = True

    def __init__(
        self,
        *,
        non_cached_tokens: int = 16,
        w_prefix: float = 2.0,
        w_queue: float = 1.0,
        w_kv: float = 0.0,
        max_prefix_blocks: int = 256,
    ) -> None:
        self.non_cached = check_number("non_cached_tokens", non_cached_tokens, lo=0, integer=True)
        scorers = {"w_prefix": w_prefix, "w_queue": w_queue, "w_kv": w_kv, "max_prefix_blocks": max_prefix_blocks}
        self.prefill = _Side("prefill", "llmd_scorer", scorers, "w_prefix")
        self.decode = _Side("decode", "llmd_scorer", scorers, "w_prefix")

    def disaggregates(self, request: Request, decode_hit_tokens: int) -> bool:
        n = self.non_cached
        isl = request.input_tokens
        return n > 0 and isl >= n and isl - decode_hit_tokens >= n

    def choose_pair(self, request: Request, cluster: ClusterView) -> tuple[int | None, int | None]:
        view = _OneLookup(cluster)
        d = self.decode.choose(request, view)
        if not self.disaggregates(request, view.cached_prefix_tokens(request)[d]):
            return None, d
        return self.prefill.choose(request, view), d


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
    "DisaggContext", "DisaggPolicy", "PoolView", "check_policy_shape", "colocated_policy_names",
    "disaggregated_policy_names",
]
