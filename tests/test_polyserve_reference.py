"""PolyServe's fast choice against the obvious one it replaced: evaluate every instance's
feasibility with a full TTFT replay, then take the most loaded feasible one, borrow from
tighter bins, or fall back to the lowest TTFT. The fast one tries instances in packing
order and cuts replays short once the verdict is known; every decision must be the same."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import make_config
from lmsim.policies.base import argmin_first
from lmsim.policies.polyserve import PolyServe
from lmsim.policies.predictive import estimate_ttft
from lmsim.study.compose import build_simulation
from lmsim.study.rundir import requests_table
from lmsim.workload.generators import generate
from lmsim.workload.scaling import scale_to_rate


def reference_choose(self, request, cluster):
    cls = self.request_class(request)
    cached = cluster.cached_prefix_tokens(request)
    inst = cluster.instances
    isl = request.input_tokens
    ttft_slo, tpot_slo = self.slo[cls]

    def ttft(i):
        v = inst[i]
        return estimate_ttft(
            v, isl - cached[i], cached[i], v.cost_model, v.max_num_batched_tokens, v.max_num_seqs
        )

    def feasible(i):
        v = inst[i]
        b = v.batch_size + 1
        return v.cost_model.step_time((), b, v.total_tokens + isl + b) <= tpot_slo and ttft(i) <= ttft_slo

    tighter = sorted(
        (c for c in range(len(self.slo)) if self.slo[c][1] < tpot_slo), key=lambda c: -self.slo[c][1]
    )
    for c in [cls, *tighter]:
        ok = [i for i in self.bins[c] if feasible(i)]
        if ok:
            return max(ok, key=lambda i: (inst[i].batch_size, -i))
    own = self.bins[cls]
    return own[argmin_first([ttft(i) for i in own])]


def _run(rate: float) -> tuple[bytes, dict]:
    trace = scale_to_rate(generate("chatbot", {"num_requests": 300}, seed=5), rate)
    trace.output_tokens = np.minimum(trace.output_tokens, 200)
    # Two classes, so loose requests can borrow the tight bin; at the higher rate most
    # decisions find nothing feasible and take the fallback.
    config = make_config(
        cluster={"num_instances": 6, "profile": "h20/qwen3-30b-a3b", "num_gpu_blocks": 4000},
        router={
            "policy": "polyserve",
            "params": {
                "slo_classes": [{"ttft_s": 0.5, "tpot_s": 0.03}, {"ttft_s": 1.0, "tpot_s": 0.06}],
                "default_slo_class": 1,
            },
        },
        simulation={"check": False},
    )
    results = build_simulation(config, trace).run()
    buffer = io.BytesIO()
    pq.write_table(requests_table(results.requests), buffer)
    return buffer.getvalue(), results.summary


@pytest.mark.parametrize("rate", [8.0, 40.0])
def test_polyserve_decides_as_the_obvious_implementation(rate: float, monkeypatch):
    fast, summary = _run(rate)
    monkeypatch.setattr(PolyServe, "choose", reference_choose)
    slow, _ = _run(rate)
    assert fast == slow
    assert summary["num_finished"] == 300
