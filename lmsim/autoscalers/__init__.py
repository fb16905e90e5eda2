"""Autoscalers, registered by name in `AUTOSCALERS` (the contract is `lmsim.scaling`).

Importing this package imports every built-in scaler so the registry is complete. The study
layer (`lmsim.study.compose`) creates the configured one and hands it to the engine; the
engine never imports this package.
"""

from lmsim.registry import Registry
from lmsim.scaling import Autoscaler

AUTOSCALERS: Registry[Autoscaler] = Registry("autoscaler")

from lmsim.autoscalers import schedule  # noqa: E402, F401  (registration side effects)

__all__ = ["AUTOSCALERS", "Autoscaler"]
