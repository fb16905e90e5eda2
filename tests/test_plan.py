"""`lmsim plan` (issue 37): the hand-computed answer, probe reuse and resume, screening,
ties, an infeasible space and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import make_trace
from lmsim.cli import main
from lmsim.plan import run_plan
from lmsim.plan.probe import PROBES_FILE

LINEAR = {"kind": "linear", "step_base_s": 0.02, "per_prefill_token_s": 0.0001}
N = 300
GAP_S = 0.03


def _plan_file(tmp_path: Path, plan: dict, *, requests: int = N) -> Path:
    """Deterministic arrivals every 30 ms (33.3 req/s), 800-token prompts, one output token each,
    no shared prefixes; at most one prompt per step (max_num_batched_tokens 800)."""
    trace = tmp_path / "det.parquet"
    if not trace.exists():
        make_trace([GAP_S * k for k in range(requests)], [800] * requests, [1] * requests).save(trace)
    raw = {
        "name": "hand",
        "workload": {"trace": str(trace)},
        "cluster": {"num_gpu_blocks": 4096, "max_num_batched_tokens": 800, "enable_prefix_caching": False},
        "plan": {
            "objective": "gpus", "budget_gpus": 16,
            "gpus": [{"name": "lin", "profile": LINEAR}],
            "routers": [{"policy": "round_robin"}],
            "search": {"seeds": [0]},
            **plan,
        },
    }  # fmt: skip
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_hand_built_linear_case_gives_the_computed_count(tmp_path):
    """A request alone takes one step of 0.02 + 800 x 0.0001 = 0.1 s and, with one output
    token, finishes in it (TTFT = 0.1 s). Round robin over n instances gives each instance a
    request every n x 30 ms and, at most one prompt per step, each is a D/D/1 queue: with
    n x 0.03 >= 0.1 (n >= 4) every TTFT is 0.1 s; below, the k-th request of an instance waits
    k x (0.1 - 0.03 n) more. n = 3: 100 requests per instance, TTFTs 0.1 + 0.01 k (k = 0..99, three
    requests each); the median of the 300 sits at (300 - 1) / 2 = rank 149.5, between k = 49
    and k = 50: (0.59 + 0.60) / 2 = 0.595 s. n = 2: ranks 149/150 are k = 74, 75 of 0.1 + 0.04 k:
    3.08 s. So a P50 TTFT bound of 0.6 s needs 3 instances; 0.59 s needs 4."""
    result = run_plan(_plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.6}}), log=None)
    row = result.row(result.winner)
    assert (result.winner, row["instances"]) == ("lin colocated round_robin", 3)
    assert row["values"]["ttft_p50_s"] == pytest.approx(0.595, abs=1e-9)
    tighter = run_plan(_plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.59}}), log=None)
    assert tighter.row(tighter.winner)["instances"] == 4
    assert tighter.row(tighter.winner)["values"]["ttft_p50_s"] == pytest.approx(0.1, abs=1e-9)


def test_probes_are_reused_and_a_rerun_resumes_without_simulating(tmp_path):
    """Doubling from 1: 1 fails, 2 fails, 4 meets; bisection: 3 meets. Four probes, each run
    once; the rerun reads all four back and simulates nothing. A second design that differs
    only in a label-free way (the same router twice under two labels) runs the same
    experiments: its probes are read back too."""
    path = _plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.6}})
    out = tmp_path / "out"
    first = run_plan(path, out=out, log=None)
    assert (first.stats["probes_run"], first.stats["probes_reused"]) == (4, 0)
    assert len((out / PROBES_FILE).read_text().splitlines()) == 4
    again = run_plan(path, out=out, log=None)
    assert (again.stats["probes_run"], again.stats["probes_reused"]) == (0, 4)
    assert again.winner == first.winner
    for name in ("plan.txt", "plan.json", "pareto.png", "winner.yaml"):
        assert (out / name).exists()
    winner = yaml.safe_load((out / "winner.yaml").read_text())
    assert winner["cluster"]["num_instances"] == 3 and winner["router"]["policy"] == "round_robin"


def test_interrupted_plan_resumes_from_saved_probes(tmp_path):
    """A plan stopped after its second probe (the probe store raising as the third comes in)
    keeps the two probes on disk; the rerun runs only the other two."""
    from lmsim.plan import probe as probe_module

    path = _plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.6}})
    out = tmp_path / "out"
    original = probe_module.ProbeStore.add
    calls = []

    def add_then_stop(self, entry):
        calls.append(entry["key"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        original(self, entry)

    probe_module.ProbeStore.add = add_then_stop
    try:
        with pytest.raises(KeyboardInterrupt):
            run_plan(path, out=out, log=None)
    finally:
        probe_module.ProbeStore.add = original
    assert len((out / PROBES_FILE).read_text().splitlines()) == 2
    resumed = run_plan(path, out=out, log=None)
    assert (resumed.stats["probes_run"], resumed.stats["probes_reused"]) == (2, 2)
    assert resumed.row(resumed.winner)["instances"] == 3


def test_screening_drops_the_slow_design_and_says_why(tmp_path):
    """Two GPUs: `lin` (0.1 s a request) and `slow` (step base 0.06: 0.14 s a request). A P99
    TTFT bound of 0.2 s needs no growing queue: on the first 100 requests, one instance fewer
    than that (lin 3: +0.01 s a request, 33 requests each; slow 4: +0.02 s, 25 each) puts far
    more than 1% of requests over 0.2 s. So ceil(0.1 / 0.03) = 4 `lin` instances and
    ceil(0.14 / 0.03) = 5 `slow` ones; with keep 0.5 the screening keeps `lin` and drops `slow`
    naming 5 GPUs against 4, and only `lin` is searched on all 300 (two probes: 4 and 3)."""
    slow = {**LINEAR, "step_base_s": 0.06}
    result = run_plan(_plan_file(tmp_path, {
        "slo": {"ttft_p99_s": 0.2},
        "gpus": [{"name": "lin", "profile": LINEAR}, {"name": "slow", "profile": slow}],
        "search": {"seeds": [0], "screen_requests": [100], "keep": 0.5},
    }), log=None)  # fmt: skip
    assert result.winner == "lin colocated round_robin"
    assert result.row(result.winner)["instances"] == 4
    assert list(result.screened) == ["slow colocated round_robin"]
    evidence = result.screened["slow colocated round_robin"]
    assert "first 100 requests" in evidence and "needs 5 GPUs" in evidence and "at most 4 GPUs" in evidence
    assert result.stats["screened_out"] == 1 and result.stats["full_length_designs"] == 1
    # the full-length search starts at the slice's answer and tries its neighbour: 4 meets, 3 fails
    assert [(s["name"], s["probes_run"]) for s in result.stats["stages"]][1] == ("full runs", 2)
    # the slice's count held at full length (no queue either way): a ratio of 1
    assert result.stats["screening_calibration"] == {"rung": "screening rung 1 (first 100 requests)", "designs": 1,
                                                     "min": 1.0, "median": 1.0, "max": 1.0}
    assert result.stats["full_runs_saved_estimate"] >= 1


def test_equal_designs_are_reported_as_a_tie(tmp_path):
    """round_robin and least_tokens route this trace identically (every instance idle or
    equally loaded in turn): both need 4 instances, so neither is ranked above the other."""
    result = run_plan(_plan_file(tmp_path, {
        "slo": {"ttft_p99_s": 0.12},
        "routers": [{"policy": "round_robin"}, {"policy": "least_tokens"}],
    }), log=None)  # fmt: skip
    counts = {r["design"]: r["instances"] for r in result.rows}
    assert counts == {"lin colocated round_robin": 4, "lin colocated least_tokens": 4}
    assert len(result.tied) == 1 and {result.winner, *result.tied} == set(counts)


def test_infeasible_space_names_the_constraint_and_by_how_much(tmp_path):
    """A request alone takes 0.1 s, so no count meets a P99 TTFT of 0.05 s: at the budget
    (16 instances, no queue) the P99 is 0.1 s, 100% over the bound."""
    result = run_plan(_plan_file(tmp_path, {"slo": {"ttft_p99_s": 0.05}}), log=None)
    assert result.winner is None
    assert result.infeasible == [
        "ttft_p99_s: at best 0.1 s > 0.05 s, 100% over (lin colocated round_robin, at the GPU budget)"
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slo": {"ttfx_p99_s": 1.0}}, "plan.slo: ttfx_p99_s: unknown SLO metric"),
        ({"slo": {"ttft_p99_s": 1.0}, "objective": "cost"},
         "plan.gpus.0.price_per_hour: GPU 'lin' has no price and the objective is cost"),
        ({"slo": {"ttft_p99_s": 1.0}, "routers": []}, "plan.routers: List should have at least 1 item"),
        ({"slo": {"ttft_p99_s": 1.0}, "routers": [{"policy": "pd"}]},
         "plan: the design space is empty (lin colocated pd: skipped, pd routes P/D pools only)"),
        ({"slo": {"ttft_p99_s": 1.0}, "gpus": [{"name": "lin", "profile": LINEAR, "tp": 4}], "budget_gpus": 2},
         "plan.budget_gpus: 2 GPUs is below one instance of any design (the smallest needs 4)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, change, message):
    path = _plan_file(tmp_path, change)
    assert main(["plan", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_cli_prints_the_table_and_writes_the_plan(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["plan", str(_plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.6}})), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cheapest: lin colocated round_robin: 3 GPUs" in printed
    data = json.loads((out / "plan.json").read_text())
    assert data["winner"] == "lin colocated round_robin"


def test_a_local_pool_finds_the_same_answer_and_the_report_shows_the_plan(tmp_path):
    """Two workers run each round's probes in parallel: the same probes, the same answer; and
    `lmsim report` on the plan folder has the plan's section with its table and figure."""
    from lmsim.viz.report import write_report

    path = _plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.6}})
    result = run_plan(path, out=tmp_path / "out", workers=2, log=None)
    assert result.row(result.winner)["instances"] == 3 and result.stats["probes_run"] == 4
    page = write_report(tmp_path / "out", tmp_path / "report.html").read_text()
    assert "capacity plan (lmsim plan)" in page and "cheapest: lin colocated round_robin: 3 GPUs" in page
    assert "data:image/png;base64" in page


def test_designs_become_the_experiments_they_name():
    """`pd 1:2` at n instances: round(n / 3) prefill (at least 1, leaving at least 1 decode);
    n = 2 -> 1 + 1, 3 -> 1 + 2, 7 -> 2 + 5. A colocated router on P/D pools routes both sides
    under `pd`; a host tier becomes cluster.kv_tiers.host.capacity_gb. Each is a valid experiment."""
    from lmsim.config import validate
    from lmsim.plan.config import GpuOption, RouterOption
    from lmsim.plan.design import Design

    gpu = GpuOption(name="h100", profile="h100/qwen3-30b-a3b", price_per_hour=2.0)
    design = Design(gpu, "pd 1:2", 64.0, RouterOption(policy="lmetric"))
    assert [design.split(n) for n in (2, 3, 7)] == [(1, 1), (1, 2), (2, 5)]
    base = {"workload": {"generator": {"name": "chatbot", "params": {"num_requests": 10}}, "rate": 5},
            "cluster": {"num_instances": 4}}  # fmt: skip
    raw = design.experiment(base, 7)
    config = validate(raw, where="test")
    assert [(p.role, p.num_instances) for p in config.cluster.pools] == [("prefill", 2), ("decode", 5)]
    assert (config.router.policy, config.router.params) == ("pd", {"prefill_policy": "lmetric", "decode_policy": "lmetric"})
    assert config.cluster.kv_tiers.host.capacity_gb == 64.0
    assert (design.gpus(7), design.cost_per_hour(7)) == (7, 14.0)
    colocated = validate(Design(gpu, "colocated", None, RouterOption(policy="vllm")).experiment(base, 3), where="t")
    assert (colocated.cluster.num_instances, colocated.cluster.pools, colocated.router.policy) == (3, None, "vllm")


def test_pd_pools_of_a_polynomial_profile_price_by_their_role():
    """Dynamo's mocker prices a prefill worker's pass with no decode part and a decode
    worker's with no prefill (lmsim/profile/polynomial.py): a P/D design on the `polynomial`
    profile gives each pool `worker_type` = its role; colocated keeps the aggregated one."""
    from lmsim.config import validate
    from lmsim.plan.config import GpuOption, RouterOption
    from lmsim.plan.design import Design

    gpu = GpuOption(name="poly", profile={"kind": "polynomial", "kv_bytes_per_token": 98304}, price_per_hour=1.0)
    base = {"workload": {"generator": {"name": "chatbot", "params": {"num_requests": 10}}, "rate": 5},
            "cluster": {"num_gpu_blocks": 1000}}  # fmt: skip
    config = validate(Design(gpu, "pd 1:3", None, RouterOption(policy="round_robin")).experiment(base, 4), where="t")
    assert [(p.role, p.num_instances, p.profile["worker_type"]) for p in config.cluster.pools] == [
        ("prefill", 1, "prefill"), ("decode", 3, "decode")]
    colocated = validate(Design(gpu, "colocated", None, RouterOption(policy="round_robin")).experiment(base, 4), where="t")
    assert "worker_type" not in colocated.cluster.profile


@pytest.mark.parametrize(
    ("start", "informed", "answer", "sequence"),
    [
        (1, False, 11, [1, 2, 4, 8, 16, 12, 10, 11]),  # blind: double to 16, bisect (8, 16]
        (9, True, 11, [9, 10, 12, 11]),  # informed: gallop 9, 10, 12, then bisect (10, 12]
        (14, True, 11, [14, 13, 11, 7, 9, 10]),  # from above: 14, 13, 11 meet; 7 fails; bisect (7, 11]
        (11, True, 11, [11, 10]),  # the earlier answer holds: two probes
        (4, True, None, [4, 5, 7, 11, 19, 20]),  # nothing meets within the cap of 20
    ],
)
def test_count_search_probe_sequence(start, informed, answer, sequence):
    """A design that meets the SLO from `answer` instances on (none: never) within a cap of 20."""
    from lmsim.plan.search import CountSearch

    search = CountSearch(None, 1, 20, start, informed=informed)  # type: ignore[arg-type]
    seen = []
    while (n := search.next_count()) is not None:
        seen.append(n)
        search.record(n, {"met": answer is not None and n >= answer})
    assert (seen, search.answer) == (sequence, answer)


def test_running_a_plan_file_as_an_experiment_points_to_lmsim_plan(tmp_path, capsys):
    path = _plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.6}})
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 2
    assert f"plan: this is a plan file; run it with `lmsim plan {path}`" in capsys.readouterr().err


def test_a_gpu_without_a_price_takes_the_shipped_one(tmp_path, monkeypatch):
    """With lmsim.shipped.gpu_price_per_hour (the `traffic` helper's price table) a GPU priced
    nowhere in the plan takes the shipped price: 3 instances x $2.50 = $7.50/h."""
    import lmsim.shipped

    monkeypatch.setattr(lmsim.shipped, "gpu_price_per_hour", lambda gpu: {"lin": 2.5}[gpu], raising=False)
    result = run_plan(_plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.6}, "objective": "cost"}), log=None)
    assert result.row(result.winner)["cost_per_hour"] == pytest.approx(7.5)


def test_a_mean_bound_plans_the_hand_computed_count(tmp_path):
    """The case of test_hand_built_linear_case_gives_the_computed_count, bounded by the mean
    (Dynamo's replay_optimize bounds means). n = 3: TTFTs 0.1 + 0.01 k, k = 0..99, three
    requests each: mean 0.1 + 0.01 x 49.5 = 0.595 s. n = 2: 0.1 + 0.04 k, k = 0..149: mean
    0.1 + 0.04 x 74.5 = 3.08 s. So a mean TTFT bound of 0.6 s needs 3 instances, 0.59 s needs 4
    (every TTFT 0.1 s). The n = 2 probe fails early, before the last arrival (8.97 s): by 6 s
    each instance has served ~60 requests (TTFT sum ~0.1 x 60 + 0.04 x 1770 = 77 s) and holds
    ~40 waiting with ages up to 2.4 s (~48 s): ~250 s over both, so the lower bound (known TTFTs + waiting ages)
    / 300 already exceeds 0.59 s (a sum of 177 s). No probe stops early as met."""
    result = run_plan(_plan_file(tmp_path, {"slo": {"ttft_mean_s": 0.6}}), log=None)
    row = result.row(result.winner)
    assert (result.winner, row["instances"]) == ("lin colocated round_robin", 3)
    assert row["values"]["ttft_mean_s"] == pytest.approx(0.595, abs=1e-9)
    tighter = run_plan(_plan_file(tmp_path, {"slo": {"ttft_mean_s": 0.59}}), out=tmp_path / "out", log=None)
    assert tighter.row(tighter.winner)["instances"] == 4
    assert tighter.row(tighter.winner)["values"]["ttft_mean_s"] == pytest.approx(0.1, abs=1e-9)
    probes = [json.loads(line) for line in (tmp_path / "out" / PROBES_FILE).read_text().splitlines()]
    stopped = [p for p in probes if p["early"] == "failed: ttft_mean_s"]
    assert any(p["stopped_at_s"] < GAP_S * (N - 1) for p in stopped)  # n = 2: before the last arrival
    assert not any(p["early"] == "met" for p in probes)  # a mean is never certainly met early


def test_mean_statistics_by_hand():
    """Three finished requests, TTFT 0.1, 0.2, 0.9 s (mean 0.4; the median would be 0.2) and
    TPOT 0.01, none (one output token), 0.03 s: the TPOT mean is over the two that have one,
    0.02 (0.0133 if the one-token request counted as 0). ITL comes from the summary's pooled
    mean. A fourth, rejected request makes the TTFT mean infinite (1e12 / 4 here): a lost
    request fails a mean bound. The early stop's lower bound on a TTFT mean, with one request
    done at 0.1 s, one waiting 3 s for its first token and one not yet arrived (age -1):
    (0.1 + 3 + 0) / 3 = 1.0333 s; on an E2E mean with the first done at 0.5 s, likewise
    (0.5 + 3 + 0) / 3."""
    from types import SimpleNamespace

    import numpy as np
    import pandas as pd

    from lmsim.plan.slo import EarlyStop, measure, parse_bounds

    bounds = parse_bounds({"ttft_mean_s": 1.0, "tpot_mean_s": 1.0, "itl_mean_s": 1.0, "ttft_p50_s": 1.0})
    assert [b.is_mean for b in bounds] == [True, True, True, False]  # sorted: itl, tpot, ttft means, ttft_p50
    requests = pd.DataFrame({"status": ["finished"] * 3, "ttft_s": [0.1, 0.2, 0.9],
                             "tpot_s": [0.01, np.nan, 0.03]})  # fmt: skip
    values = measure(bounds, SimpleNamespace(requests=requests, summary={"itl_s_mean": 0.025}))
    assert values["ttft_mean_s"] == pytest.approx(0.4)
    assert values["ttft_p50_s"] == pytest.approx(0.2)
    assert values["tpot_mean_s"] == pytest.approx(0.02)
    assert values["itl_mean_s"] == 0.025
    lost = pd.concat([requests, pd.DataFrame({"status": ["rejected"], "ttft_s": [np.nan], "tpot_s": [np.nan]})])
    assert measure(bounds, SimpleNamespace(requests=lost, summary={}))["ttft_mean_s"] == pytest.approx(1e12 / 4, rel=1e-6)
    done = np.array([True, False, False])
    age = np.array([5.0, 3.0, -1.0])
    assert EarlyStop._mean_floor("ttft", np.array([0.1, np.nan, np.nan]), done, age) == pytest.approx(3.1 / 3)
    assert EarlyStop._mean_floor("e2e", np.array([0.5, np.nan, np.nan]), done, age) == pytest.approx(3.5 / 3)
