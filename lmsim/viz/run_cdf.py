"""Figures from saved results only; never called while a simulation runs."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lmsim.outputs import save_figure


def _cdf(ax, values: np.ndarray, label: str) -> None:
    values = np.sort(values[~np.isnan(values)])
    if not len(values):
        return
    ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=label)


def plot_run_cdf(requests: pd.DataFrame, path: str | os.PathLike[str], *, title: str = "") -> None:
    """TTFT and TPOT CDFs of one run's finished requests (seed Figure 22 style)."""
    done = requests[requests["status"].astype(str) == "finished"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, metric, label in ((axes[0], "ttft_s", "TTFT (s)"), (axes[1], "tpot_s", "TPOT (s)")):
        _cdf(ax, done[metric].to_numpy(dtype=float), title or "run")
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
