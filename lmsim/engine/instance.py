"""One serving instance on the SimPy clock: runs its scheduler's steps back to back.

The instance plans a step (or a run of decode-only steps), schedules one event at the end
and commits there. A run's step boundaries are computed by accumulating step durations one
at a time, exactly as stepping one by one would. While a run is in flight, anyone reading
the instance (the router, the sampler) first calls `materialize()`, which applies the
effects of the steps that have started or completed by now; an arrival additionally
truncates the run after the step in progress, so the newcomer is considered at the same
step boundary as in one-by-one stepping.

KV events (a block stored in or evicted from the prefix cache) happen when a step is
scheduled, but vLLM publishes them only when that step's output is processed
(`Scheduler.update_from_output` takes the KV cache manager's events and hands them to the
publisher), so each event is stamped with the end of the step that produced it, whether the
step was planned on its own or applied lazily inside a run (`KVEventSink`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate

import simpy

from lmsim.config import PoolSpec
from lmsim.engine.clock import STEP_END, WAKE, schedule_at
from lmsim.engine.request import Request
from lmsim.engine.scheduler import InstanceScheduler, StepOutcome, StepPlan

INF = float("inf")
StepListener = Callable[["Instance", StepPlan, StepOutcome, float], None]
RejectListener = Callable[[Request], None]
KVEventSink = Callable[[int, int, bool, float], None]  # (instance_id, hash, stored, published at)


def materialize_all(instances: list[Instance], now: float) -> None:
    """Bring every instance's fast-forwarded run up to date with the clock, before anyone
    reads the instances (a routing decision, a periodic scrape or sample)."""
    for instance in instances:
        if now >= instance.next_boundary:
            instance.materialize()


class Instance:
    def __init__(
        self,
        env: simpy.Environment,
        instance_id: int,
        scheduler: InstanceScheduler,
        on_step_end: StepListener,
        on_rejected: RejectListener,
        pool: PoolSpec | None = None,
    ) -> None:
        self.env = env
        self.instance_id = instance_id
        self.pool = pool  # the pool it belongs to (name, role, engine settings)
        self.scheduler = scheduler
        self._on_step_end = on_step_end
        self._on_rejected = on_rejected
        self._plan: StepPlan | None = None
        self._times: list[float] = []  # boundaries of the planned run: start, end of each step
        self._end_event: simpy.Event | None = None
        self._wake_pending = False
        # Time of the next step boundary inside a fast-forwarded run that materialize() has
        # not applied yet; infinity when there is nothing to apply.
        self.next_boundary = INF
        self.num_steps = 0
        self.num_events = 0
        self.busy_time_s = 0.0
        # Where this instance's KV events go once stamped (None: nobody listens), and the
        # events of the step being planned, whose end is not known yet.
        self.kv_sink: KVEventSink | None = None
        self._planning = False
        self._receiving = False  # a connector's load is becoming cache entries
        self._kv_unstamped: list[tuple[int, bool]] = []

    @property
    def cache(self):
        return self.scheduler.cache

    @property
    def is_busy(self) -> bool:
        return self._plan is not None

    # -- the router's side ---------------------------------------------------------------

    def submit(self, request: Request) -> None:
        self.materialize()
        self.scheduler.enqueue(request)
        self._reconsider()

    def external_ready(self, request: Request) -> None:
        """A connector's load for `request` has landed (lmsim.engine.connector). Its blocks
        become cache entries now, between steps; their KV events are published with the next
        step (see `on_kv_event`)."""
        self.materialize()
        self._receiving = True
        self.scheduler.finish_load(request)
        self._receiving = False
        self._reconsider()

    def release_held(self, request: Request) -> None:
        """A connector is done reading a finished request's blocks: free them."""
        self.materialize()
        self.scheduler.release_held(request)
        self._reconsider()

    def _reconsider(self) -> None:
        """The waiting queue or the free pool changed: plan at the next step boundary, as
        one-by-one stepping would (an idle instance wakes now; a run in flight ends after
        the step in progress)."""
        if self._plan is None:
            if not self._wake_pending:
                self._wake_pending = True
                schedule_at(self.env, self.env.now, WAKE, self._wake)
        elif self._plan.num_steps > 1:
            self._truncate_after_current_step()

    def materialize(self) -> None:
        """Bring a fast-forwarded run up to date with the clock."""
        now = self.env.now
        if now < self.next_boundary:
            return
        plan = self._plan
        assert plan is not None
        times = self._times
        k = plan.num_steps
        started = bisect_right(times, now, 0, k)
        completed = bisect_right(times, now, 1, k + 1) - 1
        self.scheduler.advance(started, completed)
        self.next_boundary = times[started] if started < k else INF

    def step_in_flight(self) -> tuple[float, dict[int, int]]:
        """Seconds until the step running now ends, and the prompt tokens it is computing per
        request id (empty when idle or in a decode-only step). A request arriving now can
        join only the step after it."""
        plan = self._plan
        if plan is None:
            return 0.0, {}
        now = self.env.now
        times = self._times
        j = min(max(bisect_right(times, now, 0, plan.num_steps) - 1, 0), plan.num_steps - 1)
        chunks = {r.request_id: q for r, q in plan.chunks} if j == 0 else {}
        return max(0.0, times[j + 1] - now), chunks

    # -- KV events -----------------------------------------------------------------------

    def on_kv_event(self, block_hash: int, stored: bool) -> None:
        """The cache stored or evicted a block while a step was being scheduled; publish it
        when that step ends. Blocks a connector's load caches between steps are published
        with the next step the instance plans (vLLM caches them in the next `schedule()`,
        `_update_waiting_for_remote_kv`)."""
        assert self.kv_sink is not None
        if self._planning or self._receiving:
            self._kv_unstamped.append((block_hash, stored))
            return
        plan = self._plan
        assert plan is not None
        published = self._times[self.scheduler.event_step - plan.start_step + 1]
        self.kv_sink(self.instance_id, block_hash, stored, published)

    def _publish_planned_events(self) -> None:
        events, self._kv_unstamped = self._kv_unstamped, []
        assert self.kv_sink is not None and self._plan is not None
        published = self._times[1]
        for block_hash, stored in events:
            self.kv_sink(self.instance_id, block_hash, stored, published)

    # -- the engine loop -----------------------------------------------------------------

    def _wake(self, _event: simpy.Event) -> None:
        self._wake_pending = False
        if self._plan is None:
            self._start_step()

    def _start_step(self) -> None:
        self._planning = True
        plan = self.scheduler.plan(self.env.now)
        self._planning = False
        self._plan = plan
        if self.scheduler.rejected:
            rejected, self.scheduler.rejected = self.scheduler.rejected, []
            for request in rejected:
                self._on_rejected(request)
        if plan is None:
            # A plan that only started loads (their blocks' allocation evicted some) runs no
            # step: its events are published at once, as vLLM's output of an empty step.
            events, self._kv_unstamped = self._kv_unstamped, []
            for block_hash, stored in events:
                self.kv_sink(self.instance_id, block_hash, stored, self.env.now)  # type: ignore[misc]
            return
        # accumulate adds exactly as `t = t + d` step by step would, at C speed.
        times = list(accumulate(plan.durations, initial=self.env.now))
        self._times = times
        if self._kv_unstamped:
            self._publish_planned_events()
        self.next_boundary = times[1] if plan.num_steps > 1 else INF
        self._end_event = schedule_at(self.env, times[-1], STEP_END, self._step_end)

    def _truncate_after_current_step(self) -> None:
        plan = self._plan
        assert plan is not None
        started = bisect_right(self._times, self.env.now, 0, plan.num_steps)
        if started >= plan.num_steps:
            return
        plan.num_steps = started
        del plan.durations[started:]
        del self._times[started + 1 :]
        self.scheduler.truncate_run(started)
        self._end_event = schedule_at(self.env, self._times[-1], STEP_END, self._step_end)

    def _step_end(self, event: simpy.Event) -> None:
        if event is not self._end_event:
            return  # superseded by a truncation
        plan = self._plan
        assert plan is not None
        now = self.env.now
        outcome = self.scheduler.commit(plan, now)
        self.num_steps += plan.num_steps
        self.num_events += 1
        self.busy_time_s += now - self._times[0]
        self._plan = None
        self._end_event = None
        self.next_boundary = INF
        self._on_step_end(self, plan, outcome, now)
        self._start_step()
