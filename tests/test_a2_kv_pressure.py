"""benchmarks/a2_kv_pressure.py: the A2 (llm-d 37-capacity) replay builds inference-perf's
shared_prefix workload and stage barrier as its docstring says."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "a2_kv_pressure.py"


@pytest.fixture(scope="module")
def a2():
    spec = importlib.util.spec_from_file_location("a2_kv_pressure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_group_prompts_share_exactly_the_system_blocks(a2):
    """2 groups x 2 prompts, system 64 and question 32 tokens in 16-token blocks: 64/16 = 4
    system blocks shared by the group, 96//16 - 4 = 2 question blocks of each prompt's own."""
    prompts = a2.shared_prefix_prompts(16, system_len=64, question_len=32, num_groups=2, per_group=2)
    assert len(prompts) == 4 and all(len(p) == 6 for p in prompts)
    by_system: dict[tuple, list] = {}
    for p in prompts:
        by_system.setdefault(tuple(p[:4]), []).append(p[4:])
    assert len(by_system) == 2 and all(len(q) == 2 for q in by_system.values())
    tails = [b for p in prompts for b in p[4:]]
    assert len(set(tails)) == 8  # no question block shared


def test_every_stage_walks_the_same_prompt_order(a2):
    """Stages (3 req/s, 2 s) and (2 req/s, 1.5 s) send int(3 x 2) = 6 and int(2 x 1.5) = 3
    evenly spaced requests; request n of a stage gets prompts[n % 4], n restarting per stage."""
    prompts = a2.shared_prefix_prompts(16, system_len=64, question_len=32, num_groups=2, per_group=2)
    trace, stage_of = a2.ladder_trace(((3, 2), (2, 1.5)), [0.0, 10.0], prompts, 96, 4, 16)
    assert stage_of.tolist() == [0] * 6 + [1] * 3
    assert np.allclose(trace.arrival_s, [0, 1 / 3, 2 / 3, 1, 4 / 3, 5 / 3, 10, 10.5, 11])
    ids = [trace.hash_ids(i).tolist() for i in range(len(trace))]
    assert ids[0] == ids[4] == ids[6] == prompts[0]
    assert ids[5] == ids[7] == prompts[1] and ids[8] == prompts[2]


def test_the_next_stage_starts_a_second_after_the_last_request_ends(a2):
    """One instance, every step 10 ms (linear profile, base only); one request per stage of
    96 prompt tokens and 4 outputs: one prefill step gives the first token at 0.01 s, three
    decode steps end it at 0.04 s, so stage 2 sends at 0.04 + 1 = 1.04 s and ends at 1.08 s."""
    profile = {"kind": "linear", "step_base_s": 0.01}
    config = a2.make_config(profile, "random", 16, num_instances=1)
    prompts = a2.shared_prefix_prompts(16, system_len=64, question_len=32, num_groups=1, per_group=1)
    results, _stage_of, starts = a2.run_ladder(config, ((1, 1), (1, 1)), prompts, 96, 4)
    assert starts == pytest.approx([0.0, 1.04])
    assert results.requests.finished_at.tolist() == pytest.approx([0.04, 1.08])
    # the second request hits the first one's 6 prompt blocks but the last: (96 - 1) // 16 = 5
    assert results.requests.cached_tokens.tolist() == [0, 80]
