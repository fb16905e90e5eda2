"""Step-cost profiles: what one engine step costs, from data under `profiles/`.

`load_cost_model(spec)` turns the experiment's `cluster.profile` into a `StepCostModel`.
A spec is either a mapping `{kind: linear, ...}` (hand-checkable, for tests) or the name of
a profile shipped with lmsim (`lmsim/data/profiles/`, linked as `profiles/`) (for example `h20/qwen3-30b-a3b`), or a
path to one.
"""

from __future__ import annotations

from typing import Any

from lmsim.data import PROFILES_DIR
from lmsim.errors import ProfileError
from lmsim.profile.base import LinearCostModel, StepCostModel

__all__ = ["PROFILES_DIR", "LinearCostModel", "StepCostModel", "load_cost_model"]


def load_cost_model(spec: str | dict[str, Any]) -> StepCostModel:
    if isinstance(spec, dict):
        kind = spec.get("kind", "linear")
        if kind != "linear":
            raise ProfileError(f"cluster.profile.kind: unknown profile kind {kind!r} (known: linear)")
        fields = {k: v for k, v in spec.items() if k != "kind"}
        try:
            return LinearCostModel(**fields)
        except TypeError as exc:
            raise ProfileError(f"cluster.profile: {exc}") from None
    from lmsim.profile.tables import (
        load_table_profile,  # the table-driven predictor (profiles issue)
    )

    return load_table_profile(spec)
