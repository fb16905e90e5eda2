"""A run's own CDF figure, written with the run; drawn from its results only."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lmsim.outputs import save_figure
from lmsim.viz.axes import set_scale
from lmsim.viz.style import policy_style


def plot_run_cdf(requests: pd.DataFrame, path: str | os.PathLike[str], *, title: str = "", policy: str = "") -> None:
    """TTFT and TPOT CDFs (ms) of one run's finished requests (seed Figure 22 style)."""
    done = requests[requests["status"].astype(str) == "finished"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    color = policy_style(policy).color if policy else "#1f77b4"
    for ax, metric, label in ((axes[0], "ttft_s", "TTFT (ms)"), (axes[1], "tpot_s", "TPOT (ms)")):
        values = done[metric].to_numpy(dtype=float, na_value=np.nan) * 1000.0
        values = np.sort(values[~np.isnan(values)])
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), color=color, label=policy or title or "run")
        set_scale(ax, "x", values)
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
