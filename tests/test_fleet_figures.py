"""The `fleet` figure kind and the report's `fleet & cost` section (lmsim/viz/fleet.py),
drawn from saved results: a small real run, with a hand-made fleet_events.parquet dropped
into a copy (the engine that writes it is another module's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from test_sweep import tiny_experiment, write_experiment

from lmsim.cli import main
from lmsim.viz.figures import supported_kinds
from lmsim.viz.fleet import plot_fleet
from lmsim.viz.runs import RunSet


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("fleetfig")
    raw = tiny_experiment()
    raw["cluster"] = {"num_instances": 2, "profile": "h20/qwen2-7b"}
    raw["output"]["dir"] = str(tmp / "plain")
    assert main(["run", str(write_experiment(tmp / "exp.yaml", raw)), "--no-figure"]) == 0
    return tmp / "plain"


def with_fleet_events(plain: Path, dest: Path) -> Path:
    """Instance 0 up from 0; instance 1 starts at 5, active at 8, crashes at 12 (a scale
    decision at 5 asked for 2 replicas)."""
    run = dest / "fleet"
    shutil.copytree(plain, run)
    gpu = "NVIDIA H20 96GB"
    pd.DataFrame({
        "time_s": [0.0, 5.0, 5.0, 8.0, 12.0],
        "instance_id": [0, -1, 1, 1, 1],
        "pool": ["default"] * 5,
        "gpu": [gpu, "", gpu, gpu, gpu],
        "gpus": [1, 0, 1, 1, 1],
        "event": ["active", "scale", "start", "active", "crash"],
        "target": pd.array([None, 2, None, None, None], dtype="Int64"),
    }).to_parquet(run / "fleet_events.parquet")  # fmt: skip
    return run


def test_a_plain_run_draws_no_fleet_figure_and_has_no_cost_section(plain_run: Path, tmp_path: Path) -> None:
    assert "fleet" not in supported_kinds(RunSet(plain_run))
    assert main(["report", str(plain_run), "--out", str(tmp_path / "r.html")]) == 0
    assert "fleet &amp; cost" not in (tmp_path / "r.html").read_text()


def test_fleet_figure_marks_scale_and_crash_and_counts_replicas(plain_run: Path, tmp_path: Path) -> None:
    """Active replicas: 1 from 0, 2 at 8, 1 at 12 (crash); provisioned: 1, 2 at 5, 1 at 12.
    Vertical lines: the scale decision at 5 and the crash at 12, in each of the 3 panels."""
    run = with_fleet_events(plain_run, tmp_path)
    data = RunSet(run)
    assert "fleet" in supported_kinds(data)
    fig = plot_fleet(data)
    top = fig.axes[0]
    active, provisioned = top.lines[0], top.lines[1]
    assert list(active.get_xdata()[:4]) == [0.0, 5.0, 8.0, 12.0] == list(provisioned.get_xdata()[:4])
    assert list(active.get_ydata()[:4]) == [1, 1, 2, 1]
    assert list(provisioned.get_ydata()[:4]) == [1, 2, 2, 1]
    vertical = [tuple(np.unique(line.get_xdata())) for ax in fig.axes[:3] for line in ax.lines
                if len(line.get_xdata()) == 2 and len(np.unique(line.get_xdata())) == 1]  # fmt: skip
    assert sorted(vertical) == [(5.0,)] * 3 + [(12.0,)] * 3
    assert [t.get_text() for t in top.texts] == ["default→2"]
    plt.close(fig)
    assert main(["plot", str(run), "--kind", "fleet", "--format", "png"]) == 0
    assert (run / "figures" / "fleet.png").stat().st_size > 10_000


def test_report_has_a_fleet_and_cost_section(plain_run: Path, tmp_path: Path) -> None:
    """GPU-hours: instance 0 for the run span, instance 1 from 5 to 12 (7 s)."""
    import json

    run = with_fleet_events(plain_run, tmp_path)
    span = json.loads((run / "summary.json").read_text())["sim_time_s"]
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert page.count("fleet &amp; cost") == 1
    assert f"<td>{(span + 7.0) / 3600:.4g}</td>" in page
    assert "soramidjourney.com" in page  # the H20 price's source
    assert "<h3>fleet</h3>" in page


def test_a_run_without_a_price_says_why_in_its_row(tmp_path: Path) -> None:
    raw = tiny_experiment()
    raw["cost"] = {"window_s": 10}
    raw["output"]["dir"] = str(tmp_path / "run")
    assert main(["run", str(write_experiment(tmp_path / "exp.yaml", raw)), "--no-figure"]) == 0
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "runs on GPU" in page and "linear-profile" in page and "which has no shipped price" in page
