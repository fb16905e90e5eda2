"""Engine invariants checked after every step when `simulation.check` (`--check`) is on.

A violation raises `InvariantError` naming the instance or request, the step and the
simulated time. These checks walk every live request, so they are for tests and debugging,
not for speed.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from .errors import InvariantError
from .request import RequestState

if TYPE_CHECKING:
    from .instance import Instance
    from .scheduler import StepOutcome, StepPlan
    from .simulation import Simulation

_EPS = 1e-9


def _fail(what: str, instance: Instance | None, step: int, now: float) -> None:
    where = f"instance {instance.instance_id}, " if instance is not None else ""
    raise InvariantError(f"{where}step {step}, t={now:.6f}s: {what}")


def check_step(sim: Simulation, instance: Instance, plan: StepPlan, outcome: StepOutcome, now: float) -> None:
    s = instance.scheduler
    step = plan.start_step
    cfg = sim.config.cluster
    if plan.num_tokens > cfg.max_num_batched_tokens:
        _fail(f"scheduled {plan.num_tokens} tokens > budget {cfg.max_num_batched_tokens}", instance, step, now)
    if len(s.running) > cfg.max_num_seqs:
        _fail(f"{len(s.running)} running > max_num_seqs {cfg.max_num_seqs}", instance, step, now)

    # KV accounting: what requests hold must match the pool.
    held = 0
    refs: dict[int, int] = {}
    for request in s.running:
        held += s._blocks_held(request)
        for key in request.block_keys:
            if key >= 0:
                refs[key] = refs.get(key, 0) + 1
        if request.state is not RequestState.RUNNING:
            _fail(f"request {request.request_id} in running list with state {request.state.name}", instance, step, now)
    for request in s.waiting:
        if request.block_keys:
            _fail(f"waiting request {request.request_id} holds blocks", instance, step, now)
        if request.state is not RequestState.WAITING:
            _fail(f"request {request.request_id} in waiting queue with state {request.state.name}", instance, step, now)
    problems = s.cache.check(held, refs)
    if problems:
        _fail("KV: " + "; ".join(problems), instance, step, now)
    ids = [r.request_id for r in s.running] + [r.request_id for r in s.waiting]
    if len(ids) != len(set(ids)):
        _fail("a request is both running and waiting, or listed twice", instance, step, now)
    if s.num_decoding != sum(1 for r in s.running if r.decoding):
        _fail("decode count out of sync with the running list", instance, step, now)

    for request in outcome.finished:
        stamps = [
            request.arrived_at,
            request.routed_at,
            request.first_scheduled_at,
            request.first_token_at,
            request.finished_at,
        ]
        if any(t is None for t in stamps) or any(b < a - _EPS for a, b in itertools.pairwise(stamps)):
            _fail(f"request {request.request_id} timestamps not monotone: {stamps}", instance, step, now)
        floor = idle_prefill_time(sim, request.input_tokens - (request.cached_tokens or 0), request.cached_tokens or 0)
        ttft = request.first_token_at - request.arrived_at
        if ttft < floor * (1 - 1e-9) - _EPS:
            _fail(
                f"request {request.request_id} TTFT {ttft:.6f}s below its idle prefill time {floor:.6f}s",
                instance,
                step,
                now,
            )

    in_system = sum(len(i.scheduler.running) + len(i.scheduler.waiting) for i in sim.instances)
    if in_system != sim.live:
        _fail(f"{in_system} requests in instances but {sim.live} arrived and not done", None, step, now)


def idle_prefill_time(sim: Simulation, uncached: int, cached: int) -> float:
    """Time to prefill `uncached` tokens after `cached` ones on an otherwise idle engine."""
    budget = sim.config.cluster.max_num_batched_tokens
    threshold = sim.config.cluster.long_prefill_token_threshold
    total = 0.0
    done = cached
    left = uncached
    while left > 0:
        q = min(left, budget, threshold) if threshold else min(left, budget)
        total += sim.cost_model.step_time([(q, done)], 0, 0)
        done += q
        left -= q
    return total


def check_end(sim: Simulation) -> None:
    for instance in sim.instances:
        s = instance.scheduler
        if s.is_idle and s.cache.num_free_blocks != s.cache.num_total_blocks:
            _fail(
                f"idle at the end with {s.cache.num_total_blocks - s.cache.num_free_blocks} blocks still in use",
                instance,
                s.steps_done,
                sim.env.now,
            )
