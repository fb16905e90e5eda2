"""The design space: every (GPU, shape, host tier, router) combination the plan names, and the
experiment each one gives at a given instance count.

A P/D shape `pd P:D` at n instances has round(n P / (P + D)) prefill instances (at least one)
and the rest decode (at least one), so the count search moves one instance at a time and the
ratio is kept as well as n allows. A colocated router on a P/D shape routes both sides (`pd`
with that policy on the prefill and on the decode choice, as `lmsim capacity` does); a
disaggregated-only router has no colocated design (skipped, and said so)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from lmsim.plan.config import GpuOption, PlanSection, RouterOption, parse_shape


@dataclass(frozen=True)
class Design:
    gpu: GpuOption
    shape: str
    host_gb: float | None
    router: RouterOption

    @property
    def ratio(self) -> tuple[int, int] | None:
        return parse_shape(self.shape)

    @property
    def label(self) -> str:
        host = "" if not self.host_gb else f" host{self.host_gb:g}GB"
        return f"{self.gpu.label} {self.shape}{host} {self.router.name}"

    @property
    def min_instances(self) -> int:
        return 1 if self.ratio is None else 2

    def gpus(self, n: int) -> int:
        return n * self.gpu.tp

    def cost_per_hour(self, n: int) -> float | None:
        price = self.gpu.price_per_hour
        return None if price is None else self.gpus(n) * price

    def split(self, n: int) -> tuple[int, int]:
        """(prefill, decode) instances of a P/D design at n instances."""
        assert self.ratio is not None
        p, d = self.ratio
        prefill = min(max(1, round(n * p / (p + d))), n - 1)
        return prefill, n - prefill

    def describe(self, n: int) -> str:
        if self.ratio is None:
            return f"{n} instances"
        p, d = self.split(n)
        return f"{p} prefill + {d} decode"

    def experiment(self, base: dict[str, Any], n: int) -> dict[str, Any]:
        """The base experiment's raw mapping turned into this design at n instances."""
        raw = copy.deepcopy(base)
        cluster = raw.setdefault("cluster", {})
        cluster.pop("pools", None)
        if self.ratio is None:
            cluster.pop("kv_transfer", None)
        cluster["profile"] = copy.deepcopy(self.gpu.profile)
        if self.host_gb:
            cluster["kv_tiers"] = {**(cluster.get("kv_tiers") or {}), "host": {"capacity_gb": self.host_gb}}
        router = raw.setdefault("router", {})
        router.pop("params", None)
        if self.ratio is None:
            cluster["num_instances"] = n
            router["policy"], router["params"] = self.router.policy, copy.deepcopy(self.router.params)
        else:
            cluster.pop("num_instances", None)
            p, d = self.split(n)
            cluster["pools"] = [
                {"name": "prefill", "role": "prefill", "num_instances": p, **_role_profile(self.gpu.profile, "prefill")},
                {"name": "decode", "role": "decode", "num_instances": d, **_role_profile(self.gpu.profile, "decode")},
            ]
            if is_disaggregated(self.router.policy):
                router["policy"], router["params"] = self.router.policy, copy.deepcopy(self.router.params)
            else:
                side: dict[str, Any] = {"prefill_policy": self.router.policy, "decode_policy": self.router.policy}
                if self.router.params:
                    side.update(prefill_params=copy.deepcopy(self.router.params),
                                decode_params=copy.deepcopy(self.router.params))  # fmt: skip
                router["policy"], router["params"] = "pd", side
        return raw


def _role_profile(profile: str | dict[str, Any], role: str) -> dict[str, Any]:
    """A pool's own profile where the GPU's profile prices a pass by the worker's role: the
    `polynomial` profile (Dynamo's mocker) charges a prefill worker no decode part and a decode
    worker no prefill (lmsim/profile/polynomial.py), so a P/D pool gets `worker_type` = its
    role unless the plan set one. Other profiles price every role alike: nothing to add."""
    if isinstance(profile, dict) and profile.get("kind") == "polynomial" and "worker_type" not in profile:
        return {"profile": {**copy.deepcopy(profile), "worker_type": role}}
    return {}


def is_disaggregated(policy: str) -> bool:
    from lmsim.policies import POLICIES

    return bool(getattr(POLICIES.get(policy), "disaggregated", False))


def enumerate_designs(plan: PlanSection) -> tuple[list[Design], list[str]]:
    """Every design in a fixed order (GPU, shape, host tier, router as listed), and one note
    per combination that cannot exist (a P/D-only router on a colocated shape)."""
    designs, notes = [], []
    for gpu in plan.gpus:
        for shape in plan.shapes:
            for host in plan.host_tier_gb:
                for router in plan.routers:
                    if parse_shape(shape) is None and is_disaggregated(router.policy):
                        notes.append(f"{gpu.label} {shape} {router.name}: skipped, {router.policy} routes P/D pools only")
                        continue
                    if gpu.tp * (1 if parse_shape(shape) is None else 2) > plan.budget_gpus:
                        notes.append(f"{gpu.label} {shape} {router.name}: skipped, one instance needs more than "
                                     f"the budget of {plan.budget_gpus} GPUs")  # fmt: skip
                        continue
                    designs.append(Design(gpu, shape, host, router))
    return designs, notes
