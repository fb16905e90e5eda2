"""Sweep execution: run every incomplete point on a process pool or Dask, resume after an
interruption, and keep the index current.

`local` is a process pool (in-process for `-j 1`); `dask` is a LocalCluster or a given
scheduler. A run whose directory is complete and whose saved config equals the one it would
get is skipped; SIGINT/SIGTERM stop the sweep, discard the runs in flight (their temporary
directories) and leave finished runs untouched. A sweep directory holds one run directory
per point, `sweep.parquet`, `sweep.yaml` and, for failed runs, `<name>.error.txt` with the
traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmsim.config import ExperimentConfig, validate
from lmsim.errors import counted
from lmsim.study.expand import SweepError, SweepPoint, base_config, load_sweep, point_config
from lmsim.study.index import INDEX_FILE, read_spec_points, write_index, write_spec
from lmsim.study.rundir import (
    RUN_FILES,
    check_output_dir,
    default_directory,
    directory_kind,
    is_complete,
    is_own_partial,
    saved_config_difference,
    write_kind_marker,
)

LOCK_FILE = ".sweep.lock"
CONNECT_TIMEOUT_S = 5.0


class SweepInterrupted(BaseException):
    """Raised in the main thread by the SIGINT/SIGTERM handler installed during a sweep.

    A BaseException so that no `except Exception` inside a run swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# -- one run -----------------------------------------------------------------------------


def _log_to_stderr(name: str) -> Callable[[str], None]:
    def log(line: str) -> None:
        print(f"[{name}] {line}", file=sys.stderr, flush=True)

    return log


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """Run one point and save it; never raises for a failing run (the error is returned), so
    both executors report failures the same way. Executed in a worker process, which first
    imports the sweep's plug-ins (`lmsim.plugins.install_plugins`: a spawned or remote
    worker has none). The result names the worker's process (`pid`)."""
    from lmsim.plugins import install_plugins
    from lmsim.study.capacity import remember_capacities
    from lmsim.study.experiment import load_workload_trace, simulate
    from lmsim.study.rundir import save_run

    started = time.perf_counter()
    name = task["name"]
    try:
        install_plugins(task.get("plugins", ()))
        remember_capacities(task.get("capacities", {}))
        config = validate(task["raw"], where=f"{task['where']} [{name}]")
        trace = load_workload_trace(config, Path(task["experiment_dir"]), log=_log_to_stderr(name))
        results = simulate(config, trace)
        save_run(results, Path(task["out"]) / name, figure=config.output.figures)
    except Exception as exc:
        message = str(exc).splitlines()[0] if str(exc) else ""
        return {
            "name": name,
            "ok": False,
            "error": f"{type(exc).__name__}: {message}",
            "traceback": traceback.format_exc(),
            "pid": os.getpid(),
        }
    return {"name": name, "ok": True, "wall_s": time.perf_counter() - started, "pid": os.getpid()}


def _resolve_capacities(tasks: list[dict[str, Any]]) -> None:
    """Search, once and here in the parent, every capacity the runs' `load:` needs and no
    cache has, so the search is announced with its probes on stderr, and send each run the
    capacities it needs (`task["capacities"]`): workers only look them up, and a worker on
    another machine, without this machine's cache, does not repeat the search in silence."""
    from lmsim.study.capacity import CapacitySearch, cache_key, lookup_capacity, resolve_capacity
    from lmsim.study.experiment import capacity_seed_config, capacity_trace, workload_identity

    seen: set[str] = set()
    for task in tasks:
        try:
            config = validate(task["raw"], where=f"{task['where']} [{task['name']}]")
            if config.workload.load is None:
                continue
            experiment_dir = Path(task["experiment_dir"])
            identity = workload_identity(capacity_seed_config(config), experiment_dir)
            key = cache_key(identity, config, CapacitySearch())
        except Exception:
            continue  # the run itself reports what is wrong with it
        if key not in seen and lookup_capacity(key) is None:
            print(f"sweep: run {task['name']} needs a capacity no cache has", file=sys.stderr, flush=True)
            resolve_capacity(capacity_trace(capacity_seed_config(config), experiment_dir), config, workload=identity,
                             log=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
        seen.add(key)
        found = lookup_capacity(key)
        if found is not None:
            task["capacities"] = {key: found}


def _warm_trace_cache(tasks: list[dict[str, Any]]) -> None:
    """Generate here, before the pool forks its workers, every generated workload that two
    or more points share: the workers inherit the parent's trace cache (copy-on-write), so
    each workload is generated once per sweep instead of once per worker or per point
    (the coder workload costs ~3-7 s CPU, as much as a fig11 point's simulation)."""
    from collections import Counter

    from lmsim.study.experiment import capacity_seed_config, generated_trace

    wanted: Counter[tuple[str, str, int]] = Counter()
    specs: dict[tuple[str, str, int], tuple[str, dict[str, Any], int]] = {}
    for task in tasks:
        try:
            config = validate(task["raw"], where=f"{task['where']} [{task['name']}]")
        except Exception:
            continue  # the run itself reports what is wrong with it
        configs = [config]
        if config.workload.load is not None:
            configs.append(capacity_seed_config(config))
        for cfg in {id(c): c for c in configs}.values():
            gen = cfg.workload.generator
            if gen is None:
                continue
            key = (gen.name, repr(sorted(gen.params.items())), cfg.seed)
            wanted[key] += 1
            specs[key] = (gen.name, dict(gen.params), cfg.seed)
    for key, count in wanted.items():
        if count > 1:
            with contextlib.suppress(Exception):  # a failing generation fails its runs later
                generated_trace(*specs[key])


def _config_difference(run_dir: Path, raw: dict[str, Any]) -> str | None:
    try:
        wanted = ExperimentConfig.model_validate(raw).to_dict()
    except Exception:
        return "no longer a valid point"
    return saved_config_difference(run_dir, wanted)


@dataclass
class _Survey:
    """What an existing sweep directory holds, judged against the experiment now given:
    `changed` finished runs (name -> first difference) that it would make differently, and
    the points of an earlier, longer sweep (`earlier`, recorded in sweep.yaml) still
    finished and made as this experiment would make them."""

    changed: dict[str, str] = field(default_factory=dict)
    earlier: list[SweepPoint] = field(default_factory=list)


def _survey(out: Path, raw: dict[str, Any], points: list[SweepPoint], where: str) -> _Survey:
    survey = _Survey()
    if directory_kind(out) != "sweep":
        return survey
    current = {p.name for p in points}
    base = base_config(raw)
    candidates = list(points)
    for name, params in read_spec_points(out):
        if name in current or not is_complete(out / name):
            continue
        try:
            candidates.append(SweepPoint(name, params, point_config(base, params, where=where)))
        except Exception:
            survey.changed[name] = "no longer a valid point"
    for p in candidates:
        if not is_complete(out / p.name):
            continue
        difference = _config_difference(out / p.name, p.raw)
        if difference is not None:
            survey.changed[p.name] = difference
        elif p.name not in current:
            survey.earlier.append(p)
    return survey


def _sweep_directory(given: Path | None, default: Path, raw: dict[str, Any], points: list[SweepPoint],
                     where: str, *, overwrite: bool) -> tuple[Path, _Survey]:
    """Where the sweep writes, and what is there already. A named `--out` must be absent,
    empty or an lmsim sweep; runs there that this experiment would make differently are
    replaced only with `overwrite`. Without `--out`, like `lmsim run`: the default folder,
    or (when it holds runs of another configuration, or anything else) the first of
    `-2`, `-3`, ... that is free or holds this same sweep; with `overwrite`, the default."""
    if given is None and not overwrite:
        surveys: dict[Path, _Survey] = {}

        def reusable(path: Path) -> bool:
            if directory_kind(path) != "sweep":
                return False
            surveys[path] = _survey(path, raw, points, where)
            return not surveys[path].changed

        path = default_directory(default, reusable)
        check_output_dir(path, "sweep", resumable=True)
        return path, surveys.get(path) or _survey(path, raw, points, where)
    path = given if given is not None else default
    check_output_dir(path, "sweep", resumable=True)
    survey = _survey(path, raw, points, where)
    if survey.changed and not overwrite:
        name, difference = next(iter(survey.changed.items()))
        count = len(survey.changed)
        raise SweepError(
            f"{path}: {count} finished run{'s were' if count != 1 else ' was'} made from another "
            f"configuration ({name}: {difference}); pass --overwrite to replace "
            f"{'them' if count != 1 else 'it'}, or choose another --out"
        )
    for name in survey.changed:  # refused now, not after hours of sweeping
        check_output_dir(path / name, "run", overwrite=True, allowed_files=RUN_FILES)
    return path, survey


def _discard_partials(out: Path, names: list[str]) -> int:
    """Remove the temporary and replaced-old directories `save_run` leaves behind when its
    process dies mid-write; only for this sweep's points, and only directories lmsim marked
    as its own (`is_own_partial`)."""
    removed = 0
    if not out.exists():
        return 0
    wanted = set(names)
    for entry in out.iterdir():
        m = re.fullmatch(r"\.(.+)\.(tmp|old)-\d+", entry.name)
        if m and m.group(1) in wanted and is_own_partial(entry):
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    for tmp in out.glob(f".{INDEX_FILE}.tmp-*"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
    return removed


# -- execution ---------------------------------------------------------------------------


@dataclass
class SweepOutcome:
    out: Path
    points: list[SweepPoint]
    skipped: list[str] = field(default_factory=list)  # complete before this invocation
    executed: list[str] = field(default_factory=list)  # ran to completion now
    failed: dict[str, str] = field(default_factory=dict)  # name -> one-line error
    stale: list[str] = field(default_factory=list)  # complete but made from another config (--overwrite)
    earlier: list[str] = field(default_factory=list)  # complete points of an earlier, longer sweep, kept
    removed: list[str] = field(default_factory=list)  # earlier points of another config (--overwrite)
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
    path = out / LOCK_FILE
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SweepError(f"{out}: another sweep is writing to this directory") from None
        try:
            yield
        finally:
            # Removed while still held, so a sweep waiting on it finds it gone or free; the
            # folder is left as the sweep's files alone.
            path.unlink(missing_ok=True)


def _run_inline(tasks: list[dict[str, Any]], report: Callable[[dict[str, Any]], None]) -> None:
    for task in tasks:
        report(run_point(task))


def _run_pool(tasks: list[dict[str, Any]], jobs: int, report: Callable[[dict[str, Any]], None]) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # fork: workers inherit the imported package (no re-import per worker); the initializer
    # resets the signal handlers the parent installed.
    fork = sys.platform.startswith("linux")
    ctx = multiprocessing.get_context("fork" if fork else "spawn")
    if fork:
        _warm_trace_cache(tasks)
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
        # Runs in flight are abandoned: kill their workers now rather than wait for them.
        # (ProcessPoolExecutor has no public way to do this.) The pending futures are not
        # cancelled: the pool's manager thread then fails each one with BrokenProcessPool,
        # and on Python 3.11 it raises InvalidStateError (printed from its thread) for a
        # future cancelled before it got there (3.12's concurrent/futures/process.py,
        # terminate_broken, ignores it). Nobody waits on these futures: failing them is
        # harmless.
        for proc in list(getattr(executor, "_processes", {}).values()):
            proc.terminate()
        for proc in list(getattr(executor, "_processes", {}).values()):
            proc.join(timeout=10)
        executor.shutdown(wait=False)
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

    token = secrets.token_hex(6)  # unique task keys on a shared scheduler
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
    overwrite: bool = False,
) -> SweepOutcome:
    """Run every incomplete point of the experiment's sweep and write the index.

    Finished runs are never silently discarded: the output directory is chosen as
    `_sweep_directory` says, and with `overwrite` the runs this experiment would make
    differently are rerun and every point it no longer gives is removed. Without it, points of
    an earlier, longer sweep of the same configuration stay in the index.

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
    first = validate(points[0].raw, where=str(experiment))
    default = Path(first.output.dir or Path("runs") / first.name)
    # Absent, empty or a sweep lmsim made: never a run directory or the user's own folder.
    out_given, survey = _sweep_directory(Path(out) if out else None, default, raw, points, str(experiment),
                                         overwrite=overwrite)  # fmt: skip
    out_dir = out_given.resolve()
    outcome = SweepOutcome(out_dir, points, earlier=[p.name for p in survey.earlier])
    current = {p.name for p in points}
    names = [p.name for p in points] + [n for n in survey.changed if n not in current]

    client = cluster = None
    if executor == "dask":
        client, cluster = _dask_client(jobs, scheduler)  # fails before anything is touched

    from lmsim.plugins import loaded_plugins
    from lmsim.progress import progress_bar

    experiment_dir = str(Path(experiment).resolve().parent)
    plugins = loaded_plugins()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_kind_marker(out_dir, "sweep")
        with _lock(out_dir):
            _discard_partials(out_dir, names)
            for name in survey.changed:
                if name not in current:  # --overwrite: a point this experiment no longer has
                    shutil.rmtree(out_dir / name)
                    outcome.removed.append(name)
            if overwrite:
                # --overwrite makes the folder exactly this sweep: a point an earlier sweep of the
                # same base config ran and this one no longer has (a shortened axis, or a zipped
                # value changed beside a value still swept) would otherwise stay in the index
                # and be averaged with this sweep's runs in figures and tables
                for p in survey.earlier:
                    shutil.rmtree(out_dir / p.name)
                    outcome.removed.append(p.name)
                survey.earlier.clear()
                outcome.earlier.clear()
            todo = []
            for p in points:
                run_dir = out_dir / p.name
                if is_complete(run_dir):
                    if p.name not in survey.changed:
                        outcome.skipped.append(p.name)
                        continue
                    outcome.stale.append(p.name)
                todo.append({
                    "name": p.name, "raw": p.raw, "where": str(experiment),
                    "experiment_dir": experiment_dir, "out": str(out_dir), "plugins": plugins,
                })  # fmt: skip
            indexed = points + survey.earlier
            write_spec(out_dir, str(experiment), raw, indexed)
            _resolve_capacities(todo)
            where = "Dask " + (scheduler or "LocalCluster") if executor == "dask" else f"local pool (-j {jobs})"
            print(
                f"sweep {first.name}: {counted(len(points), 'run')}, {len(outcome.skipped)} already complete, "
                f"{len(todo)} to run on {where}; output {out_dir}"
                + (f" ({default} holds another configuration's runs or files, kept)"
                   if out is None and out_given != default else "")
                + (f"; {counted(len(outcome.stale), 'finished run')} of another configuration replaced (--overwrite)"
                   if outcome.stale else "")
                + (f"; {counted(len(outcome.removed), 'run')} of points it no longer has removed (--overwrite)"
                   if outcome.removed else "")
                + (f"; {counted(len(outcome.earlier), 'run')} of an earlier, longer sweep kept in the index"
                   if outcome.earlier else ""),
                flush=True,
            )
            bar = progress_bar(progress and bool(todo), total=len(todo), unit="run", desc="sweep")

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
                    outcome.index = write_index(out_dir, indexed, raw)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
    return outcome


