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
