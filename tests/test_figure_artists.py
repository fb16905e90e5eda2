"""What the seed figures draw, read from their artists (issue 38): bands over seeds that stay
inside the data and say what they are, axes that start at zero or are log, tick labels that
never run together, one x range per CDF column.

The fixture is written by hand, not simulated, so the numbers are known: run directories
(config.yaml, requests.parquet, summary.json) of two traces, lmetric at seeds 0-2 (whose
latencies differ by a factor per seed, as Coder's and ToolAgent's P99s do in the paper study)
and vllm at seed 0, at loads 0.3 and 0.6; and a KV host-tier capacity sweep. Each test names
the defect of the shipped Figures 22/23 it pins; each failed on the code before the fix."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml
from figure_checks import assert_readable, bands, log_axis_problems, overlapping_labels

from lmsim.viz.bands import band_words, cdf_band, point_interval, t95
from lmsim.viz.figures import plot_cdf, plot_rate, plot_tiers
from lmsim.viz.runs import RunSet

# Per-seed latency factors: seed 2's TTFTs are 80 times seed 0's, its TPOTs 6 times.
TTFT_FACTOR = {0: 1.0, 1: 8.0, 2: 80.0}
TPOT_FACTOR = {0: 1.0, 1: 2.0, 2: 6.0}
N_REQUESTS = 300


def _write_run(path: Path, config: dict, ttft_s: np.ndarray, tpot_s: np.ndarray, extra: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    n = len(ttft_s)
    pd.DataFrame({"status": ["finished"] * n, "arrived_at": np.arange(n, dtype=float) / 10.0,
                  "ttft_s": ttft_s, "tpot_s": tpot_s}).to_parquet(path / "requests.parquet")  # fmt: skip
    summary = {"ttft_s_mean": float(ttft_s.mean()), "ttft_s_p99": float(np.quantile(ttft_s, 0.99)),
               "tpot_s_mean": float(tpot_s.mean()), "tpot_s_p99": float(np.quantile(tpot_s, 0.99)),
               "policy": config["router"]["policy"], **(extra or {})}  # fmt: skip
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def _config(trace: str, policy: str, seed: int, load: float, **cluster: object) -> dict:
    return {"name": "fixture", "seed": seed, "workload": {"generator": {"name": trace}, "load": load},
            "cluster": {"num_instances": 4, "profile": "h20/qwen3-30b-a3b", **cluster},
            "router": {"policy": policy}}  # fmt: skip


def _latencies(seed: int, load: float, trace: str) -> tuple[np.ndarray, np.ndarray]:
    """Log-normal TTFTs (median 50 ms at load 0.3) and TPOTs (median 20 ms, clipped to
    8-2,500 ms: the 2.5 decades of Figure 22's Coder TPOT panel), scaled per seed and load."""
    rng = np.random.default_rng(1000 * seed + int(load * 10) + (7 if trace == "coder" else 0))
    ttft = 0.05 * np.exp(rng.normal(0.0, 0.8, N_REQUESTS)) * TTFT_FACTOR[seed] * load / 0.3
    tpot = np.clip(0.02 * np.exp(rng.normal(0.0, 1.0, N_REQUESTS)) * TPOT_FACTOR[seed], 0.008, 2.5)
    return ttft, tpot


@pytest.fixture(scope="module")
def seeded_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("seeded")
    dirs = []
    for trace in ("coder", "chatbot"):
        for load in (0.3, 0.6):
            for policy, seeds in (("lmetric", (0, 1, 2)), ("vllm", (0,))):
                for seed in seeds:
                    ttft, tpot = _latencies(seed, load, trace)
                    dirs.append(_write_run(root / f"{trace}-{policy}-s{seed}-l{load}", _config(trace, policy, seed, load), ttft, tpot))  # fmt: skip
    return dirs


def _band_of(ax, color: str) -> np.ndarray:
    from matplotlib.colors import to_hex

    (band,) = [c for c in ax.collections if to_hex(c.get_facecolor()[0]) == color]
    return np.concatenate([p.vertices for p in band.get_paths()])


def test_cdf_band_stays_inside_the_seeds_data(seeded_runs: list[Path]) -> None:
    """Fig. 22: the 95% band of Coder's TTFT CDF was a slab from CDF 0 to 0.3 across the whole
    log axis (the quantile-axis interval, t = 4.30 at 3 seeds, cut at 0 ms, i.e. at the axis
    floor) and llm-d's band a line at CDF 1.0 across the panel. The band is now on the CDF
    axis, within [0, 1], and only over the latencies the seeds produced."""
    data = RunSet(seeded_runs)
    fig = plot_cdf(data)
    lmetric = data.index[data.index["router.policy"] == "lmetric"]
    for ax, (_, frame) in zip(fig.axes[::2], data.facets()):
        runs = lmetric[lmetric["run"].isin(frame["run"])]["run"]
        ttft = np.concatenate([data.requests(r)["ttft_s"].to_numpy() * 1000.0 for r in runs])
        (band,) = bands(ax)
        assert ttft.min() <= band[:, 0].min() and band[:, 0].max() <= ttft.max()
        assert band[:, 1].min() >= 0.0 and band[:, 1].max() <= 1.0
    assert_readable(fig)
    plt.close(fig)


def test_cdf_band_by_hand() -> None:
    """Three seeds of two values each, {1, 3}, {2, 4}, {5, 6}: at x = 3 the seeds' CDFs are
    1, 1/2, 0 (mean 1/2, band 0..1); at x = 5 they are 1, 1, 1/2 (mean 5/6, band 1/2..1).
    With five seeds the band is the t interval: at x = 2 over {1,2},{1,2},{1,2},{3,4},{3,4}
    the CDFs are 1, 1, 1, 0, 0: mean 0.6, sd 0.5477, half 2.776 * 0.5477 / √5 = 0.680, cut
    to [0, 1]: 0 .. 1."""
    x, centre, low, high = cdf_band([np.array([1.0, 3.0]), np.array([2.0, 4.0]), np.array([5.0, 6.0])])
    assert x.min() == 1.0 and x.max() == 6.0
    at = {float(v): i for i, v in enumerate(x)}
    assert (centre[at[3.0]], low[at[3.0]], high[at[3.0]]) == pytest.approx((0.5, 0.0, 1.0))
    assert (centre[at[5.0]], low[at[5.0]], high[at[5.0]]) == pytest.approx((5 / 6, 0.5, 1.0))
    five = [np.array([1.0, 2.0])] * 3 + [np.array([3.0, 4.0])] * 2
    x, centre, low, high = cdf_band(five)
    i = list(x).index(2.0)
    assert centre[i] == pytest.approx(0.6) and (low[i], high[i]) == (0.0, 1.0)
    assert t95(5) * np.std([1, 1, 1, 0, 0], ddof=1) / np.sqrt(5) == pytest.approx(0.680, abs=1e-3)


def test_point_interval_by_hand() -> None:
    """Seeds 5, 6, 18 s (ToolAgent's P99 TTFT in Fig. 23): the old mean ± t·sd/√n was
    9.67 ± 4.303 · 7.23 / √3 = -8.3 .. 27.6 s. Now, under 5 seeds, min-max: 5 .. 18, around
    the mean 9.67 (linear) or the geometric mean (5·6·18)^(1/3) = 8.14 (log). Five seeds 1, 2,
    4, 8, 16 on a log axis: logs 0..4 ln 2, mean 2 ln 2 (centre 4), sd 1.581 ln 2, half
    2.776 · 1.581 / √5 · ln 2 = 1.963 ln 2: 4 / 2^1.963 = 1.03 .. 4 · 2^1.963 = 15.6."""
    assert point_interval(np.array([5.0, 6.0, 18.0]), log=False) == pytest.approx((29 / 3, 5.0, 18.0))
    assert point_interval(np.array([5.0, 6.0, 18.0]), log=True) == pytest.approx((540 ** (1 / 3), 5.0, 18.0))
    centre, low, high = point_interval(np.array([1.0, 2.0, 4.0, 8.0, 16.0]), log=True)
    assert (centre, low, high) == pytest.approx((4.0, 4 / 2**1.963, 4 * 2**1.963), rel=1e-3)
    # linear, five seeds: 1, 1, 1, 1, 30: mean 6.8 - 2.776 * 12.97 / √5 < 0, cut at zero
    assert point_interval(np.array([1.0, 1.0, 1.0, 1.0, 30.0]), log=False)[1] == 0.0
    assert band_words([1, 3, 3]) == "band: min–max of 3 seeds"
    assert band_words([5, 1]) == "band: 95% CI, 5 seeds"
    assert band_words([1, 1]) is None


def test_rate_bands_are_computed_where_the_axis_is(seeded_runs: list[Path]) -> None:
    """Fig. 23: with 3 seeds, Student-t intervals reached below zero; on log axes they became
    rectangles down to the axis floor and stretched the Agent P99 TTFT axis to 0.01 s. Each
    point is now the seeds' min-max around their mean (geometric on a log axis): every band
    vertex between the lowest and the highest seed, positive on log axes."""
    data = RunSet(seeded_runs)
    fig = plot_rate(data)
    assert log_axis_problems(fig) == []
    lmetric = data.index[data.index["router.policy"] == "lmetric"]
    rows = np.array(fig.axes).reshape(-1, 4)
    metrics = ("ttft_s_mean", "ttft_s_p99", "tpot_s_mean", "tpot_s_p99")
    for (_, frame), row in zip(data.facets(exclude=("workload.load",)), rows):
        for ax, metric in zip(row, metrics):
            seeds = lmetric[lmetric["run"].isin(frame["run"])]
            values = seeds[metric].astype(float).to_numpy() * 1000.0
            band = _band_of(ax, "#d62728")
            assert values.min() * (1 - 1e-9) <= band[:, 1].min() and band[:, 1].max() <= values.max() * (1 + 1e-9)
            line = next(line for line in ax.get_lines() if line.get_label().startswith("lmetric"))
            at_03 = seeds[seeds["workload.load"] == 0.3][metric].astype(float).to_numpy() * 1000.0
            log = ax.get_yscale() == "log"
            expected = np.exp(np.log(at_03).mean()) if log else at_03.mean()
            assert line.get_ydata()[0] == pytest.approx(expected)
            if log:  # the axis holds the data, not decades of empty floor below it
                assert ax.get_ylim()[0] >= values.min() / 2
    assert rows[0, 1].get_yscale() == "log"  # P99 TTFT spans 80x over the seeds
    plt.close(fig)


def test_linear_latency_axes_start_at_zero(seeded_runs: list[Path]) -> None:
    """Fig. 23: mean TPOT axes ran below zero (a t band at 3 seeds). A non-negative quantity
    is on a log axis or on a linear one from 0."""
    data = RunSet(seeded_runs)
    for fig in (plot_rate(data), plot_cdf(data)):
        for ax in fig.axes:
            if ax.get_yscale() == "linear" and ax.get_ylabel() != "CDF":
                assert ax.get_ylim()[0] == 0.0, ax.get_ylabel()
                top = max(line.get_ydata().max() for line in ax.get_lines())
                assert ax.get_ylim()[1] >= top * 1.04  # the highest point is inside the frame
            if ax.get_xscale() == "linear" and ax.get_ylabel() == "CDF":
                assert ax.get_xlim()[0] == 0.0, ax.get_xlabel()
        assert_readable(fig)
        plt.close(fig)
    fig = plot_rate(data)
    assert any(ax.get_yscale() == "linear" for ax in fig.axes)  # the check above checked something
    plt.close(fig)


def test_tick_labels_never_overlap(seeded_runs: list[Path]) -> None:
    """Fig. 22: the TPOT CDFs' log ticks read "5001000" and "10002000" (1-2-5 ticks on 2.5
    decades of a 4.6-inch panel). Labels are measured as drawn and thinned until none touch."""
    data = RunSet(seeded_runs)
    for fig in (plot_cdf(data), plot_rate(data)):
        assert overlapping_labels(fig) == []
        plt.close(fig)


def test_legend_says_what_the_band_is(seeded_runs: list[Path]) -> None:
    data = RunSet(seeded_runs)
    fig = plot_cdf(data)
    assert fig.axes[1].get_legend().get_title().get_text() == "mean of the seeds' CDFs;\nband: min–max of 3 seeds"
    plt.close(fig)
    fig = plot_rate(data)
    assert fig.axes[3].get_legend().get_title().get_text() == (
        "mean of seeds (geometric on log axes);\nband: min–max of 3 seeds"
    )
    plt.close(fig)


def test_cdf_columns_share_one_x_range(seeded_runs: list[Path]) -> None:
    """Every panel of a metric spans the same latencies (and unit), so rows compare."""
    fig = plot_cdf(RunSet(seeded_runs))
    rows = np.array(fig.axes).reshape(-1, 2)
    for column in rows.T:
        assert len({ax.get_xlim() for ax in column}) == 1
        assert len({ax.get_xlabel() for ax in column}) == 1
    plt.close(fig)


def test_tiers_bands_are_min_max_and_ratios_from_zero(tmp_path: Path) -> None:
    """The tiers figure over three seeds: host-tier capacities 0, 8, 32 GB, GPU hit ratios per
    seed 0.2 / 0.3 / 0.4 (band 0.2..0.4 around 0.3), on an axis from 0."""
    dirs = []
    for gb in (0, 8, 32):
        for seed in (0, 1, 2):
            ttft, tpot = _latencies(seed, 0.3, "chatbot")
            config = _config("chatbot", "lmetric", seed, 0.5, kv_tiers={"host": {"capacity_gb": gb}})
            extra = {"prefix_hit_ratio_first_admission": 0.2 + 0.1 * seed,
                     "prefix_hit_ratio_first_admission_host": 0.01 * gb * (seed + 1) / 3}  # fmt: skip
            dirs.append(_write_run(tmp_path / f"t{gb}-s{seed}", config, ttft, tpot, extra))
    fig = plot_tiers(RunSet(dirs))
    gpu = fig.axes[0]
    band = bands(gpu)[0]
    assert band[:, 1].min() == pytest.approx(0.2) and band[:, 1].max() == pytest.approx(0.4)
    assert list(gpu.get_lines()[0].get_ydata()) == pytest.approx([0.3, 0.3, 0.3])
    assert gpu.get_ylim()[0] == 0.0
    assert_readable(fig)
    plt.close(fig)


def test_a_parameter_sweep_of_one_policy_is_one_colour_scale(tmp_path: Path) -> None:
    """Issue 35: bailian at five lambdas drew five dash styles of one orange. A policy swept
    over one numeric parameter now draws solid lines in shades of its colour, lighter to
    darker as lambda grows (relative luminance strictly falling), legend in lambda order;
    two variants of a policy (llm-d deployed and oracle) keep their dash styles."""
    from matplotlib.colors import to_rgb

    dirs = []
    for lam in (1.0, 0.0, 0.25, 0.5, 0.75):
        ttft, tpot = _latencies(0, 0.3, "chatbot")
        config = _config("chatbot", "bailian", 0, 0.5)
        config["router"]["params"] = {"lambda": lam}
        dirs.append(_write_run(tmp_path / f"lam{lam}", config, ttft * (1 + lam), tpot))
    fig = plot_cdf(RunSet(dirs))
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == [f"bailian, lambda={v}" for v in ("0.0", "0.25", "0.5", "0.75", "1.0")]
    assert {line.get_linestyle() for line in lines} == {"-"}
    luminance = [float(np.dot(to_rgb(line.get_color()), (0.2126, 0.7152, 0.0722))) for line in lines]
    assert all(a > b for a, b in pairwise(luminance))
    assert_readable(fig)
    plt.close(fig)
