"""The router's metrics path as one setting (`router.view.metrics_path`)."""

from __future__ import annotations

import pytest

from conftest import make_config, make_trace, simulate
from lmsim.engine.views import METRICS_PATHS, ViewAdapter
from lmsim.errors import ConfigError


@pytest.mark.parametrize(
    ("path", "load_view", "interval"),
    [("llm-d", "scraped", 0.05), ("vllm-production-stack", "scraped", 30.0), ("dynamo", "exact", 0.1),
     ("sglang", "exact", 0.1), ("exact", "exact", 0.1), (0.25, "scraped", 0.25), (0, "exact", 0.1)],
)
def test_family_defaults(path, load_view, interval):
    adapter = ViewAdapter(metrics_path=path)
    assert (adapter.load_view, adapter.scrape_interval_s) == (load_view, interval)


def test_metrics_path_excludes_the_explicit_settings():
    with pytest.raises(ValueError, match="give one or the other"):
        ViewAdapter(metrics_path="llm-d", scrape_interval_s=1.0)
    with pytest.raises(ValueError, match=r"must be seconds or one of exact\|llm-d"):
        ViewAdapter(metrics_path="envoy")
    assert set(METRICS_PATHS) >= {"llm-d", "dynamo", "sglang", "vllm-production-stack"}


def test_a_stale_load_view_changes_the_decision():
    """Two instances, least-requests routing (`vllm`'s JSQ on the waiting + running count).
    Requests at 0.00 and 0.01 (each 200 prefill tokens: 0.21 s on the linear profile, still
    running at 0.01). Exact: the second sees instance 0 busy and goes to 1. With a 30 s
    refresh (vLLM production stack) the router still holds the snapshot taken at the first
    request (both idle), so the tie breaks to instance 0 again."""
    trace = make_trace([0.0, 0.01], [200, 200], [2, 2])
    cluster = {"num_instances": 2}
    exact = simulate(trace, cluster=cluster, router={"policy": "vllm"})
    stale = simulate(trace, cluster=cluster, router={"policy": "vllm", "view": {"metrics_path": "vllm-production-stack"}})
    assert exact.requests["instance_id"].tolist() == [0, 1]
    assert stale.requests["instance_id"].tolist() == [0, 0]


def test_bad_metrics_path_in_a_config_is_one_line():
    from lmsim.study.compose import build_simulation

    config = make_config(router={"policy": "vllm", "view": {"metrics_path": -1}})
    with pytest.raises(ConfigError, match=r"router\.view: param 'metrics_path'"):
        build_simulation(config, make_trace([0.0], [10], [2]))
