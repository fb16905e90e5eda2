"""The `schedule` autoscaler: replica counts fixed in advance, per pool and time.

A replay of a known capacity plan (a cron-driven scale-out, the replica counts another
scaler chose) or the scripted scale events of a test. It reads nothing of the observation
but its time.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from lmsim.autoscalers.base import AUTOSCALERS
from lmsim.scaling import Autoscaler, FleetObservation


@AUTOSCALERS.register("schedule")
class ScheduleScaler(Autoscaler):
    """`replicas: {pool: [[time_s, count], ...]}`: from each `time_s` on, the pool's target
    is `count` (until the next entry). Before a pool's first entry the scaler leaves the
    pool as it is. Entries must be in increasing time order, times >= 0, counts >= 0 (the
    engine clamps to the pool's min/max replicas)."""

    def __init__(self, *, replicas: dict[str, Any]) -> None:
        if not isinstance(replicas, dict) or not replicas:
            raise ValueError("param 'replicas' must map a pool name to [[time_s, count], ...]")
        self.steps: dict[str, tuple[list[float], list[int]]] = {}
        for pool, entries in replicas.items():
            where = f"param 'replicas.{pool}'"
            if not isinstance(entries, list) or not entries:
                raise ValueError(f"{where} must be a non-empty list of [time_s, count]")
            times: list[float] = []
            counts: list[int] = []
            for entry in entries:
                if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                    raise ValueError(f"{where}: each entry must be [time_s, count], got {entry!r}")
                t, n = entry
                if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
                    raise ValueError(f"{where}: time_s must be a number >= 0, got {t!r}")
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise ValueError(f"{where}: count must be an integer >= 0, got {n!r}")
                if times and t <= times[-1]:
                    raise ValueError(f"{where}: times must increase, {t} after {times[-1]}")
                times.append(float(t))
                counts.append(n)
            self.steps[str(pool)] = (times, counts)

    def decide(self, observation: FleetObservation) -> dict[str, int]:
        out: dict[str, int] = {}
        for pool, (times, counts) in self.steps.items():
            k = bisect_right(times, observation.time_s) - 1
            if k >= 0:
                out[pool] = counts[k]
        return out
