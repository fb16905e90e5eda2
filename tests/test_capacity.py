"""Capacity search: terminates, brackets a sustainable rate, and scales with cluster size."""

from __future__ import annotations

import numpy as np

from conftest import make_config, make_trace
from lmsim.study.capacity import CapacitySearch, find_capacity, is_sustainable
from lmsim.workload.scaling import scale_to_rate


def poisson_trace(n: int = 600, seed: int = 1):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0, n)).tolist()
    return make_trace(arrivals, [200] * n, [20] * n)


SEARCH = CapacitySearch(probe_requests=600, rel_tol=0.05)


def config(instances: int):
    return make_config(cluster={"num_instances": instances, "num_gpu_blocks": 4000},
                       simulation={"check": False})


def test_capacity_is_sustainable_and_a_bit_more_is_not():
    trace = poisson_trace()
    rate, probes = find_capacity(trace, config(2), SEARCH, use_cache=False)
    assert len(probes) <= SEARCH.max_probes
    assert any(not p.sustainable for p in probes)
    assert is_sustainable(scale_to_rate(trace, rate), config(2), SEARCH)[0]
    assert not is_sustainable(scale_to_rate(trace, rate * 1.5), config(2), SEARCH)[0]


def test_capacity_is_monotone_in_cluster_size():
    trace = poisson_trace()
    small, _ = find_capacity(trace, config(8), SEARCH, use_cache=False)
    large, _ = find_capacity(trace, config(16), SEARCH, use_cache=False)
    assert small < large
    # A 200-token prompt costs 0.2 s of prefill on the linear profile, so one instance
    # serves at most 5 requests/s. A short probe (600 requests) cannot see an overload of a
    # few percent build up, so the search may overshoot that bound a little, not more.
    assert 0.8 * 16 * 5.0 < large < 1.2 * 16 * 5.0
    assert 0.8 * 8 * 5.0 < small < 1.2 * 8 * 5.0


def test_capacity_policy_is_replayed_and_keys_the_cache():
    from lmsim.study.capacity import cache_key, probe_config, trace_identity

    base = config(2)
    other = make_config(cluster={"num_instances": 2, "num_gpu_blocks": 4000},
                        simulation={"check": False}, capacity={"policy": "lmetric"})
    assert probe_config(base).router.policy == "vllm"
    assert probe_config(other).router.policy == "lmetric"
    trace = trace_identity(poisson_trace(n=64))
    # The default keeps the keys every shipped capacity was stored under.
    assert cache_key(trace, base, SEARCH) == cache_key(trace, make_config(
        cluster={"num_instances": 2, "num_gpu_blocks": 4000}, simulation={"check": False},
        capacity={"policy": "vllm"}), SEARCH)
    assert cache_key(trace, base, SEARCH) != cache_key(trace, other, SEARCH)


def test_generated_block_caching_keys_the_cache_only_when_off():
    from lmsim.study.capacity import cache_key, key_payload, trace_identity

    trace = trace_identity(poisson_trace(n=64))
    on = config(2)
    off = make_config(cluster={"num_instances": 2, "num_gpu_blocks": 4000, "cache_generated_blocks": False},
                      simulation={"check": False})
    # The default (on) is left out of the key, as before the field existed, so shipped
    # capacities are still found; off is a different cluster.
    assert "cache_generated_blocks" not in key_payload(trace, on, SEARCH)["cluster"]
    assert key_payload(trace, off, SEARCH)["cluster"]["cache_generated_blocks"] is False
    assert cache_key(trace, on, SEARCH) != cache_key(trace, off, SEARCH)
