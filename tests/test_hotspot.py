"""The KV-hotspot detector end to end: it alarms on the Figure 21 workload during the burst,
for the burst's class, and stays quiet on chatbot traffic."""

from __future__ import annotations

import numpy as np

from conftest import make_config
from lmsim.study.compose import build_simulation
from lmsim.workload.generators import generate

POLICY = {
    "policy": "lmetric_hotspot",
    "params": {"bs_plus_one": True, "p_token": "request", "log_interval_s": 20},
}


def run(trace):
    config = make_config(
        cluster={"num_instances": 16, "profile": "h20/qwen3-30b-a3b", "num_gpu_blocks": None},
        router=POLICY,
        simulation={"check": False},
    )
    return build_simulation(config, trace).run().router_events


def test_detector_fires_during_the_burst_and_names_its_class():
    burst_start, burst_len = 180.0, 120.0
    trace = generate(
        "hotspot",
        {"duration_s": 420, "burst_start_min": burst_start / 60, "burst_duration_s": burst_len,
         "rate": 3.0, "burst_rate": 6.0, "max_output_tokens": 200},
        seed=1,
    )
    events = run(trace)
    alarms = events[events.kind == "hotspot_alarm"]
    assert len(alarms) >= 1
    # Every alarm falls inside the burst and is for one class: the burst's shared prefix.
    assert alarms.time_s.between(burst_start, burst_start + burst_len).all()
    assert alarms.class_id.nunique() == 1
    # The alarmed class is the one whose share x jumps during the burst, and Eq. 2 was
    # violated when it fired: x/(1-x) > |M|/|M̄|.
    row = alarms.iloc[0]
    assert row.x / (1 - row.x) > row.m / (row.num_instances - row.m)
    windows = events[(events.kind == "hotspot_window") & (events.class_id == row.class_id)]
    during = windows[windows.time_s.between(burst_start + 20, burst_start + burst_len)]
    assert (during.x > 0.4).all() and len(during) >= 3


def test_detector_is_quiet_on_chatbot_traffic():
    trace = generate("chatbot", {"duration_s": 150, "rate": 30}, seed=1)
    events = run(trace)
    assert len(trace) > 3000
    assert not (events.kind == "hotspot_alarm").any() if len(events) else True
    assert np.isin(events.kind.unique(), ["hotspot_window"]).all()
