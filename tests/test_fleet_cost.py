"""lmsim.fleet_cost and the shipped GPU prices: GPU-hours, cost, goodput and per-window SLO
numbers from tiny hand-built frames, every expected number computed in the docstring."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from lmsim.errors import ConfigError
from lmsim.fleet_cost import (
    compute_fleet_cost,
    fleet_cost,
    provisioned_intervals,
    replica_timeline,
    window_stats,
)
from lmsim.profile.hardware import gpu_key, profile_gpu, shipped_gpus
from lmsim.shipped import gpu_price_per_hour, gpu_price_source, shipped_gpu_prices


def events(*rows, scale=()):
    """fleet_events rows (time_s, instance_id, pool, gpu, gpus, event) + scale rows (time_s, pool, target)."""
    frame = pd.DataFrame(rows, columns=["time_s", "instance_id", "pool", "gpu", "gpus", "event"])
    frame["target"] = pd.array([pd.NA] * len(frame), dtype="Int64")
    if scale:
        extra = pd.DataFrame([(t, -1, p, "", 0, "scale", n) for t, p, n in scale],
                             columns=[*frame.columns])  # fmt: skip
        extra["target"] = extra["target"].astype("Int64")
        frame = pd.concat([frame, extra], ignore_index=True).sort_values("time_s", kind="stable")
    return frame


# Pool "d": instance 0 up from t = 0 (first row: active at 0) until the run ends at 100;
# instance 1 starts at 10, active at 40, drains at 70, stops at 80; instance 2 (2 GPUs)
# starts at 50, crashes at 60, restarts at 65 and stays to the end.
FLEET = events(
    (0.0, 0, "d", "NVIDIA H20 96GB", 1, "active"),
    (10.0, 1, "d", "NVIDIA H20 96GB", 1, "start"),
    (40.0, 1, "d", "NVIDIA H20 96GB", 1, "active"),
    (50.0, 2, "d", "NVIDIA H20 96GB", 2, "start"),
    (55.0, 2, "d", "NVIDIA H20 96GB", 2, "active"),
    (60.0, 2, "d", "NVIDIA H20 96GB", 2, "crash"),
    (62.0, 2, "d", "NVIDIA H20 96GB", 2, "detected"),
    (65.0, 2, "d", "NVIDIA H20 96GB", 2, "restart"),
    (70.0, 1, "d", "NVIDIA H20 96GB", 1, "drain"),
    (75.0, 2, "d", "NVIDIA H20 96GB", 2, "active"),
    (80.0, 1, "d", "NVIDIA H20 96GB", 1, "stop"),
    scale=[(10.0, "d", 2), (50.0, "d", 3), (70.0, "d", 2)],
)


def test_provisioned_intervals_from_start_to_stop_or_crash():
    """Instance 0: [0, 100]; 1: [10, 80]; 2: [50, 60] and, restarted, [65, 100]."""
    got = provisioned_intervals(FLEET, 100.0)
    assert [tuple(r) for r in got[["instance_id", "start_s", "end_s"]].itertuples(index=False)] == [
        (0, 0.0, 100.0), (1, 10.0, 80.0), (2, 50.0, 60.0), (2, 65.0, 100.0),
    ]
    assert got["gpus"].tolist() == [1, 1, 2, 2]


def requests_frame():
    """Five requests, SLO TTFT 1 s, TPOT 0.1 s, window 50 s:
    r0 arrives 5, finished, ttft 0.5, tpot 0.05, 10 tokens  -> good
    r1 arrives 20, finished, ttft 2.0 (misses), tpot 0.05, 20 tokens
    r2 arrives 55, finished, ttft 0.2, tpot NaN (one token), 1 token -> good
    r3 arrives 60, failed (crash), 0 tokens
    r4 arrives 70, finished, ttft 0.4, tpot 0.3 (misses), 9 tokens
    r5 never arrived."""
    return pd.DataFrame({
        "arrived_at": [5.0, 20.0, 55.0, 60.0, 70.0, np.nan],
        "finished_at": [6.0, 23.0, 55.2, np.nan, 73.0, np.nan],
        "ttft_s": [0.5, 2.0, 0.2, np.nan, 0.4, np.nan],
        "tpot_s": [0.05, 0.05, np.nan, np.nan, 0.3, np.nan],
        "output_tokens": [10, 20, 1, 0, 9, 5],
        "status": pd.Categorical(["finished", "finished", "finished", "failed", "finished", "not_arrived"]),
    })  # fmt: skip


CONFIG = {
    "cluster": {"num_instances": 3, "profile": "h20/qwen2-7b"},
    "output": {"slo": {"ttft_s": 1.0, "tpot_s": 0.1}},
    "cost": {"window_s": 50.0, "gpu_price_per_hour": {}},
}


def test_cost_goodput_and_cost_per_million_tokens_with_fleet_events():
    """GPU-seconds: 100 + 70 + 2 x (10 + 35) = 260 -> 260 / 3600 GPU-hours; at the shipped
    H20 price p: cost 260 p / 3600. Output tokens of finished requests 10 + 20 + 1 + 9 = 40,
    so cost per million = cost / 40e-6. Good: r0, r2 of 5 arrived -> attainment 0.4;
    goodput 2 / 100 s = 0.02/s."""
    got = compute_fleet_cost(requests_frame(), {"sim_time_s": 100.0}, CONFIG, FLEET)
    price = gpu_price_per_hour("h20")
    assert got.pools[["pool", "gpu"]].values.tolist() == [["d", "NVIDIA H20 96GB"]]
    assert got.totals["gpu_hours"] == pytest.approx(260 / 3600)
    assert got.totals["cost_usd"] == pytest.approx(260 / 3600 * price)
    assert got.totals["output_tokens"] == 40
    assert got.totals["usd_per_million_output_tokens"] == pytest.approx(260 / 3600 * price / 40e-6)
    assert got.totals["slo_attainment"] == pytest.approx(0.4)
    assert got.totals["goodput_per_s"] == pytest.approx(0.02)
    assert got.pools["price_source"].iloc[0] == gpu_price_source("h20")


def test_fixed_fleet_pays_every_instance_for_the_whole_span_and_config_price_wins():
    """No fleet events: 3 instances x 1 GPU (h20/qwen2-7b, TP 1) x 100 s = 300 GPU-s;
    at the configured $3.6/GPU-hour: 300 / 3600 x 3.6 = $0.30."""
    config = {**CONFIG, "cost": {"window_s": 50.0, "gpu_price_per_hour": {"h20": 3.6}}}
    got = compute_fleet_cost(requests_frame(), {"sim_time_s": 100.0}, config, None)
    assert got.totals["gpu_hours"] == pytest.approx(300 / 3600)
    assert got.totals["cost_usd"] == pytest.approx(0.30)
    assert got.pools["gpu"].tolist() == ["h20"]


def test_tensor_parallel_profile_counts_its_gpus():
    """a100/llama-2-70b-tp2: 2 instances x 2 GPUs x 3600 s = 4 GPU-hours."""
    config = {"cluster": {"num_instances": 2, "profile": "a100/llama-2-70b-tp2"}}
    got = compute_fleet_cost(requests_frame(), {"sim_time_s": 3600.0}, config, None)
    assert got.totals["gpu_hours"] == pytest.approx(4.0)
    assert got.totals["cost_usd"] == pytest.approx(4.0 * gpu_price_per_hour("a100"))


def test_pools_of_a_saved_config_are_priced_by_their_own_gpu():
    """A saved P/D config (num_instances dumped beside the pools): prefill 2 x h20, decode
    3 x h100, 1800 s: 1 and 1.5 GPU-hours at their own prices."""
    from lmsim.config import validate

    saved = validate({"workload": {"generator": {"name": "chatbot"}}, "cluster": {"pools": [
        {"name": "p", "role": "prefill", "num_instances": 2, "profile": "h20/qwen2-7b"},
        {"name": "d", "role": "decode", "num_instances": 3, "profile": "h100/qwen2-7b"}]}},
        where="test").to_dict()  # fmt: skip
    got = compute_fleet_cost(requests_frame(), {"sim_time_s": 1800.0}, saved, None)
    assert got.pools[["pool", "gpu", "gpu_hours"]].values.tolist() == [["p", "h20", 1.0], ["d", "h100", 1.5]]
    want = 1.0 * gpu_price_per_hour("h20") + 1.5 * gpu_price_per_hour("h100")
    assert got.totals["cost_usd"] == pytest.approx(want)


def test_unknown_gpu_is_one_clear_line():
    config = {"cluster": {"num_instances": 1, "profile": {"kind": "linear", "step_base_s": 0.01}}}
    with pytest.raises(ConfigError, match=r"pool 'default' runs on GPU 'linear-profile', which has no shipped price; "
                                          r"set cost.gpu_price_per_hour: \{linear-profile: USD per GPU-hour\}"):
        compute_fleet_cost(requests_frame(), {"sim_time_s": 10.0}, config, None)
    priced = {**config, "cost": {"gpu_price_per_hour": {"linear-profile": 1.0}}}
    assert compute_fleet_cost(requests_frame(), {"sim_time_s": 36.0}, priced, None).totals["cost_usd"] == pytest.approx(0.01)


def test_windows_by_arrival_time():
    """Window [0, 50): r0, r1 arrived, r0 good -> 0.5; TTFT p50 = (0.5 + 2.0) / 2 = 1.25,
    p99 = 0.5 + 0.99 x 1.5 = 1.985. Window [50, 100): r2, r3, r4 arrived, r2 good -> 1/3;
    finished r2, r4: TTFT p50 0.3; TPOT only r4's 0.3 (r2 has none)."""
    w = window_stats(requests_frame(), 50.0, 1.0, 0.1)
    assert w["start_s"].tolist() == [0.0, 50.0]
    assert w["arrived"].tolist() == [2, 3]
    assert w["arrival_rate_per_s"].tolist() == [2 / 50, 3 / 50]
    assert w["slo_attainment"].tolist() == pytest.approx([0.5, 1 / 3])
    assert w["ttft_p50_s"].tolist() == pytest.approx([1.25, 0.3])
    assert w["ttft_p99_s"].iloc[0] == pytest.approx(1.985)
    assert w["tpot_p50_s"].tolist() == pytest.approx([0.05, 0.3])


def test_replica_timeline_active_and_provisioned():
    """Provisioned: 1 from 0, 2 at 10, 3 at 50, 2 at 60 (crash), 3 at 65 (restart), 2 at 80.
    Active: 1 from 0, 2 at 40, 3 at 55, 2 at 60 (crash), 1 at 70 (drain), 2 at 75."""
    t = replica_timeline(FLEET, 100.0)
    assert t["time_s"].tolist() == [0.0, 10.0, 40.0, 50.0, 55.0, 60.0, 65.0, 70.0, 75.0, 80.0, 100.0]
    assert t["provisioned"].tolist() == [1, 2, 2, 3, 3, 2, 3, 3, 3, 2, 2]
    assert t["active"].tolist() == [1, 1, 2, 2, 3, 2, 2, 1, 2, 2, 2]


def test_fleet_cost_reads_a_run_directory(tmp_path):
    requests_frame().to_parquet(tmp_path / "requests.parquet")
    FLEET.to_parquet(tmp_path / "fleet_events.parquet")
    (tmp_path / "summary.json").write_text(json.dumps({"sim_time_s": 100.0}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    got = fleet_cost(tmp_path)
    assert got.totals["gpu_hours"] == pytest.approx(260 / 3600) and got.totals["fleet_events"]


# -- shipped prices ------------------------------------------------------------------------


def test_every_shipped_gpu_has_a_sourced_price():
    prices = shipped_gpu_prices()
    assert sorted(prices) == shipped_gpus()
    for key, entry in prices.items():
        assert gpu_price_per_hour(key) > 0
        for field in ("provider", "product", "basis", "per_gpu", "url", "date"):
            assert entry.get(field), f"{key}: {field}"
        assert entry["basis"] in ("on-demand", "reserved", "assumed", "derived")
        assert entry["url"] in gpu_price_source(key)


def test_the_h20_derivation_matches_its_formula():
    """$2.00 (H800) x 1.2M / 2.7M CNY = $0.889 -> 0.89."""
    assert gpu_price_per_hour("h20") == round(2.00 * 1.2 / 2.7, 2)
    assert math.isclose(gpu_price_per_hour("h800"), 2.0)


def test_profile_and_name_to_gpu_key():
    assert profile_gpu("h20/qwen2-7b") == ("h20", 1)
    assert profile_gpu("a100/llama-2-70b-tp2") == ("a100", 2)
    assert profile_gpu({"kind": "linear"}) == (None, 1)
    assert gpu_key("NVIDIA H20 96GB") == "h20"
    assert gpu_key("NVIDIA H200 141GB") == "h200"
    assert gpu_key("NVIDIA A100 80GB") == "a100"
    assert gpu_key("h200/qwen3-30b-a3b") == "h200"
    assert gpu_key("tpu-v5") is None
    with pytest.raises(ConfigError, match="no shipped price for GPU 'b200'"):
        gpu_price_per_hour("b200")
