"""The engine fuzzer (tests/engine_fuzz.py): random small scenarios, each run with
fast-forward and the invariant checker, one step at a time, and with fast-forward again;
the three runs must agree exactly, raise nothing and end every request as they must.

CI runs LMSIM_FUZZ_SCENARIOS scenarios (default 400, spread evenly over the categories)
from seed LMSIM_FUZZ_START (default 0); counts, not wall time, bound it. More on demand:

    LMSIM_FUZZ_SCENARIOS=5000 python -m pytest tests/test_fuzz.py -q
    python -m pytest tests/test_fuzz.py -m slow -q      # 3,000 more, from seed 100,000
    python tests/engine_fuzz.py 5000 --save /tmp/fails  # the same from the command line

A failure names each failing seed and category and how to replay it.
"""

from __future__ import annotations

import json
import os

import pytest
from engine_fuzz import CATEGORIES, evaluate, generate

from lmsim.engine.instance import Instance

SCENARIOS = int(os.environ.get("LMSIM_FUZZ_SCENARIOS", "400"))
START = int(os.environ.get("LMSIM_FUZZ_START", "0"))
# What each category must reach in CI's sample, or it has stopped testing what it is for.
REACHES = {
    "engine": {"rejection"},
    "mixed": {"preemption"},
    "pd": {"kv transfer", "prefilled on decode"},
    "tiers": {"tier load", "disk hit"},
    "pd_tiers": {"kv transfer", "tier load"},
    "mixed_tiers": {"tier load"},
    "async_pd": {"kv transfer", "preemption"},
    "preempt": {"preemption", "eviction"},
    "closed": {"not arrived"},
    "cut": {"unfinished"},
}


def fuzz(category: str, seeds: range) -> set[str]:
    """Run the seeds of one category; fail listing every scenario with findings. Returns
    the engine paths the runs went through."""
    failures = []
    covered: set[str] = set()
    for seed in seeds:
        verdict = evaluate(generate(seed, category))
        covered |= verdict.covered
        if verdict.findings:
            found = "; ".join(f"{kind}: {detail[:300]}" for kind, detail in verdict.findings)
            failures.append(f"seed {seed}: {found}")
    assert not failures, (
        f"{len(failures)} of {len(seeds)} {category} scenarios failed "
        f"(replay: python tests/engine_fuzz.py 1 --start SEED --category {category}):\n" + "\n".join(failures)
    )
    return covered


@pytest.mark.parametrize("category", list(CATEGORIES))
def test_fuzzed_scenarios_agree_hold_their_invariants_and_end(category: str) -> None:
    per_category = -(-SCENARIOS // len(CATEGORIES))
    covered = fuzz(category, range(START, START + per_category))
    if per_category >= 40:
        assert REACHES[category] <= covered, f"{category} never reached {REACHES[category] - covered}"


@pytest.mark.slow
@pytest.mark.parametrize("category", list(CATEGORIES))
def test_thousands_of_fuzzed_scenarios(category: str) -> None:
    fuzz(category, range(100_000, 100_000 + 3000 // len(CATEGORIES)))


def test_every_category_has_its_reach_listed_and_every_dimension_is_used() -> None:
    from engine_fuzz import DIMENSIONS

    assert set(REACHES) == set(CATEGORIES)
    assert {name for dims in CATEGORIES.values() for name in dims} == set(DIMENSIONS)


def test_a_scenario_is_a_pure_function_of_its_seed_and_survives_json() -> None:
    for category in CATEGORIES:
        scenario = generate(7, category)
        assert scenario == generate(7, category)
        assert json.loads(json.dumps(scenario)) == scenario
        assert scenario["category"] == category
    assert generate(7, "pd") != generate(8, "pd")
    assert [generate(seed)["category"] for seed in range(len(CATEGORIES))] == list(CATEGORIES)


def test_the_fuzzer_reports_a_fast_forward_that_loses_the_steps_a_cut_ended(monkeypatch) -> None:
    """Defect 4 of issue 39 planted again: a cut run forgets the ended steps of a run in
    flight. The fuzzer's cut scenarios find it (as the fix's regression test,
    tests/test_fuzz_findings.py, does by hand)."""
    monkeypatch.setattr(Instance, "record_ended_steps", lambda self: None)
    found = [evaluate(generate(seed, "cut")).findings for seed in range(20)]
    assert any(kind == "fast-forward differs from stepping" and detail.startswith("summary ")
               for findings in found for kind, detail in findings)


def test_the_fuzzer_reports_an_invariant_failure_of_the_checked_run(monkeypatch) -> None:
    """A TTFT floor above any possible TTFT fails every request's first token in run A."""
    monkeypatch.setattr("lmsim.engine.invariants.least_prefill_time", lambda *a: 1e9)
    findings = evaluate(generate(0, "engine")).findings
    assert findings and findings[0][0] == "checked run"
    assert "below its idle prefill time" in findings[0][1]
