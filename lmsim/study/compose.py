"""Composing a run: the routing policy the experiment names, checked against the cluster's
shape, and its autoscaler, handed to the engine's `Simulation`. This is where the policy and
autoscaler registries meet the engine, so the engine imports nothing from `lmsim.policies`
or `lmsim.autoscalers`."""

from __future__ import annotations

from lmsim.config import ExperimentConfig
from lmsim.engine.simulation import Simulation
from lmsim.policies import POLICIES, Policy
from lmsim.policies.disagg import check_policy_shape
from lmsim.scaling import Autoscaler
from lmsim.workload.trace import Trace


def make_policy(config: ExperimentConfig) -> Policy:
    """The experiment's routing policy, or one line naming `router.policy` / `router.params`."""
    check_policy_shape(config.router.policy, config.cluster.is_disaggregated, where="router.policy")
    return POLICIES.create(config.router.policy, config.router.params, where="router.params")


def make_autoscaler(config: ExperimentConfig) -> Autoscaler | None:
    """The experiment's autoscaler (None without one), or one line naming `autoscaler.name` /
    `autoscaler.params`."""
    if config.autoscaler is None:
        return None
    from lmsim.autoscalers import AUTOSCALERS

    AUTOSCALERS.get(config.autoscaler.name, where="autoscaler.name")
    return AUTOSCALERS.create(config.autoscaler.name, config.autoscaler.params, where="autoscaler.params")


def build_simulation(config: ExperimentConfig, trace: Trace) -> Simulation:
    """The simulation of `trace` on `config`'s cluster under its router, ready to `run()`."""
    return Simulation(config, trace, make_policy(config), make_autoscaler(config))


__all__ = ["build_simulation", "make_autoscaler", "make_policy"]
