"""One simulation: build a cluster from a validated config and replay a workload on it.

`Simulation(config, trace, policy).run()` returns `Results`; nothing is written here (the
study layer's `lmsim.study.compose.build_simulation` creates the policy). Randomness
comes from one `numpy.random.SeedSequence(config.seed)` spawned into independent streams
(policy, router view), so a run is a pure function of its config and trace.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from lmsim.config import ExperimentConfig, PoolSpec
from lmsim.engine.block_names import BlockNames
from lmsim.engine.clock import ARRIVAL, SAMPLE, schedule_at
from lmsim.engine.disagg import Disaggregation, DisaggRouter
from lmsim.engine.fleet import Fleet, allocated_pools, fleet_configured, plan_pools
from lmsim.engine.frontend import FrontEnd
from lmsim.engine.instance import Instance, materialize_all
from lmsim.engine.kv_cache import GlobalPrefixIndex, PrefixCache
from lmsim.engine.kv_tiers import build_kv_tiers
from lmsim.engine.metrics import (
    EXCEEDS_KV_CACHE,
    PROMPT_TOO_LONG,
    QUEUE_FULL,
    RESUME_EXCEEDS_KV_CACHE,
    Recorder,
)
from lmsim.engine.request import Request, RequestState
from lmsim.engine.results import Results
from lmsim.engine.router import FleetRouter, LiveClusterView, Router
from lmsim.engine.scheduler import InstanceScheduler, StepOutcome, StepPlan
from lmsim.engine.stages import StageBarrier
from lmsim.errors import ConfigError, InvariantError
from lmsim.profile import StepCostModel, bind_kv_capacity, load_cost_model
from lmsim.routing import Policy
from lmsim.workload.trace import Trace

PROGRESS_EVERY = 256  # arrivals between progress callbacks


class _Context:
    """The RouterContext handed to policies (see policies/base.py). Its scalar engine facts
    are the first pool's; `cost_models` and each instance view carry every instance's own
    (mixed fleets)."""

    def __init__(self, sim: Simulation, rng: np.random.Generator) -> None:
        cfg = sim.config.cluster
        first = sim.pools[0].engine
        self._sim = sim
        self.num_instances = len(sim.instances)
        self.block_size = cfg.block_size
        self.max_num_batched_tokens = first["max_num_batched_tokens"]
        self.max_num_seqs = first["max_num_seqs"]
        self.rng = rng
        self.cost_model = sim.cost_model
        self.cost_models = [i.scheduler.cost_model for i in sim.instances]

    def now(self) -> float:
        return self._sim.env.now

    def load_cost_model(self, spec: Any) -> StepCostModel:
        return load_cost_model(spec)

    def every(self, period_s: float, callback: Callable[[float], None]) -> None:
        self._sim.add_periodic(period_s, callback)

    def subscribe_kv_events(self, callback: Callable[[int, int, bool, float], None]) -> None:
        self._sim.subscribe_kv_events(callback)

    def subscribe_tier_kv_events(self, callback: Callable[[int, int, bool, float, str], None]) -> None:
        self._sim.subscribe_tier_kv_events(callback)

    def record_event(self, kind: str, **fields: Any) -> None:
        self._sim.router_events.append({"time_s": self._sim.env.now, "kind": kind, **fields})


class Simulation:
    """One run on one SimPy clock. `policy` is the routing policy object, created and checked
    against the cluster's shape by whoever composes the run (`lmsim.study.compose`): the
    engine knows policies only through the contract in `lmsim.routing`."""

    def __init__(self, config: ExperimentConfig, trace: Trace, policy: Policy, autoscaler: Any = None) -> None:
        self.config = config
        self.trace = trace
        cfg = config.cluster
        self.env = simpy.Environment()
        self.fleet: Fleet | None = None
        fleet = fleet_configured(config)
        if fleet:
            if config.autoscaler is not None and autoscaler is None:
                raise ConfigError("autoscaler: compose the run with lmsim.study.compose.build_simulation, which creates it")
            # every instance the run may use, the stopped ones too (lmsim.engine.fleet)
            self.pools, initial = allocated_pools(config)
        else:
            self.pools = cfg.pool_specs()
        self.kv_listeners: list[Callable[[int, int, bool], None]] = []
        self._kv_subscribers: list[Callable[[int, int, bool, float], None]] = []
        self._tier_subscribers: list[Callable[[int, int, bool, float, str], None]] = []
        self.router_events: list[dict[str, Any]] = []
        self.index = GlobalPrefixIndex(sum(p.num_instances for p in self.pools))
        self.recorder = Recorder(len(trace), trace.output_tokens)
        self.check = config.simulation.check
        self._periodic: list[tuple[float, Callable[[float], None]]] = []

        self.instances: list[Instance] = []
        # One model is served by every pool: its context window is the smallest a pool sets.
        windows = []
        models: dict[str, StepCostModel] = {}
        self.pool_cost_models: dict[str, StepCostModel] = {}  # as configured (invariants' truth)
        for pool in self.pools:
            engine = pool.engine
            key = json.dumps(engine["profile"], sort_keys=True)
            if key not in models:
                models[key] = load_cost_model(engine["profile"])
            num_blocks = self._kv_blocks(pool, models[key])
            # a step model that depends on the KV pool's size gets this pool's
            cost_model = bind_kv_capacity(models[key], num_blocks * cfg.block_size)
            self.pool_cost_models[pool.name] = cost_model
            # vLLM v0 / Vidur: int(fraction * blocks), under the rule that has a watermark only
            watermark = (
                int(engine["watermark_blocks_fraction"] * num_blocks)
                if engine["admission"] == "whole_prompt_watermark" else 0
            )
            window = engine["max_model_len"] or getattr(cost_model, "max_model_len", None)
            if window is not None:
                windows.append(window)
            # a prefill instance's requests are prefill legs: the disaggregation hears of them
            on_step_end = self._on_prefill_step_end if pool.role == "prefill" else self._on_step_end
            on_rejected = self._on_prefill_rejected if pool.role == "prefill" else self._on_engine_rejected
            for i in pool.instance_ids:
                scheduler = self._scheduler(pool, i, num_blocks, cost_model, watermark)
                self.instances.append(
                    Instance(
                        self.env, i, scheduler, on_step_end, on_rejected, pool,
                        async_scheduling=engine["async_scheduling"],
                        host_time=cost_model.host_time if engine["async_scheduling"] else None,
                        connector_poll=config.cluster.kv_connector_poll == "step",
                    )
                )
        first = self.instances[0].scheduler
        self.cost_model = first.cost_model
        self.num_blocks = first.cache.num_total_blocks
        self.watermark_blocks = first.watermark_blocks
        self.max_model_len = min(windows) if windows else None

        seeds = np.random.SeedSequence(config.seed).spawn(2)
        self.policy = policy
        self.disagg: Disaggregation | None = None
        if cfg.is_disaggregated:
            self.disagg = Disaggregation(self)
            self.policy.bind(self.disagg.context(_Context(self, np.random.default_rng(seeds[0])), seeds[0]))
        else:
            self.policy.bind(_Context(self, np.random.default_rng(seeds[0])))
        # host memory / disk below the GPU caches (lmsim.engine.kv_tiers); {} without tiers.
        # After the disaggregation's connectors, which come first on their instances.
        self.kv_tiers = build_kv_tiers(self)
        if self.kv_tiers:
            self.recorder.track_kv_tiers()
        self.adapter = self._view_adapter(np.random.default_rng(seeds[1]))
        cluster = LiveClusterView(
            self.env, self.instances, self.index, cfg.block_size, cfg.enable_prefix_caching, self.kv_tiers
        )
        self.cluster = cluster
        if fleet:
            self._build_fleet(initial, autoscaler)
        self.router: Router | DisaggRouter
        if self.disagg is not None:
            self.router = DisaggRouter(self.disagg, cluster, self.policy, self.adapter, self.fleet)
        elif self.fleet is not None:
            self.router = FleetRouter(self.instances, cluster, self.policy, self.adapter, self._dispatch, self.fleet)
        else:
            self.router = Router(self.instances, cluster, self.policy, self.adapter, self._dispatch)

        # Arrivals: open-loop rows in trace order, closed-loop rows once released, a load
        # ladder's rows stage by stage (lmsim.engine.stages).
        after = trace.column("after_id")
        self.stages = StageBarrier.from_trace(trace)
        # the client-side latency path (None: the client sits at the router, as before)
        self.frontend = FrontEnd.from_config(config.frontend)
        self._egress_s = self.frontend.stream_s if self.frontend is not None else 0.0
        # sent by the client, not yet through the front end: on no instance (the invariants)
        self.in_front_end: set[int] = set()
        gated = np.zeros(len(trace), dtype=bool)
        if self.stages is not None:
            gated[self.stages.gated_rows] = True
        self._open_rows = np.flatnonzero((after < 0) & ~gated)
        self._open_pos = 0
        self._released: list[tuple[float, int]] = []
        self._children: dict[int, list[int]] = {}
        for row in np.flatnonzero(after >= 0).tolist():
            self._children.setdefault(int(after[row]), []).append(row)
        self._delay = trace.column("delay_s")
        # the content names of every full block a request fills
        self.block_names = BlockNames(
            trace, cfg.block_size, prefix_caching=cfg.enable_prefix_caching,
            cache_generated_blocks=cfg.cache_generated_blocks,
        )
        self._session_id = trace.column("session_id")
        self._parent_id = trace.column("parent_id")
        self._class_id = trace.column("class_id")
        self._slo_class = trace.column("slo_class")
        self._arrival_event: simpy.Event | None = None
        self._arrival_time = float("inf")
        self.live = 0  # arrived and not yet finished or rejected
        self.num_arrived = 0
        self._progress: Callable[[int], None] | None = None
        self.last_arrival_s = 0.0
        self.last_activity_s = 0.0  # the last arrival or step end: the run's simulated span

    def _scheduler(
        self, pool: PoolSpec, instance_id: int, num_blocks: int, cost_model: StepCostModel, watermark: int
    ) -> InstanceScheduler:
        """A fresh scheduler and empty cache for one of `pool`'s instances."""
        engine = pool.engine
        cache = PrefixCache(
            num_blocks, self.config.cluster.block_size, instance_id, self.index, self.kv_listeners,
            free_queue_order=engine["free_queue_order"],
        )
        return InstanceScheduler(
            cache,
            cost_model,
            max_num_batched_tokens=engine["max_num_batched_tokens"],
            max_num_seqs=engine["max_num_seqs"],
            long_prefill_token_threshold=engine["long_prefill_token_threshold"],
            enable_prefix_caching=engine["enable_prefix_caching"],
            fast_forward=self.config.simulation.fast_forward,
            admission=engine["admission"],
            watermark_blocks=watermark,
            waive_long_prefill_when_alone=engine["waive_long_prefill_when_alone"],
        )

    def new_scheduler(self, instance_id: int) -> InstanceScheduler:
        """A fresh, empty scheduler like instance `instance_id`'s (a restart, lmsim.engine.fleet)."""
        old = self.instances[instance_id].scheduler
        pool = self.instances[instance_id].pool
        return self._scheduler(pool, instance_id, old.cache.num_total_blocks, old.cost_model, old.watermark_blocks)

    def _kv_blocks(self, pool: PoolSpec, cost_model: StepCostModel) -> int:
        engine = pool.engine
        if engine["num_gpu_blocks"] is not None:
            return engine["num_gpu_blocks"]
        blocks = cost_model.num_kv_blocks(self.config.cluster.block_size, engine["gpu_memory_utilization"])
        if blocks is None:
            field = "cluster.num_gpu_blocks" if self.config.cluster.pools is None else f"cluster.pools.{pool.name}.num_gpu_blocks"
            raise ConfigError(f"{field}: required with a profile that has no memory facts")
        return blocks

    def _build_fleet(self, initial: list[int], autoscaler: Any) -> None:
        plans = plan_pools(self.config, self.pools, initial, self.pool_cost_models)
        self.fleet = fleet = Fleet(self, plans, autoscaler)
        self.recorder.track_fleet()
        for instance in self.instances:
            instance._on_step_end = self._fleet_step_end(instance._on_step_end, fleet)

    @staticmethod
    def _fleet_step_end(on_step_end: Callable[..., None], fleet: Fleet) -> Callable[..., None]:
        def step_end(instance: Instance, plan: StepPlan, outcome: StepOutcome, now: float) -> None:
            on_step_end(instance, plan, outcome, now)
            fleet.on_step_end(instance.instance_id, outcome.first_tokens, outcome.finished, now)

        return step_end

    def _view_adapter(self, rng: np.random.Generator) -> Any:
        view_cfg = dict(self.config.router.view)
        # Exact views need no adapter: policies then read the live instances directly.
        exact = all(view_cfg.get(k, "exact") == "exact" for k in ("kv_view", "load_view"))
        if exact and set(view_cfg) <= {"kv_view", "load_view"}:
            return None
        try:
            from lmsim.engine.views import ViewAdapter
        except ImportError:
            raise ConfigError("router.view: router-state realism is not available") from None
        try:
            adapter = ViewAdapter(**view_cfg)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"router.view: {exc}") from None
        adapter.bind(_Context(self, rng))
        return adapter

    # -- KV events -----------------------------------------------------------------------

    def subscribe_kv_events(self, callback: Callable[[int, int, bool, float], None]) -> None:
        """`callback(instance_id, block_hash, stored, published_at)` for every block an
        instance's cache stores or evicts, stamped by the instance with the end of the step
        that changed it (see `Instance.on_kv_event`)."""
        if not self._kv_subscribers:
            for instance in self.instances:
                instance.kv_sink = self._publish_kv_event
            self.kv_listeners.append(self._on_cache_kv_event)
        self._kv_subscribers.append(callback)

    def subscribe_tier_kv_events(self, callback: Callable[[int, int, bool, float, str], None]) -> None:
        """`callback(instance_id, block_hash, stored, at, medium)` for every block an
        instance's host memory (`medium` "cpu") or disk ("disk") gains or evicts, at the time
        its copy lands or it is pushed out (lmsim.engine.kv_tiers)."""
        if not self._tier_subscribers:
            for tier in self.kv_tiers.values():
                tier.publish = self._publish_tier_event
        self._tier_subscribers.append(callback)

    def _publish_tier_event(self, instance_id: int, block_hash: int, stored: bool, at: float, medium: str) -> None:
        for callback in self._tier_subscribers:
            callback(instance_id, block_hash, stored, at, medium)

    def _on_cache_kv_event(self, instance_id: int, block_hash: int, stored: bool) -> None:
        self.instances[instance_id].on_kv_event(block_hash, stored)

    def _publish_kv_event(self, instance_id: int, block_hash: int, stored: bool, at: float) -> None:
        for callback in self._kv_subscribers:
            callback(instance_id, block_hash, stored, at)

    # -- periodic work -------------------------------------------------------------------

    def add_periodic(self, period_s: float, callback: Callable[[float], None]) -> None:
        if period_s <= 0:
            raise ConfigError(f"periodic callback needs a positive period, got {period_s}")
        self._periodic.append((period_s, callback))

    def _schedule_periodic(self, period_s: float, callback: Callable[[float], None], n: int) -> None:
        # Ticks at n * period from the start, computed by multiplication so they never drift.
        def tick(_event: simpy.Event) -> None:
            if not self._work_remains():
                return
            # A scrape or a policy's timer reads the instances: decode runs first apply
            # the steps that have started by now, as stepping one by one would have.
            materialize_all(self.instances, self.env.now)
            callback(self.env.now)
            self._schedule_periodic(period_s, callback, n + 1)

        schedule_at(self.env, n * period_s, SAMPLE, tick)

    def _sample(self, now: float) -> None:
        for instance in self.instances:
            s = instance.scheduler
            self.recorder.sample(
                now,
                instance.instance_id,
                len(s.running),
                len(s.waiting),
                len(s.prefilling),
                s.cache.usage,
                s.pending_prefill_tokens,
                s.total_tokens,
            )

    def _work_remains(self) -> bool:
        return self.live > 0 or self._next_arrival() is not None

    # -- arrivals ------------------------------------------------------------------------

    def _next_arrival(self) -> tuple[float, int] | None:
        best = None
        if self._open_pos < len(self._open_rows):
            row = int(self._open_rows[self._open_pos])
            best = (float(self.trace.arrival_s[row]), row)
        if self._released and (best is None or self._released[0] < best):
            best = self._released[0]
        return best

    def _schedule_next_arrival(self) -> None:
        nxt = self._next_arrival()
        if nxt is None:
            self._arrival_event = None
            self._arrival_time = float("inf")
            return
        if self._arrival_event is not None and self._arrival_time <= nxt[0]:
            return
        self._arrival_time = nxt[0]
        self._arrival_event = schedule_at(self.env, max(nxt[0], self.env.now), ARRIVAL, self._arrive)

    def _arrive(self, event: simpy.Event) -> None:
        if event is not self._arrival_event:
            return
        self._arrival_event = None
        self._arrival_time = float("inf")
        nxt = self._next_arrival()
        assert nxt is not None
        _t, row = nxt
        if self._released and self._released[0] == nxt:
            heapq.heappop(self._released)
        else:
            self._open_pos += 1
        self._route(row, self.env.now)
        self._schedule_next_arrival()
        if self.drain_limit is not None and self._next_arrival() is None:
            stop_at = self.env.now + self.drain_limit
            schedule_at(self.env, stop_at, SAMPLE, self._stop)

    def _stop(self, _event: simpy.Event) -> None:
        """The drain limit: stop once nothing more is due to arrive and the last arrival is
        `drain_limit_s` old. A closed-loop successor released before then arrives and
        re-arms it; one whose predecessor is still running then never arrives."""
        if self._next_arrival() is not None:
            return
        if self.env.now < self.last_arrival_s + self.drain_limit or self.live == 0:
            return  # not yet, or nothing left to cut short: the run ends by itself
        self.last_activity_s = self.env.now
        raise simpy.core.StopSimulation(None)

    def _hard_stop(self, _event: simpy.Event) -> None:
        if self.live or self._next_arrival() is not None or self._children or self._stages_pending:
            self.last_activity_s = self.env.now
            raise simpy.core.StopSimulation(None)

    def new_request(self, row: int, now: float) -> Request:
        """Request `row` of the trace as it arrives at `now`: output clipped to the model
        length, its blocks named."""
        trace = self.trace
        ids = trace.hash_ids(row)
        if ids.dtype != np.int64:  # a compact trace (Trace.compact): the engine keys on int64
            ids = ids.astype(np.int64)
        input_tokens = int(trace.input_tokens[row])
        output_tokens = int(trace.output_tokens[row])
        limit = self.max_model_len
        clipped = limit is not None and input_tokens < limit < input_tokens + output_tokens
        if clipped:
            output_tokens = limit - input_tokens
        names = self.block_names.names(row, ids, input_tokens, output_tokens)
        request = Request(
            request_id=row,
            arrived_at=now,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            block_hashes=names.prompt,
            kv_hashes=names.kv,
            num_shared_blocks=names.shared,
            trace_hash_ids=ids,
            session_id=int(self._session_id[row]),
            parent_id=int(self._parent_id[row]),
            class_id=int(self._class_id[row]),
            slo_class=int(self._slo_class[row]),
            prompt_text=trace.prompt_text(row),
        )
        return request

    def _route(self, row: int, now: float) -> None:
        request = self.new_request(row, now)
        input_tokens = request.input_tokens
        limit = self.max_model_len
        clipped = limit is not None and input_tokens < limit < input_tokens + int(self.trace.output_tokens[row])
        self.live += 1
        self.num_arrived += 1
        if self._progress is not None and not self.num_arrived % PROGRESS_EVERY:
            self._progress(PROGRESS_EVERY)
        self.last_arrival_s = now
        self.last_activity_s = now
        self.recorder.arrived(request)
        if limit is not None and input_tokens >= limit:
            # vLLM's input processor refuses a prompt that leaves no room for one output
            # token (prompt_len >= max_model_len) before any router or engine sees it.
            self.reject(request, PROMPT_TOO_LONG)
            return
        if clipped:
            # vLLM stops a request once prompt + output reaches max_model_len.
            self.recorder.clipped(request)
        if self.frontend is None:
            self.router.route(request, now)
            return
        # sent now; the router sees it once the front end has handled and tokenised it
        self.in_front_end.add(request.request_id)
        schedule_at(
            self.env, self.frontend.routed_at(now, input_tokens, request.prompt_text), ARRIVAL,
            lambda _event: self._route_from_front_end(request),
        )

    def _route_from_front_end(self, request: Request) -> None:
        self.in_front_end.discard(request.request_id)
        self.router.route(request, self.env.now)

    def _dispatch(self, request: Request, instance_id: int) -> bool:
        reason = self.dispatch_problem(request, instance_id)
        if reason is not None:
            self.reject(request, reason)
            return False
        return True

    def dispatch_problem(self, request: Request, instance_id: int, *, queue: bool = True) -> int | None:
        """Why `request` cannot be queued on the instance (a reject reason), or None. With
        `queue=False` only whether it could ever fit there, not whether the queue has room."""
        instance = self.instances[instance_id]
        cap = instance.pool.engine["max_waiting"]
        bs = self.config.cluster.block_size
        scheduler = instance.scheduler
        num_blocks = scheduler.cache.num_total_blocks
        # A request whose final context exceeds the whole KV pool could never finish (vLLM
        # refuses it up front as longer than the model length); queueing it would livelock.
        too_long = -(-(request.input_tokens + request.output_tokens - 1) // bs) > num_blocks
        # under a watermark the whole prompt must fit beside it, or it would wait forever
        too_long |= -(-request.input_tokens // bs) + scheduler.watermark_blocks > num_blocks
        if too_long:
            return EXCEEDS_KV_CACHE
        if queue and cap is not None and scheduler.num_waiting >= cap:
            return QUEUE_FULL
        return None

    def _on_engine_rejected(self, request: Request) -> None:
        """An instance dropped a waiting request that can never be admitted again; the
        router hears of it as of a finished one (its in-flight counters)."""
        self.reject(request, RESUME_EXCEEDS_KV_CACHE)
        self.policy.on_finished(request)
        if self.fleet is not None and request.instance_id is not None:
            self.fleet.maybe_drained(request.instance_id)

    def _on_prefill_rejected(self, leg: Request) -> None:
        assert self.disagg is not None
        self.disagg.on_leg_rejected(leg)

    def fail(self, request: Request, reason: int) -> None:
        """`request` ends failed: lost to a crash and not sent again (lmsim.engine.fleet)."""
        request.state = RequestState.REJECTED
        self.recorder.failed(request, reason)
        self.live -= 1
        self._release_children(request, self.env.now)

    def reject(self, request: Request, reason: int) -> None:
        request.state = RequestState.REJECTED
        self.recorder.rejected(request, reason)
        self.live -= 1
        self._release_children(request, self.env.now)

    @property
    def _stages_pending(self) -> bool:
        return self.stages is not None and self.stages.pending

    def _release(self, due: list[tuple[float, int]]) -> None:
        for item in due:
            heapq.heappush(self._released, item)
        self._schedule_next_arrival()

    def _release_children(self, request: Request, now: float) -> None:
        if self.stages is not None:
            self._release(self.stages.on_done(request.request_id, now))
        if request.state is not RequestState.FINISHED:
            self._drop_successors(request.request_id)
            return
        for row in self._children.pop(request.request_id, ()):
            heapq.heappush(self._released, (now + float(self._delay[row]), row))
        self._schedule_next_arrival()

    def _drop_successors(self, row: int) -> None:
        """A closed-loop chain whose step was rejected never continues: forget every
        successor so the run does not wait for them."""
        stack = [row]
        while stack:
            stack.extend(self._children.pop(stack.pop(), ()))

    # -- step ends -----------------------------------------------------------------------

    def _on_prefill_step_end(self, instance: Instance, plan: StepPlan, outcome: StepOutcome, now: float) -> None:
        assert self.disagg is not None
        self.last_activity_s = now
        self.disagg.on_prefill_step_end(outcome, now)
        if self.check:
            from lmsim.engine.invariants import check_step

            check_step(self, instance, plan, outcome, now)

    def _on_step_end(self, instance: Instance, plan: StepPlan, outcome: StepOutcome, now: float) -> None:
        self.last_activity_s = now
        for request in outcome.first_tokens:
            self.policy.on_first_token(request)
        for request in outcome.finished:
            self.live -= 1
            self.recorder.finished(request)
            self.policy.on_finished(request)
            if self.stages is not None or request.request_id in self._children:
                # the client reacts when it reads the last token
                self._release_children(request, now + self._egress_s)
        if self.check:
            from lmsim.engine.invariants import check_step

            check_step(self, instance, plan, outcome, now)

    # -- running -------------------------------------------------------------------------

    def run(self, stop_at_s: float | None = None, progress: Callable[[int], None] | None = None) -> Results:
        """Replay the workload. `stop_at_s` cuts the run at that simulated time (for callers
        that only need to know what finished by then, like the capacity search); `progress`
        hears how many more requests arrived, every PROGRESS_EVERY arrivals."""
        self.drain_limit = self.config.simulation.drain_limit_s
        self._progress = progress
        started = time.perf_counter()
        if stop_at_s is not None:
            schedule_at(self.env, stop_at_s, SAMPLE, self._hard_stop)
        self._schedule_periodic(self.config.simulation.sample_interval_s, self._sample, 0)
        for period, callback in self._periodic:
            self._schedule_periodic(period, callback, 1)
        if self.stages is not None:
            self._release(self.stages.start())
        if self.fleet is not None:
            self.fleet.start_timers()
        self._schedule_next_arrival()
        self.env.run()
        if progress is not None and self.num_arrived % PROGRESS_EVERY:
            progress(self.num_arrived % PROGRESS_EVERY)
        wall = time.perf_counter() - started
        if self.check:
            from lmsim.engine.invariants import check_end

            check_end(self)
        for instance in self.instances:
            instance.materialize()
            instance.record_ended_steps()
            s = instance.scheduler
            for request in [*s.running, *s.waiting, *s.loading]:
                request.num_output_done = instance.scheduler.outputs_of(request)
                if self.disagg is not None and instance.pool.role == "prefill":
                    request = self.disagg.client_of(request)  # still prefilling: its leg's stats
                self.recorder.store(request)
        if self.disagg is not None:
            for request in self.disagg.clients_in_handover():
                self.recorder.store(request)
        return Results.from_simulation(self, wall)


__all__ = ["InvariantError", "Simulation"]
