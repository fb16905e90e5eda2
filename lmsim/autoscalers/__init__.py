"""Autoscalers, one module per scaler, registered by name in `AUTOSCALERS` (the contract is
`lmsim.scaling`). Importing this package imports every built-in scaler so the registry is
complete."""

from lmsim.registry import Registry
from lmsim.scaling import Autoscaler

AUTOSCALERS: Registry[Autoscaler] = Registry("autoscaler")

from lmsim.autoscalers import hpa, sla_planner  # noqa: E402,F401  (registration side effects)

__all__ = ["AUTOSCALERS"]
