"""Seeded synthetic workload generators, each calibrated to published trace statistics.

`generate(name, params, seed=S)` builds the named generator from its keyword-only
parameters (documented, with sources, in each class) and returns a canonical `Trace`.
Every generator draws only from `numpy.random.default_rng(seed)`, so a (name, params,
seed) triple always gives the same trace.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmsim.workload.generators import agent, benchmarks, chat, coder, sessions, synthetic  # noqa: F401  (registration side effects)
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.trace import Trace

__all__ = ["GENERATORS", "generate"]


def generate(name: str, params: dict[str, Any] | None = None, *, seed: int) -> Trace:
    params = dict(params or {})
    gen = GENERATORS.create(name, params, where=f"generator {name}")
    trace = gen.generate(np.random.default_rng(seed))
    trace.meta.update({"generator": name, "seed": str(seed)})
    trace.meta.update({f"param.{k}": str(v) for k, v in sorted(params.items())})
    trace.validate()
    return trace
