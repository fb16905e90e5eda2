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

Asynchronous scheduling (vLLM's default from 0.33: `AsyncScheduler`, and
`EngineCore.step_with_batch_queue` with a batch queue of 2, `max_concurrent_batches = 2`
when `async_scheduling` is on). The engine loop schedules step N+1 as soon as step N is
submitted, then blocks on N's output, processes it (`update_from_output`) and schedules
N+2. So:

* step M is planned when step M-2 ends (when the engine is idle, steps N and N+1 are planned
  back to back), and its plan sees the state before M-1 commits: a request arriving while
  step M-1 runs is first scheduled in step M+1; a request whose last token step M-1
  computes is not scheduled in M (vLLM skips a request whose placeholders already reach
  its max_tokens) but still holds its blocks and its seat while M is planned;
* the host (CPU) part of a step, `host_time(num_seqs, num_tokens)` of the cost model,
  overlaps the GPU part of the step before: the host works on one plan at a time, from
  `max(plan due, host free)`, and the GPU starts step M at `max(end of M-1, its host work
  done)`, so M ends at that + (step_time - host_time). An idle engine pays both parts;
* a step's KV events are published when the step in flight at its planning ends (the
  `update_from_output` after the `schedule()` that produced them), or its own end when the
  engine was idle.

Fast-forward stays exact: a run's steps are planned at their own due times (step M at
the end of M-2), so an arrival truncates the run after the steps planned by then.

KV connector completions (`external_ready`: a load landed; `release_held`: the reader of a
held request's blocks is done) reach the scheduler when vLLM learns of them, not when the
bytes land. The worker polls its connector once per step, right after launching the step's
forward (`KVConnectorModelRunnerMixin._get_kv_connector_output`: `start_load_kv`, the
forward, then `get_finished` / `get_transfer_results`), and the step's output carries what
the poll found (`KVConnectorOutput.finished_recving` / `finished_sending`); the scheduler
applies it when it processes that output (`Scheduler.update_from_output` ->
`_update_from_kv_xfer_finished`: a finished receive is admitted by the next `schedule()`,
`_update_waiting_for_remote_kv`; a finished send frees the blocks, `_free_blocks`). Here the
poll of a step is at its planning time, so a completion at t is applied at the end of the
first step planned at or after t, right before the plan made there: a load that lands
while step N runs is admitted in step N+2 (synchronous) or N+4 (asynchronous: N+1 was
planned when N-1 ended, so the first poll after t is N+2's, and the plan made when N+2
ends is N+4's) instead of N+1 / N+2, one / two steps later. An engine with nothing to run
but requests waiting (for their KV, or for blocks a held request keeps) runs empty steps
that poll at once (`EngineCore.step`: `kv_connector_no_forward` for an empty schedule), so
it applies a completion the instant it lands; an engine with no request at all does not
step (`SchedulerInterface.has_requests`) and a finished send waits for its next step.
Fast-forward stays exact: a completion only ever truncates a run so that the step that
polls it ends the run (sync) or is the step whose end plans the next run (async), and the
step ends apply completions by landing time alone, never by event order.
`kv_connector_poll: instant` applies each completion at its landing instead (lmsim before
issue 34, and Dynamo's mocker, which activates a transfer when it lands).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable
from itertools import accumulate, repeat
from operator import sub

import simpy

from lmsim.config import PoolSpec
from lmsim.engine.clock import STEP_END, WAKE, schedule_at
from lmsim.engine.request import Request
from lmsim.engine.scheduler import InstanceScheduler, StepOutcome, StepPlan

INF = float("inf")
StepListener = Callable[["Instance", StepPlan, StepOutcome, float], None]
RejectListener = Callable[[Request], None]
KVEventSink = Callable[[int, int, bool, float], None]  # (instance_id, hash, stored, published at)
HostTime = Callable[[int, int], float]  # (sequences, tokens) -> host seconds of a step
# What a connector completion does once the scheduler learns of it (see the module docstring)
LOADED, SENT = 0, 1


def materialize_all(instances: list[Instance], now: float) -> None:
    """Bring every instance's fast-forwarded run up to date with the clock, before anyone
    reads the instances (a routing decision, a periodic scrape or sample)."""
    for instance in instances:
        if now >= instance.next_boundary:
            instance.materialize()


class _Planned:
    """A plan in flight and its timing: when each step is planned and when it ends, when
    its KV events are published, and the event that commits it at its end."""

    __slots__ = (
        "end_offset",
        "ends",
        "event",
        "host",
        "host_free",
        "long_gaps",
        "plan",
        "prev_end",
        "published",
        "starts",
    )

    def __init__(self, plan: StepPlan, starts: list[float], ends: list[float], end_offset: int,
                 published: list[float] | None, host_free: list[float], prev_end: float) -> None:
        self.plan = plan
        self.prev_end = prev_end  # when the step before its first one ended
        self.long_gaps: list[float] = []  # gaps ended by its first step that span more than it
        self.starts = starts  # starts[j]: when step j is planned
        self.ends = ends  # ends[end_offset + j]: when step j ends
        self.end_offset = end_offset
        # published[j]: when step j's KV events are published (None: at its end)
        self.published = published
        # when step j's host work is done (asynchronous scheduling); past the list the host
        # is never the bottleneck, and step j's host work runs from its planning for `host`
        self.host_free = host_free
        self.host = 0.0
        self.event: simpy.Event | None = None

    def end(self, j: int) -> float:
        return self.ends[self.end_offset + j]

    def published_at(self, j: int) -> float:
        return self.ends[self.end_offset + j] if self.published is None else self.published[j]

    @property
    def last_end(self) -> float:
        return self.ends[self.end_offset + self.plan.num_steps - 1]


class Instance:
    def __init__(
        self,
        env: simpy.Environment,
        instance_id: int,
        scheduler: InstanceScheduler,
        on_step_end: StepListener,
        on_rejected: RejectListener,
        pool: PoolSpec | None = None,
        *,
        async_scheduling: bool = False,
        host_time: HostTime | None = None,
        connector_poll: bool = True,
    ) -> None:
        self.env = env
        self.instance_id = instance_id
        self.pool = pool  # the pool it belongs to (name, role, engine settings)
        self.scheduler = scheduler
        self._on_step_end = on_step_end
        self._on_rejected = on_rejected
        self.async_scheduling = async_scheduling
        if async_scheduling and host_time is None:
            raise ValueError("asynchronous scheduling needs the cost model's host_time")
        self._host_time = host_time
        self._depth = 2 if async_scheduling else 1  # steps planned and not ended, at most
        self._inflight: deque[_Planned] = deque()  # oldest first; the last is the newest
        self._due_event: simpy.Event | None = None
        self._host_free = -INF
        self._wake_pending = False
        # Time of the next step boundary inside a fast-forwarded run that materialize() has
        # not applied yet; infinity when there is nothing to apply.
        self.next_boundary = INF
        self.num_steps = 0
        self.num_events = 0
        self.busy_time_s = 0.0
        # Where this instance's KV events go once stamped (None: nobody listens), and the
        # events of the step being planned, whose timing is not known yet.
        self.kv_sink: KVEventSink | None = None
        self._receiving = False  # a connector's load is becoming cache entries
        # Connector completions not applied yet, (landed at, kind, request) in landing order;
        # with `connector_poll` off they are applied as they land.
        self.connector_poll = connector_poll
        self.landed: list[tuple[float, int, Request]] = []
        self._empty_poll = -INF  # async: an empty plan's poll, applied when the step in flight ends
        self._idle_poll = False  # a wake-up that polls (nothing in flight, requests waiting)
        # told when a plan is made, with when its KV events are published (lower KV tiers)
        self.on_planned: Callable[[float], None] | None = None
        self._kv_unstamped: list[tuple[int, bool]] = []
        # Every gap between consecutive output tokens of a request, as (gap, how many
        # requests had it): a step's decodes each wait one step (end to end); a decode
        # starved or preempted in between waits from its last token to its next.
        self.itl_gaps = array("d")
        self.itl_counts = array("I")

    @property
    def cache(self):
        return self.scheduler.cache

    def reset(self, scheduler: InstanceScheduler) -> float:
        """The engine process is gone (a stop or a crash, lmsim.engine.fleet): the steps in
        flight are dropped, and `scheduler` (fresh, empty) replaces the old one. The steps
        of a fast-forwarded run that have ended by now are counted first, as stepping one
        by one had committed them; the counters of work done carry over. Events of the
        dropped steps find nothing to do (`_step_end` and `_due` check they are current).
        Returns when the last counted step ended (-inf if none)."""
        self.materialize()  # the steps started by now allocated their blocks (evictions counted)
        last = self.record_ended_steps()
        old = self.scheduler
        scheduler.connector = old.connector
        scheduler.num_outside_grid = old.num_outside_grid
        scheduler.num_preemptions = old.num_preemptions
        scheduler.cache.num_evictions = old.cache.num_evictions
        self.scheduler = scheduler
        self._inflight.clear()
        self._due_event = None
        self._host_free = -INF
        self.next_boundary = INF
        self.landed = []
        self._empty_poll = -INF
        self._idle_poll = False
        self._kv_unstamped = []
        self._receiving = False
        return last

    @property
    def is_busy(self) -> bool:
        return bool(self._inflight)

    # -- the router's side ---------------------------------------------------------------

    def submit(self, request: Request) -> None:
        self.materialize()
        self.scheduler.enqueue(request)
        self._reconsider()

    def external_ready(self, request: Request) -> None:
        """A connector's load for `request` has landed now (lmsim.engine.connector). Its
        blocks become cache entries when the scheduler learns of it (module docstring),
        between steps; their KV events are published with the next step (see
        `on_kv_event`)."""
        self._connector_done(LOADED, request)

    def release_held(self, request: Request) -> None:
        """A connector is done reading a finished request's blocks now: free them when the
        scheduler learns of it."""
        self._connector_done(SENT, request)

    def _connector_done(self, kind: int, request: Request) -> None:
        self.materialize()
        if not self.connector_poll:
            self._apply_completion(kind, request)
            self._reconsider()
            return
        self.landed.append((self.env.now, kind, request))
        if self._inflight:
            self._end_run_at_first_apply()  # or, if no step in flight polls it, the next plan's
        elif self._polls_when_idle():
            self._wake_to_poll()

    def _polls_when_idle(self) -> bool:
        """vLLM's engine steps (empty steps poll the connector) while it has requests: some
        running or waiting, or waiting for their KV."""
        scheduler = self.scheduler
        return not scheduler.is_idle or bool(scheduler.loading)

    def _wake_to_poll(self) -> None:
        self._idle_poll = True
        if not self._wake_pending:
            self._wake_pending = True
            schedule_at(self.env, self.env.now, WAKE, self._wake)

    def _end_run_at_first_apply(self) -> None:
        """The earliest landed completion is applied at the end of the first step in flight
        planned at or after its landing; no step of the run may be planned at or after that
        (stepping, it would be planned after the completion is applied). So the run ends
        there (synchronous) or its second-to-last step does, whose end plans the next run
        (asynchronous), and that end is an event that applies it."""
        first_landing = self.landed[0][0]
        for planned in self._inflight:
            k = planned.plan.num_steps
            j = bisect_left(planned.starts, first_landing, 0, k)
            if j < k:
                applied_at = planned.end(j)
                newest = self._inflight[-1]
                self._truncate_to(bisect_left(newest.starts, applied_at, 0, newest.plan.num_steps))
                return

    def _apply_polled(self, horizon: float) -> None:
        """Apply the completions a poll at `horizon` (or earlier) has seen, in landing order
        (at equal times loads first, then by request id: never the order events happened to
        fire in)."""
        landed = self.landed
        n = bisect_right(landed, horizon, key=_landed_at)
        if not n:
            return
        seen = sorted(landed[:n], key=_completion_order)
        del landed[:n]
        for _at, kind, request in seen:
            self._apply_completion(kind, request)

    def _apply_completion(self, kind: int, request: Request) -> None:
        if kind == LOADED:
            self._receiving = True
            self.scheduler.finish_load(request)
            self._receiving = False
        else:
            self.scheduler.release_held(request)

    def _reconsider(self) -> None:
        """The waiting queue or the free pool changed: plan at the next step boundary, as
        one-by-one stepping would (an idle instance wakes now; a run in flight keeps the
        steps planned by now and drops the rest)."""
        if not self._inflight:
            if not self._wake_pending:
                self._wake_pending = True
                schedule_at(self.env, self.env.now, WAKE, self._wake)
        elif self._inflight[-1].plan.num_steps > 1:
            self._truncate_after_planned_steps()

    def materialize(self) -> None:
        """Bring a fast-forwarded run up to date with the clock."""
        now = self.env.now
        if now < self.next_boundary:
            return
        newest = self._inflight[-1]
        k = newest.plan.num_steps
        starts = newest.starts
        started = bisect_right(starts, now, 0, k)
        if self.async_scheduling:
            ends = newest.ends
            completed = bisect_right(ends, now, 0, k)
            self.scheduler.advance(started, completed)
            # the next step to plan or to end (the last one's end is its commit)
            boundary = starts[started] if started < k else INF
            if completed < k - 1 and ends[completed] < boundary:
                boundary = ends[completed]
            self.next_boundary = boundary
            return
        # synchronous: step j ends when step j+1 starts, one list holds both
        self.scheduler.advance(started, bisect_right(starts, now, 1, k + 1) - 1)
        self.next_boundary = starts[started] if started < k else INF

    def _set_next_boundary(self) -> None:
        """Asynchronous scheduling: the next time the newest plan has a step to apply, the
        planning of its first step not yet allocated or the end of its first step not yet
        counted as done (the end of the last one is its commit)."""
        newest = self._inflight[-1]
        plan = newest.plan
        start, k = plan.start_step, plan.num_steps
        scheduler = self.scheduler
        started = scheduler.allocated_through - start
        boundary = newest.starts[started] if started < k else INF
        completed = scheduler.steps_done - start
        if completed < k - 1:
            end = newest.ends[completed if completed > 0 else 0]
            if end < boundary:
                boundary = end
        self.next_boundary = boundary

    def step_in_flight(self) -> tuple[float, dict[int, int]]:
        """Seconds until the step running now ends, and the prompt tokens it is computing per
        request id (empty when idle or in a decode-only step). A request arriving now can
        join only a step planned after it."""
        if not self._inflight:
            return 0.0, {}
        now = self.env.now
        if self.async_scheduling:
            for planned in self._inflight:  # the GPU runs the oldest step not yet ended
                k = planned.plan.num_steps
                j = bisect_right(planned.ends, now, 0, k)
                if j < k:
                    chunks = {r.request_id: q for r, q in planned.plan.chunks} if j == 0 else {}
                    return max(0.0, planned.end(j) - now), chunks
            return 0.0, {}
        newest = self._inflight[-1]
        plan = newest.plan
        times = newest.starts  # synchronous: step j ends when step j+1 starts, at times[j + 1]
        j = min(max(bisect_right(times, now, 0, plan.num_steps) - 1, 0), plan.num_steps - 1)
        chunks = {r.request_id: q for r, q in plan.chunks} if j == 0 else {}
        return max(0.0, times[j + 1] - now), chunks

    # -- KV events -----------------------------------------------------------------------

    def on_kv_event(self, block_hash: int, stored: bool) -> None:
        """The cache stored or evicted a block while a step was being scheduled; publish it
        when vLLM would (see the module docstring). Blocks a connector's load caches between
        steps are published with the next step the instance plans (vLLM caches them in the
        next `schedule()`, `_update_waiting_for_remote_kv`)."""
        assert self.kv_sink is not None
        if not self._receiving:
            step = self.scheduler.event_step
            for planned in reversed(self._inflight):
                j = step - planned.plan.start_step
                if 0 <= j < planned.plan.num_steps:
                    self.kv_sink(self.instance_id, block_hash, stored, planned.published_at(j))
                    return
        self._kv_unstamped.append((block_hash, stored))  # the step being planned now, or the next

    def _publish_planned_events(self, planned: _Planned) -> None:
        events, self._kv_unstamped = self._kv_unstamped, []
        assert self.kv_sink is not None
        published = planned.published_at(0)
        for block_hash, stored in events:
            self.kv_sink(self.instance_id, block_hash, stored, published)

    # -- the engine loop -----------------------------------------------------------------

    def _wake(self, _event: simpy.Event) -> None:
        self._wake_pending = False
        poll, self._idle_poll = self._idle_poll, False
        if not self._inflight:
            if poll:
                self._apply_polled(self.env.now)
            self._fill()

    def _fill(self) -> None:
        """Plan while fewer than `depth` planned steps have not ended (synchronous: when
        none is in flight, which is whenever this is called)."""
        if not self.async_scheduling:
            self._start_step()
            return
        scheduler = self.scheduler
        while scheduler.planned_ahead() < self._depth:
            if not self._start_step():
                return

    def _start_step(self) -> bool:
        scheduler = self.scheduler
        now = self.env.now
        plan = scheduler.plan(now)
        if scheduler.rejected:
            rejected, scheduler.rejected = scheduler.rejected, []
            for request in rejected:
                self._on_rejected(request)
        if scheduler.interrupted:
            # their last token came at the end of the step before the one planned now
            last_token = self._inflight[-1].last_end if self._inflight else now
            for request in scheduler.interrupted:
                request.gap_from = last_token
            scheduler.interrupted.clear()
        if plan is None:
            # A plan that only started loads (their blocks' allocation evicted some) runs no
            # step: its events are published at once, as vLLM's output of an empty step.
            events, self._kv_unstamped = self._kv_unstamped, []
            for block_hash, stored in events:
                self.kv_sink(self.instance_id, block_hash, stored, now)  # type: ignore[misc]
            if self.on_planned is not None:
                self.on_planned(now)
            if self.landed:
                # vLLM runs the empty step anyway and its poll sees what has landed: applied
                # at once, or when the step in flight ends (its output is processed first)
                if self._inflight:
                    self._empty_poll = now
                elif self._polls_when_idle():
                    self._wake_to_poll()
            return False
        if self.async_scheduling:
            planned = self._time_async(plan, now)
            planned.event = schedule_at(self.env, planned.last_end, STEP_END, self._step_end)
            self._inflight.append(planned)
            self._set_next_boundary()
            self._schedule_due(planned)
        else:
            # accumulate adds exactly as `t = t + d` step by step would, at C speed; step j
            # starts when step j-1 ends, so one list holds both.
            times = list(accumulate(plan.durations, initial=now))
            planned = _Planned(plan, times, times, 1, None, [], now)
            planned.event = schedule_at(self.env, times[-1], STEP_END, self._step_end)
            self.next_boundary = times[1] if plan.num_steps > 1 else INF
            self._inflight.append(planned)
        if self.landed:  # polled by a step in flight or by this plan's first step
            self._end_run_at_first_apply()
        if plan.late or plan.chunks:
            self._note_long_gaps(planned)
        if self._kv_unstamped:
            self._publish_planned_events(planned)
        if self.on_planned is not None:
            self.on_planned(planned.published_at(0))
        return True

    def _note_long_gaps(self, planned: _Planned) -> None:
        """Gaps longer than a step, fixed when the plan is timed (its first step is never
        cut): a request starved or preempted waits from its last token (`gap_from`) to its
        next, which a decode starved before gets in the first step and a preempted request
        when its recompute completes."""
        plan = planned.plan
        first_end = planned.end(0)
        for request in plan.late:
            planned.long_gaps.append(first_end - request.gap_from)
            request.gap_from = -1.0
        for request, q in plan.chunks:
            if request.gap_from >= 0 and request.num_computed_tokens + q == request.num_tokens_target:
                planned.long_gaps.append(first_end - request.gap_from)
                request.gap_from = -1.0

    def _record_step_gaps(self, planned: _Planned, steps: int) -> None:
        """The gaps ended by the first `steps` steps of a plan: each decode (but the late
        ones, recorded apart) waited from the end of the step before to its own end."""
        if not steps:
            return
        plan = planned.plan
        gaps, counts = self.itl_gaps, self.itl_counts
        if planned.long_gaps:
            gaps.extend(planned.long_gaps)
            counts.extend(repeat(1, len(planned.long_gaps)))
        decodes = plan.num_decodes
        if not decodes:
            return
        off = planned.end_offset
        ends = planned.ends
        first = decodes - len(plan.late) if plan.late else decodes
        if first:
            gaps.append(ends[off] - planned.prev_end)
            counts.append(first)
        if steps > 1:
            gaps.extend(map(sub, ends[off + 1 : off + steps], ends[off : off + steps - 1]))
            counts.extend(repeat(decodes, steps - 1))

    def record_ended_steps(self) -> float:
        """The run stops now: count the steps in flight that have ended, their busy time and
        their gaps, as their plan's commit would have (stepping one by one committed each).
        Returns when the last of them ended (-inf if none)."""
        now = self.env.now
        last = -INF
        for planned in self._inflight:
            k = planned.plan.num_steps
            off = planned.end_offset
            ended = bisect_right(planned.ends, now, off, off + k) - off
            self._record_step_gaps(planned, ended)
            if not ended:
                continue
            last = max(last, planned.end(ended - 1))
            self.num_steps += ended
            if self.async_scheduling:
                host = planned.host
                self.busy_time_s += sum(d - host if d > host else 0.0 for d in planned.plan.durations[:ended])
            else:
                self.busy_time_s += planned.end(ended - 1) - planned.starts[0]
        return last

    def _time_async(self, plan: StepPlan, now: float) -> _Planned:
        """Step boundaries under asynchronous scheduling (module docstring): step j of the
        plan is planned at `now` (j = 0), when the step in flight ends (j = 1; `now` if the
        engine was idle), or when step j-2 ends; its host work runs from max(planned, host
        free) for `host_time`, its GPU part from max(previous end, host done) for
        `step_time - host_time`."""
        assert self._host_time is not None
        host = self._host_time(plan.num_decodes + len(plan.chunks), plan.num_tokens)
        previous = self._inflight[-1].last_end if self._inflight else None
        starts: list[float] = []
        ends: list[float] = []
        host_free: list[float] = []
        free = self._host_free
        prev_end = -INF if previous is None else previous
        durations = plan.durations
        if len(durations) == 1:  # a single step: the loop below, once
            free = (now if now > free else free) + host
            gpu = durations[0] - host
            end = (prev_end if prev_end > free else free) + (gpu if gpu > 0.0 else 0.0)
            planned = _Planned(plan, [now], [end], 0, [end if previous is None else previous], [free],
                               now if previous is None else previous)
            planned.host = host
            self._host_free = free
            return planned
        for j, duration in enumerate(durations):
            if j == 0:
                due = now
            elif j == 1:
                due = now if previous is None else previous
            else:
                if j == 2 and free <= ends[0] and ends[1] >= ends[0] + host:
                    gpus = list(map(host.__rsub__, durations[2:]))
                    if min(gpus) >= host:
                        # The host is never the bottleneck from here: step j's host work
                        # starts when it is planned (the end of step j-2) and is done before
                        # step j-1 ends, so the GPU runs the steps back to back, end[j] =
                        # end[j-1] + gpu[j]: the additions the loop below would make, at
                        # C speed.
                        ends += accumulate(gpus, initial=ends[1])
                        del ends[2]  # accumulate repeats its initial value
                        starts += ends[: len(durations) - 2]
                        break
                due = ends[j - 2]
            free = (due if due > free else free) + host
            gpu = duration - host
            end = (prev_end if prev_end > free else free) + (gpu if gpu > 0.0 else 0.0)
            starts.append(due)
            ends.append(end)
            host_free.append(free)
            prev_end = end
        published = [ends[0] if previous is None else previous, *ends[:-1]]
        planned = _Planned(plan, starts, ends, 0, published, host_free, now if previous is None else previous)
        planned.host = host
        self._host_free = self._host_free_after(planned, len(durations) - 1)
        return planned

    @staticmethod
    def _host_free_after(planned: _Planned, j: int) -> float:
        """When the host is done with step j's work."""
        host_free = planned.host_free
        return host_free[j] if j < len(host_free) else planned.starts[j] + planned.host

    def _schedule_due(self, planned: _Planned) -> None:
        """The next plan is due when the second-to-last planned step ends: inside a run, an
        event of its own; otherwise the commit of the step in flight plans it."""
        k = planned.plan.num_steps
        self._due_event = schedule_at(self.env, planned.end(k - 2), STEP_END, self._due) if k > 1 else None

    def _due(self, event: simpy.Event) -> None:
        if event is not self._due_event:
            return  # superseded by a truncation
        self._due_event = None
        self.materialize()
        if self.landed:  # the run's second-to-last step ends now and reports its poll
            newest = self._inflight[-1]
            self._apply_polled(newest.starts[newest.plan.num_steps - 2])
        self._fill()

    def _truncate_after_planned_steps(self) -> None:
        """An arrival wants the next step that is not planned yet: keep the steps of the run
        whose planning time has come and drop the rest."""
        newest = self._inflight[-1]
        self._truncate_to(bisect_right(newest.starts, self.env.now, 0, newest.plan.num_steps))

    def _truncate_to(self, kept: int) -> None:
        """Keep the first `kept` steps of the newest run (at least those planned by now)."""
        newest = self._inflight[-1]
        plan = newest.plan
        if kept >= plan.num_steps:
            return
        plan.num_steps = kept
        del plan.durations[kept:]
        if newest.ends is newest.starts:  # synchronous: one list of boundaries
            del newest.ends[kept + 1 :]
        else:
            del newest.starts[kept:]
            del newest.ends[kept:]
            del newest.host_free[kept:]
            del newest.published[kept:]  # type: ignore[index]
            self._host_free = self._host_free_after(newest, kept - 1)
        self.scheduler.truncate_run(kept)
        newest.event = schedule_at(self.env, newest.last_end, STEP_END, self._step_end)
        if self.async_scheduling:
            self._schedule_due(newest)

    def _step_end(self, event: simpy.Event) -> None:
        inflight = self._inflight
        if not inflight or event is not inflight[0].event:
            return  # superseded by a truncation (the truncated run may be over and the instance idle)
        oldest = inflight[0]
        plan = oldest.plan
        now = self.env.now
        outcome = self.scheduler.commit(plan, now)
        if plan.num_decodes or oldest.long_gaps:
            self._record_step_gaps(oldest, plan.num_steps)
        inflight.popleft()
        self.num_steps += plan.num_steps
        self.num_events += 1
        if not self.async_scheduling:
            self.busy_time_s += now - oldest.starts[0]
            self.next_boundary = INF
            self._on_step_end(self, plan, outcome, now)
            if self.landed:
                self._apply_polled(oldest.starts[plan.num_steps - 1])
            self._start_step()
            return
        # the GPU's share: the host part overlapped the step before
        host = oldest.host
        self.busy_time_s += sum(d - host if d > host else 0.0 for d in plan.durations)
        if inflight:
            self._set_next_boundary()
        else:
            self.next_boundary = INF
        self._on_step_end(self, plan, outcome, now)
        if self.landed:
            polled = oldest.starts[plan.num_steps - 1]
            self._apply_polled(polled if polled > self._empty_poll else self._empty_poll)
        self._empty_poll = -INF
        self._fill()


def _landed_at(completion: tuple[float, int, Request]) -> float:
    return completion[0]


def _completion_order(completion: tuple[float, int, Request]) -> tuple[float, int, int]:
    return completion[0], completion[1], completion[2].request_id
