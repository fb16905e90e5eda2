"""benchmarks/fleet/dynamo_planner.py and benchmarks/plan/dynamo_replay_optimize.py: the parts
that do not need Dynamo (the trace, SLO attainment, the replica trajectory, the schedule that
replays Dynamo's decisions, the lmsim configs), checked on numbers small enough to compute by
hand. Dynamo itself runs only in the peer venv, never here."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import load_script

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(folder: Path, name: str):
    return load_script(folder / f"{name}.py", BENCH)


@pytest.fixture(scope="module")
def planner():
    return _load(BENCH / "fleet", "dynamo_planner")


def _args(**over) -> argparse.Namespace:
    base = {"num_blocks": 17_500, "max_batched": 8192, "max_seqs": 256, "max_model_len": 16_384,
            "fixed_prefill": 1, "fixed_decode": 4, "fixed_agg": 4, "prefill": 1, "decode": 1, "gpu_budget": 16,
            "startup_s": 60.0, "ttft_ms": 500.0, "itl_ms": 25.0, "throughput_interval_s": 60, "load_interval_s": 10,
            "predictor": "kalman", "bandwidth_gb_s": 50.0, "bytes_per_token": 98_304, "isl_from": "finished",
            "dynamo_perf_model": "polynomial"}
    return argparse.Namespace(**{**base, **over})


def test_slo_attainment_counts_by_hand(planner) -> None:
    """4 requests against TTFT <= 500 ms, ITL <= 25 ms: (100, 20) meets both; (600, 20) misses
    TTFT; (100, 30) misses ITL; a one-token answer (100, None) has no gap and meets ITL; an
    unfinished request (None, None) misses both. TTFT 3/5, ITL 3/5, both 2/5."""
    rows = [{"ttft_ms": 100, "itl_ms": 20}, {"ttft_ms": 600, "itl_ms": 20}, {"ttft_ms": 100, "itl_ms": 30},
            {"ttft_ms": 100, "itl_ms": None}, {"ttft_ms": None, "itl_ms": None}]
    got = planner.slo_attainment(rows, 500.0, 25.0)
    assert got == {"ttft": 3 / 5, "itl": 3 / 5, "both": 2 / 5}


def test_the_trace_follows_the_rate_steps(planner, tmp_path: Path) -> None:
    """Rates 2 and 10 req/s for 100 s each: about 200 and 1,000 arrivals (Poisson, so within
    5 sigma: 200 +- 71, 1,000 +- 158); every prompt starts with its system prompt's two
    512-token blocks (ids 1..16) and has ceil(input / 512) ids; the same seed writes the same
    file."""
    trace = tmp_path / "t.jsonl"
    info = planner.make_trace(trace, planner.parse_segments("0:2,100:10"), 200.0, seed=3)
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(rows) == info["requests"]
    first = sum(r["timestamp"] < 100_000 for r in rows)
    assert abs(first - 200) < 71 and abs((len(rows) - first) - 1000) < 158
    assert all(1 <= r["hash_ids"][0] <= 16 and r["hash_ids"][1] == r["hash_ids"][0] + 1 for r in rows)
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in rows)
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    again = tmp_path / "u.jsonl"
    planner.make_trace(again, planner.parse_segments("0:2,100:10"), 200.0, seed=3)
    assert again.read_text() == trace.read_text()


def test_segments_must_start_at_zero_and_increase(planner) -> None:
    with pytest.raises(SystemExit):
        planner.parse_segments("10:2,5:3")


def test_dynamo_decisions_become_the_schedule_scalers_replicas(planner) -> None:
    """Initial 1P+1D, then Dynamo's events decode 1 -> 2 at 310 s and prefill 1 -> 2 at 400 s:
    replicas prefill [[0, 1], [400, 2]], decode [[0, 1], [310, 2]]; an aggregated case lands
    in the pool lmsim names `default`."""
    row = {"mode": "disagg", "events": [{"at_s": 310.0, "role": "decode", "from": 1, "to": 2},
                                        {"at_s": 400.0, "role": "prefill", "from": 1, "to": 2}]}
    assert planner.dynamo_schedule(row, _args()) == {"prefill": [[0.0, 1], [400.0, 2]], "decode": [[0.0, 1], [310.0, 2]]}
    agg = {"mode": "agg", "events": [{"at_s": 20.0, "role": "agg", "from": 1, "to": 3}]}
    assert planner.dynamo_schedule(agg, _args()) == {"default": [[0.0, 1], [20.0, 3]]}


def test_trajectory_from_fleet_events_by_hand(planner) -> None:
    """Decode instance 1 starts at 10 s and is active at 70 s; instance 0 drains at 100 s and
    stops at 130 s; scale rows (instance -1) are skipped. After each event: 10 s 1 active +
    1 starting; 70 s 2 active; 100 s 1 active + 1 draining; 130 s 1 active. `steps` prints
    the active counts where they change."""
    events = pd.DataFrame({
        "time_s": [0.0, 10.0, 10.0, 70.0, 100.0, 130.0],
        "instance_id": [0, -1, 1, 1, 0, 0],
        "pool": ["decode"] * 6,
        "event": ["active", "scale", "start", "active", "drain", "stop"],
    })
    rows = planner.trajectory_from_events(events, "c")
    assert [(r["time_s"], r["decode_active"], r["decode_starting"], r["decode_draining"]) for r in rows] == [
        (0.0, 1, 0, 0), (10.0, 1, 1, 0), (70.0, 2, 0, 0), (100.0, 1, 0, 1), (130.0, 1, 0, 0)]
    assert planner.steps(rows, "c", "lmsim") == "0s:1 70s:2 100s:1"


@pytest.mark.parametrize("case", ["fixed-disagg", "fixed-agg", "sla-disagg", "load-agg"])
def test_the_lmsim_side_of_every_case_is_a_valid_experiment(planner, case: str, tmp_path: Path) -> None:
    """The lmsim configs validate against lmsim's config models (fleet/autoscaler sections
    included): the same KV size, batch limits, context and start-up as the Dynamo side."""
    from lmsim.config import validate

    config = validate(planner.lmsim_config(case, _args(), tmp_path / "t.jsonl", tmp_path / "out"), where="test")
    assert config.cluster.num_gpu_blocks == 17_500 and config.cluster.max_num_batched_tokens == 8192
    if case.startswith("fixed"):
        assert config.fleet is None and config.autoscaler is None
    else:
        assert config.autoscaler.name == "sla_planner"
        assert all(pool.startup_s == 60.0 for pool in config.fleet.pools.values())
    scheduled = planner.lmsim_config(case, _args(), tmp_path / "t.jsonl", tmp_path / "out",
                                     schedule={"default": [[0.0, 1]]})
    assert validate(scheduled, where="test").autoscaler.name == "schedule"


def test_replay_optimize_script_imports_without_dynamo() -> None:
    """The replay_optimize script's answer function is importable in the project's Python
    (Dynamo runs in the peer interpreter) and says so when the peer is missing."""
    module = _load(BENCH / "plan", "dynamo_replay_optimize")
    assert module.dynamo_answer(peer_python="/nonexistent/python") == {
        "error": "Dynamo not importable with /nonexistent/python"}


def test_polynomial_perf_model_prices_forward_passes_by_hand(planner, monkeypatch) -> None:
    """The stand-in for AISimulate's RustForwardPassPerfModel (peer_stubs.py) on a worker of
    280,000 KV tokens, each pass given as ForwardPassMetrics:
    * prefill worker, 4,096 new tokens: 4.209989e-7 x 4096^2 + 1.518344e-2 x 4096 + 16.50142
      = 85.756 ms (the mocker's figure; no decode part on a prefill worker);
    * decode worker, one sequence of 4,096 KV tokens: u = 4096 / 280000, -25.74 u^2 + 54.01 u
      + 5.74 = 6.525 ms;
    * aggregated, 1,000 prefill tokens beside 10 decodes of 20,000 KV tokens: prefill 32.106 ms
      plus decode at u = 21,000 / 280,000 = 0.075, 9.646 ms: 41.752 ms.
    It replaces engine_query's AISForwardPassPerfModel, is ready at once and tuning only counts."""
    import types

    from peer_stubs import POLYNOMIAL_PERF_MODEL_SOURCE

    names = ["dynamo", "dynamo.planner", "dynamo.planner.core", "dynamo.planner.core.perf_model",
             "dynamo.planner.core.perf_model.engine_query"]
    modules = [types.ModuleType(n) for n in names]
    for parent, child, name in zip(modules, modules[1:], names[1:]):
        setattr(parent, name.rsplit(".", 1)[1], child)
    for name, module in zip(names, modules):
        monkeypatch.setitem(sys.modules, name, module)
    scope: dict = {}
    exec(POLYNOMIAL_PERF_MODEL_SOURCE, scope)
    model_class = scope["use_polynomial_perf_model"](str(BENCH.parent), 280_000)
    assert modules[-1].AISForwardPassPerfModel is model_class

    def fpm(**scheduled):
        keys = ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens", "num_decode_requests",
                "sum_decode_kv_tokens")
        return {"scheduled_requests": {k: scheduled.get(k, 0) for k in keys}}

    prefill = model_class.best_available({"worker_type": "prefill"})
    decode = model_class.best_available({"worker_type": "decode"})
    agg = model_class.best_available({"worker_type": "aggregated"})
    assert prefill.estimate_forward_pass_time_ms([fpm(num_prefill_requests=1, sum_prefill_tokens=4096)]) == \
        pytest.approx(85.756, abs=5e-4)
    assert decode.estimate_forward_pass_time_ms([fpm(num_decode_requests=1, sum_decode_kv_tokens=4096)]) == \
        pytest.approx(6.525, abs=5e-4)
    assert agg.estimate_forward_pass_time_ms([fpm(num_prefill_requests=1, sum_prefill_tokens=1000,
                                                  num_decode_requests=10, sum_decode_kv_tokens=20_000)]) == \
        pytest.approx(41.7518, abs=5e-4)
    agg.tune_with_fpms([[fpm()], [fpm()]])
    assert agg.diagnostics()["readiness"] == "ready" and agg.diagnostics()["retained_observations"] == 2
