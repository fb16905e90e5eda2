"""Hand-built stand-ins for the router's views and context, for policy tests.

`FakeInstance` holds a set of cached block hashes and plain load fields; `FakeCluster` answers
`cached_prefix_tokens` from them (or from an explicit override); `FakeContext` is a
RouterContext whose clock the test advances, firing `every` callbacks on time, and whose
`emit_kv` feeds KV-event subscribers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmsim.engine.request import Request
from lmsim.policies import POLICIES, Policy
from lmsim.profile import LinearCostModel, load_cost_model

BLOCK = 16
# The step cost FakeContext and FakeInstance price with unless a test says otherwise.
DEFAULT_COST = LinearCostModel(step_base_s=0.01, per_prefill_token_s=1e-4, per_decode_seq_s=1e-3)


def hashes(tag: Any, n: int, start: int = 0) -> list[int]:
    """`n` block hashes of a content stream `tag`, positions start..start+n-1. Concatenate
    streams to build prompts that share a prefix: `hashes("sys", 4) + hashes(7, 2, start=4)`."""
    return [hash((tag, start + j)) & 0x7FFF_FFFF_FFFF for j in range(n)]


_next_id = [1000]


def make_request(
    input_tokens: int,
    block_hashes: list[int] | None = None,
    *,
    request_id: int | None = None,
    arrived_at: float = 0.0,
    class_id: int = -1,
    slo_class: int = -1,
) -> Request:
    if request_id is None:
        _next_id[0] += 1
        request_id = _next_id[0]
    if block_hashes is None:
        block_hashes = hashes(("req", request_id), input_tokens // BLOCK)
    return Request(
        request_id=request_id,
        arrived_at=arrived_at,
        input_tokens=input_tokens,
        output_tokens=1,
        block_hashes=list(block_hashes),
        class_id=class_id,
        slo_class=slo_class,
    )


@dataclass
class FakeInstance:
    instance_id: int
    num_running: int = 0
    num_waiting: int = 0
    num_prefilling: int = 0
    pending_prefill_tokens: int = 0
    total_tokens: int = 0
    decode_context_tokens: int = 0
    kv_usage: float = 0.0
    num_free_blocks: int = 1000
    num_total_blocks: int = 1000
    blocks: set[int] = field(default_factory=set)
    queue: list[tuple[int, int]] = field(default_factory=list)
    in_flight: tuple[float, list[int]] = (0.0, [])  # (seconds left, tokens per queue entry)
    pool: str = "default"
    role: str = "both"
    cost_model: Any = DEFAULT_COST
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256

    @property
    def batch_size(self) -> int:
        return self.num_running + self.num_waiting

    def cached_prefix_tokens(self, request: Request) -> int:
        limit = min(len(request.block_hashes), (request.input_tokens - 1) // BLOCK)
        j = 0
        while j < limit and request.block_hashes[j] in self.blocks:
            j += 1
        return j * BLOCK

    def queued_prefills(self) -> list[tuple[int, int]]:
        return list(self.queue)

    def step_in_flight(self) -> tuple[float, list[int]]:
        return self.in_flight


class FakeCluster:
    def __init__(self, instances: list[FakeInstance], ctx: FakeContext | None = None) -> None:
        self.instances = instances
        self.block_size = BLOCK
        self.ctx = ctx
        self.cached_override: list[int] | None = None
        self._now = 0.0

    @property
    def now(self) -> float:
        return self.ctx.t if self.ctx is not None else self._now

    def cached_prefix_tokens(self, request: Request) -> list[int]:
        if self.cached_override is not None:
            return list(self.cached_override)
        return [v.cached_prefix_tokens(request) for v in self.instances]


def cluster_of(n: int = 3, ctx: FakeContext | None = None, **per_field: list[Any]) -> FakeCluster:
    """`cluster_of(3, num_running=[1, 0, 2])`: fields given as one value per instance."""
    insts = [FakeInstance(i) for i in range(n)]
    for name, values in per_field.items():
        for inst, v in zip(insts, values):
            setattr(inst, name, v)
    return FakeCluster(insts, ctx)


class FakeContext:
    def __init__(
        self,
        num_instances: int = 3,
        *,
        seed: int = 0,
        cost_model: Any = None,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 256,
    ) -> None:
        self.num_instances = num_instances
        self.block_size = BLOCK
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.rng = np.random.default_rng(seed)
        self.cost_model = cost_model or DEFAULT_COST
        self.cost_models = [self.cost_model] * num_instances
        self.t = 0.0
        self.timers: list[list[Any]] = []  # [next due, period, callback]
        self.kv_subscribers: list[Any] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def now(self) -> float:
        return self.t

    def load_cost_model(self, spec: Any) -> Any:
        return load_cost_model(spec)

    def every(self, period_s: float, callback: Any) -> None:
        self.timers.append([self.t + period_s, period_s, callback])

    def advance(self, to: float) -> None:
        """Move the clock to `to`, firing periodic callbacks at their due times in order."""
        while self.timers:
            timer = min(self.timers, key=lambda x: x[0])
            if timer[0] > to:
                break
            self.t = timer[0]
            timer[0] += timer[1]
            timer[2](self.t)
        self.t = to

    def subscribe_kv_events(self, callback: Any) -> None:
        self.kv_subscribers.append(callback)

    def emit_kv(self, instance_id: int, block_hash: int, stored: bool) -> None:
        for cb in self.kv_subscribers:
            cb(instance_id, block_hash, stored, self.t)

    def record_event(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))


def make_policy(name: str, ctx: FakeContext | None = None, **params: Any) -> Policy:
    # Python call syntax cannot say lambda=...; tests write lambda_ and YAML says lambda.
    params = {("lambda" if k == "lambda_" else k): v for k, v in params.items()}
    policy = POLICIES.create(name, params)
    policy.bind(ctx or FakeContext())
    return policy


def route(policy: Policy, request: Request, cluster: FakeCluster) -> int:
    """choose + on_routed, as the router does."""
    choice = policy.choose(request, cluster)
    policy.on_routed(request, choice)
    return choice
