"""The plan file: a base experiment plus a `plan:` section (the SLO, the objective, the budget
and the design space), read and checked so that every problem is one line naming the file
and the field (`ConfigError`, exit 2)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lmsim.config import ExperimentConfig, _format_validation_error, read_yaml, validate
from lmsim.errors import ConfigError, suggest

# An SLO bound is `<metric>_<statistic>_s`: the statistic of the metric over every request of
# the workload, an unfinished or rejected one counting as missing it (see lmsim.plan.slo). The
# mean is there for planners that bound means (Dynamo's replay_optimize and SLA planner).
SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
SLO_STATISTICS = ("p50", "p90", "p99", "mean")
SLO_KEY = re.compile(r"^(?P<metric>[a-z0-9]+)_(?P<stat>[a-z0-9]+)_s$")
SLO_KEYS = tuple(f"{m}_{s}_s" for m in SLO_METRICS for s in SLO_STATISTICS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuOption(_Strict):
    name: str = Field(min_length=1, description="GPU key (h20, h100, ...): names the price")
    profile: str | dict[str, Any] = Field(description="the step-cost profile of one instance on this GPU")
    tp: int = Field(1, gt=0, description="GPUs one instance holds (the profile's tensor-parallel size)")
    price_per_hour: float | None = Field(
        None, gt=0, description="USD per GPU-hour; default: the shipped price table (lmsim.shipped)"
    )

    @property
    def label(self) -> str:
        return self.name if self.tp == 1 else f"{self.name}x{self.tp}"


class RouterOption(_Strict):
    policy: str = Field(min_length=1, description="registered policy")
    params: dict[str, Any] = Field(default_factory=dict, description="its parameters")
    label: str | None = Field(None, description="name in the tables (default: the policy)")

    @property
    def name(self) -> str:
        return self.label or self.policy


class SearchOptions(_Strict):
    screen_requests: list[int] = Field(
        default_factory=lambda: [400], description="the short slices of the screening rungs, requests"
    )
    keep: float = Field(0.5, gt=0, le=1, description="share of the designs each rung keeps (successive halving)")
    tie_margin: float = Field(
        0.1, ge=0, description="a design within this relative cost of the last one a rung keeps is kept too (short slices are noisy)"
    )
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1,
                             description="seeds the final candidates are repeated over")
    finalists: int = Field(3, gt=0, description="designs repeated over the seeds (the cheapest after full runs)")
    drain_limit_s: float = Field(60.0, gt=0, description="a probe stops this long after its last arrival")
    check_interval_s: float = Field(2.0, gt=0, description="simulated seconds between early-stop checks")
    early_stop: bool = Field(True, description="stop a probe once its SLO verdict is certain")

    @field_validator("screen_requests")
    @classmethod
    def _increasing(cls, value: list[int]) -> list[int]:
        if any(v <= 0 for v in value) or sorted(set(value)) != value:
            raise ValueError("screen_requests: positive request counts in increasing order")
        return value


class PlanSection(_Strict):
    objective: Literal["gpus", "cost"] = Field("cost", description="minimise GPUs or cost per hour")
    slo: dict[str, float] = Field(description="bounds: <ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_s, and attainment")
    budget_gpus: int = Field(gt=0, description="most GPUs a design may use")
    gpus: list[GpuOption] = Field(min_length=1)
    shapes: list[str] = Field(default_factory=lambda: ["colocated"], min_length=1,
                              description="colocated, or pd P:D (prefill:decode instances)")
    host_tier_gb: list[float | None] = Field(default_factory=lambda: [None], min_length=1,
                                             description="host KV tier per instance, GB (null: none)")
    routers: list[RouterOption] = Field(min_length=1)
    search: SearchOptions = Field(default_factory=SearchOptions)

    @field_validator("slo")
    @classmethod
    def _slo_keys(cls, slo: dict[str, float]) -> dict[str, float]:
        if not slo:
            raise ValueError("no bound: give at least one of " + ", ".join(SLO_KEYS) + " or attainment")
        for key, value in slo.items():
            if key == "attainment":
                if not 0 < value <= 1:
                    raise ValueError(f"attainment: a fraction in (0, 1] (got {value!r})")
                continue
            m = SLO_KEY.match(key)
            if m is None or m["metric"] not in SLO_METRICS or m["stat"] not in SLO_STATISTICS:
                raise ValueError(f"{key}: unknown SLO metric{suggest(key, [*SLO_KEYS, 'attainment'], label='metrics')}")
            if not value > 0:
                raise ValueError(f"{key}: a bound in seconds > 0 (got {value!r})")
        return slo

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, shapes: list[str]) -> list[str]:
        for shape in shapes:
            parse_shape(shape)
        return shapes

    @model_validator(mode="after")
    def _unique(self) -> PlanSection:
        for what, names in (("gpus", [g.label for g in self.gpus]), ("routers", [r.name for r in self.routers])):
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup is not None:
                raise ValueError(f"{what}: {dup!r} is listed twice (give one a label)")
        return self


def parse_shape(shape: str) -> tuple[int, int] | None:
    """None for `colocated`; (P, D) for `pd P:D`."""
    text = str(shape).strip()
    if text == "colocated":
        return None
    m = re.fullmatch(r"pd\s+(\d+):(\d+)", text)
    if m is None or int(m[1]) < 1 or int(m[2]) < 1:
        raise ValueError(f"shape {shape!r}: colocated, or pd P:D with P, D >= 1 (e.g. 'pd 1:2')")
    return int(m[1]), int(m[2])


def load_plan(path: str | Path, overrides: list[str] | None = None) -> tuple[ExperimentConfig, dict[str, Any], PlanSection]:
    """The base experiment (without its `plan:`), its raw mapping, and the checked plan
    section. Prices come from the plan, else the shipped table; a GPU priced by neither when
    the objective is cost is an error naming it."""
    from lmsim.config import apply_overrides

    where = str(path)
    raw = apply_overrides(read_yaml(path), list(overrides or []), where=where)
    section = raw.pop("plan", None)
    if section is None:
        raise ConfigError(f"{where}: plan: missing (a plan file is an experiment with a plan: section)")
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: plan: must be a mapping")
    for key in ("sweep", "zip", "seeds"):
        if raw.get(key) is not None:
            raise ConfigError(f"{where}: {key}: a plan's base experiment has no {key} (the plan sets the design)")
    base = validate(raw, where=where).from_folder(Path(path).resolve().parent)
    try:
        plan = PlanSection.model_validate(section)
    except ValidationError as exc:
        message = _format_validation_error(exc, where)
        # name the field under plan:, as the user wrote it
        raise ConfigError(message.replace(f"{where}: ", f"{where}: plan.", 1)) from None
    plan = _with_prices(plan, where)
    _check_plan(base, plan, where)
    return base, copy.deepcopy(raw), plan


def shipped_price(gpu: str) -> float | None:
    """The shipped price of `gpu` per hour when lmsim ships a price table, else None."""
    import lmsim.shipped

    lookup = getattr(lmsim.shipped, "gpu_price_per_hour", None)
    if lookup is None:
        return None
    try:
        return float(lookup(gpu))
    except Exception:  # an unknown key: the plan must give the price
        return None


def _with_prices(plan: PlanSection, where: str) -> PlanSection:
    gpus = []
    for i, gpu in enumerate(plan.gpus):
        if gpu.price_per_hour is None:
            price = shipped_price(gpu.name)
            if price is None and plan.objective == "cost":
                raise ConfigError(
                    f"{where}: plan.gpus.{i}.price_per_hour: GPU {gpu.name!r} has no price and the objective is "
                    "cost (give price_per_hour, or objective: gpus)"
                )
            gpu = gpu.model_copy(update={"price_per_hour": price})
        gpus.append(gpu)
    return plan.model_copy(update={"gpus": gpus})


def _check_plan(base: ExperimentConfig, plan: PlanSection, where: str) -> None:
    from lmsim.policies import POLICIES

    smallest = min(g.tp * (1 if parse_shape(s) is None else 2) for g in plan.gpus for s in plan.shapes)
    if plan.budget_gpus < smallest:
        raise ConfigError(
            f"{where}: plan.budget_gpus: {plan.budget_gpus} GPUs is below one instance of any design "
            f"(the smallest needs {smallest})"
        )
    for i, router in enumerate(plan.routers):
        POLICIES.create(router.policy, router.params, where=f"{where}: plan.routers.{i}")


def check_designs(raw: dict[str, Any], designs: list[Any], where: str) -> None:
    """Each design's experiment checked as `lmsim run` checks one (profile and KV pool, policy
    and parameters on this shape), before anything runs; an error names the design."""
    from lmsim.cli import _check_config

    for design in designs:
        at = f"{where} [{design.label}]"
        config = validate(design.experiment(raw, design.min_instances), where=at)
        _check_config(config, at)
