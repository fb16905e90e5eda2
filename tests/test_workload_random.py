"""The `random` generator (vLLM's synthetic benchmark workload) and the gamma arrival process
(lmsim/workload/generators/synthetic.py, lmsim/workload/arrivals.py).

Statistical checks state their bound: a sample mean of n gamma gaps (shape k, mean 1/rate)
has standard error (1/rate)(1/sqrt(k))/sqrt(n); a sample standard deviation has relative
standard error sqrt((2 + 6/k) / (4n)) (6/k is the gamma's excess kurtosis). Each test
allows 5 standard errors, so a correct generator fails about once in 1.7 million seeds,
and the seeds are fixed anyway.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import LINEAR, simulate
from lmsim.errors import ConfigError
from lmsim.workload.arrivals import arrivals_for_count, arrivals_for_duration
from lmsim.workload.generators import generate


def gaps_of(arrival: np.ndarray) -> np.ndarray:
    return np.diff(np.concatenate(([0.0], arrival)))


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_burstiness(burstiness: float) -> None:
    n, rate = 200_000, 8.0
    trace = generate("random", {"num_requests": n, "input_len": 16, "output_len": 1, "rate": rate,
                                "burstiness": burstiness, "rescale": False}, seed=11)  # fmt: skip
    gaps = gaps_of(trace.arrival_s)
    mean_se = (1 / rate) / math.sqrt(burstiness) / math.sqrt(n)
    assert abs(gaps.mean() - 1 / rate) < 5 * mean_se
    cv_rel_se = math.sqrt((2 + 6 / burstiness) / (4 * n))
    cv = gaps.std() / gaps.mean()
    assert abs(cv / (1 / math.sqrt(burstiness)) - 1) < 5 * cv_rel_se + 5 * mean_se * rate


def test_rescale_puts_the_last_arrival_at_count_over_rate() -> None:
    # vLLM stretches the cumulative gaps so that 1000 requests at 4 req/s end at 250 s;
    # the mean gap (the first measured from t = 0) is then 0.25 s exactly.
    trace = generate("random", {"num_requests": 1000, "rate": 4.0, "burstiness": 0.5,
                                "input_len": 16, "output_len": 1}, seed=2)  # fmt: skip
    assert trace.arrival_s[-1] == 250.0
    assert np.all(np.diff(trace.arrival_s) >= 0) and trace.arrival_s[0] > 0


def test_infinite_rate_and_infinite_burstiness() -> None:
    at_once = generate("random", {"num_requests": 5, "rate": "inf"}, seed=0)
    assert at_once.arrival_s.tolist() == [0.0] * 5
    even = generate("random", {"num_requests": 4, "rate": 4.0, "burstiness": float("inf")}, seed=0)
    assert even.arrival_s.tolist() == [0.25, 0.5, 0.75, 1.0]


def test_duration_draws_a_renewal_process_that_a_longer_duration_extends() -> None:
    # Poisson at 10 req/s for 1000 s: 10,000 arrivals expected, standard deviation 100
    times = arrivals_for_duration(np.random.default_rng(5), 1000.0, 10.0, 1.0)
    assert abs(len(times) - 10_000) < 500 and times.max() < 1000.0
    shorter = arrivals_for_duration(np.random.default_rng(5), 400.0, 10.0, 1.0)
    np.testing.assert_array_equal(shorter, times[: len(shorter)])
    trace = generate("random", {"duration_s": 60.0, "rate": 2.0, "input_len": 16}, seed=1)
    assert trace.arrival_s.max() < 60.0 and abs(len(trace) - 120) < 5 * math.sqrt(120)


def test_rescale_matches_the_count_formula() -> None:
    raw = arrivals_for_count(np.random.default_rng(3), 50, 5.0, 2.0, rescale=False)
    stretched = arrivals_for_count(np.random.default_rng(3), 50, 5.0, 2.0)
    np.testing.assert_allclose(stretched, raw * (10.0 / raw[-1]), rtol=1e-15)


def test_fixed_lengths_are_exact_and_every_block_is_unique() -> None:
    n = 300
    trace = generate("random", {"num_requests": n, "input_len": 100, "output_len": 20}, seed=4)
    assert trace.input_tokens.tolist() == [100] * n and trace.output_tokens.tolist() == [20] * n
    assert np.diff(trace.hash_offsets).tolist() == [7] * n  # ceil(100 / 16)
    assert len(np.unique(trace.hash_values)) == 7 * n  # no accidental sharing
    assert trace.session_id.tolist() == list(range(n))  # no request continues another


def test_range_ratio_draws_vllms_integer_interval() -> None:
    n = 20_000
    trace = generate("random", {"num_requests": n, "input_len": 100, "output_len": 20,
                                "range_ratio": 0.5}, seed=6)  # fmt: skip
    inp, out = trace.input_tokens, trace.output_tokens
    assert (inp.min(), inp.max()) == (50, 150) and (out.min(), out.max()) == (10, 30)
    sd = math.sqrt((101**2 - 1) / 12)  # discrete uniform on 101 values
    assert abs(inp.mean() - 100) < 5 * sd / math.sqrt(n)
    # vLLM's bounds: floor(3 * 0.5) = 1 and ceil(3 * 1.5) = 5
    small = generate("random", {"num_requests": 2000, "input_len": 3, "range_ratio": 0.5}, seed=1)
    assert (small.input_tokens.min(), small.input_tokens.max()) == (1, 5)


def test_explicit_distributions() -> None:
    n = 40_000
    logn = generate("random", {"num_requests": n, "input_len": {"distribution": "lognormal", "median": 200, "sigma": 1.0},
                               "output_len": {"distribution": "normal", "mean": 500, "std": 50}}, seed=8)  # fmt: skip
    below = np.mean(logn.input_tokens <= 200)
    # rint(200 e^z) <= 200 iff z < ln(200.5 / 200) = 0.0025: probability 0.501
    assert abs(below - 0.501) < 5 * math.sqrt(0.25 / n)
    assert abs(np.log(logn.input_tokens).std() - 1.0) < 5 * math.sqrt(2 / (4 * n)) + 0.01
    assert abs(logn.output_tokens.mean() - 500) < 5 * 50 / math.sqrt(n)
    capped = generate("random", {"num_requests": 1000, "input_len": {"distribution": "lognormal", "median": 200,
                                 "sigma": 1.0, "min": 50, "max": 300}}, seed=8)  # fmt: skip
    assert capped.input_tokens.min() == 50 and capped.input_tokens.max() == 300
    uni = generate("random", {"num_requests": 3000, "output_len": {"distribution": "uniform", "min": 3, "max": 5}}, seed=1)
    assert sorted(set(uni.output_tokens.tolist())) == [3, 4, 5]
    const = generate("random", {"num_requests": 3, "output_len": {"distribution": "constant", "value": 9}}, seed=1)
    assert const.output_tokens.tolist() == [9, 9, 9]


def test_prefix_blocks_are_shared_and_nothing_else() -> None:
    # prefix 40 tokens = 2 whole blocks + 8 tokens; with input 30 a prompt is 70 tokens,
    # ceil(70/16) = 5 ids: the first 2 shared by every request, the other 3 its own
    n = 200
    trace = generate("random", {"num_requests": n, "input_len": 30, "prefix_len": 40}, seed=0)
    assert trace.input_tokens.tolist() == [70] * n
    ids = [trace.hash_ids(i).tolist() for i in range(n)]
    assert all(row[:2] == [0, 1] for row in ids)
    assert len({x for row in ids for x in row[2:]}) == 3 * n


@pytest.mark.parametrize("prefix_len", [160, 170])
def test_prefix_hit_ratio_on_one_instance(prefix_len: int) -> None:
    # 10 requests 1 s apart (constant gaps), each done long before the next: request 0
    # computes everything, requests 1-9 find the prefix's 10 whole blocks cached (160
    # tokens: with prefix 170 the 11th block mixes prefix and own tokens, so it is not
    # shared). Prompts are prefix_len + 40 tokens, so the hit ratio is 9 * 160 / (10 * prompt):
    # 0.72 for prefix 160, 0.6857 for 170.
    prompt = prefix_len + 40
    trace = generate("random", {"num_requests": 10, "input_len": 40, "output_len": 2, "prefix_len": prefix_len,
                                "rate": 1.0, "burstiness": "inf"}, seed=0)  # fmt: skip
    results = simulate(trace, cluster={"num_instances": 1, "profile": dict(LINEAR), "num_gpu_blocks": 1000})
    assert results.requests["cached_tokens"].tolist() == [0] + [160] * 9
    assert results.summary["prefix_hit_ratio_first_admission"] == pytest.approx(9 * 160 / (10 * prompt))


def test_deterministic_per_seed() -> None:
    params = {"num_requests": 500, "input_len": {"distribution": "lognormal", "median": 300, "sigma": 0.8},
              "range_ratio": 0.0, "rate": 3.0, "burstiness": 0.5, "prefix_len": 50}  # fmt: skip
    a, b, c = (generate("random", params, seed=s) for s in (1, 1, 2))
    for col in ("arrival_s", "input_tokens", "output_tokens", "hash_values", "hash_offsets"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
    assert not np.array_equal(a.input_tokens, c.input_tokens)


@pytest.mark.parametrize(("params", "message"), [
    ({"rate": 0}, "rate must be > 0"),
    ({"burstiness": -1}, "burstiness must be > 0"),
    ({"range_ratio": 1.0}, r"range_ratio must be in \[0, 1\)"),
    ({"prefix_len": -3}, "prefix_len must be a whole number >= 0"),
    ({"num_requests": 5, "duration_s": 5}, "only one of num_requests and duration_s"),
    ({"duration_s": 10, "rate": "inf"}, "give num_requests, not duration_s"),
    ({"input_len": {"distribution": "zipf"}}, "input_len.distribution must be one of"),
    ({"input_len": {"distribution": "lognormal", "median": 5}}, r"needs 'sigma'"),
    ({"input_len": {"distribution": "uniform", "min": 5, "max": 2}}, "min <= max"),
    ({"input_len": {"distribution": "normal", "mean": 5, "std": 1, "mode": 3}}, "has no field 'mode'"),
    ({"input_len": {"distribution": "constant", "value": 5}, "range_ratio": 0.2}, "range_ratio applies to a fixed"),
    ({"input_len": "long"}, "input_len must be a token count"),
])  # fmt: skip
def test_bad_params_are_one_line(params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        generate("random", params, seed=0)
