"""Sweeps on Dask for real (lmsim/study/execute.py, lmsim/plugins.py): worker processes,
not threads; a scheduler and workers started as their own processes over TCP; and
`--plugin` modules reaching the workers.

Every test needs the dask extra (`pip install 'lmsim[dask]'`) and skips cleanly without it
(CI installs `.[test]` only). The TCP test is marked `slow` (`pytest -m slow
tests/test_sweep_dask.py`): it starts `dask scheduler` and two `dask worker` processes on
127.0.0.1 at free ports and always stops them.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sweep import FOUR_RUNS, comparable, run_cli, tiny_experiment, write_experiment

from lmsim.study.execute import run_sweep
from lmsim.study.index import read_index

pytest.importorskip("distributed")

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_FILES = ("requests.parquet", "instances.parquet", "router_events.parquet", "config.yaml")
WALL_CLOCK = ("wall_time_s", "router_us_per_decision", "requests_per_wall_s")

# A policy no lmsim install knows: if a worker runs a point with it, the module reached it.
# Everything goes to the last instance, so its traces are unmistakable.
PLUGIN = '''
from lmsim.policies.base import POLICIES, Policy


@POLICIES.register("last_instance_only")
class LastInstanceOnly(Policy):
    def choose(self, request, cluster) -> int:
        return len(cluster.instances) - 1
'''


def run_files(sweep_dir: Path, name: str) -> dict[str, object]:
    run = sweep_dir / name
    files: dict[str, object] = {f: (run / f).read_bytes() for f in RUN_FILES}
    summary = json.loads((run / "summary.json").read_text())
    files["summary.json"] = {k: v for k, v in summary.items() if k not in WALL_CLOCK}
    return files


def test_local_cluster_processes_give_the_local_pools_bytes(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiny_experiment(**copy.deepcopy(FOUR_RUNS)))
    local = run_sweep(exp, out=tmp_path / "local", jobs=2, progress=False)
    seen: list[dict] = []
    dask = run_sweep(exp, out=tmp_path / "dask", jobs=2, executor="dask", progress=False, on_result=seen.append)
    assert local.exit_code == dask.exit_code == 0 and len(dask.executed) == 4
    # the runs happened in worker processes, not in this one
    assert {r["ok"] for r in seen} == {True} and os.getpid() not in {r["pid"] for r in seen}
    for name in local.executed:
        assert run_files(tmp_path / "dask", name) == run_files(tmp_path / "local", name), name
    assert comparable(read_index(tmp_path / "dask")).equals(comparable(read_index(tmp_path / "local")))


def plugin_experiment(tmp_path: Path) -> Path:
    raw = tiny_experiment(sweep={"router.policy": ["last_instance_only"], "workload.rate": [2.0, 4.0]})
    return write_experiment(tmp_path / "exp.yaml", raw)


def check_plugin_runs(sweep_dir: Path) -> None:
    import pandas as pd

    index = read_index(sweep_dir)
    assert len(index) == 2
    for name in index["run"]:
        requests = pd.read_parquet(sweep_dir / name / "requests.parquet")
        assert len(requests) > 10 and set(requests["instance_id"]) == {1}, name


def test_a_plugin_policy_runs_on_local_cluster_workers(tmp_path: Path) -> None:
    # The workers are fresh processes (spawned, not forked): before plugins were shipped,
    # every point failed there with "unknown policy 'last_instance_only'".
    (tmp_path / "my_policy.py").write_text(PLUGIN)
    exp = plugin_experiment(tmp_path)
    out = tmp_path / "s"
    proc = run_cli("--plugin", str(tmp_path / "my_policy.py"), "sweep", str(exp), "--executor", "dask",
                   "-j", "2", "--out", str(out), "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    check_plugin_runs(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.slow
def test_sweep_on_a_tcp_scheduler_with_two_worker_processes(tmp_path: Path) -> None:
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    bin_dir = Path(sys.executable).parent
    dask = str(bin_dir / "dask") if (bin_dir / "dask").exists() else "dask"
    # the workers start elsewhere: the plug-in file is not in their folder or on their path
    elsewhere = tmp_path / "workers"
    elsewhere.mkdir()
    logs = [open(tmp_path / f"{n}.log", "w") for n in ("scheduler", "worker1", "worker2")]  # noqa: SIM115
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            cwd=elsewhere, env=env, stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True,
        ))  # fmt: skip
        for k in (1, 2):
            procs.append(subprocess.Popen(
                [dask, "worker", address, "--nthreads", "1", "--no-dashboard", "--name", f"w{k}",
                 "--local-directory", str(elsewhere / f"w{k}")],
                cwd=elsewhere, env=env, stdout=logs[k], stderr=subprocess.STDOUT, start_new_session=True,
            ))  # fmt: skip
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
        (tmp_path / "my_policy.py").write_text(PLUGIN)
        exp = plugin_experiment(tmp_path)
        out = tmp_path / "s"
        proc = run_cli("--plugin", str(tmp_path / "my_policy.py"), "sweep", str(exp), "--scheduler", address,
                       "--out", str(out), "--no-progress", cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert f"to run on Dask {address}" in proc.stdout
        check_plugin_runs(out)
        # a second sweep on the same workers, the plug-in edited: the new version runs
        (tmp_path / "my_policy.py").write_text(PLUGIN.replace("len(cluster.instances) - 1", "0"))
        again = run_cli("--plugin", str(tmp_path / "my_policy.py"), "sweep", str(exp), "--scheduler", address,
                        "--out", str(tmp_path / "s2"), "--no-progress", cwd=tmp_path)  # fmt: skip
        assert again.returncode == 0, again.stderr
        import pandas as pd

        for name in read_index(tmp_path / "s2")["run"]:
            assert set(pd.read_parquet(tmp_path / "s2" / name / "requests.parquet")["instance_id"]) == {0}
    finally:
        stop(procs)
        for log in logs:
            log.close()
    assert all(p.poll() is not None for p in procs)
