"""Fast-forward equivalence: planning runs of decode-only steps as one event must give the
same results, bit for bit, as stepping one at a time, for every policy on every generator.

Sensitivity: `test_equivalence_check_catches_one_shifted_boundary` breaks fast-forward on
purpose (it moves a single intermediate step boundary of one run by 1 ns, which shifts every
later time on that instance) and asserts the comparison below sees the difference. If that
test ever passes with the mutation in place, the equivalence test has lost its teeth.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import make_config
from lmsim.engine.instance import Instance
from lmsim.engine.simulation import Simulation
from lmsim.policies import POLICIES
from lmsim.study.rundir import requests_table
from lmsim.workload.generators import generate
from lmsim.workload.scaling import scale_to_rate

GENERATORS = {
    "chatbot": {"num_requests": 60},
    "agent": {"num_requests": 80},
    "toolagent": {"num_requests": 40},
    "coder": {"num_requests": 40},
    "hotspot": {"num_requests": 40},
}
RATE = {"chatbot": 12.0, "agent": 40.0, "toolagent": 4.0, "coder": 3.0, "hotspot": 3.0}


def _trace(name: str):
    trace = scale_to_rate(generate(name, GENERATORS[name], seed=3), RATE[name])
    # Long outputs only add identical decode steps; capping them keeps the one-step-at-a-time
    # reference fast while leaving plenty of multi-step runs to compare.
    trace.output_tokens = np.minimum(trace.output_tokens, 96)
    return trace


def _requests_bytes(trace, policy: str, fast_forward: bool) -> bytes:
    config = make_config(
        cluster={"num_instances": 4, "profile": "h20/qwen3-30b-a3b", "num_gpu_blocks": 6000},
        router={"policy": policy},
        simulation={"fast_forward": fast_forward, "check": False},
    )
    results = Simulation(config, trace).run()
    buffer = io.BytesIO()
    pq.write_table(requests_table(results.requests), buffer)
    return buffer.getvalue()


TRACES: dict[str, object] = {}


def trace_for(name: str):
    if name not in TRACES:
        TRACES[name] = _trace(name)
    return TRACES[name]


@pytest.mark.parametrize("generator", sorted(GENERATORS))
@pytest.mark.parametrize("policy", POLICIES.names())
def test_fast_forward_gives_identical_requests(generator: str, policy: str):
    trace = trace_for(generator)
    on = _requests_bytes(trace, policy, True)
    off = _requests_bytes(trace, policy, False)
    assert on == off


def test_fast_forward_actually_skips_events():
    trace = trace_for("chatbot")
    config = make_config(
        cluster={"num_instances": 4, "profile": "h20/qwen3-30b-a3b", "num_gpu_blocks": 6000},
        router={"policy": "lmetric"},
        simulation={"check": False},
    )
    on = Simulation(config, trace).run().summary
    off_cfg = config.model_copy(update={"simulation": config.simulation.model_copy(update={"fast_forward": False})})
    off = Simulation(off_cfg, trace).run().summary
    assert on["num_steps"] == off["num_steps"]  # the same steps happen...
    assert off["num_step_events"] == off["num_steps"]  # ...one event each without it...
    assert on["num_step_events"] < off["num_steps"] / 3  # ...and far fewer events with it


def test_equivalence_check_catches_one_shifted_boundary(monkeypatch):
    """The mutation: the first multi-step run planned anywhere gets its second step 1 ns
    longer. Everything else is untouched."""
    original = Instance._start_step
    state = {"mutated": False}

    def broken(self):
        original(self)
        plan = self._plan
        if plan is not None and plan.num_steps > 2 and not state["mutated"]:
            state["mutated"] = True
            plan.durations[1] += 1e-9
            t = self._times[0]
            times = [t]
            for d in plan.durations:
                t = t + d
                times.append(t)
            self._times = times
            from lmsim.engine.clock import STEP_END, schedule_at

            self._end_event = schedule_at(self.env, times[-1], STEP_END, self._step_end)

    trace = trace_for("chatbot")
    good_on = _requests_bytes(trace, "vllm", True)
    monkeypatch.setattr(Instance, "_start_step", broken)
    bad_on = _requests_bytes(trace, "vllm", True)
    assert state["mutated"]
    assert bad_on != good_on
