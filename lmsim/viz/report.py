"""`lmsim report DIR`: one self-contained `report.html` for a sweep directory, or for a
directory of sweep directories (e.g. `runs/paper/`): every figure kind the saved results
support (PNG, base64-embedded), the summary table of each sweep and every run's resolved
config. Reads saved results only."""

from __future__ import annotations

import base64
import html
import os
import tempfile
from pathlib import Path

from lmsim.errors import LmsimError
from lmsim.outputs import SIGNATURE, check_output_file, write_text
from lmsim.study.index import INDEX_FILE, SPEC_FILE, WALL_CLOCK_COLUMNS
from lmsim.viz.figures import SweepData, make_figures, supported_kinds

REPORT_FILE = "report.html"
TABLE_COLUMNS = ("policy", "num_finished", "num_unfinished", "num_rejected", "offered_rate_per_s",
                 "ttft_s_mean", "ttft_s_p50", "ttft_s_p99", "tpot_s_mean", "tpot_s_p50", "tpot_s_p99",
                 "prefix_hit_ratio")  # fmt: skip

_STYLE = """body{font-family:sans-serif;max-width:1400px;margin:1em auto;padding:0 1em}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#eee}img{max-width:100%;display:block;margin:.5em 0}pre{font-size:11px;background:#f6f6f6;
padding:.5em;overflow:auto}details{margin:.2em 0}h2{border-bottom:1px solid #999}"""


class ReportError(LmsimError):
    """Nothing to report in the given directory."""


def find_sweeps(root: Path) -> list[Path]:
    if (root / INDEX_FILE).exists():
        return [root]
    return sorted(p.parent for p in root.glob(f"*/{INDEX_FILE}"))


def _table(data: SweepData) -> str:
    index = data.index
    cols = ["run", *[k for k in data.keys if k in index], *[c for c in TABLE_COLUMNS if c in index]]
    frame = index[[c for c in cols if c not in WALL_CLOCK_COLUMNS]].copy()
    for c in frame.columns:
        if c.startswith(("ttft_s", "tpot_s")):
            frame[c] = (frame[c].astype(float) * 1000).round(1)  # shown in ms
    frame = frame.rename(columns={c: c.replace("_s_", " ms ") for c in frame.columns if c.startswith(("ttft_s", "tpot_s"))})
    return frame.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="", border=0)


def _section(sweep: Path, root: Path) -> str:
    data = SweepData(sweep)
    title = html.escape(str(sweep.relative_to(root)) if sweep != root else sweep.name)
    parts = [f'<h2 id="{title}">{title}</h2>']
    spec = sweep / SPEC_FILE
    if spec.exists():
        parts.append(f"<details><summary>experiment (sweep.yaml)</summary><pre>{html.escape(spec.read_text())}</pre></details>")
    with tempfile.TemporaryDirectory() as tmp:
        for path in make_figures(sweep, supported_kinds(data), formats=("png",), out=tmp):
            b64 = base64.b64encode(path.read_bytes()).decode()
            parts.append(f"<h3>{path.stem}</h3><img alt='{path.stem}' src='data:image/png;base64,{b64}'>")
    parts.append("<h3>summary</h3>" + _table(data))
    configs = []
    for run in data.index["run"]:
        cfg = data.run_dir(run) / "config.yaml"
        if cfg.exists():
            configs.append(f"<details><summary>{html.escape(run)}</summary><pre>{html.escape(cfg.read_text())}</pre></details>")
    parts.append("<h3>resolved configs</h3>" + "".join(configs))
    return "\n".join(parts)


def is_report(path: Path) -> bool:
    """An HTML page `write_report` wrote (signed in its head)."""
    with open(path, "rb") as fh:
        return SIGNATURE.encode() in fh.read(4096)


def write_report(
    root: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *, overwrite: bool = False,
) -> Path:
    """Write the report to `out` (default DIR/report.html); a file there that lmsim did not
    write is replaced only with `overwrite`."""
    root = Path(root)
    sweeps = find_sweeps(root)
    if not sweeps:
        raise ReportError(f"{root}: no sweep.parquet here or in a subdirectory")
    path = check_output_file(Path(out) if out else root / REPORT_FILE, overwrite=overwrite, ours=is_report)
    sections = [_section(s, root) for s in sweeps]
    toc = "".join(f'<li><a href="#{html.escape(n)}">{html.escape(n)}</a></li>'
                  for n in (str(s.relative_to(root)) if s != root else s.name for s in sweeps))  # fmt: skip
    page = (f"<!doctype html><html><head><meta charset='utf-8'><meta name='generator' content='{SIGNATURE}'><title>lmsim report: {html.escape(root.name)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>lmsim report: {html.escape(str(root))}</h1>"
            f"<p>Latencies in ms. Generated from saved results only.</p><ul>{toc}</ul>"
            + "\n".join(sections) + "</body></html>")  # fmt: skip
    return write_text(path, page)
