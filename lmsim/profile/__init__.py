"""Step-cost profiles: what one engine step costs, from data under `profiles/`.

`load_cost_model(spec)` turns the experiment's `cluster.profile` into a `StepCostModel`.
A spec is either a mapping `{kind: linear, ...}` (hand-checkable, for tests; or `{kind:
polynomial}`, Dynamo's mocker step model, `profile/polynomial.py`) or the name of
a profile shipped with lmsim (`lmsim/data/profiles/`, linked as `profiles/`) (for example `h20/qwen3-30b-a3b`), or a
path to one.
"""

from __future__ import annotations

from typing import Any

from lmsim.errors import ProfileError
from lmsim.profile.base import LinearCostModel, StepCostModel
from lmsim.shipped import PROFILES_DIR

__all__ = [
    "PROFILES_DIR", "LinearCostModel", "StepCostModel", "bind_kv_capacity", "kv_bytes_per_token", "load_cost_model",
    "profile_identity",
]


def load_cost_model(spec: str | dict[str, Any]) -> StepCostModel:
    if isinstance(spec, dict):
        from lmsim.profile.inline import INLINE_KINDS, build_inline

        kind = spec.get("kind", "linear")
        if kind not in INLINE_KINDS:
            raise ProfileError(f"cluster.profile.kind: unknown profile kind {kind!r} (known: {', '.join(INLINE_KINDS)})")
        try:
            return build_inline(spec)
        except TypeError as exc:
            raise ProfileError(f"cluster.profile: {exc}") from None
    from lmsim.profile.tables import (
        load_table_profile,  # the table-driven predictor (profiles issue)
    )

    return load_table_profile(spec)


def bind_kv_capacity(model: StepCostModel, kv_capacity_tokens: int) -> StepCostModel:
    """`model` on an instance of `kv_capacity_tokens` KV tokens: a model whose step time
    depends on the KV pool's size (the `polynomial` kind) gets a copy bound to it; any other
    is returned as it is."""
    bind = getattr(model, "with_kv_capacity", None)
    return bind(kv_capacity_tokens) if bind is not None else model


def kv_bytes_per_token(model: StepCostModel) -> float | None:
    """The KV bytes one token occupies on one instance of `model` (None when the profile
    does not say: a linear or polynomial profile without `kv_bytes_per_token`)."""
    return getattr(model, "kv_bytes_per_token", None)


def profile_identity(spec: str | dict[str, Any]) -> dict[str, Any]:
    """What makes two profiles price steps the same: an inline profile's fields, or a table
    profile's name plus a digest of its cost-bearing content (the four CSV tables and the
    `hardware`, `model`, `memory`, `step` sections). Provenance (dates, paths) is left out,
    so regenerating identical tables keeps every capacity keyed to them."""
    if isinstance(spec, dict):
        return {"inline": dict(sorted(spec.items()))}
    import hashlib
    import json

    import yaml

    from lmsim.profile.tables import TABLE_FILES, resolve_profile

    path = resolve_profile(spec)
    meta = yaml.safe_load(path.read_text()) or {}
    digest = hashlib.sha256()
    facts = {k: meta.get(k) for k in ("hardware", "model", "memory", "step")}
    digest.update(json.dumps(facts, sort_keys=True, default=str).encode())
    for kind in sorted(TABLE_FILES):
        table = path.parent / (meta.get("tables") or {}).get(kind, TABLE_FILES[kind])
        digest.update(kind.encode())
        digest.update(table.read_bytes().replace(b"\r\n", b"\n"))
    return {"name": meta.get("name", str(spec)), "sha256": digest.hexdigest()[:16]}
