"""Parameter sweeps: expand an experiment's `sweep:`/`zip:` block into runs, execute them on a
process pool or Dask, resume after an interruption, and write the `sweep.parquet` index.

This module owns:
  * expansion (`expand_sweep`): the cartesian product of the `sweep:` axes, where each `zip:`
    group of keys forms a single axis whose lists vary together; each point is validated
    against the schema (and its policy and generator parameters) before anything runs;
  * run naming (`point_name`): `key=value` pairs of the swept keys, sanitised, with a hash
    suffix when too long or when two points would collide;
  * execution (`run_sweep`): `local` (a process pool; in-process for `-j 1`) or `dask`
    (a LocalCluster, or a given scheduler), with a tqdm progress bar;
  * resume and interruption: a run whose directory is complete and whose saved config equals
    the one it would get is skipped; SIGINT/SIGTERM stop the sweep, discard the runs in
    flight (their temporary directories) and leave finished runs untouched;
  * the index (`write_index`): one row per complete run, sorted by run name, built from the
    run directories on disk, so it depends neither on the executor nor on completion order.

A sweep directory holds one run directory per point, `sweep.parquet`, `sweep.yaml` (the
experiment and its points) and, for failed runs, `<name>.error.txt` with the traceback.

A null value in a sweep list means "leave this key unset" for that point (for instance a
policy parameter that only one of the zipped policies accepts); it is left out of the name.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from .config import ExperimentConfig, apply_overrides, read_yaml, set_dotted, validate
from .errors import LmsimError

INDEX_FILE = "sweep.parquet"
SPEC_FILE = "sweep.yaml"
LOCK_FILE = ".sweep.lock"
# Summary fields that measure the host, not the simulated system; they differ between two
# otherwise identical runs and are excluded when indexes are compared.
WALL_CLOCK_COLUMNS = ("wall_time_s", "router_us_per_decision", "requests_per_wall_s")
# Keys whose sweep varies the arrival rate (figures plot these on the x axis).
RATE_KEYS = ("workload.load", "workload.rate", "workload.time_scale", "workload.generator.params.rate")
MAX_NAME_LEN = 120
CONNECT_TIMEOUT_S = 5.0
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


class SweepError(LmsimError):
    """A sweep cannot start (bad sweep block, unreachable scheduler, locked directory)."""


class SweepInterrupted(BaseException):
    """Raised in the main thread by the SIGINT/SIGTERM handler installed during a sweep.

    A BaseException so that no `except Exception` inside a run swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# -- expansion ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    name: str
    params: dict[str, Any]  # swept dotted key -> value (None: left unset), in sweep order
    raw: dict[str, Any]  # the run's raw config: the experiment without sweep/zip, point applied


def format_value(value: Any) -> str:
    """A value as it appears in a run name: YAML-like scalars, compact JSON otherwise."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def point_name(params: dict[str, Any]) -> str:
    """`k1=v1,k2=v2` over the set keys, sanitised to a portable file name; names longer than
    MAX_NAME_LEN keep a readable prefix and end in `~` plus a hash of the full text."""
    text = ",".join(f"{k}={format_value(v)}" for k, v in params.items() if v is not None)
    if not text:
        return "default"
    name = _NAME_UNSAFE.sub("-", text)
    if len(name) > MAX_NAME_LEN:
        name = f"{name[: MAX_NAME_LEN - 9]}~{_digest(text)}"
    return name


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            model = _model_of(arg)
            if model is not None:
                return model
    return None


def _is_mapping(annotation: Any) -> bool:
    if typing.get_origin(annotation) is dict or annotation is dict:
        return True
    return any(_is_mapping(a) for a in typing.get_args(annotation)) if typing.get_args(annotation) else False


def check_sweep_key(key: str, *, where: str) -> None:
    """Fail unless `key` names a field of the schema. Below a free-form mapping (policy or
    generator params, a profile dict) any key is accepted here; the point's validation then
    checks it against the policy or generator."""
    model: type[BaseModel] = ExperimentConfig
    parts = key.split(".")
    if any(not p for p in parts):
        raise SweepError(f"{where}: sweep key {key!r}: malformed dotted key")
    if parts[0] in ("sweep", "zip"):
        raise SweepError(f"{where}: sweep key {key!r}: a sweep cannot vary its own definition")
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            known = ", ".join(fields)
            raise SweepError(
                f"{where}: sweep key {key!r}: unknown key {'.'.join(parts[: depth + 1])!r} "
                f"(known here: {known})"
            )
        annotation = fields[part].annotation
        sub = _model_of(annotation)
        if depth == len(parts) - 1:
            return
        if sub is not None:
            model = sub
        elif _is_mapping(annotation):
            return
        else:
            raise SweepError(f"{where}: sweep key {key!r}: {'.'.join(parts[: depth + 1])} is not a mapping")


def _axes(sweep: dict[str, Any], zips: list[Any], *, where: str) -> list[tuple[list[str], list[list[Any]]]]:
    for key, values in sweep.items():
        if not isinstance(values, list):
            raise SweepError(f"{where}: sweep.{key}: expected a list of values, got {values!r}")
        if not values:
            raise SweepError(f"{where}: sweep.{key}: empty list (a sweep axis needs at least one value)")
    group_of: dict[str, int] = {}
    for g, group in enumerate(zips):
        if not isinstance(group, list) or not group:
            raise SweepError(f"{where}: zip[{g}]: expected a non-empty list of sweep keys")
        for key in group:
            if key not in sweep:
                raise SweepError(f"{where}: zip[{g}]: {key!r} is not a key of sweep:")
            if key in group_of:
                raise SweepError(f"{where}: zip[{g}]: {key!r} is already in zip[{group_of[key]}]")
            group_of[key] = g
        lengths = {len(sweep[k]) for k in group}
        if len(lengths) > 1:
            sizes = ", ".join(f"{k}: {len(sweep[k])}" for k in group)
            raise SweepError(f"{where}: zip[{g}]: zipped lists differ in length ({sizes})")
    axes: list[tuple[list[str], list[list[Any]]]] = []
    emitted: set[int] = set()
    for key in sweep:  # axes in the order the keys appear, a zip group at its first key
        if key in group_of:
            g = group_of[key]
            if g in emitted:
                continue
            emitted.add(g)
            keys = list(zips[g])
            axes.append((keys, [list(row) for row in zip(*(sweep[k] for k in keys))]))
        else:
            axes.append(([key], [[v] for v in sweep[key]]))
    return axes


def _unset_dotted(raw: dict[str, Any], key: str) -> None:
    node: Any = raw
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def expand_sweep(raw: dict[str, Any], *, where: str) -> list[SweepPoint]:
    """Every point of the experiment's sweep, validated, in expansion order (the first axis
    varies slowest). An experiment without `sweep:` is one point named `default`."""
    sweep = raw.get("sweep") or {}
    zips = raw.get("zip") or []
    if not isinstance(sweep, dict):
        raise SweepError(f"{where}: sweep: expected a mapping of dotted keys to lists")
    if not isinstance(zips, list):
        raise SweepError(f"{where}: zip: expected a list of key groups")
    base = {k: v for k, v in raw.items() if k not in ("sweep", "zip")}
    for key in sweep:
        check_sweep_key(str(key), where=where)
    axes = _axes(sweep, zips, where=where)
    combos: list[dict[str, Any]] = [{}]
    for keys, rows in axes:
        combos = [{**c, **dict(zip(keys, row))} for c in combos for row in rows]
    names = [point_name(c) for c in combos]
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    points = []
    for combo, name in zip(combos, names):
        if seen[name] > 1:
            # Two points sanitise to the same name ("a/b" vs "a-b"): disambiguate both by a
            # hash of the exact values, which keeps each name stable across reruns.
            name = f"{name[: MAX_NAME_LEN - 9]}~{_digest(json.dumps(combo, sort_keys=True, default=str))}"
        point_raw = copy.deepcopy(base)
        for key, value in combo.items():
            if value is None:
                _unset_dotted(point_raw, key)
            else:
                set_dotted(point_raw, key, copy.deepcopy(value), where=f"{where}: sweep")
        points.append(SweepPoint(name, combo, point_raw))
    if len({p.name for p in points}) != len(points):
        raise SweepError(f"{where}: sweep: two points have identical values")
    _validate_points(points, where=where)
    return points


def _validate_points(points: list[SweepPoint], *, where: str) -> None:
    from .policies import POLICIES
    from .profile import load_cost_model
    from .workload.generators import GENERATORS

    profiles: set[str] = set()
    for p in points:
        at = f"{where} [{p.name}]" if p.params else where
        config = validate(p.raw, where=at)
        POLICIES.create(config.router.policy, config.router.params, where=f"{at}: router.params")
        gen = config.workload.generator
        if gen is not None:
            GENERATORS.create(gen.name, dict(gen.params), where=f"{at}: workload.generator")
        key = json.dumps(config.cluster.profile, sort_keys=True)
        if key not in profiles:
            profiles.add(key)
            load_cost_model(config.cluster.profile)


def load_sweep(
    path: str | os.PathLike[str], overrides: list[str] | None = None
) -> tuple[dict[str, Any], list[SweepPoint]]:
    """Read an experiment, apply `--set` overrides, expand and validate its sweep."""
    where = str(path)
    raw = apply_overrides(read_yaml(path), overrides or [], where=where)
    return raw, expand_sweep(raw, where=where)


# -- one run -----------------------------------------------------------------------------


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """Run one point and save it; never raises for a failing run (the error is returned), so
    both executors report failures the same way. Executed in a worker process."""
    from .simulation import Simulation
    from .workload.build import load_workload_trace

    started = time.perf_counter()
    name = task["name"]
    try:
        config = validate(task["raw"], where=f"{task['where']} [{name}]")
        trace = load_workload_trace(config, Path(task["experiment_dir"]))
        results = Simulation(config, trace).run()
        results.save(Path(task["out"]) / name, figure=config.output.figures)
    except Exception as exc:
        message = str(exc).splitlines()[0] if str(exc) else ""
        return {
            "name": name,
            "ok": False,
            "error": f"{type(exc).__name__}: {message}",
            "traceback": traceback.format_exc(),
        }
    return {"name": name, "ok": True, "wall_s": time.perf_counter() - started}


def _saved_config_matches(run_dir: Path, raw: dict[str, Any]) -> bool:
    """True when the complete run at run_dir was made from this point's config (`output`
    aside: where figures go does not change results)."""
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return False
    if not isinstance(saved, dict):
        return False
    try:
        wanted = ExperimentConfig.model_validate(raw).to_dict()
    except Exception:
        return False
    saved.pop("output", None)
    wanted.pop("output", None)
    return saved == wanted


def _discard_partials(out: Path, names: list[str]) -> int:
    """Remove the temporary and replaced-old directories `Results.save` leaves behind when
    its process dies mid-write; only for this sweep's points."""
    removed = 0
    if not out.exists():
        return 0
    wanted = set(names)
    for entry in out.iterdir():
        m = re.fullmatch(r"\.(.+)\.(tmp|old)-\d+", entry.name)
        if m and m.group(1) in wanted and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    for tmp in out.glob(f".{INDEX_FILE}.tmp-*"):
        tmp.unlink(missing_ok=True)
    return removed


# -- the index ---------------------------------------------------------------------------


def _column(values: list[Any]) -> list[Any]:
    """A parquet-friendly column of swept values: numbers stay numbers, anything else
    (strings, mappings, mixtures) becomes its name text; unset stays null."""
    present = [v for v in values if v is not None]
    if all(isinstance(v, bool) for v in present):
        return values
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        if any(isinstance(v, float) for v in present) or len(present) < len(values):
            return [float("nan") if v is None else float(v) for v in values]
        return values
    return [None if v is None else format_value(v) for v in values]


def _offered_rate(run_dir: Path) -> float | None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    arrived = pq.read_table(run_dir / "requests.parquet", columns=["arrived_at"])["arrived_at"]
    arrived = arrived.drop_null()
    if len(arrived) < 2:
        return None
    span = pc.max(arrived).as_py() - pc.min(arrived).as_py()
    return len(arrived) / span if span > 0 else None  # as workload.rate defines it


def build_index(out: Path, points: list[SweepPoint]):
    """One row per complete run, sorted by name: run, the swept keys, `offered_rate_per_s`
    (measured from arrivals) and every scalar of summary.json."""
    import pandas as pd

    from .results import COMPLETE_MARKER, is_complete

    keys: list[str] = []
    for p in points:
        keys.extend(k for k in p.params if k not in keys)
    rows = []
    for p in sorted(points, key=lambda q: q.name):
        run_dir = out / p.name
        if not is_complete(run_dir):
            continue
        summary = json.loads((run_dir / COMPLETE_MARKER).read_text())
        row: dict[str, Any] = {"run": p.name}
        row.update({k: p.params.get(k) for k in keys})
        row["offered_rate_per_s"] = _offered_rate(run_dir)
        for k, v in summary.items():
            if k not in row and (v is None or isinstance(v, (bool, int, float, str))):
                row[k] = v
        rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else ["run", *keys])
    for k in keys:
        if k in frame:
            frame[k] = _column(list(frame[k].astype(object).where(frame[k].notna(), None)))
    return frame


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def write_index(out: Path, points: list[SweepPoint], experiment: dict[str, Any]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = build_index(out, points)
    keys: list[str] = []
    for p in points:
        keys.extend(k for k in p.params if k not in keys)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"lmsim.sweep_keys"] = json.dumps(keys).encode()
    meta[b"lmsim.experiment"] = str(experiment.get("name", "")).encode()
    table = table.replace_schema_metadata(meta)
    path = out / INDEX_FILE
    _atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return path


def read_index(sweep_dir: str | os.PathLike[str]):
    """The index as a DataFrame, with `attrs["sweep_keys"]` the swept keys in order."""
    import pyarrow.parquet as pq

    table = pq.read_table(Path(sweep_dir) / INDEX_FILE)
    frame = table.to_pandas()
    meta = table.schema.metadata or {}
    frame.attrs["sweep_keys"] = json.loads(meta.get(b"lmsim.sweep_keys", b"[]"))
    return frame


def _write_spec(out: Path, experiment_path: str, raw: dict[str, Any], points: list[SweepPoint]) -> None:
    spec = {
        "experiment": str(experiment_path),
        "config": raw,
        "points": [{"name": p.name, "params": p.params} for p in points],
    }
    text = yaml.safe_dump(spec, sort_keys=False)
    _atomic_write(out / SPEC_FILE, lambda tmp: tmp.write_text(text))


# -- execution ---------------------------------------------------------------------------


@dataclass
class SweepOutcome:
    out: Path
    points: list[SweepPoint]
    skipped: list[str] = field(default_factory=list)  # complete before this invocation
    executed: list[str] = field(default_factory=list)  # ran to completion now
    failed: dict[str, str] = field(default_factory=dict)  # name -> one-line error
    stale: list[str] = field(default_factory=list)  # complete but made from another config
    interrupted: int | None = None  # signal number that stopped the sweep
    index: Path | None = None

    @property
    def exit_code(self) -> int:
        if self.interrupted is not None:
            return 128 + self.interrupted
        return 1 if self.failed else 0


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into `SweepInterrupted` in the main thread while a sweep runs;
    a second signal during cleanup is ignored so cleanup finishes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SweepInterrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _worker_init() -> None:
    # A terminal's Ctrl-C reaches the whole process group; the parent decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _lock(out: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform; concurrent sweeps unguarded
        yield
        return
    with open(out / LOCK_FILE, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SweepError(f"{out}: another sweep is writing to this directory") from None
        yield


def _run_inline(tasks: list[dict[str, Any]], report: Callable[[dict[str, Any]], None]) -> None:
    for task in tasks:
        report(run_point(task))


def _run_pool(tasks: list[dict[str, Any]], jobs: int, report: Callable[[dict[str, Any]], None]) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # fork: workers inherit the imported package (no re-import per worker); the initializer
    # resets the signal handlers the parent installed.
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    executor = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init)
    futures = {}
    try:
        futures = {executor.submit(run_point, t): t["name"] for t in tasks}
        for fut in as_completed(futures):
            try:
                result = fut.result()
            except BrokenProcessPool as exc:
                result = {"name": futures[fut], "ok": False, "error": f"worker died: {exc}", "traceback": ""}
            report(result)
    except BaseException:
        for fut in futures:
            fut.cancel()
        # Runs in flight are abandoned: kill their workers now rather than wait for them.
        # (ProcessPoolExecutor has no public way to do this.)
        for proc in list(getattr(executor, "_processes", {}).values()):
            proc.terminate()
        for proc in list(getattr(executor, "_processes", {}).values()):
            proc.join(timeout=10)
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=True)


def _dask_client(jobs: int, scheduler: str | None):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise SweepError("--executor dask needs dask[distributed] (pip install 'lmsim[dask]')") from None
    import logging

    if scheduler:
        try:
            return Client(scheduler, timeout=f"{CONNECT_TIMEOUT_S}s"), None
        except (OSError, TimeoutError, ValueError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SweepError(f"cannot reach the Dask scheduler at {scheduler}: {reason}") from None
    cluster = LocalCluster(
        n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None,
        silence_logs=logging.ERROR,
    )  # fmt: skip
    return Client(cluster), cluster


def _run_dask(client: Any, tasks: list[dict[str, Any]], report: Callable[[dict[str, Any]], None]) -> None:
    from distributed import as_completed

    token = _digest(f"{os.getpid()}-{time.time()}")
    futures = [
        client.submit(run_point, t, key=f"lmsim-{token}-{i}", pure=False, retries=0)
        for i, t in enumerate(tasks)
    ]
    try:
        for fut in as_completed(futures):
            try:
                result = fut.result()
            except Exception as exc:  # the worker died or the task was lost
                name = tasks[futures.index(fut)]["name"]
                result = {"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": ""}
            report(result)
    except BaseException:
        client.cancel(futures, force=True)
        raise


def run_sweep(
    experiment: str | os.PathLike[str],
    overrides: list[str] | None = None,
    *,
    out: str | os.PathLike[str] | None = None,
    jobs: int = 1,
    executor: str = "local",
    scheduler: str | None = None,
    progress: bool = True,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> SweepOutcome:
    """Run every incomplete point of the experiment's sweep and write the index.

    `on_result` sees each finished run's result (name, ok, error) after it is recorded; it
    exists for callers that want to stop early (raising KeyboardInterrupt stops the sweep
    exactly like SIGINT)."""
    if executor not in ("local", "dask"):
        raise SweepError(f"unknown executor {executor!r} (local or dask)")
    if scheduler and executor != "dask":
        raise SweepError("--scheduler needs --executor dask")
    if jobs < 1:
        raise SweepError(f"-j must be >= 1, got {jobs}")
    raw, points = load_sweep(experiment, overrides)
    base_config = validate(points[0].raw, where=str(experiment))
    out_dir = Path(out or base_config.output.dir or Path("runs") / base_config.name).resolve()
    outcome = SweepOutcome(out_dir, points)
    names = [p.name for p in points]

    client = cluster = None
    if executor == "dask":
        client, cluster = _dask_client(jobs, scheduler)  # fails before anything is touched

    from tqdm import tqdm

    from .results import is_complete

    experiment_dir = str(Path(experiment).resolve().parent)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with _lock(out_dir):
            _discard_partials(out_dir, names)
            todo = []
            for p in points:
                run_dir = out_dir / p.name
                if is_complete(run_dir):
                    if _saved_config_matches(run_dir, p.raw):
                        outcome.skipped.append(p.name)
                        continue
                    outcome.stale.append(p.name)
                todo.append({
                    "name": p.name, "raw": p.raw, "where": str(experiment),
                    "experiment_dir": experiment_dir, "out": str(out_dir),
                })  # fmt: skip
            _write_spec(out_dir, str(experiment), raw, points)
            where = "Dask " + (scheduler or "LocalCluster") if executor == "dask" else f"local pool (-j {jobs})"
            print(
                f"sweep {base_config.name}: {len(points)} runs, {len(outcome.skipped)} already complete, "
                f"{len(todo)} to run on {where}; output {out_dir}"
                + (f" ({len(outcome.stale)} complete runs have a changed config and rerun)" if outcome.stale else ""),
                flush=True,
            )
            bar = tqdm(total=len(todo), unit="run", desc="sweep", disable=not progress or not todo,
                       file=sys.stderr, dynamic_ncols=True)  # fmt: skip

            def report(result: dict[str, Any]) -> None:
                name = result["name"]
                error_file = out_dir / f"{name}.error.txt"
                if result["ok"]:
                    outcome.executed.append(name)
                    error_file.unlink(missing_ok=True)
                else:
                    outcome.failed[name] = result["error"]
                    error_file.write_text(result.get("traceback") or result["error"])
                    bar.write(f"run {name} failed: {result['error']} (traceback in {error_file.name})", file=sys.stderr)
                bar.update(1)
                if on_result is not None:
                    on_result(result)

            with _signals_raise():
                try:
                    if executor == "dask":
                        _run_dask(client, todo, report)
                    elif jobs == 1 or len(todo) <= 1:
                        _run_inline(todo, report)
                    else:
                        _run_pool(todo, min(jobs, len(todo)), report)
                except SweepInterrupted as exc:
                    outcome.interrupted = exc.signum
                except KeyboardInterrupt:
                    outcome.interrupted = int(signal.SIGINT)
                finally:
                    bar.close()
                    # The run in flight, if any, never reached its rename: drop it.
                    _discard_partials(out_dir, names)
                    outcome.index = write_index(out_dir, points, raw)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
    return outcome


# -- command line ------------------------------------------------------------------------


def cmd_sweep(args: Any) -> int:
    if args.list:
        _raw, points = load_sweep(args.experiment, args.overrides)
        for p in points:
            print(p.name)
        return 0
    executor = args.executor or ("dask" if args.scheduler else "local")
    outcome = run_sweep(
        args.experiment, args.overrides, out=args.out, jobs=args.jobs, executor=executor,
        scheduler=args.scheduler, progress=not args.no_progress,
    )  # fmt: skip
    complete = len(outcome.skipped) + len(outcome.executed)
    print(
        f"sweep: {complete}/{len(outcome.points)} runs complete ({len(outcome.executed)} ran now, "
        f"{len(outcome.skipped)} skipped as complete, {len(outcome.failed)} failed); index {outcome.index}"
    )
    if outcome.failed:
        for name, error in sorted(outcome.failed.items()):
            print(f"failed: {name}: {error}", file=sys.stderr)
    if outcome.interrupted is not None:
        sig = signal.Signals(outcome.interrupted).name
        print(f"lmsim: sweep interrupted by {sig}; finished runs are kept, rerun the same command to resume",
              file=sys.stderr)  # fmt: skip
    return outcome.exit_code


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("sweep", help="run every point of an experiment's sweep: block (resumable)")
    p.add_argument("experiment", help="experiment YAML with a sweep: block")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field before expansion (repeatable)")
    p.add_argument("--out", help="sweep directory (default: output.dir or runs/<name>)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="runs in parallel (default 1)")
    p.add_argument("--executor", choices=("local", "dask"), default=None,
                   help="local process pool (default) or dask.distributed")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="Dask scheduler address (default: a LocalCluster with -j workers)")
    p.add_argument("--list", action="store_true", help="print the run names and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)
