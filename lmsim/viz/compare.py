"""`lmsim compare`: one table of the metrics serving people quote for any set of saved runs
(sweeps expand to their runs), each row labelled by the config differences that distinguish
it, optional ratios to a baseline run, and overlaid CDFs. Reads saved results only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lmsim.outputs import save_figure
from lmsim.study.rundir import COMPARE_FILES, check_output_dir, write_kind_marker
from lmsim.viz.axes import LEGEND_FONTSIZE, latency_axis
from lmsim.viz.figures import FORMATS
from lmsim.viz.runs import PlotError, RunSet
from lmsim.viz.style import VARIANT_LINESTYLES, policy_style

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"), ("queue_s", "queue"))
STATS = ("mean", "p50", "p90", "p99")
# (summary key, column, format): one format per column, so a column never mixes notations.
OTHER_COLUMNS = (
    ("request_throughput_per_s", "req/s", "{:.3f}"),
    ("output_token_throughput_per_s", "out tok/s", "{:.1f}"),
    ("goodput_per_s", "goodput req/s", "{:.3f}"),
    ("slo_attainment", "SLO attained", "{:.3f}"),
    ("prefix_hit_ratio", "hit ratio", "{:.3f}"),
    ("num_preemptions", "preemptions", "{:.0f}"),
)
# Shown only when some run has them (disaggregated clusters).
DISAGG_COLUMNS = (
    ("kv_transfer_s_mean", "KV transfer mean ms", "{:.1f}"),
    ("kv_transfer_bytes_mean", "KV transfer mean MB", "{:.1f}"),
    ("num_prefilled_on_decode", "prefilled on decode", "{:.0f}"),
)
# Shown when a compared run has lower KV tiers (lmsim.engine.kv_tiers): hit ratios per tier at
# first admission and over every lookup, bytes moved and lane busy time (summed over instances).
TIER_COLUMNS = (
    ("prefix_hit_ratio_first_admission", "GPU hit 1st", "{:.3f}"),
    ("prefix_hit_ratio_first_admission_host", "host hit 1st", "{:.3f}"),
    ("prefix_hit_ratio_first_admission_disk", "disk hit 1st", "{:.3f}"),
    ("prefix_hit_ratio_host", "host hit", "{:.3f}"),
    ("prefix_hit_ratio_disk", "disk hit", "{:.3f}"),
    ("kv_h2d_bytes", "loaded GB", "{:.1f}"),
    ("kv_offload_bytes_host", "offloaded GB", "{:.1f}"),
    ("kv_h2d_busy_s", "load busy s", "{:.1f}"),
    ("kv_d2h_busy_s", "store busy s", "{:.1f}"),
)
TABLE_FILE, TEXT_FILE = "compare.csv", "compare.txt"  # named in study.rundir.COMPARE_FILES
CDF_STEM = "cdf"
COMPARE_DIR_FILES = COMPARE_FILES | {f"{CDF_STEM}.{f}" for f in FORMATS}


def metric_columns(index: pd.DataFrame | None = None) -> list[tuple[str, str, str]]:
    """The table's columns; with the compared runs' `index`, also the disaggregation and
    KV-tier columns when some run has them."""
    cols = [(f"{m}_{s}", f"{name} {s} ms", "{:.1f}") for m, name in LATENCIES for s in STATS]
    extra = [c for c in DISAGG_COLUMNS if index is not None and c[0] in index and index[c[0]].notna().any()]
    tiers = index is not None and "kv_tiers_instances" in index and bool(index["kv_tiers_instances"].notna().any())
    return cols + list(OTHER_COLUMNS) + extra + (list(TIER_COLUMNS) if tiers else [])


def compare_table(data: RunSet, baseline: str | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """(table, column formats): one row per run, indexed by its distinguishing config
    values; latencies in ms. With `baseline` (a run label or directory), every metric is
    followed by its ratio to the baseline run's value (`÷ base`)."""
    index = data.index
    labels = [data.diff_label(row) for _, row in index.iterrows()]
    table = pd.DataFrame(index=pd.Index(labels, name="run"))
    formats: dict[str, str] = {}
    base_row = None
    if baseline is not None:
        base_row = index[index["run"] == _baseline_run(data, baseline)].iloc[0]
    for key, column, form in metric_columns(index):
        scale = 1000.0 if column.endswith(" ms") else 1e-6 if column.endswith(" MB") else 1e-9 if column.endswith(" GB") else 1.0
        if key in index:
            values = pd.to_numeric(index[key], errors="coerce").to_numpy(dtype=float, na_value=np.nan) * scale
        else:  # a run saved before this metric existed
            values = np.full(len(index), np.nan)
        table[column] = values
        formats[column] = form
        if base_row is not None:
            base = float(base_row[key]) * scale if key in base_row and pd.notna(base_row[key]) else np.nan
            with np.errstate(divide="ignore", invalid="ignore"):
                table[f"{column} ÷ base"] = values / base if base else np.nan
            formats[f"{column} ÷ base"] = "{:.2f}"
    return table, formats


def _baseline_run(data: RunSet, baseline: str) -> str:
    """The run `--baseline` names: its label in the index, its row label in the printed
    table (`policy=vllm`), or its directory."""
    if baseline in set(data.index["run"]):
        return baseline
    labels = {data.diff_label(row): row["run"] for _, row in data.index.iterrows()}
    if baseline in labels:
        return labels[baseline]
    wanted = Path(baseline).resolve()
    for run in data.index["run"]:
        if data.run_dir(run).resolve() == wanted:
            return run
    raise PlotError(f"--baseline {baseline}: not one of the compared runs "
                    f"(give its directory or its row label: {', '.join(labels)})")  # fmt: skip


def format_table(table: pd.DataFrame, formats: dict[str, str]) -> pd.DataFrame:
    out = pd.DataFrame(index=table.index)
    for column in table.columns:
        form = formats[column]
        out[column] = [("-" if pd.isna(v) else form.format(v)) for v in table[column]]
    return out


def format_text(table: pd.DataFrame, formats: dict[str, str]) -> str:
    """The table for a terminal: one block of columns per latency metric, then the rates
    and counts, each block with the runs' labels as rows."""
    shown = format_table(table, formats)
    groups = [[c for c in shown.columns if c.startswith(name + " ")] for _, name in LATENCIES]
    rest = [c for c in shown.columns if not any(c in g for g in groups)]
    blocks = []
    with pd.option_context("display.width", 1000, "display.max_columns", None, "display.max_colwidth", 80):
        for columns in [*groups, rest]:
            if columns:
                blocks.append(shown[columns].to_string())
    return "\n\n".join(blocks)


def plot_compare_cdf(data: RunSet) -> plt.Figure:
    """TTFT, TPOT and E2E CDFs (ms), every run overlaid, labelled by its differences."""
    metrics = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"))
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), layout="constrained")
    seen: dict[str, int] = {}
    for _, row in data.index.iterrows():
        policy = data.policy(row)
        n = seen.get(policy, 0)
        seen[policy] = n + 1
        style = policy_style(policy)
        done = data.requests(row["run"])
        done = done[done["status"].astype(str) == "finished"]
        for ax, (metric, _) in zip(axes, metrics):
            values = np.sort(done[metric].to_numpy(dtype=float, na_value=np.nan) * 1000.0)
            values = values[~np.isnan(values)]
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), color=style.color,
                        ls=VARIANT_LINESTYLES[n % len(VARIANT_LINESTYLES)], label=data.diff_label(row))  # fmt: skip
    for ax, (_, name) in zip(axes, metrics):
        xs = [line.get_xdata() for line in ax.get_lines()]
        ax.set_xlabel(f"{name} ({latency_axis(ax, 'x', np.concatenate(xs) if xs else np.array([]))})")
        ax.set_ylabel("CDF")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    # Below the panels: labels name every difference and may be long.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", fontsize=LEGEND_FONTSIZE, ncol=1)
    fig.suptitle(data.title(data.index), fontsize=10)
    return fig


def write_compare(data: RunSet, table: pd.DataFrame, text: str, out: str | os.PathLike[str]) -> list[Path]:
    """Write the table (CSV and text) and the overlaid CDFs into `out`, a new directory or
    one `lmsim compare` wrote before (nothing else is replaced)."""
    out_dir = Path(out)
    check_output_dir(out_dir, "compare", overwrite=True, allowed_files=COMPARE_DIR_FILES)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_kind_marker(out_dir, "compare")
    written = []
    for name, write in ((TABLE_FILE, lambda p: table.to_csv(p)), (TEXT_FILE, lambda p: p.write_text(text + "\n"))):
        path = out_dir / name
        tmp = path.with_name(f".{name}.tmp-{os.getpid()}")
        write(tmp)
        os.replace(tmp, path)
        written.append(path)
    fig = plot_compare_cdf(data)
    for f in FORMATS:
        save_figure(fig, out_dir / f"{CDF_STEM}.{f}")
        written.append(out_dir / f"{CDF_STEM}.{f}")
    plt.close(fig)
    return written


def compare(paths: list[Any], *, baseline: str | None = None, out: str | None = None) -> tuple[str, list[Path]]:
    """The formatted table (and the files written with `out`). A baseline directory that is
    not among `paths` (nor inside a given sweep) joins the compared runs."""
    paths = list(paths)
    if baseline is not None and Path(baseline).is_dir():
        wanted = Path(baseline).resolve()
        if not any(wanted == Path(p).resolve() or Path(p).resolve() in wanted.parents for p in paths):
            paths.append(baseline)
    data = RunSet(paths)
    table, formats = compare_table(data, baseline)
    text = format_text(table, formats)
    written = write_compare(data, table, text, out) if out else []
    return text, written
