"""`lmsim compare`, run sets of ad-hoc runs and sweeps, and the figure conventions (one
style per policy, plain ticks, seeds averaged) on tiny linear-cost runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_sweep import tiny_experiment, write_experiment

from lmsim.cli import main
from lmsim.study.execute import run_sweep
from lmsim.viz.axes import set_scale
from lmsim.viz.compare import compare, compare_table
from lmsim.viz.figures import alarming_class, plot_cdf, plot_rate, t95
from lmsim.viz.runs import RunSet, differing_keys, flatten
from lmsim.viz.style import POLICY_STYLES, policy_style, register_style
from lmsim.viz.titles import model_words


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same experiment run twice by hand, the second with --set router.policy=lmetric."""
    root = tmp_path_factory.mktemp("cmp")
    exp = write_experiment(root / "exp.yaml", tiny_experiment())
    assert main(["run", str(exp), "--out", str(root / "a"), "--no-figure"]) == 0
    assert main(["run", str(exp), "--out", str(root / "b"), "--no-figure", "--set", "router.policy=lmetric"]) == 0
    return root / "a", root / "b"


@pytest.fixture(scope="module")
def seeded_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("seeds")
    raw = tiny_experiment(sweep={"router.policy": ["vllm", "lmetric"], "workload.rate": [2.0, 4.0], "seed": [0, 1]})
    exp = write_experiment(root / "exp.yaml", raw)
    assert run_sweep(exp, out=root / "sweep", jobs=2, progress=False).exit_code == 0
    return root / "sweep"


def test_config_differences_label_the_runs() -> None:
    a = flatten({"router": {"policy": "vllm", "params": {}}, "output": {"dir": "x"}, "seed": 0})
    b = flatten({"router": {"policy": "lmetric", "params": {"lambda": 0.5}}, "output": {"dir": "y"}, "seed": 0})
    # output.dir names a run, it does not distinguish one; a key only one run sets differs.
    assert differing_keys([a, b]) == ["router.policy", "router.params.lambda"]
    assert model_words("h20/qwen3-30b-a3b") == "Qwen3-30B-A3B on H20"
    assert model_words("h20/qwen2-7b") == "Qwen2-7B on H20"


def test_compare_two_ad_hoc_runs_with_baseline(two_runs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, b = two_runs
    data = RunSet([a, b])
    assert data.keys == ["router.policy"]
    table, _ = compare_table(data, baseline=str(a))
    assert list(table.index) == ["policy=vllm", "policy=lmetric"]
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert table.loc["policy=lmetric", "TTFT mean ms"] == pytest.approx(1000 * sb["ttft_s_mean"])
    assert table.loc["policy=lmetric", "TTFT mean ms ÷ base"] == pytest.approx(sb["ttft_s_mean"] / sa["ttft_s_mean"])
    assert table.loc["policy=vllm", "goodput req/s ÷ base"] == pytest.approx(1.0)
    assert table.loc["policy=lmetric", "req/s"] == pytest.approx(sb["request_throughput_per_s"])

    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--baseline", str(a), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "policy=lmetric" in printed and "TTFT p99 ms ÷ base" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["compare.csv", "compare.txt", "cdf.png", "cdf.svg", "cdf.pdf", "lmsim.json"]
    )
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0  # its own output: replaced


def test_compare_never_overwrites_foreign_files(two_runs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, b = two_runs
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "compare.csv").write_text("my data")
    assert main(["compare", str(a), str(b), "--out", str(mine)]) == 2
    assert "not written by lmsim" in capsys.readouterr().err
    assert (mine / "compare.csv").read_text() == "my data"
    assert main(["compare", str(a), str(b), "--baseline", str(tmp_path / "nope")]) == 2


def test_compare_expands_sweeps_and_mixes_runs(seeded_sweep: Path, two_runs: tuple[Path, Path]) -> None:
    text, written = compare([seeded_sweep])
    assert written == []
    assert "policy=lmetric, rate=4.0 " in text and "seed=1" not in text  # one row over its seeds
    data = RunSet([seeded_sweep, two_runs[0]])
    assert len(data.index) == 9


def test_compare_averages_seeds_and_takes_a_baseline_across_them(seeded_sweep: Path, capsys) -> None:
    """Issue 35: compare printed one row per seed, and --baseline could only name one seed's
    run. Runs that differ only in their seed are one row: the mean of the two seeds a and b,
    and the half-width of its 95% interval t(0.975, 1) · sd / √2 = 12.706 · |a - b| / 2; the
    baseline row is named without the seed, and the ratio is of the means."""
    data = RunSet(seeded_sweep)
    table, _ = compare_table(data, baseline="policy=vllm, rate=2.0")
    assert list(table.index) == ["policy=vllm, rate=2.0", "policy=vllm, rate=4.0",
                                 "policy=lmetric, rate=2.0", "policy=lmetric, rate=4.0"]  # fmt: skip
    assert table["seeds"].tolist() == [2, 2, 2, 2]
    runs = data.index[(data.index["router.policy"] == "lmetric") & (data.index["workload.rate"] == 4.0)]
    a, b = 1000 * runs["ttft_s_mean"].astype(float).to_numpy()
    row = table.loc["policy=lmetric, rate=4.0"]
    assert row["TTFT mean ms"] == pytest.approx((a + b) / 2)
    assert row["TTFT mean ms ±95%"] == pytest.approx(12.706 * abs(a - b) / 2)
    base = table.loc["policy=vllm, rate=2.0", "TTFT mean ms"]
    assert row["TTFT mean ms ÷ base"] == pytest.approx((a + b) / 2 / base)
    assert table.loc["policy=vllm, rate=2.0", "TTFT mean ms ÷ base"] == 1.0
    a_run = data.run_dir(runs["run"].iloc[0])
    by_dir, _ = compare_table(data, baseline=str(a_run))  # a seed's directory names its row
    assert by_dir.loc["policy=vllm, rate=2.0", "TTFT mean ms ÷ base"] == pytest.approx(base / ((a + b) / 2))
    assert main(["compare", str(seeded_sweep), "--baseline", "policy=vllm, rate=2.0"]) == 0
    printed = capsys.readouterr().out
    assert f"{(a + b) / 2:.1f} ± {12.706 * abs(a - b) / 2:.1f}" in printed
    report = seeded_sweep.parent / "report.html"
    assert main(["report", str(seeded_sweep), "--out", str(report)]) == 0
    page = report.read_text()
    assert page.count("<td>policy=lmetric, rate=4.0</td>") == 1 and "seed=1" not in page.split("<table")[1].split("</table>")[0]
    assert f"{(a + b) / 2:.1f} ± {12.706 * abs(a - b) / 2:.1f}" in page


def test_plot_accepts_several_run_directories(two_runs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, b = two_runs
    assert main(["plot", str(a), str(b), "--format", "png"]) == 2  # where would they go?
    assert "--out" in capsys.readouterr().err
    assert main(["plot", str(a), str(b), "--out", str(tmp_path / "f")]) == 0
    assert sorted(p.name for p in (tmp_path / "f").iterdir() if not p.name.startswith(".")) == [
        "cdf.pdf", "cdf.png", "cdf.svg"
    ]  # fmt: skip
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "<td>policy=vllm</td>" in page and "<td>policy=lmetric</td>" in page
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "r.html")]) == 0  # its own: replaced
    (tmp_path / "notes.html").write_text("<p>mine</p>")
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "notes.html")]) == 2
    assert (tmp_path / "notes.html").read_text() == "<p>mine</p>"


def test_one_colour_and_marker_per_policy_everywhere(seeded_sweep: Path) -> None:
    data = RunSet(seeded_sweep)
    for fig in (plot_cdf(data), plot_rate(data)):
        for ax in fig.axes:
            for line in ax.get_lines():
                policy = line.get_label().split(",")[0]
                assert line.get_color() == POLICY_STYLES[policy].color
    register_style("my_policy", color="#123456", marker="x")
    assert policy_style("my_policy").color == "#123456"
    unknown = policy_style("never_registered")
    assert policy_style("never_registered") == unknown  # kept once assigned


def test_seeds_are_averaged_with_confidence(seeded_sweep: Path) -> None:
    data = RunSet(seeded_sweep)
    fig = plot_rate(data)
    ax = fig.axes[0]  # mean TTFT
    line = next(line for line in ax.get_lines() if line.get_label() == "vllm")
    runs = data.index[(data.index["router.policy"] == "vllm") & (data.index["workload.rate"] == 2.0)]
    assert len(runs) == 2
    assert line.get_ydata()[0] == pytest.approx(1000 * runs["ttft_s_mean"].mean())
    assert ax.collections  # the 95% band
    assert t95(2) == 12.706 and t95(3) == 4.303 and t95(100) == 1.96


def test_log_scale_only_across_decades() -> None:
    import matplotlib.pyplot as plt

    fig, (narrow, wide) = plt.subplots(1, 2)
    set_scale(narrow, "x", np.array([8.0, 9.0, 12.0]))
    set_scale(wide, "x", np.array([5.0, 50.0, 5000.0]))
    assert narrow.get_xscale() == "linear" and wide.get_xscale() == "log"
    wide.set_xlim(5, 5000)
    fig.canvas.draw()
    labels = [t.get_text() for t in wide.get_xticklabels()]
    assert "10" in labels and "1000" in labels and not any("10^" in t or "×" in t for t in labels)
    plt.close(fig)


def test_alarming_class_is_the_one_that_alarmed_most() -> None:
    import pandas as pd

    events = pd.DataFrame({
        "time_s": [10.0, 20.0, 30.0, 40.0, 50.0],
        "kind": ["hotspot_window", "hotspot_alarm", "hotspot_alarm", "hotspot_clear", "hotspot_alarm"],
        "class_id": [1, 7, 3, 7, 7],
    })  # fmt: skip
    assert alarming_class(events) == 7
    assert alarming_class(events[events["kind"] == "hotspot_window"]) is None


def test_baseline_accepts_the_row_label_compare_prints(two_runs: tuple[Path, Path], capsys) -> None:
    """Issue 24: `--baseline policy=vllm`, the label compare printed for that row, was
    rejected ("not one of the compared runs")."""
    a, b = two_runs
    assert main(["compare", str(a), str(b), "--baseline", "policy=vllm"]) == 0
    printed = capsys.readouterr().out
    assert "TTFT mean ms ÷ base" in printed
    by_dir = compare([a, b], baseline=str(a))[0]
    assert compare([a, b], baseline="policy=vllm")[0] == by_dir
    assert main(["compare", str(a), str(b), "--baseline", "policy=nosuch"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lmsim: error: --baseline policy=nosuch: not one of the compared runs "
        "(give its directory or its row label: policy=vllm, policy=lmetric)"
    )
