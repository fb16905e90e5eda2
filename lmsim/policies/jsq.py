"""vLLM's load balancing: join the shortest queue on batch size (policies.md §1)."""

from __future__ import annotations

from lmsim.engine.request import Request
from lmsim.policies._common import argmin_rotating, check_number, id_bound, listed_ids
from lmsim.policies.base import POLICIES, ClusterView, Policy, RouterContext, argmin_first


@POLICIES.register("vllm")
class VllmJSQ(Policy):
    """JSQ on `w_run·R + w_wait·Q` (policies.md §1a/§1b).

    Params:
      w_run=1.0, w_wait=1.0: the paper's baseline scores R + Q (§1a). vLLM's real DP balancer
        is `w_wait=4` (§1b).
      stale_view_s=0.0: 0 reads exact R/Q at decision time. When > 0 the policy keeps its own
        (waiting, running) snapshot per instance id, replaced wholesale every `stale_view_s`
        (vLLM's DP coordinator publishes every 0.1 s; an instance not listed then counts 0),
        and adds 1 to the chosen instance's local waiting count at each dispatch (vLLM's
        optimistic increment, `client_count` = 1).
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
            # by instance id; an instance not listed now publishes nothing (counts 0)
            n = max(self.ctx.num_instances, id_bound(listed_ids(self._cluster, self.ctx.num_instances)))
            waiting, running = [0] * n, [0] * n
            for v in self._cluster.instances:
                waiting[v.instance_id] = v.num_waiting
                running[v.instance_id] = v.num_running
            self._waiting, self._running = waiting, running

    def choose(self, request: Request, cluster: ClusterView) -> int:
        wr, ww = self.w_run, self.w_wait
        if self.stale_view_s > 0:
            first = self._cluster is None
            self._cluster = cluster  # the router's view now: the next publish reads it
            if first:
                self._publish(cluster.now)
            assert self._waiting is not None
            running, waiting = self._running, self._waiting
            scores = [wr * running[i] + ww * waiting[i] for i in listed_ids(cluster, self.ctx.num_instances)]
        else:
            scores = [wr * v.num_running + ww * v.num_waiting for v in cluster.instances]
        if self.start_index == 0:
            return argmin_first(scores)
        return argmin_rotating(scores, self.start_index)

    def on_routed(self, request: Request, instance_id: int) -> None:
        if self._waiting is not None:
            self._waiting[instance_id] += 1
