"""Shared helpers for the policy families: parameter checks, router-local counters, picks.

Parameter checks raise `ValueError` with one line naming the parameter, the allowed values and
what was given; the registry prefixes the policy name ("policy 'bailian': param 'lambda' must
be in [0, 1], got 1.5").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lmsim.engine.request import Request
from lmsim.routing import (
    argmin_first,
    argmin_random,
    capped_blocks,
    check_bool,
    check_choice,
    check_number,
)

__all__ = ["capped_blocks", "check_bool", "check_choice", "check_number"]  # re-exported for the families


def listed_ids(cluster: Any, num_instances: int) -> Sequence[int]:
    """The instance ids of `cluster.instances`, by position: what a policy keys its own
    per-instance state by (the listed instances may be a subset of the `num_instances`
    allocated, so a position is not an id; `lmsim.routing`). When all are listed the ids
    are 0..num_instances-1 in order, `range(num_instances)`, read without the views."""
    instances = cluster.instances
    if len(instances) == num_instances:
        return range(num_instances)
    return [v.instance_id for v in instances]


def id_bound(ids: Sequence[int]) -> int:
    """One more than the largest of `ids` (0 for none): how long a list by id must be."""
    if type(ids) is range:
        return len(ids)
    return max(ids) + 1 if ids else 0


class InflightCounter:
    """Router-local in-flight requests per instance id: +1 at dispatch, -1 at completion.

    This is the `load` of SGLang / vLLM-router and AIBrix's `realtime_num_requests_running`
    (policies.md §0): exact at dispatch, but it counts requests the router sent, not engine
    R/Q. Keyed by request id so a duplicate or missing `on_finished` cannot drift the count.
    """

    __slots__ = ("_where", "counts")

    def __init__(self) -> None:
        self.counts: list[int] = []
        self._where: dict[int, int] = {}

    def ensure(self, n: int) -> None:
        if len(self.counts) < n:
            self.counts.extend([0] * (n - len(self.counts)))

    def of(self, ids: Sequence[int]) -> list[int]:
        """The counts of the instances `ids` (a listed subset, by position)."""
        self.ensure(id_bound(ids))
        counts = self.counts
        if type(ids) is range:  # every instance listed: positions are ids
            return counts[: len(ids)]
        return [counts[i] for i in ids]

    def routed(self, request: Request, instance_id: int) -> None:
        self.ensure(instance_id + 1)
        self.counts[instance_id] += 1
        self._where[request.request_id] = instance_id

    def finished(self, request: Request) -> None:
        iid = self._where.pop(request.request_id, None)
        if iid is not None:
            self.counts[iid] -= 1


def argmin_rotating(scores: Sequence[float], start: int) -> int:
    """First strict minimum scanning from `start` (wrapping): vLLM's tie-break with a moving
    start index."""
    n = len(scores)
    best = start % n
    best_score = scores[best]
    for k in range(1, n):
        i = (start + k) % n
        if scores[i] < best_score:
            best, best_score = i, scores[i]
    return best


def pick_min(scores: Sequence[Any], tie_break: str, rng: np.random.Generator, start: int = 0) -> int:
    """argmin with a named tie-break: 'random' (seeded), 'first' (lowest id) or 'rotate'."""
    if tie_break == "random":
        return argmin_random(scores, rng)
    if tie_break == "rotate":
        return argmin_rotating(scores, start)
    return argmin_first(scores)


def estimator_cost_models(ctx: Any, profile: Any) -> list[Any]:
    """The step-cost model a predictive policy prices each instance with, by id: each
    instance's own (a well-tuned simulator; in a mixed fleet every pool's own profile)
    unless the policy names another profile (an untuned one, then used for all)."""
    if profile is None:
        return list(ctx.cost_models)
    model = ctx.load_cost_model(profile)
    return [model] * ctx.num_instances
