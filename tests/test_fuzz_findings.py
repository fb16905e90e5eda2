"""The engine defects the differential fuzzer found (issue 39), each as its minimized
scenario built here, with what the engine must do instead.

Profiles: the conftest linear one (10 ms a step + 1 ms a prefill token + 0.1 ms a decode),
or the dyadic one (2^-7 s a step + 2^-10 s a prefill token) whose times are exact binary
fractions, so step ends, arrivals and loads tie exactly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import LINEAR, make_config, make_trace
from lmsim.engine.invariants import idle_prefill_time, least_prefill_time
from lmsim.errors import InvariantError
from lmsim.profile.base import LinearCostModel
from lmsim.study.compose import build_simulation

DYADIC = {"kind": "linear", "step_base_s": 2**-7, "per_prefill_token_s": 2**-10,
          "per_decode_seq_s": 0.0, "per_context_token_s": 0.0}


def run_both(trace, **sections):
    """The run with fast-forward on (and the invariant checker) and off: identical."""
    results = []
    for fast_forward in (True, False):
        config = make_config(**sections)
        sim_cfg = config.simulation.model_copy(update={"fast_forward": fast_forward})
        results.append(build_simulation(config.model_copy(update={"simulation": sim_cfg}), trace).run())
    fast, stepped = results
    pd.testing.assert_frame_equal(fast.requests, stepped.requests, check_exact=True)
    return fast, stepped


# -- 1. P/D with asynchronous scheduling: a leg preempted with its last chunk in flight -------


def test_a_prefill_leg_preempted_with_its_last_chunk_in_flight_is_recomputed_on_decode():
    """Three prompts (129, 129, 97 tokens) on a 24-block prefill instance, chunks of at most
    20 tokens, asynchronous scheduling. Request 2's leg is planned its last chunk, then the
    next plan (made while that chunk computes) preempts it for room: vLLM still appends the
    in-flight token, so the leg finishes from the waiting queue at 0.400390625 s, but with
    no blocks (vLLM NixlConnector `request_finished`: `delay_free_blocks = len(block_ids) >
    0`). Before the fix the handoff tried to read and free that KV: KeyError in
    `release_held` (the checker: "past its prefill but does not hold its KV").

    Now the decode instance, idle, prefills all 97 tokens itself in one step:
    0.400390625 + 2^-7 + 97 * 2^-10 = 0.5029296875 s; no transfer is recorded for it."""
    trace = make_trace([0.0, 0.0166015625, 0.0302734375], [129, 129, 97], [1, 1, 1])
    cluster = {
        "profile": {**DYADIC, "kv_bytes_per_token": 262144}, "async_scheduling": True, "num_gpu_blocks": 64,
        "pools": [
            {"name": "p", "role": "prefill", "num_instances": 1, "num_gpu_blocks": 24, "long_prefill_token_threshold": 20},
            {"name": "d", "role": "decode", "num_instances": 1},
        ],
    }
    router = {"policy": "pd", "params": {"prefill_policy": "round_robin", "decode_policy": "round_robin"}}
    fast, _ = run_both(trace, cluster=cluster, router=router)
    r = fast.requests
    assert list(r.status) == ["finished"] * 3
    assert r.num_preemptions[2] == 1
    assert r.prefill_done_at[2] == 0.400390625
    assert r.first_token_at[2] == 0.400390625 + 2**-7 + 97 * 2**-10 == 0.5029296875
    assert np.isnan(r.kv_transfer_start_at[2]) and pd.isna(r.kv_transfer_bytes[2])
    assert fast.summary["num_kv_transfers"] == 2
    assert fast.summary["num_prefilled_on_decode"] == 1


# -- 2. a tier load landing exactly at a step end ----------------------------------------------


def test_a_tier_load_landing_at_a_step_end_is_seen_alike_with_fast_forward_on_and_off():
    """Request 2 (16 tokens, block 1000 in host memory) is admitted at the step boundary
    3.326171875 s and loads its block: 16 tokens x 65536 B at 8 MiB/s = 0.125 s, landing at
    3.451171875 s, exactly when one of request 1's decode steps (2^-7 s each) ends. The
    landing counts after the step ends, like a P/D transfer's (ARRIVAL priority): that
    step plans request 1's last decode alone; request 2 joins when it ends at 3.458984375 s
    and computes its one token (the load covers all 16 but the last is recomputed):
    3.458984375 + 2^-7 + 2^-10 = 3.4677734375 s. Before the fix the landing ran at the step
    end's own priority, and stepping saw it first (3.4599609375 s) while a fast-forwarded
    run, whose end event was queued earlier, saw it after."""
    trace = make_trace([2.83203125, 2.8564453125, 3.3251953125], [167, 99, 16], [1, 46, 1],
                       [[], [1000, 1001, 1005002, 1005003, 1005004, 1005005, 1005006], [1000]])
    cluster = {"profile": {**DYADIC, "kv_bytes_per_token": 65536}, "num_gpu_blocks": 60,
               "kv_tiers": {"host": {"capacity_blocks": 8, "read_bytes_s": 8388608.0}}}
    fast, _ = run_both(trace, cluster=cluster)
    r = fast.requests
    assert r.first_scheduled_at[2] == 3.326171875
    assert r.kv_hit_tokens_host[2] == 16 and r.kv_load_s[2] == 0.125
    assert r.finished_at[1] == 3.458984375
    assert r.first_token_at[2] == 3.458984375 + 2**-7 + 2**-10 == 3.4677734375


# -- 3. the TTFT floor of the invariant checker --------------------------------------------------


CONTEXT = {**DYADIC, "per_decode_seq_s": 2**-12, "per_context_token_s": 2**-20}


def test_the_ttft_floor_prices_the_short_chunk_first_and_keeps_the_threshold():
    """A 33-token prompt, budget 32, long_prefill_token_threshold 20 (vLLM 0.11 applies it
    even to a request alone). Each chunk pays for its whole context (c + q) at 2^-20 s a
    token. The engine runs 20 + 13: 2 x 2^-7 + 33 x 2^-10 + (20 + 33) x 2^-20 = 0.0479021 s.
    The old floor, the idle engine's maximal chunks 32 + 1, charged (32 + 33) x 2^-20 and
    called that a violation. The least any schedule can pay: the fewest chunks of at most
    20 (two), the short one first, 13 + 20: (13 + 33) x 2^-20, so the floor is 2 x 2^-7 +
    33 x 2^-10 + 46 x 2^-20."""
    trace = make_trace([0.0], [33], [1])
    cluster = {"profile": CONTEXT, "num_gpu_blocks": 62, "max_num_batched_tokens": 32,
               "long_prefill_token_threshold": 20}
    fast, _ = run_both(trace, cluster=cluster)
    assert fast.requests.ttft_s[0] == 2 * 2**-7 + 33 * 2**-10 + 53 * 2**-20
    sim = build_simulation(make_config(cluster=cluster), trace)
    pool = sim.instances[0].pool
    assert least_prefill_time(sim, 33, 0, pool) == 2 * 2**-7 + 33 * 2**-10 + 46 * 2**-20
    assert idle_prefill_time(sim, 33, 0) == 2 * 2**-7 + 33 * 2**-10 + 65 * 2**-20  # above the TTFT


def test_the_tightened_floor_still_catches_an_engine_that_prefills_too_fast():
    """The same prompt on an engine secretly charging half the context price: 2 x 2^-7 +
    33 x 2^-10 + 26.5 x 2^-20 = 0.0478768 s, below the floor's 46 x 2^-20 (0.0478954 s)."""
    trace = make_trace([0.0], [33], [1])
    sim = build_simulation(make_config(cluster={"profile": CONTEXT, "num_gpu_blocks": 62, "max_num_batched_tokens": 32,
                                          "long_prefill_token_threshold": 20}), trace)
    sim.instances[0].scheduler.cost_model = LinearCostModel(2**-7, 2**-10, 2**-12, 2**-21)
    with pytest.raises(InvariantError, match=r"request 0 TTFT 0\.047877s below its idle prefill time 0\.047895s"):
        sim.run()


def test_the_ttft_floor_of_a_fully_loaded_prompt_computes_its_last_token_after_the_rest():
    """Two 16-token prompts naming block 1000; host memory keeps it. The second cannot hit
    it on the GPU (a hit leaves at least one token to compute) but loads it from host
    memory (16 x 1024 B at 32 GB/s: 0.512 us) and computes its last token after 15 of
    context: 10 + 1 + 0.001 x 16 ms = 11.016 ms, TTFT 11.0165 ms. The old floor priced
    that token after all 16 (11.017 ms) and reported a violation."""
    trace = make_trace([0.0, 2.424], [16, 16], [1, 1], [[1000], [1000]])
    cluster = {"profile": {**LINEAR, "per_context_token_s": 1e-6, "kv_bytes_per_token": 1024},
               "num_gpu_blocks": 64, "kv_tiers": {"host": {"capacity_blocks": 1}}}
    fast, _ = run_both(trace, cluster=cluster)
    assert fast.requests.kv_hit_tokens_host[1] == 16
    assert fast.requests.ttft_s[1] == pytest.approx(0.010 + 0.001 + 16e-6 + 16 * 1024 / 32e9, abs=1e-12)


def test_under_pd_the_ttft_floor_and_the_record_count_the_prefill_legs_tier_load():
    """P/D with host memory on every instance: request 1 (16 tokens, block 1000, like
    request 0 before it) loads its block from the prefill instance's host memory, 16 x
    512 KiB = 8 MiB, and computes one token there. The floor used to charge the prefill
    instance all 16 tokens (0.032394 s against a TTFT of 0.018008 s); the leg's tier hit
    now counts like a prefix hit. The request's record also carries the leg's tier columns
    (they were null while the summary counted the load)."""
    trace = make_trace([0.0, 0.0703125], [16, 16], [1, 1], [[1000], [1000]])
    cluster = {"profile": {**DYADIC, "kv_bytes_per_token": 524288}, "num_gpu_blocks": 60,
               "kv_tiers": {"host": {"capacity_blocks": 1}},
               "pools": [{"name": "p", "role": "prefill", "num_instances": 1},
                         {"name": "d", "role": "decode", "num_instances": 1}]}
    fast, _ = run_both(trace, cluster=cluster, router={"policy": "pd"})
    r, s = fast.requests, fast.summary
    assert r.kv_hit_tokens_host[1] == 16 and r.kv_hit_tokens_disk[1] == 0
    assert r.kv_load_bytes[1] == 16 * 524288 == s["kv_load_bytes_host"]
    assert s["kv_num_loads"] == 1
    assert r.ttft_s[1] == pytest.approx(0.018008, abs=1e-6)


# -- 4. counters of a run the drain limit cuts ----------------------------------------------------


def test_a_drain_limit_cut_counts_the_steps_that_ended_with_fast_forward_on_and_off():
    """Two pools of one instance, a request each at t=0: 100 tokens prefill in 110 ms, then
    decode steps of 10.1 ms. drain_limit_s 0.2 cuts both at 0.2 s, after the prefill and 8
    decode steps (the 8th ends at 0.1908 s, the 9th would at 0.2009 s): 9 steps each, busy
    0.1908 s of 0.2. Fast-forward ran the decodes as one planned run whose end had not come,
    and counted only the prefill: 2 steps and busy fractions 0.55."""
    trace = make_trace([0.0, 0.0], [100, 100], [30, 30])
    cluster = {"pools": [{"name": "a", "num_instances": 1}, {"name": "b", "num_instances": 1}]}
    fast, stepped = run_both(trace, cluster=cluster, simulation={"drain_limit_s": 0.2})
    for results in (fast, stepped):
        s = results.summary
        assert s["num_unfinished"] == 2 and s["sim_time_s"] == 0.2
        assert s["num_steps"] == 18
        assert s["busy_fraction_a"] == pytest.approx((0.110 + 8 * 0.0101) / 0.2, rel=1e-12)
        assert s["busy_fraction_b"] == pytest.approx(0.954, rel=1e-12)


# -- 5. a hand-over and an arrival at the same instant --------------------------------------------


def test_a_hand_over_joins_the_decode_queue_before_an_arrival_at_the_same_instant():
    """1 prefill + 1 decode instance (max_num_seqs 1), dynamo_disagg with the conditional
    bypass. Request 0 (48 tokens, blocks 1000-1002, 16 outputs): prefilled on P in
    2^-7 + 48 * 2^-10 = 0.0546875 s, its 3 MiB land at 2^30 B/s 0.0029296875 s later, D
    computes its last prompt token by 0.06640625 s and decodes 15 steps of 2^-7 s to
    T = 0.18359375 s. Its closed-loop successor, request 2 (64 tokens, 48 cached on D:
    eff_isl 16 < 64 and 16/64 < 0.7), arrives at T and is bypassed to D. Request 1 (32
    tokens) arrives at 0.14453125 s and its leg ends on P at 0.14453125 + 2^-7 + 32 *
    2^-10 = T too, so it is handed over to D at T.

    The hand-over goes first (`clock.HANDOVER`, before ARRIVAL): D's plan at T starts
    request 1's load (allocating its blocks, no seat) and admits request 2 (16 tokens,
    first token at T + 2^-7 + 16 * 2^-10 = 0.20703125 s, done one decode later at
    0.21484375 s). Request 1's 2 MiB land 2^21 / 2^30 = 2^-9 s later, at 0.185546875 s, polled
    by the step planned at 0.20703125 s and applied at its end, 0.21484375 s; its last
    prompt token then takes 2^-7 + 2^-10: first token at 0.2236328125 s.

    Both had ARRIVAL priority before, so they went in the order their events were made,
    that is in the order the steps ending at T had been scheduled: stepping scheduled P's
    step (planned at 0.14453125 s) before D's last step (planned at 0.17578125 s), but
    fast-forward planned D's whole decode run at 0.06640625 s. With fast-forward, request 2
    was queued first and took D's only seat, request 1's load started only at 0.21484375 s
    and its first token came at 0.2255859375 s."""
    T = 0.18359375
    trace = make_trace([0.0, 0.14453125, 0.0], [48, 32, 64], [16, 2, 2], [[1000, 1001, 1002], [], [1000, 1001, 1002, 1003]],
                       after_id=np.array([-1, -1, 0]), delay_s=np.array([0.0, 0.0, 0.0]))
    cluster = {"profile": {**DYADIC, "kv_bytes_per_token": 65536}, "num_gpu_blocks": 64,
               "pools": [{"name": "p", "role": "prefill", "num_instances": 1},
                         {"name": "d", "role": "decode", "num_instances": 1, "max_num_seqs": 1}],
               "kv_transfer": {"bandwidth_bytes_s": 2.0**30, "latency_s": 0.0}}
    router = {"policy": "dynamo_disagg",
              "params": {"conditional_disagg": True, "eff_isl_threshold": 64, "decode_choice": "at_arrival"}}
    fast, _ = run_both(trace, cluster=cluster, router=router)
    r = fast.requests
    assert r.finished_at[0] == T and r.arrived_at[2] == T and r.prefill_done_at[1] == T
    assert np.isnan(r.kv_transfer_start_at[2])  # bypassed: prefilled on D
    assert r.first_token_at[2] == T + 2**-7 + 16 * 2**-10 == 0.20703125
    assert r.kv_transfer_start_at[1] == T
    assert r.kv_transfer_s[1] == 32 * 65536 / 2**30 == 2**-9
    assert r.first_token_at[1] == 0.20703125 + 2**-7 + 2**-7 + 2**-10 == 0.2236328125
