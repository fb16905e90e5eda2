"""Load-oblivious and plain load baselines: round robin, seeded random, least tokens."""

from __future__ import annotations

from lmsim.engine.request import Request
from lmsim.policies.base import POLICIES, ClusterView, Policy, argmin_first


@POLICIES.register("round_robin")
class RoundRobin(Policy):
    """Cycle through the listed instances in id order regardless of state: the next one is
    the first listed after the last chosen id, wrapping to the lowest, so an instance that
    joins or leaves neither restarts the cycle nor makes it skip one."""

    def __init__(self) -> None:
        self._last = -1  # the instance id chosen last

    def choose(self, request: Request, cluster: ClusterView) -> int:
        instances = cluster.instances
        last = self._last
        choice = 0
        for k, v in enumerate(instances):
            if v.instance_id > last:
                choice = k
                break
        self._last = instances[choice].instance_id
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
