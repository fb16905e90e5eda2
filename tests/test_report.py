"""`lmsim report` writes one self-contained HTML page from saved results (lmsim/viz/report.py)."""

from __future__ import annotations

from pathlib import Path

from test_figures import tiny_sweep  # noqa: F401  (the module-scoped fixture)

from lmsim.cli import main
from lmsim.viz.figures import SweepData, supported_kinds


def test_report_embeds_figures_tables_and_configs(tiny_sweep: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    root = tiny_sweep.parent  # a directory of sweep directories
    assert main(["report", str(root), "--out", str(tmp_path / "r.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    kinds = supported_kinds(SweepData(tiny_sweep))
    assert page.count("src='data:image/png;base64,") == len(kinds) == 5
    assert "src='http" not in page and "<link" not in page  # nothing external
    assert page.count("configuration shared by every run") == 1  # the config once ...
    assert page.count("<td>policy=") == 8  # ... and each run's differences as its row label
    assert "TTFT mean ms" in page and "lmetric_hotspot" in page
    assert "lmsim 0.1.0" in page and " · commit " in page and " UTC." in page
    assert not list(tmp_path.glob(".*tmp*"))


def test_report_without_sweeps_fails(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "no sweep.parquet or run here or in a subdirectory" in capsys.readouterr().err


def test_report_embeds_figures_plot_drew_after_the_results_bytes_equal(tiny_sweep: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """A sweep whose PNGs `lmsim plot` drew after its last results gives the same page as
    one the report draws itself, without drawing; stale or missing PNGs are redrawn."""
    import os
    import re
    import shutil

    from lmsim.viz import report

    sweep = tmp_path / "s" / tiny_sweep.name
    shutil.copytree(tiny_sweep, sweep)
    shutil.rmtree(sweep / "figures", ignore_errors=True)
    drawn: list[list[str]] = []
    real = report.make_figures
    monkeypatch.setattr(report, "make_figures", lambda *a, **k: drawn.append(list(a[1])) or real(*a, **k))

    def page(name: str) -> str:
        assert main(["report", str(sweep), "--out", str(tmp_path / name)]) == 0
        return re.sub(r"<p class='meta'>.*?</p>", "", (tmp_path / name).read_text())

    reference = page("drawn.html")
    kinds = supported_kinds(SweepData(sweep))
    assert drawn == [kinds]
    assert main(["plot", str(sweep), "--format", "png"]) == 0
    assert page("reused.html") == reference
    redrawn = [k for k in kinds if k == "param"]  # plot --param may have drawn another key
    assert drawn == [kinds, redrawn]
    later = max(p.stat().st_mtime_ns for p in (sweep / "figures").glob("*.png")) + 10**9
    os.utime(sweep / "sweep.parquet", ns=(later, later))  # results newer than the figures
    assert page("stale.html") == reference
    assert drawn == [kinds, redrawn, kinds]


def test_report_of_a_runs_folder_finds_runs_and_sweeps_below_and_skips_an_empty_sweep(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Issue 24: `lmsim report runs` did not see runs one level down (runs/quickstart) and
    one sweep without complete runs aborted the whole report. Runs and sweeps anywhere
    below are sections (a sweep's own runs are not sections of their own); an empty sweep
    is named on the page and on stderr, and the others are reported."""
    from test_sweep import tiny_experiment, write_experiment

    monkeypatch.chdir(tmp_path)
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"workload.rate": [2.0, 4.0]}))
    assert main(["run", "quickstart", "--no-figure", "--set", "workload.limit=20"]) == 0
    assert main(["run", "traces/chatbot", "--no-figure", "--set", "workload.limit=20"]) == 0
    assert main(["sweep", str(exp), "--out", "runs/s", "--no-progress"]) == 0
    # every point fails (the generator checks duration_s when it generates): an empty index
    failing = write_experiment(tmp_path / "failing.yaml", tiny_experiment(
        sweep={"workload.generator.params.duration_s": [-1]}))  # fmt: skip
    assert main(["sweep", str(failing), "--out", "runs/empty", "--no-progress"]) == 1
    capsys.readouterr()
    assert main(["report", "runs"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "runs/report.html"
    assert err.strip() == "lmsim report: runs/empty: skipped, the sweep has no complete runs"
    page = (tmp_path / "runs/report.html").read_text()
    sections = [line for line in page.split("<h2 id=") if line.startswith('"')]
    assert [s.split('"')[1] for s in sections] == ["empty", "quickstart", "s", "traces/chatbot"]
    assert "skipped: the sweep has no complete runs" in page
    assert page.count("configuration shared by every run") == 3
