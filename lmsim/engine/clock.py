"""Scheduling callbacks on the SimPy clock at exact absolute times.

SimPy schedules at `now + delay`; in floating point `now + (t - now)` is not always `t`.
The engine computes step boundaries by accumulating step durations and must put events
exactly there, so that replaying steps one at a time and fast-forwarding runs of steps land
on bit-identical times. This is the only module that touches SimPy's event queue directly.

Priorities order events that share a timestamp; the order is part of the semantics:
a step that ends at time t is committed (and the next one planned) before requests arriving
at t are routed, and idle instances wake up only after every arrival at t is queued.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush
from typing import Any

import simpy

STEP_END = 0
ARRIVAL = 1
WAKE = 2
SAMPLE = 3


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
