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
    section = text[text.index("## Adding a policy"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'Adding a policy' section has no python block"
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


def test_a_loaded_config_remembers_its_yaml_folder(tmp_path: Path, monkeypatch) -> None:
    """Issue 24: `cfg = lmsim.load_experiment("proj/exp.yaml"); lmsim.run(cfg)` lost the
    YAML's folder ("data/t.parquet: trace file not found") where `lmsim.run("proj/exp.yaml")`
    found the trace beside the YAML. The folder is remembered beside the config, not in it:
    its serialized form (and so config.yaml and every digest of it) is unchanged."""
    import shutil

    from lmsim.shipped import TRACES_DIR

    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    shutil.copy(TRACES_DIR / "kimi_conversation_sample.parquet", proj / "data/t.parquet")
    raw = yaml.safe_load((Path(lmsim.__file__).parent / "data/experiments/quickstart.yaml").read_text())
    raw["workload"] = {"trace": "data/t.parquet", "limit": 30}
    (proj / "exp.yaml").write_text(yaml.safe_dump(raw))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    config = lmsim.load_experiment("proj/exp.yaml")
    monkeypatch.chdir(elsewhere)  # the folder was resolved when the YAML was read
    by_config = lmsim.run(config)
    by_path = lmsim.run("../proj/exp.yaml")
    assert by_config.summary["num_requests"] == by_path.summary["num_requests"] == 30
    assert by_config.requests["finished_at"].tolist() == by_path.requests["finished_at"].tolist()
    assert lmsim.run(config, {"workload.limit": 20}).summary["num_requests"] == 20  # overrides keep it
    assert config.source_dir == proj.resolve()
    assert config.model_copy().source_dir == proj.resolve()
    # not part of what the config is: same dump and equal to the same content read elsewhere
    assert "proj" not in yaml.safe_dump(config.to_dict()) and "source" not in config.to_dict()
    copied = tmp_path / "copy.yaml"
    copied.write_text((proj / "exp.yaml").read_text())
    assert lmsim.load_experiment(copied) == config
    assert config.model_dump_json() == lmsim.load_experiment(copied).model_dump_json()


def test_api_runs_carry_capacity_and_load_like_cli_runs(tmp_path: Path, monkeypatch) -> None:
    """Issue 24: runs made through the API lacked capacity_req_s, capacity_source,
    load_rate_req_s and load in summary.json. traces/chatbot at load 0.5 of its shipped
    capacity: the API's run says what `lmsim run` says, and 0.5 x capacity = arrival rate."""
    from lmsim.cli import main

    monkeypatch.chdir(tmp_path)
    results = lmsim.run("traces/chatbot", {"workload.limit": 30}, out=tmp_path / "api")
    assert main(["run", "traces/chatbot", "--set", "workload.limit=30", "--out", "cli", "--no-figure"]) == 0
    cli = json.loads((tmp_path / "cli/summary.json").read_text())
    keys = ("load", "capacity_req_s", "capacity_source", "load_rate_req_s")
    for summary in (results.summary, json.loads((tmp_path / "api/summary.json").read_text())):
        assert {k: summary[k] for k in keys} == {k: cli[k] for k in keys}
        assert summary["load"] == 0.5 and summary["capacity_source"] == "shipped"
        assert summary["load_rate_req_s"] == pytest.approx(0.5 * summary["capacity_req_s"])
    assert (tmp_path / "api/config.yaml").read_text().startswith("# workload.load 0.5 resolved to")


@pytest.mark.parametrize(("returned", "shown"), [("99", "99"), ("-1", "-1"), ("None", "None"), ("1.0", "1.0")])
def test_a_plugin_returning_a_bad_index_is_one_line(tmp_path: Path, returned: str, shown: str) -> None:
    """Issue 24: a plug-in policy returning an instance that does not exist ended in a
    RuntimeError traceback. One line names the policy, the value and what is allowed;
    exit 3, the code of a bug (here the plug-in's) rather than of bad input."""
    (tmp_path / "bad_index.py").write_text(
        "from lmsim.policies.base import POLICIES, Policy\n\n"
        '@POLICIES.register("bad_index")\n'
        "class BadIndex(Policy):\n"
        f"    def choose(self, request, cluster):\n        return {returned}\n"
    )
    proc = _lmsim("run", "quickstart", "--plugin", "bad_index", "--set", "router.policy=bad_index",
                  "--set", "workload.limit=5", "--no-figure", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == [
        f"lmsim: error: policy 'bad_index' chose instance {shown} for request 0 at t=0.000 s; "
        "choose() must return an int from 0 to 15 (the cluster's 16 instances)"
    ]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["run", "--help"], ["--plugin", "x", "--version"]])
def test_startup_imports_no_numeric_or_plotting_library(argv: list[str]) -> None:
    """Issue 24: `lmsim --version` took 2.2 s because every subcommand module imported
    pandas and matplotlib to build the parser. A command module now loads only when one of
    its commands is on the command line, so --version and --help import none of them.
    (Checked by what is imported, never by wall time.)"""
    code = (
        "import sys\nfrom lmsim.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "heavy = ('numpy', 'pandas', 'matplotlib', 'pyarrow', 'pydantic', 'simpy', 'scipy')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"



def test_the_quick_parser_lists_every_command_as_the_full_one_does() -> None:
    """`lmsim --help` lists the commands whose modules it did not load (lmsim.cli.options.
    COMMANDS) exactly as the fully loaded parser does."""
    from lmsim.cli import build_parser
    from lmsim.cli.options import COMMANDS

    quick, full = build_parser(["--help"]).format_help(), build_parser().format_help()
    assert quick == full
    assert all(name in quick for name in COMMANDS)
