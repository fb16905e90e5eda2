"""Prefill/decode disaggregation: a request's prompt is computed on a prefill instance, its
KV moves over the network to a decode instance, and the decode instance produces every
output token (issue 25).

The lifecycle is vLLM's NixlConnector, which Dynamo's mocker models in its vLLM mode
("source-first handoff", `ai-dynamo/aisimulate` `crates/core/src/replay/README.md`; vLLM
`vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py`):

1. At arrival a disaggregated policy (`lmsim.policies.disagg`) names a prefill instance P
   and a decode instance D (`decode_choice: after_prefill` names D when the prefill is
   done), or no prefill instance at all: then the request is prefilled on D like on a
   colocated instance (a conditional bypass).
2. P runs a prefill leg: the same prompt, one output token, never shown to the client (the
   llm-d sidecar sends the prefill pod `max_tokens=1`; the mocker's "hidden one-token
   bootstrap request"). When it finishes, P keeps its blocks (vLLM `request_finished`
   returning `delay_free_blocks`) and the request joins D's waiting queue.
3. D admits it first come first served like any request. Its connector side offers every
   prompt token past D's own prefix hit (NixlConnector `get_num_new_matched_tokens`: `count
   = len(prompt_token_ids) - num_computed_tokens`), so the blocks D lacks including the
   partial last one; D's hit is capped below the prompt's length, so at least one block is
   always read. D allocates them (vLLM `allocate_slots`), which needs room: while D has
   none the request waits at the head of D's queue and P keeps holding its KV, the
   backpressure a prefill pool feels when decode is full. Once allocated, the transfer
   starts.
4. The transfer moves `kv_transfer.tokens` worth of KV (the blocks D reads, whole blocks as
   NIXL moves them, or the whole prompt as the mocker prices it by default) x the prefill
   profile's `kv_bytes_per_token` over P's egress and D's ingress channel
   (`lmsim.engine.links`, bandwidth, first-byte latency, `sharing` fair, fifo or none).
   When its last byte lands, D's worker has the blocks and P's gets the read notification
   (NIXL delivers the transfer's `notif_msg` to P with it); each engine learns of it at its
   next connector poll (`lmsim.engine.instance`, `cluster.kv_connector_poll`): D then
   caches the received blocks and queues the request, P frees its blocks (they stay in P's
   prefix cache; `finished_sending` -> `_free_blocks`).
5. At D's next step the request computes its last token only (vLLM
   `_update_waiting_for_remote_kv` sets `num_computed_tokens` to the loaded blocks' tokens,
   capped at the prompt, minus one so that a token is sampled) and samples the first token
   the client sees. TTFT = that token - arrival.

A request preempted on D later recomputes there (the prefill's KV is gone). So does one whose
leg was preempted on P while its last chunk was in flight (asynchronous scheduling): vLLM
still gives the leg its token, but its blocks are freed, so D prefills the whole prompt (no
transfer is recorded; it counts in `num_prefilled_on_decode`).

The request object the client sees lives on D; the prefill leg is a second `Request` with
the same id that exists only on P. The engine's records follow the client; the leg's
admission facts (first scheduled, prefix hit, lookups, preemptions) are folded into it when
its prefill is done, so `cached_tokens` is the prefill instance's hit, as the mocker
reports (`prefix_cache_reused_ratio` of the prefill pool).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from lmsim.engine.clock import ARRIVAL, HANDOVER, SAMPLE, schedule_at
from lmsim.engine.connector import attach_connector
from lmsim.engine.instance import materialize_all
from lmsim.engine.links import Channel, Transfer, TransferNetwork
from lmsim.engine.metrics import NO_INSTANCE
from lmsim.engine.request import Request
from lmsim.engine.router import RouterBase
from lmsim.errors import ConfigError
from lmsim.profile import kv_bytes_per_token

if TYPE_CHECKING:
    from lmsim.engine.scheduler import InstanceScheduler, StepOutcome

Simulation = Any  # the composition root that builds this (importing it would be a cycle)

# A handoff's states: the leg runs on P; P holds its KV and the request is about to join D's
# queue; it waits there; the KV moves.
PREFILLING, HANDING, AWAITING, TRANSFERRING = 0, 1, 2, 3


def check_disaggregated_pools(pools: list[Any], cost_models: dict[str, Any], where: str = "") -> None:
    """One line (ConfigError) when a disaggregated cluster's pools cannot run: a `both` pool
    among them, or a prefill profile that does not say how many KV bytes a token is."""
    prefix = f"{where}: " if where else ""
    both = [p.name for p in pools if p.role == "both"]
    if both:
        raise ConfigError(
            f"{prefix}cluster.pools.{both[0]}.role: a disaggregated cluster has prefill and decode pools "
            "only (a decode instance prefills a request itself when the policy bypasses the prefill pool)"
        )
    for pool in pools:
        if pool.role == "prefill" and kv_bytes_per_token(cost_models[pool.name]) is None:
            raise ConfigError(
                f"{prefix}cluster.pools.{pool.name}.profile: a prefill pool's profile must state "
                "kv_bytes_per_token (the KV bytes a transfer moves per token)"
            )


class Handoff:
    """One disaggregated request between its arrival and the landing of its KV."""

    __slots__ = ("bytes", "client", "decode_id", "kv_held", "leg", "prefill_id", "started_at", "state")

    def __init__(self, client: Request, leg: Request, prefill_id: int, decode_id: int | None) -> None:
        self.client = client
        self.leg = leg
        self.prefill_id = prefill_id
        self.decode_id = decode_id
        self.state = PREFILLING
        self.started_at = 0.0
        self.bytes = 0
        self.kv_held = True  # False: the leg finished without KV to hand over (_PrefillSide)


class Disaggregation:
    """The prefill and decode instances' KV connector, and the handoff between them."""

    def __init__(self, sim: Simulation) -> None:
        cfg = sim.config.cluster
        self.sim = sim
        self.env = sim.env
        self.transfer = cfg.transfer
        self.block_size = cfg.block_size
        check_disaggregated_pools(sim.pools, sim.pool_cost_models)
        self.prefill_ids = [i.instance_id for i in sim.instances if i.pool.role == "prefill"]
        self.decode_ids = [i.instance_id for i in sim.instances if i.pool.role == "decode"]
        self._kv_bytes = {
            i: float(kv_bytes_per_token(sim.pool_cost_models[pool.name]))  # type: ignore[arg-type]
            for pool in sim.pools if pool.role == "prefill" for i in pool.instance_ids
        }
        bw = self.transfer.bandwidth_bytes_s
        self.network = TransferNetwork(sim.env, self.transfer.sharing)
        # one NIC per GPU, each direction its own channel
        self.egress = {i: Channel(f"{i}.egress", bw) for i in self.prefill_ids}
        self.ingress = {i: Channel(f"{i}.ingress", bw) for i in self.decode_ids}
        self.handoffs: dict[int, Handoff] = {}
        self.records = sim.recorder.enable_handoffs()
        self.num_transfers = 0
        self.num_local_prefills = 0
        self._handing: list[Handoff] = []  # prefills ended now, to hand over together
        self._starting: list[Handoff] = []  # transfers started now, to submit together
        prefill_side, decode_side = _PrefillSide(self), _DecodeSide(self)
        for instance in sim.instances:
            # first on its instance: a decode leg's KV comes from its prefill instance, and
            # only what that does not supply is looked up in lower tiers (lmsim.engine.kv_tiers)
            attach_connector(instance.scheduler, prefill_side if instance.pool.role == "prefill" else decode_side)
        self.policy: Any = None  # set by the DisaggRouter
        self.router: DisaggRouter | None = None

    def context(self, base: Any, seed: np.random.SeedSequence) -> DisaggContext:
        return DisaggContext(base, self, seed)

    # -- routing -------------------------------------------------------------------------

    def start(self, request: Request, prefill_id: int, decode_id: int | None, now: float) -> bool:
        """Queue `request`'s prefill leg on P (D now or after the prefill); False when it was
        rejected instead."""
        sim = self.sim
        leg = Request(
            request_id=request.request_id,
            arrived_at=request.arrived_at,
            input_tokens=request.input_tokens,
            output_tokens=1,
            block_hashes=request.block_hashes,
            trace_hash_ids=request.trace_hash_ids,
            session_id=request.session_id,
            parent_id=request.parent_id,
            class_id=request.class_id,
            slo_class=request.slo_class,
        )
        leg.routed_at = now
        leg.instance_id = prefill_id
        reason = sim.dispatch_problem(leg, prefill_id)
        if reason is None and decode_id is not None:
            reason = sim.dispatch_problem(request, decode_id, queue=False)
        if reason is not None:
            sim.reject(request, reason)
            return False
        self.handoffs[request.request_id] = Handoff(request, leg, prefill_id, decode_id)
        self.records.prefill_instance_id[request.request_id] = prefill_id
        sim.instances[prefill_id].submit(leg)
        return True

    def client_of(self, leg: Request) -> Request:
        """The client request of a prefill leg, with the leg's admission facts folded in."""
        h = self.handoffs[leg.request_id]
        _fold(h.leg, h.client)
        return h.client

    def clients_in_handover(self) -> list[Request]:
        """Requests whose prefill ended at the instant a run was cut short, not yet queued on
        their decode instance (on no instance's lists)."""
        return [h.client for h in self._handing]

    # -- the prefill side ----------------------------------------------------------------

    def on_prefill_step_end(self, outcome: StepOutcome, now: float) -> None:
        for leg in outcome.finished:  # a leg finishes with its one token
            h = self.handoffs[leg.request_id]
            _fold(leg, h.client)
            self.records.prefill_done_at[leg.request_id] = now
            self.policy.on_prefill_done(leg)
            h.state = HANDING
            if not self._handing:
                schedule_at(self.env, now, HANDOVER, self._hand_over)
            self._handing.append(h)

    def _hand_over(self, _event: Any) -> None:
        """The requests whose prefill ended now join their decode queues: after every step
        that ends now has planned its successor (as a fast-forwarded run sees it), before
        the requests arriving now are routed (`clock.HANDOVER`), and in request order, not
        in the order the prefill instances' steps happened to end."""
        handing, self._handing = sorted(self._handing, key=_by_request), []
        for h in handing:
            self._to_decode(h, self.env.now)

    def on_leg_rejected(self, leg: Request) -> None:
        h = self.handoffs.pop(leg.request_id)
        _fold(leg, h.client)
        self.policy.on_prefill_done(leg)  # the prefill side's counters let go of it
        self.sim._on_engine_rejected(h.client)

    def _to_decode(self, h: Handoff, now: float) -> None:
        sim = self.sim
        client = h.client
        if h.decode_id is None:
            assert self.router is not None
            h.decode_id = self.router.choose_decode(client, now)
        fleet = sim.fleet
        if fleet is not None and h.decode_id is not None and not fleet.serves(h.decode_id):
            # the decode instance crashed (chosen at arrival, or now while the router still
            # lists it): the request is lost
            del self.handoffs[client.request_id]
            if h.kv_held:
                sim.instances[h.prefill_id].release_held(h.leg)
            fleet.lose(client)
            return
        reason = NO_INSTANCE if h.decode_id is None else sim.dispatch_problem(client, h.decode_id)
        if reason is not None:
            del self.handoffs[client.request_id]
            if h.kv_held:
                sim.instances[h.prefill_id].release_held(h.leg)
            sim.reject(client, reason)
            self.policy.on_finished(client)
            return
        if not h.kv_held:
            # no KV to receive: the decode instance prefills it like a bypassed request
            del self.handoffs[client.request_id]
            self.num_local_prefills += 1
            sim.instances[h.decode_id].submit(client)
            return
        h.state = AWAITING
        sim.instances[h.decode_id].submit(client)

    # -- crashes (lmsim.engine.fleet) ----------------------------------------------------

    def on_crash(self, instance_id: int, lost: list[Request]) -> list[Request]:
        """Instance `instance_id` crashed holding `lost` (by request id): the client requests
        lost with it. A prefill instance loses the legs it was prefilling (their clients
        with them) and the KV it held: a client still waiting for that KV on its decode
        instance is prefilled there instead (vLLM's `kv_load_failure_policy: recompute`); a
        transfer already on its way completes (an approximation: the read would fail and
        the decode instance recompute). A decode instance loses its clients; the KV their
        prefill instances held for them is freed."""
        sim = self.sim
        clients = []
        if sim.instances[instance_id].pool.role == "prefill":
            for leg in lost:
                h = self.handoffs[leg.request_id]
                if h.state == PREFILLING:
                    del self.handoffs[leg.request_id]
                    _fold(leg, h.client)
                    self.policy.on_prefill_done(leg)  # the prefill side lets go of it
                    clients.append(h.client)
                elif h.state == AWAITING:
                    del self.handoffs[leg.request_id]
                    self.num_local_prefills += 1
                else:
                    h.kv_held = False
            return clients
        for client in lost:
            h = self.handoffs.pop(client.request_id, None)
            if h is not None and h.kv_held:
                sim.instances[h.prefill_id].release_held(h.leg)
            clients.append(client)
        return clients

    def forget(self, request_id: int) -> None:
        """A lost request's handoff records: its next attempt (or none) writes its own."""
        r = self.records
        r.prefill_instance_id[request_id] = -1
        r.kv_transfer_bytes[request_id] = -1
        for column in (r.prefill_done_at, r.kv_transfer_start_at, r.kv_transfer_s):
            column[request_id] = np.nan

    # -- the decode side -----------------------------------------------------------------

    def blocks_to_receive(self, request: Request, local_hit_blocks: int) -> int:
        h = self.handoffs.get(request.request_id)
        if h is None or h.state != AWAITING:
            return 0
        # every prompt block past D's hit, the partial last one too (at least one: the hit
        # stops short of the prompt's last token)
        return -(-request.input_tokens // self.block_size) - local_hit_blocks

    def start_transfer(self, request: Request, num_blocks: int) -> None:
        h = self.handoffs[request.request_id]
        h.state = TRANSFERRING
        tokens = num_blocks * self.block_size if self.transfer.tokens == "destination_missing" else request.input_tokens
        nbytes = round(tokens * self._kv_bytes[h.prefill_id])
        now = self.env.now
        h.started_at = now
        h.bytes = nbytes
        rid = request.request_id
        self.records.kv_transfer_start_at[rid] = now
        self.records.kv_transfer_bytes[rid] = nbytes
        self.num_transfers += 1
        if not self._starting:
            schedule_at(self.env, now, SAMPLE, self._submit_transfers)
        self._starting.append(h)

    def _submit_transfers(self, _event: Any) -> None:
        """The transfers decode instances started now enter the network together, once every
        instance has planned at this instant, by decode instance and load order: how they
        share a link must not depend on which instance happened to plan first."""
        starting, self._starting = sorted(self._starting, key=_by_destination), []
        for h in starting:
            self.network.submit(
                h.bytes, (self.egress[h.prefill_id], self.ingress[h.decode_id]),  # type: ignore[index]
                latency_s=self.transfer.latency_s, on_done=self._landed, tag=h,
            )

    def _landed(self, transfer: Transfer) -> None:
        # Like an arrival, after every step that ends now (and never inside the decode
        # instance's planning, which a transfer of nothing would otherwise interrupt).
        schedule_at(self.env, self.env.now, ARRIVAL, lambda _e: self._received(transfer.tag))

    def _received(self, h: Handoff) -> None:
        """The last byte landed: D's worker has the blocks and P's has the read notification;
        each instance applies its side at its next connector poll."""
        if self.handoffs.get(h.client.request_id) is not h:
            return  # its decode instance crashed meanwhile (on_crash)
        self.records.kv_transfer_s[h.client.request_id] = self.env.now - h.started_at
        del self.handoffs[h.client.request_id]
        self.sim.instances[h.decode_id].external_ready(h.client)  # type: ignore[index]
        if h.kv_held:  # else its prefill instance crashed while the bytes were on their way
            self.sim.instances[h.prefill_id].release_held(h.leg)
        if self.sim.fleet is not None:  # a draining prefill instance stops once its KV is read
            self.sim.fleet.maybe_drained(h.prefill_id)


def _by_request(h: Handoff) -> int:
    return h.client.request_id


def _by_destination(h: Handoff) -> tuple[int, int]:
    return h.decode_id, h.client.kv_load_seq  # type: ignore[return-value]


def _fold(leg: Request, client: Request) -> None:
    """The prefill leg's admission facts become the client's (idempotent)."""
    client.first_scheduled_at = leg.first_scheduled_at
    client.cached_tokens = leg.cached_tokens
    client.lookup_tokens = leg.lookup_tokens
    client.lookup_hit_tokens = leg.lookup_hit_tokens
    client.num_preemptions = leg.num_preemptions
    # the lower tiers the leg loaded from (lmsim.engine.kv_tiers); the client loads nothing
    # before its prefill is done, so assigning keeps this idempotent
    client.kv_hit_tokens_host = leg.kv_hit_tokens_host
    client.kv_hit_tokens_disk = leg.kv_hit_tokens_disk
    client.kv_load_bytes = leg.kv_load_bytes
    client.kv_load_s = leg.kv_load_s


class _PrefillSide:
    """The KV connector of a prefill instance: it loads nothing and keeps every finished
    leg's blocks until its decode instance has read them."""

    def __init__(self, disagg: Disaggregation) -> None:
        self.disagg = disagg

    def external_blocks(self, scheduler: InstanceScheduler, request: Request, local_hit_blocks: int) -> int:
        return 0

    def start_load(self, scheduler: InstanceScheduler, request: Request, first_block: int, num_blocks: int) -> None:
        raise AssertionError("a prefill instance loads no KV")

    def admitted(self, scheduler: InstanceScheduler, request: Request, hit_blocks: int) -> None:
        pass

    def hold_on_finish(self, scheduler: InstanceScheduler, request: Request) -> bool:
        # vLLM NixlConnector `request_finished`: `delay_free_blocks = len(block_ids) > 0`.
        # A leg preempted while its last chunk was in flight (asynchronous scheduling) still
        # gets its token, but its blocks were freed (scheduler `_sampled_while_waiting`):
        # nothing to read, the decode instance recomputes the prompt.
        held = bool(request.block_keys)
        if not held:
            self.disagg.handoffs[request.request_id].kv_held = False
        return held


class _DecodeSide:
    """The KV connector of a decode instance: a handed-off request's missing prompt blocks
    come from its prefill instance."""

    def __init__(self, disagg: Disaggregation) -> None:
        self.disagg = disagg

    def external_blocks(self, scheduler: InstanceScheduler, request: Request, local_hit_blocks: int) -> int:
        return self.disagg.blocks_to_receive(request, local_hit_blocks)

    def start_load(self, scheduler: InstanceScheduler, request: Request, first_block: int, num_blocks: int) -> None:
        self.disagg.start_transfer(request, num_blocks)

    def admitted(self, scheduler: InstanceScheduler, request: Request, hit_blocks: int) -> None:
        pass

    def hold_on_finish(self, scheduler: InstanceScheduler, request: Request) -> bool:
        return False


class DisaggRouter(RouterBase):
    """The router of a disaggregated cluster: the policy names a (prefill, decode) pair."""

    def __init__(self, disagg: Disaggregation, cluster: Any, policy: Any, adapter: Any, fleet: Any = None) -> None:
        super().__init__(disagg.sim.instances, cluster, policy, adapter)
        self.fleet = fleet
        self.disagg = disagg
        self.sim = disagg.sim
        disagg.policy = policy
        disagg.router = self
        self._prefill = set(disagg.prefill_ids)
        self._decode = set(disagg.decode_ids)

    def _check(self, choice: Any, allowed: set[int], what: str) -> int:
        if not isinstance(choice, (int, np.integer)) or int(choice) not in allowed:
            raise RuntimeError(f"policy {self.policy.registry_name} chose invalid {what} instance {choice!r}")
        return int(choice)

    def _listed(self) -> tuple[Any, set[int], set[int]]:
        """The view the policy reads and the prefill and decode ids it may answer: every
        instance, or under a changing fleet the routable ones (lmsim.engine.fleet; the
        policy still answers global ids, its sides map their role-local positions)."""
        view = self.view()
        if self.fleet is None:
            return view, self._prefill, self._decode
        routable = set(self.fleet.routable)
        return self.fleet.view(view), self._prefill & routable, self._decode & routable

    def route(self, request: Request, now: float) -> None:
        materialize_all(self.instances, now)
        view, prefill_ids, decode_ids = self._listed()
        if not (prefill_ids and decode_ids):  # a changing fleet with a role scaled to nothing
            self.fleet.no_instance(request)
            return
        started = time.perf_counter()
        prefill, decode = self.policy.choose_pair(request, view)
        self.decision_wall_s += time.perf_counter() - started
        self.num_decisions += 1
        if prefill is None and decode is None:
            raise RuntimeError(f"policy {self.policy.registry_name} chose neither a prefill nor a decode instance")
        p = None if prefill is None else self._check(prefill, prefill_ids, "prefill")
        d = None if decode is None else self._check(decode, decode_ids, "decode")
        request.routed_at = now
        request.instance_id = d
        if self.fleet is not None and any(i is not None and not self.fleet.serves(i) for i in (p, d)):
            self._sent_to_dead(request, p, d)
            return
        if p is None:  # prefilled on its decode instance
            assert d is not None
            if not self.sim._dispatch(request, d):
                return
            self.disagg.num_local_prefills += 1
            self.instances[d].submit(request)
        elif not self.disagg.start(request, p, d, now):
            return
        for where in (p, d):
            if where is not None and self.adapter is not None:
                self.adapter.on_routed(request, where)
        self.policy.on_routed_pair(request, p, d)
        if self.fleet is not None:
            self.fleet.on_routed(request, d if d is not None else p)

    def _sent_to_dead(self, request: Request, p: int | None, d: int | None) -> None:
        """The policy chose a crashed instance the router still lists: the request is lost
        (the prefill side lets go of it as of a prefill done)."""
        for where in (p, d):
            if where is not None and self.adapter is not None:
                self.adapter.on_routed(request, where)
        self.policy.on_routed_pair(request, p, d)
        if p is not None:
            self.policy.on_prefill_done(request)
        self.fleet.sent_to_dead(request)

    def choose_decode(self, request: Request, now: float) -> int | None:
        """`decode_choice: after_prefill`: the decode instance, now that the prefill is done
        (None: a changing fleet has no decode instance to offer)."""
        materialize_all(self.instances, now)
        view, _prefill_ids, decode_ids = self._listed()
        if not decode_ids:
            return None
        started = time.perf_counter()
        choice = self.policy.choose_decode(request, view)
        self.decision_wall_s += time.perf_counter() - started
        d = self._check(choice, decode_ids, "decode")
        request.instance_id = d
        if self.adapter is not None:
            self.adapter.on_routed(request, d)
        self.policy.on_decode_chosen(request, d)
        return d


class DisaggContext:
    """What a disaggregated policy may use (lmsim.policies.disagg.DisaggContext): the
    engine's context, the two roles' instance ids, and `side(role)`, a context restricted to
    one role's instances for a policy that routes within it."""

    def __init__(self, base: Any, disagg: Disaggregation, seed: np.random.SeedSequence) -> None:
        self._base = base
        self._seed = seed
        self.prefill_ids = list(disagg.prefill_ids)
        self.decode_ids = list(disagg.decode_ids)
        for name in ("num_instances", "block_size", "max_num_batched_tokens", "max_num_seqs", "rng",
                     "cost_model", "cost_models"):
            setattr(self, name, getattr(base, name))
        self._pool_engine = {i.instance_id: i.pool.engine for i in disagg.sim.instances}

    def now(self) -> float:
        return self._base.now()

    def load_cost_model(self, spec: Any) -> Any:
        return self._base.load_cost_model(spec)

    def every(self, period_s: float, callback: Any) -> None:
        self._base.every(period_s, callback)

    def subscribe_kv_events(self, callback: Any) -> None:
        self._base.subscribe_kv_events(callback)

    def record_event(self, kind: str, **fields: Any) -> None:
        self._base.record_event(kind, **fields)

    def side(self, role: str) -> SideContext:
        """A RouterContext over one role's instances (role-local ids 0..n-1 of that role, in
        instance order), with its own seeded random stream."""
        ids = self.prefill_ids if role == "prefill" else self.decode_ids
        (child,) = self._seed.spawn(1)
        return SideContext(self, role, ids, np.random.default_rng(child))


class SideContext:
    """A RouterContext restricted to the instances `ids`: a policy bound to it knows them by
    role-local ids 0..len(ids)-1 (its views, `lmsim.policies.disagg.PoolView`, list the
    routable ones under those ids); KV events and recorded instance ids are translated."""

    def __init__(self, parent: DisaggContext, role: str, ids: list[int], rng: np.random.Generator) -> None:
        self._parent = parent
        self.role = role
        self.ids = ids
        self._local = {g: k for k, g in enumerate(ids)}
        engine = parent._pool_engine[ids[0]]
        self.num_instances = len(ids)
        self.block_size = parent.block_size
        self.max_num_batched_tokens = engine["max_num_batched_tokens"]
        self.max_num_seqs = engine["max_num_seqs"]
        self.rng = rng
        self.cost_models = [parent.cost_models[g] for g in ids]
        self.cost_model = self.cost_models[0]

    def now(self) -> float:
        return self._parent.now()

    def load_cost_model(self, spec: Any) -> Any:
        return self._parent.load_cost_model(spec)

    def every(self, period_s: float, callback: Any) -> None:
        self._parent.every(period_s, callback)

    def subscribe_kv_events(self, callback: Any) -> None:
        local = self._local

        def translated(instance_id: int, block_hash: int, stored: bool, at: float) -> None:
            k = local.get(instance_id)
            if k is not None:
                callback(k, block_hash, stored, at)

        self._parent.subscribe_kv_events(translated)

    def record_event(self, kind: str, **fields: Any) -> None:
        if "instance_id" in fields:
            fields["instance_id"] = self.ids[fields["instance_id"]]
        self._parent.record_event(kind, side=self.role, **fields)
