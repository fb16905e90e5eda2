"""KV transfers in simulated time: bytes over channels of finite bandwidth.

A transfer moves `nbytes` across one or more channels (a prefill GPU's NIC and a decode GPU's
NIC; a GPU's PCIe lane to host memory; a disk) after a first-byte latency, and calls back when
its last byte lands. How concurrent transfers share a channel is a property of the network:

* `none`: every transfer runs at the bandwidth of its slowest channel as if alone. Dynamo's
  mocker (AISimulate 0.13, `engine/handoff.rs::HandoffTransferTiming::delay_ms`) prices a P/D
  handoff this way: two simultaneous transfers each take the full time.
* `fifo`: each channel carries one transfer at a time, in submission order; a transfer starts
  when its latency has passed and every channel it crosses is free, and holds them all until
  it ends. The mocker's private host-offload lanes work so (`host_offload/tier.rs::FifoLane`:
  start = max(lane tail, not before), duration = bytes / bandwidth).
* `fair`: concurrent transfers share bandwidth max-min fairly across every channel they cross
  (progressive filling: raise all rates together, freeze the transfers of the first channel
  that saturates, repeat), re-balanced whenever a transfer starts or ends. This is the fluid
  model flow-level network simulators use (SimGrid's LV08 model without its latency
  corrections); RDMA NICs shared by several queue pairs approach it.

Times are computed in floating point from the event times only (no clock drift), so the same
submissions give the same completion times on every run. With fair sharing each start and
each completion re-plans the next completion event; an outdated event is ignored.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from lmsim.engine.clock import STEP_END, schedule_at

SHARING_MODES = ("none", "fifo", "fair")
TransferDone = Callable[["Transfer"], None]


@dataclass(eq=False)
class Channel:
    """One direction of one physical link (a NIC's egress, a PCIe lane, a disk)."""

    name: str
    bandwidth_bytes_s: float
    free_at: float = 0.0  # fifo: when the transfer in progress (or queued last) ends

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_s > 0:
            raise ValueError(f"channel {self.name}: bandwidth must be positive, got {self.bandwidth_bytes_s}")


@dataclass(eq=False)
class Transfer:
    """One transfer; `started_at` is when its first byte moved (after latency and queueing),
    `finished_at` when its last byte landed."""

    seq: int
    nbytes: float
    channels: tuple[Channel, ...]
    submitted_at: float
    on_done: TransferDone | None
    tag: object = None
    started_at: float | None = None
    finished_at: float | None = None
    remaining: float = 0.0
    rate: float = 0.0

    @property
    def duration_s(self) -> float | None:
        """Submission to last byte: latency, queueing and the bytes themselves."""
        return None if self.finished_at is None else self.finished_at - self.submitted_at


class TransferNetwork:
    """Channels that share one sharing rule, on one SimPy clock."""

    def __init__(self, env: simpy.Environment, sharing: str = "fair") -> None:
        if sharing not in SHARING_MODES:
            raise ValueError(f"sharing must be one of {', '.join(SHARING_MODES)}, got {sharing!r}")
        self.env = env
        self.sharing = sharing
        self._seq = 0
        self._active: list[Transfer] = []  # fair: transfers moving bytes, in start order
        self._last = 0.0  # fair: time the active transfers' `remaining` refers to
        self._next_event: simpy.Event | None = None
        self.bytes_moved = 0.0
        self.num_transfers = 0

    def submit(
        self,
        nbytes: float,
        channels: tuple[Channel, ...],
        *,
        latency_s: float = 0.0,
        on_done: TransferDone | None = None,
        tag: object = None,
    ) -> Transfer:
        """Start moving `nbytes` over `channels` now; `on_done(transfer)` runs when it ends
        (at once, at the current time, for zero bytes and zero latency)."""
        if nbytes < 0 or latency_s < 0:
            raise ValueError(f"a transfer needs bytes >= 0 and latency >= 0, got {nbytes}, {latency_s}")
        if not channels:
            raise ValueError("a transfer crosses at least one channel")
        now = self.env.now
        self._seq += 1
        transfer = Transfer(self._seq, float(nbytes), tuple(channels), now, on_done, tag)
        transfer.remaining = float(nbytes)
        self.num_transfers += 1
        self.bytes_moved += float(nbytes)
        ready = now + latency_s
        slowest = min(c.bandwidth_bytes_s for c in channels)
        if self.sharing == "none":
            transfer.started_at = ready
            self._finish_at(transfer, ready + nbytes / slowest)
        elif self.sharing == "fifo":
            start = max(ready, *(c.free_at for c in channels))
            end = start + nbytes / slowest
            for c in channels:
                c.free_at = end
            transfer.started_at = start
            self._finish_at(transfer, end)
        elif latency_s > 0:
            schedule_at(self.env, ready, STEP_END, lambda _e: self._join(transfer))
        else:
            self._join(transfer)
        return transfer

    # -- none / fifo: the end is known at submission -------------------------------------

    def _finish_at(self, transfer: Transfer, end: float) -> None:
        def done(_event: simpy.Event) -> None:
            transfer.remaining = 0.0
            transfer.finished_at = end
            if transfer.on_done is not None:
                transfer.on_done(transfer)

        schedule_at(self.env, end, STEP_END, done)

    # -- fair: progressive filling -------------------------------------------------------

    def _join(self, transfer: Transfer) -> None:
        now = self.env.now
        self._advance(now)
        transfer.started_at = now
        if transfer.remaining <= 0:
            transfer.finished_at = now
            if transfer.on_done is not None:
                transfer.on_done(transfer)
            return
        self._active.append(transfer)
        self._rebalance()

    def _advance(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            for t in self._active:
                t.remaining -= t.rate * elapsed
        self._last = now

    def _rebalance(self) -> None:
        assign_max_min_rates(self._active)
        self._plan_next()

    def _plan_next(self) -> None:
        if not self._active:
            self._next_event = None
            return
        now = self.env.now
        first = min(self._active, key=lambda t: (t.remaining / t.rate, t.seq))
        event = schedule_at(self.env, now + max(first.remaining, 0.0) / first.rate, STEP_END, self._on_event)
        self._next_event = event

    def _on_event(self, event: simpy.Event) -> None:
        if event is not self._next_event:
            return  # superseded by a later start or end
        now = self.env.now
        self._advance(now)
        # The transfer this event was planned for ends now; others that reach zero with it
        # (equal shares of equal sizes) end now too. Rounding leaves them a few ulps of
        # bytes: what one more femtosecond at their rate would move counts as done.
        done = [t for t in self._active if t.remaining <= t.rate * 1e-12 * max(1.0, now)]
        if not done:
            done = [min(self._active, key=lambda t: (t.remaining / t.rate, t.seq))]
        finished = set(map(id, done))
        self._active = [t for t in self._active if id(t) not in finished]
        for t in done:
            t.remaining = 0.0
            t.rate = 0.0
            t.finished_at = now
        self._rebalance()
        for t in done:
            if t.on_done is not None:
                t.on_done(t)


def assign_max_min_rates(transfers: list[Transfer]) -> None:
    """Max-min fair rates by progressive filling: every unfrozen transfer's rate rises
    together; the channel whose capacity runs out first freezes the transfers crossing it at
    its fair share; repeat with what is left. Sets `transfer.rate` on each."""
    capacity: dict[int, float] = {}
    crossing: dict[int, list[Transfer]] = {}
    for t in transfers:
        for c in t.channels:
            if id(c) not in capacity:
                capacity[id(c)] = c.bandwidth_bytes_s
                crossing[id(c)] = []
            crossing[id(c)].append(t)
    unfrozen = {id(t) for t in transfers}
    while unfrozen:
        best_share, best_channel = None, None
        for cid, users in crossing.items():
            n = sum(1 for t in users if id(t) in unfrozen)
            if n == 0:
                continue
            share = capacity[cid] / n
            if best_share is None or share < best_share:
                best_share, best_channel = share, cid
        assert best_share is not None and best_channel is not None
        for t in crossing[best_channel]:
            if id(t) not in unfrozen:
                continue
            t.rate = best_share
            unfrozen.discard(id(t))
            for c in t.channels:
                capacity[id(c)] -= best_share


class PlannedLane:
    """Transfers over one channel priced without the SimPy clock, for submissions that carry
    their own time: a KV block stored by a step is known when the step is planned, counts
    from the step's end, and under fast-forward may reach its lane only after that end has
    passed. The lane is then a function of its submissions, not of when they were made.

    Submissions come in non-decreasing time order. `peek()` is the time of the lane's next
    event (a transfer joining a fair share, or transfers completing); `pop()` processes it.
    A caller drives the lane up to a horizon it knows every submission before has been made
    (`lmsim.engine.kv_tiers` drives several lanes together, in time order, since one lane's
    completions submit to another). The sharing rules are `TransferNetwork`'s on a single
    channel: `none` and `fifo` fix a transfer's end when it is submitted, `fair` shares the
    bandwidth equally among the transfers under way (processor sharing). tests/test_links.py
    checks every rule against `TransferNetwork` on the same submissions.
    """

    def __init__(self, channel: Channel, sharing: str, latency_s: float = 0.0) -> None:
        if sharing not in SHARING_MODES:
            raise ValueError(f"sharing must be one of {', '.join(SHARING_MODES)}, got {sharing!r}")
        self.channel = channel
        self.sharing = sharing
        self.latency_s = latency_s
        self._seq = 0
        self._last_submit = float("-inf")
        self._ends: list[tuple[float, int, object]] = []  # none/fifo: (end, seq, payload) heap
        # fair: transfers not yet moving (ready time, seq, bytes, payload) in time order, and
        # the ones moving [remaining bytes, seq, payload], as of time `_t`
        self._joining: list[tuple[float, int, float, object]] = []
        self._join_head = 0
        self._moving: list[list] = []
        self._t = 0.0
        self.bytes_moved = 0.0
        self.num_transfers = 0
        self.busy_s = 0.0  # time with at least one transfer moving bytes
        self._busy_until = float("-inf")

    def submit(self, at: float, nbytes: float, payload: object) -> None:
        if at < self._last_submit:
            raise ValueError(f"{self.channel.name}: submission at {at} after one at {self._last_submit}")
        self._last_submit = at
        self._seq += 1
        self.num_transfers += 1
        self.bytes_moved += nbytes
        ready = at + self.latency_s
        bandwidth = self.channel.bandwidth_bytes_s
        if self.sharing == "fair":
            self._joining.append((ready, self._seq, float(nbytes), payload))
            return
        start = max(ready, self.channel.free_at) if self.sharing == "fifo" else ready
        end = start + nbytes / bandwidth
        if self.sharing == "fifo":
            self.channel.free_at = end
        # starts never decrease under none and fifo: the busy union grows at its end
        self.busy_s += max(0.0, end - max(start, self._busy_until))
        self._busy_until = max(self._busy_until, end)
        heapq.heappush(self._ends, (end, self._seq, payload))

    def peek(self) -> float:
        if self.sharing != "fair":
            return self._ends[0][0] if self._ends else INF
        nxt = self._joining[self._join_head][0] if self._join_head < len(self._joining) else INF
        if self._moving:
            done = self._t + min(m[0] for m in self._moving) * len(self._moving) / self.channel.bandwidth_bytes_s
            nxt = min(nxt, done)
        return nxt

    def pop(self) -> tuple[float, list[object]]:
        """Process the next event: (its time, the payloads of the transfers it completes)."""
        if self.sharing != "fair":
            end, _seq, payload = heapq.heappop(self._ends)
            out = [payload]
            while self._ends and self._ends[0][0] == end:
                out.append(heapq.heappop(self._ends)[2])
            return end, out
        t = self.peek()
        moving = self._moving
        if moving:
            moved = (t - self._t) * self.channel.bandwidth_bytes_s / len(moving)
            for m in moving:
                m[0] -= moved
            self.busy_s += t - self._t
        self._t = t
        # Transfers that reach zero now (equal shares of equal sizes end together; rounding
        # leaves a few ulps of bytes) complete; a tie between a completion and a join
        # completes first, which shares out the same bytes either way.
        tolerance = self.channel.bandwidth_bytes_s * 1e-12 * max(1.0, t)
        done = [m for m in moving if m[0] <= tolerance]
        if done:
            self._moving = [m for m in moving if m[0] > tolerance]
            return t, [m[2] for m in sorted(done, key=lambda m: m[1])]
        _ready, seq, nbytes, payload = self._joining[self._join_head]
        self._join_head += 1
        if self._join_head > 1024 and self._join_head * 2 > len(self._joining):
            del self._joining[: self._join_head]
            self._join_head = 0
        if nbytes <= 0:
            return t, [payload]
        moving.append([nbytes, seq, payload])
        return t, []


INF = float("inf")
