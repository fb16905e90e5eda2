"""Shipped capacities: measure every `load:` point of the bundled experiments once, so a
fresh clone never searches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmsim.config import validate
from lmsim.study.capacity import (
    BUNDLED_PATH,
    CapacitySearch,
    _read_cache,
    _write_cache,
    cache_key,
    find_capacity,
)
from lmsim.study.expand import load_sweep
from lmsim.study.experiment import capacity_seed_config, capacity_trace


def bundle_experiments(paths: list[str], log: Any = print) -> int:
    """Measure, and record in experiments/capacity.json, the capacity every `load:` point of
    the given experiments (sweeps expanded) will ask for. Returns how many were measured."""
    done: set[str] = set()
    bundled = _read_cache(BUNDLED_PATH)
    for path in paths:
        _raw, points = load_sweep(path)
        for point in points:
            config = validate(point.raw, where=f"{path} [{point.name}]")
            if config.workload.load is None:
                continue
            trace = capacity_trace(capacity_seed_config(config), Path(path).resolve().parent)
            search = CapacitySearch()
            key = cache_key(trace.head(search.probe_requests), config, search)
            if key in done:
                continue
            done.add(key)
            if key in bundled:
                log(f"{path} [{point.name}]: bundled already ({bundled[key]['rate']:.3f} req/s)")
                continue
            rate, probes = find_capacity(trace, config, search)
            _write_cache(key, {"rate": rate, "probes": [p.__dict__ for p in probes]}, BUNDLED_PATH)
            bundled[key] = {"rate": rate}
            log(f"{path} [{point.name}]: {rate:.3f} req/s ({len(probes)} probes)")
    return len(done)
