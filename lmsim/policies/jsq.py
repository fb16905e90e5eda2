"""vLLM's load balancing: join the shortest queue on batch size (policies.md §1)."""

from __future__ import annotations

from lmsim.engine.request import Request
from lmsim.policies._common import argmin_rotating, check_number
from lmsim.policies.base import POLICIES, ClusterView, Policy, RouterContext, argmin_first


@POLICIES.register("vllm")
class VllmJSQ(Policy):
    """JSQ on `w_run·R + w_wait·Q` (policies.md §1a/§1b).

    Params:
      w_run=1.0, w_wait=1.0: the paper's baseline scores R + Q (§1a). vLLM's real DP balancer
        is `w_wait=4` (§1b).
      stale_view_s=0.0: 0 reads exact R/Q at decision time. When > 0 the policy keeps its own
        (waiting, running) snapshot, replaced wholesale every `stale_view_s` (vLLM's DP
        coordinator publishes every 0.1 s), and adds 1 to the chosen instance's local waiting
        count at each dispatch (vLLM's optimistic increment, `client_count` = 1).
      start_index=0: the fixed scan start of vLLM's API-server client.
    Tie-break: the first strict minimum scanning from `start_index` (vLLM's).
    Deviation: vLLM publishes only when stats changed (else every 5 s); here the snapshot is
    refreshed every period regardless, which is the same as long as load changes.
    """

    def __init__(
        self,
        *,
        w_run: float = 1.0,
        w_wait: float = 1.0,
        stale_view_s: float = 0.0,
        start_index: int = 0,
    ) -> None:
        self.w_run = check_number("w_run", w_run, lo=0)
        self.w_wait = check_number("w_wait", w_wait, lo=0)
        self.stale_view_s = check_number("stale_view_s", stale_view_s, lo=0)
        self.start_index = check_number("start_index", start_index, lo=0, integer=True)
        self._cluster: ClusterView | None = None
        self._waiting: list[int] | None = None
        self._running: list[int] = []

    def bind(self, ctx: RouterContext) -> None:
        super().bind(ctx)
        if self.stale_view_s > 0:
            ctx.every(self.stale_view_s, self._publish)

    def _publish(self, now: float) -> None:
        if self._cluster is not None:
            inst = self._cluster.instances
            self._waiting = [v.num_waiting for v in inst]
            self._running = [v.num_running for v in inst]

    def choose(self, request: Request, cluster: ClusterView) -> int:
        wr, ww = self.w_run, self.w_wait
        if self.stale_view_s > 0:
            if self._cluster is None:
                self._cluster = cluster
                self._publish(cluster.now)
            assert self._waiting is not None
            scores = [wr * r + ww * q for r, q in zip(self._running, self._waiting)]
        else:
            scores = [wr * v.num_running + ww * v.num_waiting for v in cluster.instances]
        if self.start_index == 0:
            return argmin_first(scores)
        return argmin_rotating(scores, self.start_index)

    def on_routed(self, request: Request, instance_id: int) -> None:
        if self._waiting is not None:
            self._waiting[instance_id] += 1
