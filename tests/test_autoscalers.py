"""The `hpa` and `sla_planner` autoscalers driven by synthetic observations (no engine): each
number is computed by hand in the test's docstring."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest

from lmsim.autoscalers import AUTOSCALERS
from lmsim.autoscalers.hpa import HorizontalPodAutoscaler
from lmsim.autoscalers.sla_planner import (
    ConstantPredictor,
    EnginePerformance,
    KalmanPredictor,
    SlaPlanner,
    capacity_batch_sizes,
    fit_pair_under_ceiling,
    profiler_tables,
)
from lmsim.errors import ConfigError
from lmsim.profile.base import LinearCostModel
from lmsim.scaling import FleetObservation, PoolObservation, ScalerContext


class Context(ScalerContext):
    """A scaler context that keeps the events a scaler records."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def record_event(self, kind: str, **fields) -> None:
        self.events.append({"kind": kind, **fields})


def pool(name: str = "default", **fields) -> PoolObservation:
    base = dict(
        pool=name,
        role="both",
        gpu="NVIDIA H100 80GB",
        gpus_per_instance=1,
        min_replicas=1,
        max_replicas=10,
        target=4,
        active=4,
        starting=0,
        draining=0,
        failed=0,
        num_running=0,
        num_waiting=0,
        kv_usage=0.0,
        num_requests=0,
        request_rate=0.0,
        mean_input_tokens=float("nan"),
        mean_output_tokens=float("nan"),
        ttft_mean_s=None,
        itl_mean_s=None,
    )
    base.update(fields)
    return PoolObservation(**base)


def observe(time_s: float, *pools: PoolObservation, interval_s: float = 60.0) -> FleetObservation:
    return FleetObservation(
        time_s=time_s, scraped_at_s=time_s, interval_s=interval_s, pools={p.pool: p for p in pools}
    )


# -- hpa ---------------------------------------------------------------------------------------


def hpa(**params) -> HorizontalPodAutoscaler:
    return AUTOSCALERS.create("hpa", {"metric": "num_running", "target": 4, **params})


def test_hpa_desired_count_is_ceil_of_current_times_ratio():
    """4 replicas running 26 requests: average 6.5 per replica against a target of 4, ratio
    1.625, desired ceil(1.625 x 4) = ceil(6.5) = 7; the default scale-up limit is
    max(4 + 4 pods, ceil(4 x 2) = 8) = 8 per 15 s, so 7 passes."""
    assert hpa().decide(observe(0, pool(num_running=26))) == {"default": 7}


def test_hpa_scale_up_default_policies_cap_the_jump():
    """80 running on 4: ratio 5, desired 20; the defaults allow 4 + 4 = 8 or 4 x 2 = 8 per
    15 s, and 8 <= max_replicas 10: 8."""
    assert hpa().decide(observe(0, pool(num_running=80))) == {"default": 8}


def test_hpa_other_metrics_are_per_replica_averages():
    """kv_usage 0.9 over 4 replicas against 0.6: ratio 1.5, ceil(6) = 6. request_rate 20
    req/s over 4 replicas = 5 each against 2: ratio 2.5, ceil(10) = 10 > the limit 8."""
    kv = AUTOSCALERS.create("hpa", {"metric": "kv_usage", "target": 0.6})
    assert kv.decide(observe(0, pool(kv_usage=0.9))) == {"default": 6}
    rate = AUTOSCALERS.create("hpa", {"metric": "request_rate", "target": 2})
    assert rate.decide(observe(0, pool(request_rate=20.0))) == {"default": 8}
    waiting = AUTOSCALERS.create("hpa", {"metric": "num_waiting", "target": 1})
    assert waiting.decide(observe(0, pool(num_waiting=6))) == {"default": 6}


@pytest.mark.parametrize(
    ("running", "params", "expected"),
    [
        (44, {}, 4),  # 11 / 10 = 1.1: on the upper edge of the band, holds
        (36, {}, 4),  # 9 / 10 = 0.9: on the lower edge, holds
        (46, {}, 5),  # 1.15: ceil(1.15 x 4) = ceil(4.6) = 5
        (44, {"scale_up": {"tolerance": 0.0}}, 5),  # no band upward: ceil(4.4) = 5
        (44, {"tolerance": 0.2}, 4),
    ],
)
def test_hpa_tolerance_band(running, params, expected):
    """Target 10 per replica on 4 replicas; kube holds while 0.9 <= ratio <= 1.1."""
    scaler = AUTOSCALERS.create(
        "hpa",
        {
            "metric": "num_running",
            "target": 10,
            "scale_down": {"stabilization_window_s": 0},
            **params,
        },
    )
    assert scaler.decide(observe(0, pool(num_running=running))) == {"default": expected}


def test_hpa_scale_down_stabilization_holds_the_window_maximum():
    """Window 300 s, decisions every 60 s. t=0: 16 running on 4 (ratio 1): recommendation 4.
    From t=60 the load is 4 running (ratio 0.25): raw recommendation ceil(0.25 x 4) = 1, but
    the answer is the maximum over (t - 300, t], which holds the 4 of t=0 until t=300, where
    t=0 falls out of the half-open window: max(1, 1, 1, 1, 1) = 1, within the default
    scale-down limit int(4 x (1 - 100/100)) = 0 and min_replicas 1."""
    scaler = hpa()
    answers = [scaler.decide(observe(0, pool(num_running=16)))["default"]]
    for t in (60, 120, 180, 240, 300):
        answers.append(scaler.decide(observe(t, pool(num_running=4)))["default"])
    assert answers == [4, 4, 4, 4, 4, 1]
    immediate = hpa(scale_down={"stabilization_window_s": 0})
    immediate.decide(observe(0, pool(num_running=16)))
    assert immediate.decide(observe(60, pool(num_running=4))) == {"default": 1}


def test_hpa_scale_up_stabilization_takes_the_window_minimum():
    """Scale-up window 120 s: t=0 recommends 4 (ratio 1), t=60 recommends ceil(2 x 4) = 8:
    the answer is at most min(4, 8) = 4, so it holds; at t=120 the t=0 sample is out of the
    half-open (0, 120] and min(8, 8) = 8 passes."""
    scaler = hpa(scale_up={"stabilization_window_s": 120})
    assert scaler.decide(observe(0, pool(num_running=16))) == {"default": 4}
    assert scaler.decide(observe(60, pool(num_running=32))) == {"default": 4}
    assert scaler.decide(observe(120, pool(num_running=32))) == {"default": 8}


def test_hpa_pods_policy_counts_changes_within_its_period():
    """Scale-up policy 2 pods per 60 s. t=0: desired 12 (48 running on 4), limit 4 + 2 = 6.
    t=30: on 6 replicas desired ceil(72/6/4 x 6) = 18, but the period start is 6 - 2 (the +2
    at t=0 is inside (-30, 30]) = 4, limit 4 + 2 = 6: holds. t=61: the +2 is out of
    (1, 61], start 6, limit 8."""
    scaler = hpa(scale_up={"policies": [{"type": "pods", "value": 2, "period_s": 60}]})
    assert scaler.decide(observe(0, pool(num_running=48))) == {"default": 6}
    six = dict(target=6, active=6, num_running=72)
    assert scaler.decide(observe(30, pool(**six))) == {"default": 6}
    assert scaler.decide(observe(61, pool(**six))) == {"default": 8}


def test_hpa_percent_policy_scale_down():
    """Scale-down 50 % per 60 s, no window: 8 replicas with 2 running (ratio 1/16, desired 1):
    limit int(8 x 0.5) = 4. At t=30 on 4 replicas the period start is 4 + 4 = 8: limit 4,
    holds. At t=61: start 4, limit 2."""
    scaler = hpa(
        scale_down={
            "stabilization_window_s": 0,
            "policies": [{"type": "percent", "value": 50, "period_s": 60}],
        }
    )
    assert scaler.decide(observe(0, pool(target=8, active=8, num_running=2))) == {"default": 4}
    assert scaler.decide(observe(30, pool(num_running=1))) == {"default": 4}
    assert scaler.decide(observe(61, pool(num_running=1))) == {"default": 2}
    # truncated, as kube's int32(): 5 x 0.5 = 2.5 allows down to 2
    odd = hpa(
        scale_down={
            "stabilization_window_s": 0,
            "policies": [{"type": "percent", "value": 50, "period_s": 60}],
        }
    )
    assert odd.decide(observe(0, pool(target=5, active=5, num_running=1))) == {"default": 2}


def test_hpa_select_policy_min_and_disabled():
    """From 4 replicas wanting 20: policies 4 pods (-> 8) and 50 % (-> 6) per 15 s; `max`
    allows 8, `min` 6, `disabled` keeps 4."""
    policies = [
        {"type": "pods", "value": 4, "period_s": 15},
        {"type": "percent", "value": 50, "period_s": 15},
    ]
    answers = {
        select: hpa(scale_up={"policies": policies, "select_policy": select}).decide(
            observe(0, pool(num_running=80))
        )
        for select in ("max", "min", "disabled")
    }
    assert answers == {"max": {"default": 8}, "min": {"default": 6}, "disabled": {"default": 4}}


def test_hpa_starting_replicas_count_as_missing_metrics():
    """Target 4 replicas, 2 active, 2 starting (no metrics yet). Average 6 on the active ones:
    ratio 1.5, a scale-up, so kube counts the missing pods at 0: (12 + 0) / 4 = 3, ratio 0.75
    flips the direction: hold 4. With 10 each: (20 + 0) / 4 = 5, ratio 1.25, ceil(5) = 5."""
    starting = dict(active=2, starting=2)
    assert hpa().decide(observe(0, pool(num_running=12, **starting))) == {"default": 4}
    assert hpa().decide(observe(0, pool(num_running=20, **starting))) == {"default": 5}
    # on a scale-down they count at the target: 1 each on the active ones (ratio 0.25), then
    # (2 + 2 x 4) / 4 = 2.5, ratio 0.625, ceil(0.625 x 4) = 3
    no_window = hpa(scale_down={"stabilization_window_s": 0})
    assert no_window.decide(observe(0, pool(num_running=2, **starting))) == {"default": 3}
    # exactly on target (ratio 1): the missing pods are left out, the ratio stays 1, hold
    assert no_window.decide(observe(0, pool(num_running=8, **starting))) == {"default": 4}


def test_hpa_bounds_and_no_metrics():
    """Desired 20 on max_replicas 6: 6. No active replica: no metric, no decision (kube
    skips). A pool above its max goes to the max."""
    assert hpa().decide(observe(0, pool(num_running=80, max_replicas=6))) == {"default": 6}
    assert hpa().decide(observe(0, pool(active=0, starting=4))) == {}
    assert hpa().decide(observe(0, pool(target=12, active=12, num_running=48))) == {"default": 10}


def test_hpa_pools_param_selects_pools():
    scaler = hpa(pools=["a"])
    answer = scaler.decide(observe(0, pool("a", num_running=26), pool("b", num_running=26)))
    assert answer == {"a": 7}
    ctx = Context()
    ctx.pools = {"a": pool("a")}
    with pytest.raises(
        ConfigError, match=r"^autoscaler\.params: autoscaler 'hpa': param 'pools': no pool 'c'"
    ):
        hpa(pools=["c"]).bind(ctx)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"metric": "cpu", "target": 1}, "param 'metric' must be one of"),
        ({"metric": "num_running", "target": 0}, "param 'target' must be > 0"),
        ({"metric": "num_running", "target": -2}, "param 'target' must be > 0"),
        (
            {"metric": "num_running", "target": 1, "tolerance": -0.1},
            "param 'tolerance' must be >= 0",
        ),
        (
            {"metric": "num_running", "target": 1, "scale_down": {"stabilization_window_s": -1}},
            "param 'scale_down.stabilization_window_s' must be >= 0",
        ),
        (
            {"metric": "num_running", "target": 1, "scale_up": {"window": 3}},
            "param 'scale_up' has no key 'window'",
        ),
        (
            {
                "metric": "num_running",
                "target": 1,
                "scale_up": {"policies": [{"type": "nodes", "value": 1, "period_s": 15}]},
            },
            "param 'scale_up.policies\\[0\\].type' must be one of pods|percent",
        ),
        (
            {
                "metric": "num_running",
                "target": 1,
                "scale_up": {"policies": [{"type": "pods", "value": 1}]},
            },
            "param 'scale_up.policies\\[0\\]' lacks 'period_s'",
        ),
        (
            {"metric": "num_running", "target": 1, "scale_up": {"select_policy": "avg"}},
            "param 'scale_up.select_policy'",
        ),
    ],
)
def test_hpa_bad_params(params, message):
    with pytest.raises(ValueError, match=message):
        HorizontalPodAutoscaler(**params)
    with pytest.raises(ConfigError, match="autoscaler 'hpa': " + message):
        AUTOSCALERS.create("hpa", params)


# -- sla_planner: the engine model ------------------------------------------------------------

# Prefill engines: 10 ms + 0.1 ms per prefill token. Decode engines: 10 ms + 0.1 ms per
# decode + 1 us per KV token attended.
PREFILL = LinearCostModel(step_base_s=0.010, per_prefill_token_s=0.0001)
DECODE = LinearCostModel(step_base_s=0.010, per_decode_seq_s=0.0001, per_context_token_s=1e-6)


def perf(model=PREFILL, **limits) -> EnginePerformance:
    return EnginePerformance(
        model,
        **{
            "max_num_batched_tokens": 8192,
            "max_num_seqs": 1024,
            "max_kv_tokens": 100_000,
            **limits,
        },
    )


def test_prefill_capacity_largest_batch_within_ttft():
    """ISL 1000: batches up to min(1024, 8192 // 1000) = 8; TTFT(b) = 0.01 + 0.1 b s, so
    b = 4 (0.41 s) is the largest within 500 ms: 4 / 0.41 = 9.7561 req/s."""
    capacity = perf().prefill_capacity(1000, 0.5)
    assert capacity.ttft_s == pytest.approx(0.41)
    assert capacity.rps == pytest.approx(4 / 0.41)
    assert capacity.eligible


def test_prefill_capacity_chunks_long_prompts():
    """ISL 10000 > 8192: batch 1 in two chunks, 8192 and 1808 tokens:
    (0.01 + 0.8192) + (0.01 + 0.1808) = 1.02 s, over the target, still the answer."""
    capacity = perf().prefill_capacity(10_000, 0.5)
    assert capacity.ttft_s == pytest.approx(1.02)
    assert capacity.rps == pytest.approx(1 / 1.02)
    assert not capacity.eligible


def test_decode_capacity_itl_and_kv_bounds():
    """ISL 1000, OSL 100: context 1000 + 100 // 2 = 1050. ITL(B) = 0.01 + 0.0001 B + 1e-6 x 1050 B
    = 0.01 + 0.00115 B <= 0.05 gives B = 34 (49.1 ms): 34 / (100 x 0.0491) = 6.9246 req/s.
    With 20000 KV tokens only 20000 // 1050 = 19 fit: ITL 31.85 ms, 19 / 3.185 = 5.9655."""
    capacity = perf(DECODE).decode_capacity(1000, 100, 0.05)
    assert capacity.itl_s == pytest.approx(0.0491)
    assert capacity.rps == pytest.approx(34 / (100 * 0.0491))
    small = perf(DECODE, max_kv_tokens=20_000).decode_capacity(1000, 100, 0.05)
    assert small.rps == pytest.approx(19 / (100 * 0.03185))


def test_aggregated_capacity_balances_prefill_with_decodes():
    """ISL 1000, OSL 100 on the decode profile (prefill tokens cost 1 us of context each, no
    per-token prefill cost): batch B needs ceil(10 B) prefill tokens per pass. ITL(B) =
    0.01 + 0.0001 B + 1e-6 (10 B + 1050 B) = 0.01 + 0.00116 B <= 0.05 gives B = 34
    (ITL 0.04944 s); its TTFT = one pass of 340 + 1000 prefill tokens beside the 34 decodes =
    0.01 + 0.0034 + 1e-6 (1340 + 35700) = 0.05044 s <= 0.5. rps = 34 / (100 x 0.04944)."""
    capacity = perf(DECODE).aggregated_capacity(1000, 100, 0.5, 0.05)
    assert capacity.itl_s == pytest.approx(0.04944)
    assert capacity.ttft_s == pytest.approx(0.05044)
    assert capacity.rps == pytest.approx(34 / (100 * 0.04944))


def test_capacity_batch_sizes_matches_dynamo_sampling():
    """engine_query.py: all sizes up to 128, else 128 points 1 + k (max - 1) // 127."""
    assert capacity_batch_sizes(3) == [1, 2, 3]
    sizes = capacity_batch_sizes(1024)
    assert len(sizes) == 128 and sizes[0] == 1 and sizes[-1] == 1024
    assert sizes[1] == 9 and sizes[10] == 81  # 1 + 1023 // 127, 1 + 10230 // 127 (80.55 floored)


def test_profiler_tables_match_dynamo_profiler_points():
    """Max context 4608, granularity 8: prefill ISLs range(100, 4096, 499) = 100, 599, ...,
    3593 (9 points); TTFT(100) = 0.01 + 0.01 = 20 ms, 100 / 20 ms = 5000 tok/s/GPU. Decode
    at ISL 100 (context 350, KV 100000): max concurrency 100000 // 600 = 166, 8 levels from 1
    to 166; n = 1: ITL = 0.01 + 0.0001 + 350e-6 = 10.45 ms."""
    tables = profiler_tables(perf(DECODE), max_context_length=4608)
    prefill, decode = tables["prefill"], tables["decode"]
    assert list(prefill["prefill_isl"][:2]) == [100, 599] and len(prefill["prefill_isl"]) == 9
    prefill_only = profiler_tables(perf(PREFILL), max_context_length=4608)["prefill"]
    assert prefill_only["prefill_ttft"][0] == pytest.approx(20.0)
    assert prefill_only["prefill_thpt_per_gpu"][0] == pytest.approx(5000.0)
    assert decode["y_context_length"][0] == 350 and decode["z_itl"][0] == pytest.approx(10.45)
    assert decode["x_kv_usage"][7] == pytest.approx(350 * 166 / 100_000)


# -- sla_planner: load predictors --------------------------------------------------------------


def test_constant_predictor_skips_the_idle_start():
    predictor = ConstantPredictor()
    for value in (0, 0, 5, 0, 7):
        predictor.add(value)
    assert predictor.data == [5, 0, 7] and predictor.predict() == 7


def test_kalman_predictor_matches_dynamo():
    """Reference values printed by dynamo 1.6.1's own KalmanPredictor (filterpy) for these
    inputs with the default q_level 1, q_trend 0.1, r 10, min points 5: the last value until 5
    points, then the filter's one-step forecast."""
    predictor = KalmanPredictor(q_level=1.0, q_trend=0.1, r=10.0, min_points=5, log1p=False)
    forecasts = []
    for value in (0, 0, 10, 20, 30, 40, 50, 60, 55):
        predictor.add(value)
        forecasts.append(predictor.predict())
    expected = [0, 0, 10, 20, 30, 40, 59.9478225545025, 69.96846936351255, 69.25882134594573]
    assert forecasts == pytest.approx(expected, rel=1e-12)
    in_log = KalmanPredictor(q_level=1.0, q_trend=0.1, r=10.0, min_points=5, log1p=True)
    forecasts = []
    for value in (100, 120, 90, 150, 160, 170):
        in_log.add(value)
        forecasts.append(in_log.predict())
    assert forecasts == pytest.approx(
        [100, 120, 90, 150, 178.93210914931495, 196.4054034513862], rel=1e-12
    )


# -- sla_planner: decisions --------------------------------------------------------------------


def disagg_planner(**params) -> SlaPlanner:
    planner = AUTOSCALERS.create("sla_planner", params)
    ctx = Context()
    ctx.pools = {
        "prefill": {"role": "prefill", "max_kv_tokens": 100_000},
        "decode": {"role": "decode", "max_kv_tokens": 100_000},
    }
    ctx.cost_models = {"prefill": PREFILL, "decode": DECODE}
    ctx.interval_s = 60.0
    planner.bind(ctx)
    return planner


def pd_observation(
    time_s=60.0, *, requests=1800, prefill_active=4, decode_active=4, ttft=None, itl=None
):
    prefill = pool(
        "prefill",
        role="prefill",
        target=prefill_active,
        active=prefill_active,
        num_requests=requests,
        request_rate=requests / 60,
        mean_input_tokens=1000.0,
        mean_output_tokens=100.0,
        ttft_mean_s=ttft,
    )
    decode = pool(
        "decode",
        role="decode",
        target=decode_active,
        active=decode_active,
        num_requests=requests,
        request_rate=requests / 60,
        mean_input_tokens=1000.0,
        mean_output_tokens=100.0,
        itl_mean_s=itl,
    )
    return observe(time_s, prefill, decode)


def test_sla_planner_disagg_replicas_by_hand():
    """1800 requests in 60 s: 30 req/s of ISL 1000, OSL 100 (constant forecast). Prefill:
    ceil(30 / (4 / 0.41)) = ceil(3.075) = 4. Decode: ceil(30 / (34 / 4.91)) = ceil(4.332) = 5."""
    planner = disagg_planner()
    assert planner.resolved_mode == "disagg"
    assert planner.decide(pd_observation(prefill_active=2, decode_active=2)) == {
        "prefill": 4,
        "decode": 5,
    }
    event = planner.ctx.events[0]  # Dynamo's per-tick diagnostics, for router_events.parquet
    assert (
        event["kind"],
        event["demand_rps"],
        event["target_prefill"],
        event["target_decode"],
    ) == ("sla_planner", 30.0, 4, 5)
    assert event["prefill_engine_rps"] == pytest.approx(4 / 0.41)
    assert event["decode_engine_rps"] == pytest.approx(34 / 4.91)
    # the same counts ready already: no decision
    assert planner.decide(pd_observation(prefill_active=4, decode_active=5)) == {}


def test_sla_planner_isl_from_finished_requests():
    """Routed requests averaged 1000 prompt tokens in the interval, the requests that finished
    in it (in the decode pool) 2000. `isl_from: routed` forecasts ISL 1000, `finished` 2000
    (Dynamo's offline replay's window: ISL over completed requests); the request count stays
    the routed 1800 either way (demand 30 req/s)."""
    obs = pd_observation(prefill_active=2, decode_active=2)
    decode = dataclasses.replace(obs.pools["decode"], mean_finished_input_tokens=2000.0)
    obs = dataclasses.replace(obs, pools={**obs.pools, "decode": decode})
    for isl_from, isl in (("routed", 1000.0), ("finished", 2000.0)):
        planner = disagg_planner(isl_from=isl_from)
        planner.decide(obs)
        event = planner.ctx.events[0]
        assert (event["predicted_isl"], event["demand_rps"]) == (isl, 30.0)


def test_fleet_traffic_window_averages_finished_prompts():
    """Requests routed at 1 s (prompt 100) and 2 s (300); two finish in (0, 10]: at 5 s
    (prompt 500, 4 output tokens, ITL 0.1) and 8 s (prompt 1500, 2 tokens, ITL 0.3), one at
    12 s outside. Window (0, 10]: 2 routed of mean ISL 200, mean OSL 3, mean ITL 0.2, mean
    prompt of the finished (500 + 1500) / 2 = 1000."""
    from lmsim.engine.fleet import _Traffic

    t = _Traffic()
    t.routed.extend([(1.0, 100), (2.0, 300)])
    t.finished.extend([(5.0, 4, 0.1, 500), (8.0, 2, 0.3, 1500), (12.0, 9, 0.5, 7000)])
    num, isl, osl, ttft, itl, finished_isl = t.window(0.0, 10.0)
    assert (num, isl, osl, ttft, finished_isl) == (2, 200.0, 3.0, None, 1000.0)
    assert itl == pytest.approx(0.2)


def test_sla_planner_caps_change_per_decision_and_keeps_the_floor():
    """From 1 + 1 the cap of 2 per decision allows 3 + 3; with no traffic yet (ISL unknown)
    the model cannot size the tick and holds the ready counts, raised to min_endpoint 2."""
    planner = disagg_planner(max_throughput_scaling_replicas=2)
    assert planner.decide(pd_observation(prefill_active=1, decode_active=1)) == {
        "prefill": 3,
        "decode": 3,
    }
    idle = disagg_planner(min_endpoint=2)
    quiet = pd_observation(requests=0, prefill_active=1, decode_active=1)
    quiet = dataclasses.replace(
        quiet,
        pools={
            k: dataclasses.replace(
                v, mean_input_tokens=float("nan"), mean_output_tokens=float("nan")
            )
            for k, v in quiet.pools.items()
        },
    )
    assert idle.decide(quiet) == {"prefill": 2, "decode": 2}


def test_sla_planner_gpu_budget_fits_the_proposal():
    """Wanting 4 prefill + 5 decode (1 GPU each) from 2 + 2 under 6 GPUs: both grow, the
    fitting pair nearest (4, 5) with the least skew between the two growths (2 asked of
    prefill, 3 of decode) is (3, 3); `fit_directional_budget_pair` picks the same."""
    planner = disagg_planner(max_gpu_budget=6)
    assert planner.decide(pd_observation(prefill_active=2, decode_active=2)) == {
        "prefill": 3,
        "decode": 3,
    }
    assert fit_pair_under_ceiling((2, 2), (4, 5), (1, 1), 6, (1, 1)) == (3, 3)


def test_sla_planner_correction_factors():
    """Decode engines 30, observed mean ITL 30 ms and TTFT 30 ms, OSL 100: request duration
    0.03 + 0.03 x 99 = 3 s; per-engine concurrency 1800 / 30 x 3 / 60 = 3; expected ITL at 3
    decodes of context 1050 = 0.01 + 0.00115 x 3 = 13.45 ms: d = 30 / 13.45 = 2.2305, so the
    decode is sized for 50 / 2.2305 = 22.42 ms: B = 10 (21.5 ms), 10 / 2.15 = 4.651 req/s,
    ceil(30 / 4.651) = 7 (5 uncorrected). Expected TTFT at ISL 1000 = 0.11 s: p = 0.03 / 0.11
    = 0.2727, demand 30 x 0.2727 = 8.18 req/s, ceil(8.18 x 0.41 / 4) = 1 (4 uncorrected).
    A TTFT above the expected one (p > 1) changes nothing: min(1, p)."""
    observation = pd_observation(decode_active=30, ttft=0.03, itl=0.03)
    plain = disagg_planner(max_throughput_scaling_replicas=100)
    assert plain.decide(observation) == {"prefill": 4, "decode": 5}
    corrected = disagg_planner(max_throughput_scaling_replicas=100, correction_factors=True)
    assert corrected.decide(observation) == {"prefill": 1, "decode": 7}
    assert corrected.d_correction == pytest.approx(0.03 / 0.01345)
    assert corrected.p_correction == pytest.approx(0.03 / 0.11)
    slow_prefill = disagg_planner(max_throughput_scaling_replicas=100, correction_factors=True)
    assert slow_prefill.decide(pd_observation(decode_active=30, ttft=0.5, itl=0.03))["prefill"] == 4


def test_sla_planner_aggregated_mode():
    """One pool of role `both` on the decode profile: 30 req/s over 34 / 4.944 = 6.877 req/s
    per engine (see the aggregated capacity test): ceil(4.362) = 5."""
    planner = AUTOSCALERS.create("sla_planner", {})
    ctx = Context()
    ctx.pools = {"default": {"role": "both", "max_kv_tokens": 100_000}}
    ctx.cost_models = {"default": DECODE}
    ctx.interval_s = 60.0
    planner.bind(ctx)
    assert planner.resolved_mode == "agg"
    one = pool(
        num_requests=1800, mean_input_tokens=1000.0, mean_output_tokens=100.0, target=1, active=1
    )
    assert planner.decide(observe(60, one)) == {"default": 5}
    assert math.ceil(30 / (34 / (100 * 0.04944))) == 5


def test_sla_planner_kalman_forecasts_the_ramp():
    """Requests per interval 600, 1200, ..., 3000 (10 to 50 req/s): after 5 points the
    Kalman forecast is 60 x the reference forecast for 10, ..., 50 (the filter is linear in
    its inputs): 3596.9 requests, 59.95 req/s, sizes prefill for ceil(59.95 x 0.41 / 4) = 7, where the constant
    forecast (50 req/s) gives ceil(5.125) = 6."""
    kalman = disagg_planner(load_predictor="kalman", max_throughput_scaling_replicas=100)
    constant = disagg_planner(max_throughput_scaling_replicas=100)
    for k, requests in enumerate((600, 1200, 1800, 2400, 3000)):
        answer_k = kalman.decide(pd_observation(60.0 * (k + 1), requests=requests))
        answer_c = constant.decide(pd_observation(60.0 * (k + 1), requests=requests))
    assert kalman.last_decision["predicted_num_req"] == pytest.approx(
        59.9478225545025 * 60, rel=1e-9
    )
    assert answer_k["prefill"] == 7 and answer_c["prefill"] == 6


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"ttft_ms": 0}, "param 'ttft_ms' must be > 0"),
        ({"itl_ms": -5}, "param 'itl_ms' must be > 0"),
        ({"load_predictor": "arima"}, "param 'load_predictor' must be one of constant|kalman"),
        ({"mode": "prefill"}, "param 'mode' must be one of"),
        ({"min_endpoint": -1}, "param 'min_endpoint' must be >= 0"),
        (
            {"max_throughput_scaling_replicas": 0},
            "param 'max_throughput_scaling_replicas' must be >= 1",
        ),
        ({"max_gpu_budget": -2}, "param 'max_gpu_budget' must be >= -1"),
        ({"correction_factors": "yes"}, "param 'correction_factors' must be true or false"),
        ({"isl_from": "arrived"}, "param 'isl_from' must be one of finished\\|routed"),
    ],
)
def test_sla_planner_bad_params(params, message):
    with pytest.raises(ValueError, match=message):
        SlaPlanner(**params)
    with pytest.raises(ConfigError, match="autoscaler 'sla_planner': " + message):
        AUTOSCALERS.create("sla_planner", params)


def test_sla_planner_bad_pools_at_bind():
    planner = AUTOSCALERS.create("sla_planner", {"prefill_pool": "nope"})
    ctx = Context()
    ctx.pools = {"p": {"role": "prefill"}, "d": {"role": "decode"}}
    ctx.cost_models = {"p": PREFILL, "d": DECODE}
    with pytest.raises(
        ConfigError, match="autoscaler 'sla_planner': param 'prefill_pool': no pool 'nope'"
    ):
        planner.bind(ctx)
    agg = AUTOSCALERS.create("sla_planner", {"correction_factors": True})
    ctx.pools = {"default": {"role": "both"}}
    with pytest.raises(
        ConfigError, match="param 'correction_factors' needs prefill and decode pools"
    ):
        agg.bind(ctx)


def test_hpa_percent_scale_up_rounds_up():
    """50 % per 15 s from 3 replicas: ceil(3 x 1.5) = ceil(4.5) = 5 (kube rounds a scale-up
    limit up so that small deployments can grow)."""
    scaler = hpa(scale_up={"policies": [{"type": "percent", "value": 50, "period_s": 15}]})
    assert scaler.decide(observe(0, pool(target=3, active=3, num_running=60))) == {"default": 5}


PLANNER_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "against_dynamo_planner.py"


def test_planner_pieces_match_dynamos_own_code(monkeypatch, capsys):
    """benchmarks/against_dynamo_planner.py runs Dynamo 1.6.1's capacity search, GPU-ceiling
    fit and Kalman predictor beside ours on the same inputs (18 capacity cases, 5000 budget
    cases, 4 series): no mismatch. Skipped where the peer interpreter is not installed."""
    monkeypatch.syspath_prepend(str(PLANNER_SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("against_dynamo_planner", PLANNER_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not module.peer_available(module.DEFAULT_PEER):
        pytest.skip("needs the Dynamo peer interpreter")
    assert module.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("mismatches     0") == 4, out


def test_sla_planner_engine_limits_sources():
    """The decode pool's KV capacity from `ctx.engine_limits` (20000 tokens: 19 sequences of
    context 1050, 5.9655 req/s per engine, ceil(30 / 5.9655) = ceil(5.029) = 6 engines); the
    `max_kv_tokens` param wins over it; with neither (the fleet hands PoolObservations as pool
    facts) and a profile without memory facts, Dynamo's replay fallback of 16384 x 16 tokens
    (no KV bound at this context: 34 sequences, 5 engines)."""

    def planner(params, engine_limits=None):
        scaler = AUTOSCALERS.create("sla_planner", params)
        ctx = Context()
        ctx.pools = {
            "prefill": pool("prefill", role="prefill"),
            "decode": pool("decode", role="decode"),
        }
        ctx.cost_models = {"prefill": PREFILL, "decode": DECODE}
        ctx.interval_s = 60.0
        if engine_limits is not None:
            ctx.engine_limits = engine_limits
        scaler.bind(ctx)
        return scaler

    limits = {"decode": {"max_kv_tokens": 20_000}}
    assert planner({}, limits).decide(pd_observation(decode_active=1))["decode"] == 6
    assert (
        planner({"max_kv_tokens": 100_000}, limits).decide(pd_observation(decode_active=1))[
            "decode"
        ]
        == 5
    )
    fallback = planner({})
    assert fallback.performance["decode"].max_kv_tokens == 16384 * 16
    assert fallback.performance["decode"].max_num_batched_tokens == 8192
    assert fallback.decide(pd_observation(decode_active=1))["decode"] == 5
