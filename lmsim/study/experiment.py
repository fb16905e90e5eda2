"""Turn an experiment's `workload:` section into the trace the cluster replays:
load or generate, cut (window, limit), then scale the arrival process."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmsim.config import ExperimentConfig
from lmsim.data import DATA_DIR
from lmsim.errors import ConfigError, TraceError
from lmsim.workload.trace import Trace, read_parquet


def resolve_path(path: str, experiment_dir: Path | None) -> Path:
    """A relative path is looked up in the working directory, then beside the experiment
    file, then among the bundled data (so bundled experiments run from anywhere)."""
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    for base in (experiment_dir, DATA_DIR):
        if base is not None and (base / candidate).exists():
            return base / candidate
    return candidate


def load_workload_trace(config: ExperimentConfig, experiment_dir: Path | None = None) -> Trace:
    w = config.workload
    if w.generator is not None:
        from lmsim.workload.generators import generate

        trace = generate(w.generator.name, dict(w.generator.params), seed=config.seed)
    else:
        assert w.trace is not None
        path = resolve_path(w.trace, experiment_dir)
        if w.format in (None, "canonical") and path.suffix == ".parquet":
            trace = read_parquet(path)
        else:
            try:
                from lmsim.workload.formats import load_trace
            except ImportError:
                raise TraceError(f"{path}: raw trace formats are not available") from None
            trace = load_trace(path, format=w.format, skip_bad_rows=w.skip_bad_rows)
    return shape_workload(trace, config)


def shape_workload(trace: Trace, config: ExperimentConfig) -> Trace:
    w = config.workload
    if w.max_tokens is not None:
        from lmsim.workload.clip import clip_to_max_tokens

        trace = clip_to_max_tokens(trace, w.max_tokens)
    if w.start_s is not None or w.end_s is not None:
        from lmsim.workload.scaling import window

        trace = window(trace, w.start_s or 0.0, w.end_s if w.end_s is not None else float("inf"))
    if w.sample is not None:
        keep = np.random.default_rng(w.sample.seed).random(len(trace)) < w.sample.fraction
        if w.sample.complement:
            keep = ~keep
        trace = trace.take(np.flatnonzero(keep))
        if len(trace) == 0:
            raise ConfigError("workload.sample: no requests left after thinning")
    full = trace
    if w.limit is not None:
        trace = trace.head(w.limit)
    if len(trace) == 0:
        raise ConfigError("workload: no requests left after the window/limit")
    if w.time_scale is not None:
        from lmsim.workload.scaling import time_scale

        trace = time_scale(trace, w.time_scale)
    elif w.rate is not None:
        from lmsim.workload.scaling import scale_to_rate

        trace = scale_to_rate(trace, w.rate)
    elif w.load is not None:
        from lmsim.study.capacity import find_capacity
        from lmsim.workload.scaling import mean_rate, time_scale

        # Capacity belongs to the workload and cluster, not to a prefix cut for a quick run:
        # it is measured before `limit` (see capacity_trace), and the prefix is stretched by
        # the same factor as the whole, so a smoke test at limit=50 keeps the arrival times
        # of the real run.
        capacity, _ = find_capacity(full, config)
        trace = time_scale(trace, w.load * capacity / mean_rate(full))
    return trace



def capacity_trace(config: ExperimentConfig, experiment_dir: Path | None = None) -> Trace:
    """The trace whose capacity `workload.load` refers to: the workload after its window and
    sampling, before `limit` and any rescaling."""
    w = config.workload
    bare = config.model_copy(
        update={"workload": w.model_copy(update={"limit": None, "load": None, "rate": None, "time_scale": None})}
    )
    return load_workload_trace(bare, experiment_dir)
