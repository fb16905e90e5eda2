"""Load ladders: the stages of inference-perf's load generator and their arrival shapes.

Read from kubernetes-sigs/inference-perf (`inference_perf/loadgen/load_timer.py`,
`load_generator.py`, v0.1-v0.2 and later). A stage has a `rate` and a `duration` and sends
exactly `int(rate x duration)` requests; times are offsets from the stage's start.

- `poisson` (`PoissonLoadTimer.start_timer`): one-second slots; in each, k ~ Poisson(rate);
  a slot with k = 0 sends nothing, otherwise its k requests get exponential gaps rescaled to
  sum to one second (so the k-th lands at the slot's end). Slots continue until the stage
  has its requests, which may run past `duration` when the draws fall short.
- `constant` (`ConstantLoadTimer.start_timer`): despite the name not evenly spaced:
  n = int(rate x duration) exponential gaps of mean 1/rate, rescaled to sum to `duration`
  (the last request lands at the stage's end). Every stored version of the file does this
  (the earliest drew unscaled exponential gaps); the cluster-benchmark README's "evenly
  spaced" is not what the source does.
- `even`: evenly spaced, request i at (i + 1) x duration / n (not an inference-perf shape:
  the strictly periodic client some other tools use, for comparison).

Between stages (`load_generator.py`: the stage loop) the generator waits until every request
of the stage has finished, then sleeps `interval` (1 s default): `lmsim.engine.stages`
replays that barrier. The trace's `arrival_s` is the schedule without the barrier (stage k
nominally starts `sum(duration_j + interval, j < k)`, a Poisson stage that overran its
duration counting to its last request); its meta records the stages (`stage_meta`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmsim.errors import ConfigError

LOAD_TYPES = ("poisson", "constant", "even")
META_STARTS = "stage_starts_s"
META_INTERVAL = "stage_interval_s"
META_BARRIER = "stage_barrier"
DEFAULT_INTERVAL_S = 1.0  # inference-perf LoadConfig.interval


@dataclass(frozen=True)
class Stage:
    rate: float
    duration: float

    @property
    def num_requests(self) -> int:
        return int(self.rate * self.duration)


def parse_stages(stages: Any, *, where: str) -> list[Stage]:
    """`[{rate: R, duration: D}, ...]` as inference-perf's `load.stages` writes it."""
    if not isinstance(stages, list | tuple) or not stages:
        raise ConfigError(f"{where}: stages must be a non-empty list of {{rate, duration}} mappings")
    out = []
    for k, spec in enumerate(stages):
        if not isinstance(spec, dict) or set(spec) != {"rate", "duration"}:
            raise ConfigError(f"{where}: stages[{k}] must be a mapping with exactly rate and duration, got {spec!r}")
        rate, duration = spec["rate"], spec["duration"]
        for name, value in (("rate", rate), ("duration", duration)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{where}: stages[{k}].{name} must be a finite number > 0, got {value!r}")
        stage = Stage(float(rate), float(duration))
        if stage.num_requests < 1:
            raise ConfigError(f"{where}: stages[{k}] sends int(rate x duration) = 0 requests")
        out.append(stage)
    return out


def check_load_type(kind: Any, *, where: str) -> str:
    if kind not in LOAD_TYPES:
        raise ConfigError(f"{where}: load_type must be one of {', '.join(LOAD_TYPES)}, got {kind!r}")
    return str(kind)


def _rescaled_gaps(rng: np.random.Generator, n: int, mean: float, total: float) -> np.ndarray:
    gaps = rng.exponential(mean, n)
    return np.cumsum(gaps * (total / gaps.sum()))


def stage_offsets(rng: np.random.Generator, kind: str, stage: Stage) -> np.ndarray:
    """Send times of a stage's requests, seconds from its start (see the module docstring)."""
    n = stage.num_requests
    if kind == "even":
        return (np.arange(n) + 1) * (stage.duration / n)
    if kind == "constant":
        return _rescaled_gaps(rng, n, 1.0 / stage.rate, stage.duration)
    times: list[np.ndarray] = []
    have = 0
    slot = 0
    while have < n:
        k = int(rng.poisson(stage.rate))
        if k:
            part = slot + _rescaled_gaps(rng, k, 1.0 / k, 1.0)
            times.append(part)
            have += k
        slot += 1
    return np.concatenate(times)[:n]


def ladder(
    rng: np.random.Generator, kind: str, stages: list[Stage], interval_s: float
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """(nominal arrival times, stage of each request, nominal start of each stage): the
    stages back to back with `interval_s` between them, as if each lasted its duration."""
    arrival, stage_of, starts = [], [], []
    start = 0.0
    for k, stage in enumerate(stages):
        offsets = stage_offsets(rng, kind, stage)
        arrival.append(start + offsets)
        stage_of.append(np.full(len(offsets), k, dtype=np.int64))
        starts.append(start)
        start += max(stage.duration, float(offsets[-1])) + interval_s
    return np.concatenate(arrival), np.concatenate(stage_of), starts


def stage_meta(starts: list[float], interval_s: float, barrier: bool) -> dict[str, str]:
    """The trace meta a staged workload carries (read back by `lmsim.engine.stages`)."""
    return {META_STARTS: json.dumps(starts), META_INTERVAL: repr(float(interval_s)), META_BARRIER: "1" if barrier else "0"}
