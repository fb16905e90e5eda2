"""The global router: read-only views of the instances, the policy call, dispatch.

Policies see instances only through `LiveInstanceView` (attributes computed from the
instance's state at the current time) and `LiveClusterView` (adds the one-pass prefix
lookup over the global block-hash index). The router measures the wall time each decision
takes, to report `router_us_per_decision`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import simpy

from lmsim.engine.fleet import ACTIVE
from lmsim.engine.instance import Instance, materialize_all
from lmsim.engine.kv_cache import GlobalPrefixIndex
from lmsim.engine.kv_tiers import TieredKV
from lmsim.engine.request import Request
from lmsim.errors import PolicyError
from lmsim.routing import Policy


class LiveInstanceView:
    """A read-only window on one instance. Reading is side-effect free for the simulation."""

    __slots__ = (
        "_instance", "_scheduler", "_tiers", "cost_model", "instance_id", "max_num_batched_tokens",
        "max_num_seqs", "pool", "role",
    )

    def __init__(self, instance: Instance, tiers: TieredKV | None = None) -> None:
        self._instance = instance
        self._tiers = tiers
        self._scheduler = instance.scheduler
        self.instance_id = instance.instance_id
        # What the instance is, fixed for the run: mixed fleets price each on its own profile.
        pool = instance.pool
        self.pool = pool.name if pool is not None else "default"
        self.role = pool.role if pool is not None else "both"
        self.cost_model = instance.scheduler.cost_model
        self.max_num_batched_tokens = instance.scheduler.max_num_batched_tokens
        self.max_num_seqs = instance.scheduler.max_num_seqs

    def rebind(self) -> None:
        """The instance was given a new scheduler (lmsim.engine.fleet: a stop or a crash)."""
        self._scheduler = self._instance.scheduler

    @property
    def num_running(self) -> int:
        return len(self._scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self._scheduler.waiting)

    @property
    def batch_size(self) -> int:
        return len(self._scheduler.running) + len(self._scheduler.waiting)

    @property
    def num_prefilling(self) -> int:
        return len(self._scheduler.prefilling)

    @property
    def pending_prefill_tokens(self) -> int:
        return self._scheduler.pending_prefill_tokens

    @property
    def total_tokens(self) -> int:
        return self._scheduler.total_tokens

    @property
    def decode_context_tokens(self) -> int:
        return self._scheduler.decode_context_tokens

    @property
    def kv_usage(self) -> float:
        return self._scheduler.cache.usage

    @property
    def num_free_blocks(self) -> int:
        return self._scheduler.cache.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self._scheduler.cache.num_total_blocks

    def cached_prefix_tokens(self, request: Request) -> int:
        return self._scheduler.hit_blocks(request) * self._scheduler.block_size

    def queued_prefills(self) -> list[tuple[int, int]]:
        return self._scheduler.queued_prefills()

    def kv_load_time_s(self, host_tokens: int, disk_tokens: int) -> float:
        """Seconds this instance takes to bring that many tokens from host memory and disk to
        the GPU on idle lanes (0 without tiers)."""
        tiers = self._tiers
        return tiers.load_time_s(host_tokens, disk_tokens) if tiers is not None else 0.0

    def step_in_flight(self) -> tuple[float, list[int]]:
        """(seconds until the running step ends, prompt tokens it computes for each entry of
        `queued_prefills()`, in the same order)."""
        remaining, chunks = self._instance.step_in_flight()
        sched = self._scheduler
        if chunks:
            q = [chunks.get(r.request_id, 0) for r in sched.prefilling]
        else:
            q = [0] * len(sched.prefilling)
        if sched.waiting:
            q.extend([0] * len(sched.waiting))
        return remaining, q


class LiveClusterView:
    def __init__(
        self,
        env: simpy.Environment,
        instances: Sequence[Instance],
        index: GlobalPrefixIndex,
        block_size: int,
        enable_prefix_caching: bool,
        kv_tiers: dict[int, TieredKV] | None = None,
    ) -> None:
        self._env = env
        self._tiers = kv_tiers or {}
        self.instances = [LiveInstanceView(i, self._tiers.get(i.instance_id)) for i in instances]
        self._index = index
        self.block_size = block_size
        self._caching = enable_prefix_caching
        self.has_kv_tiers = bool(self._tiers)

    @property
    def now(self) -> float:
        return self._env.now

    def rebind(self, instance_id: int) -> None:
        self.instances[instance_id].rebind()

    def cached_prefix_tokens(self, request: Request) -> list[int]:
        if not self._caching:
            return [0] * len(self.instances)
        bs = self.block_size
        cap = (request.input_tokens - 1) // bs
        return [b * bs for b in self._index.match_blocks(request.block_hashes, cap)]

    def cached_prefix_tokens_by_tier(self, request: Request) -> list[tuple[int, int, int]]:
        """Per instance (GPU, host, disk) tokens of `request`'s prompt: the GPU prefix hit
        (as `cached_prefix_tokens`), then the blocks continuing it in host memory, then those
        continuing that on disk, up to the prompt's full blocks: what the instance's tiers
        would load at admission now (lmsim.engine.kv_tiers)."""
        gpu = self.cached_prefix_tokens(request)
        if not self._tiers or not self._caching:
            return [(g, 0, 0) for g in gpu]
        bs = self.block_size
        hashes = request.block_hashes
        stop = min(len(hashes), request.input_tokens // bs)
        out = []
        for i, g in enumerate(gpu):
            tiers = self._tiers.get(i)
            if tiers is None:
                out.append((g, 0, 0))
                continue
            host, disk = tiers.split(hashes, g // bs, stop)
            out.append((g, host * bs, disk * bs))
        return out

    def catch_up_kv_tiers(self) -> None:
        """Apply every tier store due by now (their KV events with it)."""
        now = self._env.now
        for tiers in self._tiers.values():
            tiers.catch_up(now)


class RouterBase:
    """What every router keeps: the instances, the exact cluster view and the adapter that
    turns it into what the policy knows (`router.view`), and the wall time decisions take."""

    def __init__(self, instances: Sequence[Instance], cluster: LiveClusterView, policy: Any, adapter: Any) -> None:
        self.instances = instances
        self.cluster = cluster
        self.policy = policy
        self.adapter = adapter
        self.num_decisions = 0
        self.decision_wall_s = 0.0

    def view(self) -> Any:
        return self.adapter.wrap(self.cluster) if self.adapter is not None else self.cluster

    @property
    def us_per_decision(self) -> float:
        return 1e6 * self.decision_wall_s / self.num_decisions if self.num_decisions else 0.0


class Router(RouterBase):
    def __init__(
        self,
        instances: Sequence[Instance],
        cluster: LiveClusterView,
        policy: Policy,
        adapter: Any,
        on_dispatch: Callable[[Request, int], bool],
    ) -> None:
        super().__init__(instances, cluster, policy, adapter)
        self._on_dispatch = on_dispatch

    def route(self, request: Request, now: float) -> int | None:
        """Choose an instance and submit the request there; None if it was rejected."""
        materialize_all(self.instances, now)
        choice = self._choose(request, self.view(), len(self.instances), now, "the cluster's")
        request.routed_at = now
        request.instance_id = choice
        if not self._on_dispatch(request, choice):
            return None
        self._send(request, choice)
        return choice

    def _choose(self, request: Request, view: Any, n: int, now: float, listed: str) -> int:
        """The policy's answer for `request`, timed and checked to be a position 0..n-1."""
        started = time.perf_counter()
        choice = self.policy.choose(request, view)
        self.decision_wall_s += time.perf_counter() - started
        self.num_decisions += 1
        if not isinstance(choice, (int, np.integer)) or isinstance(choice, bool) or not 0 <= choice < n:
            raise PolicyError(
                f"policy {self.policy.registry_name!r} chose instance {choice!r} for request "
                f"{request.request_id} at t={now:.3f} s; choose() must return an int from 0 to {n - 1} "
                f"({listed} {n} instances)"
            )
        return int(choice)

    def _send(self, request: Request, instance_id: int) -> None:
        self.instances[instance_id].submit(request)
        if self.adapter is not None:
            self.adapter.on_routed(request, instance_id)
        self.policy.on_routed(request, instance_id)


class FleetRouter(Router):
    """The router of a changing fleet (lmsim.engine.fleet): the policy sees the routable
    instances only and answers a position in that list, which the router maps to the
    instance's id; a request sent to a crashed instance the router still lists is lost, and
    one arriving when nothing is routable is rejected (`no_instance`)."""

    def __init__(self, instances: Sequence[Instance], cluster: LiveClusterView, policy: Policy, adapter: Any,
                 on_dispatch: Callable[[Request, int], bool], fleet: Any) -> None:
        super().__init__(instances, cluster, policy, adapter, on_dispatch)
        self.fleet = fleet

    def route(self, request: Request, now: float) -> int | None:
        fleet = self.fleet
        ids = fleet.routable
        if not ids:
            fleet.no_instance(request)
            return None
        materialize_all(self.instances, now)
        k = self._choose(request, fleet.view(self.view()), len(ids), now, "a position among the routable")
        instance_id = ids[k]
        request.routed_at = now
        request.instance_id = instance_id
        if fleet.state[instance_id] != ACTIVE:  # crashed, not yet detected
            if self.adapter is not None:
                self.adapter.on_routed(request, instance_id)
            self.policy.on_routed(request, instance_id)
            fleet.sent_to_dead(request)
            return None
        if not self._on_dispatch(request, instance_id):
            return None
        self._send(request, instance_id)
        fleet.on_routed(request, instance_id)
        return instance_id
