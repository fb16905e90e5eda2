"""The policy registry, and the contract a policy is written against, re-exported from
`lmsim.routing` (where the engine reads it too) so plug-ins keep importing
`from lmsim.policies.base import POLICIES, Policy`."""

from __future__ import annotations

from lmsim.registry import Registry
from lmsim.routing import (
    ClusterView,
    InstanceView,
    Policy,
    RequestView,
    RouterContext,
    argmin_first,
    argmin_random,
)

POLICIES: Registry[Policy] = Registry("policy")

__all__ = [
    "POLICIES", "ClusterView", "InstanceView", "Policy", "RequestView", "RouterContext", "argmin_first",
    "argmin_random",
]
