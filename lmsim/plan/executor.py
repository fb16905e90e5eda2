"""Where a plan's probes run: in this process (one worker), on a local process pool kept for the
whole plan, or on Dask (a LocalCluster, or a given scheduler), as `lmsim sweep` runs its points
(the pool and client come from lmsim.study.execute)."""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Iterator
from typing import Any

from lmsim.plan.probe import run_probe


class ProbeExecutor:
    def __init__(self, workers: int = 1, dask: str | None = None) -> None:
        """`dask`: a scheduler address, or `local` for a LocalCluster of `workers` processes."""
        self.workers = workers
        self.dask = dask
        self._pool: Any = None
        self._client: Any = None
        self._cluster: Any = None
        if dask is not None:
            from lmsim.study.execute import _dask_client

            self._client, self._cluster = _dask_client(workers, None if dask == "local" else dask)
        elif workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            from lmsim.study.execute import _worker_init

            fork = sys.platform.startswith("linux")
            ctx = multiprocessing.get_context("fork" if fork else "spawn")
            self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init)

    @property
    def where(self) -> str:
        if self._client is not None:
            return "Dask " + ("LocalCluster" if self.dask == "local" else str(self.dask))
        return f"local pool ({self.workers} workers)" if self._pool is not None else "this process"

    def run(self, tasks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Each task's result, in completion order."""
        if not tasks:
            return
        if self._client is not None:
            from distributed import as_completed

            token = secrets.token_hex(6)
            futures = [self._client.submit(run_probe, t, key=f"lmsim-plan-{token}-{i}", pure=False, retries=0)
                       for i, t in enumerate(tasks)]  # fmt: skip
            for fut in as_completed(futures):
                yield fut.result()
        elif self._pool is not None:
            from concurrent.futures import as_completed as done

            futures = [self._pool.submit(run_probe, t) for t in tasks]
            for fut in done(futures):
                yield fut.result()
        else:
            for task in tasks:
                yield run_probe(task)

    def close(self) -> None:
        if self._pool is not None:
            # Probes in flight (an interruption) are abandoned: end their workers now (the pool
            # has no public way to), as lmsim sweep does; after a normal end there are none.
            workers = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for proc in workers:
                with contextlib.suppress(Exception):
                    proc.terminate()
            self._pool = None
        for thing in (self._client, self._cluster):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
