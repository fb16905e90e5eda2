"""A run's own CDF figure, written with the run; drawn from its results only."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lmsim.outputs import save_figure
from lmsim.viz.axes import LEGEND_FONTSIZE, declutter_ticks, latency_axis
from lmsim.viz.style import policy_style
from lmsim.viz.titles import load_words


def run_title(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """`name: policy, load` in words: "quickstart: vllm, load 50% of capacity (34.4 req/s)"."""
    words = [str(config.get("router", {}).get("policy", "run"))]
    workload = config.get("workload", {})
    load = load_words({f"workload.{k}": workload.get(k) for k in ("load", "rate", "time_scale")})
    if load:
        rate = summary.get("load_rate_req_s")
        words.append(load + (f" ({rate:.3g} req/s)" if rate is not None and "capacity" in load else ""))
    return f"{config.get('name', 'run')}: {', '.join(words)}"


def plot_run_cdf(requests: pd.DataFrame, path: str | os.PathLike[str], *, title: str = "", policy: str = "") -> None:
    """TTFT and TPOT CDFs of one run's finished requests (seed Figure 22 style), in the
    policy's colour (lmsim.viz.style), labelled with the policy."""
    done = requests[requests["status"].astype(str) == "finished"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    color = policy_style(policy).color if policy else "#1f77b4"
    for ax, metric, label in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
        values = done[metric].to_numpy(dtype=float, na_value=np.nan) * 1000.0
        values = np.sort(values[~np.isnan(values)])
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), color=color, label=policy or title or "run")
            ax.legend(fontsize=LEGEND_FONTSIZE, loc="lower right")
        ax.set_xlabel(f"{label} ({latency_axis(ax, 'x', values)})")
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    declutter_ticks(fig)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
