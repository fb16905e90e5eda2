"""Autoscalers, registered by name in `AUTOSCALERS` (the contract is `lmsim.scaling`).

Importing this package imports every built-in scaler so the registry is complete. The study
layer (`lmsim.study.compose`) creates the configured one and hands it to the engine; the
engine never imports this package. A scaler module registers with
`@AUTOSCALERS.register(name)` from `lmsim.autoscalers.base` (importing the package itself
from a module it imports would be a cycle).
"""

from lmsim.autoscalers import hpa, schedule, sla_planner  # noqa: F401  (registration side effects)
from lmsim.autoscalers.base import AUTOSCALERS, Autoscaler

__all__ = ["AUTOSCALERS", "Autoscaler"]
