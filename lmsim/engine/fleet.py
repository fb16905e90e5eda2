"""Instances joining and leaving during a run (issue 36): lifecycle, crashes, the scaler tick.

Off unless the experiment has a `fleet:`, `faults:` or `autoscaler:` section; without them
the simulation never builds a `Fleet` and runs exactly as before.

**Allocation.** Every instance a run may use exists from the start: a pool holds
`fleet.pools.<name>.max_replicas` (default its `num_instances`) instances, ids as today
(pool k's after pool k-1's). The first `num_instances` of a pool are active at t=0, the rest
stopped. An id is never reused: a restart is the same instance starting again, empty.

**States.** stopped -> starting (the start-up time: weights load, engine init) -> warming
(`warmup_s`, may be 0) -> active -> draining -> stopped; active, draining, starting and
warming -> failed (a crash) -> starting (after `faults.restart_s`, when set) or stays failed.

**Start-up time.** `engine_init_s + weight_bytes / load_bandwidth_bytes_s` unless a pool
(`fleet.pools.<name>.startup_s`) or the fleet (`fleet.startup_s`) sets one. `weight_bytes` is
the pool's profile `model.weight_bytes` (one GPU's shard: every rank reads its own shard at
the same time). The defaults are `lmsim.config.FleetConfig`'s: 30 s of engine
initialisation and 2 GB/s from storage. What they stand for in vLLM: the engine logs the
weight load ("Loading weights took ... seconds", the model loader) and then
`EngineCore._initialize_kv_caches` (vllm/v1/engine/core.py) profiles memory, allocates the
KV cache and captures the CUDA graphs, logged as "init engine (profile, create kv cache,
warmup model) took ... seconds"; the first is bytes over the storage's read bandwidth, the
second roughly constant per engine. Dynamo's offline replay prices start-up as one number:
the mocker's `--startup-time` (dynamo/mocker/args.py, "Simulated engine startup time in
seconds", default None: instant), passed to the engine config by
`build_mocker_engine_args` (dynamo/mocker/config.py). A profile that has no
`model.weight_bytes` (a linear or inline profile) needs an explicit `startup_s`.

**Empty at start.** A starting instance has an empty KV cache and prefix cache: on a stop or
a crash its scheduler and cache are replaced by fresh ones (the prefix index then matches
nothing there), and subscribers of KV events (a router's replica of the caches, `kv_view:
events`) hear every block it held removed at that instant, as Dynamo's indexer drops a
worker that leaves (vLLM publishes `AllBlocksCleared` when a restarted engine comes up).
Lower KV tiers (host memory, disk) are not supported with a changing fleet yet (a
ConfigError says so): the intended choice is that a drain keeps the node's disk tier, a
crash keeps nothing.

**Router visibility.** The router lists the routable instances: active ones, and crashed
ones whose crash is younger than `fleet.detection_delay_s` (the health check has not
noticed yet). A request sent to a crashed instance is lost like the ones it held.

**What the router sees of a crashed instance it still lists** (`fleet.dead_view`). `frozen`
(default): what it last knew, the instance's load and cached prefixes at the crash, until
the crash is detected; only then do KV-event subscribers hear its blocks removed. `empty`:
the crashed instance as restarted, idle and with no cache, at once. A real router learns of
a crash only through its health check or discovery: a dead engine stops answering metric
scrapes (llm-d's EPP keeps the pod's last metrics until the pod leaves the endpoint
slice), stops publishing KV events and load metrics (Dynamo's KV router keeps a worker's
blocks in its radix tree until the worker's lease expires and discovery removes it), so
its last picture stays. Measured on experiments/beyond/fleet/crash.yaml (ChatBot at 70% of
16 H20, one crash at 300 s, 5 s detection): under `empty` a load-aware router sends the
"idle" dead instance a burst in those 5 s (vllm: 245 requests retried, all 245 lost again
and failed, as the immediate retry went to the same instance), a black hole no real
router is shown; under `frozen` it does not.

**Losing requests.** A crash loses everything on the instance (running, waiting, loading).
With `faults.in_flight: retry` each is sent again through the router `retry_after_s` later,
as a fresh request (a new prefill, the original arrival time kept, so its TTFT includes the
loss), at most `max_retries` times, after which it ends `failed` (`retries_exhausted`);
with `fail` it ends `failed` at once (`instance_crash`). The router's policy hears of a lost
request as finished (its stream ended with an error). A request that arrives (or is
retried) when nothing is routable is rejected (`no_instance`).

**P/D.** Each role scales on its own; the router lists each role's routable instances (the
policy's sides see them under role-local ids). A prefill instance's crash loses the legs it
was prefilling (their requests are retried or fail as above) and the KV it held: a request
still waiting for that KV on its decode instance is prefilled there instead (vLLM's
`kv_load_failure_policy: recompute`), a transfer already on its way completes (an
approximation: the read would fail). A decode instance's crash loses its requests and frees
the KV their prefill instances held; a request whose prefill ends after its decode
instance (chosen at arrival) crashed is lost then. Drain timeouts are not supported under
P/D yet (a ConfigError).

**Drain.** A draining instance takes no new requests and stops once it holds none; after
`fleet.drain_timeout_s` it hands what it still holds back through the router (each counts
as a retry, never failing for it) and stops.

**Faults.** Crashes at given times (`faults.crashes`), and with `faults.mtbf_s` each instance
fails as a Poisson process of that mean over the run's whole clock (instance i's gaps are
exponential draws from its own stream seeded by (faults.seed, i), so the times do not
depend on what else happens); a failure that lands while the instance is stopped or already
failed does nothing.

**Autoscaler.** Every `autoscaler.interval_s` the scaler decides from the scrape taken
`metrics_delay_s` earlier (`lmsim.scaling`). A scrape reads every pool's instances (state
counts; running, waiting and KV usage summed or averaged over active instances) and the
traffic over the interval ending at the scrape: requests routed to the pool's instances in
it (count, rate, mean prompt length), requests that finished there (mean output length,
mean inter-token time), first tokens there (mean TTFT). Prefill and decode pools both see
the whole cluster's traffic (Dynamo's planner reads the frontend's metrics). The answer is
clamped to [min_replicas, max_replicas]; scale-up starts stopped instances lowest id first;
scale-down cancels starting (or warming) ones newest first, then drains the newest active.
Each decision that changes a target is a `scale` row in `fleet_events`.

**Results** (only when a fleet is configured): `fleet_events` rows `time_s, instance_id,
pool, gpu, gpus, event, target` (event: start, warm, active, drain, stop, crash, detected,
restart, scale; instance_id -1 and `target` for scale rows; a restart is a `restart` row
and a `start` row at the same time; the instances active at t=0 have one `active` row at
0 and no `start`), request columns `retries` and `end_reason`, and the summary's `fleet`
block: per pool the GPU-seconds provisioned (from `start`, or 0 for the initial instances,
to `stop`/`crash` or the end of the run; starting, warming and draining included).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from lmsim.config import ExperimentConfig, FleetConfig, PoolSpec
from lmsim.engine.clock import ARRIVAL, SAMPLE, schedule_at
from lmsim.engine.instance import materialize_all
from lmsim.engine.metrics import INSTANCE_CRASH, NO_INSTANCE, RETRIES_EXHAUSTED
from lmsim.engine.request import Request
from lmsim.errors import ConfigError
from lmsim.scaling import Autoscaler, FleetObservation, PoolObservation

STOPPED, STARTING, WARMING, ACTIVE, DRAINING, FAILED = range(6)
STATE_NAMES = ("stopped", "starting", "warming", "active", "draining", "failed")


def fleet_configured(config: ExperimentConfig) -> bool:
    return config.fleet is not None or config.faults is not None or config.autoscaler is not None


@dataclasses.dataclass
class PoolPlan:
    """One pool's instances over the run and how they start."""

    name: str
    role: str
    ids: list[int]
    initial: int
    min_replicas: int
    max_replicas: int
    startup_s: float | None  # None: never needed (nothing starts) or unknown
    warmup_s: float
    gpus: int
    gpu: str


def profile_facts(cost_model: Any) -> tuple[float | None, str, int]:
    """(weight bytes on one GPU, the GPU's name, GPUs per instance) from a profile's facts;
    (None, "", 1) for a profile without them (linear, polynomial)."""
    data = getattr(cost_model, "data", None)
    meta = getattr(data, "meta", None)
    if not isinstance(meta, dict):
        return None, "", 1
    weights = meta.get("model", {}).get("weight_bytes")
    gpu = str(meta.get("hardware", {}).get("gpu", ""))
    tp = int(meta.get("parallel", {}).get("tensor_parallel_size", 1) or 1)
    return (float(weights) if weights is not None else None), gpu, tp


def allocated_pools(config: ExperimentConfig) -> tuple[list[PoolSpec], list[int]]:
    """The pools with every instance the run may use ((pools, initial count per pool));
    unknown pool names in `fleet.pools` and bounds that exclude the initial count are one
    line each."""
    pools = config.cluster.pool_specs()
    fleet = config.fleet or FleetConfig()
    names = [p.name for p in pools]
    for name in fleet.pools:
        if name not in names:
            raise ConfigError(f"fleet.pools.{name}: no such pool (pools: {', '.join(names)})")
    out, first, initial = [], 0, []
    for pool in pools:
        spec = fleet.pools.get(pool.name)
        n = pool.num_instances
        high = spec.max_replicas if spec is not None and spec.max_replicas is not None else n
        if high < n:
            raise ConfigError(f"fleet.pools.{pool.name}.max_replicas: {high} is below the pool's num_instances {n}")
        if spec is not None and spec.min_replicas is not None and spec.min_replicas > n:
            raise ConfigError(
                f"fleet.pools.{pool.name}.min_replicas: {spec.min_replicas} is above the pool's num_instances {n}"
            )
        out.append(dataclasses.replace(pool, num_instances=high, first_instance=first))
        initial.append(n)
        first += high
    return out, initial


def plan_pools(config: ExperimentConfig, pools: list[PoolSpec], initial: list[int],
               cost_models: dict[str, Any]) -> list[PoolPlan]:
    """Each pool's plan, or one line naming the field that is missing or wrong."""
    if config.cluster.kv_tiers is not None or any(p.kv_tiers is not None for p in pools):
        raise ConfigError("cluster.kv_tiers: lower KV tiers with a changing fleet (fleet/faults/autoscaler) are not supported yet")
    fleet = config.fleet or FleetConfig()
    faults = config.faults
    total = sum(p.num_instances for p in pools)
    if faults is not None:
        for k, crash in enumerate(faults.crashes):
            if crash.instance >= total:
                raise ConfigError(
                    f"faults.crashes[{k}].instance: {crash.instance}: no such instance (the run has {total}, ids 0..{total - 1})"
                )
    if config.cluster.is_disaggregated and config.fleet is not None and config.fleet.drain_timeout_s is not None:
        raise ConfigError("fleet.drain_timeout_s: not supported in a disaggregated cluster yet")
    restarts = faults is not None and faults.restart_s is not None
    plans = []
    for pool, n in zip(pools, initial):
        spec = fleet.pools.get(pool.name)
        weights, gpu, tp = profile_facts(cost_models[pool.name])
        startup = spec.startup_s if spec is not None and spec.startup_s is not None else fleet.startup_s
        may_start = restarts or pool.num_instances > n
        if startup is None and may_start:
            if weights is None:
                raise ConfigError(
                    f"fleet.pools.{pool.name}.startup_s: required (the pool's profile has no model.weight_bytes "
                    "to derive a start-up time from)"
                )
            startup = fleet.engine_init_s + weights / fleet.load_bandwidth_bytes_s
        warmup = spec.warmup_s if spec is not None and spec.warmup_s is not None else fleet.warmup_s
        gpus = spec.gpus_per_instance if spec is not None and spec.gpus_per_instance is not None else tp
        low = spec.min_replicas if spec is not None and spec.min_replicas is not None else min(1, n)
        plans.append(PoolPlan(
            pool.name, pool.role, list(pool.instance_ids), n, low, pool.num_instances, startup, warmup, gpus,
            gpu or "unknown",
        ))
    return plans


class FrozenInstanceView:
    """A crashed instance as the router last knew it (`fleet.dead_view: frozen`): its load
    and cached prefix at the crash, read-only, with the live view's fixed facts."""

    _LOAD = ("num_running", "num_waiting", "batch_size", "num_prefilling", "pending_prefill_tokens",
             "total_tokens", "decode_context_tokens", "kv_usage", "num_free_blocks", "num_total_blocks")

    def __init__(self, live: Any, cached_hashes: set[int], block_size: int) -> None:
        for name in ("instance_id", "pool", "role", "cost_model", "max_num_batched_tokens", "max_num_seqs",
                     *self._LOAD):
            setattr(self, name, getattr(live, name))
        self._queued = list(live.queued_prefills())
        self._hashes = cached_hashes
        self._block_size = block_size
        self._live = live

    def cached_prefix_tokens(self, request: Request) -> int:
        """The leading prompt blocks the instance held at the crash (capped as the global
        index caps a hit: one token is always computed)."""
        cap = (request.input_tokens - 1) // self._block_size
        n = 0
        for block_hash in request.block_hashes[:cap]:
            if block_hash not in self._hashes:
                break
            n += 1
        return n * self._block_size

    def queued_prefills(self) -> list[tuple[int, int]]:
        return list(self._queued)

    def step_in_flight(self) -> tuple[float, list[int]]:
        return 0.0, [0] * len(self._queued)

    def kv_load_time_s(self, host_tokens: int, disk_tokens: int) -> float:
        return self._live.kv_load_time_s(host_tokens, disk_tokens)


class RoutableView:
    """A cluster view listing only some instances (the routable ones), in id order, by
    position: `instances[k]` and entry k of the prefix vectors are the k-th listed instance
    (FLEET_DESIGN.md, "Routable subset"). Anything else is the whole cluster's."""

    def __init__(self, base: Any, ids: list[int], frozen: dict[int, FrozenInstanceView] | None = None) -> None:
        self._base = base
        self._ids = ids
        frozen = frozen or {}
        self._frozen = [(k, frozen[i]) for k, i in enumerate(ids) if i in frozen]
        self.instances = [frozen.get(i) or base.instances[i] for i in ids]
        self.block_size = base.block_size

    @property
    def now(self) -> float:
        return self._base.now

    def cached_prefix_tokens(self, request: Request) -> list[int]:
        full = self._base.cached_prefix_tokens(request)
        out = [full[i] for i in self._ids]
        for k, view in self._frozen:
            out[k] = view.cached_prefix_tokens(request)
        return out

    def cached_prefix_tokens_by_tier(self, request: Request) -> list[tuple[int, int, int]]:
        full = self._base.cached_prefix_tokens_by_tier(request)
        out = [full[i] for i in self._ids]
        for k, view in self._frozen:
            out[k] = (view.cached_prefix_tokens(request), 0, 0)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _ScalerContext:
    """What the scaler is handed once (`lmsim.scaling.ScalerContext`)."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self.pools = {p.name: fleet._pool_facts(p) for p in fleet.plans}
        self.cost_models = dict(fleet.sim.pool_cost_models)
        self.interval_s = fleet.interval_s
        # what a planner sizing engines needs to know of them (Dynamo's profiler measures
        # each at the engine's own batch limits and KV capacity)
        self.engine_limits = {}
        for plan in fleet.plans:
            scheduler = fleet.sim.instances[plan.ids[0]].scheduler
            self.engine_limits[plan.name] = {
                "max_num_batched_tokens": scheduler.max_num_batched_tokens,
                "max_num_seqs": scheduler.max_num_seqs,
                "max_kv_tokens": scheduler.cache.num_total_blocks * scheduler.cache.block_size,
            }

    def record_event(self, kind: str, **fields: Any) -> None:
        self._fleet.sim.router_events.append({"time_s": self._fleet.sim.env.now, "kind": kind, **fields})


class _Traffic:
    """One pool's traffic since the last scrape: (time, value) pairs in time order."""

    __slots__ = ("finished", "first_tokens", "routed")

    def __init__(self) -> None:
        self.routed: deque[tuple[float, int]] = deque()  # (at, prompt tokens)
        self.first_tokens: deque[tuple[float, float]] = deque()  # (at, ttft)
        self.finished: deque[tuple[float, int, float, int]] = deque()  # (at, output tokens, itl or nan, prompt tokens)

    def window(self, start: float, end: float) -> tuple[int, float, float, float | None, float | None, float]:
        def inside(rows: deque) -> list:
            return [r for r in rows if start < r[0] <= end]

        routed, first, done = inside(self.routed), inside(self.first_tokens), inside(self.finished)
        isl = float(np.mean([r[1] for r in routed])) if routed else 0.0
        osl = float(np.mean([r[1] for r in done])) if done else 0.0
        ttft = float(np.mean([r[1] for r in first])) if first else None
        itls = [r[2] for r in done if r[2] == r[2]]
        itl = float(np.mean(itls)) if itls else None
        finished_isl = float(np.mean([r[3] for r in done])) if done else float("nan")
        return len(routed), isl, osl, ttft, itl, finished_isl

    def forget_until(self, t: float) -> None:
        for rows in (self.routed, self.first_tokens, self.finished):
            while rows and rows[0][0] <= t:
                rows.popleft()


class Fleet:
    """The lifecycle controller of one simulation (see the module docstring)."""

    def __init__(self, sim: Any, plans: list[PoolPlan], autoscaler: Autoscaler | None) -> None:
        self.sim = sim
        self.env = sim.env
        config = sim.config
        self.config = config.fleet or FleetConfig()
        self.faults = config.faults
        self.plans = plans
        n = len(sim.instances)
        self.pool_of = [0] * n
        for k, plan in enumerate(plans):
            for i in plan.ids:
                self.pool_of[i] = k
        self.state = [STOPPED] * n
        self.epoch = [0] * n  # bumped by every transition: a timer of an older epoch is stale
        self.undetected: set[int] = set()  # crashed, still listed by the router
        # what the router still sees of them (dead_view: frozen), and the blocks whose
        # removal it hears of only at detection
        self.frozen: dict[int, FrozenInstanceView] = {}
        self._unpublished: dict[int, list[int]] = {}
        self.routable: list[int] = []
        self.version = 0
        self._view: tuple[int, Any, RoutableView] | None = None
        self.events: list[tuple[float, int, str, str, int, str, int]] = []
        self.targets = [p.initial for p in plans]
        self.retries: dict[int, int] = {}
        self.pending: set[int] = set()  # lost, waiting to be sent again
        self.num_crashes = [0] * len(plans)
        self.num_scale_events = [0] * len(plans)
        for plan in plans:
            for i in plan.ids[: plan.initial]:
                self.state[i] = ACTIVE
                self._event(i, "active")
        self._refresh_routable()
        # The latest stamp of each instance's published KV events (when anyone listens): a
        # stop or crash removes its blocks no earlier, so a replica of the caches applies
        # the removal after every event of the old incarnation.
        self._last_stamp = [-float("inf")] * n
        for instance in sim.instances:
            if instance.kv_sink is not None:
                instance.kv_sink = self._stamped(instance.kv_sink)
        # The autoscaler and its scrapes.
        self.autoscaler = autoscaler
        scaler_cfg = config.autoscaler
        self.interval_s = scaler_cfg.interval_s if scaler_cfg is not None else 0.0
        self.metrics_delay_s = scaler_cfg.metrics_delay_s if scaler_cfg is not None else 0.0
        self.traffic = [_Traffic() for _ in plans]
        self._whole_cluster_traffic = sim.config.cluster.is_disaggregated
        if autoscaler is not None:
            autoscaler.bind(_ScalerContext(self))  # type: ignore[arg-type]

    # -- setup -----------------------------------------------------------------------------

    def start_timers(self) -> None:
        """Crashes and scaler ticks on the clock (`Simulation.run`)."""
        faults = self.faults
        if faults is not None:
            for crash in faults.crashes:
                schedule_at(self.env, crash.time_s, SAMPLE, lambda _e, i=crash.instance: self._crash_if_running(i))
            if faults.mtbf_s is not None:
                for i in range(len(self.state)):
                    rng = np.random.default_rng([faults.seed, i])
                    self._next_random_crash(i, rng, 0.0)
        if self.autoscaler is not None:
            self._schedule_tick(1)

    def _crash_if_running(self, i: int) -> None:
        if self.sim._work_remains():
            self.crash(i)

    def _next_random_crash(self, i: int, rng: np.random.Generator, after: float) -> None:
        assert self.faults is not None and self.faults.mtbf_s is not None
        at = after + float(rng.exponential(self.faults.mtbf_s))

        def fire(_event: Any) -> None:
            if not self.sim._work_remains():
                return
            self.crash(i)
            self._next_random_crash(i, rng, at)

        schedule_at(self.env, at, SAMPLE, fire)

    def _stamped(self, sink: Callable[[int, int, bool, float], None]) -> Callable[[int, int, bool, float], None]:
        last = self._last_stamp

        def publish(instance_id: int, block_hash: int, stored: bool, at: float) -> None:
            if at > last[instance_id]:
                last[instance_id] = at
            sink(instance_id, block_hash, stored, at)

        return publish

    # -- bookkeeping ---------------------------------------------------------------------

    def _event(self, i: int, event: str, target: int = -1, pool: int | None = None) -> None:
        k = self.pool_of[i] if pool is None else pool
        plan = self.plans[k]
        self.events.append((self.env.now, i, plan.name, plan.gpu, plan.gpus, event, target))

    def _refresh_routable(self) -> None:
        state = self.state
        self.routable = [i for i in range(len(state)) if state[i] == ACTIVE or i in self.undetected]
        self.version += 1

    def view(self, cluster: Any) -> RoutableView:
        """The router's view: `cluster` (the exact or adapted view of every instance)
        restricted to the routable instances, rebuilt only when they change (or the
        adapted view's instance list is renewed by a scrape)."""
        cached = self._view
        if cached is None or cached[0] != self.version or cached[1] is not cluster.instances:
            cached = self._view = (self.version, cluster.instances, RoutableView(cluster, self.routable, self.frozen))
        return cached[2]

    def serves(self, i: int) -> bool:
        """Instance i runs the requests it is given (active or draining)."""
        return self.state[i] in (ACTIVE, DRAINING)

    def holds_nothing(self, i: int) -> bool:
        """No request on instance i, but finished prefill legs whose KV has been read (the
        read notification landed; the engine would free them at its next poll)."""
        instance = self.sim.instances[i]
        s = instance.scheduler
        if s.running or s.waiting or s.loading:
            return False
        disagg = self.sim.disagg
        if disagg is not None and any(h.decode_id == i for h in disagg.handoffs.values()):
            return False  # a request prefilling elsewhere will join its queue
        if not s.held:
            return True
        landed = {id(r) for _at, _kind, r in instance.landed}
        return all(id(r) in landed for r in s.held)

    # -- transitions ---------------------------------------------------------------------

    def _later(self, i: int, delay: float, then: Callable[[int], None]) -> None:
        """`then(i)` after `delay`, unless instance i moved on meanwhile or the run's work
        is done (a start-up or restart due after the last request adds nothing)."""
        epoch = self.epoch[i]

        def fire(_event: Any) -> None:
            if self.epoch[i] == epoch and self.sim._work_remains():
                then(i)

        schedule_at(self.env, self.env.now + delay, SAMPLE, fire)

    def _set(self, i: int, state: int) -> None:
        was = self.state[i]
        self.state[i] = state
        self.epoch[i] += 1
        if (was == ACTIVE) != (state == ACTIVE):
            self._refresh_routable()

    def start(self, i: int, *, restart: bool = False) -> None:
        plan = self.plans[self.pool_of[i]]
        assert plan.startup_s is not None, "plan_pools gives every pool that may start a start-up time"
        if restart:
            self._event(i, "restart")
        self._event(i, "start")
        self._set(i, STARTING)
        self._later(i, plan.startup_s, self._loaded)

    def _loaded(self, i: int) -> None:
        warmup = self.plans[self.pool_of[i]].warmup_s
        if warmup > 0:
            self._event(i, "warm")
            self._set(i, WARMING)
            self._later(i, warmup, self._activate)
        else:
            self._activate(i)

    def _activate(self, i: int) -> None:
        self._event(i, "active")
        self._set(i, ACTIVE)

    def drain(self, i: int) -> None:
        self._event(i, "drain")
        self._set(i, DRAINING)
        if self.holds_nothing(i):
            self._stop(i)
            return
        timeout = self.config.drain_timeout_s
        if timeout is not None:
            self._later(i, timeout, self._drain_timeout)

    def _drain_timeout(self, i: int) -> None:
        """Hand back what the draining instance still holds, through the router now."""
        lost = self._empty(i)
        self._event(i, "stop")
        self._set(i, STOPPED)
        for request in lost:
            self.sim.policy.on_finished(request)
            self._resend(request, 0.0)

    def maybe_drained(self, i: int) -> None:
        """A draining instance's request ended: it stops once it holds none (deferred to
        after every step ending now, as the instance plans its next step first)."""
        if self.state[i] == DRAINING and self.holds_nothing(i):
            epoch = self.epoch[i]

            def stop(_event: Any) -> None:
                if self.epoch[i] == epoch and self.holds_nothing(i):
                    self._stop(i)

            schedule_at(self.env, self.env.now, SAMPLE, stop)

    def _stop(self, i: int) -> None:
        self._empty(i)
        self._event(i, "stop")
        self._set(i, STOPPED)

    def cancel(self, i: int) -> None:
        """A starting (or warming) instance the scaler no longer wants."""
        self._event(i, "stop")
        self._set(i, STOPPED)

    def crash(self, i: int) -> None:
        state = self.state[i]
        if state in (STOPPED, FAILED):
            return
        freeze = state == ACTIVE and self.config.dead_view == "frozen"
        if freeze:
            sim = self.sim
            sim.instances[i].materialize()
            old = sim.instances[i].scheduler
            self.frozen[i] = FrozenInstanceView(sim.cluster.instances[i], set(old.cache.cached_hashes), old.block_size)
        lost = self._empty(i, publish_removals=not freeze)
        self._event(i, "crash")
        self.num_crashes[self.pool_of[i]] += 1
        if state == ACTIVE:
            self.undetected.add(i)
        self._set(i, FAILED)
        if i in self.undetected:
            self._later(i, self.config.detection_delay_s, self._detect)
        faults = self.faults
        if faults is not None and faults.restart_s is not None:
            self._later(i, faults.restart_s, self._restart)
        if self.sim.disagg is not None:
            lost = self.sim.disagg.on_crash(i, lost)
        for request in lost:
            self.lose(request)

    def _detect(self, i: int) -> None:
        self._event(i, "detected")
        self.undetected.discard(i)
        self.frozen.pop(i, None)
        hashes = self._unpublished.pop(i, None)
        if hashes:
            at = max(self.env.now, self._last_stamp[i])
            for block_hash in hashes:
                self.sim._publish_kv_event(i, block_hash, False, at)
        self._refresh_routable()

    def _restart(self, i: int) -> None:
        if i in self.undetected:  # restarted before the health check noticed: now it knows
            self._detect(i)
        self.start(i, restart=True)

    def _empty(self, i: int, *, publish_removals: bool = True) -> list[Request]:
        """Take every request off instance i and give it an empty cache (module docstring);
        returns the requests, by request id. Without `publish_removals` the KV-event
        subscribers hear of the removed blocks only at detection (a frozen dead view)."""
        sim = self.sim
        instance = sim.instances[i]
        old = instance.scheduler
        landed = {id(r) for _at, _kind, r in instance.landed}
        held = [r for r in old.held if id(r) not in landed]
        lost = sorted([*old.running, *old.waiting, *old.loading, *held], key=_by_id)
        if sim._kv_subscribers:
            removed = sorted(old.cache.cached_hashes)
            if publish_removals:
                at = max(self.env.now, self._last_stamp[i])
                for block_hash in removed:
                    sim._publish_kv_event(i, block_hash, False, at)
            else:
                self._unpublished[i] = removed
        last_step = instance.reset(sim.new_scheduler(i))
        if last_step > sim.last_activity_s:  # ended inside a fast-forwarded run: a step end stepping saw
            sim.last_activity_s = last_step
        sim.cluster.rebind(i)
        return lost

    # -- requests ------------------------------------------------------------------------

    def lose(self, request: Request) -> None:
        """`request` was on (or sent to) an instance that crashed (module docstring)."""
        sim = self.sim
        sim.policy.on_finished(request)
        faults = self.faults
        rid = request.request_id
        if sim.disagg is not None:
            sim.disagg.forget(rid)
        if faults is None or faults.in_flight == "fail":
            sim.fail(request, INSTANCE_CRASH)
        elif self.retries.get(rid, 0) >= faults.max_retries:
            sim.fail(request, RETRIES_EXHAUSTED)
        else:
            self._resend(request, faults.retry_after_s)

    def _resend(self, request: Request, delay: float) -> None:
        rid = request.request_id
        self.retries[rid] = self.retries.get(rid, 0) + 1
        self.pending.add(rid)

        def send(_event: Any) -> None:
            self.pending.discard(rid)
            sim = self.sim
            fresh = sim.new_request(rid, request.arrived_at)
            sim.router.route(fresh, self.env.now)

        schedule_at(self.env, self.env.now + delay, ARRIVAL, send)

    def no_instance(self, request: Request) -> None:
        self.sim.reject(request, NO_INSTANCE)

    def sent_to_dead(self, request: Request) -> None:
        """The router sent `request` to a crashed instance it still lists: lost."""
        self.lose(request)

    # -- traffic, for the scrapes ----------------------------------------------------------

    def on_routed(self, request: Request, instance_id: int) -> None:
        if self.autoscaler is not None:
            self._traffic_of(instance_id, lambda t: t.routed.append((self.env.now, request.input_tokens)))

    def on_step_end(self, instance_id: int, first_tokens: list[Request], finished: list[Request], now: float) -> None:
        if self.autoscaler is not None and (first_tokens or finished) and self.plans[self.pool_of[instance_id]].role != "prefill":
            def note(t: _Traffic) -> None:
                for r in first_tokens:
                    t.first_tokens.append((now, now - r.arrived_at))
                for r in finished:
                    n = r.output_tokens
                    itl = (now - r.first_token_at) / (n - 1) if n > 1 and r.first_token_at is not None else float("nan")
                    t.finished.append((now, n, itl, r.input_tokens))

            self._traffic_of(instance_id, note)
        if finished and self.state[instance_id] == DRAINING:
            self.maybe_drained(instance_id)

    def _traffic_of(self, instance_id: int, note: Callable[[_Traffic], None]) -> None:
        if self._whole_cluster_traffic:
            for t in self.traffic:
                note(t)
        else:
            note(self.traffic[self.pool_of[instance_id]])

    # -- the autoscaler ------------------------------------------------------------------

    def _pool_facts(self, plan: PoolPlan) -> PoolObservation:
        return self._observe(self.plans.index(plan), self.env.now, (0, 0.0, 0.0, None, None, float("nan")))

    def _observe(self, k: int, now: float, traffic: tuple[int, float, float, float | None, float | None, float]) -> PoolObservation:
        plan = self.plans[k]
        running = waiting = 0
        usage = []
        for i in plan.ids:
            if self.state[i] == ACTIVE:
                s = self.sim.instances[i].scheduler
                running += len(s.running)
                waiting += s.num_waiting
                usage.append(s.cache.usage)
        num, isl, osl, ttft, itl, finished_isl = traffic
        return PoolObservation(
            pool=plan.name, role=plan.role, gpu=plan.gpu, gpus_per_instance=plan.gpus,
            min_replicas=plan.min_replicas, max_replicas=plan.max_replicas, **self._replica_counts(k),
            num_running=running, num_waiting=waiting,
            kv_usage=float(np.mean(usage)) if usage else 0.0,
            num_requests=num, request_rate=num / self.interval_s if self.interval_s > 0 else 0.0,
            mean_input_tokens=isl, mean_output_tokens=osl, ttft_mean_s=ttft, itl_mean_s=itl,
            mean_finished_input_tokens=finished_isl,
        )

    def _schedule_tick(self, n: int) -> None:
        """Scrape n at n * interval - metrics delay (at least 0), decision n at n * interval;
        each scrape schedules the next one and its own decision."""
        scrape_at = max(0.0, n * self.interval_s - self.metrics_delay_s)
        schedule_at(self.env, scrape_at, SAMPLE, lambda _e: self._scrape(n))

    def _scrape(self, n: int) -> None:
        if not self.sim._work_remains():
            return
        now = self.env.now
        materialize_all(self.sim.instances, now)
        start = now - self.interval_s
        pools = {}
        for k, plan in enumerate(self.plans):
            pools[plan.name] = self._observe(k, now, self.traffic[k].window(start, now))
        for t in self.traffic:
            t.forget_until(now)
        self._schedule_tick(n + 1)
        # created after the next scrape's event: at one instant (no metrics delay) the
        # decision reads this scrape, the next scrape comes later anyway
        schedule_at(self.env, n * self.interval_s, SAMPLE, lambda _e: self._decide(n, now, pools))

    def _decide(self, n: int, scraped_at: float, pools: dict[str, PoolObservation]) -> None:
        if not self.sim._work_remains():
            return
        now = self.env.now
        materialize_all(self.sim.instances, now)
        assert self.autoscaler is not None
        # Replica counts are read live, only the engines' metrics are a scrape old: an HPA
        # reads the scale subresource and pod readiness from the API server
        # (horizontal.go reconcileAutoscaler), Dynamo's planner the ready workers from its
        # runtime. With the scrape's counts, a scaler that had just raised the target saw
        # the old one and took it back (the HPA flapped 8 <-> 9 every sync).
        pools = {name: dataclasses.replace(obs, **self._replica_counts(k)) for k, (name, obs) in enumerate(pools.items())}
        self.apply(self.autoscaler.decide(FleetObservation(now, scraped_at, self.interval_s, pools)))

    def _replica_counts(self, k: int) -> dict[str, int]:
        """Pool k's target and its instances by state, as PoolObservation fields."""
        counts = [0] * 6
        for i in self.plans[k].ids:
            counts[self.state[i]] += 1
        return {"target": self.targets[k], "active": counts[ACTIVE], "starting": counts[STARTING] + counts[WARMING],
                "draining": counts[DRAINING], "failed": counts[FAILED]}

    def apply(self, desired: dict[str, int]) -> None:
        """Clamp each pool's desired count and move its instances towards it."""
        names = [p.name for p in self.plans]
        for name in sorted(desired):
            if name not in names:
                raise ConfigError(f"autoscaler: decided for pool {name!r}, which does not exist (pools: {', '.join(names)})")
            k = names.index(name)
            plan = self.plans[k]
            target = min(max(int(desired[name]), plan.min_replicas), plan.max_replicas)
            if target != self.targets[k]:
                self.targets[k] = target
                self.num_scale_events[k] += 1
                self._event(-1, "scale", target, pool=k)
            self._reconcile(k)

    def _reconcile(self, k: int) -> None:
        plan = self.plans[k]
        state = self.state
        serving = [i for i in plan.ids if state[i] in (STARTING, WARMING, ACTIVE)]
        target = self.targets[k]
        if len(serving) < target:
            for i in [i for i in plan.ids if state[i] == STOPPED][: target - len(serving)]:
                self.start(i)
        elif len(serving) > target:
            excess = len(serving) - target
            starting = [i for i in reversed(plan.ids) if state[i] in (STARTING, WARMING)]
            for i in starting[:excess]:
                self.cancel(i)
            excess -= min(excess, len(starting))
            for i in [i for i in reversed(plan.ids) if state[i] == ACTIVE][:excess]:
                self.drain(i)

    # -- results ---------------------------------------------------------------------------

    def events_frame(self) -> pd.DataFrame:
        rows = self.events
        target = np.array([r[6] for r in rows], dtype=np.int64)
        return pd.DataFrame({
            "time_s": np.array([r[0] for r in rows], dtype=float),
            "instance_id": np.array([r[1] for r in rows], dtype=np.int64),
            "pool": [r[2] for r in rows],
            "gpu": [r[3] for r in rows],
            "gpus": np.array([r[4] for r in rows], dtype=np.int64),
            "event": [r[5] for r in rows],
            "target": pd.arrays.IntegerArray(target, target < 0),
        })

    def summary(self, end_s: float, num_failed: int, num_no_instance: int) -> dict[str, Any]:
        began: dict[int, float] = {}
        seconds = [0.0] * len(self.plans)
        for t, i, _pool, _gpu, _gpus, event, _target in self.events:
            if i < 0:
                continue
            if event == "start" or (event == "active" and t == 0.0 and i not in began):
                began.setdefault(i, t)
            elif event in ("stop", "crash") and i in began:
                seconds[self.pool_of[i]] += t - began.pop(i)
        for i, t in began.items():
            seconds[self.pool_of[i]] += max(0.0, end_s - t)
        pools = {
            plan.name: {
                "gpu": plan.gpu,
                "gpus_per_instance": plan.gpus,
                "instance_seconds": seconds[k],
                "gpu_seconds": seconds[k] * plan.gpus,
                "num_scale_events": self.num_scale_events[k],
                "num_crashes": self.num_crashes[k],
                "final_target": self.targets[k],
            }
            for k, plan in enumerate(self.plans)
        }
        return {
            "pools": pools,
            "gpu_seconds": sum(p["gpu_seconds"] for p in pools.values()),
            "num_scale_events": sum(self.num_scale_events),
            "num_crashes": sum(self.num_crashes),
            "num_retries": int(sum(self.retries.values())),
            "num_failed": num_failed,
            "num_rejected_no_instance": num_no_instance,
        }


def _by_id(request: Request) -> int:
    return request.request_id


__all__ = ["Fleet", "PoolPlan", "RoutableView", "allocated_pools", "fleet_configured", "plan_pools", "profile_facts"]
