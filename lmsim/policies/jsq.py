"""vLLM's load balancing: join the shortest queue on batch size (policies.md §1).

The paper's baseline scores `R + Q` (w_run = w_wait = 1). vLLM's real data-parallel balancer
weighs waiting requests 4x (`w_wait=4`) and scans from a fixed start index keeping the first
strict minimum, which is the tie-break used here.
"""

from __future__ import annotations

from ..request import Request
from .base import POLICIES, ClusterView, Policy, argmin_first


@POLICIES.register("vllm")
class VllmJSQ(Policy):
    def __init__(self, *, w_run: float = 1.0, w_wait: float = 1.0) -> None:
        if w_run < 0 or w_wait < 0:
            raise ValueError("w_run and w_wait must be >= 0")
        self.w_run = w_run
        self.w_wait = w_wait

    def choose(self, request: Request, cluster: ClusterView) -> int:
        return argmin_first(
            [self.w_run * v.num_running + self.w_wait * v.num_waiting for v in cluster.instances]
        )
