"""Turn an experiment's `workload:` section into the trace the cluster replays:
load or generate, cut (window, limit), then scale the arrival process."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from lmsim.config import ExperimentConfig
from lmsim.errors import ConfigError, TraceError
from lmsim.shipped import DATA_DIR, bundled_trace
from lmsim.workload.trace import Trace, read_parquet

if TYPE_CHECKING:
    from lmsim.engine.results import Results


def resolve_path(path: str, experiment_dir: Path | None) -> Path:
    """A relative path is looked up in the working directory, then beside the experiment
    file, then among the bundled data (so bundled experiments run from anywhere); a bare
    name may name a bundled trace (`kimi_conversation_sample`)."""
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    for base in (experiment_dir, DATA_DIR):
        if base is not None and (base / candidate).exists():
            return base / candidate
    return bundled_trace(path) or candidate


@lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def workload_identity(config: ExperimentConfig, experiment_dir: Path | None = None) -> dict[str, Any]:
    """What defines the workload whose capacity `load:` refers to, as plain data: the
    generator's name, version, parameters and seed, or the trace file's content digest and
    format; plus the window and sampling. Never the generated numbers themselves."""
    w = config.workload
    if w.generator is not None:
        from lmsim.workload.generators import GENERATORS

        cls = GENERATORS.get(w.generator.name, where="workload.generator")
        source: dict[str, Any] = {
            "generator": w.generator.name,
            "version": getattr(cls, "version", 0),
            "params": dict(sorted(w.generator.params.items())),
            "seed": config.seed,
        }
    else:
        assert w.trace is not None
        path = resolve_path(w.trace, experiment_dir)
        try:
            stat = path.stat()
        except OSError as exc:
            raise TraceError(f"{path}: cannot read the trace ({exc.strerror})") from None
        source = {
            "file_sha256": _file_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns),
            "format": w.format_name, "skip_bad_rows": w.skip_bad_rows,
            **({"format_params": dict(sorted(w.format_params.items()))} if w.format_params else {}),
        }  # fmt: skip
    shape = {"start_s": w.start_s, "end_s": w.end_s, "sample": w.sample.model_dump() if w.sample else None}
    return {"source": source, "shape": shape}


CapacityMode = Literal["search", "lookup"]

# Generated traces kept per process, by (generator class, parameters, seed): a sweep's
# points share a few workloads, and a pool worker runs many points. Generation is a pure
# function of the key, so a hit returns the same numbers. Measured on fig11: the coder
# workload took 6.7 s CPU to generate per point against 9 s of simulation; the agent
# workload 0.4 s. Cached arrays are made read-only (they are shared, never written).
TRACE_CACHE_BYTES = 256 * 2**20
_trace_cache: OrderedDict[tuple[Any, ...], Trace] = OrderedDict()


def _trace_nbytes(trace: Trace) -> int:
    return sum(v.nbytes for v in vars(trace).values() if isinstance(v, np.ndarray))


def generated_trace(name: str, params: dict[str, Any], seed: int) -> Trace:
    """`generate(name, params, seed=seed)`, from this process's cache when it was generated
    before; the caller gets its own `Trace` (own `meta`) sharing the read-only columns."""
    from lmsim.workload.generators import GENERATORS, generate

    if name not in GENERATORS.names():
        return generate(name, dict(params), seed=seed)  # generate's own error for the name
    key = (GENERATORS.get(name), name, json.dumps(params, sort_keys=True, default=repr), seed)
    trace = _trace_cache.get(key)
    if trace is None:
        trace = generate(name, dict(params), seed=seed).compact()
        size = _trace_nbytes(trace)
        if size <= TRACE_CACHE_BYTES // 2:
            for value in vars(trace).values():
                if isinstance(value, np.ndarray):
                    value.flags.writeable = False
            _trace_cache[key] = trace
            while sum(_trace_nbytes(t) for t in _trace_cache.values()) > TRACE_CACHE_BYTES:
                _trace_cache.popitem(last=False)
            trace = trace.replace()
    else:
        _trace_cache.move_to_end(key)
        trace = trace.replace()
    return trace


def load_workload_trace(
    config: ExperimentConfig,
    experiment_dir: Path | None = None,
    *,
    capacity: CapacityMode = "search",
    log: Callable[[str], None] | None = None,
) -> Trace:
    """The trace the cluster replays. With `workload.load`, the capacity is looked up and,
    when `capacity="search"`, searched if absent (announced through `log`); with
    `"lookup"` (validate) a missing capacity leaves the trace unscaled and is recorded in
    `trace.meta["capacity_source"] = "missing"`."""
    w = config.workload
    if w.generator is not None:
        trace = generated_trace(w.generator.name, dict(w.generator.params), config.seed)
    else:
        assert w.trace is not None
        path = resolve_path(w.trace, experiment_dir)
        if w.format_name in (None, "canonical") and path.suffix == ".parquet":
            trace = read_parquet(path)
        else:
            try:
                from lmsim.workload.formats import load_trace
            except ImportError:
                raise TraceError(f"{path}: raw trace formats are not available") from None
            trace = load_trace(path, format=w.format_name, skip_bad_rows=w.skip_bad_rows, params=w.format_params)
    trace = trace.compact()  # ids as int32 for the replay when they fit (half the memory)
    identity = workload_identity(capacity_seed_config(config), experiment_dir) if w.load is not None else None
    return shape_workload(trace, config, workload=identity, capacity=capacity, log=log)


def shape_workload(
    trace: Trace,
    config: ExperimentConfig,
    *,
    workload: dict[str, Any] | None = None,
    capacity: CapacityMode = "search",
    log: Callable[[str], None] | None = None,
) -> Trace:
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
        from lmsim.study.capacity import resolve_capacity
        from lmsim.workload.scaling import mean_rate, time_scale

        # Capacity belongs to the workload and cluster, not to a prefix cut for a quick run:
        # it is measured before `limit` (see capacity_trace), and the prefix is stretched by
        # the same factor as the whole, so a smoke test at limit=50 keeps the arrival times
        # of the real run.
        found = resolve_capacity(
            _capacity_reference(full, config), config, workload=workload, allow_search=capacity == "search", log=log
        )
        trace.meta["capacity_source"] = found.source
        if found.rate is None:
            return _scheduled(trace, config)
        trace = time_scale(trace, w.load * found.rate / mean_rate(full))
        trace.meta.update({
            "capacity_source": found.source,
            "capacity_req_s": repr(found.rate),
            "load_rate_req_s": repr(w.load * found.rate),
        })  # fmt: skip
    return _scheduled(trace, config)


def _scheduled(trace: Trace, config: ExperimentConfig) -> Trace:
    """The trace under `workload.rate_schedule`, applied last: the schedule's multipliers
    are relative to the rate time_scale / rate / load set."""
    if config.workload.rate_schedule is None:
        return trace
    from lmsim.workload.rate_schedule import apply_rate_schedule

    return apply_rate_schedule(trace, config.workload.rate_schedule)


def load_resolution(config: ExperimentConfig, trace: Trace) -> dict[str, Any]:
    """What `workload.load` resolved to, for summary.json and the console: the capacity
    (req/s), where it came from, and the mean arrival rate the workload was scaled to."""
    if config.workload.load is None:
        return {}
    meta = trace.meta
    rate = meta.get("capacity_req_s")
    return {
        "load": config.workload.load,
        "capacity_req_s": float(rate) if rate is not None else None,
        "capacity_source": meta.get("capacity_source", "missing"),
        "load_rate_req_s": float(meta["load_rate_req_s"]) if "load_rate_req_s" in meta else None,
    }


def simulate(config: ExperimentConfig, trace: Trace, *, progress: Callable[[int], None] | None = None) -> Results:
    """Replay `trace` on `config`'s cluster; the summary also names what `workload.load`
    resolved to (`load_resolution`), so runs made by `lmsim run`, a sweep and the API carry
    the same fields."""
    from lmsim.study.compose import build_simulation

    results = build_simulation(config, trace).run(progress=progress)
    results.summary.update(load_resolution(config, trace))
    return results


def describe_load(resolution: dict[str, Any], config: ExperimentConfig | None = None) -> str:
    """One console line for a resolved `load:`. On a disaggregated cluster it names whose
    capacity that is: the whole prefill + decode fleet's, under the capacity policy on both
    roles, since "capacity" alone would read as a colocated cluster's."""
    if not resolution:
        return ""
    whose = ""
    if config is not None and config.cluster.is_disaggregated:
        from lmsim.study.capacity import describe_reference

        whose = f" of this disaggregated cluster ({config.cluster.describe()}) under {describe_reference(config)}"
    if resolution["capacity_req_s"] is None:
        return (f"load {resolution['load']:g}: capacity{whose} not shipped or cached; "
                "`lmsim run` would search for it (minutes)")
    return (f"load {resolution['load']:g} of capacity {resolution['capacity_req_s']:.4g} req/s{whose} "
            f"({resolution['capacity_source']}) = arrival rate {resolution['load_rate_req_s']:.4g} req/s")



def _capacity_reference(full: Trace, config: ExperimentConfig) -> Trace:
    """The trace whose capacity scales `full`: itself, or for a generated workload replayed
    under another seed (a `seeds:` repeat) the draw at `capacity.seed`. Capacity belongs to the
    workload's distribution; measuring it per draw would both search again for every seed and
    offer each repeat a slightly different rate."""
    if config.workload.generator is None or config.seed == config.capacity.seed:
        return full
    return capacity_trace(capacity_seed_config(config))


def capacity_seed_config(config: ExperimentConfig) -> ExperimentConfig:
    """The config whose workload draw a `seeds:` repeat is scaled by (see _capacity_reference)."""
    if config.workload.generator is None or config.seed == config.capacity.seed:
        return config
    return config.model_copy(update={"seed": config.capacity.seed})


def capacity_trace(config: ExperimentConfig, experiment_dir: Path | None = None) -> Trace:
    """The trace whose capacity `workload.load` refers to: the workload after its window and
    sampling, before `limit` and any rescaling."""
    w = config.workload
    bare = config.model_copy(
        update={"workload": w.model_copy(
            update={"limit": None, "load": None, "rate": None, "time_scale": None, "rate_schedule": None}
        )}
    )
    return load_workload_trace(bare, experiment_dir)
