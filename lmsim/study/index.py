"""The sweep directory's index and spec: `sweep.parquet`, one row per complete run sorted by
run name, built from the run directories on disk (so it depends neither on the executor nor
on completion order), and `sweep.yaml`, the experiment and its points (with the points of an
earlier, longer sweep of the same configuration that are still in the folder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from lmsim.outputs import atomic_path, write_text
from lmsim.study.expand import SweepPoint, format_value

INDEX_FILE = "sweep.parquet"
SPEC_FILE = "sweep.yaml"
# Summary fields that measure the host, not the simulated system; they differ between two
# otherwise identical runs and are excluded when indexes are compared.
WALL_CLOCK_COLUMNS = ("wall_time_s", "router_us_per_decision", "requests_per_wall_s")
# Keys whose sweep varies the arrival rate (figures plot these on the x axis).
RATE_KEYS = ("workload.load", "workload.rate", "workload.time_scale", "workload.generator.params.rate")


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


def _dotted(raw: dict[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def build_index(out: Path, points: list[SweepPoint]):
    """One row per complete run, sorted by name: run, the swept keys, `offered_rate_per_s`
    (measured from arrivals) and every scalar of summary.json."""
    import pandas as pd

    from lmsim.study.rundir import COMPLETE_MARKER, is_complete

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
        # A key another point sweeps (an earlier, longer sweep's axis): this point's own value.
        row.update({k: p.params[k] if k in p.params else _dotted(p.raw, k) for k in keys})
        row["offered_rate_per_s"] = _offered_rate(run_dir)
        for k, v in summary.items():
            if k not in row and (v is None or isinstance(v, (bool, int, float, str))):
                row[k] = v
        # a changing fleet's totals (the nested block's scalars), as fleet_<name>
        for k, v in (summary.get("fleet") or {}).items():
            if isinstance(v, (bool, int, float)):
                row[f"fleet_{k}"] = v
        rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else ["run", *keys])
    for k in keys:
        if k in frame:
            frame[k] = _column(list(frame[k].astype(object).where(frame[k].notna(), None)))
    return frame


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
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_index(sweep_dir: str | os.PathLike[str]):
    """The index as a DataFrame, with `attrs["sweep_keys"]` the swept keys in order."""
    import pyarrow.parquet as pq

    table = pq.read_table(Path(sweep_dir) / INDEX_FILE)
    frame = table.to_pandas()
    meta = table.schema.metadata or {}
    frame.attrs["sweep_keys"] = json.loads(meta.get(b"lmsim.sweep_keys", b"[]"))
    return frame


def read_spec_points(sweep_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(name, params) of every point sweep.yaml records; none when it is absent or unreadable."""
    try:
        spec = yaml.safe_load((sweep_dir / SPEC_FILE).read_text()) or {}
        return [(str(p["name"]), dict(p["params"] or {})) for p in spec.get("points", [])]
    except (OSError, yaml.YAMLError, TypeError, KeyError, AttributeError):
        return []


def write_spec(out: Path, experiment_path: str, raw: dict[str, Any], points: list[SweepPoint]) -> None:
    spec = {
        "experiment": str(experiment_path),
        "config": raw,
        "points": [{"name": p.name, "params": p.params} for p in points],
    }
    text = yaml.safe_dump(spec, sort_keys=False)
    write_text(out / SPEC_FILE, text)


