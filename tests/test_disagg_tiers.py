"""Disaggregated pools with host-memory tiers on every instance: both connectors on one
instance (the P/D handoff first, then the tiers: lmsim.engine.connector.MultiConnector), the
invariants on at every step, and fast-forward changing nothing, under synchronous (vllm-0.11)
and asynchronous (vllm-0.33) scheduling."""

from __future__ import annotations

import pytest

import lmsim
from lmsim.config import validate

RAW = {
    "name": "pd-tiers",
    "workload": {"generator": {"name": "chatbot", "params": {"duration_s": 25, "rate": 6}}},
    "cluster": {
        "pools": [{"name": "p", "role": "prefill", "num_instances": 2}, {"name": "d", "role": "decode", "num_instances": 2}],
        # a small GPU pool, so prompts are evicted to host memory and loaded back
        "num_gpu_blocks": 2500,
        "kv_tiers": {"host": {"capacity_blocks": 20000, "read_bytes_s": 3.2e10, "write_bytes_s": 3.2e10}},
    },
    "router": {"policy": "pd"},
    "simulation": {"check": True},
}


def run(fast_forward: bool, engine: str = "vllm-0.11"):
    raw = {
        **RAW,
        "cluster": {**RAW["cluster"], "engine": engine},
        "simulation": {**RAW["simulation"], "fast_forward": fast_forward},
    }
    return lmsim.run(validate(raw, where="test"))


@pytest.mark.parametrize("engine", ["vllm-0.11", "vllm-0.33"])  # synchronous and asynchronous
def test_handoffs_and_tier_loads_share_instances_and_fast_forward_changes_nothing(engine):
    on, off = run(True, engine), run(False, engine)
    s = on.summary
    assert s["num_finished"] == s["num_requests"] > 0
    assert s["num_kv_transfers"] == s["num_finished"]  # every request handed over
    assert s["kv_num_loads"] > 0  # and some prompts came back from host memory
    assert on.requests.equals(off.requests)
    assert {k: v for k, v in s.items() if k.startswith("itl_s_")} == {
        k: v for k, v in off.summary.items() if k.startswith("itl_s_")
    }
