"""Profiles written inline in an experiment (`cluster.profile: {kind: ..., ...}`): the
hand-checkable `linear` kind and Dynamo's mocker `polynomial` kind. One check serves config
validation (so a typo names the experiment's field) and loading."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from lmsim.profile.base import LinearCostModel, StepCostModel
from lmsim.profile.polynomial import PolynomialCostModel, check_polynomial_fields

INLINE_KINDS = ("linear", "polynomial")
LINEAR_FIELDS = tuple(f.name for f in dataclasses.fields(LinearCostModel) if f.name != "name")


def check_inline_profile(spec: dict[str, Any]) -> None:
    """Raise ValueError with one line naming the first problem of an inline profile."""
    kind = spec.get("kind", "linear")
    if kind not in INLINE_KINDS:
        raise ValueError(f"unknown profile kind {kind!r} (known: {', '.join(INLINE_KINDS)})")
    if kind == "polynomial":
        check_polynomial_fields(spec)
        return
    for key in spec:
        if key != "kind" and key not in LINEAR_FIELDS:
            raise ValueError(f"unknown field {key!r} for a linear profile (fields: {', '.join(LINEAR_FIELDS)})")
    if "step_base_s" not in spec:
        raise ValueError("a linear profile needs step_base_s")
    for key in LINEAR_FIELDS:
        if key not in spec:
            continue
        value = spec[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number (got {value!r})")
        # Steps must take positive time, or simulated time could stand still.
        if value < 0 or (key == "step_base_s" and value == 0):
            bound = "> 0" if key == "step_base_s" else ">= 0"
            raise ValueError(f"{key} must be {bound} (got {value!r})")
    if spec.get("host_step_s", 0) > spec["step_base_s"]:
        raise ValueError("host_step_s must be <= step_base_s (it is the host part of it)")


def build_inline(spec: dict[str, Any]) -> StepCostModel:
    fields = {k: v for k, v in spec.items() if k != "kind"}
    if spec.get("kind", "linear") == "polynomial":
        return PolynomialCostModel(**fields)
    return LinearCostModel(**fields)
