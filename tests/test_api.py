"""The Python API (`import lmsim`), `--version`, and user policy plug-ins from the command
line: `--plugin MODULE` and the `lmsim.policies` entry-point group. The README's
custom-policy example is run exactly as written."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import lmsim
from lmsim.errors import ConfigError

README = Path(__file__).resolve().parents[1] / "README.md"


def _lmsim(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # -P: like the `lmsim` console script, the working directory is not on sys.path, so a
    # plug-in module there is found only because --plugin looks for it.
    return subprocess.run(
        [sys.executable, "-P", "-m", "lmsim", *args], cwd=cwd, capture_output=True, text=True,
        timeout=300, env=env,
    )  # fmt: skip


def test_version_has_one_source() -> None:
    from importlib.metadata import PackageNotFoundError, version

    from lmsim._version import __version__
    from lmsim.cli import main

    assert lmsim.__version__ == __version__
    with contextlib.suppress(PackageNotFoundError):  # not installed: running from a checkout
        assert version("lmsim") == __version__  # pyproject reads lmsim/_version.py
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0


def test_load_experiment_by_bundled_name_with_overrides() -> None:
    config = lmsim.load_experiment("quickstart", {"workload.limit": 30, "router.policy": "lmetric"})
    assert config.name == "quickstart"
    assert config.workload.limit == 30 and config.router.policy == "lmetric"
    same = lmsim.load_experiment("quickstart", ["workload.limit=30", "router.policy=lmetric"])
    assert same == config
    with pytest.raises(ConfigError, match=r"router\.polcy"):
        lmsim.load_experiment("quickstart", {"router.polcy": "x"})


def test_run_returns_dataframes_and_saves_what_load_run_reads(tmp_path: Path) -> None:
    config = lmsim.load_experiment("quickstart", {"workload.limit": 40})
    results = lmsim.run(config, out=tmp_path / "r")
    assert isinstance(results.requests, pd.DataFrame) and len(results.requests) == 40
    assert isinstance(results.instances, pd.DataFrame) and len(results.instances) > 0
    assert isinstance(results.router_events, pd.DataFrame)
    assert results.summary["num_requests"] == 40 and results.summary["policy"] == "vllm"
    saved = lmsim.load_run(tmp_path / "r")
    assert saved.summary["num_finished"] == results.summary["num_finished"]
    assert saved.requests["ttft_s"].tolist() == pytest.approx(results.requests["ttft_s"].tolist(), nan_ok=True)
    # a path and overrides give the same simulation; an existing run needs overwrite
    again = lmsim.run("quickstart", ["workload.limit=40"])
    assert again.requests["finished_at"].tolist() == pytest.approx(results.requests["finished_at"].tolist())
    with pytest.raises(ConfigError, match="pass --overwrite"):
        lmsim.run(config, out=tmp_path / "r")
    lmsim.run(config, out=tmp_path / "r", overwrite=True)


def test_run_refuses_a_sweep() -> None:
    with pytest.raises(ConfigError, match="sweep: block"):
        lmsim.run(lmsim.load_experiment("quickstart", {"sweep": {"router.policy": ["vllm", "lmetric"]}}))


def _readme_policy_example() -> str:
    text = README.read_text()
    section = text[text.index("### Routing policies"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Routing policies section has no python block"
    return match.group(1)


@pytest.mark.parametrize("placement", ["run", "global"])
def test_readme_custom_policy_runs_as_written(tmp_path: Path, placement: str) -> None:
    (tmp_path / "readme_policy.py").write_text(_readme_policy_example())
    args = ["--set", "router.policy=fewest_waiting", "--set", "workload.limit=50", "--out", "out"]
    if placement == "run":
        proc = _lmsim("run", "quickstart", "--plugin", "readme_policy", *args, "--no-figure", cwd=tmp_path)
    else:
        proc = _lmsim("--plugin", "readme_policy", "run", "quickstart", *args, "--no-figure", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["policy"] == "fewest_waiting" and summary["num_finished"] == 50
    config = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert config["router"]["policy"] == "fewest_waiting"


def test_without_the_plugin_the_policy_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "readme_policy.py").write_text(_readme_policy_example())
    proc = _lmsim("validate", "quickstart", "--set", "router.policy=fewest_waiting", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown policy 'fewest_waiting'" in proc.stderr
    proc = _lmsim("validate", "quickstart", "--plugin", "readme_policy.py",
                  "--set", "router.policy=fewest_waiting", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_entry_point_group_registers_policies(tmp_path: Path) -> None:
    """An installed distribution declaring `[lmsim.policies]` is imported without --plugin."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "ep_policies.py").write_text(_readme_policy_example().replace('"fewest_waiting"', '"ep_fewest"'))
    dist = site / "ep_policies-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-policies\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lmsim.policies]\nep_fewest = ep_policies\n")
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    work = tmp_path / "work"
    work.mkdir()
    proc = _lmsim("validate", "quickstart", "--set", "router.policy=ep_fewest", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    (site / "ep_policies.py").write_text("import no_such_dependency_of_the_plugin\n")
    proc = _lmsim("validate", "quickstart", cwd=work, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "lmsim: error: entry point 'ep_fewest' (lmsim.policies, ep_policies): cannot import it "
        "(ModuleNotFoundError: No module named 'no_such_dependency_of_the_plugin')"
    ]
