"""The autoscaler registry (what `lmsim.autoscalers` re-exports): scaler modules register
here, so that they need not import the package that imports them."""

from lmsim.registry import Registry
from lmsim.scaling import Autoscaler

AUTOSCALERS: Registry[Autoscaler] = Registry("autoscaler")

__all__ = ["AUTOSCALERS", "Autoscaler"]
