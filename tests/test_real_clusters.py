"""benchmarks/real_clusters/harness.py: the metrics every real-cluster case reports (issue 33
item 5), checked on numbers small enough to compute by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import load_script

FOLDER = Path(__file__).resolve().parents[1] / "benchmarks" / "real_clusters"


def _load(name: str):
    return load_script(FOLDER / f"{name}.py")


@pytest.fixture(scope="module")
def harness():
    return _load("harness")


def test_kendall_tau_b_counts_a_tie_in_one_side_in_its_denominator(harness):
    """a = 1, 2, 3, 4 and b = 1, 3, 2, 2: of the 6 pairs, (0,1) (0,2) (0,3) agree (C = 3),
    (1,2) (1,3) disagree (D = 2), (2,3) is tied in b only (n2 = 1, n1 = 0):
    tau_b = (3 - 2) / sqrt((6 - 0)(6 - 1)) = 1 / sqrt(30) = 0.18257."""
    assert harness.kendall_tau([1, 2, 3, 4], [1, 3, 2, 2]) == pytest.approx(1 / math.sqrt(30))
    assert harness.kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert harness.kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert math.isnan(harness.kendall_tau([1, 2], [5, 5]))  # no ranking on one side


def test_saturation_is_the_first_stage_past_three_times_the_first_ttft_or_short_of_offered(harness):
    """TTFT 1, 2, 2.9, 3.1, 10 s: 3 x 1 = 3 s is first exceeded at index 3 (2.9 is not).
    With offered 10..50 and throughput 10, 19, 26: 26 < 0.9 x 30 = 27 at index 2 comes first
    (19 >= 0.9 x 20 = 18 is not short). Never: None."""
    ttft = [1, 2, 2.9, 3.1, 10]
    assert harness.saturation_stage(ttft) == 3
    assert harness.saturation_stage(ttft, [10, 19, 26, 40, 50], [10, 20, 30, 40, 50]) == 2
    assert harness.saturation_stage([1, 1.5, 2.9]) is None


def test_compare_gives_ratios_ranking_best_router_and_saturation(harness):
    """Two routers, stages 1 and 2. Real TTFT: x 1, 4 (saturated at stage 2: 4 > 3 x 1),
    y 2, 2.5; sim TTFT: x 1.2, 2, y 1.8, 5. Real throughput: x 10, 20; y 8, 16; sim x 11, 17;
    y 9, 18.
    Stage 1: TTFT x < y both sides: tau 1, best x = x; throughput x > y both sides: tau 1.
    Stage 2: TTFT real x 4 > y 2.5, sim x 2 < y 5: tau -1, best y vs x; throughput real x > y,
    sim x 17 < y 18: tau -1. Saturation: x real 2, sim never (2 < 3.6); y real never, sim 2
    (5 > 5.4? no: never) -> both within one stage. Ratios: x TTFT 1.2/1 = 1.2 (unsaturated),
    x stage-2 TTFT 2/4 = 0.5 (saturated on the real side, left out of the TTFT bar);
    throughput within 15%: 11/10, 17/20 = 0.85, 9/8 = 1.125, 18/16 = 1.125 -> all 4.
    Unsaturated TTFT within 30%: 1.2, 0.9 (y 1.8/2), 2.0 (y 5/2.5) -> 2 of 3."""
    real = harness.long_table([
        (1, "x", "ttft", 1.0), (2, "x", "ttft", 4.0), (1, "y", "ttft", 2.0), (2, "y", "ttft", 2.5),
        (1, "x", "throughput", 10.0), (2, "x", "throughput", 20.0),
        (1, "y", "throughput", 8.0), (2, "y", "throughput", 16.0)])
    sim = harness.long_table([
        (1, "x", "ttft", 1.2), (2, "x", "ttft", 2.0), (1, "y", "ttft", 1.8), (2, "y", "ttft", 5.0),
        (1, "x", "throughput", 11.0), (2, "x", "throughput", 17.0),
        (1, "y", "throughput", 9.0), (2, "y", "throughput", 18.0)])
    c = harness.compare("t", real, sim, [1, 2])
    assert c.per_stage.tau_ttft.tolist() == [1.0, -1.0]
    assert c.per_stage.tau_tput.tolist() == [1.0, -1.0]
    assert c.per_stage.best_real.tolist() == ["x", "y"] and c.per_stage.best_sim.tolist() == ["x", "x"]
    per_router = c.per_router.set_index("router")
    assert per_router.loc["x", "sat_real"] == "2" and per_router.loc["x", "sat_sim"] == "never"
    assert per_router.loc["y", "sat_real"] == "never" and per_router.loc["y", "sat_sim"] == "never"
    cell = c.cells.set_index(["stage", "router", "metric"])
    assert cell.loc[("1", "x", "ttft"), "ratio"] == pytest.approx(1.2)
    assert not cell.loc[("2", "x", "ttft"), "unsaturated"]
    bars = c.bars()
    assert bars["tau_ttft"] == 0.0 and bars["best_match"] == 0.5 and bars["saturation_ok"] == 1.0
    assert bars["tput_within_15"] == 1.0
    assert bars["ttft_within_30"] == pytest.approx(2 / 3)
    assert bars["pass_tau"] is False and bars["pass_saturation"] is True


def test_the_cases_read_their_published_rows(harness):
    """Each case's transcribed numbers agree with points.csv (the scripts assert it); needs
    ../shared."""
    if harness.shared_dir() is None:
        pytest.skip("../shared/docs/cluster_benchmarks/points.csv not available")
    a2 = _load("a2_llmd_37_capacity")
    real = a2.real_table()
    a2.check_against_points(real)
    assert len(real) == 4 * 9 * 2
    assert len(_load("a3_llmd_64p_cache_load").real_table()) == 4 * 11 * 2
    assert len(_load("a4_llmd_frequent_evictions").real_table()) == 4 * 7 * 2
    a14 = _load("a14_llm_router").real_table()
    assert a14[(a14.stage == "4") & (a14.router == "least-loaded") & (a14.metric == "ttft")].value.item() == 0.066
    b2 = _load("b2_openinfer_rtx5090").real_table()
    assert b2[(b2.stage == "16") & (b2.metric == "throughput")].value.item() == 1690.0


def test_without_ttft_the_best_router_is_the_highest_throughput(harness):
    """One stage, throughput only: real x 10 < y 20, sim x 12 > y 11: best y vs x, tau -1."""
    real = harness.long_table([("inf", "x", "throughput", 10.0), ("inf", "y", "throughput", 20.0)])
    sim = harness.long_table([("inf", "x", "throughput", 12.0), ("inf", "y", "throughput", 11.0)])
    c = harness.compare("t", real, sim, ["inf"])
    assert (c.per_stage.best_real.item(), c.per_stage.best_sim.item()) == ("y", "x")
    assert c.per_stage.tau_tput.item() == -1.0 and c.bars()["best_match"] == 0.0


def test_stage_rows_count_output_tokens_as_the_client_does(harness):
    """inference-perf re-tokenises the output text: on Llama-3.1 it counts 0.982 of the
    generated tokens (the llm-d 64p run's totals: 1,029,882 of 5,460 x 192). One stage of
    two requests with 10 output tokens: throughput scales by the count, TTFT does not."""
    from conftest import make_trace, simulate
    from lmsim.workload.ladder import stage_meta

    trace = make_trace([0.0, 0.5], [10, 10], [10, 10], stage=[0, 0], session_id=[0, 1])
    trace.meta.update(stage_meta([0.0], 1.0, True))
    results = simulate(trace)
    plain = {(r[2]): r[3] for r in harness.stage_rows(results, "x", ["s"])}
    counted = {(r[2]): r[3] for r in harness.stage_rows(results, "x", ["s"], output_count=harness.LLAMA31_OUTPUT_COUNT)}
    assert pytest.approx(1_029_882 / (5_460 * 192), abs=5e-4) == harness.LLAMA31_OUTPUT_COUNT
    assert counted["throughput"] == pytest.approx(0.982 * plain["throughput"])
    assert counted["ttft"] == plain["ttft"]
