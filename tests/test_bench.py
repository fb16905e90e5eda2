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
