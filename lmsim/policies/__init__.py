"""Routing policies, one module per family, registered by name in `POLICIES`.

Importing this package imports every built-in family so the registry is complete.
What the router knows (exact, approximate or delayed KV state; exact or scraped load) is
modelled by the engine (`lmsim.engine.views`) in front of any policy: policies only read
the views they are given.
"""

from lmsim.policies import (  # noqa: F401  (registration side effects)
    cache_aware,
    disagg,
    filter,
    jsq,
    linear,
    llmd_epp,
    lmetric,
    polyserve,
    preble,
    predictive,
    simple,
)
from lmsim.policies.base import POLICIES, ClusterView, InstanceView, Policy, RouterContext

__all__ = ["POLICIES", "ClusterView", "InstanceView", "Policy", "RouterContext"]
