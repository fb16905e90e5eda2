"""workload.rate_schedule (lmsim.workload.rate_schedule): a monotone time warp of the
arrivals after time_scale / rate / load. Every expected number is computed by hand in the
test's docstring."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmsim.config import RateScheduleConfig, validate
from lmsim.errors import ConfigError
from lmsim.study.experiment import capacity_trace, shape_workload
from lmsim.workload.rate_schedule import apply_rate_schedule, cumulative, multiplier, warp_times
from lmsim.workload.trace import Trace


def steady(n: int, gap: float = 1.0, **columns) -> Trace:
    """n requests, one every `gap` seconds from 0."""
    return Trace(
        arrival_s=np.arange(n) * gap,
        input_tokens=np.full(n, 16),
        output_tokens=np.full(n, 4),
        hash_offsets=np.arange(n + 1),
        hash_values=np.arange(n),
        block_size=16,
        **columns,
    )


def piecewise(*points) -> RateScheduleConfig:
    return RateScheduleConfig(shape="piecewise", segments=[{"at_s": a, "multiplier": m} for a, m in points])


def test_piecewise_step_doubles_the_rate_from_its_start():
    """1 req/s under [0: x1, 10: x2]: Lambda(T) = T up to 10, then 10 + 2 (T - 10). The
    input arrival at t = 10 + k lands at T = 10 + k / 2: arrivals 0, 1, ..., 10 a second
    apart, then 10.5, 11, ..., 0.5 s apart."""
    out = apply_rate_schedule(steady(21), piecewise((0, 1), (10, 2)))
    expected = np.concatenate([np.arange(11.0), 10 + np.arange(1, 11) / 2])
    np.testing.assert_allclose(out.arrival_s, expected, rtol=0, atol=1e-12)
    assert np.diff(out.arrival_s[:11]).tolist() == [1.0] * 10
    np.testing.assert_allclose(np.diff(out.arrival_s[10:]), 0.5)


def test_piecewise_slowdown_and_speedup():
    """[0: x0.5, 4: x4] on 1 req/s: Lambda(4) = 0.5 * 4 = 2, so t = 1, 2 land at 2, 4
    (gaps 2 s), and t = 3 at 4 + (3 - 2) / 4 = 4.25."""
    out = warp_times(np.array([0.0, 1.0, 2.0, 3.0]), piecewise((0, 0.5), (4, 4)))
    np.testing.assert_allclose(out, [0.0, 2.0, 4.0, 4.25])


def test_linear_ramp_matches_the_integral():
    """Linear from x1 at 0 to x3 at 10, held after: Lambda(T) = T + T^2 / 10 on [0, 10]
    (m = 1 + T / 5), so Lambda(10) = 20 and input t = 20 lands at T = 10; t = 11 solves
    T^2 / 10 + T = 11: T = (-1 + sqrt(1 + 4.4)) * 5 = 6.6190; t = 26 lands at 10 + 6 / 3 = 12."""
    s = RateScheduleConfig(shape="linear", segments=[{"at_s": 0, "multiplier": 1}, {"at_s": 10, "multiplier": 3}])
    out = warp_times(np.array([0.0, 11.0, 20.0, 26.0]), s)
    np.testing.assert_allclose(out, [0.0, (-1 + math.sqrt(5.4)) * 5, 10.0, 12.0], rtol=1e-12)
    np.testing.assert_allclose(cumulative(out, s), [0.0, 11.0, 20.0, 26.0], rtol=1e-12)
    np.testing.assert_allclose(multiplier(np.array([0.0, 5.0, 10.0, 99.0]), s), [1, 2, 3, 3])


def diurnal(**kw) -> RateScheduleConfig:
    return RateScheduleConfig(shape="diurnal", **{"period_s": 100.0, "peak_at_s": 25.0, "low": 1.0, "high": 3.0, **kw})


def test_diurnal_integrates_to_the_mean_over_a_period():
    """m = low + (high - low)(1 + cos)/2 averages (1 + 3) / 2 = 2 over a period, so a
    steady 10 req/s workload (4000 requests over 400 s) puts Lambda(100) * 10 = 2000
    arrivals in the first 100 s of output time, and all 4000 by T = 200."""
    s = diurnal()
    trace = steady(4000, gap=0.1)
    out = apply_rate_schedule(trace, s).arrival_s
    assert cumulative(np.array([100.0]), s)[0] == pytest.approx(200.0, rel=1e-12)
    assert int((out < 100.0).sum()) == 2000
    assert int((out < 200.0).sum()) == 4000
    np.testing.assert_allclose(cumulative(out, s), trace.arrival_s, atol=1e-9)


def test_diurnal_peaks_where_asked():
    """The multiplier is high at the peak and low half a period later; the warped
    arrivals are densest around peak_at_s: the gap there is 0.1 / 3, at the trough 0.1."""
    s = diurnal()
    np.testing.assert_allclose(multiplier(np.array([25.0, 75.0, 125.0]), s), [3.0, 1.0, 3.0])
    out = apply_rate_schedule(steady(4000, gap=0.1), s).arrival_s
    at_peak = np.diff(out[(out > 24.9) & (out < 25.1)])
    at_trough = np.diff(out[(out > 74.8) & (out < 75.2)])
    assert at_peak.mean() == pytest.approx(0.1 / 3, rel=1e-3)
    assert at_trough.mean() == pytest.approx(0.1, rel=1e-3)


def test_diurnal_is_dynamos_sinusoid_with_the_peak_mid_period():
    """Dynamo's sin_synth.py: rate(t) = (min + max)/2 + (max - min)/2 sin(2 pi t / period - pi/2);
    with min 5, max 10, period 10 it equals diurnal(low 5, high 10, peak 5): 5 at 0, 7.5 at
    2.5, 10 at 5."""
    s = diurnal(period_s=10.0, peak_at_s=5.0, low=5.0, high=10.0)
    t = np.linspace(0, 30, 301)
    dynamo = 7.5 + 2.5 * np.sin(2 * np.pi * t / 10 - np.pi / 2)
    np.testing.assert_allclose(multiplier(t, s), dynamo, atol=1e-12)
    np.testing.assert_allclose(multiplier(np.array([0.0, 2.5, 5.0]), s), [5.0, 7.5, 10.0], atol=1e-12)


def test_warp_is_monotone_and_deterministic():
    rng = np.random.default_rng(3)
    t = np.sort(rng.exponential(1.0, 5000).cumsum())
    for s in (piecewise((0, 2), (50, 0.3), (400, 5)), diurnal(peak_at_s=0.0, low=0.2, high=4.0)):
        out = warp_times(t, s)
        assert np.all(np.diff(out) >= 0)
        assert np.array_equal(out, warp_times(t.copy(), s))


def test_closed_loop_think_times_are_not_scaled():
    """Only arrival estimates move: delay_s (think time) and the links stay as they are."""
    trace = steady(4, after_id=np.array([-1, 0, 1, -1]), delay_s=np.array([0.0, 3.0, 5.0, 0.0]))
    out = apply_rate_schedule(trace, piecewise((0, 4)))
    np.testing.assert_allclose(out.arrival_s, [0.0, 0.25, 0.5, 0.75])
    assert out.delay_s.tolist() == [0.0, 3.0, 5.0, 0.0]
    assert out.after_id.tolist() == [-1, 0, 1, -1]


def test_a_ladder_is_refused():
    with pytest.raises(ConfigError, match="staged workload"):
        apply_rate_schedule(steady(3, stage=np.array([0, 0, 1])), piecewise((0, 2)))


BASE = {
    "workload": {"generator": {"name": "random", "params": {"num_requests": 50}}},
    "cluster": {"num_instances": 1, "profile": {"kind": "linear", "step_base_s": 0.01}, "num_gpu_blocks": 100},
}


def config(**workload):
    return validate({**BASE, "workload": {**BASE["workload"], **workload}}, where="test")


def test_applied_after_the_rate_and_left_out_of_the_capacity_reference():
    """`rate: 2` (requests / span) stretches 50 requests over 50 / 2 = 25 s; a constant x4
    schedule then divides every gap by 4: the span becomes 25 / 4 = 6.25 s. The trace `load:` measures capacity on is
    the unscheduled one."""
    trace = steady(50, gap=1.0)
    plain = shape_workload(trace, config(rate=2.0))
    cfg = config(rate=2.0, rate_schedule={"shape": "piecewise", "segments": [{"at_s": 0, "multiplier": 4}]})
    scheduled = shape_workload(trace, cfg)
    assert plain.arrival_s[-1] == pytest.approx(25.0)
    assert scheduled.arrival_s[-1] == pytest.approx(6.25)
    reference = capacity_trace(cfg)
    assert np.array_equal(reference.arrival_s, capacity_trace(config()).arrival_s)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"shape": "piecewise", "segments": [{"at_s": 5, "multiplier": 1}]}, "must start at at_s 0"),
        ({"shape": "linear", "segments": [{"at_s": 0, "multiplier": 1}, {"at_s": 0, "multiplier": 2}]}, "sorted"),
        ({"shape": "piecewise"}, "needs segments"),
        ({"shape": "diurnal", "period_s": 10, "low": 1, "high": 2}, "needs peak_at_s"),
        ({"shape": "diurnal", "period_s": 10, "peak_at_s": 0, "low": 3, "high": 2}, "low 3.0 > high 2.0"),
        ({"shape": "piecewise", "segments": [{"at_s": 0, "multiplier": 1}], "low": 1}, "not low"),
    ],
)
def test_bad_schedules_are_one_line(schedule, message):
    with pytest.raises(ConfigError, match=message) as err:
        config(rate_schedule=schedule)
    assert "\n" not in str(err.value) and "workload.rate_schedule" in str(err.value)


def test_validate_names_the_schedule_and_the_span_it_produced(tmp_path, capsys):
    """50 requests a second apart (trace arrivals 0..49) under x2 from 0: arrivals over 0-24.5 s."""
    import yaml

    from lmsim.cli import main

    steady(50).save(tmp_path / "t.parquet")
    raw = {**BASE, "workload": {"trace": "t.parquet",
                                "rate_schedule": {"shape": "piecewise", "segments": [{"at_s": 0, "multiplier": 2}]}}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["validate", str(tmp_path / "exp.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "rate schedule piecewise x2 at 0 s: arrivals over 0-24.5 s"
