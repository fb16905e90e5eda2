"""Engine invariants checked after every step when `simulation.check` (`--check`) is on.

A violation raises `InvariantError` naming the instance or request, the step and the
simulated time. These checks walk every live request, so they are for tests and debugging,
not for speed.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from lmsim.engine.kv_cache import ANON
from lmsim.engine.metrics import STATUS_NAMES, UNFINISHED
from lmsim.engine.request import Request, RequestState
from lmsim.errors import InvariantError
from lmsim.profile.base import LinearCostModel

if TYPE_CHECKING:
    from lmsim.engine.instance import Instance
    from lmsim.engine.scheduler import StepOutcome, StepPlan


class Simulation(Protocol):
    """What the checks read of a running simulation (the engine's `Simulation`; named here
    as a protocol so that the simulation can import its checks without a cycle)."""

    config: Any
    cost_model: Any
    pool_cost_models: dict[str, Any]
    recorder: Any
    instances: list[Instance]
    live: int
    env: Any

_EPS = 1e-9


def _fail(what: str, instance: Instance | None, step: int, now: float) -> None:
    where = f"instance {instance.instance_id}, " if instance is not None else ""
    raise InvariantError(f"{where}step {step}, t={now:.6f}s: {what}")


_STAMPS = ("arrived_at", "routed_at", "first_scheduled_at", "first_token_at", "finished_at")


def check_step(sim: Simulation, instance: Instance, plan: StepPlan, outcome: StepOutcome, now: float) -> None:
    s = instance.scheduler
    # The step that just ended (the last of a fast-forwarded run), whose end is `now`; so a
    # message reads the same with fast-forward on or off.
    step = plan.start_step + plan.num_steps - 1

    # The step's composition: recount the tokens instead of trusting the plan's counter.
    tokens = plan.num_decodes
    # the threshold is waived only for a request alone in the engine (vLLM 0.33), so any
    # step that schedules two sequences must respect it
    # the pool's configured limits: the truth the scheduler must respect
    limits = instance.pool.engine
    cap = limits["long_prefill_token_threshold"] if plan.num_decodes + len(plan.chunks) > 1 else plan.long_prefill_cap
    for request, q in plan.chunks:
        tokens += q
        if q < 1 or (cap and q > cap):
            _fail(f"request {request.request_id} got a prefill chunk of {q} tokens", instance, step, now)
    if tokens != plan.num_tokens:
        _fail(f"plan reports {plan.num_tokens} tokens but its chunks and decodes add to {tokens}", instance, step, now)
    if tokens > limits["max_num_batched_tokens"]:
        _fail(f"scheduled {tokens} tokens > budget {limits['max_num_batched_tokens']}", instance, step, now)
    if not tokens and not plan.preempted:
        # Only a step whose running requests were all preempted may compute nothing; an
        # empty step otherwise is the start of a livelock (planned again and again).
        _fail("planned a step that computes nothing and preempted nobody", instance, step, now)
    seqs = plan.num_decodes + len(plan.chunks)
    if seqs > limits["max_num_seqs"]:
        _fail(f"scheduled {seqs} sequences > max_num_seqs {limits['max_num_seqs']}", instance, step, now)
    if len(s.running) > limits["max_num_seqs"]:
        _fail(f"{len(s.running)} running > max_num_seqs {limits['max_num_seqs']}", instance, step, now)

    # KV accounting: what requests hold must match the pool.
    held = 0
    refs: dict[int, int] = {}
    for request in s.running:
        held += s._blocks_held(request)
        for key in request.block_keys:
            if key != ANON:
                refs[key] = refs.get(key, 0) + 1
        if request.state is not RequestState.RUNNING:
            _fail(f"request {request.request_id} in running list with state {request.state.name}", instance, step, now)
    for request in s.waiting:
        if request.block_keys and not request.kv_loaded:
            _fail(f"waiting request {request.request_id} holds blocks", instance, step, now)
        if request.state is not RequestState.WAITING:
            _fail(f"request {request.request_id} in waiting queue with state {request.state.name}", instance, step, now)
    # Blocks held outside the running batch: loads in flight, loaded requests waiting for
    # admission, finished requests kept for a reader (lmsim.engine.connector).
    for request in itertools.chain(s.loading, (r for r in s.waiting if r.kv_loaded), s.held):
        held += len(request.block_keys) + request.kv_held_extra
        for key in request.block_keys:
            if key != ANON:
                refs[key] = refs.get(key, 0) + 1
    problems = s.cache.check(held, refs)
    if problems:
        _fail("KV: " + "; ".join(problems), instance, step, now)
    if s.num_decoding != sum(1 for r in s.running if r.decoding):
        _fail("decode count out of sync with the running list", instance, step, now)

    # Timestamps: checked as soon as each one exists (first token), and in full at the end.
    # The TTFT floor is an invariant only for an additive cost model (the linear profile):
    # there, the idle engine's maximal chunks are the cheapest way to prefill. Interpolated
    # tables are not additive (a table clamped below its first grid point charges a 1-token
    # chunk like a 10-token one), so a busy engine's different chunking can legitimately be
    # a little faster than the idle one; the property tests found such a case.
    additive = isinstance(sim.pool_cost_models[instance.pool.name], LinearCostModel)
    for request in outcome.first_tokens:
        _check_stamps(request, 4, instance, step, now)
        if not additive:
            continue
        # tokens a connector loaded were not computed here
        skipped = (request.cached_tokens or 0) + request.kv_external_blocks * s.block_size
        floor = idle_prefill_time(sim, max(1, request.input_tokens - skipped), skipped, instance.pool)
        ttft = request.first_token_at - request.arrived_at
        if ttft < floor * (1 - 1e-9) - _EPS:
            _fail(
                f"request {request.request_id} TTFT {ttft:.6f}s below its idle prefill time {floor:.6f}s",
                instance,
                step,
                now,
            )
    for request in outcome.finished:
        _check_stamps(request, 5, instance, step, now)

    _check_conservation(sim, instance, step, now)


def _check_stamps(request: Request, count: int, instance: Instance, step: int, now: float) -> None:
    """arrived <= routed <= first scheduled <= first token <= finished, for the first
    `count` of them, all present and none in the future."""
    rid = request.request_id
    previous: tuple[str, float] | None = None
    for name in _STAMPS[:count]:
        t = getattr(request, name)
        if t is None:
            _fail(f"request {rid} has no {name}", instance, step, now)
        if previous is not None and t < previous[1] - _EPS:
            _fail(f"request {rid} {name} {t:.6f}s before {previous[0]} {previous[1]:.6f}s", instance, step, now)
        if t > now + _EPS:
            _fail(f"request {rid} {name} {t:.6f}s is in the future", instance, step, now)
        previous = (name, t)


def _check_conservation(sim: Simulation, instance: Instance | None, step: int, now: float) -> None:
    """Every arrived request that is neither finished nor rejected sits on exactly one
    instance (running or waiting), the one it was routed to; nothing else does."""
    status = sim.recorder.status
    where: dict[int, int] = {}
    for inst in sim.instances:
        s = inst.scheduler
        for request in itertools.chain(s.running, s.waiting, s.loading):
            rid = request.request_id
            if rid in where:
                _fail(f"request {rid} listed twice (instances {where[rid]} and {inst.instance_id})", instance, step, now)
            where[rid] = inst.instance_id
            if request.instance_id != inst.instance_id:
                _fail(f"request {rid} routed to instance {request.instance_id} but queued on {inst.instance_id}", instance, step, now)
            if status[rid] != UNFINISHED:
                _fail(f"request {rid} is {STATUS_NAMES[int(status[rid])]} but still on instance {inst.instance_id}", instance, step, now)
    live = np.flatnonzero(status == UNFINISHED)
    if len(live) != len(where):
        lost = next(int(r) for r in live if int(r) not in where)
        _fail(f"request {lost} arrived and is not done but is on no instance", instance, step, now)
    if sim.live != len(live):
        _fail(f"the live counter says {sim.live} but {len(live)} arrived requests are not done", instance, step, now)


def idle_prefill_time(sim: Simulation, uncached: int, cached: int, pool: Any = None) -> float:
    """Time to prefill `uncached` tokens after `cached` ones on an otherwise idle engine
    (where `long_prefill_token_threshold` does not apply: the request is alone), on a
    `pool` as configured (default: the cluster's first)."""
    pool = pool if pool is not None else sim.instances[0].pool
    budget = pool.engine["max_num_batched_tokens"]
    cost_model = sim.pool_cost_models[pool.name]
    total = 0.0
    done = cached
    left = uncached
    while left > 0:
        q = min(left, budget)
        total += cost_model.step_time([(q, done)], 0, 0)
        done += q
        left -= q
    return total


def check_end(sim: Simulation) -> None:
    _check_conservation(sim, None, max((i.scheduler.steps_done for i in sim.instances), default=0), sim.env.now)
    for instance in sim.instances:
        s = instance.scheduler
        if s.loading or s.held:
            _fail(
                f"at the end {len(s.loading)} loads are in flight and {len(s.held)} finished requests hold blocks",
                instance,
                s.steps_done,
                sim.env.now,
            )
        if s.is_idle and s.cache.num_free_blocks != s.cache.num_total_blocks:
            _fail(
                f"idle at the end with {s.cache.num_total_blocks - s.cache.num_free_blocks} blocks still in use",
                instance,
                s.steps_done,
                sim.env.now,
            )
