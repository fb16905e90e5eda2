"""Any set of saved runs, read-only: run directories and sweep directories (which expand to
their runs), with the configuration keys that distinguish them and titles in words.

The distinguishing keys come from diffing the runs' saved `config.yaml` files, so ad-hoc
runs (`lmsim run ... --set router.policy=...`) compare exactly like a sweep's points.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from lmsim.errors import LmsimError
from lmsim.study.expand import format_value
from lmsim.study.index import INDEX_FILE, RATE_KEYS, SPEC_FILE, _offered_rate, read_index
from lmsim.study.rundir import COMPLETE_MARKER, is_complete
from lmsim.viz.titles import load_words, model_words, policy_words, trace_words

# Config fields that name or place a run, or only check it: they never distinguish results.
IGNORED_KEYS = ("name", "description", "output.dir", "output.figures", "simulation.check", "sweep", "zip")
SEED_KEY = "seed"


class PlotError(LmsimError):
    """The results cannot support the requested figure or table."""


def as_text(column: pd.Series) -> pd.Series:
    """Values as comparable text, missing ones as "null". `astype(str)` is not enough: pandas
    3 keeps NaN missing where pandas 2 wrote "nan", so a key null for one policy and set for
    another (the canary's lambda) would vary under one pandas and not the other."""
    values = [v.item() if isinstance(v, np.generic) else v for v in column]
    return pd.Series([format_value(None if _missing(v) else v) for v in values], index=column.index, dtype=object)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, (float, np.floating)) and np.isnan(value))


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to scalar values; a list of mappings (`cluster.pools`) is numbered as
    `--set` and `sweep:` name its entries (`cluster.pools.0.num_instances`); other lists
    become their compact text."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, dotted + "."))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            flat.update(flatten({str(i): v for i, v in enumerate(value)}, dotted + "."))
        elif isinstance(value, (list, dict)):
            flat[dotted] = format_value(value) if value else None
        else:
            flat[dotted] = value
    return flat


def differing_keys(configs: list[dict[str, Any]]) -> list[str]:
    """Keys (in first-seen order) whose value is not the same in every config; a key
    missing from some configs differs unless it is null everywhere it appears."""
    keys: list[str] = []
    for c in configs:
        keys.extend(k for k in c if k not in keys)
    out = []
    for k in keys:
        if any(k == i or k.startswith(i + ".") for i in IGNORED_KEYS):
            continue
        values = {format_value(c.get(k)) for c in configs}
        if len(values) > 1:
            out.append(k)
    return out


# Keys of a cluster's pools and KV transfer: they move with the policy when disaggregated
# runs sit beside colocated ones, and would otherwise fill the legend.
_SHAPE_KEYS = ("cluster.pools.", "cluster.kv_transfer.")
# Short names a reader knows; every other key is shortened to its last component.
SHORT_NAMES = {"workload.generator.name": "trace", "workload.trace": "trace", "router.policy": "policy"}


def short_key(key: str) -> str:
    if key in SHORT_NAMES:
        return SHORT_NAMES[key]
    parts = key.split(".")
    numbered = [i for i, p in enumerate(parts) if p.isdigit()]
    if numbered:  # an entry of a list: keep the list's name and the number (pools.0.role)
        return ".".join(parts[numbered[-1] - 1:])
    return parts[-1]


def fmt(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return format_value(value)


def _in_spec_order(root: Path, frame: pd.DataFrame) -> pd.DataFrame:
    """The index rows in the order of the points in `sweep.yaml` (when it lists them)."""
    try:
        spec = yaml.safe_load((root / SPEC_FILE).read_text()) or {}
        order = {p["name"]: i for i, p in enumerate(spec.get("points", []))}
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        return frame
    position = [order.get(r, len(order)) for r in frame["run"]]
    return frame.assign(_order=position).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


class RunSet:
    """Read-only access to saved runs: `index` has one row per run (`run` a unique label,
    the distinguishing config keys, every scalar of summary.json, `offered_rate_per_s`);
    `keys` are the distinguishing keys; `configs[run]` the flattened configs."""

    def __init__(self, paths: str | os.PathLike[str] | list[str | os.PathLike[str]]) -> None:
        roots = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
        if not roots:
            raise PlotError("no run or sweep directory given")
        self.root = roots[0]
        self.roots = roots
        frames, self._dirs, self.configs = [], {}, {}
        sweep_keys: list[str] = []
        for root in roots:
            prefix = "" if len(roots) == 1 else (root.name or str(root)) + "/"
            if (root / INDEX_FILE).exists():
                frame = read_index(root)
                frame = _in_spec_order(root, frame)
                sweep_keys.extend(k for k in frame.attrs.get("sweep_keys", []) if k not in sweep_keys)
                dirs = [root / r for r in frame["run"]]
                frame = frame.assign(run=[prefix + r for r in frame["run"]])
            elif is_complete(root):
                summary = json.loads((root / COMPLETE_MARKER).read_text())
                row: dict[str, Any] = {"run": "." if len(roots) == 1 else prefix.rstrip("/")}
                row["offered_rate_per_s"] = _offered_rate(root)
                row.update({k: v for k, v in summary.items() if v is None or isinstance(v, (bool, int, float, str))})
                frame, dirs = pd.DataFrame([row]), [root]
            else:
                raise PlotError(f"{root}: neither a sweep directory (sweep.parquet) nor a complete run")
            for run, d in zip(frame["run"], dirs):
                if run in self._dirs:
                    raise PlotError(f"{d}: two runs would share the label {run!r}; pass distinct directories")
                self._dirs[run] = d
                path = d / "config.yaml"
                self.configs[run] = flatten(yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
            frames.append(frame)
        index = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        if not len(index):
            raise PlotError(f"{self.root}: the sweep has no complete runs")
        diff = differing_keys([self.configs[r] for r in index["run"]])
        # Sweep keys first (their order is the author's), then any other difference.
        self.keys = [k for k in sweep_keys if k in diff] + [k for k in diff if k not in sweep_keys]
        for k in self.keys:
            if k not in index:
                index[k] = [self.configs[r].get(k) for r in index["run"]]
        self.index = index
        self._requests: dict[str, pd.DataFrame] = {}
        self._events: dict[str, pd.DataFrame] = {}

    def run_dir(self, run: str) -> Path:
        return self._dirs[run]

    def requests(self, run: str) -> pd.DataFrame:
        if run not in self._requests:
            self._requests[run] = pq.read_table(self.run_dir(run) / "requests.parquet").to_pandas()
        return self._requests[run]

    def events(self, run: str) -> pd.DataFrame:
        if run not in self._events:
            path = self.run_dir(run) / "router_events.parquet"
            self._events[run] = pq.read_table(path).to_pandas() if path.exists() else pd.DataFrame()
        return self._events[run]

    # -- labels ---------------------------------------------------------------------------

    def varying(self, keys: list[str]) -> list[str]:
        return [k for k in keys if k in self.index and as_text(self.index[k]).nunique() > 1]

    def series_keys(self) -> list[str]:
        """Router keys, plus any other key that moves with them (zipped with the policy, as
        in the canary: LMetric on 6 instances vs Bailian on 12): those belong to the line,
        not to a panel of their own."""
        router = [k for k in self.keys if k.startswith("router.")]
        return router + self._bound_to(router)

    def _bound_to(self, router: list[str]) -> list[str]:
        """Varying non-router keys that are constant within every combination of the varying
        router keys (so each line has one value of them)."""
        lines = self.varying(router)
        if not lines:
            return []
        candidates = self.varying([k for k in self.keys if not k.startswith("router.") and k != SEED_KEY])
        text = pd.DataFrame({k: as_text(self.index[k]) for k in lines + candidates})
        per_line = text.groupby(lines, sort=False, dropna=False)
        return [k for k in candidates if (per_line[k].nunique() == 1).all()]

    def facet_keys(self, exclude: tuple[str, ...] = ()) -> list[str]:
        # keys zipped with the lines' router keys, or with the x axis (a prefill:decode
        # split zips the decode count with the prefill count), are no panels of their own
        bound = self._bound_to([k for k in self.keys if k.startswith("router.")])
        axis = [k for k in exclude if k in self.index and k not in RATE_KEYS]
        if axis:
            bound += self._bound_to(axis)
        return self.varying([k for k in self.keys if not k.startswith("router.") and k != SEED_KEY
                             and k not in exclude and k not in bound])  # fmt: skip

    def has_seeds(self) -> bool:
        return bool(self.varying([SEED_KEY]))

    def series_label(self, row: pd.Series) -> str:
        """The policy (or the name of its variant, `titles.policy_words`: "llm-d (deployed)")
        and every other varying router key (the legend names each)."""
        config = self.configs.get(row["run"], {})
        label, named = policy_words(self.policy(row), config)
        if any(k in self.index and k not in self.keys for k in named):
            # a key the name says is the plotted axis (a param plot over noise_rel): the
            # variants are points of one line, not lines of their own
            label, named = self.policy(row), set()
        for k in self.varying(self.series_keys()):
            if k.startswith(_SHAPE_KEYS) or k in named:
                continue  # how a disaggregated cluster is laid out, or what the name says
            value = config.get(k, row.get(k))  # the config keeps 2 an int where the index has 2.0
            if k != "router.policy" and value is not None and not (isinstance(value, float) and np.isnan(value)):
                label += f", {short_key(k)}={fmt(value)}"
        return label

    def policy(self, row: pd.Series) -> str:
        return str(row.get("policy", row.get("router.policy", "run")))

    def diff_label(self, row: pd.Series, exclude: tuple[str, ...] = ()) -> str:
        """Every distinguishing key of this run (but `exclude`), `short=value`, for tables
        and legends."""
        names = [short_key(k) for k in self.keys]
        parts = []
        for k in self.keys:
            if k in exclude:
                continue
            name = short_key(k) if names.count(short_key(k)) == 1 else k
            value = self.configs[row["run"]].get(k)
            if value is not None:
                parts.append(f"{name}={fmt(value)}")
        return ", ".join(parts) or self.run_dir(row["run"]).resolve().name

    def title(self, frame: pd.DataFrame, exclude: tuple[str, ...] = ()) -> str:
        """A facet's title in words: trace, model, load (unless it is the x axis), and any
        other distinguishing key that is not one of those."""
        def shared(words_of: Any) -> str | None:
            words = {words_of(self.configs[r]) for r in frame["run"]}
            return words.pop() if len(words) == 1 else None

        def model_of(config: dict[str, Any]) -> str:
            profile = config.get("cluster.profile")
            if profile is None and config.get("cluster.profile.kind") is not None:
                profile = f"{config['cluster.profile.kind']} cost model"
            return model_words(profile)

        words = [w for w in (shared(trace_words), shared(model_of)) if w]
        if not any(k in exclude for k in RATE_KEYS):
            load = shared(load_words)
            if load:
                words.append(load)
        described = {"workload.generator.name", "workload.trace", "cluster.profile", *RATE_KEYS,
                     "workload.generator.params.num_requests", "workload.limit"}  # fmt: skip
        for k in self.facet_keys(exclude):
            if k not in described and as_text(frame[k]).nunique() == 1:
                words.append(f"{short_key(k)}={fmt(frame[k].iloc[0])}")
        return ", ".join(words)

    def facets(self, exclude: tuple[str, ...] = ()) -> list[tuple[str, pd.DataFrame]]:
        keys = self.facet_keys(exclude)
        if not keys:
            return [(self.title(self.index, exclude), self.index)]
        groups = []
        # In the order the experiment lists its points (the seed's panel order), not alphabetical.
        for _, frame in self.index.groupby(keys, sort=False, dropna=False):
            groups.append((self.title(frame, exclude), frame))
        return groups
