"""Instances joining, draining and crashing (lmsim.engine.fleet), on runs small enough to
follow by hand.

The profile is the linear one of tests/conftest.py: a step costs 0.010 s + 0.001 s per
prompt token computed + 0.0001 s per decode. A 16-token prompt's first token takes
0.010 + 0.016 = 0.026 s; each decode step of one request 0.0101 s. Blocks are 16 tokens; a
64-token prompt of 4 named blocks can hit at most (64 - 1) // 16 = 3 blocks = 48 tokens.

The policy is `vllm` (fewest running + waiting, ties to the first listed): it reads only the
views it is given, so it routes a routable subset by position.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from conftest import make_config, make_trace, simulate
from lmsim.engine.fleet import RoutableView
from lmsim.engine.router import FleetRouter, Router
from lmsim.study.compose import build_simulation
from lmsim.study.rundir import load_run, save_run

PREFIX = [1, 2, 3, 4]  # a 64-token prompt's four blocks


def _events(results) -> list[tuple[float, int, str]]:
    e = results.fleet_events
    return [(round(t, 9), i, ev) for t, i, ev in zip(e["time_s"], e["instance_id"], e["event"])]


def _row(results, rid: int) -> dict:
    return results.requests.iloc[rid].to_dict()


def test_a_scaled_up_instance_serves_only_after_its_start_up_and_starts_cold():
    """One instance active, one stopped (max_replicas 2, startup_s 3). The schedule asks for
    2 from t=1: the scaler's first tick (interval 1 s) starts instance 1 at 1.0, which
    becomes active at 1.0 + 3.0 = 4.0.

    r0 (t=0) computes the prefix on instance 0. r1 arrives at 3.999, before instance 1 is
    ready: the router lists only instance 0, so r1 goes there and hits 48 tokens. r2 and r3
    arrive together at 4.5: r2 takes the first listed (both idle), instance 0 (hit 48); r3
    takes instance 1, which has never computed the prefix: cached_tokens 0, scheduled at
    once, 4.5."""
    trace = make_trace([0.0, 3.999, 4.5, 4.5], [64] * 4, [2] * 4, [PREFIX] * 4)
    r = simulate(
        trace, cluster={"num_instances": 1}, router={"policy": "vllm"},
        fleet={"pools": {"default": {"max_replicas": 2, "startup_s": 3.0}}},
        autoscaler={"name": "schedule", "interval_s": 1.0, "params": {"replicas": {"default": [[1.0, 2]]}}},
    )
    assert _events(r) == [(0.0, 0, "active"), (1.0, -1, "scale"), (1.0, 1, "start"), (4.0, 1, "active")]
    assert r.fleet_events["target"].tolist()[1] == 2
    assert [_row(r, i)["instance_id"] for i in range(4)] == [0, 0, 0, 1]
    assert [_row(r, i)["cached_tokens"] for i in range(4)] == [0, 48, 48, 0]
    assert _row(r, 3)["first_scheduled_at"] == 4.5
    assert list(r.requests["retries"]) == [0, 0, 0, 0]
    # provisioned: instance 0 from 0, instance 1 from its start at 1.0, to the run's end
    end = r.summary["sim_time_s"]
    assert r.summary["fleet"]["pools"]["default"]["instance_seconds"] == pytest.approx(end + (end - 1.0))
    assert r.summary["fleet"]["num_scale_events"] == 1


def test_a_drained_instance_finishes_what_it_holds_and_takes_nothing_new():
    """Two instances. r0 (t=0, 100 outputs) runs on instance 0 until 0.026 + 99 x 0.0101 =
    1.0259; r1 (t=0.5, 200 outputs) goes to the idle instance 1 and finishes at 0.5 + 0.026
    + 199 x 0.0101 = 2.5359. At t=1 the schedule asks for one replica: the newest active
    instance, 1, drains. It keeps r1 to the end and stops when r1 finishes, 2.5359. r2
    (1.5) and r3 (1.6) go to instance 0, the only one listed.
    Provisioned: instance 0 for the whole run (to r1's end, 2.5359, the last activity) plus
    instance 1 to its stop: 2 x 2.5359 = 5.0718 instance-seconds."""
    trace = make_trace([0.0, 0.5, 1.5, 1.6], [16] * 4, [100, 200, 5, 5])
    r = simulate(
        trace, cluster={"num_instances": 2}, router={"policy": "vllm"},
        autoscaler={"name": "schedule", "interval_s": 1.0, "params": {"replicas": {"default": [[1.0, 1]]}}},
    )
    assert [_row(r, i)["instance_id"] for i in range(4)] == [0, 1, 0, 0]
    assert _row(r, 1)["finished_at"] == pytest.approx(0.5 + 0.026 + 199 * 0.0101)
    assert _events(r) == [
        (0.0, 0, "active"), (0.0, 1, "active"), (1.0, -1, "scale"), (1.0, 1, "drain"), (2.5359, 1, "stop"),
    ]
    assert set(r.requests["status"]) == {"finished"}
    assert r.summary["fleet"]["pools"]["default"]["instance_seconds"] == pytest.approx(2 * 2.5359)


def test_a_drain_timeout_hands_the_rest_back_through_the_router():
    """As above, but `drain_timeout_s: 0.5`: at 1.5 instance 1 still runs r1 (it would
    finish at 2.5359), so it is taken off, routed again at once to instance 0 (idle since
    r0 ended at 1.0259) as a fresh request, and counts one retry; instance 1 stops at 1.5.
    r1 then prefills again at 1.5 and finishes at 1.5 + 0.026 + 199 x 0.0101 = 3.5359."""
    trace = make_trace([0.0, 0.5], [16] * 2, [100, 200])
    r = simulate(
        trace, cluster={"num_instances": 2}, router={"policy": "vllm"}, fleet={"drain_timeout_s": 0.5},
        autoscaler={"name": "schedule", "interval_s": 1.0, "params": {"replicas": {"default": [[1.0, 1]]}}},
    )
    assert _events(r)[-2:] == [(1.0, 1, "drain"), (1.5, 1, "stop")]
    row = _row(r, 1)
    assert (row["instance_id"], row["retries"], row["routed_at"]) == (0, 1, 1.5)
    assert row["finished_at"] == pytest.approx(3.5359)
    assert row["status"] == "finished"


def test_a_crash_sends_its_requests_back_once_and_loses_its_cache():
    """Instance 0 crashes at 0.5 (detected 0.1 s later, restarted 1.0 s after the crash,
    start-up 0.5 s: `restart` and `start` at 1.5, active at 2.0).

    r0 (t=0, the 64-token prefix, 100 outputs) is decoding on instance 0 then: it is lost
    and sent again 0.2 s later, at 0.7, once (retries 1), where the router lists only
    instance 1 (the crash was detected at 0.6), so it is prefilled again there from nothing
    (cached 0: the prefix was on the crashed instance). r1 (t=0.1) runs on instance 1
    untouched. At 3.0, r2 and r3 bring the prefix again: r2 goes to the restarted instance
    0, whose cache is empty (cached 0, though it computed the prefix before its crash); r3
    to instance 1, which has it from r0's retry (48)."""
    trace = make_trace([0.0, 0.1, 3.0, 3.0], [64, 16, 64, 64], [100, 100, 2, 2], [PREFIX, [], PREFIX, PREFIX])
    r = simulate(
        trace, cluster={"num_instances": 2}, router={"policy": "vllm"},
        fleet={"detection_delay_s": 0.1, "startup_s": 0.5},
        faults={"crashes": [{"time_s": 0.5, "instance": 0}], "retry_after_s": 0.2, "restart_s": 1.0},
    )
    assert _events(r) == [
        (0.0, 0, "active"), (0.0, 1, "active"), (0.5, 0, "crash"), (0.6, 0, "detected"),
        (1.5, 0, "restart"), (1.5, 0, "start"), (2.0, 0, "active"),
    ]
    r0 = _row(r, 0)
    assert (r0["retries"], r0["routed_at"], r0["instance_id"], r0["cached_tokens"]) == (1, 0.7, 1, 0)
    assert r0["arrived_at"] == 0.0 and r0["status"] == "finished"
    assert list(r.requests["retries"]) == [1, 0, 0, 0]
    assert [_row(r, i)["instance_id"] for i in (2, 3)] == [0, 1]
    assert [_row(r, i)["cached_tokens"] for i in (2, 3)] == [0, 48]
    fleet = r.summary["fleet"]
    assert (fleet["num_crashes"], fleet["num_retries"], fleet["num_failed"]) == (1, 1, 0)
    # instance 0: 0 -> 0.5 and 1.5 -> end; instance 1: 0 -> end
    end = r.summary["sim_time_s"]
    assert fleet["pools"]["default"]["instance_seconds"] == pytest.approx(0.5 + (end - 1.5) + end)


def test_the_router_sends_to_a_dead_instance_until_the_crash_is_detected():
    """Instance 0 crashes at 1.0, idle; the health check notices at 1.0 + 2.0 = 3.0. Until
    then the router still lists it, and an idle dead instance looks the least loaded. r0
    arrives at 1.5: sent to instance 0, lost, sent again 0.75 s later at 2.25 (lost again),
    at 3.0 (a retry is an arrival, routed before the detection at the same instant: lost a
    third time), at 3.75 (only instance 1 is listed: served, retries 3). r1 arrives at 3.5,
    after the detection: instance 1, no retry."""
    trace = make_trace([1.5, 3.5], [16, 16], [400, 2])
    r = simulate(
        trace, cluster={"num_instances": 2}, router={"policy": "vllm"}, fleet={"detection_delay_s": 2.0},
        faults={"crashes": [{"time_s": 1.0, "instance": 0}], "retry_after_s": 0.75, "max_retries": 5},
    )
    r0, r1 = _row(r, 0), _row(r, 1)
    assert (r0["retries"], r0["routed_at"], r0["instance_id"], r0["status"]) == (3, 3.75, 1, "finished")
    assert (r1["retries"], r1["routed_at"], r1["instance_id"]) == (0, 3.5, 1)
    assert _events(r)[2:] == [(1.0, 0, "crash"), (3.0, 0, "detected")]


@pytest.mark.parametrize("dead_view, r3_instance, r3_status", [("frozen", 1, "finished"), ("empty", 0, "failed")])
def test_the_router_sees_a_dead_instance_as_it_last_was_until_detection(dead_view, r3_instance, r3_status):
    """vllm (fewest running + waiting, ties to the first listed). r0 (t=0) -> instance 0
    (tie); r1 (t=0.05) -> instance 1 (0 has 1); r2 (t=0.1) -> instance 0 (tie 1:1). Instance
    0 crashes at 0.5 holding r0 and r2 (`in_flight: fail`: both fail); detection at 2.5.
    r3 arrives at 1.0. `frozen`: the router still sees instance 0 as at the crash, 2
    requests against instance 1's 1, and sends r3 to instance 1: served. `empty`: it sees
    instance 0 idle (0 against 1), sends r3 there, and r3 is lost with it (failed)."""
    trace = make_trace([0.0, 0.05, 0.1, 1.0], [16, 16, 16, 16], [400, 400, 400, 2])
    r = simulate(
        trace, cluster={"num_instances": 2}, router={"policy": "vllm"},
        fleet={"detection_delay_s": 2.0, "dead_view": dead_view},
        faults={"crashes": [{"time_s": 0.5, "instance": 0}], "in_flight": "fail"},
    )
    assert [_row(r, i)["status"] for i in (0, 1, 2)] == ["failed", "finished", "failed"]
    r3 = _row(r, 3)
    assert (r3["routed_at"], r3["instance_id"], r3["status"]) == (1.0, r3_instance, r3_status)


def test_lost_requests_fail_without_retries_or_past_max_retries():
    """The same dead-instance window (crash at 1.0, detected at 3.0). With `in_flight:
    fail` r0 (t=1.5) fails at once (instance_crash). With `max_retries: 1` it is sent again
    at 2.25, lost again and fails (retries_exhausted, retries 1). A request arriving when no
    instance is listed at all (the only one crashed and detected) is rejected with
    no_instance."""
    trace = make_trace([1.5], [16], [10])
    crash = {"crashes": [{"time_s": 1.0, "instance": 0}], "retry_after_s": 0.75}
    fail = simulate(trace, cluster={"num_instances": 2}, router={"policy": "vllm"}, fleet={"detection_delay_s": 2.0},
                    faults={**crash, "in_flight": "fail"})
    row = _row(fail, 0)
    assert (row["status"], row["end_reason"], row["retries"]) == ("failed", "instance_crash", 0)
    assert fail.summary["fleet"]["num_failed"] == 1
    once = simulate(trace, cluster={"num_instances": 2}, router={"policy": "vllm"}, fleet={"detection_delay_s": 2.0},
                    faults={**crash, "max_retries": 1})
    row = _row(once, 0)
    assert (row["status"], row["end_reason"], row["retries"]) == ("failed", "retries_exhausted", 1)
    alone = simulate(trace, cluster={"num_instances": 1}, fleet={"detection_delay_s": 0.1}, faults=crash)
    row = _row(alone, 0)
    assert (row["status"], row["reject_reason"], row["end_reason"]) == ("rejected", "no_instance", "no_instance")
    assert alone.summary["fleet"]["num_rejected_no_instance"] == 1


def test_poisson_crashes_are_drawn_from_the_seed_alone():
    """`mtbf_s` draws each instance's crash times from its own stream (faults.seed, id):
    the same seed gives the same crashes, another seed others; the draw does not depend on
    the workload."""
    trace = make_trace([0.1 * k for k in range(40)], [16] * 40, [30] * 40)
    faults = {"mtbf_s": 1.0, "restart_s": 0.2, "retry_after_s": 0.05, "max_retries": 10}
    runs = [simulate(trace, cluster={"num_instances": 2}, router={"policy": "vllm"},
                     fleet={"startup_s": 0.1, "detection_delay_s": 0.05}, faults={**faults, "seed": s}) for s in (1, 1, 2)]
    crashes = [[(t, i) for t, i, ev in _events(r) if ev == "crash"] for r in runs]
    assert crashes[0] == crashes[1] and crashes[0] and crashes[0] != crashes[2]
    assert runs[0].requests.equals(runs[1].requests)
    assert set(runs[0].requests["status"]) <= {"finished", "failed", "rejected"}


def test_no_fleet_no_change():
    """Without fleet, faults or autoscaler the run is built as before: the plain router over
    the whole cluster, no fleet events, no new columns or summary block."""
    trace = make_trace([0.0], [16], [2])
    sim = build_simulation(make_config(), trace)
    assert type(sim.router) is Router and sim.fleet is None
    r = sim.run()
    assert r.fleet_events is None and "retries" not in r.requests and "fleet" not in r.summary
    fleet_sim = build_simulation(make_config(fleet={}), trace)
    assert type(fleet_sim.router) is FleetRouter


def test_the_routable_view_lists_a_subset_by_position():
    class Base:
        instances = ["i0", "i1", "i2"]
        block_size = 16
        now = 1.5

        def cached_prefix_tokens(self, request):
            return [0, 16, 32]

    view = RoutableView(Base(), [0, 2])
    assert view.instances == ["i0", "i2"] and view.cached_prefix_tokens(None) == [0, 32] and view.now == 1.5


def test_fleet_events_are_saved_and_read_back(tmp_path):
    trace = make_trace([0.0, 0.0], [16, 16], [5, 5])
    r = simulate(trace, cluster={"num_instances": 2}, faults={"crashes": [{"time_s": 0.01, "instance": 1}], "max_retries": 0})
    run = save_run(r, tmp_path / "run", figure=False)
    assert (run / "fleet_events.parquet").is_file()
    back = load_run(run)
    assert back.fleet_events.equals(r.fleet_events)
    def reasons(frame):
        return [None if pd.isna(v) else v for v in frame["end_reason"].astype(object)]

    assert reasons(back.requests) == reasons(r.requests) == [None, "retries_exhausted"]
    assert not math.isnan(back.summary["fleet"]["gpu_seconds"])


def _pd_sides_route_subsets() -> bool:
    import lmsim.policies.disagg as disagg

    return hasattr(disagg, "LocalView")


@pytest.mark.skipif(not _pd_sides_route_subsets(), reason="P/D sides over a routable subset come with the policyids branch")
def test_prefill_and_decode_pools_scale_on_their_own():
    """P/D: prefill pool p (instance 0, one more allocated: 1), decode pool d (instances 2,
    3). At t=1 the schedule asks p for 2 and d for 1: instance 1 starts (active at 1.0 +
    1.0 = 2.0), decode instance 3 drains.

    r1 (t=0.5, 32 tokens) was prefilled on 0 (0.010 + 0.032 = 0.042 s, done 0.542), its 2
    blocks (32 tokens x 1000 B at 1e9 B/s = 32 us) landed on decode 3 at 0.542032, whose
    next step computes the last prompt token (0.011 s): first token 0.553032, then 99
    decodes of 0.0101 s: finished 1.552932, when instance 3 stops. r2 and r3 arrive
    together at 2.5: the prefill side (fewest requests, first listed) puts r2 on 0 and r3 on
    the new instance 1; both decode on 2, the only decode instance listed."""
    pools = [{"name": "p", "role": "prefill", "num_instances": 1}, {"name": "d", "role": "decode", "num_instances": 2}]
    trace = make_trace([0.0, 0.5, 2.5, 2.5], [32] * 4, [150, 100, 5, 5])
    r = simulate(
        trace,
        cluster={"pools": pools, "kv_transfer": {"bandwidth_bytes_s": 1e9, "latency_s": 0.0},
                 "profile": {"kind": "linear", "step_base_s": 0.010, "per_prefill_token_s": 0.001,
                             "per_decode_seq_s": 0.0001, "kv_bytes_per_token": 1000}},
        router={"policy": "pd", "params": {"prefill_policy": "vllm", "decode_policy": "vllm"}},
        fleet={"pools": {"p": {"max_replicas": 2, "startup_s": 1.0}}},
        autoscaler={"name": "schedule", "interval_s": 1.0, "params": {"replicas": {"p": [[1.0, 2]], "d": [[1.0, 1]]}}},
    )
    assert [(t, i, ev) for t, i, ev in _events(r) if t > 0 and i >= 0] == [
        (1.0, 3, "drain"), (1.0, 1, "start"), (1.552932, 3, "stop"), (2.0, 1, "active"),
    ]
    r1 = _row(r, 1)
    assert (r1["prefill_instance_id"], r1["instance_id"]) == (0, 3)
    assert r1["finished_at"] == pytest.approx(1.552932)
    assert [(_row(r, i)["prefill_instance_id"], _row(r, i)["instance_id"]) for i in (2, 3)] == [(0, 2), (1, 2)]
    assert set(r.requests["status"]) == {"finished"}


class _Watcher:
    """An autoscaler that records what it is shown and asks for nothing."""

    registry_name = "watcher"

    def __init__(self) -> None:
        self.seen = []

    def bind(self, ctx) -> None:
        self.ctx = ctx

    def decide(self, observation):
        self.seen.append(observation)
        return {}


def test_the_scaler_reads_a_scrape_taken_metrics_delay_earlier():
    """interval 1 s, metrics delay 0.5 s: decision n at n s reads the scrape of n - 0.5 s,
    whose traffic is over (n - 1.5, n - 0.5].

    r0 (t=0.1, 16 tokens, 2 outputs): first token 0.1 + 0.026 = 0.126 (TTFT 0.026), one
    decode: done 0.1361 (ITL 0.0101). r1 (t=0.2, 32 tokens, 3 outputs): first token 0.2 +
    0.042 = 0.242 (TTFT 0.042), done 0.2622 (ITL 0.0101). The scrape at 0.5 sees 2 requests
    (rate 2/s), mean prompt (16 + 32)/2 = 24, mean output (2 + 3)/2 = 2.5, mean TTFT
    (0.026 + 0.042)/2 = 0.034, ITL 0.0101; one active instance, idle. r2 (t=0.7, 16, 2)
    is the traffic of the scrape at 1.5 (TTFT 0.026, output 2), read at 2.0; r3 at 2.2
    keeps the run going until then."""
    from lmsim.engine.simulation import Simulation
    from lmsim.policies import POLICIES

    trace = make_trace([0.1, 0.2, 0.7, 2.2], [16, 32, 16, 16], [2, 3, 2, 2])
    config = make_config(fleet={}, autoscaler={"name": "schedule", "interval_s": 1.0, "metrics_delay_s": 0.5,
                                               "params": {"replicas": {"default": [[0, 1]]}}})
    watcher = _Watcher()
    Simulation(config, trace, POLICIES.create("round_robin"), watcher).run()
    assert [(o.time_s, o.scraped_at_s) for o in watcher.seen] == [(1.0, 0.5), (2.0, 1.5)]
    first = watcher.seen[0].pools["default"]
    assert (first.num_requests, first.request_rate, first.mean_input_tokens, first.mean_output_tokens) == (2, 2.0, 24.0, 2.5)
    assert first.ttft_mean_s == pytest.approx(0.034) and first.itl_mean_s == pytest.approx(0.0101)
    assert (first.active, first.starting, first.draining, first.failed, first.target) == (1, 0, 0, 0, 1)
    assert (first.num_running, first.num_waiting, first.kv_usage) == (0, 0, 0.0)
    assert (first.min_replicas, first.max_replicas, first.role, first.gpus_per_instance) == (1, 1, "both", 1)
    second = watcher.seen[1].pools["default"]
    assert (second.num_requests, second.mean_input_tokens, second.mean_output_tokens) == (1, 16.0, 2.0)
    assert second.ttft_mean_s == pytest.approx(0.026)
    assert set(watcher.ctx.pools) == {"default"} and watcher.ctx.interval_s == 1.0


class _RaiseOnce(_Watcher):
    """Asks for 2 instances at its first decision, then only watches."""

    def decide(self, observation):
        self.seen.append(observation)
        return {"default": 2} if len(self.seen) == 1 else {}


def test_replica_counts_are_live_while_metrics_are_a_scrape_old():
    """interval 1 s, metrics delay 1.5 s (longer than the interval): decision 1 (t=1) reads
    the scrape of max(0, 1 - 1.5) = 0, decision 2 (t=2) the scrape of 0.5. The first decision
    raises the target from 1 to 2 (max 2; start-up 10 s, so the new instance is still
    starting at t=2). The scrape at 0.5 was taken before that, yet decision 2 must see
    target 2 and 1 starting instance: an HPA reads spec.replicas and readiness from the API
    server, not from the metrics pipeline. (With the scrape's counts it saw target 1 and
    would have asked again, or taken it back.) r0..r2 keep the run going past t=2."""
    from lmsim.engine.simulation import Simulation
    from lmsim.policies import POLICIES

    trace = make_trace([0.1, 1.2, 2.4], [16, 16, 16], [2, 2, 2])
    config = make_config(fleet={"startup_s": 10.0, "pools": {"default": {"max_replicas": 2}}},
                         autoscaler={"name": "schedule", "interval_s": 1.0, "metrics_delay_s": 1.5,
                                     "params": {"replicas": {"default": [[0, 1]]}}})
    watcher = _RaiseOnce()
    Simulation(config, trace, POLICIES.create("round_robin"), watcher).run()
    assert [(o.time_s, o.scraped_at_s) for o in watcher.seen][:2] == [(1.0, 0.0), (2.0, 0.5)]
    second = watcher.seen[1].pools["default"]
    assert (second.target, second.active, second.starting) == (2, 1, 1)


def test_the_schedule_scaler_answers_the_count_in_force():
    """`replicas: {a: [[0, 4], [600, 8], [1800, 4]]}`: 4 from 0 s, 8 from 600 s, 4 again
    from 1800 s; a pool whose first entry is later is left alone before it."""
    from lmsim.autoscalers import AUTOSCALERS
    from lmsim.errors import ConfigError
    from lmsim.scaling import FleetObservation

    scaler = AUTOSCALERS.create("schedule", {"replicas": {"a": [[0, 4], [600, 8], [1800, 4]], "b": [[100, 2]]}})
    answers = [scaler.decide(FleetObservation(t, t, 60.0, {})) for t in (0.0, 60.0, 599.0, 600.0, 1799.9, 1800.0)]
    assert answers == [{"a": 4}, {"a": 4}, {"a": 4, "b": 2}, {"a": 8, "b": 2}, {"a": 8, "b": 2}, {"a": 4, "b": 2}]
    for bad in ({"a": [[5, 1], [5, 2]]}, {"a": [[-1, 1]]}, {"a": [[0, -1]]}, {"a": []}, {}):
        with pytest.raises(ConfigError, match="autoscaler 'schedule'"):
            AUTOSCALERS.create("schedule", {"replicas": bad})


@pytest.mark.skipif(not _pd_sides_route_subsets(), reason="P/D sides over a routable subset come with the policyids branch")
def test_a_prefill_crash_sends_the_request_back_through_both_sides():
    """P/D, prefill instances 0 and 1, decode instance 2; the crash of 0 is noticed at once
    (detection 0). r0 (t=0, 200 tokens) is prefilling on 0 (the first listed) until 0.010 +
    0.200 = 0.21 s; 0 crashes at 0.1: its leg is lost, the request is sent again at 0.15,
    when only prefill instance 1 is listed: its leg is prefilled there, done at 0.15 + 0.21
    = 0.36, and decoded on 2. One retry; the handoff records are the second attempt's."""
    pools = [{"name": "p", "role": "prefill", "num_instances": 2}, {"name": "d", "role": "decode", "num_instances": 1}]
    r = simulate(
        make_trace([0.0], [200], [3]),
        cluster={"pools": pools, "kv_transfer": {"bandwidth_bytes_s": 1e9, "latency_s": 0.0},
                 "profile": {"kind": "linear", "step_base_s": 0.010, "per_prefill_token_s": 0.001,
                             "per_decode_seq_s": 0.0001, "kv_bytes_per_token": 1000}},
        router={"policy": "pd", "params": {"prefill_policy": "vllm", "decode_policy": "vllm"}},
        fleet={"detection_delay_s": 0.0},
        faults={"crashes": [{"time_s": 0.1, "instance": 0}], "retry_after_s": 0.05},
    )
    row = _row(r, 0)
    assert (row["retries"], row["prefill_instance_id"], row["instance_id"]) == (1, 1, 2)
    assert row["routed_at"] == pytest.approx(0.15) and row["prefill_done_at"] == pytest.approx(0.36)
    assert row["status"] == "finished" and r.summary["fleet"]["num_crashes"] == 1


def test_a_crash_removes_the_instance_from_the_routers_replica_of_the_caches():
    """`kv_view: events`: the router's replica of the caches learns instance 0's blocks from
    its KV events, each published when the step that stored the block ends. r0 (t=0)
    stores the 4-block prefix there in its prefill step, 0 -> 0.074 s. Instance 0 crashes
    at 0.03, mid-step: every block it held is published removed, stamped no earlier than
    its last published event (0.074), so the replica applies the removal after the stores
    and at the end holds nothing on 0 (bit 0 of no entry). Stamped at the crash (0.03) the
    removals would come first and the stores would leave the blocks listed on 0. r1 (t=2,
    8 tokens) fills no block."""
    trace = make_trace([0.0, 2.0], [64, 8], [2, 2], [PREFIX, []])
    config = make_config(
        cluster={"num_instances": 2}, router={"policy": "vllm", "view": {"kv_view": "events", "kv_event_delay_s": 0.0}},
        fleet={"startup_s": 0.5}, faults={"crashes": [{"time_s": 0.03, "instance": 0}], "restart_s": 0.1},
    )
    sim = build_simulation(config, trace)
    replica = sim.adapter.events
    sim.run()
    replica.catch_up(float("inf"))
    assert not [h for h, mask in replica._holders.items() if mask & 1]
    crashed = [ev for _t, i, ev in _events_of(sim) if i == 0]
    assert crashed == ["active", "crash", "detected", "restart", "start", "active"]


def _events_of(sim) -> list[tuple[float, int, str]]:
    return [(t, i, ev) for t, i, _pool, _gpu, _gpus, ev, _target in sim.fleet.events]
