"""The contract between the engine and the routing policies: what a policy sees and how it
answers. It sits below both: the engine builds the views and calls a policy object it is
handed (the study layer composes the run and creates the policy from the registry in
`lmsim.policies`), and the policies implement `Policy` against these views, so neither
package imports the other's internals.

A policy is one class registered by name in `lmsim.policies.POLICIES`; its keyword-only
constructor arguments are its YAML `params`. For each arriving request the router calls
`choose(request, cluster)` and sends the request where it says. Policies read the cluster
only through the read-only views below; they never reach into instance internals, and they
must not read the request's `output_tokens` (a real router cannot know it).

Positions and ids. `cluster.instances` lists the instances the router may send to now (the
routable ones, in id order): all of them unless instances start, drain or fail during the
run (`fleet:`), and then a subset of the `ctx.num_instances` allocated. `choose` answers a
position in that list; the router sends the request to `cluster.instances[k].instance_id`.
Every per-instance list a view returns (`cached_prefix_tokens`, ...) is by position too.
The hooks (`on_routed`, KV events, `ctx.cost_models`) speak ids, so whatever a policy keeps
per instance (in-flight counts, prefix indexes, bins, windows) is keyed by
`InstanceView.instance_id`, never by position. With every instance listed a position is
the id. A policy on one side of a disaggregated cluster sees role-local ids (0..n-1 over
that role's instances, `lmsim.policies.disagg.PoolView`).

Views are cheap live proxies: reading an attribute computes it from the instance's state at
the current simulated time. `ClusterView.cached_prefix_tokens(request)` gives every
instance's exact prefix-cache hit in one pass over a global block-hash index.

Policies that keep router-local state (in-flight counters, an approximate prefix index,
sliding windows) update it in the `on_*` hooks; the router calls them at dispatch, at the
request's first token and when it finishes.

Parameter checks raise `ValueError` with one line naming the parameter, the allowed values and
what was given; the registry prefixes the policy name ("policy 'bailian': param 'lambda' must
be in [0, 1], got 1.5").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class RequestView(Protocol):
    """What a router may read of a request (the engine's `Request` has these and more)."""

    request_id: int
    arrived_at: float  # simulated seconds
    input_tokens: int  # prompt length
    block_hashes: list[int]  # content hashes of the prompt's full 16-token blocks, in order
    trace_hash_ids: Sequence[int]  # the trace's own block ids (their size is the trace's)
    session_id: int  # -1 when the trace names none
    parent_id: int  # the request this one follows in its session, -1 if none
    class_id: int  # the workload's request class, -1 if none
    slo_class: int  # the SLO class a policy may serve by, -1 if none


class InstanceView(Protocol):
    instance_id: int  # the instance's id for the run (0-based; role-local on a P/D side): key state by it
    pool: str  # the pool's name ("default" without cluster.pools)
    role: str  # both | prefill | decode
    cost_model: Any  # the instance's own StepCostModel (mixed fleets differ per pool)
    max_num_batched_tokens: int  # the instance's engine limits
    max_num_seqs: int  # most requests the instance runs at once
    num_running: int  # R: requests in the running batch, including partial prefills
    num_waiting: int  # Q: requests in the waiting queue
    batch_size: int  # R + Q, the paper's BS
    num_prefilling: int  # running requests whose prompt is not fully computed
    pending_prefill_tokens: int  # uncomputed prompt tokens, queued and partial, after hits
    total_tokens: int  # tokens in context over running + waiting requests
    decode_context_tokens: int  # KV tokens the decoding requests attend to
    kv_usage: float  # 1 - free/total blocks (cached-but-free blocks count as free)
    num_free_blocks: int  # KV blocks free, cached-but-unused ones included
    num_total_blocks: int  # the instance's whole KV pool, in blocks

    def cached_prefix_tokens(self, request: RequestView) -> int:
        """Tokens of `request` that would hit this instance's prefix cache now (block-aligned,
        capped so that at least one prompt token is computed)."""
        ...

    def queued_prefills(self) -> list[tuple[int, int]]:
        """(tokens still to compute, tokens already in KV) for each prefilling running request
        and then each waiting request, in the order the instance will schedule them."""
        ...

    def step_in_flight(self) -> tuple[float, list[int]]:
        """(seconds until the engine step running now ends, the prompt tokens that step is
        computing for each entry of `queued_prefills()`)."""
        ...

    def kv_load_time_s(self, host_tokens: int, disk_tokens: int) -> float:
        """Seconds the instance takes to bring that many tokens from its host memory and disk
        to the GPU on idle lanes (0 without lower KV tiers)."""
        ...


class ClusterView(Protocol):
    instances: Sequence[InstanceView]  # the routable instances, in id order; `choose` answers a position here
    now: float  # simulated seconds
    block_size: int  # tokens per KV block
    has_kv_tiers: bool  # some instance keeps KV in host memory or on disk (lmsim.engine.kv_tiers)

    def cached_prefix_tokens(self, request: RequestView) -> list[int]:
        """Per listed instance, by position: `InstanceView.cached_prefix_tokens`, all in one
        pass."""
        ...

    def cached_prefix_tokens_by_tier(self, request: RequestView) -> list[tuple[int, int, int]]:
        """Per listed instance (GPU, host, disk) tokens: the GPU prefix hit (as
        `cached_prefix_tokens`), then the tokens continuing it in host memory, then those
        continuing that on disk: what the instance would load instead of computing."""
        ...


class RouterContext(Protocol):
    """What a policy may use besides the views, handed over once in `bind`."""

    num_instances: int  # instances allocated for the run (ids 0..num_instances-1), listed or not
    block_size: int
    max_num_batched_tokens: int  # the first pool's limits; each InstanceView carries its own
    max_num_seqs: int
    rng: np.random.Generator  # the policy's own seeded stream
    cost_model: Any  # the first pool's StepCostModel (the only one without cluster.pools)
    cost_models: Sequence[Any]  # every instance's own StepCostModel, by instance_id (mixed fleets)

    def now(self) -> float: ...

    def load_cost_model(self, spec: Any) -> Any:
        """Another profile's StepCostModel (e.g. an untuned estimator)."""
        ...

    def every(self, period_s: float, callback: Callable[[float], None]) -> None:
        """Call `callback(now)` every `period_s` simulated seconds while requests remain."""
        ...

    def subscribe_kv_events(self, callback: Callable[[int, int, bool, float], None]) -> None:
        """Call `callback(instance_id, block_hash, stored, now)` whenever an instance's prefix
        cache gains (`stored=True`) or evicts (`stored=False`) a block."""
        ...

    def record_event(self, kind: str, **fields: Any) -> None:
        """Append a row to the run's `router_events.parquet` (e.g. hotspot alarms)."""
        ...


class Policy:
    """Base class: subclasses implement `choose` and may override the hooks."""

    registry_name = "?"
    # Param -> one line on why its default is what it is, for the open choices that were
    # measured both ways (`lmsim policies` prints them).
    default_reasons: dict[str, str] = {}

    def bind(self, ctx: RouterContext) -> None:
        self.ctx = ctx

    def choose(self, request: RequestView, cluster: ClusterView) -> int:  # pragma: no cover
        """The position in `cluster.instances` (0 <= k < len(cluster.instances)) of the
        instance to send `request` to; the router maps it to that view's `instance_id`."""
        raise NotImplementedError

    def on_routed(self, request: RequestView, instance_id: int) -> None:
        """`request` was sent to the instance with this id (an id, not a position)."""
        pass

    def on_first_token(self, request: RequestView) -> None:
        pass

    def on_finished(self, request: RequestView) -> None:
        pass


def argmin_first(scores: Sequence[float]) -> int:
    """Index of the first strict minimum: vLLM's tie-break (scan from index 0)."""
    best = 0
    best_score = scores[0]
    for i in range(1, len(scores)):
        if scores[i] < best_score:
            best, best_score = i, scores[i]
    return best


def argmin_random(scores: Sequence[float], rng: np.random.Generator) -> int:
    """A uniformly random index among the minima (seeded)."""
    low = min(scores)
    ties = [i for i, s in enumerate(scores) if s == low]
    if len(ties) == 1:
        return ties[0]
    return ties[int(rng.integers(len(ties)))]


def check_number(
    name: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    integer: bool = False,
) -> float:
    """Validate a numeric parameter; bools are rejected (YAML `yes` is not a number)."""
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or (not integer and math.isnan(value)):
        raise ValueError(f"param {name!r} must be {kind}, got {value!r}")
    if lo is not None and hi is not None:
        left = "(" if lo_open else "["
        if value < lo or value > hi or (lo_open and value == lo):
            raise ValueError(f"param {name!r} must be in {left}{lo}, {hi}], got {value!r}")
    elif lo is not None and (value < lo or (lo_open and value == lo)):
        op = ">" if lo_open else ">="
        raise ValueError(f"param {name!r} must be {op} {lo}, got {value!r}")
    return value


def check_choice(name: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"param {name!r} must be one of {'|'.join(allowed)}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"param {name!r} must be true or false, got {value!r}")
    return value


def capped_blocks(request: RequestView, block_size: int) -> int:
    """Prompt blocks a cache hit may cover: the engine always computes at least one token."""
    return max(0, (request.input_tokens - 1) // block_size)
