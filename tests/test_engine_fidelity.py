"""vLLM v1 behaviours that move a routing study (issue 13), each checked through
`lmsim run` on a canonical Parquet trace or on the engine with the hand-checkable linear
profile (conftest: 10 ms + 1 ms per prefill token + 0.1 ms per decode sequence)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import LINEAR, make_trace, simulate
from lmsim.cli import main


def run_cli(tmp_path: Path, trace, name: str = "run", **sections) -> pd.DataFrame:
    """Save `trace` as canonical Parquet, run it with `lmsim run`, return requests.parquet."""
    trace_path = tmp_path / f"{name}.parquet"
    trace.save(trace_path)
    cluster = {"num_instances": 1, "profile": dict(LINEAR), "num_gpu_blocks": 1000}
    cluster.update(sections.pop("cluster", {}))
    exp = {
        "name": name,
        "workload": {"trace": str(trace_path)},
        "cluster": cluster,
        "router": {"policy": "round_robin"},
        "simulation": {"check": True, **sections.pop("simulation", {})},
        **sections,
    }
    exp_path = tmp_path / f"{name}.yaml"
    exp_path.write_text(yaml.safe_dump(exp))
    out = tmp_path / f"{name}-out"
    assert main(["run", str(exp_path), "--out", str(out), "--no-figure"]) == 0
    return pd.read_parquet(out / "requests.parquet")


def test_a_follow_up_turn_hits_its_predecessors_output(tmp_path):
    # Block 16. Request 0: 64-token prompt (ids 1-4), 48 outputs: 64 + 48 - 1 = 111 tokens
    # get KV, six full blocks. Request 1 (parent_id 0) re-sends prompt and answer plus a
    # new message, 144 tokens with ids 1-9: its ids 5 and 6 name request 0's output
    # blocks, so it hits six blocks, 96 tokens (64 when output blocks were anonymous).
    trace = make_trace(
        [0.0, 10.0], [64, 144], [48, 2], [[1, 2, 3, 4], list(range(1, 10))], parent_id=[-1, 0]
    )
    req = run_cli(tmp_path, trace)
    assert list(req.cached_tokens) == [0, 96]
    # 144 - 96 = 48 tokens computed: 10 + 48 = 58 ms to the first token
    assert req.ttft_s.iloc[1] == pytest.approx(0.058)


def test_a_preempted_request_resumes_with_its_own_output_cached():
    # 11 blocks. A (ids 1-4, 30 outputs) and B (ids 11-14, 60 outputs) prefill together (8
    # blocks) and take a 5th block each at KV 64. At KV 80 (17 outputs) both need a 6th:
    # A gets the last free block and B, the newest, is preempted. B's five blocks are all
    # cache entries by then: its prompt and its first output block (ids 15, named by its
    # continuation). A needs nothing more (6 blocks hold its 93 tokens) and finishes; B's
    # resumed lookup covers its prompt and 17 outputs (81 tokens, vLLM hashes
    # all_token_ids) and hits five blocks, 80 tokens. With anonymous output blocks it hit 64.
    trace = make_trace(
        [0.0, 0.0, 50.0, 50.0], [64, 64, 144, 144], [30, 60, 1, 1],
        [[1, 2, 3, 4], [11, 12, 13, 14], list(range(1, 10)), list(range(11, 20))],
        parent_id=[-1, -1, 0, 1],
    )
    r = simulate(trace, cluster={"num_gpu_blocks": 11})
    req = r.requests
    assert list(req.num_preemptions) == [0, 1, 0, 0]
    assert req.lookup_tokens.iloc[1] == 64 + 81
    assert req.lookup_hit_tokens.iloc[1] == 0 + 80
    assert req.cached_tokens.iloc[1] == 0  # the first admission's hit
    # The hit ratio counts every lookup, as vLLM 0.11's prefix-cache metric does; the
    # first-admission ratio stays as its own key.
    hits, looked = req.lookup_hit_tokens.sum(), req.lookup_tokens.sum()
    assert looked == req.input_tokens.sum() + 81
    assert r.summary["prefix_hit_ratio"] == pytest.approx(hits / looked)
    first = req.cached_tokens.sum() / req.input_tokens.sum()
    assert r.summary["prefix_hit_ratio_first_admission"] == pytest.approx(first)
    assert hits == req.cached_tokens.sum() + 80


def test_long_prefill_threshold_does_not_cap_a_request_alone():
    # vLLM 0.33 Scheduler.schedule waives long_prefill_token_threshold when running +
    # waiting <= 1. A 1,000-token prompt alone with threshold 300: one 1,000-token step,
    # 10 + 1000 = 1010 ms. vLLM 0.11 (the default engine) caps it anyway: chunks of 300,
    # 300, 300 and 100, 3 x 310 + 110 = 1040 ms. With a second request waiting, both are
    # capped under either: A's 300-token chunk and B's 300 share the first step.
    waived = {"long_prefill_token_threshold": 300, "engine": "vllm-0.33", "async_scheduling": False}
    alone = simulate(make_trace([0.0], [1000], [1]), cluster=waived)
    assert alone.requests.ttft_s.iloc[0] == pytest.approx(1.010)
    capped = simulate(make_trace([0.0], [1000], [1]), cluster={"long_prefill_token_threshold": 300})
    assert capped.requests.ttft_s.iloc[0] == pytest.approx(1.040)
    pair = simulate(make_trace([0.0, 0.0], [1000, 1000], [1, 1]), cluster=waived)
    # 3 steps of 600 tokens (300 each) = 3 x 0.610, then the last 100 + 100: 0.210
    assert pair.requests.ttft_s.iloc[0] == pytest.approx(3 * 0.610 + 0.210)


def _admission_trace():
    # 20 blocks. A: 100-token prompt, 100 outputs (holds 7 -> 13 blocks). B arrives with a
    # 200-token prompt (13 blocks) while A decodes; budget 64 so B's first chunk is 64
    # tokens (4 blocks).
    return make_trace([0.0, 0.5], [100, 200], [100, 2])


def test_admission_rules_differ_on_what_must_fit():
    cluster = {"num_gpu_blocks": 20, "max_num_batched_tokens": 64, "engine": "vllm-0.11"}
    first = simulate(_admission_trace(), cluster={**cluster, "admission": "first_chunk"})
    full = simulate(_admission_trace(), cluster={**cluster, "admission": "full_sequence"})
    water = simulate(
        _admission_trace(),
        cluster={**cluster, "admission": "whole_prompt_watermark", "watermark_blocks_fraction": 0.1},
    )
    # first_chunk admits B at once (4 blocks fit beside A's 7); B then needs blocks A's
    # decodes also need, and the newest (B) is preempted.
    assert first.requests.first_scheduled_at.iloc[1] == pytest.approx(0.5, abs=0.02)
    assert first.requests.num_preemptions.iloc[1] >= 1
    # full_sequence waits until the whole 200 tokens (13 blocks) fit: after A finishes
    a_done = full.requests.finished_at.iloc[0]
    assert full.requests.first_scheduled_at.iloc[1] >= a_done - 1e-12
    assert full.requests.num_preemptions.sum() == 0
    # the watermark (2 of 20 blocks) also waits for A
    assert water.requests.first_scheduled_at.iloc[1] >= water.requests.finished_at.iloc[0] - 1e-12
    assert water.requests.num_preemptions.sum() == 0


@pytest.mark.parametrize("value", ["first_chunk", "full_sequence", "whole_prompt_watermark"])
def test_admission_accepts_the_three_rules(tmp_path, value):
    trace = make_trace([0.0, 0.0], [100, 100], [3, 3])
    req = run_cli(tmp_path, trace, cluster={"admission": value})
    assert list(req.status.astype(str)) == ["finished", "finished"]


def test_admission_rejects_other_values_with_one_line(tmp_path, capsys):
    exp = tmp_path / "bad.yaml"
    exp.write_text(yaml.safe_dump({"workload": {"trace": "x.parquet"}, "cluster": {"admission": "greedy"}}))
    assert main(["validate", str(exp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster.admission" in err[0] and "bad.yaml" in err[0]


ISSUE_ROWS = dict(
    arrivals=[0.0, 0.0, 5.0, 5.69],
    inputs=[2048, 1024, 656, 3072],
    outputs=[2, 2, 300, 2],
    hashes=[list(range(1, 129)), list(range(1, 65)), list(range(1000, 1041)), list(range(1, 193))],
)
ISSUE_CLUSTER = {"num_gpu_blocks": 200, "max_num_batched_tokens": 1200, "long_prefill_token_threshold": 560}


def test_fast_forward_equals_stepping_on_the_issue_scenario(tmp_path):
    # Issue 13 item 5: with content-free blocks first in the free queue and duplicates kept
    # as cache entries, W's cached prefix (A's 128 blocks) survives R's decodes: W waits
    # for R to finish. Both modes must agree exactly.
    rows = ISSUE_ROWS
    trace = make_trace(rows["arrivals"], rows["inputs"], rows["outputs"], rows["hashes"])
    on = run_cli(tmp_path, trace, "on", cluster=ISSUE_CLUSTER)
    off = run_cli(tmp_path, trace, "off", cluster=ISSUE_CLUSTER, simulation={"fast_forward": False})
    pd.testing.assert_frame_equal(on, off, check_exact=True)
    assert (tmp_path / "on-out" / "requests.parquet").read_bytes() == (
        tmp_path / "off-out" / "requests.parquet"
    ).read_bytes()


def test_fast_forward_equals_stepping_when_a_decode_caches_the_waiting_heads_next_block(tmp_path):
    # 10 blocks. R: 32-token prompt (ids 1000-1001), 100 outputs. W, R's next turn
    # (parent_id 0), arrives at 0.5 s while R decodes: 148 tokens whose ids 1002-1008 name
    # R's output blocks. W needs 10 blocks minus its hit on R's (in-use) cached blocks.
    # Between R's block fills W misses by one block; at the step that fills a block of R,
    # R's hit grows before R's next allocation and W fits exactly: stepping admits it
    # there (0.5167 s, 80 cached tokens), and R's next allocation then preempts it. The
    # old fast-forward rule ("a blocked head stays blocked") skipped that step and
    # admitted W only after R finished (1.0419 s, 128 cached).
    trace = make_trace(
        [0.0, 0.5], [32, 148], [100, 2], [[1000, 1001], list(range(1000, 1010))], parent_id=[-1, 0]
    )
    cluster = {"num_gpu_blocks": 10, "engine": "vllm-0.11"}  # first-chunk admission, one step at a time
    on = run_cli(tmp_path, trace, "on", cluster=cluster)
    off = run_cli(tmp_path, trace, "off", cluster=cluster, simulation={"fast_forward": False})
    pd.testing.assert_frame_equal(on, off, check_exact=True)
    assert on.first_scheduled_at.iloc[1] == pytest.approx(0.5167)
    assert on.cached_tokens.iloc[1] == 80 and on.num_preemptions.iloc[1] == 1


def test_continuation_rows_follow_links_then_sessions_then_extension():
    import numpy as np

    from lmsim.workload.trace import continuation_rows, continued_ids

    # row 0 -> row 2 by parent_id (row 1 also extends it, but the link wins); row 1 -> row 3
    # by extension (no links, no sessions); row 3 continues nothing; row 4's ids contradict
    # its parent's full blocks, so row 4 does not continue row 3.
    trace = make_trace(
        [0, 1, 2, 3, 4], [40, 48, 80, 64, 80], [5, 5, 5, 5, 5],
        [[1, 2, 3], [1, 2, 4], [1, 2, 5, 6, 7], [1, 2, 4, 8], [9, 9, 9, 9, 9]],
        parent_id=[-1, -1, 0, -1, 3],
    )
    assert continuation_rows(trace).tolist() == [2, 3, -1, -1, -1]
    assert continued_ids(trace, 0, 2).tolist() == [1, 2, 5, 6, 7]
    # a session of its own: the extension rule looks only inside the session
    trace.session_id = np.array([0, 1, 2, 3, 4])
    assert continuation_rows(trace).tolist() == [2, -1, -1, -1, -1]


def test_a_guessed_continuation_must_extend_more_than_a_shared_prefix():
    import numpy as np

    from lmsim.workload.trace import find_continuations

    # 16-token blocks, no sessions. Rows 1 and 2 are two conversations behind one system
    # prompt (id 1); rows 3 and 4 are their next turns, row 6 names row 5 as its parent.
    # Row 0 sends only the system prompt: its first extension is row 1, but the rows going
    # on past block 1 go on with 2 (rows 1, 3) and 4 (rows 2, 4), so the guess is
    # refused. Row 1's last full block (3) is extended only by row 3, row 2's (5) only by
    # row 4: two guesses kept. Rows 3, 4 and 6 have no extension; row 5 is linked.
    ids = [[1], [1, 2, 3], [1, 4, 5], [1, 2, 3, 6], [1, 4, 5, 7], [8, 9], [8, 9, 10]]
    trace = make_trace(
        list(range(7)), [16 * len(x) for x in ids], [5] * 7, ids, parent_id=[-1] * 6 + [5]
    )
    found = find_continuations(trace)
    assert found.rows.tolist() == [-1, 3, 4, -1, -1, 6, -1]
    assert (found.linked, found.inferred, found.refused) == (1, 2, 1)
    # In sessions, only the row's own session is asked: row 0 alone with row 1 is
    # continued by it (the other conversation's extension is in another session).
    trace.session_id = np.array([0, 0, 1, 0, 1, 2, 2])
    found = find_continuations(trace)
    assert found.rows.tolist() == [1, 3, 4, -1, -1, 6, -1]
    assert (found.linked, found.inferred, found.refused) == (1, 3, 0)


def test_generators_name_output_blocks_only_through_real_continuations():
    from lmsim.workload.generators import generate
    from lmsim.workload.trace import continuation_rows, find_continuations

    chat = generate("chatbot", {"num_requests": 400}, seed=1)
    cont = continuation_rows(chat)
    parent = chat.column("parent_id")
    child_of = {int(p): i for i, p in reversed(list(enumerate(parent))) if p >= 0}
    # every turn that has a next turn is continued by exactly that turn
    assert all(cont[p] == c for p, c in child_of.items())
    assert (cont >= 0).sum() == len(child_of)
    agent = generate("agent", {"num_requests": 400}, seed=1)
    assert (continuation_rows(agent) < 0).all()
    # Without its sessions, a short-suffix agent request would look continued by the next
    # request of the same template; those rows' template blocks are extended in several
    # ways, so the guess is refused as ambiguous (27 such rows here).
    agent.session_id = None
    found = find_continuations(agent)
    assert (found.rows < 0).all() and found.refused == 27
    assert len(child_of) > 10
