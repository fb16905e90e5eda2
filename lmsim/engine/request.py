"""A request: the unit of work, its progress through one instance, and its timestamps.

Request objects exist only while a request is in the system (routed and not finished);
finished requests are written to the run's columnar records and dropped, so a million-request
replay never holds a million objects. Timestamps are simulated seconds and `None` until they
happen, never 0.

State diagram: WAITING -> RUNNING -> FINISHED, with RUNNING -> WAITING on preemption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum


class RequestState(IntEnum):
    PENDING = 0  # known to the trace, not yet arrived
    WAITING = 1  # in an instance's waiting queue
    RUNNING = 2  # in an instance's running batch (prefilling or decoding)
    FINISHED = 3
    REJECTED = 4  # turned away because the waiting queue was full

    @property
    def is_done(self) -> bool:
        return self >= RequestState.FINISHED


@dataclass(slots=True, eq=False)
class Request:
    """What a router may read: `request_id`, `arrived_at`, `input_tokens`, `block_hashes`,
    `trace_hash_ids`, `session_id`, `parent_id`, `class_id`, `slo_class`, `prompt_text`. `output_tokens` is
    the trace's ground truth and must not be used for routing (a real router cannot know it).

    `block_hashes` are the engine-block (16-token) content hashes of the prompt's full blocks
    that the trace identifies, in order; see `lmsim.engine.kv_cache.engine_block_hashes`.
    `kv_hashes` (engine only) names every full block of prompt + output - 1 tokens: the
    trace's ids, then those of the request's continuation (see
    `lmsim.workload.trace.continuation_rows`), then synthetic names unique to the request
    (`lmsim.engine.block_names`); without generated-block caching, the prompt's full blocks.
    """

    request_id: int
    arrived_at: float
    input_tokens: int
    output_tokens: int
    block_hashes: list[int]
    trace_hash_ids: Sequence[int] = ()
    session_id: int = -1
    parent_id: int = -1
    class_id: int = -1
    slo_class: int = -1
    # The prompt as the client sent it, for routers that read text (llm-d's approximate
    # prefix scorer hashes characters); "" when the workload has no text (most traces).
    # Shared with the trace's table, never copied.
    prompt_text: str = ""

    state: RequestState = RequestState.PENDING
    instance_id: int | None = None
    routed_at: float | None = None
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    cached_tokens: int | None = None  # prefix-cache hit at first admission
    # Over every admission, first and resumed (vLLM counts both in its prefix-cache metric):
    lookup_tokens: int = 0  # tokens looked up (prompt + outputs so far)
    lookup_hit_tokens: int = 0  # of which served by the prefix cache
    predicted_ttft_s: float | None = None  # set by predictive policies, for error CDFs
    num_preemptions: int = 0

    # Engine bookkeeping, owned by the instance scheduler.
    num_computed_tokens: int = 0
    num_output_done: int = 0  # output tokens sampled, valid while not decoding
    decode_base: int = 0  # while decoding: outputs = instance step counter - decode_base
    admit_seq: int = 0  # admission order on the instance (running-list order)
    # Keys of the blocks allocated while prefilling (see kv_cache); blocks added while
    # decoding are not named, only counted.
    block_keys: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0  # leading blocks that are cache entries (vLLM num_cached_block)
    kv_hashes: list[int] | None = None
    # Leading kv_hashes another request may hit (trace or continuation names; default all).
    # The scheduler caches the synthetic rest of the output in one run when it releases the
    # request, not block by block as decodes fill them: nobody else can hit them meanwhile.
    num_shared_blocks: int = -1
    pending_prefill: int = 0  # tokens counted in the instance's pending-prefill total
    finish_step: int = 0  # step counter value at whose end a decoding request finishes
    decoding: bool = False
    # KV from a connector (lmsim.engine.connector): blocks being loaded, and whether the
    # request waits holding loaded blocks (admitted next without a lookup).
    kv_external_blocks: int = 0
    kv_loaded: bool = False
    kv_load_seq: int = 0  # loading order, so loaded requests keep their queue order
    kv_held_extra: int = 0  # unnamed tail blocks a held (finished) request still holds
    # Lower KV tiers (lmsim.engine.kv_tiers): tokens found in host memory and on disk at the
    # first admission (-1: never looked up on an instance with tiers), and every load's bytes
    # and seconds (submission to landing).
    kv_hit_tokens_host: int = -1
    kv_hit_tokens_disk: int = -1
    kv_load_bytes: int = 0
    kv_load_s: float = 0.0
    # Its last token is being computed: out of the decode batch, still running and holding
    # `held_blocks` until the step that computes it ends (see scheduler `_launch`).
    retiring: bool = False
    held_blocks: int = 0
    held_tokens: int = 0  # a retiring decode's KV tokens (0: a prompt's, cached as computed)
    starved_in_flight: int = 0  # starved in planned steps that have not ended yet
    # When its tokens stop coming one per step (starved, preempted): the time of its last
    # token, so the gap to its next one is recorded whole; -1 while they come every step.
    gap_from: float = -1.0
    # The last prefix-cache match: valid while the cache's version and the cap are these.
    hit_memo_version: int = 0
    hit_memo_cap: int = -1
    hit_memo_blocks: int = 0

    def __post_init__(self) -> None:
        if self.kv_hashes is None:
            self.kv_hashes = self.block_hashes
        if self.num_shared_blocks < 0:
            self.num_shared_blocks = len(self.kv_hashes)

    @property
    def num_tokens_target(self) -> int:
        """Tokens the request must have in its KV before it next samples: prompt plus the
        output tokens sampled so far (the last of which is not yet in the cache)."""
        return self.input_tokens + self.num_output_done
