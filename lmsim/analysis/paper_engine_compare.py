"""The same traffic on another engine: Figures 22 and 23 rerun with a cluster setting changed
(by default `cluster.engine: vllm-0.33`, issue 27) at exactly the arrival times of the saved
default-engine runs, and the claims' numbers under both.

    python -m lmsim.analysis.paper_engine_compare prepare runs/paper runs/paper-vllm033 \
        --set cluster.engine=vllm-0.33 --fig23-loads 0.5,0.8
    lmsim sweep runs/paper-vllm033/fig22.yaml -j 2     # and fig23.yaml
    python -m lmsim.analysis.paper_engine_compare compare runs/paper runs/paper-vllm033

(`reproduce_engine.sh` does all three.) Why not `workload.load` again: a load is a fraction
of the capacity measured on *this* cluster, so another engine would be offered other rates
(and, with no shipped capacity for it, would search first). Why not `workload.rate`: it scales
the replayed prefix (`workload.limit`) to that rate, while `load` stretches the prefix by the
factor that takes the *whole* generated workload (this seed's draw, before `limit`) to
load x capacity, so a prefix's own rate differs. `prepare` therefore gives every point
`workload.time_scale` = load x capacity / mean rate of that whole workload, the very
expression `shape_workload` evaluates, with the capacity the saved run recorded in its
summary.json, and checks that the trace each new point replays has the arrival times (and
closed-loop think times) of the trace its default run replayed, bit for bit. `--limit N`
shortens every point for a quick check (the factor is unchanged, so the first N arrivals
stay where they were).

`compare` pairs each new run with its default run, lays the new metrics over the default
index (same trace, policy, seed and load columns) and computes both through verdicts.py's
Figure 22 and 23 sections: the verdicts that differ, then every number side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from lmsim.config import validate
from lmsim.errors import ConfigError
from lmsim.study.capacity import Capacity, CapacitySearch, cache_key, remember_capacities
from lmsim.study.experiment import (
    capacity_seed_config,
    capacity_trace,
    load_workload_trace,
    workload_identity,
)
from lmsim.study.index import read_index
from lmsim.workload.scaling import mean_rate

FIGURES = ("fig22", "fig23")
LOAD, SCALE = "workload.load", "workload.time_scale"
PAIRS = "pairs.json"


def _verdicts() -> Any:
    from lmsim.analysis import paper_verdicts

    return paper_verdicts


def _canonical(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=repr)


def _parse_set(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        out[key] = yaml.safe_load(text)
    return out


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _drop_dotted(raw: dict[str, Any], key: str) -> None:
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        node = node.get(part, {})
    node.pop(last, None)


def time_scale_of(run_dir: Path, experiment_dir: Path | None) -> tuple[dict[str, Any], float]:
    """(the run's config, the time-scale factor its `workload.load` applied): load x the
    capacity recorded in summary.json / the mean rate of the run's whole workload (its own
    seed's draw, before `limit`; the capacity seed's draw only names the capacity),
    evaluated as shape_workload does."""
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    config = validate(raw, where=str(run_dir / "config.yaml"))
    summary = json.loads((run_dir / "summary.json").read_text())
    capacity = summary.get("capacity_req_s")
    if config.workload.load is None or capacity is None:
        raise ConfigError(f"{run_dir}: not a run scaled by workload.load with a recorded capacity")
    whole = capacity_trace(config, experiment_dir)
    return raw, config.workload.load * float(capacity) / mean_rate(whole)


def _same_traffic(default_raw: dict[str, Any], new_raw: dict[str, Any], capacity: float, where: str) -> None:
    """The new point's trace has the default run's arrivals and think times, bit for bit
    (the default trace rebuilt with its recorded capacity fed to the lookup)."""
    config = validate(default_raw, where=where)
    key = cache_key(workload_identity(capacity_seed_config(config)), config, CapacitySearch())
    remember_capacities({key: Capacity(capacity, "recorded", key)})
    old = load_workload_trace(config, capacity="lookup")
    new = load_workload_trace(validate(new_raw, where=where), capacity="lookup")
    same = np.array_equal(old.arrival_s, new.arrival_s) and np.array_equal(
        old.column("delay_s"), new.column("delay_s"))  # fmt: skip
    if not same:
        raise ConfigError(f"{where}: the time-scaled trace does not replay the default run's arrivals")


def prepare(root: Path, out: Path, changes: dict[str, Any], fig23_loads: list[float] | None,
            limit: int | None, figures: tuple[str, ...] = FIGURES) -> list[Path]:  # fmt: skip
    """Write `out/<fig>.yaml` (every point zipped, `time_scale` for `load`, `changes` set)
    and `out/pairs.json` (new point params -> default run). Returns the YAMLs written."""
    out.mkdir(parents=True, exist_ok=True)
    pairs: dict[str, dict[str, str]] = {}
    written = []
    for fig in figures:
        sweep_file = root / fig / "sweep.yaml"
        if not sweep_file.exists():
            continue
        saved = yaml.safe_load(sweep_file.read_text())
        experiment_dir = Path(saved["experiment"]).parent if saved.get("experiment") else None
        base = {k: v for k, v in saved["config"].items() if k not in ("sweep", "zip", "seeds")}
        _drop_dotted(base, LOAD)
        for key, value in changes.items():
            _set_dotted(base, key, value)
        base["name"] = f"{base.get('name', fig)}-same-traffic"
        base.setdefault("output", {})["dir"] = str((out / fig).resolve())
        points, fig_pairs = [], {}
        for point in saved["points"]:
            run_dir = root / fig / point["name"]
            if not (run_dir / "summary.json").exists():
                continue
            params = dict(point["params"])
            if fig == "fig23" and fig23_loads is not None and not any(
                    math.isclose(float(params[LOAD]), x) for x in fig23_loads):  # fmt: skip
                continue
            default_raw, factor = time_scale_of(run_dir, experiment_dir)
            params.pop(LOAD, None)
            params[SCALE] = factor
            if limit is not None:
                params["workload.limit"] = min(limit, int(params.get("workload.limit") or limit))
            new_raw = json.loads(json.dumps(default_raw))
            new_raw["workload"].update({"load": None, "time_scale": factor})
            for key, value in changes.items():
                _set_dotted(new_raw, key, value)
            if limit is not None:
                new_raw["workload"]["limit"] = params["workload.limit"]
                default_raw["workload"]["limit"] = params["workload.limit"]
            _same_traffic(default_raw, new_raw, json.loads((run_dir / "summary.json").read_text())["capacity_req_s"],
                          f"{run_dir}")  # fmt: skip
            points.append(params)
            fig_pairs[_canonical(params)] = point["name"]
        if not points:
            continue
        keys = sorted({k for p in points for k in p})
        base["sweep"] = {k: [p.get(k) for p in points] for k in keys}
        base["zip"] = [keys] if len(keys) > 1 else None
        path = out / f"{fig}.yaml"
        tmp = path.with_name(f".{path.name}.tmp")
        header = (f"# {fig} at the arrival times of {root / fig}'s runs (engine_compare.py prepare);\n"
                  f"# changed: {', '.join(f'{k}={v}' for k, v in changes.items()) or 'nothing'}\n")  # fmt: skip
        tmp.write_text(header + yaml.safe_dump(base, sort_keys=False))
        tmp.replace(path)
        written.append(path)
        pairs[fig] = fig_pairs
    tmp = out / f".{PAIRS}.tmp"
    tmp.write_text(json.dumps({"root": str(root), "changes": changes, "pairs": pairs}, indent=1, default=repr) + "\n")
    tmp.replace(out / PAIRS)
    return written


def paired_frames(root: Path, other: Path, fig: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(default rows, the same rows with the other engine's metrics), the default rows
    restricted to the runs that have a finished partner."""
    v = _verdicts()
    pairs = json.loads((other / PAIRS).read_text())["pairs"].get(fig)
    frame = v.load(root, fig)
    if not pairs or frame is None or not (other / fig / "sweep.parquet").exists():
        return None
    saved = yaml.safe_load((other / fig / "sweep.yaml").read_text())
    partner = {pairs[_canonical(p["params"])]: p["name"] for p in saved["points"] if _canonical(p["params"]) in pairs}
    new_index = read_index(other / fig).set_index("run")
    rows = frame[frame["run"].isin([d for d, n in partner.items() if n in new_index.index])].copy()
    metrics = [c for c in new_index.columns if c in rows.columns and "." not in c and c not in ("seed", "run")]
    swapped = rows.copy()
    for column in metrics:
        swapped[column] = [new_index.loc[partner[r], column] for r in rows["run"]]
    return rows, swapped


def compare(root: Path, other: Path, labels: tuple[str, str]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    v = _verdicts()
    lines: list[str] = []
    default_numbers: dict[str, Any] = {}
    other_numbers: dict[str, Any] = {}
    for fig, section in (("fig22", v.fig22_rows), ("fig23", v.fig23_rows)):
        frames = paired_frames(root, other, fig)
        if frames is None:
            continue
        rows, swapped = frames
        section(rows, default_numbers)
        lines += [f"# {fig} under {labels[1]} ({len(swapped)} runs, the arrival times of {labels[0]}'s)", "",
                  *section(swapped, other_numbers), ""]  # fmt: skip
    if not other_numbers:
        return lines, default_numbers, other_numbers
    lines += [*v.changed_verdicts(default_numbers, other_numbers, labels), ""]
    lines += v.compare(default_numbers, other_numbers, labels)
    return lines, default_numbers, other_numbers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the same-traffic sweeps")
    p.add_argument("root", type=Path, help="the default-engine reproduction (runs/paper)")
    p.add_argument("out", type=Path, help="where the new sweeps go (runs/paper-vllm033)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="cluster setting to change (default: cluster.engine=vllm-0.33)")  # fmt: skip
    p.add_argument("--fig23-loads", default="0.5,0.8", help="loads of Figure 23 to rerun ('all' for every one)")
    p.add_argument("--limit", type=int, help="replay only the first N requests of each point (a quick check)")
    p.add_argument("--figures", default=",".join(FIGURES), help="which of fig22,fig23")
    c = sub.add_parser("compare", help="the claims' numbers under both engines")
    c.add_argument("root", type=Path)
    c.add_argument("other", type=Path)
    c.add_argument("--labels", default="default,vllm-0.33", help="names of the two engines in the tables")
    c.add_argument("--json", type=Path, help="write both sets of numbers here")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            loads = None if args.fig23_loads == "all" else [float(x) for x in args.fig23_loads.split(",")]
            changes = _parse_set(args.set) if args.set else {"cluster.engine": "vllm-0.33"}
            figures = tuple(f for f in args.figures.split(",") if f)
            written = prepare(args.root, args.out, changes, loads, args.limit, figures)
            if not written:
                raise ConfigError(f"{args.root}: no finished fig22/fig23 runs to mirror")
            for path in written:
                print(path)
            return 0
        if not (args.other / PAIRS).exists():
            raise ConfigError(f"{args.other / PAIRS}: missing (run `engine_compare.py prepare` first)")
        labels = tuple(args.labels.split(",", 1))
        lines, before, after = compare(args.root, args.other, labels)  # type: ignore[arg-type]
        if not after:
            raise ConfigError(f"{args.other}: no finished run paired with {args.root}")
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print("\n".join(lines))
    if args.json is not None:
        def clean(numbers: dict[str, Any]) -> dict[str, Any]:
            return {k: (None if isinstance(x, float) and math.isnan(x) else x) for k, x in numbers.items()}

        tmp = args.json.with_name(f".{args.json.name}.tmp")
        tmp.write_text(json.dumps({labels[0]: clean(before), labels[1]: clean(after)}, indent=1, sort_keys=True) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
