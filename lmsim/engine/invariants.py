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
    kv_tiers: dict[int, Any]  # instance id -> its lower KV tiers (lmsim.engine.kv_tiers)
    recorder: Any
    instances: list[Instance]
    live: int
    env: Any
    disagg: Any  # lmsim.engine.disagg.Disaggregation, or None

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
    if s._longest is not None and s.num_decoding:
        # the longest decode's KV offset, kept incrementally, against a recount
        offsets = [r.input_tokens - r.decode_base for r in s.running if r.decoding]
        if s._longest.longest() != max(offsets) or len(s._longest) != len(offsets):
            _fail(f"longest decode offset {s._longest.longest()} but the decoding requests' is {max(offsets)}",
                  instance, step, now)

    # Timestamps: checked as soon as each one exists (first token), and in full at the end.
    # The TTFT floor is an invariant only for an additive cost model (the linear profile):
    # there, the cheapest way to prefill is known (`least_prefill_time`). Interpolated
    # tables are not additive (a table clamped below its first grid point charges a 1-token
    # chunk like a 10-token one), so a busy engine's different chunking can legitimately be
    # a little faster than the idle one; the property tests found such a case.
    for request in outcome.first_tokens:
        _check_stamps(request, 4, instance, step, now)
        _check_handoff_stamps(sim, request, instance, step, now)
        floor = _ttft_floor(sim, request, instance)
        if floor is None:
            continue
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


def _ttft_floor(sim: Simulation, request: Request, instance: Instance) -> float | None:
    """The least TTFT `request` could have had, or None when the cost models are not
    additive (see check_step).

    A request handed over from a prefill instance: its prefill there (after the prefill
    instance's hit and what its lower tiers loaded), the transfer at full bandwidth after its
    latency, then the decode instance's step computing the last token (a transfer brings every
    other prompt token, the partial last block too). Otherwise: the prefill here after the hit
    and whatever a connector loaded. Tokens brought in are at most all but the last one,
    which is always computed (scheduler `_loaded_tokens`)."""
    s = instance.scheduler
    bs = s.block_size
    rid = request.request_id
    handoffs = sim.recorder.handoffs
    if handoffs is not None and instance.pool.role == "decode" and handoffs.prefill_instance_id[rid] >= 0:
        source = sim.instances[int(handoffs.prefill_instance_id[rid])].pool
        if not all(isinstance(sim.pool_cost_models[p.name], LinearCostModel) for p in (source, instance.pool)):
            return None
        # the leg's admission facts, folded into the request (disagg `_fold`)
        tiers = max(request.kv_hit_tokens_host, 0) + max(request.kv_hit_tokens_disk, 0)
        hit = min(_best_hit(request) + tiers, request.input_tokens - 1)
        floor = least_prefill_time(sim, request.input_tokens - hit, hit, source)
        nbytes = int(handoffs.kv_transfer_bytes[rid])
        if nbytes > 0:
            link = sim.config.cluster.transfer
            floor += link.latency_s + nbytes / link.bandwidth_bytes_s
        return floor + least_prefill_time(sim, 1, request.input_tokens - 1, instance.pool)
    if not isinstance(sim.pool_cost_models[instance.pool.name], LinearCostModel):
        return None
    # tokens a connector loaded were not computed here
    skipped = min(_best_hit(request) + request.kv_external_blocks * bs, request.input_tokens - 1)
    return least_prefill_time(sim, request.input_tokens - skipped, skipped, instance.pool)


def _best_hit(request: Request) -> int:
    """At most the prefix hit of the admission that produced the first token. `cached_tokens`
    is the first admission's; a request preempted before its first token is admitted again
    and may then hit more (a prefix another request has meanwhile computed or received), so
    the sum of every admission's hit bounds it instead: a lower floor, still a floor."""
    first = request.cached_tokens or 0
    return max(first, request.lookup_hit_tokens) if request.num_preemptions else first


def _check_handoff_stamps(sim: Simulation, request: Request, instance: Instance, step: int, now: float) -> None:
    """prefill done <= transfer start <= transfer landed <= first token (decode side)."""
    handoffs = sim.recorder.handoffs
    rid = request.request_id
    if handoffs is None or instance.pool.role != "decode" or handoffs.prefill_instance_id[rid] < 0:
        return
    done, start, took = handoffs.prefill_done_at[rid], handoffs.kv_transfer_start_at[rid], handoffs.kv_transfer_s[rid]
    if np.isnan(start):  # its leg lost its KV to a preemption: recomputed here, no transfer
        start, took = done, 0.0
    if not done <= start <= start + took <= request.first_token_at + _EPS:
        _fail(
            f"request {rid}: prefill done {done:.6f}s, transfer from {start:.6f}s for {took:.6f}s, "
            f"first token {request.first_token_at:.6f}s are out of order",
            instance, step, now,
        )


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
    instance (running or waiting), the one it was routed to, or is still in the front end;
    nothing else does."""
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
    if sim.disagg is not None:
        from lmsim.engine.disagg import HANDING

        # between its prefill's end and its place in the decode queue (the same instant) a
        # request is where its held KV is
        for rid, h in sim.disagg.handoffs.items():
            if h.state == HANDING:
                if rid in where:
                    _fail(f"request {rid} listed twice (instances {where[rid]} and {h.prefill_id})", instance, step, now)
                where[rid] = h.prefill_id
    for rid in getattr(sim, "in_front_end", ()):
        # sent, still in the client-side front end (lmsim.engine.frontend)
        where[rid] = -1
    fleet = getattr(sim, "fleet", None)
    if fleet is not None:
        _check_fleet(sim, fleet, where, instance, step, now)
    live = np.flatnonzero(status == UNFINISHED)
    if len(live) != len(where):
        lost = next(int(r) for r in live if int(r) not in where)
        _fail(f"request {lost} arrived and is not done but is on no instance", instance, step, now)
    if sim.live != len(live):
        _fail(f"the live counter says {sim.live} but {len(live)} arrived requests are not done", instance, step, now)
    if sim.disagg is not None:
        _check_handoffs(sim, instance, step, now)


def _check_fleet(sim: Simulation, fleet: Any, where: dict[int, int], instance: Instance | None, step: int,
                 now: float) -> None:
    """A changing fleet (lmsim.engine.fleet): a request lost and waiting to be sent again is
    on no instance (it counts as where it is); an instance that is not serving (stopped,
    starting, warming, failed) holds no request and no block; the router lists exactly the
    active instances and the crashed ones not yet detected."""
    from lmsim.engine.fleet import ACTIVE, DRAINING, FAILED, STATE_NAMES

    for rid in sorted(fleet.pending):
        if rid in where:
            _fail(f"request {rid} waits to be sent again but is on instance {where[rid]}", instance, step, now)
        where[rid] = -1
    for inst in sim.instances:
        i = inst.instance_id
        state = fleet.state[i]
        if state in (ACTIVE, DRAINING):
            continue
        s = inst.scheduler
        held = len(s.running) + len(s.waiting) + len(s.loading) + len(s.held)
        used = s.cache.num_total_blocks - s.cache.num_free_blocks
        if held or used or s.cache.cached_hashes:
            _fail(
                f"instance {i} is {STATE_NAMES[state]} but holds {held} requests, {used} used blocks and "
                f"{len(s.cache.cached_hashes)} cached blocks", instance, step, now,
            )
    expected = [i for i, state in enumerate(fleet.state) if state == ACTIVE or (state == FAILED and i in fleet.undetected)]
    if fleet.routable != expected:
        _fail(f"the router lists instances {fleet.routable}, expected {expected}", instance, step, now)


def _check_handoffs(sim: Simulation, instance: Instance | None, step: int, now: float) -> None:
    """Every KV a prefill instance holds is being read by (or about to be offered to) the
    decode instance of its request; every load on a decode instance is such a transfer (or
    one from the instance's own lower KV tiers); a
    handoff past its prefill has its leg held on its prefill instance."""
    from lmsim.engine.disagg import PREFILLING, TRANSFERRING

    handoffs = sim.disagg.handoffs
    for inst in sim.instances:
        s = inst.scheduler
        # completions that have landed and wait for the instance's next connector poll
        landed = {id(request) for _at, _kind, request in inst.landed}
        if inst.pool.role == "prefill":
            for leg in s.held:
                if id(leg) in landed:
                    continue
                h = handoffs.get(leg.request_id)
                if h is None or h.leg is not leg or h.prefill_id != inst.instance_id or h.state == PREFILLING:
                    _fail(f"prefill instance {inst.instance_id} holds request {leg.request_id}'s KV for no handoff", instance, step, now)
        tier = sim.kv_tiers.get(inst.instance_id)
        for request in s.loading:
            if tier is not None and request.request_id in tier.loading_ids:
                continue  # a load from the instance's own host memory or disk
            if id(request) in landed:
                continue  # landed, not yet polled
            h = handoffs.get(request.request_id)
            if h is None or h.state != TRANSFERRING or h.decode_id != inst.instance_id:
                _fail(f"instance {inst.instance_id} loads request {request.request_id}'s KV outside a transfer", instance, step, now)
    for rid, h in handoffs.items():
        if h.state != PREFILLING and h.kv_held and h.leg not in sim.instances[h.prefill_id].scheduler.held:
            _fail(f"request {rid} is past its prefill but instance {h.prefill_id} does not hold its KV", instance, step, now)


def idle_prefill_time(sim: Simulation, uncached: int, cached: int, pool: Any = None) -> float:
    """Time to prefill `uncached` tokens after `cached` ones on an otherwise idle engine
    (where `long_prefill_token_threshold` does not apply: the request is alone), on a
    `pool` as configured (default: the cluster's first). Under asynchronous scheduling only
    the first chunk pays its host time: the next chunk's is spent while the GPU computes
    the one before, so that is a lower bound there."""
    pool = pool if pool is not None else sim.instances[0].pool
    budget = pool.engine["max_num_batched_tokens"]
    cost_model = sim.pool_cost_models[pool.name]
    overlapped = pool.engine["async_scheduling"]
    total = 0.0
    done = cached
    left = uncached
    while left > 0:
        q = min(left, budget)
        total += cost_model.step_time([(q, done)], 0, 0)
        if overlapped and done > cached:
            total -= cost_model.host_time(1, q)
        done += q
        left -= q
    return total


def least_prefill_time(sim: Simulation, uncached: int, cached: int, pool: Any) -> float:
    """A lower bound on the time any schedule takes to prefill `uncached` tokens after
    `cached` ones on `pool`, under the additive linear cost model (the TTFT floor).

    Each step carrying one of the request's chunks (q tokens after c) lasts at least what
    that chunk alone costs, base + a*q + x*(c + q) (a: per prefill token, x: per context
    token; other work in the step only adds), and under asynchronous scheduling every step
    but the first may hide its host time h <= base behind the step before. With n chunks
    ending at positions e_1 < ... < e_n = cached + uncached the request pays at least
    base + (n - 1)(base - h) + a*uncached + x*sum(e_i). Chunks are at most Q tokens (the
    token budget; also `long_prefill_token_threshold` when it is never waived), so
    n >= ceil(uncached / Q). Both n and sum(e_i) grow with n (an extra chunk adds an end
    >= 1 and pushes none of the others down), so the fewest chunks win; among those,
    e_i >= e_n - (n - i)Q, which the short remainder first and full chunks after attain.
    An idle engine runs the full chunks first (`idle_prefill_time`), which costs
    x*(n - 1)(Q - remainder) more: maximal chunks first are not the cheapest when context
    is priced."""
    engine = pool.engine
    largest = engine["max_num_batched_tokens"]
    threshold = engine["long_prefill_token_threshold"]
    if 0 < threshold < largest and not engine["waive_long_prefill_when_alone"]:
        largest = threshold
    cost_model = sim.pool_cost_models[pool.name]
    overlapped = engine["async_scheduling"]
    total = 0.0
    done = cached
    left = uncached
    q = uncached - (-(-uncached // largest) - 1) * largest  # the remainder, 1..largest
    while left > 0:
        total += cost_model.step_time([(q, done)], 0, 0)
        if overlapped and done > cached:
            total -= cost_model.host_time(1, q)
        done += q
        left -= q
        q = largest
    return total


def check_end(sim: Simulation) -> None:
    last = max((i.scheduler.steps_done for i in sim.instances), default=0)
    _check_conservation(sim, None, last, sim.env.now)
    if sim.disagg is not None and sim.live == 0 and sim.disagg.handoffs:
        _fail(f"at the end {len(sim.disagg.handoffs)} handoffs never completed", None, last, sim.env.now)
    for instance in sim.instances:
        s = instance.scheduler
        # a run cut short (drain limit, stop time) may leave transfers in flight; an instance
        # with no request left polls no more, so a finished send may wait for its next step
        unpolled = sum(1 for _at, _kind, request in instance.landed if request in s.held)
        if sim.live == 0 and (s.loading or len(s.held) > unpolled):
            _fail(
                f"at the end {len(s.loading)} loads are in flight and {len(s.held)} finished requests hold blocks",
                instance,
                s.steps_done,
                sim.env.now,
            )
        if s.is_idle and not (s.loading or s.held or instance.landed) and s.cache.num_free_blocks != s.cache.num_total_blocks:
            _fail(
                f"idle at the end with {s.cache.num_total_blocks - s.cache.num_free_blocks} blocks still in use",
                instance,
                s.steps_done,
                sim.env.now,
            )
