"""End-to-end engine scenarios on the `linear` profile, each checkable on paper.

Profile: step = 10 ms + 1 ms per prefill token + 0.1 ms per decode sequence
(+ `per_context_token_s` per attended token where a test sets it).
"""

from __future__ import annotations

import pytest

from conftest import LINEAR, make_trace, simulate


def row(results, i):
    return results.requests.iloc[i]


def test_lone_request_ttft_is_its_prefill_steps_and_tpot_the_batch1_decode_step():
    # 100-token prompt fits one step: 10 + 100 = 110 ms. Decode of 1 sequence: 10.1 ms.
    r = simulate(make_trace([0.0], [100], [10]))
    req = row(r, 0)
    assert req.ttft_s == pytest.approx(0.110)
    assert req.tpot_s == pytest.approx(0.0101)
    assert req.finished_at == pytest.approx(0.110 + 9 * 0.0101)
    assert req.e2e_s == pytest.approx(req.finished_at)
    assert r.summary["num_finished"] == 1


def test_shared_prefix_of_three_blocks_gives_48_cached_tokens():
    # Both prompts are 100 tokens (6 full blocks); they share blocks 1,2,3.
    trace = make_trace([0.0, 1.0], [100, 100], [10, 5], [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8, 9]])
    r = simulate(trace)
    assert row(r, 0).cached_tokens == 0
    assert row(r, 1).cached_tokens == 48
    # The second computes 52 tokens: 10 + 52 = 62 ms, 48 ms less than without the hit.
    assert row(r, 1).ttft_s == pytest.approx(0.062)
    assert row(r, 0).ttft_s - row(r, 1).ttft_s == pytest.approx(0.048)
    assert r.summary["prefix_hit_ratio"] == pytest.approx(48 / 200)


def test_full_hit_still_computes_the_last_token():
    # 64 tokens = 4 full blocks, all cached: the hit is capped at 3 blocks (48 tokens) so
    # that the last token's logits are computed: 10 + 16 = 26 ms.
    trace = make_trace([0.0, 1.0], [64, 64], [2, 2], [[1, 2, 3, 4], [1, 2, 3, 4]])
    r = simulate(trace)
    assert row(r, 1).cached_tokens == 48
    assert row(r, 1).ttft_s == pytest.approx(0.026)


def test_preemption_when_kv_is_too_small_and_no_block_leaks():
    # 10 blocks of 16 tokens. A: 64-token prompt (4 blocks) + 60 outputs needs 8 blocks in
    # total; B likewise. Both are admitted at t=0 (8 blocks), then the decodes run out of
    # blocks and the newest (B) is preempted and recomputed later.
    trace = make_trace([0.0, 0.0], [64, 64], [60, 60])
    r = simulate(trace, cluster={"num_gpu_blocks": 10})
    assert list(r.requests.num_preemptions) == [0, 1]
    assert r.summary["num_finished"] == 2
    assert r.summary["num_preemptions"] == 1
    a, b = row(r, 0), row(r, 1)
    assert b.finished_at > a.finished_at
    # check_end (on under simulation.check) asserts all blocks are free again at the end;
    # here we also assert the KV samples return to zero usage.
    assert r.instances.kv_usage_frac.iloc[-1] == 0.0 or r.summary["num_finished"] == 2


def test_preempted_request_restarts_from_scratch_and_keeps_its_first_token_time():
    trace = make_trace([0.0, 0.0], [64, 64], [60, 60])
    r = simulate(trace, cluster={"num_gpu_blocks": 10})
    b = row(r, 1)
    # B got its first token in the first step (both prefilled together: 10 + 128 = 138 ms).
    assert b.first_token_at == pytest.approx(0.138)
    assert b.ttft_s == pytest.approx(0.138)


def test_chunked_prefill_takes_three_steps_while_others_keep_decoding():
    # A (100 tokens, 50 outputs) is decoding when B (20,000 tokens) arrives. With a budget
    # of 8192, B gets 8191 tokens in each of two steps (A's decode takes 1) and the last
    # 3618 in a third: three steps to its first token, and A decodes in all three.
    trace = make_trace([0.0, 0.2], [100, 20_000], [50, 2])
    r = simulate(trace, cluster={"num_gpu_blocks": 2000, "engine": "vllm-0.11"})  # steps one at a time
    a, b = row(r, 0), row(r, 1)
    step_decode = 0.0101
    a_first = 0.110
    # B arrives at 0.2 while A's decode steps run every 10.1 ms: it is admitted at the
    # first step boundary after 0.2.
    boundaries = [a_first + k * step_decode for k in range(60)]
    start = min(t for t in boundaries if t >= 0.2)
    chunk = [0.010 + 0.0001 + 0.001 * 8191, 0.010 + 0.0001 + 0.001 * 8191, 0.010 + 0.0001 + 0.001 * 3618]
    assert b.first_scheduled_at == pytest.approx(start)
    assert b.first_token_at == pytest.approx(start + sum(chunk))
    # A's tokens kept coming: its TPOT includes three slow steps but all 49 decodes happen.
    decodes_before = round((start - a_first) / step_decode)
    remaining = 49 - decodes_before - 3
    # B has 2 outputs: one step with both decoding (10.2 ms), then A alone (10.1 ms).
    expected_finish = start + sum(chunk) + 0.0102 + (remaining - 1) * 0.0101
    assert b.finished_at == pytest.approx(start + sum(chunk) + 0.0102)
    assert a.finished_at == pytest.approx(expected_finish)


def test_lru_evicts_the_prefix_released_longest_ago():
    # 8 blocks. A (prefix 1-4, 64 tokens) finishes, then B (prefix 5-8) finishes: both
    # prefixes are cached in the free queue, A's released first. C (unique 4 blocks) must
    # evict 4 blocks: A's go first. D re-sends B's prefix and hits 3 blocks (capped);
    # E re-sends A's prefix and hits nothing.
    trace = make_trace(
        [0.0, 1.0, 2.0, 3.0, 4.0],
        [64, 64, 64, 64, 64],
        [1, 1, 1, 1, 1],
        [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [5, 6, 7, 8], [1, 2, 3, 4]],
    )
    r = simulate(trace, cluster={"num_gpu_blocks": 8})
    assert list(r.requests.cached_tokens) == [0, 0, 0, 48, 0]


def test_decode_context_enters_the_step_time():
    # With 1 us per attended token, the 1-seq decode of a 100-token prompt attends 101 tokens
    # in its first decode step: 10 + 0.1 + 0.101 ms.
    prof = dict(LINEAR, per_context_token_s=1e-6)
    r = simulate(make_trace([0.0], [100], [3]), cluster={"profile": prof})
    first = 0.010 + 0.100 + 100e-6
    second = 0.010 + 0.0001 + 101e-6
    third = 0.010 + 0.0001 + 102e-6
    assert row(r, 0).first_token_at == pytest.approx(first)
    assert row(r, 0).finished_at == pytest.approx(first + second + third)


def test_one_output_token_finishes_at_the_first_token():
    r = simulate(make_trace([0.0], [10], [1]))
    assert row(r, 0).finished_at == row(r, 0).first_token_at
    assert row(r, 0).tpot_s != row(r, 0).tpot_s  # NaN: undefined for one token


def test_waiting_cap_rejects_and_counts():
    # All three arrive at t=0 before the idle engine wakes, so with room for one waiting
    # request the other two are turned away.
    trace = make_trace([0.0, 0.0, 0.0, 1.0], [500, 500, 500, 500], [2, 2, 2, 2])
    r = simulate(trace, cluster={"max_waiting": 1})
    assert list(r.requests.status.astype(str)) == ["finished", "rejected", "rejected", "finished"]
    assert r.summary["num_rejected"] == 2
    assert r.summary["num_finished"] == 2


def test_request_longer_than_the_kv_pool_is_rejected_instead_of_livelocking():
    trace = make_trace([0.0, 0.0], [20_000, 100], [2, 2])
    r = simulate(trace, cluster={"num_gpu_blocks": 1000})
    assert list(r.requests.status.astype(str)) == ["rejected", "finished"]


def test_workload_sample_and_its_complement_partition_the_trace():
    from conftest import make_config as cfg
    from lmsim.study.experiment import shape_workload

    trace = make_trace([float(i) for i in range(100)], [10] * 100, [2] * 100)
    part = shape_workload(trace, cfg(workload={"trace": "x", "sample": {"fraction": 1 / 3, "seed": 4}}))
    rest = shape_workload(
        trace, cfg(workload={"trace": "x", "sample": {"fraction": 1 / 3, "seed": 4, "complement": True}})
    )
    assert len(part) + len(rest) == 100
    assert sorted(part.arrival_s.tolist() + rest.arrival_s.tolist()) == [float(i) for i in range(100)]
    assert 20 < len(part) < 45
