"""Routing policies, one module per family, registered by name in `POLICIES`.

Importing this package imports every built-in family so the registry is complete.
`views.ViewAdapter` models what the router knows (exact, approximate or delayed KV state;
exact or scraped load) and is applied by the router in front of any policy.
"""

from . import (  # noqa: F401  (registration side effects)
    cache_aware,
    filter,
    jsq,
    linear,
    lmetric,
    polyserve,
    preble,
    predictive,
    simple,
)
from .base import POLICIES, ClusterView, InstanceView, Policy, RouterContext
from .views import ViewAdapter

__all__ = ["POLICIES", "ClusterView", "InstanceView", "Policy", "RouterContext", "ViewAdapter"]
