"""`lmsim bench`: a fixed set of workloads that measure simulator speed and memory.

Each workload runs in a fresh child process so its peak RSS is its own. Figures are printed,
never asserted (tests do not depend on wall-clock time). `--json PATH` writes the table as a
list of records for comparison across commits; `--profile` adds a cProfile breakdown of where
the time goes, grouped by component. Beside wall time each row gives the process's CPU time
(`req/cpu s`): on a shared machine wall time mostly measures the other jobs.

Workloads: the points of the bundled experiments/bench/full.yaml (quick.yaml with
`--quick`), 16 Qwen3-30B-A3B instances on H20 at load 0.5 of measured capacity:
* chatbot generator with `vllm`, `lmetric` and `llmd`;
* coder generator (closed-loop agent sessions) with `lmetric`;
* a 1M-request agent trace with `lmetric` (100k with `--quick`).
Their capacities ship in experiments/capacity.json (`lmsim capacity --bundle`, also run
by experiments/remeasure_capacities.sh), so a bench never searches; should one be
missing, the search is announced on stderr and is not timed.
"""

from __future__ import annotations

import cProfile
import multiprocessing as mp
import os
import pstats
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

from lmsim.config import validate


@dataclass(frozen=True)
class Workload:
    name: str
    policy: str
    raw: dict[str, Any]  # the point's experiment


def workloads(quick: bool) -> list[Workload]:
    from lmsim.shipped import EXPERIMENTS_DIR
    from lmsim.study.expand import load_sweep

    _raw, points = load_sweep(EXPERIMENTS_DIR / "bench" / ("quick.yaml" if quick else "full.yaml"))
    return [Workload(p.raw["name"], p.raw["router"]["policy"], p.raw) for p in points]


CATEGORIES = (
    ("router", ("lmsim/engine/router.py", "lmsim/engine/views.py", "lmsim/policies/")),
    ("kv cache", ("lmsim/engine/kv_cache.py",)),
    ("scheduler", ("lmsim/engine/scheduler.py", "lmsim/engine/instance.py")),
    ("cost model", ("lmsim/profile/",)),
    ("simpy", ("simpy/",)),
    ("metrics", ("lmsim/engine/metrics.py", "lmsim/engine/results.py")),
    ("replay", ("lmsim/engine/simulation.py", "lmsim/engine/clock.py", "lmsim/engine/request.py")),
)


def _category(filename: str) -> str:
    path = filename.replace(os.sep, "/")
    for name, parts in CATEGORIES:
        if any(p in path for p in parts):
            return name
    return "other (numpy, builtins)"


def profile_breakdown(stats: pstats.Stats) -> dict[str, float]:
    """Self time per component, as fractions of the total."""
    totals: dict[str, float] = {}
    for (filename, _line, _func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        cat = _category(filename)
        totals[cat] = totals.get(cat, 0.0) + tottime
    whole = sum(totals.values()) or 1.0
    return {k: v / whole for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def run_workload(w: Workload, profile: bool) -> dict[str, Any]:
    """Run one workload in this process; returns its row of the table."""
    from lmsim.study.compose import build_simulation
    from lmsim.study.experiment import load_workload_trace

    config = validate(w.raw, where=f"bench {w.name}/{w.policy}")

    def announce(line: str) -> None:
        print(f"bench {w.name}/{w.policy}: {line}", file=sys.stderr, flush=True)

    trace = load_workload_trace(config, log=announce)  # generation and a capacity search are not timed
    sim = build_simulation(config, trace)
    profiler = cProfile.Profile() if profile else None
    started, cpu_started = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    results = sim.run()
    if profiler is not None:
        profiler.disable()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    s = results.summary
    row: dict[str, Any] = {
        "workload": w.name,
        "policy": w.policy,
        "num_requests": s["num_requests"],
        "requests_per_s": s["num_finished"] / wall,
        "sim_s_per_wall_s": s["sim_time_s"] / wall,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_cpu_s": s["num_finished"] / cpu if cpu > 0 else None,
        "steps": s["num_steps"],
        "events": s["num_step_events"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "router_us_per_decision": s["router_us_per_decision"],
    }
    if profiler is not None:
        row["profile"] = profile_breakdown(pstats.Stats(profiler))
    return row


def _child(w: Workload, profile: bool, queue: Any) -> None:
    try:
        queue.put(run_workload(w, profile))
    except BaseException as exc:  # report, the parent prints it
        queue.put({"workload": w.name, "policy": w.policy, "error": f"{type(exc).__name__}: {exc}"})


def run_bench(quick: bool, profile: bool, only: str | None = None) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    rows = []
    for w in workloads(quick):
        if only and only not in (w.name, w.policy, f"{w.name}/{w.policy}"):
            continue
        queue = ctx.Queue()
        proc = ctx.Process(target=_child, args=(w, profile, queue))
        proc.start()
        row = queue.get()
        proc.join()
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


HEADER = (
    f"{'workload':12} {'policy':8} {'requests':>9} {'req/s':>8} {'req/cpu s':>9} {'sim s/s':>8} "
    f"{'steps':>10} {'events':>9} {'RSS MB':>7} {'router us':>9}"
)


def format_row(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['workload']:12} {row['policy']:8} error: {row['error']}"
    line = (
        f"{row['workload']:12} {row['policy']:8} {row['num_requests']:>9} {row['requests_per_s']:>8.0f} "
        f"{row['requests_per_cpu_s'] or 0:>9.0f} "
        f"{row['sim_s_per_wall_s']:>8.1f} {row['steps']:>10} {row['events']:>9} "
        f"{row['peak_rss_mb']:>7.0f} {row['router_us_per_decision']:>9.1f}"
    )
    if "profile" in row:
        parts = ", ".join(f"{k} {100 * v:.0f}%" for k, v in row["profile"].items())
        line += f"\n{'':22}time: {parts}"
    return line
