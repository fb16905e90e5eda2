"""Prompt text on the trace and on the request (llm-d's approximate prefix scorer reads
characters, not engine blocks)."""

from __future__ import annotations

import numpy as np

from conftest import make_config, make_trace
from lmsim.study.compose import build_simulation
from lmsim.workload.trace import read_parquet


def test_text_and_stage_survive_parquet_and_take(tmp_path):
    trace = make_trace([0.0, 1.0, 2.0], [3, 3, 3], [1, 1, 1], stage=[0, 0, 1], text_id=[1, -1, 0])
    trace = trace.replace(prompt_texts=("sys one", "sys two"))
    path = tmp_path / "t.parquet"
    trace.save(path)
    back = read_parquet(path)
    assert back.stage.tolist() == [0, 0, 1]
    assert [back.prompt_text(i) for i in range(3)] == ["sys two", "", "sys one"]
    part = back.take(np.array([2, 0]))
    assert part.stage.tolist() == [1, 0]
    assert [part.prompt_text(i) for i in range(2)] == ["sys one", "sys two"]


def test_trace_without_text_writes_no_new_columns(tmp_path):
    trace = make_trace([0.0], [3], [1])
    assert "stage" not in trace.to_arrow().column_names
    assert "prompt_text" not in trace.to_arrow().column_names
    assert trace.prompt_text(0) == ""


def test_router_sees_the_prompt_text():
    trace = make_trace([0.0, 0.5], [20, 20], [2, 2], text_id=[0, 0]).replace(prompt_texts=("hello world",))
    sim = build_simulation(make_config(), trace)
    seen: list[str] = []
    choose = sim.policy.choose

    def spy(request, cluster):
        seen.append(request.prompt_text)
        return choose(request, cluster)

    sim.policy.choose = spy
    sim.run()
    assert seen == ["hello world", "hello world"]
    assert seen[0] is trace.prompt_texts[0]  # shared, not copied
