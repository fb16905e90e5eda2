"""One probe of the search (a design at an instance count, on a slice of the workload, under one
seed) run in a worker, and the store of every probe a plan has made (`probes.jsonl` in the
plan's folder), which a rerun reads back so that an interrupted plan resumes without running
any probe again.

A probe's key is a digest of everything its verdict depends on: the experiment it runs (the
design's config, seed, slice), the SLO and the stopping rules. Change any and the probe runs
again; change nothing and it is read back."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

PROBES_FILE = "probes.jsonl"


def probe_key(raw: dict[str, Any], slo: dict[str, float], stop: dict[str, Any]) -> str:
    payload = {"experiment": raw, "slo": slo, "stop": stop, "version": 1}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()[:24]


def run_probe(task: dict[str, Any]) -> dict[str, Any]:
    """Simulate one probe and judge it; returns the verdict, the bound statistics, how far
    the run went and its wall time. Never raises: an error comes back as `error`."""
    import traceback

    from lmsim.config import validate
    from lmsim.plan.slo import EarlyStop, measure, parse_bounds
    from lmsim.plugins import install_plugins
    from lmsim.study.compose import build_simulation
    from lmsim.study.experiment import load_workload_trace

    started = time.perf_counter()
    try:
        install_plugins(task.get("plugins", ()))
        config = validate(task["raw"], where=task["where"])
        trace = load_workload_trace(config, Path(task["experiment_dir"]))
        stop = task["stop"]
        sim_cfg = config.simulation.model_copy(update={"drain_limit_s": stop["drain_limit_s"], "check": False})
        config = config.model_copy(update={"simulation": sim_cfg})
        sim = build_simulation(config, trace)
        bounds = parse_bounds(task["slo"])
        early = None
        if stop["early_stop"]:
            early = EarlyStop(sim, bounds, config.output.slo.model_dump())
            sim.add_periodic(stop["check_interval_s"], early)
        results = sim.run()
        values = measure(bounds, results)
        met = all(b.met(values[b.key]) for b in bounds)
        arrived = int((results.requests["status"] != "not_arrived").sum())
        span = float(trace.arrival_s[-1] - trace.arrival_s[0]) if len(trace) > 1 else 0.0
        return {
            "key": task["key"], "ok": True, "met": met, "values": values,
            "judged": {b.key: {"value": values[b.key], "limit": b.limit, "met": b.met(values[b.key])} for b in bounds},
            "early": early.verdict if early is not None else None,
            "stopped_at_s": early.at_s if early is not None else None,
            "requests": len(trace), "arrived": arrived, "finished": int(results.summary["num_finished"]),
            "offered_output_tok_s": float(trace.output_tokens.sum()) / span if span > 0 else None,
            "wall_s": time.perf_counter() - started, "pid": os.getpid(),
        }  # fmt: skip
    except Exception as exc:
        return {"key": task["key"], "ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                "traceback": traceback.format_exc(), "wall_s": time.perf_counter() - started}  # fmt: skip


class ProbeStore:
    """Probes by key, appended to `probes.jsonl` as they finish (one JSON object a line; a
    line cut by an interruption is ignored on reading)."""

    def __init__(self, folder: Path | None) -> None:
        self.path = folder / PROBES_FILE if folder is not None else None
        self.found: dict[str, dict[str, Any]] = {}
        self.reused = 0  # probes read back instead of run
        if self.path is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and entry.get("ok") and "key" in entry:
                    self.found[entry["key"]] = entry

    def get(self, key: str) -> dict[str, Any] | None:
        return self.found.get(key)

    def add(self, entry: dict[str, Any]) -> None:
        self.found[entry["key"]] = entry
        if self.path is not None and entry.get("ok"):
            with open(self.path, "a") as fh:
                fh.write(json.dumps({k: v for k, v in entry.items() if k != "traceback"}, sort_keys=True) + "\n")
