"""The KV connector seam: KV that reaches an instance from outside its GPU, and KV it keeps
for someone else after a request ends.

vLLM v1 serves prefill/decode disaggregation (NixlConnector) and host/disk offload
(OffloadingConnector, LMCache) through one scheduler-side interface
(`vllm/distributed/kv_transfer/kv_connector/v1/base.py`, `KVConnectorBase_V1`), and lmsim
models the same seam once in the instance scheduler:

1. `external_blocks(scheduler, request, local_hit_blocks)`: at admission, after the local
   prefix-cache hit, how many further whole blocks of the request's tokens the connector can
   supply (vLLM `get_num_new_matched_tokens` with `load_kv_async=True`): the prompt blocks a
   prefill instance computed, or the blocks found in host memory or on disk.
2. The scheduler allocates GPU blocks for the local hit and the external blocks (vLLM
   `allocate_slots(num_external_computed_tokens=...)`), schedules no tokens for the request
   and parks it (vLLM `WAITING_FOR_REMOTE_KVS`); other requests keep running. It then calls
   `start_load(scheduler, request, first_block, num_blocks)`; the connector moves the bytes
   (`lmsim.engine.links`) and calls the instance's `external_ready(request)` when they have
   landed.
3. When the instance's scheduler learns of it (vLLM: at the end of the first step whose
   connector poll, `get_finished`, comes after the landing; `lmsim.engine.instance`), the
   blocks become cache entries and the request waits at the front of the queue with
   `num_computed_tokens` = the loaded tokens, one fewer when they cover every token (vLLM
   `_update_waiting_for_remote_kv` recomputes the last token so that a token is sampled); its
   next admission schedules only the rest.
4. `hold_on_finish(scheduler, request)`: when a request finishes, whether its blocks stay
   allocated for someone to read (vLLM `request_finished` returning `delay_free_blocks`: a
   prefill instance keeps a request's KV until the decode instance has pulled it); the
   connector frees them later with the instance's `release_held(request)`, which, like a
   landed load, takes effect at the instance's next poll (vLLM `finished_sending`).

Without a connector (`scheduler.connector is None`) none of this runs: the single-pool engine
is exactly what it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lmsim.engine.request import Request

# The scheduler imports this protocol, so the protocol names it without importing it (an
# import, even a typing-only one, would be a cycle: tests/test_architecture.py).
InstanceScheduler = Any


class KVConnector(Protocol):
    def external_blocks(self, scheduler: InstanceScheduler, request: Request, local_hit_blocks: int) -> int:
        """Whole blocks after the first `local_hit_blocks` that the connector can load now
        (0: none; the request is admitted as usual). A pure lookup: the scheduler may ask
        again before it admits."""
        ...

    def start_load(self, scheduler: InstanceScheduler, request: Request, first_block: int, num_blocks: int) -> None:
        """GPU blocks first_block..first_block+num_blocks-1 are allocated: fill them, then call
        the instance's `external_ready(request)`."""
        ...

    def admitted(self, scheduler: InstanceScheduler, request: Request, hit_blocks: int) -> None:
        """The request was admitted with a GPU hit of `hit_blocks` blocks (vLLM
        `update_state_after_alloc`, called for every admission)."""
        ...

    def hold_on_finish(self, scheduler: InstanceScheduler, request: Request) -> bool:
        """True to keep the finished request's blocks until `release_held(request)`."""
        ...


class MultiConnector:
    """Several connectors on one instance (vLLM `MultiConnector`,
    `vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py`): a P/D receive and host
    tiers on one decode instance, say. Loads come from the first connector, in order, that
    offers blocks (vLLM `get_num_new_matched_tokens`: "the first connector that has new
    matched tokens will be assigned to this request"); every connector hears every finish.
    vLLM asks every connector even after one has offered; here the later ones are not asked,
    since a tier connector's lookup records the request's first-admission split, which should
    say what was loaded, not what could have been.
    vLLM lets several connectors hold a finished request and frees it after the last one is
    done; lmsim's tier connector never holds, so at most one holder is allowed here and a
    second is an error rather than a silent early free."""

    def __init__(self, connectors: list[KVConnector]) -> None:
        self.connectors = list(connectors)
        self._chosen: dict[int, KVConnector] = {}  # request id -> the connector that offered

    def external_blocks(self, scheduler: InstanceScheduler, request: Request, local_hit_blocks: int) -> int:
        self._chosen.pop(request.request_id, None)
        for connector in self.connectors:
            blocks = connector.external_blocks(scheduler, request, local_hit_blocks)
            if blocks:
                self._chosen[request.request_id] = connector
                return blocks
        return 0

    def start_load(self, scheduler: InstanceScheduler, request: Request, first_block: int, num_blocks: int) -> None:
        self._chosen.pop(request.request_id).start_load(scheduler, request, first_block, num_blocks)

    def admitted(self, scheduler: InstanceScheduler, request: Request, hit_blocks: int) -> None:
        for connector in self.connectors:
            connector.admitted(scheduler, request, hit_blocks)

    def hold_on_finish(self, scheduler: InstanceScheduler, request: Request) -> bool:
        holders = [c for c in self.connectors if c.hold_on_finish(scheduler, request)]
        if len(holders) > 1:
            raise RuntimeError(f"request {request.request_id}: two connectors hold its blocks; one may")
        return bool(holders)


def attach_connector(scheduler: InstanceScheduler, connector: KVConnector) -> None:
    """Give the instance `connector`, after any it already has (a `MultiConnector` when
    there are several)."""
    current = scheduler.connector
    if current is None:
        scheduler.connector = connector
    elif isinstance(current, MultiConnector):
        current.connectors.append(connector)
    else:
        scheduler.connector = MultiConnector([current, connector])
