"""`lmsim plot` draws every figure kind from saved results only (lmsim/viz/figures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sweep import run_cli, tiny_experiment, write_experiment

from lmsim.study.execute import run_sweep
from lmsim.viz.figures import PlotError, SweepData, make_figures, supported_kinds


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two rates × four policy settings: rate and cdf plots; llmd logs predictions (error
    plot); two alarm thresholds of lmetric_hotspot (param plot);
    lmetric_hotspot on the hotspot workload with a low alarm threshold (hotspot plot)."""
    root = tmp_path_factory.mktemp("fig")
    raw = tiny_experiment(
        sweep={
            "router.policy": ["vllm", "llmd", "lmetric_hotspot", "lmetric_hotspot"],
            "router.params.min_window_requests": [None, None, 2, 4],
            "workload.rate": [2.0, 4.0],
        },
        zip=[["router.policy", "router.params.min_window_requests"]],
    )
    raw["workload"]["generator"] = {
        "name": "hotspot",
        "params": {"duration_s": 150, "rate": 1.0, "burst_start_min": 1.0, "burst_duration_s": 40,
                   "burst_rate": 2.0, "burst_prefix_tokens": 2000, "max_output_tokens": 200},
    }  # fmt: skip
    exp = write_experiment(root / "exp.yaml", raw)
    assert run_sweep(exp, out=root / "sweep", jobs=2, progress=False).exit_code == 0
    return root / "sweep"


def _mtimes(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if "figures" not in p.parts}


def test_plot_writes_every_kind_without_running(tiny_sweep: Path, tmp_path: Path) -> None:
    before = _mtimes(tiny_sweep)
    data = SweepData(tiny_sweep)
    assert supported_kinds(data) == ["cdf", "rate", "param", "error", "hotspot"]
    written = make_figures(tiny_sweep, formats=("png", "svg"), out=tmp_path / "figs")
    assert sorted(p.name for p in written) == sorted(
        f"{k}.{f}" for k in ("cdf", "rate", "param", "error", "hotspot") for f in ("png", "svg")
    )
    assert all(p.stat().st_size > 1000 for p in written)
    assert _mtimes(tiny_sweep) == before  # only read: no run directory touched


def test_plot_cli_default_dir_and_pdf(tiny_sweep: Path) -> None:
    proc = run_cli("plot", str(tiny_sweep), "--kind", "cdf,error", "--format", "pdf")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tiny_sweep / "figures" / "cdf.pdf"), str(tiny_sweep / "figures" / "error.pdf")]


def test_single_run_directory_plots_cdf(tiny_sweep: Path, tmp_path: Path) -> None:
    run = tiny_sweep / "router.policy=vllm,workload.rate=2.0"
    assert supported_kinds(SweepData(run)) == ["cdf"]
    assert [p.name for p in make_figures(run, out=tmp_path)] == ["cdf.png", "cdf.svg", "cdf.pdf"]


def test_unsupported_kind_is_one_line_error(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"router.policy": ["vllm", "lmetric"]}))
    run_sweep(exp, out=tmp_path / "s", progress=False)
    with pytest.raises(PlotError, match="a rate plot needs a sweep over the arrival rate"):
        make_figures(tmp_path / "s", ["rate"])
    for kind, message in [
        ("rate", "a rate plot needs a sweep over the arrival rate"),
        ("error", "no run logged predicted TTFTs"),
        ("hotspot", "no run used lmetric_hotspot"),
        ("param", "a parameter plot needs a numeric swept key"),
        ("bogus", "unknown plot kind 'bogus'"),
    ]:
        proc = run_cli("plot", str(tmp_path / "s"), "--kind", kind)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "s" / "figures").exists()
