"""`lmsim bench` bookkeeping (never its timings): the profile groups time by component."""

from __future__ import annotations

from lmsim.study.bench import _category, format_row


def test_profile_categories_follow_the_package_layout():
    assert _category("/x/lmsim/engine/kv_cache.py") == "kv cache"
    assert _category("/x/lmsim/engine/router.py") == "router"
    assert _category("/x/lmsim/policies/linear.py") == "router"
    assert _category("/x/lmsim/engine/scheduler.py") == "scheduler"
    assert _category("/x/lmsim/engine/simulation.py") == "replay"
    assert _category("/x/site-packages/simpy/core.py") == "simpy"
    assert _category("~") == "other (numpy, builtins)"


def test_a_row_shows_cpu_throughput_beside_wall_throughput():
    row = {
        "workload": "chatbot", "policy": "lmetric", "num_requests": 100, "requests_per_s": 50.0,
        "requests_per_cpu_s": 200.0, "sim_s_per_wall_s": 3.0, "steps": 10, "events": 5,
        "peak_rss_mb": 100.0, "router_us_per_decision": 4.0,
    }
    cells = format_row(row).split()
    assert cells[:6] == ["chatbot", "lmetric", "100", "50", "200", "3.0"]


def test_bench_workloads_never_search_a_capacity(tmp_path, monkeypatch):
    """Issue 24: `bench --quick` ran a silent 57 s capacity search before 3 s of simulation.
    Its workloads are bundled experiments (experiments/bench/) whose capacities ship; with
    an empty user cache every one is found, shipped."""
    from lmsim.config import validate
    from lmsim.study.bench import workloads
    from lmsim.study.capacity import CapacitySearch, cache_key, lookup_capacity
    from lmsim.study.experiment import capacity_seed_config, workload_identity

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for quick in (True, False):
        rows = workloads(quick)
        assert [f"{w.name}/{w.policy}" for w in rows][:3] == ["chatbot/vllm", "chatbot/lmetric", "chatbot/llmd"]
        for w in rows:
            config = validate(w.raw, where="bench")
            key = cache_key(workload_identity(capacity_seed_config(config)), config, CapacitySearch())
            found = lookup_capacity(key)
            assert found is not None and found.source == "shipped", (quick, w.name, w.policy)
