"""`lmsim report DIR...`: one self-contained `report.html` for any set of saved runs and
sweeps, or for a directory of sweep directories (e.g. `runs/paper/`, one section each):
every figure kind the results support (PNG, base64-embedded), one metrics table per section
whose rows are labelled by what distinguishes the runs, each column in one number format,
and the configuration shown once with only the differing keys per run. The page names the
lmsim version, the git commit of the code (when it is a checkout) and the date."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import html
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from lmsim.errors import LmsimError, counted
from lmsim.outputs import (
    SIGNATURE,
    check_output_file,
    is_signed_figure,
    is_signed_report,
    write_text,
)
from lmsim.plan.output import find_plans, is_plan_dir, plan_section_html
from lmsim.study.index import INDEX_FILE, SPEC_FILE
from lmsim.study.rundir import is_complete
from lmsim.viz.compare import CI_SUFFIX, SEEDS_COLUMN, compare_table, format_table, seed_groups
from lmsim.viz.figures import FIGURES_DIR, make_figures, supported_kinds
from lmsim.viz.runs import PlotError, RunSet

REPORT_FILE = "report.html"
# The report's table: the headline statistics (compare.csv has every one).
TABLE_COLUMNS = ("TTFT mean ms", "TTFT p50 ms", "TTFT p99 ms", "TPOT mean ms", "TPOT p50 ms", "TPOT p99 ms",
                 "ITL mean ms", "ITL p99 ms", "E2E mean ms", "E2E p99 ms", "queue mean ms",
                 "req/s", "out tok/s", "goodput req/s", "SLO attained", "hit ratio", "preemptions")  # fmt: skip

_STYLE = """body{font-family:sans-serif;max-width:1400px;margin:1em auto;padding:0 1em}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#eee}th:first-child,td:first-child{text-align:left}img{max-width:100%;display:block;margin:.5em 0}
pre{font-size:11px;background:#f6f6f6;padding:.5em;overflow:auto}details{margin:.2em 0}
h2{border-bottom:1px solid #999}.meta{color:#555;font-size:13px}"""


class ReportError(LmsimError):
    """Nothing to report in the given directory."""


def find_sweeps(root: Path) -> list[Path]:
    """`root` itself when it is a sweep or a run, else every sweep and run below it at any
    depth (`runs/quickstart`, `runs/traces/chatbot`, `runs/paper/fig22`), in name order. A
    sweep's runs belong to its section, and hidden or figure folders hold no runs."""
    if (root / INDEX_FILE).exists() or is_complete(root):
        return [root]
    found = []
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        if not child.name.startswith(".") and child.name != FIGURES_DIR:
            found.extend(find_sweeps(child))
    return found


def provenance() -> dict[str, str]:
    """lmsim version, the git commit of the installed code when it is a checkout (with
    `+dirty` for uncommitted changes), and the date (UTC)."""
    from lmsim import __version__

    where = Path(__file__).resolve().parent
    commit = "not a git checkout"
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10)  # fmt: skip
        if head.returncode == 0:
            commit = head.stdout.strip()
            dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)  # fmt: skip
            if dirty.returncode == 0 and dirty.stdout.strip():
                commit += "+dirty"
    except (OSError, subprocess.SubprocessError):
        pass
    return {"lmsim": __version__, "commit": commit, "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def _drop(config: dict[str, Any], dotted: str) -> None:
    parts = dotted.split(".")
    node: Any = config
    for p in parts[:-1]:
        if not isinstance(node, dict) or p not in node:
            return
        node = node[p]
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def shared_config(data: RunSet) -> str:
    """The first run's resolved config without the keys that differ between runs (those
    are the table's row labels) nor the fields that only name or place a run."""
    run = data.index["run"].iloc[0]
    path = data.run_dir(run) / "config.yaml"
    if not path.exists():
        return "(no config.yaml saved)"
    config = copy.deepcopy(yaml.safe_load(path.read_text()) or {})
    for key in [*data.keys, "name", "description", "output.dir", "sweep", "zip"]:
        _drop(config, key)
    return yaml.safe_dump(config, sort_keys=False).strip()


def _table(data: RunSet) -> str:
    """The headline table: one row per run, or per configuration over its seeds (mean ± the
    half-width of the 95% interval; compare.seed_groups), with its finished requests and
    offered rate (over seeds, their mean)."""
    table, formats = compare_table(data)
    wanted = [SEEDS_COLUMN, *(c + suffix for c in TABLE_COLUMNS for suffix in ("", CI_SUFFIX))]
    shown = format_table(table[[c for c in wanted if c in table]], formats)
    groups = seed_groups(data)
    finished = [pd.to_numeric(runs["num_finished"], errors="coerce").mean() for _, runs in groups]
    shown.insert(0, "finished", ["-" if v != v else f"{v:.0f}" for v in finished])
    if "offered_rate_per_s" in data.index:
        offered = [pd.to_numeric(runs["offered_rate_per_s"], errors="coerce").mean() for _, runs in groups]
        shown.insert(1, "offered req/s", ["-" if v != v else f"{v:.3f}" for v in offered])
    return shown.reset_index().to_html(index=False, border=0, escape=True)


def _section(paths: list[Path], title: str) -> str:
    data = RunSet(paths if len(paths) > 1 else paths[0])
    anchor = html.escape(title)
    parts = [f'<h2 id="{anchor}">{anchor}</h2>', f"<p>{html.escape(data.title(data.index))}; "
             f"{counted(len(data.index), 'run')}; rows name what differs: "
             f"{html.escape(', '.join(data.keys) or 'nothing')}</p>"]  # fmt: skip
    kinds = supported_kinds(data)
    drawn = _drawn_figures(paths, kinds)
    with tempfile.TemporaryDirectory() as tmp:
        missing = [k for k in kinds if k not in drawn]
        if missing:
            for path in make_figures(paths if len(paths) > 1 else paths[0], missing, formats=("png",), out=tmp):
                drawn[path.stem] = path
        for kind in kinds:
            b64 = base64.b64encode(drawn[kind].read_bytes()).decode()
            parts.append(f"<h3>{kind}</h3><img alt='{kind}' src='data:image/png;base64,{b64}'>")
    parts.append("<h3>summary</h3>" + _table(data))
    from lmsim.viz.fleet import fleet_cost_html

    fleet = fleet_cost_html(data)
    if fleet is not None:
        parts.append(fleet)
    parts.append("<h3>configuration shared by every run</h3>"
                 f"<pre>{html.escape(shared_config(data))}</pre>")  # fmt: skip
    spec = paths[0] / SPEC_FILE
    if len(paths) == 1 and spec.exists():
        parts.append(f"<details><summary>experiment (sweep.yaml)</summary><pre>{html.escape(spec.read_text())}</pre></details>")
    return "\n".join(parts)


def _drawn_figures(paths: list[Path], kinds: list[str]) -> dict[str, Path]:
    """PNGs `lmsim plot` already drew for a one-directory section, by kind, when drawn after
    the directory's results last changed (its sweep.parquet, or a run's summary.json): the
    same saved results draw the same bytes (figures carry no dates), so the report embeds
    them instead of drawing every figure again (34 s of the paper's reproduce.sh). `param`
    is always redrawn: `lmsim plot --param` may have drawn it for another key."""
    if len(paths) != 1:
        return {}
    root = paths[0]
    stamps = [root / INDEX_FILE, root / "summary.json"]
    try:
        results_changed = max(p.stat().st_mtime_ns for p in stamps if p.exists())
    except ValueError:  # neither file: not a sweep or run lmsim finished
        return {}
    found = {}
    for kind in kinds:
        png = root / FIGURES_DIR / f"{kind}.png"
        if kind != "param" and png.is_file() and png.stat().st_mtime_ns > results_changed and is_signed_figure(png):
            found[kind] = png
    return found


def write_report(
    roots: str | os.PathLike[str] | list[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    warn: Callable[[str], None] = print,
) -> Path:
    """One directory: its sweeps (or itself, a sweep or a run), a section each. Several
    directories: one section comparing all their runs; `out` is then required. A file at
    the output path that lmsim did not write is replaced only with `overwrite`. A section
    that cannot be drawn (a sweep without complete runs) is skipped, said on the page and
    through `warn`, unless it is the only one."""
    given = [Path(r) for r in (roots if isinstance(roots, list) else [roots])]
    if len(given) == 1:
        root = given[0]
        sweeps = find_sweeps(root)
        plans = find_plans(root) if root.is_dir() else []
        if not sweeps and not plans:
            raise ReportError(f"{root}: no sweep.parquet or run here or in a subdirectory (nor an lmsim plan)")
        sections = [(str(s.relative_to(root)) if s != root else s.name, [s]) for s in sweeps]
        sections += [(str(p.relative_to(root)) if p != root else p.name, [p]) for p in plans]
        path = Path(out) if out else root / REPORT_FILE
    else:
        if out is None:
            raise ReportError("several directories given: name the report file with --out")
        sections = [(", ".join(p.name for p in given), given)]
        path = Path(out)
        root = path.resolve().parent
    path = check_output_file(path, overwrite=overwrite, ours=is_signed_report)
    parts = []
    for title, paths in sections:
        try:
            if is_plan_dir(paths[0]):
                parts.append(plan_section_html(paths[0], title))
                continue
            parts.append(_section(paths, title))
        except PlotError as exc:
            if len(sections) == 1:
                raise
            # One sweep without complete runs does not take a report of many down with it.
            reason = str(exc).removeprefix(f"{paths[0]}: ")
            anchor = html.escape(title)
            parts.append(f'<h2 id="{anchor}">{anchor}</h2><p>skipped: {html.escape(reason)}</p>')
            warn(f"lmsim report: {paths[0]}: skipped, {reason}")
    body = "\n".join(parts)
    meta = provenance()
    toc = "".join(f'<li><a href="#{html.escape(t)}">{html.escape(t)}</a></li>' for t, _ in sections)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><meta name='generator' content='{SIGNATURE}'>"
            f"<title>lmsim report: {html.escape(root.name)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>lmsim report: {html.escape(str(root))}</h1>"
            f"<p class='meta'>lmsim {html.escape(meta['lmsim'])} · commit {html.escape(meta['commit'])} · "
            f"{html.escape(meta['date'])}. Latencies in ms; generated from saved results only.</p>"
            f"<ul>{toc}</ul>" + body + "</body></html>")  # fmt: skip
    return write_text(path, page)
