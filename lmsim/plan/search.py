"""The search: for each design the fewest instances whose simulated fleet meets the SLO.

1. Count search. For a fixed design, meeting the SLO is monotone in the instance count (more
   instances of the same kind under the same router only take load off each), so each design's
   answer is found by doubling from a start until a count meets it (or the GPU budget stops
   the doubling), then bisecting between the largest failing and smallest meeting count;
   from a start that already meets it, by halving down first. Every probe is kept: a count
   known to meet (fail) settles every larger (smaller) one.
   A search started from an earlier answer gallops from it instead (start +- 1, 3, 7, ...).
2. Screening (successive halving). Every design is first searched on a short slice of the
   workload (`search.screen_requests`, the first N requests at the stated rate); each rung keeps
   the `keep` share with the lowest objective (ties with the last kept one, within
   `tie_margin`, stay too) and starts the next, longer rung at its answer. Only the survivors
   are searched on the full workload; what a design was dropped on is recorded.
3. Seeds. The `finalists` cheapest designs are searched again under every seed of
   `search.seeds` (a generated workload is drawn again, a random router draws again), each
   starting at its full-length answer; the answer is then the range over seeds. Two designs
   whose ranges overlap are a tie, reported as one.

Probes run in rounds: each unfinished search proposes its next count, the round runs on the
executor in parallel, and the answers update the searches."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lmsim.plan.design import Design


@dataclass
class CountSearch:
    """Smallest count in [low, cap] meeting the SLO, from a `start` guess."""

    design: Design
    low: int
    cap: int
    start: int
    informed: bool = False  # the start is an earlier answer, not a blind guess
    meets: int | None = None  # smallest count known to meet
    fails: int = 0  # largest count known to fail (low - 1: none)
    probes: dict[int, dict[str, Any]] = field(default_factory=dict)
    at_budget: dict[str, Any] | None = None  # a whole run at the cap when nothing is feasible

    def __post_init__(self) -> None:
        self.fails = self.low - 1
        self.start = min(max(self.start, self.low), self.cap)

    @property
    def done(self) -> bool:
        return self.next_count() is None

    @property
    def answer(self) -> int | None:
        return self.meets

    def next_count(self) -> int | None:
        # From a blind start the count doubles (halves) until the answer is bracketed. From an
        # informed start (a shorter slice's or another seed's answer, usually right or a few
        # off) it gallops instead: start +- 1, 3, 7, ... so a near miss costs a probe or two.
        steps = len(self.probes)
        if self.meets is not None:
            if self.meets - self.fails <= 1:
                return None
            if self.fails < self.low:  # nothing failing known yet: go down
                if self.informed:
                    return max(self.low, self.start - (2**steps - 1))
                return max(self.low, min(self.meets - 1, self.meets // 2))
            return (self.fails + self.meets) // 2
        if self.fails >= self.cap:
            return None  # infeasible within the budget
        if not self.probes:
            return self.start
        if self.informed:
            return min(self.cap, self.start + (2**steps - 1))
        return min(self.cap, max(self.fails * 2, self.fails + 1))

    def record(self, n: int, probe: dict[str, Any]) -> None:
        self.probes[n] = probe
        if probe["met"]:
            self.meets = n if self.meets is None else min(self.meets, n)
        else:
            self.fails = max(self.fails, n)


@dataclass
class Stage:
    """One pass of count searches (a screening rung, the full runs, or a seed) and its cost."""

    name: str
    limit: int | None
    seed: int
    searches: dict[str, CountSearch] = field(default_factory=dict)
    probes_run: int = 0
    probes_reused: int = 0
    wall_s: float = 0.0


def drive(
    stage: Stage,
    make_task: Callable[[Design, int, int | None, int], dict[str, Any]],
    lookup: Callable[[str], dict[str, Any] | None],
    execute: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    log: Callable[[str], None],
) -> None:
    """Run the stage's searches to the end, a round at a time."""
    while True:
        wanted: list[tuple[CountSearch, int, dict[str, Any]]] = []
        for search in stage.searches.values():
            n = search.next_count()
            if n is None:
                continue
            task = make_task(search.design, n, stage.limit, stage.seed)
            known = lookup(task["key"])
            if known is not None:
                search.record(n, known)
                stage.probes_reused += 1
                continue
            wanted.append((search, n, task))
        if not wanted:
            if all(s.done for s in stage.searches.values()):
                return
            continue  # reused probes moved searches on: ask again
        results = {r["key"]: r for r in execute([t for _, _, t in wanted])}
        for search, n, task in wanted:
            result = results[task["key"]]
            if not result["ok"]:
                from lmsim.errors import ConfigError

                raise ConfigError(f"{search.design.label} at {n} instances: {result['error']}")
            search.record(n, result)
            stage.probes_run += 1
            stage.wall_s += result["wall_s"]
        log(f"plan: {stage.name}: {stage.probes_run} probes run, "
            f"{sum(s.done for s in stage.searches.values())}/{len(stage.searches)} designs settled")  # fmt: skip


def objective_value(design: Design, n: int | None, objective: str) -> float:
    if n is None:
        return math.inf
    if objective == "cost":
        cost = design.cost_per_hour(n)
        return math.inf if cost is None else cost
    return float(design.gpus(n))


def screen(stage: Stage, keep: float, tie_margin: float, objective: str) -> tuple[list[str], dict[str, str]]:
    """The labels a rung keeps and, for each dropped one, the evidence."""
    ranked = sorted(stage.searches.values(),
                    key=lambda s: (objective_value(s.design, s.answer, objective), s.design.label))  # fmt: skip
    count = max(1, math.ceil(keep * len(ranked)))
    threshold = objective_value(ranked[count - 1].design, ranked[count - 1].answer, objective)
    kept, dropped = [], {}
    unit = "$/h" if objective == "cost" else "GPUs"
    for s in ranked:
        value = objective_value(s.design, s.answer, objective)
        if math.isfinite(value) and value <= threshold * (1 + tie_margin) + 1e-9:
            kept.append(s.design.label)
        elif s.answer is None:
            dropped[s.design.label] = (f"{stage.name}: no count within the budget met the SLO "
                                       f"({_worst_failure(s)})")  # fmt: skip
        else:
            dropped[s.design.label] = (f"{stage.name}: needs {s.design.gpus(s.answer)} GPUs "
                                       f"({_fmt(value)} {unit}) where the kept ones need at most {_fmt(threshold)} {unit}")  # fmt: skip
    return kept, dropped


def _fmt(value: float) -> str:
    return f"{value:.2f}" if value != int(value) else f"{int(value)}"


def _worst_failure(search: CountSearch) -> str:
    if not search.probes:
        return "not probed"
    n = max(search.probes)
    probe = search.probes[n]
    return f"at {search.design.gpus(n)} GPUs: {failure_text(probe)}"


def failure_text(probe: dict[str, Any]) -> str:
    """Which bounds a probe failed, by how much: `ttft_p99_s 3.1 s > 2 s (+55%)`."""
    parts = []
    early = str(probe.get("early") or "")
    for key, item in sorted(probe.get("judged", {}).items()):
        value, limit, met = item["value"], item["limit"], item["met"]
        if met or (early.startswith("failed") and early != f"failed: {key}" and (value is None or value >= 1e11)):
            continue  # met, or left undecided by a run stopped for another bound
        if key == "attainment":
            shown = "none" if value is None else f"{value:.3f}"
            parts.append(f"attainment {shown} < {limit:g}")
        elif value is None or value >= 1e11:
            parts.append(f"{key}: more requests over {limit:g} s than the percentile allows"
                         + (f" (certain after {probe['stopped_at_s']:.0f} s simulated)" if early
                            else " (some left unfinished)"))
        else:
            parts.append(f"{key} {value:.3g} s > {limit:g} s (+{100 * (value / limit - 1):.0f}%)")
    return "; ".join(parts) or "met"
