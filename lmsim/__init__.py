"""lmsim: a discrete-event simulator of an LLM serving cluster.

A cluster is a router in front of vLLM-v1-like instances on one SimPy clock. The data flows
one way: experiment YAML -> validated config -> workload -> cluster -> per-request records ->
summaries and figures.

The Python API is three functions (the command line is built on the same pieces):

    import lmsim

    config = lmsim.load_experiment("quickstart", {"router.policy": "lmetric"})
    results = lmsim.run(config)              # or lmsim.run("exp.yaml", ["workload.limit=200"])
    results.requests                         # DataFrame, one row per request
    results.summary["ttft_s_p99"]
    same = lmsim.load_run("runs/quickstart")  # a saved run directory, as Results

`load_experiment(path_or_bundled_name, overrides=None) -> ExperimentConfig`
`run(config_or_path, overrides=None, out=None, *, overwrite=False) -> Results`
`load_run(run_dir) -> Results`

Overrides are dotted keys, as `--set` takes them: a mapping `{"workload.limit": 200}` or a
list of `"key=value"` strings (values parsed as YAML). `Results` has `.requests`,
`.instances` and `.router_events` (pandas DataFrames), `.summary` (dict) and `.config`.
Imports are lazy so `import lmsim` stays cheap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmsim._version import __version__

if TYPE_CHECKING:
    from lmsim.config import ExperimentConfig
    from lmsim.engine.results import Results

__all__ = ["__version__", "load_experiment", "load_run", "run"]

Overrides = dict[str, Any] | list[str] | None


def _experiment_path(path_or_name: str | os.PathLike[str]) -> Path:
    from lmsim.shipped import bundled_experiment

    path = Path(path_or_name)
    if path.exists():
        return path
    bundled = bundled_experiment(str(path_or_name))
    return bundled if bundled is not None else path


def _override(raw: dict[str, Any], overrides: Overrides, where: str) -> dict[str, Any]:
    import copy

    from lmsim.config import apply_overrides, set_dotted

    if not overrides:
        return raw
    if isinstance(overrides, dict):
        raw = copy.deepcopy(raw)
        for key, value in overrides.items():
            set_dotted(raw, key, value, where=where)
        return raw
    return apply_overrides(raw, list(overrides), where=where)


def load_experiment(path_or_name: str | os.PathLike[str], overrides: Overrides = None) -> ExperimentConfig:
    """Read and validate an experiment YAML, or a bundled one by name (`quickstart`,
    `traces/coder`), with dotted-key overrides. Bad input raises `lmsim.errors.ConfigError`
    with the one-line message the CLI prints."""
    from lmsim.config import read_yaml, validate

    path = _experiment_path(path_or_name)
    where = str(path)
    return validate(_override(read_yaml(path), overrides, where), where=where).from_folder(path.parent)


def run(
    config_or_path: ExperimentConfig | str | os.PathLike[str], overrides: Overrides = None,
    out: str | os.PathLike[str] | None = None, *, overwrite: bool = False,
) -> Results:
    """Run one experiment and return its `Results`; with `out`, also save the run directory
    there (absent, empty, or with `overwrite` an earlier lmsim run). Relative trace paths
    resolve against the working directory, then the YAML's folder (remembered by a config
    `load_experiment` read), then the bundled data. With `workload.load`, the summary names
    the capacity and arrival rate it resolved to, as `lmsim run` does."""
    from lmsim.config import ExperimentConfig, validate
    from lmsim.errors import ConfigError
    from lmsim.plugins import load_entry_points
    from lmsim.study.experiment import load_workload_trace, simulate
    from lmsim.study.rundir import RUN_FILES, check_output_dir, save_run

    load_entry_points()
    if isinstance(config_or_path, ExperimentConfig):
        config = config_or_path
        if overrides:
            where = config.name
            config = validate(_override(config.to_dict(), overrides, where), where=where).from_folder(config.source_dir)
    else:
        config = load_experiment(config_or_path, overrides)
    if config.sweep or config.zip:
        raise ConfigError(f"{config.name}: has a sweep: block; run its points with `lmsim sweep`")
    if out is not None:
        check_output_dir(Path(out), "run", overwrite=overwrite, allowed_files=RUN_FILES)
    results = simulate(config, load_workload_trace(config, config.source_dir))
    if out is not None:
        save_run(results, out, figure=config.output.figures)
    return results


def load_run(run_dir: str | os.PathLike[str]) -> Results:
    """A saved run directory (`lmsim run`'s output) read back as `Results`."""
    from lmsim.study.rundir import load_run as _load_run

    return _load_run(run_dir)
