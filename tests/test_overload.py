"""Overload: a run at several times capacity still terminates, with bounded state, and
says what it could not do: `cluster.max_waiting` turns arrivals away (counted as
rejected), `simulation.drain_limit_s` stops the run that long after the last arrival
(what is left is unfinished), and `summary.json` reports the two separately.

Linear profile (conftest): a step costs 10 ms + 1 ms per prefill token + 0.1 ms per decode.
A 100-token prompt with 10 outputs, alone on an instance, takes 110 ms to its first token
and 9 decode steps of 10.1 ms: 0.2009 s in all.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import make_trace, simulate
from lmsim.study.rundir import save_run

ALONE_S = 0.110 + 9 * 0.0101  # one 100-token, 10-output request on an idle instance


def statuses(results) -> list[str]:
    return list(results.requests.status.astype(str))


def test_a_burst_larger_than_the_queue_cap_is_cut_at_the_cap():
    # Ten arrivals at t=0 are all routed before the idle instance wakes up (arrivals come
    # first at equal times), so the queue takes 3 and turns the other 7 away.
    r = simulate(make_trace([0.0] * 10, [100] * 10, [10] * 10), cluster={"max_waiting": 3})
    assert statuses(r) == ["finished"] * 3 + ["rejected"] * 7
    assert (r.summary["num_finished"], r.summary["num_unfinished"], r.summary["num_rejected"]) == (3, 0, 7)


def test_the_queue_cap_is_per_instance():
    # Round robin over 2 instances: 0,2,4,6,8 to instance 0 and 1,3,5,7,9 to instance 1;
    # each keeps its first 3.
    r = simulate(
        make_trace([0.0] * 10, [100] * 10, [10] * 10),
        cluster={"num_instances": 2, "max_waiting": 3},
    )
    assert statuses(r) == ["finished"] * 6 + ["rejected"] * 4
    rejected = r.requests[r.requests.status.astype(str) == "rejected"]
    # a rejected request was routed (it has an instance and a routing time) and nothing more
    assert list(rejected.instance_id) == [0, 1, 0, 1]
    assert rejected.routed_at.notna().all()
    assert rejected[["first_scheduled_at", "first_token_at", "finished_at"]].isna().all().all()


def test_the_drain_limit_leaves_a_known_number_unfinished():
    # One running slot: the three requests run back to back, finishing at 0.2009 s and
    # 0.4018 s; the third starts then and is still prefilling when the run stops at 0.5 s.
    r = simulate(
        make_trace([0.0] * 3, [100] * 3, [10] * 3),
        cluster={"max_num_seqs": 1},
        simulation={"drain_limit_s": 0.5},
    )
    assert statuses(r) == ["finished", "finished", "unfinished"]
    req = r.requests
    assert req.finished_at.iloc[1] == pytest.approx(2 * ALONE_S)
    assert req.first_scheduled_at.iloc[2] == pytest.approx(2 * ALONE_S)
    assert np.isnan(req.first_token_at.iloc[2])
    assert r.summary["sim_time_s"] == 0.5
    assert (r.summary["num_finished"], r.summary["num_unfinished"], r.summary["num_rejected"]) == (2, 1, 0)


def test_the_drain_limit_counts_from_the_last_arrival():
    # The last arrival is at 0.3 s: the run stops at 0.8 s. Request 0 (0.2009 s) and
    # request 1 (queued behind it, done at 0.4018 s) finish; request 2 arrives at 0.3 s,
    # starts at 0.4018 s and finishes at 0.6027 s, inside the limit.
    r = simulate(
        make_trace([0.0, 0.0, 0.3], [100] * 3, [10] * 3),
        cluster={"max_num_seqs": 1},
        simulation={"drain_limit_s": 0.5},
    )
    assert statuses(r) == ["finished"] * 3
    assert r.requests.finished_at.iloc[2] == pytest.approx(3 * ALONE_S)


def test_rejected_and_unfinished_are_reported_separately_in_summary_json(tmp_path):
    # Six at t=0 with a queue of 3: 3 rejected; of the 3 queued, two finish before the
    # 0.5 s drain limit and one does not.
    r = simulate(
        make_trace([0.0] * 6, [100] * 6, [10] * 6),
        cluster={"max_num_seqs": 1, "max_waiting": 3},
        simulation={"drain_limit_s": 0.5},
    )
    save_run(r, tmp_path / "run", figure=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {k: summary[k] for k in ("num_requests", "num_finished", "num_unfinished", "num_rejected")} == {
        "num_requests": 6,
        "num_finished": 2,
        "num_unfinished": 1,
        "num_rejected": 3,
    }
    # latency statistics cover finished requests only: both TTFTs, 0.110 and 0.3109 s
    assert summary["ttft_s_mean"] == pytest.approx((0.110 + ALONE_S + 0.110) / 2)


# -- three times capacity ---------------------------------------------------------------------

# 200-token prompts cost 200 ms of prefill-token time each whatever the batching, so one
# instance serves at most 5 requests/s. Arrivals at 15/s for 20 s are 3x that bound.
RATE, DURATION, PROMPT, OUTPUT = 15.0, 20.0, 200, 20
N = int(RATE * DURATION)
ARRIVALS = [i / RATE for i in range(N)]
CAPACITY_BOUND = 5.0  # requests per second


def overload_trace():
    return make_trace(ARRIVALS, [PROMPT] * N, [OUTPUT] * N)


def test_three_times_capacity_with_cap_and_drain_terminates_with_bounded_state():
    cap, seqs, drain = 20, 8, 2.0
    r = simulate(
        overload_trace(),
        cluster={"max_waiting": cap, "max_num_seqs": seqs},
        simulation={"drain_limit_s": drain, "sample_interval_s": 0.5},
    )
    s = r.summary
    last = ARRIVALS[-1]
    assert s["sim_time_s"] == last + drain  # stopped by the drain limit, not by running dry
    assert s["num_finished"] + s["num_unfinished"] + s["num_rejected"] == N
    assert s["num_finished"] <= CAPACITY_BOUND * (last + drain)
    assert s["num_rejected"] > N // 2  # at 3x, most arrivals find the queue full
    assert 0 < s["num_unfinished"] <= cap + seqs  # what was queued or running at the stop
    # Regression pin (the bounds above are the hand-derived part): speed work on the engine
    # must not move these.
    assert (s["num_finished"], s["num_unfinished"], s["num_rejected"]) == (89, 19, 192)
    # Bounded state: never more than the cap waiting, and one sample per instance per
    # period of simulated time.
    inst = r.instances
    assert inst.num_waiting.max() == cap
    assert (inst.num_running + inst.num_waiting).max() <= cap + seqs
    assert len(inst) == int((last + drain) / 0.5) + 1


def test_three_times_capacity_without_limits_still_finishes_everything():
    # No cap and no drain limit: the queue grows, but a finite trace drains completely.
    r = simulate(overload_trace(), cluster={"max_num_seqs": 8})
    assert r.summary["num_finished"] == N
    assert r.summary["num_rejected"] == 0
    # the backlog really built up: the last request waited far longer than it took to serve
    last = r.requests.iloc[-1]
    assert last.queue_s > 10 * (last.e2e_s - last.queue_s)
    assert r.summary["sim_time_s"] >= N / CAPACITY_BOUND


# -- known engine bugs (lmsim/engine/simulation.py) ---------------------------------------------------


def test_the_drain_limit_counts_from_a_closed_loop_successors_arrival():
    # Row 1 follows row 0 (done at 0.1302 s) after 5 s of think time: it arrives at
    # 5.1302 s, so a 3 s drain limit should stop the run at 8.1302 s with both finished.
    trace = make_trace([0.0, 0.0], [100, 100], [3, 3], after_id=[-1, 0], delay_s=[0.0, 5.0])
    r = simulate(trace, simulation={"drain_limit_s": 3.0})
    assert statuses(r) == ["finished", "finished"]


def test_a_drain_limit_that_never_bites_changes_nothing():
    trace = make_trace([0.0], [100], [3])
    free = simulate(trace)
    limited = simulate(trace, simulation={"drain_limit_s": 50.0})
    assert limited.summary["sim_time_s"] == free.summary["sim_time_s"]


def test_the_drain_limit_fires_while_a_follow_up_waits_on_an_unfinished_request():
    """Request 0 decodes 100,000 tokens (about 1,000 s; its 6,257 blocks fit in 7,000);
    request 1 follows it. The drain
    limit of 5 s after the last arrival (request 0 at 0 s) stops the run at 5 s: request 0
    is unfinished and its follow-up never arrives. A follow-up waiting on its predecessor
    used to keep the limit from firing."""
    r = simulate(
        make_trace([0.0, 0.0], [100, 100], [100_000, 10], after_id=[-1, 0], delay_s=[0.0, 1.0]),
        cluster={"num_gpu_blocks": 7000},
        simulation={"drain_limit_s": 5.0},
    )
    assert statuses(r) == ["unfinished", "not_arrived"]
    assert r.summary["sim_time_s"] == 5.0


def test_a_resumed_request_that_no_longer_fits_beside_the_watermark_is_rejected():
    """vLLM v0 (`BlockSpaceManager.can_allocate` says NEVER when total blocks - required <
    watermark; `Scheduler._schedule_prefills` marks the group FINISHED_IGNORED and moves on).

    20 blocks, watermark 0.3 x 20 = 6. B (16-token prompt, 1 block) and A (208 tokens, 13
    blocks) arrive together: B needs 1 + 6 <= 20, A 13 + 6 <= 19; both prefill in step 0.
    Each needs a new block at decode steps 1, 17, 33 (B at positions 16, 32, 48; A at 208,
    224, 240): after step 33 B holds 4 and A 16, all 20. At step 49 B needs its 5th, none is
    free, and A, the newest, is preempted with 49 tokens sampled: 208 + 49 = 257 tokens = 17
    blocks, and 17 + 6 > 20, so it can never be admitted again. It is rejected when it heads
    the waiting queue at step 50, planned at 0.234 + 48 x 0.0102 + 0.0101 = 0.7337 s (prefill
    0.010 + 224 x 0.001 s, two decodes 0.0102 s, one 0.0101 s); B finishes alone. It used
    to wait forever while the idle instance planned empty steps."""
    r = simulate(
        make_trace([0.0, 0.0], [16, 208], [100, 100]),
        cluster={
            "num_gpu_blocks": 20,
            "admission": "whole_prompt_watermark",
            "watermark_blocks_fraction": 0.3,
        },
        simulation={"drain_limit_s": 100.0},
    )
    assert statuses(r) == ["finished", "rejected"]
    a = r.requests.iloc[1]
    assert a.reject_reason == "resume_exceeds_kv_cache"
    assert a.num_preemptions == 1
    assert a.first_token_at == pytest.approx(0.234)
    assert r.summary["num_rejected_resume_exceeds_kv_cache"] == 1
    # B: prefill 0.234, 48 decode steps beside A (0.0102), then 51 alone (0.0101)
    assert r.requests.finished_at.iloc[0] == pytest.approx(0.234 + 48 * 0.0102 + 51 * 0.0101)
