"""`lmsim plot` draws every figure kind from saved results only (lmsim/viz/figures.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_sweep import run_cli, tiny_experiment, write_experiment

from lmsim.study.execute import run_sweep
from lmsim.viz.figures import PlotError, SweepData, make_figures, supported_kinds


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two rates × four policy settings: rate and cdf plots; llmd logs predictions (error
    plot); two alarm thresholds of lmetric_hotspot (param plot);
    lmetric_hotspot on the hotspot workload with a low alarm threshold (hotspot plot)."""
    root = tmp_path_factory.mktemp("fig")
    raw = tiny_experiment(
        sweep={
            "router.policy": ["vllm", "llmd", "lmetric_hotspot", "lmetric_hotspot"],
            "router.params.min_window_requests": [None, None, 2, 4],
            "workload.rate": [2.0, 4.0],
        },
        zip=[["router.policy", "router.params.min_window_requests"]],
    )
    raw["workload"]["generator"] = {
        "name": "hotspot",
        "params": {"duration_s": 150, "rate": 1.0, "burst_start_min": 1.0, "burst_duration_s": 40,
                   "burst_rate": 2.0, "burst_prefix_tokens": 2000, "max_output_tokens": 200},
    }  # fmt: skip
    exp = write_experiment(root / "exp.yaml", raw)
    assert run_sweep(exp, out=root / "sweep", jobs=2, progress=False).exit_code == 0
    return root / "sweep"


def _mtimes(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if "figures" not in p.parts}


def test_plot_writes_every_kind_without_running(tiny_sweep: Path, tmp_path: Path) -> None:
    before = _mtimes(tiny_sweep)
    data = SweepData(tiny_sweep)
    assert supported_kinds(data) == ["cdf", "rate", "param", "error", "hotspot"]
    written = make_figures(tiny_sweep, formats=("png", "svg"), out=tmp_path / "figs")
    assert sorted(p.name for p in written) == sorted(
        f"{k}.{f}" for k in ("cdf", "rate", "param", "error", "hotspot") for f in ("png", "svg")
    )
    assert all(p.stat().st_size > 1000 for p in written)
    assert _mtimes(tiny_sweep) == before  # only read: no run directory touched


def test_every_kind_draws_readable_axes(tiny_sweep: Path) -> None:
    """Issue 38, on every kind the tiny sweep supports: no two tick labels of an axis touch,
    no line or band gives a log axis a value <= 0, every band lies inside its panel."""
    import matplotlib.pyplot as plt
    from figure_checks import assert_readable

    from lmsim.viz.figures import PLOTTERS

    data = SweepData(tiny_sweep)
    for kind in supported_kinds(data):
        fig = PLOTTERS[kind](data)
        assert_readable(fig)
        plt.close(fig)


def test_plot_cli_default_dir_and_pdf(tiny_sweep: Path) -> None:
    proc = run_cli("plot", str(tiny_sweep), "--kind", "cdf,error", "--format", "pdf")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tiny_sweep / "figures" / "cdf.pdf"), str(tiny_sweep / "figures" / "error.pdf")]


def test_single_run_directory_plots_cdf(tiny_sweep: Path, tmp_path: Path) -> None:
    run = tiny_sweep / "router.policy=vllm,workload.rate=2.0"
    assert supported_kinds(SweepData(run)) == ["cdf"]
    assert [p.name for p in make_figures(run, out=tmp_path)] == ["cdf.png", "cdf.svg", "cdf.pdf"]


def test_unsupported_kind_is_one_line_error(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"router.policy": ["vllm", "lmetric"]}))
    run_sweep(exp, out=tmp_path / "s", progress=False)
    with pytest.raises(PlotError, match="a rate plot needs a sweep over the arrival rate"):
        make_figures(tmp_path / "s", ["rate"])
    for kind, message in [
        ("rate", "a rate plot needs a sweep over the arrival rate"),
        ("error", "no run logged predicted TTFTs"),
        ("hotspot", "no run used lmetric_hotspot"),
        ("param", "a parameter plot needs a numeric swept key"),
        ("bogus", "unknown plot kind 'bogus'"),
    ]:
        proc = run_cli("plot", str(tmp_path / "s"), "--kind", kind)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "s" / "figures").exists()


def test_keys_zipped_with_the_policy_label_lines_not_panels(tmp_path: Path) -> None:
    """The canary's layout: LMetric on 2 instances vs Bailian (lambda 0.5, unset for LMetric)
    on 3 is one panel with two lines, each naming its cluster size and lambda; a key that
    varies independently of the policy (the rate) still makes panels."""
    from lmsim.viz.runs import RunSet

    raw = tiny_experiment(
        sweep={"router.policy": ["lmetric", "bailian"], "router.params.lambda": [None, 0.5],
               "cluster.num_instances": [2, 3], "workload.rate": [2.0, 3.0]},
        zip=[["router.policy", "router.params.lambda", "cluster.num_instances"]],
    )  # fmt: skip
    raw["workload"]["generator"]["params"]["duration_s"] = 8
    exp = write_experiment(tmp_path / "exp.yaml", raw)
    assert run_sweep(exp, out=tmp_path / "s", jobs=1, progress=False).exit_code == 0
    data = RunSet(tmp_path / "s")
    assert data.facet_keys() == ["workload.rate"]
    assert len(data.facets()) == 2
    labels = sorted({data.series_label(row) for _, row in data.index.iterrows()})
    assert labels == ["bailian, lambda=0.5, num_instances=3", "lmetric, num_instances=2"]


def test_as_text_treats_missing_values_alike() -> None:
    import numpy as np
    import pandas as pd

    from lmsim.viz.runs import as_text

    column = pd.Series([np.nan, 0.5, None, np.int64(2), np.float64(1.0), True], dtype=object)
    assert as_text(column).tolist() == ["null", "0.5", "null", "2", "1.0", "true"]
    assert as_text(pd.Series([np.nan, 0.15])).nunique() == 2


def test_a_runs_own_cdf_names_policy_and_load_in_the_policys_colour(tmp_path: Path, monkeypatch) -> None:
    """Issue 24: a run's cdf.png named neither policy nor load and was always blue.
    traces/chatbot under lmetric at load 0.5: the title gives the arrival rate it resolved to."""
    import json

    from matplotlib.colors import to_hex

    import lmsim.viz.run_cdf as run_cdf
    from lmsim.cli import main
    from lmsim.viz.style import policy_style

    drawn = []
    monkeypatch.setattr(run_cdf, "save_figure", lambda fig, path, **kw: drawn.append(fig))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "traces/chatbot", "--set", "workload.limit=40", "--set", "router.policy=lmetric"]) == 0
    (fig,) = drawn
    rate = json.loads((tmp_path / "runs/traces/chatbot/summary.json").read_text())["load_rate_req_s"]
    assert fig._suptitle.get_text() == f"trace-chatbot: lmetric, load 50% of capacity ({rate:.3g} req/s)"
    for ax in fig.axes:
        (line,) = ax.get_lines()
        assert to_hex(line.get_color()) == policy_style("lmetric").color
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["lmetric"]


def test_trace_plot_arrival_rate_does_not_drop_at_the_last_partial_minute(tmp_path: Path, monkeypatch) -> None:
    """Issue 24: 150 requests at 1 per second (t = 0..149 s) are 60 per minute throughout;
    the panel showed the last, 29-second bin's 30 requests as 30 per minute. Its count is
    now divided by its own length: 30 / 29 s = 62.1 per minute."""
    import numpy as np

    import lmsim.cli.trace as trace_cli
    from conftest import make_trace
    from lmsim.cli import main

    edges, rate = trace_cli.arrivals_per_minute(np.arange(150.0))
    assert edges.tolist() == [0.0, 60.0, 120.0, 149.0]
    assert rate.tolist() == pytest.approx([60.0, 60.0, 30 * 60 / 29])
    make_trace(list(np.arange(150.0)), [100] * 150, [10] * 150).save(tmp_path / "t.parquet")
    drawn = []
    monkeypatch.setattr(trace_cli, "save_figure", lambda fig, path, **kw: drawn.append(fig))
    assert main(["trace", "plot", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "t.png")]) == 0
    (step,) = drawn[0].axes[0].patches
    values, drawn_edges, _ = step.get_data()
    assert values.tolist() == pytest.approx(rate.tolist()) and drawn_edges.tolist() == pytest.approx(edges / 60)


def test_latency_axes_switch_to_seconds_and_share_a_scale_type_per_column(tiny_sweep: Path) -> None:
    """Issue 24: millisecond axes ran to "140k ms" and "2000k ms"; TPOT axes were linear in
    one row and log in the next. From 5,000 ms an axis is in seconds (ticks 140, not 140k);
    a column is log in every row when any of its rows spans 1.5 decades; legends at 9 pt."""
    import matplotlib.pyplot as plt

    from lmsim.viz.axes import latency_axis
    from lmsim.viz.figures import _latency_axes, plot_cdf

    fig, (a, b, c, d) = plt.subplots(1, 4)
    assert latency_axis(a, "x", [900.0, 140_000.0]) == "s"
    assert a.xaxis.get_major_formatter()(140_000.0, 0) == "140"
    assert latency_axis(b, "x", [20.0, 4_000.0]) == "ms"
    assert b.xaxis.get_major_formatter()(4_000.0, 0) == "4000"
    _latency_axes([(c, 1, "TPOT", np.array([10.0, 12.0])), (d, 1, "TPOT", np.array([1.0, 500.0]))], "x")
    assert c.get_xscale() == d.get_xscale() == "log" and c.get_xlabel() == "TPOT (ms)"
    plt.close(fig)

    fig = plot_cdf(SweepData(tiny_sweep))
    rows = np.array(fig.axes).reshape(-1, 2)
    assert len(rows) > 1
    for column in rows.T:
        assert len({ax.get_xscale() for ax in column}) == 1
    assert all(t.get_fontsize() == 9 for ax in rows[:, -1] for t in ax.get_legend().get_texts())
    plt.close(fig)


def test_llmd_is_named_oracle_or_deployed_by_its_estimator() -> None:
    """Issue 27: the exact estimator (the default) is "llm-d (oracle)", noise_rel 0.12 (the
    seed's Figure 16) "llm-d (deployed)"; the names say noise_rel, so labels leave it out.
    Any other estimator keeps the policy name and its params."""
    from lmsim.policies.predictive import DEPLOYED_NOISE_REL
    from lmsim.viz.titles import policy_words

    noise = "router.params.noise_rel"
    assert DEPLOYED_NOISE_REL == 0.12
    assert policy_words("llmd", {})[0] == "llm-d (oracle)"
    assert policy_words("llmd", {noise: 0})[0] == "llm-d (oracle)"
    name, said = policy_words("llmd", {noise: 0.12})
    assert name == "llm-d (deployed)" and noise in said
    assert policy_words("llmd", {noise: 0.2}) == ("llmd", set())
    assert policy_words("llmd", {"router.params.estimator_profile": "h20/qwen2-7b"}) == ("llmd", set())
    assert policy_words("llmd", {noise: 0.12, "router.params.in_flight_step": False}) == ("llmd", set())
    assert policy_words("vllm", {}) == ("vllm", set())


def test_llmd_deployed_and_oracle_share_a_colour_not_a_line(tmp_path: Path) -> None:
    """Figures 22/23's layout: llm-d's oracle at seed 0, llm-d as deployed at seeds 0 and 1,
    and noise_rel 0.2. The deployed line is the mean of its two seeds (and says so), in
    llm-d's colour like the oracle's, solid where the oracle's is dashed (label order); a
    parameter plot over noise_rel draws the three as points of one llmd line."""
    from matplotlib.colors import to_hex

    from lmsim.viz.figures import plot_cdf, plot_param
    from lmsim.viz.runs import RunSet
    from lmsim.viz.style import policy_style

    raw = tiny_experiment(
        sweep={"router.policy": ["vllm", "llmd", "llmd", "llmd", "llmd"],
               "router.params.noise_rel": [None, 0.0, 0.12, 0.12, 0.2], "seed": [0, 0, 0, 1, 0]},
        zip=[["router.policy", "router.params.noise_rel", "seed"]],
    )  # fmt: skip
    raw["workload"]["generator"]["params"]["duration_s"] = 8
    exp = write_experiment(tmp_path / "exp.yaml", raw)
    assert run_sweep(exp, out=tmp_path / "s", jobs=1, progress=False).exit_code == 0
    data = RunSet(tmp_path / "s")
    labels = sorted({data.series_label(row) for _, row in data.index.iterrows()})
    assert labels == ["llm-d (deployed)", "llm-d (oracle)", "llmd, noise_rel=0.2", "vllm"]
    ax = plot_cdf(data).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"vllm", "llm-d (deployed), 2 seeds", "llm-d (oracle)", "llmd, noise_rel=0.2"}
    deployed, oracle = lines["llm-d (deployed), 2 seeds"], lines["llm-d (oracle)"]
    assert to_hex(deployed.get_color()) == to_hex(oracle.get_color()) == policy_style("llmd").color
    assert (deployed.get_linestyle(), oracle.get_linestyle()) == ("-", "--")
    ax = plot_param(data, "router.params.noise_rel").axes[0]
    (llmd,) = [line for line in ax.get_lines() if line.get_label().startswith("llmd")]
    assert list(llmd.get_xdata()) == [0.0, 0.12, 0.2]


def test_a_profile_given_by_path_is_named_by_its_gpu_and_model(tmp_path: Path) -> None:
    """Issue 35: a figure of a run whose `cluster.profile` was a folder (`mine/custom`, a copy
    of h20/qwen3-30b-a3b) was titled "custom on MINE", by the folder. The title now says what
    the profile records: its name h20/qwen3-30b-a3b, else its hardware.gpu and model.name; a
    path that no longer exists is named by its last two folders when they read as gpu/model."""
    import shutil

    import yaml

    from lmsim.shipped import PROFILES_DIR
    from lmsim.viz.titles import model_words

    copy = tmp_path / "mine" / "custom"
    shutil.copytree(PROFILES_DIR / "h20" / "qwen3-30b-a3b", copy)
    assert model_words(str(copy)) == "Qwen3-30B-A3B on H20"
    assert model_words(str(copy / "profile.yaml")) == "Qwen3-30B-A3B on H20"
    raw = yaml.safe_load((copy / "profile.yaml").read_text())
    raw["name"] = "my tuned profile"
    (copy / "profile.yaml").write_text(yaml.safe_dump(raw))
    assert model_words(str(copy)) == "Qwen3-30B-A3B on NVIDIA H20 96GB"
    assert model_words("/moved/away/h100/llama-3-8b") == "Llama-3-8B on H100"
    assert model_words("/moved/away/custom") == "profile custom"
    assert model_words("h20/qwen2-7b") == "Qwen2-7B on H20"  # a bundled name stays a name
