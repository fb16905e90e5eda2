"""The `polynomial` profile (lmsim/profile/polynomial.py): Dynamo's mocker step model.

Hand numbers (the mocker measured the same, peer_research §A.3 and §C.4):
prefill of 4,096 new tokens = 4.209989e-7 x 4096² + 1.518344e-2 x 4096 + 16.50142
= 7.06319 + 62.19137 + 16.50142 = 85.75598 ms; one 4,096-token sequence decoding on
17,500 x 16 = 280,000 KV tokens: u = 0.0146286, -25.74 u² + 54.01 u + 5.74 = 6.52458 ms."""

from __future__ import annotations

import pytest

from conftest import make_config, make_trace
from lmsim.config import validate
from lmsim.errors import ConfigError
from lmsim.profile import bind_kv_capacity, load_cost_model
from lmsim.study.compose import build_simulation

CAP = 280_000
PREFILL_4096 = 0.08575598
DECODE_4096 = 0.00652458


def model(**fields):
    return bind_kv_capacity(load_cost_model({"kind": "polynomial", **fields}), CAP)


def test_prefill_and_decode_forms():
    agg, pre, dec = model(), model(worker_type="prefill"), model(worker_type="decode")
    assert pre.step_time([(4096, 0)], 0, 0) == pytest.approx(PREFILL_4096, abs=1e-8)
    # vLLM mode: the pass that completes the prompt samples a token, so a decode part is added
    assert agg.step_time([(4096, 0)], 0, 0) == pytest.approx(PREFILL_4096 + DECODE_4096, abs=1e-8)
    # a decode worker computes the last prompt token for free and decodes
    assert dec.step_time([(1, 4095)], 0, 0) == pytest.approx(DECODE_4096, abs=1e-8)
    assert agg.step_time((), 1, 4096) == pytest.approx(DECODE_4096, abs=1e-8)
    # cached context is ignored; u is capped at 1 (-25.74 + 54.01 + 5.74 = 34.01 ms)
    assert agg.step_time([(4096, 100_000)], 0, 0) > agg.step_time([(4096, 0)], 0, 0)
    assert pre.step_time([(4096, 100_000)], 0, 0) == pre.step_time([(4096, 0)], 0, 0)
    assert agg.step_time((), 10, 10 * CAP) == pytest.approx(0.03401)
    # the 1 ms floor: u = 0 gives 5.74 ms, never below 1
    assert agg.step_time((), 1, 0) == pytest.approx(0.00574)


def test_decode_runs_match_single_steps_bit_for_bit():
    m = model()
    run = m.decode_run_times(7, 12_345, 40)
    assert [float(x) for x in run] == [m.step_time((), 7, 12_345 + 7 * k) for k in range(40)]


def test_the_engine_binds_each_pools_kv_size():
    # 100-token prompt, 3 outputs, 1,000 blocks of 16: prefill 16.50142 + 1.518344
    # + 0.0042 = 18.0240 ms plus decode at u = 100/16000 (5.7400 + 0.33756 - 0.00101 =
    # 6.07655 ms); then two decodes at 101 and 102 tokens.
    trace = make_trace([0.0], [100], [3])
    cfg = make_config(cluster={"profile": {"kind": "polynomial"}})
    sim = build_simulation(cfg, trace)
    assert sim.instances[0].scheduler.cost_model.kv_capacity_tokens == 16_000
    r = sim.run().requests.iloc[0]

    def dec(k):
        u = k / 16_000
        return (-25.74 * u * u + 54.01 * u + 5.74) / 1000

    prefill = (4.209989e-07 * 100**2 + 1.518344e-02 * 100 + 1.650142e01) / 1000
    assert r.ttft_s == pytest.approx(prefill + dec(100))
    assert r.finished_at == pytest.approx(prefill + dec(100) + dec(101) + dec(102))


@pytest.mark.parametrize(("profile", "message"), [
    ({"kind": "polynomial", "worker_type": "both"}, "worker_type must be one of aggregated, prefill, decode"),
    ({"kind": "polynomial", "step_base_s": 0.01}, "unknown field 'step_base_s' for a polynomial profile"),
    ({"kind": "polynomial", "kv_capacity_tokens": 0}, "kv_capacity_tokens must be a positive integer"),
])
def test_bad_polynomial_fields_name_the_field(profile, message):
    with pytest.raises(ConfigError, match=message):
        validate({"workload": {"trace": "t"}, "cluster": {"profile": profile}}, where="exp.yaml")
