"""Routing policies, one module per family, registered by name in `POLICIES`.

Importing this package imports every built-in family so the registry is complete.
"""

from . import jsq, simple  # noqa: F401  (registration side effects)
from .base import POLICIES, ClusterView, InstanceView, Policy, RouterContext

__all__ = ["POLICIES", "ClusterView", "InstanceView", "Policy", "RouterContext"]
