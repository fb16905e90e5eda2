"""KV transfers over shared channels (lmsim/engine/links.py), numbers by hand.

Units: bytes and seconds; a 100 B/s channel moves 100 bytes in 1 s."""

from __future__ import annotations

import itertools

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from lmsim.engine.clock import schedule_at
from lmsim.engine.links import Channel, TransferNetwork, assign_max_min_rates


def run(sharing: str, jobs, channels) -> dict[str, float]:
    """jobs: (name, submit_time, nbytes, channel names, latency); returns name -> end time."""
    env = simpy.Environment()
    net = TransferNetwork(env, sharing)
    ends: dict[str, float] = {}
    for name, at, nbytes, names, latency in jobs:
        def submit(_e, name=name, nbytes=nbytes, names=names, latency=latency):
            net.submit(nbytes, tuple(channels[n] for n in names), latency_s=latency,
                       on_done=lambda t, name=name: ends.__setitem__(name, t.finished_at))
        schedule_at(env, at, 1, submit)
    env.run()
    return ends


def chans(**bw: float) -> dict[str, Channel]:
    return {k: Channel(k, v) for k, v in bw.items()}


def test_none_each_transfer_runs_as_if_alone_at_its_slowest_channel():
    # 300 B over min(100, 300) B/s = 3 s after 0.5 s latency; the second one is not slowed.
    ends = run("none", [("a", 0, 300, ("x", "y"), 0.5), ("b", 0, 300, ("x",), 0.0)], chans(x=100, y=300))
    assert ends == {"a": 3.5, "b": 3.0}


def test_fifo_queues_in_submission_order_and_holds_every_channel():
    # a: 0..2 on x; b (x,y) waits for x: 2..4; c on y alone waits for b: 4..5.
    ends = run("fifo", [("a", 0, 200, ("x",), 0), ("b", 0, 200, ("x", "y"), 0), ("c", 1, 100, ("y",), 0)],
               chans(x=100, y=100))
    assert ends == {"a": 2.0, "b": 4.0, "c": 5.0}


def test_fair_two_equal_transfers_share_and_end_together():
    ends = run("fair", [("a", 0, 100, ("x",), 0), ("b", 0, 100, ("x",), 0)], chans(x=100))
    assert ends == {"a": 2.0, "b": 2.0}


def test_fair_a_late_joiner_halves_the_rate_from_when_it_joins():
    # a alone 0..1 moves 100 of 300; then a and b at 50 each: a's last 200 take 4 s -> 5;
    # b moved 200 of 250 by 5, then alone at 100: 0.5 s -> 5.5.
    ends = run("fair", [("a", 0, 300, ("x",), 0), ("b", 1, 250, ("x",), 0)], chans(x=100))
    assert ends["a"] == pytest.approx(5.0, abs=1e-12)
    assert ends["b"] == pytest.approx(5.5, abs=1e-12)


def test_fair_latency_delays_joining():
    # b waits 1 s of latency, so a is alone for its first second exactly as above.
    ends = run("fair", [("a", 0, 300, ("x",), 0), ("b", 0, 250, ("x",), 1.0)], chans(x=100))
    assert ends["b"] == pytest.approx(5.5, abs=1e-12)


def test_max_min_rates_by_progressive_filling():
    # x 100, y 30; A crosses x and y, B only x, C only y. y saturates first: A = C = 15;
    # then x has 85 left for B alone.
    x, y = Channel("x", 100), Channel("y", 30)
    from lmsim.engine.links import Transfer

    a, b, c = (Transfer(i, 1, ch, 0, None) for i, ch in enumerate(((x, y), (x,), (y,))))
    assign_max_min_rates([a, b, c])
    assert (a.rate, b.rate, c.rate) == (15.0, 85.0, 15.0)


def test_zero_bytes_end_after_their_latency():
    ends = run("fair", [("a", 2, 0, ("x",), 0.25)], chans(x=100))
    assert ends == {"a": 2.25}


def fluid_reference(jobs, bandwidth: dict[str, float], dt: float = 5e-4) -> dict[str, float]:
    """Fair sharing stepped in small time slices: each slice recomputes max-min rates of the
    transfers that have joined and moves rate x dt bytes (the obvious, slow way)."""
    from lmsim.engine.links import Transfer

    channels = {k: Channel(k, v) for k, v in bandwidth.items()}
    pending = [Transfer(i, n, tuple(channels[c] for c in names), at + lat, None, tag=name)
               for i, (name, at, n, names, lat) in enumerate(jobs)]
    for t in pending:
        t.remaining = t.nbytes
    ends: dict[str, float] = {}
    now = 0.0
    while len(ends) < len(jobs):
        live = [t for t in pending if t.submitted_at <= now + 1e-12 and t.tag not in ends]
        for t in [t for t in live if t.remaining <= 0]:
            ends[t.tag] = now
        live = [t for t in live if t.tag not in ends]
        if live:
            assign_max_min_rates(live)
            for t in live:
                t.remaining -= t.rate * dt
        now += dt
    return ends


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.integers(1, 150), st.sampled_from(["x", "y", "xy"]),
                          st.sampled_from([0.0, 0.3])), min_size=1, max_size=5))
def test_fair_sharing_equals_the_time_sliced_reference(raw):
    jobs = [(f"j{i}", round(at, 2), n, tuple(names), lat) for i, (at, n, names, lat) in enumerate(raw)]
    bandwidth = {"x": 100.0, "y": 60.0}
    exact = run("fair", jobs, chans(**bandwidth))
    slow = fluid_reference(jobs, bandwidth)
    for name in exact:
        assert exact[name] == pytest.approx(slow[name], abs=5e-3), name


def test_bad_sharing_and_bandwidth_are_refused():
    with pytest.raises(ValueError, match="sharing must be one of none, fifo, fair"):
        TransferNetwork(simpy.Environment(), "lifo")
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        Channel("nic", 0)


def test_networks_are_deterministic():
    jobs = [(f"j{i}", i * 0.1, 100 + 37 * i, ("x", "y") if i % 2 else ("x",), 0.0) for i in range(6)]
    first = run("fair", jobs, chans(x=100, y=60))
    again = run("fair", list(itertools.chain(jobs)), chans(x=100, y=60))
    assert first == again


# -- planned lanes: the same rules, priced from submission stamps without the clock --------


def drain(lane):
    """Every completion of a PlannedLane, in order: name -> end time."""
    ends = {}
    while lane.peek() != float("inf"):
        t, done = lane.pop()
        for name in done:
            ends[name] = t
    return ends


def test_planned_fifo_lane_by_hand():
    # 100 B/s, 0.5 s latency: a 0.5..2.5; b ready 1.5, waits for a: 2.5..3.5; c ready 5.5: 5.5..6.5
    from lmsim.engine.links import PlannedLane

    lane = PlannedLane(Channel("x", 100), "fifo", latency_s=0.5)
    for name, at, nbytes in (("a", 0, 200), ("b", 1, 100), ("c", 5, 100)):
        lane.submit(at, nbytes, name)
    assert drain(lane) == {"a": 2.5, "b": 3.5, "c": 6.5}
    assert lane.busy_s == pytest.approx(4.0)
    with pytest.raises(ValueError):
        lane.submit(4, 1, "late")  # stamps never go back


@settings(max_examples=60, deadline=None)
@given(
    sharing=st.sampled_from(["none", "fifo", "fair"]),
    latency=st.sampled_from([0.0, 0.25]),
    jobs=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 500)), min_size=1, max_size=8),
)
def test_planned_lane_ends_where_the_clocked_network_does(sharing, latency, jobs):
    """The stamp-driven lane (kv_tiers' stores) and TransferNetwork (its loads) give the same
    completion times for the same submissions on one channel."""
    from lmsim.engine.links import PlannedLane

    jobs = sorted((at / 4, nbytes) for at, nbytes in jobs)
    clocked = run(sharing, [(str(k), at, n, ("x",), latency) for k, (at, n) in enumerate(jobs)], chans(x=100))
    lane = PlannedLane(Channel("x", 100), sharing, latency_s=latency)
    for k, (at, n) in enumerate(jobs):
        lane.submit(at, n, str(k))
    planned = drain(lane)
    assert planned.keys() == clocked.keys()
    for k in planned:
        assert planned[k] == pytest.approx(clocked[k], rel=1e-9, abs=1e-9)
