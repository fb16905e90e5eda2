"""What a sweep sends its workers with each point, without Dask: the capacities `load:`
needs (lmsim/study/execute.py), and `--plugin` modules (lmsim/plugins.py: `loaded_plugins`,
`install_plugins`): one fresh interpreter loads a plug-in as the CLI does and
pickles what a task carries; another, started in an empty folder where the file is not,
installs it as a spawned or remote worker would. (The Dask paths themselves are in
tests/test_sweep_dask.py, which needs the dask extra.)"""

from __future__ import annotations

import base64
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmsim.registry import Registry

REPO_ROOT = Path(__file__).resolve().parents[1]
POLICY = '''
from lmsim.policies.base import POLICIES, Policy


@POLICIES.register("shipped_policy")
class ShippedPolicy(Policy):
    VERSION = {version}

    def choose(self, request, cluster) -> int:
        return 0
'''

LOAD = """
import base64, pickle, sys
from lmsim.plugins import load_plugins, loaded_plugins
load_plugins(sys.argv[1:])
print(base64.b64encode(pickle.dumps(loaded_plugins())).decode())
"""

INSTALL = """
import base64, pickle, sys
from lmsim.errors import ConfigError
from lmsim.plugins import install_plugins
from lmsim.policies.base import POLICIES
for blob in sys.argv[1:]:
    try:
        install_plugins(pickle.loads(base64.b64decode(blob)))
        print(POLICIES.get("shipped_policy").VERSION)
    except ConfigError as exc:
        print("error:", exc)
"""


def python(code: str, *args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": ""}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def shipped(plugin_dir: Path, *specs: str) -> str:
    return python(LOAD, *specs, cwd=plugin_dir)


def test_a_file_plugin_travels_as_source_and_a_new_version_replaces_the_old(tmp_path: Path) -> None:
    plugin_dir, worker_dir = tmp_path / "mine", tmp_path / "worker"
    plugin_dir.mkdir(), worker_dir.mkdir()
    (plugin_dir / "pol.py").write_text(POLICY.format(version=1))
    v1 = shipped(plugin_dir, "pol.py")
    v1_by_name = shipped(plugin_dir, "pol")  # a top-level module found as one file: also source
    (plugin_dir / "pol.py").write_text(POLICY.format(version=2))
    v2 = shipped(plugin_dir, "pol.py")
    (plugin_dir / "pol.py").unlink()  # the worker never reads the file: it has the source
    (described,) = pickle.loads(base64.b64decode(v1))
    assert described.module == "lmsim_plugin_pol" and described.source is not None
    (by_name,) = pickle.loads(base64.b64decode(v1_by_name))
    assert by_name.module == "pol" and by_name.source == described.source
    # installing twice is once; v2 replaces v1's registration (same module, same class)
    assert python(INSTALL, v1, v1, v2, cwd=worker_dir).splitlines() == ["1", "1", "2"]


def test_a_package_plugin_is_imported_by_name_and_a_missing_one_is_one_line(tmp_path: Path) -> None:
    plugin_dir, worker_dir = tmp_path / "mine", tmp_path / "worker"
    (plugin_dir / "polpkg").mkdir(parents=True)
    worker_dir.mkdir()
    (plugin_dir / "polpkg" / "__init__.py").write_text(POLICY.format(version=7))
    blob = shipped(plugin_dir, "polpkg")
    (described,) = pickle.loads(base64.b64decode(blob))
    assert described.source is None and described.origin == str(plugin_dir)
    # a worker sharing the filesystem finds it in the folder it was loaded from
    assert python(INSTALL, blob, cwd=worker_dir) == "7"
    shutil.rmtree(plugin_dir / "polpkg")
    out = python(INSTALL, blob, cwd=worker_dir)
    assert out.startswith("error: --plugin polpkg: cannot import it on this worker (ModuleNotFoundError")
    assert "must be installed on every worker" in out and len(out.splitlines()) == 1


def test_registering_the_same_class_again_replaces_it_and_another_class_is_refused() -> None:
    registry: Registry = Registry("thing")

    def define(value: int) -> type:
        class Thing:
            VALUE = value

        return Thing

    registry.register("x")(define(1))
    registry.register("x")(define(2))  # the same module and qualified name: a re-import
    assert registry.get("x").VALUE == 2

    class Other:
        pass

    with pytest.raises(ValueError, match="'x' is registered twice"):
        registry.register("x")(Other)


def test_a_worker_uses_the_capacity_the_sweep_sent(tmp_path: Path) -> None:
    # A worker on another machine has no capacity cache: the point carries the capacity
    # the sweep resolved, and the run is scaled by it (load 0.5 x 40 req/s = 20 req/s)
    # instead of searching.
    import json

    from test_sweep import tiny_experiment

    from lmsim.config import validate
    from lmsim.study.capacity import Capacity, CapacitySearch, cache_key
    from lmsim.study.execute import run_point
    from lmsim.study.experiment import capacity_seed_config, workload_identity

    raw = tiny_experiment()
    raw["workload"]["load"] = 0.5
    raw["cluster"]["num_gpu_blocks"] = 4321  # a cluster no cache has
    config = validate(raw, where="test")
    key = cache_key(workload_identity(capacity_seed_config(config), tmp_path), config, CapacitySearch())
    task = {"name": "p", "raw": raw, "where": "test", "experiment_dir": str(tmp_path), "out": str(tmp_path),
            "capacities": {key: Capacity(40.0, "cached", key, [])}}  # fmt: skip
    result = run_point(task)
    assert result["ok"], result.get("traceback")
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["capacity_req_s"] == 40.0 and summary["load_rate_req_s"] == 20.0
