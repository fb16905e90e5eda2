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
from lmsim.viz.axes import LEGEND_FONTSIZE, declutter_ticks, latency_axis
from lmsim.viz.bands import band_words, cdf_band, t95
from lmsim.viz.figures import FORMATS
from lmsim.viz.runs import SEED_KEY, PlotError, RunSet
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


CI_SUFFIX = " ±95%"  # the half-width column beside a metric averaged over seeds
SEEDS_COLUMN = "seeds"


def seed_groups(data: RunSet) -> list[tuple[str, pd.DataFrame]]:
    """(row label, runs) per row of the table: one row per run, or, when the runs differ
    in their seed, one row per configuration with its seeds (labelled without the seed),
    in the order the runs come."""
    if not data.has_seeds():
        return [(data.diff_label(row), data.index.loc[[i]]) for i, row in data.index.iterrows()]
    keys = [k for k in data.keys if k != SEED_KEY]
    labels = [data.diff_label(row, exclude=(SEED_KEY,)) if keys else "all runs" for _, row in data.index.iterrows()]
    frame = data.index.assign(_row=labels)
    return [(label, runs.drop(columns="_row")) for label, runs in frame.groupby("_row", sort=False)]


def _values(runs: pd.DataFrame, key: str, scale: float) -> np.ndarray:
    if key not in runs:  # a run saved before this metric existed
        return np.full(len(runs), np.nan)
    return pd.to_numeric(runs[key], errors="coerce").to_numpy(dtype=float, na_value=np.nan) * scale


def _mean_ci(values: np.ndarray) -> tuple[float, float]:
    """The mean of the finite values and the half-width of its 95% Student-t interval (NaN
    under two values)."""
    values = values[np.isfinite(values)]
    if not len(values):
        return (np.nan, np.nan)
    if len(values) < 2:
        return (float(values[0]), np.nan)
    return (float(values.mean()), t95(len(values)) * float(values.std(ddof=1)) / np.sqrt(len(values)))


def compare_table(data: RunSet, baseline: str | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """(table, column formats): one row per run, indexed by its distinguishing config
    values; latencies in ms. Runs that differ only in their seed are one row (seed_groups):
    each metric is their mean, followed by the half-width of its 95% interval (`±95%`),
    and a `seeds` column counts them. With `baseline` (a run label, a row label or a
    directory), every metric is followed by its ratio to the baseline row's value
    (`÷ base`; over seeds, the ratio of the means)."""
    groups = seed_groups(data)
    seeded = data.has_seeds()
    table = pd.DataFrame(index=pd.Index([label for label, _ in groups], name="run"))
    formats: dict[str, str] = {}
    if seeded:
        table[SEEDS_COLUMN] = [len(runs) for _, runs in groups]
        formats[SEEDS_COLUMN] = "{:.0f}"
    base_row = None
    if baseline is not None:
        base_run = _baseline_run(data, baseline)
        base_row = next(i for i, (_, runs) in enumerate(groups) if base_run in set(runs["run"]))
    for key, column, form in metric_columns(data.index):
        scale = 1000.0 if column.endswith(" ms") else 1e-6 if column.endswith(" MB") else 1e-9 if column.endswith(" GB") else 1.0
        stats = [_mean_ci(_values(runs, key, scale)) for _, runs in groups]
        values = np.array([m for m, _ in stats])
        table[column] = values
        formats[column] = form
        if seeded:
            table[column + CI_SUFFIX] = [h for _, h in stats]
            formats[column + CI_SUFFIX] = form
        if base_row is not None:
            base = values[base_row]
            with np.errstate(divide="ignore", invalid="ignore"):
                table[f"{column} ÷ base"] = values / base if base and np.isfinite(base) else np.nan
            formats[f"{column} ÷ base"] = "{:.2f}"
    return table, formats


def _baseline_run(data: RunSet, baseline: str) -> str:
    """A run of the row `--baseline` names: its label in the index, its row label in the
    printed table (`policy=vllm`; over seeds, the label without the seed), or its directory."""
    if baseline in set(data.index["run"]):
        return baseline
    labels = {label: runs["run"].iloc[0] for label, runs in seed_groups(data)}
    labels.update({data.diff_label(row): row["run"] for _, row in data.index.iterrows()})
    if baseline in labels:
        return labels[baseline]
    wanted = Path(baseline).resolve()
    for run in data.index["run"]:
        if data.run_dir(run).resolve() == wanted:
            return run
    rows = [label for label, _ in seed_groups(data)]
    raise PlotError(f"--baseline {baseline}: not one of the compared runs "
                    f"(give its directory or its row label: {', '.join(rows)})")  # fmt: skip


def format_table(table: pd.DataFrame, formats: dict[str, str]) -> pd.DataFrame:
    """Every cell in its column's format; a metric averaged over seeds reads `mean ± half`
    (its `±95%` column folded in, `-` for a single seed)."""
    out = pd.DataFrame(index=table.index)
    for column in table.columns:
        if column.endswith(CI_SUFFIX):
            continue
        form = formats[column]
        cells = [("-" if pd.isna(v) else form.format(v)) for v in table[column]]
        half = column + CI_SUFFIX
        if half in table:
            cells = [c if pd.isna(h) or c == "-" else f"{c} ± {formats[half].format(h)}" for c, h in zip(cells, table[half])]
        out[column] = cells
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
    """TTFT, TPOT and E2E CDFs (ms), every row of the table overlaid, labelled by its
    differences; a row over several seeds is the mean of its seeds' CDFs with their band
    (bands.cdf_band, the rule of docs/explanation/figures.md). Each panel is log where its data spans
    decades (TPOT tails do) and starts at zero where it is linear."""
    metrics = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"))
    groups = seed_groups(data)
    ncol = 1 if len(groups) <= 4 else 2 if len(groups) <= 12 else 3
    # the panels keep their height whatever the legend below them holds
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6 + 0.24 * -(-len(groups) // ncol)), layout="constrained")
    seen: dict[str, int] = {}
    counts = []
    data_of: dict[int, list[np.ndarray]] = {i: [] for i in range(len(metrics))}
    for label, runs in groups:
        policy = data.policy(runs.iloc[0])
        n = seen.get(policy, 0)
        seen[policy] = n + 1
        style = dict(color=policy_style(policy).color, ls=VARIANT_LINESTYLES[n % len(VARIANT_LINESTYLES)])
        counts.append(len(runs))
        for i, (ax, (metric, _)) in enumerate(zip(axes, metrics)):
            samples = []
            for run in runs["run"]:
                done = data.requests(run)
                done = done[done["status"].astype(str) == "finished"]
                values = done[metric].to_numpy(dtype=float, na_value=np.nan) * 1000.0
                if len(values[~np.isnan(values)]):
                    samples.append(values[~np.isnan(values)])
            if not samples:
                continue
            data_of[i].extend(samples)
            if len(samples) == 1:
                x = np.sort(samples[0])
                ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=label, **style)
            else:
                x, centre, low, high = cdf_band(samples)
                ax.plot(x, centre, label=f"{label}, {len(samples)} seeds", **style)
                ax.fill_between(x, low, high, color=style["color"], alpha=0.2, lw=0)
    for i, (ax, (_, name)) in enumerate(zip(axes, metrics)):
        values = np.concatenate(data_of[i]) if data_of[i] else np.array([])
        ax.set_xlabel(f"{name} ({latency_axis(ax, 'x', values)})")
        ax.set_ylabel("CDF")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    band = band_words(counts)
    title = f"over seeds: mean of the seeds' CDFs; {band}" if band else None
    # Below the panels: labels name every difference and may be long.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", fontsize=LEGEND_FONTSIZE,
               ncol=ncol, title=title, title_fontsize=LEGEND_FONTSIZE)  # fmt: skip
    fig.suptitle(data.title(data.index), fontsize=10)
    declutter_ticks(fig)
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
