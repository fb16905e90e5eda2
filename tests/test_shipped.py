"""What ships, seen by an installed user from any directory (issue 24): `lmsim list ...`,
bundled names accepted where a path is, the known names on a typo, `lmsim policies [NAME]`
in whole sentences, and the paper scripts writing under the working directory."""

from __future__ import annotations

import inspect
import os
import stat
import subprocess
from pathlib import Path

import pytest

from lmsim.cli import main
from lmsim.cli.listing import first_paragraph
from lmsim.shipped import EXPERIMENTS_DIR, bundled_experiment_names


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """An empty working directory outside the checkout, as after `pip install lmsim`."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("what", "expected"), [
    ("experiments", ["quickstart ", "traces/chatbot ", "paper/fig22 ", "sweep: TTFT/TPOT CDFs of all policies"]),
    ("profiles", ["h20/qwen3-30b-a3b ", " on NVIDIA H20 96GB"]),
    ("traces", ["kimi_conversation_sample ", "1,000 requests (kimi_conversation_sample.parquet)"]),
    ("policies", ["lmetric ", "vllm "]),
    ("generators", ["chatbot ", "Multi-turn chat sessions.", "coder "]),
    ("autoscalers", ["hpa ", "sla_planner ", "schedule ", "params: metric, target, tolerance=0.1"]),
])  # fmt: skip
def test_list_names_what_ships(elsewhere, capsys, what, expected) -> None:
    assert main(["list", what]) == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out, (text, out)


def test_every_bundled_experiment_is_listed(elsewhere, capsys) -> None:
    assert main(["list", "experiments"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if not line.startswith((" ", "("))}
    from lmsim.cli.listing import INTERNAL_EXPERIMENTS

    # every bundled experiment but those only `lmsim bench` runs
    expected = {n for n in bundled_experiment_names() if not n.startswith(INTERNAL_EXPERIMENTS)}
    assert listed == expected
    assert len(listed) + len(list((EXPERIMENTS_DIR / "bench").rglob("*.yaml"))) == len(list(EXPERIMENTS_DIR.rglob("*.yaml")))


def test_a_bundled_trace_name_works_where_a_path_does(elsewhere, capsys) -> None:
    assert main(["trace", "stats", "kimi_conversation_sample"]) == 0
    assert "1000" in capsys.readouterr().out.replace(",", "")
    assert main(["trace", "stats", "traces/kimi_conversation_sample.parquet", "--json"]) == 0
    capsys.readouterr()
    assert main(["run", "quickstart", "--no-figure", "--set", "workload.limit=20",
                 "--set", "workload.trace=kimi_conversation_sample"]) == 0  # fmt: skip
    assert sorted(p.name for p in elsewhere.iterdir()) == ["runs"]


def test_an_unknown_experiment_lists_the_bundled_names_on_one_line(elsewhere, capsys) -> None:
    assert main(["run", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("lmsim: error: nosuch: experiment file not found, nor a bundled experiment (")
    for name in ("quickstart", "traces/chatbot", "paper/fig22"):
        assert name in err


def test_policies_never_cut_a_description_mid_sentence(capsys) -> None:
    """`lmsim policies` printed each docstring's first line: "Bailian's production score:",
    "The paper's "simulation-based" llm-d: estimate each". It prints the whole first
    paragraph (wrapped), and `lmsim policies NAME` the whole description."""
    from lmsim.policies import POLICIES

    assert main(["policies"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in POLICIES.names():
        summary = first_paragraph(inspect.getdoc(POLICIES.get(name)) or "")
        assert summary.endswith("."), (name, summary)
        assert summary in out, name
    assert "`score_i = λ·(1 − hit_i) + (1 − λ)·norm(BS_i)`, routed to the minimum" in out

    assert main(["policies", "bailian"]) == 0
    full = capsys.readouterr().out
    last = inspect.getdoc(POLICIES.get("bailian")).strip().splitlines()[-1].strip()
    assert last in full and "params: lambda=0.7" in full
    assert main(["policies", "bailan"]) == 2
    assert "did you mean 'bailian'?" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["reproduce.sh", "reproduce_reduced.sh"])
def test_paper_scripts_write_under_the_working_directory(tmp_path, script) -> None:
    """Run from an installed package, the scripts cd'd beside themselves and would have
    written runs/paper inside site-packages. With `lmsim` and `python` replaced by stubs
    that log where they run, every command runs in the caller's directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("lmsim", "python"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\necho "$(pwd) {tool} $*" >> {log}\n')
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    work = tmp_path / "work"
    (work / "runs/paper-reduced").mkdir(parents=True)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(EXPERIMENTS_DIR / "paper" / script)], cwd=work, env=env,
                   capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    calls = log.read_text().splitlines()
    assert calls and all(line.startswith(f"{work} ") for line in calls), calls
    sweeps = [line for line in calls if " lmsim sweep " in line]
    assert sweeps and all(f" {EXPERIMENTS_DIR / 'paper'}/" in line for line in sweeps), sweeps
