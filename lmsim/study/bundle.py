"""Shipped capacities: measure every `load:` point of the bundled experiments once, so a
fresh clone never searches."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lmsim.config import validate
from lmsim.study.capacity import (
    BUNDLED_PATH,
    CapacitySearch,
    _read_cache,
    _write_cache,
    cache_key,
    key_payload,
    resolve_capacity,
)
from lmsim.study.expand import load_sweep
from lmsim.study.experiment import capacity_seed_config, capacity_trace, workload_identity


def bundle_experiments(paths: list[str], log: Any = print, *, refresh: bool = False) -> int:
    """Measure, and record in experiments/capacity.json, the capacity every `load:` point of
    the given experiments (sweeps expanded) will ask for. Returns how many keys they need.

    With `refresh`, every capacity is searched again (the key does not cover the engine, so
    an engine change needs this) and entries no given experiment needs are dropped."""
    done: set[str] = set()
    bundled = {} if refresh else _read_cache(BUNDLED_PATH)
    search = CapacitySearch()
    for path in paths:
        _raw, points = load_sweep(path)
        experiment_dir = Path(path).resolve().parent
        for point in points:
            config = validate(point.raw, where=f"{path} [{point.name}]")
            if config.workload.load is None:
                continue
            identity = workload_identity(capacity_seed_config(config), experiment_dir)
            key = cache_key(identity, config, search)
            if key in done:
                continue
            done.add(key)
            if not refresh:
                # read again: another bundle process may have measured it meanwhile
                bundled = _read_cache(BUNDLED_PATH)
            if key in bundled:
                log(f"{path} [{point.name}]: bundled already ({bundled[key]['rate']:.4g} req/s)")
                continue
            trace = capacity_trace(capacity_seed_config(config), experiment_dir)
            found = resolve_capacity(trace, config, search, workload=identity, use_cache=False, log=log)
            entry = {
                "rate": found.rate, "probes": [p.__dict__ for p in found.probes],
                "identity": key_payload(identity, config, search),
            }  # fmt: skip
            _write_cache(key, entry, BUNDLED_PATH)
            bundled[key] = entry
            log(f"{path} [{point.name}]: {found.rate:.4g} req/s ({len(found.probes)} probes)")
    if refresh:
        kept = {k: v for k, v in _read_cache(BUNDLED_PATH).items() if k in done}
        tmp = BUNDLED_PATH.with_name(f".{BUNDLED_PATH.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, BUNDLED_PATH)
    return len(done)
