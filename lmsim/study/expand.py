"""Sweep expansion: an experiment's `sweep:`/`zip:` block becomes named, validated points.

The cartesian product of the `sweep:` axes, where each `zip:` group of keys forms a single
axis whose lists vary together; each point is validated against the schema (and its policy
and generator parameters) before anything runs. Run names (`point_name`) are `key=value`
pairs of the swept keys, sanitised, with a hash suffix when too long or when two points
would collide. A null value in a sweep list means "leave this key unset" for that point (for
instance a policy parameter that only one of the zipped policies accepts); it is left out of
the name.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from lmsim.config import (
    ExperimentConfig,
    apply_overrides,
    blame_overrides,
    read_yaml,
    set_dotted,
    validate,
)
from lmsim.errors import LmsimError, suggest

MAX_NAME_LEN = 120
CONNECT_TIMEOUT_S = 5.0
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")

class SweepError(LmsimError):
    """A sweep cannot start (bad sweep block, unreachable scheduler, locked directory)."""


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


def _list_entry_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a `list[Model]` (or `list[Model] | None`) field's entries."""
    if typing.get_origin(annotation) is list:
        args = typing.get_args(annotation)
        return _model_of(args[0]) if args else None
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is list:
            return _list_entry_model(arg)
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
    listed = False  # the previous part named a list of models: this part is an index
    for depth, part in enumerate(parts):
        if listed:
            if not part.isdigit():
                raise SweepError(f"{where}: sweep key {key!r}: {'.'.join(parts[:depth])} is a list: name an entry by number")
            listed = False
            if depth == len(parts) - 1:
                return
            continue
        fields = model.model_fields
        if part not in fields:
            raise SweepError(
                f"{where}: sweep key {key!r}: unknown key {'.'.join(parts[: depth + 1])!r}"
                f"{suggest(part, fields, label='known here')}"
            )
        annotation = fields[part].annotation
        sub = _model_of(annotation)
        if depth == len(parts) - 1:
            return
        entry = _list_entry_model(annotation)
        if entry is not None:
            model, listed = entry, True
        elif sub is not None:
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


def _seeds(seeds: Any, sweep: dict[str, Any], *, where: str) -> list[int]:
    if seeds is None:
        return []
    if not isinstance(seeds, list) or not seeds:
        raise SweepError(f"{where}: seeds: expected a non-empty list of seeds, got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise SweepError(f"{where}: seeds: {s!r} is not a non-negative integer")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"{where}: seeds: repeated seed in {seeds!r}")
    if "seed" in sweep:
        raise SweepError(f"{where}: seeds: set either seeds: or sweep.seed, not both")
    return list(seeds)


def _unset_dotted(raw: dict[str, Any], key: str) -> None:
    node: Any = raw
    parts = key.split(".")
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)] if part.isdigit() and int(part) < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def base_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The experiment without its sweep definition: what every point starts from."""
    return {k: v for k, v in raw.items() if k not in ("sweep", "zip", "seeds")}


def point_config(base: dict[str, Any], params: dict[str, Any], *, where: str) -> dict[str, Any]:
    """A point's raw config: `base` with each swept key set (or, for None, unset)."""
    point_raw = copy.deepcopy(base)
    for key, value in params.items():
        if value is None:
            _unset_dotted(point_raw, key)
        else:
            set_dotted(point_raw, key, copy.deepcopy(value), where=f"{where}: sweep")
    return point_raw


def expand_sweep(raw: dict[str, Any], *, where: str) -> list[SweepPoint]:
    """Every point of the experiment's sweep, validated, in expansion order (the first axis
    varies slowest). An experiment without `sweep:` is one point named `default`; `seeds: [...]`
    repeats every point once per seed (the last, fastest axis, named `seed=N`)."""
    sweep = raw.get("sweep") or {}
    zips = raw.get("zip") or []
    if not isinstance(sweep, dict):
        raise SweepError(f"{where}: sweep: expected a mapping of dotted keys to lists")
    if not isinstance(zips, list):
        raise SweepError(f"{where}: zip: expected a list of key groups")
    base = base_config(raw)
    for key in sweep:
        check_sweep_key(str(key), where=where)
    axes = _axes(sweep, zips, where=where)
    seeds = _seeds(raw.get("seeds"), sweep, where=where)
    if seeds:
        # Last axis, so the repeats of one point sit side by side and the `seed` column of
        # sweep.parquet tells them apart.
        axes.append((["seed"], [[s] for s in seeds]))
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
        points.append(SweepPoint(name, combo, point_config(base, combo, where=where)))
    if len({p.name for p in points}) != len(points):
        raise SweepError(f"{where}: sweep: two points have identical values")
    _validate_points(points, where=where)
    return points


def _validate_points(points: list[SweepPoint], *, where: str) -> None:
    from lmsim.policies import POLICIES
    from lmsim.profile import load_cost_model
    from lmsim.workload.generators import GENERATORS

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
    file_raw = read_yaml(path)

    def build(items: list[str]) -> tuple[dict[str, Any], list[SweepPoint]]:
        raw = apply_overrides(file_raw, items, where=where)
        return raw, expand_sweep(raw, where=where)

    return blame_overrides(build, list(overrides or []), where=where)


