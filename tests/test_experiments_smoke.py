"""Every experiment YAML under experiments/ validates (all sweep points) and runs with
`workload.limit=50`. To stay fast, each sweep runs a covering subset of its points:
every swept value of every key appears in at least one run. The limit is forced on each
expanded point, since a sweep may set `workload.limit` per point (the paper YAMLs size
each trace that way) and a swept value wins over `--set`. Every capacity a `workload.load`
needs must come from the shipped experiments/capacity.json: the user cache is hidden and a
capacity search fails the test, so a fresh clone never searches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lmsim.study import capacity
from lmsim.study.execute import run_point
from lmsim.study.expand import SweepPoint, load_sweep
from lmsim.study.rundir import is_complete

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
YAMLS = sorted(EXPERIMENTS.rglob("*.yaml"))


def covering(points: list[SweepPoint]) -> list[SweepPoint]:
    seen: set[tuple[str, str]] = set()
    chosen = []
    for p in points:
        pairs = {(k, json.dumps(v, sort_keys=True)) for k, v in p.params.items()}
        if not chosen or pairs - seen:
            chosen.append(p)
            seen |= pairs
    return chosen


def test_there_are_paper_experiments() -> None:
    names = {p.stem for p in (EXPERIMENTS / "paper").glob("*.yaml")}
    assert {"fig11", "fig12", "fig15", "fig19", "fig21", "fig22", "fig23", "fig26", "canary"} <= names


@pytest.fixture
def shipped_capacities_only(monkeypatch: pytest.MonkeyPatch) -> None:
    read = capacity._read_cache

    def bundled_only(path: Path | None = None) -> dict:
        return read(path) if path == capacity.BUNDLED_PATH else {}

    def no_search(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(
            "capacity search ran: run `lmsim capacity EXP --bundle` for this workload and cluster"
        )

    monkeypatch.setattr(capacity, "_read_cache", bundled_only)
    monkeypatch.setattr(capacity, "is_sustainable", no_search)


@pytest.mark.usefixtures("shipped_capacities_only")
@pytest.mark.parametrize("path", YAMLS, ids=[str(p.relative_to(EXPERIMENTS)) for p in YAMLS])
def test_experiment_validates_and_runs(path: Path, tmp_path: Path) -> None:
    if "plan" in (yaml.safe_load(path.read_text()) or {}):
        return _plan_validates_and_its_first_design_runs(path, tmp_path)
    raw, points = load_sweep(path, ["workload.limit=50"])  # validates every point
    trace = (raw.get("workload") or {}).get("trace") or ""
    if trace.startswith("../shared/") and not (Path.cwd() / trace).exists():
        pytest.skip(f"{trace} is not here (data for users who have it)")
    for p in covering(points):
        p.raw.setdefault("workload", {})["limit"] = 50
        result = run_point({"name": p.name, "raw": p.raw, "where": str(path),
                            "experiment_dir": str(path.parent), "out": str(tmp_path)})  # fmt: skip
        assert result["ok"], result.get("traceback")
        assert is_complete(tmp_path / p.name)


def _plan_validates_and_its_first_design_runs(path: Path, tmp_path: Path) -> None:
    """A plan file (`lmsim plan`): its plan section and every design check, and the first
    design runs at its smallest count."""
    from lmsim.plan.config import check_designs, load_plan
    from lmsim.plan.design import enumerate_designs

    _base, raw, plan = load_plan(path, ["workload.limit=50"])
    designs, _notes = enumerate_designs(plan)
    check_designs(raw, designs, str(path))
    first = designs[0].experiment(raw, designs[0].min_instances)
    result = run_point({"name": "plan-first-design", "raw": first, "where": str(path),
                        "experiment_dir": str(path.parent), "out": str(tmp_path)})  # fmt: skip
    assert result["ok"], result.get("traceback")
