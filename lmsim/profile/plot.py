"""The profile plot: prefill time vs prompt length and decode step time vs batch size."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmsim.outputs import save_figure
from lmsim.profile.analytic import decode_step_seconds, prefill_seconds


def plot_profile(model, out: Path, *, budget: int = 8192) -> Path:
    """Draw the two panels from the table predictor into a PNG at `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = np.unique(np.round(np.geomspace(128, 65536, 41)).astype(int))
    batches = np.unique(np.round(np.geomspace(1, 512, 37)).astype(int))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for cached, style in ((0, "-"), (8192, "--")):
        ys = [prefill_seconds(model, int(t), cached, budget) for t in tokens]
        ax1.plot(tokens, ys, style, label=f"{cached // 1024}k cached" if cached else "cold")
    ax1.set(xscale="log", yscale="log", xlabel="new prompt tokens",
            ylabel="prefill time, engine only [s]",
            title=f"Prefill of one request (chunks of {budget})")
    for ctx, style in ((1024, "-"), (8192, "--")):
        ys = [decode_step_seconds(model, int(b), ctx) * 1e3 for b in batches]
        ax2.plot(batches, ys, style, label=f"context {ctx // 1024}k")
    kv_blocks = model.num_kv_blocks(16, 0.9)
    if kv_blocks:
        for ctx in (1024, 8192):
            fits = kv_blocks * 16 // ctx
            if fits < batches[-1]:
                ax2.axvline(fits, color="grey", lw=0.8, ls=":")
                ax2.text(fits, ax2.get_ylim()[1] * 0.5, f" KV full at {ctx // 1024}k", fontsize=8,
                         rotation=90, va="center", color="grey")
    ax2.set(xscale="log", xlabel="decodes in the step (batch size)", ylabel="decode step time [ms]",
            title="Decode-only step")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"{model.name} (table predictor)")
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    plt.close(fig)
    return out
