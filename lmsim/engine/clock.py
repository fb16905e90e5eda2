"""Scheduling callbacks on the SimPy clock at exact absolute times.

SimPy schedules at `now + delay`; in floating point `now + (t - now)` is not always `t`.
The engine computes step boundaries by accumulating step durations and must put events
exactly there, so that replaying steps one at a time and fast-forwarding runs of steps land
on bit-identical times. This is the only module that touches SimPy's event queue directly.

Priorities order events that share a timestamp; the order is part of the semantics:
a step that ends at time t is committed (and the next one planned) before requests arriving
at t are routed, and idle instances wake up only after every arrival at t is queued.
Requests whose prefill leg ended at t join their decode queues (HANDOVER) after every step
ending at t and before the arrivals at t: the hand-over is part of the prefill step's end,
deferred only until all steps ending at t have planned. Sharing ARRIVAL's priority, a
hand-over and an arrival at the same instant (a closed-loop successor released by a step
ending at t) would go in the order their events were created, that is in the order the
steps ending at t happened to be scheduled, which differs between fast-forwarded runs and
one-by-one stepping.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush
from typing import Any

import simpy

STEP_END = 0
HANDOVER = 1
ARRIVAL = 2
WAKE = 3
SAMPLE = 4


def schedule_at(
    env: simpy.Environment, time: float, priority: int, callback: Callable[[Any], None]
) -> simpy.Event:
    if time < env.now:
        raise ValueError(f"cannot schedule in the past: {time} < {env.now}")
    event = simpy.Event(env)
    event.callbacks.append(callback)
    event._ok = True
    event._value = None
    heappush(env._queue, (time, priority, next(env._eid), event))
    return event


def stop_run() -> None:
    """End the `env.run()` under way, from inside an event callback: for a periodic check that
    has seen enough (the planner's early stop, lmsim.plan.slo). The caller records the stop
    time (`Simulation.last_activity_s`) first."""
    raise simpy.core.StopSimulation(None)
