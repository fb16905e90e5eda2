"""Load-oblivious and plain load baselines: round robin, seeded random, least tokens."""

from __future__ import annotations

from lmsim.engine.request import Request
from lmsim.policies.base import POLICIES, ClusterView, Policy, argmin_first


@POLICIES.register("round_robin")
class RoundRobin(Policy):
    """Cycle through instances 0, 1, ..., N-1 regardless of state."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, cluster: ClusterView) -> int:
        choice = self._next
        self._next = (self._next + 1) % len(cluster.instances)
        return choice


@POLICIES.register("random")
class Random(Policy):
    """Uniformly random instance from the policy's seeded stream."""

    def __init__(self) -> None:
        pass

    def choose(self, request: Request, cluster: ClusterView) -> int:
        return int(self.ctx.rng.integers(len(cluster.instances)))


@POLICIES.register("least_tokens")
class LeastTokens(Policy):
    """Fewest tokens in context (running + waiting); first minimum wins."""

    def __init__(self) -> None:
        pass

    def choose(self, request: Request, cluster: ClusterView) -> int:
        return argmin_first([v.total_tokens for v in cluster.instances])
