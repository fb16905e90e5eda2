"""Sweep expansion, naming, resume, failures, bad input and the executors (lmsim/study/expand.py, execute.py, index.py).

The helpers at the top are shared with the other sweep/figure/report test modules
(`from test_sweep import ...`): a tiny chat workload on two linear-cost instances, so a run
takes a fraction of a second.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from lmsim.errors import LmsimError
from lmsim.study.execute import run_sweep
from lmsim.study.expand import SweepError, expand_sweep, point_name
from lmsim.study.index import WALL_CLOCK_COLUMNS, read_index

LINEAR_PROFILE = {
    "kind": "linear",
    "step_base_s": 0.010,
    "per_prefill_token_s": 0.00002,
    "per_decode_seq_s": 0.0002,
    "per_context_token_s": 0.0,
}


def tiny_experiment(**sweep_block: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "tiny",
        "seed": 0,
        "workload": {
            "generator": {"name": "chatbot", "params": {"duration_s": 20, "warmup_s": 30, "rate": 3.0}},
        },
        "cluster": {"num_instances": 2, "profile": dict(LINEAR_PROFILE), "num_gpu_blocks": 4000},
        "router": {"policy": "vllm"},
        "output": {"figures": False},
    }
    raw.update(sweep_block)
    return raw


def write_experiment(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def comparable(index: pd.DataFrame) -> pd.DataFrame:
    return index.drop(columns=[c for c in WALL_CLOCK_COLUMNS if c in index]).reset_index(drop=True)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmsim", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


FOUR_RUNS = {"sweep": {"router.policy": ["vllm", "lmetric"], "workload.rate": [2.0, 4.0]}}


# -- expansion ---------------------------------------------------------------------------


def test_product_expansion_names_and_configs() -> None:
    raw = tiny_experiment(**copy.deepcopy(FOUR_RUNS))
    points = expand_sweep(raw, where="x.yaml")
    assert [p.name for p in points] == [
        "router.policy=vllm,workload.rate=2.0",
        "router.policy=vllm,workload.rate=4.0",
        "router.policy=lmetric,workload.rate=2.0",
        "router.policy=lmetric,workload.rate=4.0",
    ]
    base = tiny_experiment()
    for p, (policy, rate) in zip(points, [("vllm", 2.0), ("vllm", 4.0), ("lmetric", 2.0), ("lmetric", 4.0)]):
        want = copy.deepcopy(base)
        want["router"]["policy"] = policy
        want["workload"]["rate"] = rate
        assert p.raw == want  # sweep/zip stripped, exactly the point applied
        assert p.params == {"router.policy": policy, "workload.rate": rate}


def test_zip_expansion_varies_keys_together_and_null_unsets() -> None:
    raw = tiny_experiment(
        sweep={
            "router.policy": ["vllm", "bailian", "aibrix"],
            "seed": [0, 1],
            "router.params.lambda": [None, 0.5, None],
            "router.params.imbalance_abs_count": [None, None, 4],
        },
        zip=[["router.policy", "router.params.lambda", "router.params.imbalance_abs_count"]],
    )
    points = expand_sweep(raw, where="x.yaml")
    assert [p.name for p in points] == [
        "router.policy=vllm,seed=0",
        "router.policy=vllm,seed=1",
        "router.policy=bailian,router.params.lambda=0.5,seed=0",
        "router.policy=bailian,router.params.lambda=0.5,seed=1",
        "router.policy=aibrix,router.params.imbalance_abs_count=4,seed=0",
        "router.policy=aibrix,router.params.imbalance_abs_count=4,seed=1",
    ]
    assert [p.raw["router"] for p in points[::2]] == [
        {"policy": "vllm"},
        {"policy": "bailian", "params": {"lambda": 0.5}},
        {"policy": "aibrix", "params": {"imbalance_abs_count": 4}},
    ]
    assert [p.raw["seed"] for p in points] == [0, 1, 0, 1, 0, 1]


def test_names_are_sanitised_and_long_names_hashed() -> None:
    assert point_name({"cluster.profile": "h20/qwen2-7b"}) == "cluster.profile=h20-qwen2-7b"
    assert point_name({"a": True, "b": 1e-05, "c": None}) == "a=true,b=1e-05"
    long = point_name({"workload.generator.params.duration_s": 1.5, "router.params": {"x" * 120: 1}})
    assert len(long) == 120 and long[-9] == "~"
    assert long == point_name({"workload.generator.params.duration_s": 1.5, "router.params": {"x" * 120: 1}})
    raw = tiny_experiment(sweep={"name": ["a/b", "a-b"]})
    names = [p.name for p in expand_sweep(raw, where="x.yaml")]
    assert len(set(names)) == 2 and all(n.startswith("name=a-b~") for n in names)


def test_no_sweep_block_is_one_default_point() -> None:
    points = expand_sweep(tiny_experiment(), where="x.yaml")
    assert [p.name for p in points] == ["default"]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"sweep": {"router.polcy": ["vllm"]}}, "x.yaml: sweep key 'router.polcy': unknown key 'router.polcy'"),
        ({"sweep": {"workload.rate": []}}, "x.yaml: sweep.workload.rate: empty list"),
        ({"sweep": {"workload.rate": 3}}, "x.yaml: sweep.workload.rate: expected a list"),
        ({"sweep": {"seed.x": [1]}}, "x.yaml: sweep key 'seed.x': seed is not a mapping"),
        ({"sweep": {"router.params.lamda": [0.5]}, "router": {"policy": "bailian"}},
         "x.yaml [router.params.lamda=0.5]: router.params: policy 'bailian' has no parameter 'lamda'"),
        ({"sweep": {"workload.rate": [-1.0]}}, "x.yaml [workload.rate=-1.0]: workload.rate:"),
        ({"sweep": {"seed": [1, 2], "workload.rate": [1.0]}, "zip": [["seed", "workload.rate"]]},
         "x.yaml: zip[0]: zipped lists differ in length"),
        ({"sweep": {"seed": [1]}, "zip": [["seed", "workload.rate"]]},
         "x.yaml: zip[0]: 'workload.rate' is not a key of sweep:"),
    ],
)
def test_bad_sweep_blocks_name_file_and_key(block: dict[str, Any], message: str) -> None:
    raw = tiny_experiment()
    raw.update(block)
    with pytest.raises(LmsimError) as info:
        expand_sweep(raw, where="x.yaml")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


# -- running -----------------------------------------------------------------------------


def test_sweep_runs_indexes_and_resumes(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(**copy.deepcopy(FOUR_RUNS)))
    full = run_sweep(exp, out=tmp_path / "full", progress=False)
    assert full.exit_code == 0 and len(full.executed) == 4 and full.skipped == []
    index = read_index(tmp_path / "full")
    assert list(index["run"]) == sorted(p.name for p in full.points)
    assert list(index["router.policy"]) == ["lmetric", "lmetric", "vllm", "vllm"]
    assert list(index["workload.rate"]) == [2.0, 4.0, 2.0, 4.0]
    assert index.attrs["sweep_keys"] == ["router.policy", "workload.rate"]
    assert {"ttft_s_mean", "tpot_s_p99", "num_finished", "offered_rate_per_s"} <= set(index.columns)
    assert index["offered_rate_per_s"].round(9).tolist() == [2.0, 4.0, 2.0, 4.0]

    # Kill after k = 1 of n = 4 (KeyboardInterrupt from the callback takes the SIGINT path),
    # with a half-written run lying around as a dying worker would leave it.
    def stop(_result: dict[str, Any]) -> None:
        raise KeyboardInterrupt

    part = tmp_path / "part"
    first = run_sweep(exp, out=part, progress=False, on_result=stop)
    assert first.interrupted == 2 and first.exit_code == 130 and len(first.executed) == 1
    assert len(read_index(part)) == 1
    done = first.executed[0]
    marker = (part / done / "summary.json").stat().st_mtime_ns
    # what a run killed mid-save leaves: its temporary directory, marked as lmsim's first
    partial = part / ".router.policy=vllm,workload.rate=4.0.tmp-99999"
    partial.mkdir()
    (partial / "lmsim.json").write_text('{"kind": "run"}\n')
    (partial / "requests.parquet").write_text("half")
    # a folder of the user's that merely looks like one is not lmsim's to clean up
    lookalike = part / ".router.policy=vllm,workload.rate=2.0.tmp-1"
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("mine")

    second = run_sweep(exp, out=part, progress=False)
    assert second.skipped == [done]
    assert sorted(second.executed) == sorted(set(p.name for p in full.points) - {done})  # n - k runs
    assert (part / done / "summary.json").stat().st_mtime_ns == marker  # finished runs untouched
    assert [e.name for e in part.iterdir() if ".tmp-" in e.name] == [lookalike.name]
    assert (lookalike / "notes.txt").read_text() == "mine"
    pd.testing.assert_frame_equal(comparable(read_index(part)), comparable(index))

    third = run_sweep(exp, out=part, progress=False)
    assert third.executed == [] and len(third.skipped) == 4


def test_requests_are_byte_identical_across_sweeps(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"router.policy": ["lmetric"]}))
    run_sweep(exp, out=tmp_path / "a", progress=False)
    run_sweep(exp, out=tmp_path / "b", jobs=2, progress=False)
    name = "router.policy=lmetric"
    assert (tmp_path / "a" / name / "requests.parquet").read_bytes() == (
        tmp_path / "b" / name / "requests.parquet"
    ).read_bytes()


def _stamps(out: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/summary.json")}


def test_a_changed_base_config_goes_to_a_new_folder_or_needs_overwrite(tmp_path: Path, monkeypatch) -> None:
    """Issue 24: a sweep whose base config changed replaced its finished runs, saying only
    "(2 complete runs have a changed config and rerun)". Now, as `run` does, the default
    folder moves on to `-2`; a named --out refuses, naming the difference; --overwrite
    replaces them."""
    monkeypatch.chdir(tmp_path)
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"workload.rate": [2.0, 4.0]}))
    first = run_sweep(exp, progress=False)
    assert first.out == tmp_path / "runs/tiny" and len(first.executed) == 2
    stamps = _stamps(tmp_path / "runs/tiny")

    moved = run_sweep(exp, ["seed=1"], progress=False)
    assert moved.out == tmp_path / "runs/tiny-2" and len(moved.executed) == 2
    assert _stamps(tmp_path / "runs/tiny") == stamps
    assert run_sweep(exp, ["seed=1"], progress=False).out == tmp_path / "runs/tiny-2"  # resumed there
    assert run_sweep(exp, progress=False).out == tmp_path / "runs/tiny"

    with pytest.raises(SweepError) as info:
        run_sweep(exp, ["seed=2"], out="runs/tiny", progress=False)
    assert str(info.value) == (
        "runs/tiny: 2 finished runs were made from another configuration (workload.rate=2.0: "
        "seed 0 -> 2); pass --overwrite to replace them, or choose another --out"
    )
    assert _stamps(tmp_path / "runs/tiny") == stamps

    again = run_sweep(exp, ["seed=2"], out="runs/tiny", overwrite=True, progress=False)
    assert sorted(again.stale) == sorted(again.executed) == ["workload.rate=2.0", "workload.rate=4.0"]
    assert len(read_index(tmp_path / "runs/tiny")) == 2


def test_points_of_an_earlier_extension_stay_in_the_index(tmp_path: Path) -> None:
    """Points an earlier, longer sweep ran (same base config) stay complete in the folder;
    they stay in sweep.parquet and sweep.yaml too instead of silently dropping out."""
    exp = tmp_path / "exp.yaml"
    out = tmp_path / "s"
    write_experiment(exp, tiny_experiment(sweep={"workload.rate": [2.0, 4.0, 8.0]}))
    run_sweep(exp, out=out, progress=False)
    write_experiment(exp, tiny_experiment(sweep={"workload.rate": [2.0, 4.0]}))
    shorter = run_sweep(exp, out=out, progress=False)
    assert shorter.executed == [] and len(shorter.skipped) == 2 and shorter.earlier == ["workload.rate=8.0"]
    index = read_index(out)
    assert list(index["run"]) == ["workload.rate=2.0", "workload.rate=4.0", "workload.rate=8.0"]
    assert list(index["workload.rate"]) == [2.0, 4.0, 8.0]
    spec = yaml.safe_load((out / "sweep.yaml").read_text())
    assert [p["name"] for p in spec["points"]] == ["workload.rate=2.0", "workload.rate=4.0", "workload.rate=8.0"]

    # an axis that no longer exists: the kept point's value comes from its own config
    write_experiment(exp, tiny_experiment(sweep={"router.policy": ["vllm"]}, workload={
        **tiny_experiment()["workload"], "rate": 4.0}))  # fmt: skip
    run_sweep(exp, out=out, progress=False)
    index = read_index(out).set_index("run")
    assert index.loc["workload.rate=2.0", "router.policy"] == "vllm"
    assert index.loc["router.policy=vllm", "workload.rate"] == 4.0

    # --overwrite on the same base config: the points this sweep no longer gives go, so a
    # changed zipped value (say Bailian's lambda beside a trace still swept) is not averaged
    # with the new one in the index
    write_experiment(exp, tiny_experiment(sweep={"workload.rate": [2.0, 4.0]}))
    trimmed = run_sweep(exp, out=out, overwrite=True, progress=False)
    assert trimmed.executed == [] and trimmed.earlier == []
    assert sorted(trimmed.removed) == ["router.policy=vllm", "workload.rate=8.0"]
    assert list(read_index(out)["run"]) == ["workload.rate=2.0", "workload.rate=4.0"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["workload.rate=2.0", "workload.rate=4.0"]

    # with --overwrite, runs the new configuration does not give are removed, and said so
    write_experiment(exp, tiny_experiment(sweep={"workload.rate": [2.0]}))
    replaced = run_sweep(exp, ["seed=3"], out=out, overwrite=True, progress=False)
    assert replaced.stale == ["workload.rate=2.0"]
    assert sorted(replaced.removed) == ["workload.rate=4.0"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["workload.rate=2.0"]
    assert list(read_index(out)["run"]) == ["workload.rate=2.0"]


def test_overwrite_never_replaces_a_run_holding_the_users_files(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"workload.rate": [2.0]}))
    run_sweep(exp, out=tmp_path / "s", progress=False)
    notes = tmp_path / "s/workload.rate=2.0/notes.txt"
    notes.write_text("mine")
    with pytest.raises(LmsimError, match=r"workload.rate=2.0: holds files lmsim did not write \(notes.txt\)"):
        run_sweep(exp, ["seed=1"], out=tmp_path / "s", overwrite=True, progress=False)
    assert notes.read_text() == "mine"


def test_failing_run_is_reported_and_others_finish(tmp_path: Path) -> None:
    # The generator checks duration_s only when it generates, i.e. inside the run.
    raw = tiny_experiment(sweep={"workload.generator.params.duration_s": [20, -1, 10]})
    exp = write_experiment(tmp_path / "exp.yaml", raw)
    outcome = run_sweep(exp, out=tmp_path / "s", jobs=2, progress=False)
    bad = "workload.generator.params.duration_s=-1"
    assert sorted(outcome.executed) == [
        "workload.generator.params.duration_s=10",
        "workload.generator.params.duration_s=20",
    ]
    assert outcome.failed == {bad: "ConfigError: duration_s must be > 0, got -1"}
    assert outcome.exit_code == 1
    assert (tmp_path / "s" / f"{bad}.error.txt").exists()
    assert list(read_index(tmp_path / "s")["run"]) == sorted(outcome.executed)


def test_cli_bad_input_is_one_line_and_touches_nothing(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"workload.rate": [2.0]}))
    out = tmp_path / "s"
    assert run_cli("sweep", str(exp), "--out", str(out), "--no-progress").returncode == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    cases = [
        ["--set", "sweep={router.polcy: [vllm]}"],
        ["--set", "sweep={workload.rate: []}"],
        ["--executor", "dask", "--scheduler", "tcp://127.0.0.1:9"],
    ]
    for extra in cases:
        proc = run_cli("sweep", str(exp), "--out", str(out), "--no-progress", *extra)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lmsim: error: "), proc.stderr
    if importlib.util.find_spec("distributed") is not None:
        assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in proc.stderr
    else:  # without the dask extra the same command names what to install
        assert "--executor dask needs dask[distributed] (pip install 'lmsim[dask]')" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_scheduler_needs_dask_executor(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment())
    with pytest.raises(SweepError, match="--scheduler needs --executor dask"):
        run_sweep(exp, out=tmp_path / "s", scheduler="tcp://127.0.0.1:9", progress=False)


def test_seeds_repeat_every_point_and_index_keeps_the_seed(tmp_path: Path) -> None:
    raw = tiny_experiment(sweep={"router.policy": ["vllm", "lmetric"]}, seeds=[0, 3])
    points = expand_sweep(raw, where="x.yaml")
    assert [p.name for p in points] == [
        "router.policy=vllm,seed=0", "router.policy=vllm,seed=3",
        "router.policy=lmetric,seed=0", "router.policy=lmetric,seed=3",
    ]
    assert [p.raw["seed"] for p in points] == [0, 3, 0, 3]
    assert all("seeds" not in p.raw for p in points)
    exp = write_experiment(tmp_path / "exp.yaml", raw)
    assert run_sweep(exp, out=tmp_path / "out", progress=False).exit_code == 0
    index = read_index(tmp_path / "out")
    assert index.attrs["sweep_keys"] == ["router.policy", "seed"]
    assert sorted(index["seed"].tolist()) == [0, 0, 3, 3]
    # Another seed draws another workload: the repeats are not copies of one run.
    vllm = index[index["router.policy"] == "vllm"].set_index("seed")
    assert vllm.loc[0, "num_finished"] != vllm.loc[3, "num_finished"] or (
        vllm.loc[0, "ttft_s_mean"] != vllm.loc[3, "ttft_s_mean"]
    )


@pytest.mark.parametrize(
    ("seeds", "message"),
    [
        ([], "x.yaml: seeds: expected a non-empty list"),
        ([0, 0], "x.yaml: seeds: repeated seed"),
        ([-1], "x.yaml: seeds: -1 is not a non-negative integer"),
    ],
)
def test_bad_seeds_are_one_line(seeds: Any, message: str) -> None:
    with pytest.raises(LmsimError) as info:
        expand_sweep(tiny_experiment(seeds=seeds), where="x.yaml")
    assert str(info.value).startswith(message)
    with pytest.raises(LmsimError) as both:
        expand_sweep(tiny_experiment(sweep={"seed": [1]}, seeds=[2]), where="x.yaml")
    assert "either seeds: or sweep.seed" in str(both.value)


def test_a_seed_repeat_is_scaled_by_the_reference_seeds_capacity() -> None:
    from lmsim.config import validate
    from lmsim.study.experiment import _capacity_reference, capacity_trace

    raw = tiny_experiment()
    raw["seed"] = 2
    config = validate(raw, where="x")
    own = capacity_trace(config)
    ref = _capacity_reference(own, config)
    raw["seed"] = 0
    assert np.array_equal(ref.arrival_s, capacity_trace(validate(raw, where="x")).arrival_s)
    assert not np.array_equal(own.arrival_s, ref.arrival_s)


def test_validate_checks_every_sweep_point(tmp_path: Path, capsys) -> None:
    """Issue 24: `lmsim validate` passed a sweep whose points were invalid (a bailian
    parameter swept on vllm); now each point is checked as `run` would check it."""
    from lmsim.cli import main

    good = write_experiment(tmp_path / "good.yaml", tiny_experiment(**copy.deepcopy(FOUR_RUNS)))
    assert main(["validate", str(good)]) == 0
    assert capsys.readouterr().out.startswith(f"{good}: ok (4 sweep points, ")
    bad = write_experiment(tmp_path / "bad.yaml", tiny_experiment(sweep={
        "router.policy": ["bailian", "vllm"], "router.params.lambda": [0.5, 0.5]}, zip=[["router.policy", "router.params.lambda"]]))  # fmt: skip
    assert main(["validate", str(bad)]) == 2
    assert "[router.policy=vllm,router.params.lambda=0.5]: router.params: policy 'vllm' has no parameter 'lambda'" in (
        capsys.readouterr().err
    )


def test_one_run_is_one_run_in_every_message(tmp_path: Path, capsys) -> None:
    """Issue 24: "1 runs"."""
    from lmsim.cli import main

    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(sweep={"workload.rate": [2.0]}))
    assert main(["sweep", str(exp), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    assert main(["report", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "sweep tiny: 1 run, 0 already complete" in out and "sweep: 1/1 run complete" in out
    assert "1 run;" in (tmp_path / "s/report.html").read_text()
    assert "1 runs" not in out


def test_a_fleet_sweep_indexes_the_fleet_totals(tmp_path: Path) -> None:
    """A sweep over crash times: each point's summary has a nested `fleet` block; the index
    carries its scalars as fleet_<name>. Two instances, one crashing at 5 s (restart never):
    one crash; without the crash (crashes: []) none. Instance-seconds: the crashed
    instance counts 0 -> 5 s, the other the whole run, so the crash point provisions less."""
    raw = tiny_experiment(sweep={"faults.crashes": [[{"time_s": 5.0, "instance": 1}], []]})
    raw["faults"] = {"crashes": []}
    exp = write_experiment(tmp_path / "exp.yaml", raw)
    run_sweep(exp, out=tmp_path / "s", progress=False)
    index = read_index(tmp_path / "s").set_index("run")
    crashed = index[index["fleet_num_crashes"] == 1]
    calm = index[index["fleet_num_crashes"] == 0]
    assert len(crashed) == 1 and len(calm) == 1
    assert crashed["fleet_gpu_seconds"].iloc[0] < calm["fleet_gpu_seconds"].iloc[0]
    assert calm["fleet_gpu_seconds"].iloc[0] == pytest.approx(2 * calm["sim_time_s"].iloc[0])
