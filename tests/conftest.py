"""Shared factories: tiny traces and configs whose results can be computed by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmsim.config import ExperimentConfig, validate
from lmsim.engine.results import Results
from lmsim.study.compose import build_simulation
from lmsim.workload.trace import Trace


def make_trace(
    arrivals: list[float],
    inputs: list[int],
    outputs: list[int],
    hashes: list[list[int]] | None = None,
    block_size: int = 16,
    **columns: Any,
) -> Trace:
    hashes = hashes if hashes is not None else [[] for _ in arrivals]
    offsets = np.zeros(len(hashes) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hashes], out=offsets[1:])
    values = np.array([x for h in hashes for x in h], dtype=np.int64)
    return Trace(
        arrival_s=np.array(arrivals, dtype=float),
        input_tokens=np.array(inputs),
        output_tokens=np.array(outputs),
        hash_offsets=offsets,
        hash_values=values,
        block_size=block_size,
        source="test",
        **{k: np.array(v) for k, v in columns.items()},
    )


LINEAR = {
    "kind": "linear",
    "step_base_s": 0.010,
    "per_prefill_token_s": 0.001,
    "per_decode_seq_s": 0.0001,
    "per_context_token_s": 0.0,
}


def make_config(**sections: Any) -> ExperimentConfig:
    raw: dict[str, Any] = {
        "name": "test",
        "workload": {"trace": "unused.parquet"},
        "cluster": {"num_instances": 1, "profile": dict(LINEAR), "num_gpu_blocks": 1000},
        "router": {"policy": "round_robin"},
        "simulation": {"check": True},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    if "pools" in raw["cluster"]:  # pools give their own instance counts
        raw["cluster"].pop("num_instances", None)
    return validate(raw, where="test")


def simulate(trace: Trace, **sections: Any) -> Results:
    return build_simulation(make_config(**sections), trace).run()


@pytest.fixture
def linear_profile() -> dict[str, Any]:
    return dict(LINEAR)


@pytest.fixture(autouse=True, scope="session")
def _fresh_capacity_cache(tmp_path_factory: pytest.TempPathFactory):
    """The suite sees what a fresh machine sees: an empty user capacity cache (searches the
    tests make are cached for the session only), so a capacity is `shipped` or searched, never
    found in a developer's own ~/.cache. Subprocesses inherit it."""
    import os

    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


def load_script(path: Path, *search: Path) -> Any:
    """The benchmark script at `path` as a module, imported once: its folder and `search`
    go on sys.path (as `python benchmarks/...` would put the script's folder first), and
    the module is registered before it runs (dataclasses resolve annotations through
    sys.modules)."""
    for folder in (*search, path.parent):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
