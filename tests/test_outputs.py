"""No command deletes or overwrites what it did not write (the refusals themselves are in
tests/bad_inputs/): what each writer does replace, the default run directory rule, figures,
reports and tables recognised as lmsim's own, and data writes confined to a source checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_sweep import tiny_experiment, write_experiment

from lmsim.cli import main
from lmsim.errors import ConfigError
from lmsim.outputs import check_output_file, is_signed_figure

RUN = ["--no-figure", "--set", "workload.limit=20"]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_run_without_out_never_replaces_another_configuration(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", *RUN]) == 0
    first = (tmp_path / "runs/quickstart/requests.parquet").read_bytes()
    # a different configuration goes to the next free name, the first run is kept
    assert main(["run", "quickstart", "--no-figure", "--set", "workload.limit=30"]) == 0
    assert (tmp_path / "runs/quickstart/requests.parquet").read_bytes() == first
    assert _summary(tmp_path / "runs/quickstart-2")["num_requests"] == 30
    # the same configuration again replaces its own earlier run (same results by construction)
    assert main(["run", "quickstart", *RUN]) == 0
    assert not (tmp_path / "runs/quickstart-3").exists()
    assert "run directory: runs/quickstart " in capsys.readouterr().out
    # something of the user's at the default path is stepped around, never touched
    (tmp_path / "runs/mine").mkdir()
    (tmp_path / "runs/mine/notes.txt").write_text("mine")
    assert main(["run", "quickstart", *RUN, "--set", "output.dir=runs/mine"]) == 0
    assert (tmp_path / "runs/mine/notes.txt").read_text() == "mine"
    assert _summary(tmp_path / "runs/mine-2")["num_requests"] == 20
    # --overwrite without --out replaces the default run whatever its configuration
    assert main(["run", "quickstart", "--no-figure", "--set", "workload.limit=25", "--overwrite"]) == 0
    assert _summary(tmp_path / "runs/quickstart")["num_requests"] == 25
    assert not (tmp_path / "runs/quickstart-3").exists()


def test_run_out_replaces_an_earlier_run_only_with_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", *RUN, "--out", "r"]) == 0
    before = (tmp_path / "r/summary.json").read_bytes()
    assert main(["run", "quickstart", *RUN, "--out", "r"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lmsim: error: r: a finished run is already there; pass --overwrite to replace it"
    )
    assert (tmp_path / "r/summary.json").read_bytes() == before
    assert main(["run", "quickstart", "--no-figure", "--set", "workload.limit=10", "--out", "r", "--overwrite"]) == 0
    assert _summary(tmp_path / "r")["num_requests"] == 10
    assert json.loads((tmp_path / "r/lmsim.json").read_text())["kind"] == "run"


def test_sweep_marks_its_directory_and_resumes_it(tmp_path, monkeypatch):
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"workload.rate": [2.0]}))
    assert main(["sweep", str(exp), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "s/lmsim.json").read_text())["kind"] == "sweep"
    assert main(["sweep", str(exp), "--out", str(tmp_path / "s"), "--no-progress"]) == 0  # resumed
    # an lmsim run directory is not a sweep directory, and the reverse
    assert main(["run", str(exp), "--out", str(tmp_path / "s"), "--set", "sweep=null", "--overwrite"]) == 2


@pytest.fixture(scope="module")
def one_run_sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    exp = write_experiment(root / "exp.yaml", tiny_experiment(sweep={"workload.rate": [2.0, 4.0]}))
    assert main(["sweep", str(exp), "--out", str(root / "s"), "--no-progress"]) == 0
    return root / "s"


def test_plot_replaces_its_own_figures_and_refuses_the_users(one_run_sweep, capsys):
    assert main(["plot", str(one_run_sweep), "--kind", "rate"]) == 0
    figure = one_run_sweep / "figures" / "rate.png"
    assert is_signed_figure(figure)
    assert main(["plot", str(one_run_sweep), "--kind", "rate", "--format", "png,svg,pdf"]) == 0
    assert all(is_signed_figure(one_run_sweep / "figures" / f"rate.{f}") for f in ("png", "svg", "pdf"))
    figure.write_bytes(b"\x89PNG\r\n\x1a\nmy own drawing")
    capsys.readouterr()
    assert main(["plot", str(one_run_sweep), "--kind", "rate"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"lmsim: error: {figure}: file exists and was not written by lmsim; pass --overwrite to replace it"
    )
    assert figure.read_bytes() == b"\x89PNG\r\n\x1a\nmy own drawing"
    assert main(["plot", str(one_run_sweep), "--kind", "rate", "--overwrite"]) == 0
    assert is_signed_figure(figure)


def test_report_replaces_its_own_page_and_refuses_the_users(one_run_sweep, tmp_path, capsys):
    page = one_run_sweep / "report.html"
    assert main(["report", str(one_run_sweep)]) == 0
    assert main(["report", str(one_run_sweep)]) == 0  # its own page is replaced freely
    mine = tmp_path / "index.html"
    mine.write_text("<html>my page</html>")
    capsys.readouterr()
    assert main(["report", str(one_run_sweep), "--out", str(mine)]) == 2
    assert "file exists and was not written by lmsim" in capsys.readouterr().err
    assert mine.read_text() == "<html>my page</html>"
    assert page.exists()


def test_trace_outputs_replace_their_own_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["trace", "generate", "chatbot", "--seed", "0", "--param", "duration_s=5", "--out", "t.parquet"]
    assert main(args) == 0
    assert main(args) == 0  # a canonical trace lmsim wrote
    assert main(["trace", "plot", "t.parquet"]) == 0
    assert is_signed_figure(tmp_path / "t.png")  # in the working directory, not beside the trace
    assert main(["trace", "plot", "t.parquet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet", "t.png"]


def test_profile_plot_writes_into_the_working_directory(tmp_path, monkeypatch):
    from lmsim.shipped import PROFILES_DIR

    shipped = sorted(PROFILES_DIR.rglob("*"))
    stamps = {p: p.stat().st_mtime_ns for p in shipped}
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "plot", "h20/qwen3-30b-a3b"]) == 0
    assert is_signed_figure(tmp_path / "h20-qwen3-30b-a3b.png")
    assert sorted(PROFILES_DIR.rglob("*")) == shipped
    assert {p: p.stat().st_mtime_ns for p in shipped} == stamps


def test_profile_generate_replaces_its_own_profile(tmp_path):
    args = ["profile", "generate", "--only", "h20/qwen2-7b", "--no-plot", "--out", str(tmp_path)]
    assert main(args) == 0
    assert main(args) == 0
    profile = yaml.safe_load((tmp_path / "h20/qwen2-7b/profile.yaml").read_text())
    assert profile["name"] == "h20/qwen2-7b"


def test_shipped_data_is_written_only_from_a_source_checkout(tmp_path, monkeypatch, capsys):
    import lmsim.cli.capacity as capacity_cli
    from lmsim.shipped import check_source_checkout

    installed = tmp_path / "lib/python3.11/site-packages/lmsim/data/experiments/capacity.json"
    installed.parent.mkdir(parents=True)
    installed.write_text("{}\n")
    monkeypatch.setattr(capacity_cli, "BUNDLED_PATH", installed)
    assert main(["capacity", "--bundle", "quickstart"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"lmsim: error: capacity --bundle: {installed} belongs to the installed lmsim package; "
        "run it from a source checkout (pip install -e .)"
    )
    assert installed.read_text() == "{}\n"
    checkout = tmp_path / "src/lmsim/data/experiments/capacity.json"
    checkout.parent.mkdir(parents=True)
    checkout.write_text("{}\n")
    check_source_checkout(checkout, "capacity --bundle")  # writable, not installed: allowed


def test_bench_json_recognises_its_own_table(tmp_path):
    from lmsim.cli.bench import is_bench_json

    own = tmp_path / "b.json"
    own.write_text(json.dumps([{"workload": "chatbot", "policy": "vllm", "num_requests": 10}]))
    check_output_file(own, ours=is_bench_json)  # replaced without --overwrite
    for text in ('{"my": "results"}', "[]", "not json"):
        own.write_text(text)
        with pytest.raises(ConfigError, match="was not written by lmsim"):
            check_output_file(own, ours=is_bench_json)


def test_save_run_never_removes_a_foreign_temporary_lookalike(tmp_path, monkeypatch):
    import os

    from conftest import make_trace, simulate
    from lmsim.study.rundir import save_run

    lookalike = tmp_path / f".run.tmp-{os.getpid()}"
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="was not written by lmsim"):
        save_run(simulate(make_trace([0.0], [40], [2])), tmp_path / "run", figure=False)
    assert (lookalike / "notes.txt").read_text() == "mine"


def test_output_dir_in_the_yaml_may_not_be_the_working_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", *RUN, "--set", "output.dir=."]) == 2
    assert capsys.readouterr().err.strip() == (
        "lmsim: error: .: is the working directory or one of its parents; name a new output directory"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_rerun_after_plot_and_report_replaces_the_run_with_what_lmsim_drew_from_it(tmp_path, monkeypatch, capsys):
    """Issue 24, the newcomer's loop: run -> plot -> report -> the same run again, with and
    without --overwrite. The figures and the report were drawn by lmsim from the run, so
    they are lmsim's to replace along with it; a file of the user's still stops the run."""
    monkeypatch.chdir(tmp_path)
    run = ["run", "traces/chatbot", "--set", "workload.limit=30"]
    out = tmp_path / "runs/traces/chatbot"
    assert main(run) == 0
    assert main(["plot", "runs/traces/chatbot"]) == 0
    assert main(["report", "runs/traces/chatbot"]) == 0
    assert (out / "figures/cdf.png").exists() and (out / "report.html").exists()
    capsys.readouterr()
    assert main(run) == 0, capsys.readouterr().err
    assert "run directory: runs/traces/chatbot " in capsys.readouterr().out
    assert not (tmp_path / "runs/traces/chatbot-2").exists()
    # what was drawn from the replaced results goes with them
    assert not (out / "figures").exists() and not (out / "report.html").exists()
    assert main(["plot", "runs/traces/chatbot"]) == 0
    assert main(["report", "runs/traces/chatbot"]) == 0
    assert main([*run, "--overwrite"]) == 0, capsys.readouterr().err
    assert main(["plot", "runs/traces/chatbot", "--out", "runs/traces/chatbot/more"]) == 0
    assert main(["report", "runs/traces/chatbot", "--out", "runs/traces/chatbot/page.html"]) == 0
    assert main(["compare", "runs/traces/chatbot", "--out", "runs/traces/chatbot/cmp"]) == 0
    assert main([*run, "--out", "runs/traces/chatbot", "--overwrite"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["cdf.png", "config.yaml", "instances.parquet", "lmsim.json", "requests.parquet",
         "router_events.parquet", "summary.json"]
    )  # fmt: skip

    # a file of the user's among lmsim's figures, or beside them, is never touched
    assert main(["plot", "runs/traces/chatbot"]) == 0
    (out / "figures/mine.png").write_bytes(b"\x89PNG\r\n\x1a\nmy own drawing")
    capsys.readouterr()
    assert main([*run, "--overwrite"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lmsim: error: runs/traces/chatbot: holds files lmsim did not write (figures/mine.png); "
        "remove them or choose another --out"
    )
    assert (out / "figures/mine.png").read_bytes() == b"\x89PNG\r\n\x1a\nmy own drawing"
    (out / "figures/mine.png").unlink()
    (out / "notes.txt").write_text("mine")
    assert main([*run, "--overwrite"]) == 2
    assert "holds files lmsim did not write (notes.txt)" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").rename(out / ".notes")  # hidden is no less the user's
    assert main([*run, "--overwrite"]) == 2
    assert "holds files lmsim did not write (.notes)" in capsys.readouterr().err
    assert (out / ".notes").read_text() == "mine"
    assert (out / "figures/cdf.png").exists()


def test_sweep_resume_and_overwrite_after_plot_and_report(tmp_path, capsys):
    """The loop on a sweep: sweep -> plot (the sweep's and one run's) -> report -> the same
    sweep (resumed, nothing rerun) -> the sweep with a changed config and --overwrite (its
    runs replaced, the figures drawn inside a run going with it)."""
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"workload.rate": [2.0, 4.0]}))
    out = tmp_path / "s"
    sweep = ["sweep", str(exp), "--out", str(out), "--no-progress"]
    assert main(sweep) == 0
    assert main(["plot", str(out)]) == 0
    assert main(["plot", str(out / "workload.rate=2.0")]) == 0
    assert main(["report", str(out)]) == 0
    capsys.readouterr()
    assert main(sweep) == 0
    assert "2 already complete, 0 to run" in capsys.readouterr().out
    assert main([*sweep, "--set", "seed=1"]) == 2
    assert "2 finished runs were made from another configuration" in capsys.readouterr().err
    assert main([*sweep, "--set", "seed=1", "--overwrite"]) == 0
    assert "0 already complete, 2 to run" in capsys.readouterr().out
    assert not (out / "workload.rate=2.0/figures").exists()
    assert (out / "figures/cdf.png").exists() and (out / "report.html").exists()
    assert main(["report", str(out)]) == 0
