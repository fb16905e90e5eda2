"""The contract between the engine and the autoscalers: what a scaler observes and how it
answers. It sits below both, as `lmsim.routing` does for policies: the engine scrapes the
fleet and calls a scaler object it is handed (the study layer composes the run and creates
the scaler from the registry in `lmsim.autoscalers`), and the scalers implement `Autoscaler`
against the observations below, so neither package imports the other's internals.

An autoscaler is one class registered by name in `lmsim.autoscalers.AUTOSCALERS`; its
keyword-only constructor arguments are its YAML `autoscaler.params`. Every
`autoscaler.interval_s` of simulated time the engine calls `decide(observation)` with what a
real autoscaler could read at that moment: the metrics scraped `autoscaler.metrics_delay_s`
ago (a Prometheus scrape and its query lag), never the live engine state. The answer is the
desired replica count per pool (pools left out keep their target); the engine clamps it to
the pool's `[min_replicas, max_replicas]`, starts instances (they take the pool's start-up
time before the router sees them) and drains the newest active ones to scale down.

Parameter checks raise `ValueError` with one line naming the parameter, as policies do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PoolObservation:
    """One pool as a scrape saw it, and the traffic its front end reported over the last
    adjustment interval (what Dynamo's planner reads from the frontend's Prometheus metrics:
    request count, mean ISL/OSL, mean TTFT and ITL)."""

    pool: str
    role: str  # both | prefill | decode
    gpu: str  # the profile's GPU ("NVIDIA H20 96GB"), for pricing and per-GPU capacity
    gpus_per_instance: int
    min_replicas: int
    max_replicas: int
    target: int  # the replica count last asked for
    active: int  # instances the router can send to
    starting: int  # loading the model (and warming), not yet routable
    draining: int  # finishing what they hold, taking nothing new
    failed: int  # crashed and not yet restarted
    num_running: int  # summed over active instances
    num_waiting: int
    kv_usage: float  # mean over active instances, 0..1
    # traffic over the interval (requests that arrived / finished in it)
    num_requests: int
    request_rate: float  # req/s
    mean_input_tokens: float
    mean_output_tokens: float
    ttft_mean_s: float | None  # of requests whose first token came in the interval
    itl_mean_s: float | None
    # prompt tokens of the requests that finished in the interval (Dynamo's offline replay
    # averages its window's ISL over those: see autoscalers/sla_planner.py, isl_from)
    mean_finished_input_tokens: float = float("nan")


@dataclass(frozen=True)
class FleetObservation:
    time_s: float  # when the scaler decides
    scraped_at_s: float  # when the metrics were read (time_s - metrics delay)
    interval_s: float
    pools: dict[str, PoolObservation] = field(default_factory=dict)


class ScalerContext:
    """What a scaler may use besides the observations, handed over once in `bind`: the
    pools it manages (name -> PoolObservation-shaped facts at the start) and each pool's
    step cost model (for scalers that price capacity, like Dynamo's planner)."""

    pools: dict[str, Any]
    cost_models: dict[str, Any]
    # pool -> {max_num_batched_tokens, max_num_seqs, max_kv_tokens} of its engines
    engine_limits: dict[str, dict[str, int]]
    interval_s: float

    def record_event(self, kind: str, **fields: Any) -> None:  # pragma: no cover
        raise NotImplementedError


class Autoscaler:
    """Base class: subclasses implement `decide`."""

    registry_name = "?"

    def bind(self, ctx: ScalerContext) -> None:
        self.ctx = ctx

    def decide(self, observation: FleetObservation) -> dict[str, int]:  # pragma: no cover
        raise NotImplementedError


__all__ = ["Autoscaler", "FleetObservation", "PoolObservation", "ScalerContext"]
