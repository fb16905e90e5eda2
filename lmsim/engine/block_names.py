"""The content names (hashes) of the KV blocks a request fills: every full block of its
prompt and output, as vLLM hashes every full block of `all_token_ids`
(`vllm/v1/core/kv_cache_utils.py`, `hash_request_tokens` / `Request.block_hashes`, grown as
output tokens arrive).

A block gets its name from the first source that knows its content:

1. the request's own trace ids, for the prompt's full blocks they identify
   (`kv_cache.engine_block_hashes`);
2. the row that continues the request (`workload.trace.continuation_rows`), for the blocks
   its prompt re-sends: the output and the block where the prompt ends, which output
   tokens complete;
3. otherwise a synthetic name of its own (`BlockNames.synthetic`).

Without (3) such blocks carried no name: they went to the front of the free queue when
released (reused before any cache entry, instead of ageing in the LRU queue), and a
preempted request could not hit its own output when it resumed.

Synthetic names are unique per (row, block): block j of row r is `base + r * stride + j`,
where `base` lies above every key the trace's ids can map to and `stride` is at least the
number of full blocks any row can fill. So a synthetic name never equals a trace-derived
key, not even under the Mooncake mapping `id * r + k % r` (512-token ids, 32 engine blocks
each; `base` is `(max id + 1) * r` there), whether the trace stores its ids as int32
(`Trace.compact`) or int64; and two requests never share a synthetic block, even when their
contents happen to be equal: only the trace may say that two requests share content. The
names are integer arithmetic on the trace alone, so they are the same on every machine and
in every run of the same trace.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lmsim.engine.kv_cache import engine_block_hashes
from lmsim.workload.trace import Trace, continuation_rows, continued_ids


def first_unnamed_key(max_trace_id: int, trace_block_size: int, block_size: int) -> int:
    """The least key above every engine-block key `engine_block_hashes` derives from trace
    ids no larger than `max_trace_id` (-1: no ids at all).

    Equal block sizes, and trace blocks r times smaller, key an engine block by one trace
    id, so the bound is `max_trace_id + 1`; trace blocks r times larger key engine block k
    by `id * r + k % r`, at most `max_trace_id * r + r - 1`, so the bound is
    `(max_trace_id + 1) * r`. Python integers: no overflow whatever the ids."""
    if max_trace_id < 0:
        return 0
    if trace_block_size > block_size and trace_block_size % block_size == 0:
        return (max_trace_id + 1) * (trace_block_size // block_size)
    return max_trace_id + 1


class RequestNames(NamedTuple):
    """One request's block names: `prompt`, the prompt's full blocks the trace identifies
    (what a router sees, `Request.block_hashes`); `kv`, every full block the engine fills
    (`Request.kv_hashes`); `shared`, how many leading `kv` names come from the trace or the
    continuation (blocks another request may hit); the rest are synthetic."""

    prompt: list[int]
    kv: list[int]
    shared: int


class BlockNames:
    """Names the blocks of each row of `trace` for an engine of `block_size`-token blocks.

    `cache_generated_blocks=False` names only the prompt's full blocks (no block holding a
    generated token becomes a cache entry, as in Dynamo's mocker); `prefix_caching=False`
    names only what the trace identifies (the engine then caches nothing anyway)."""

    def __init__(
        self,
        trace: Trace,
        block_size: int,
        *,
        prefix_caching: bool = True,
        cache_generated_blocks: bool = True,
    ) -> None:
        self.trace = trace
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.cache_generated_blocks = cache_generated_blocks
        n = len(trace)
        self.continuation = (
            continuation_rows(trace) if prefix_caching and cache_generated_blocks
            else np.full(n, -1, dtype=np.int64)
        )
        values = trace.hash_values
        max_id = int(values.max()) if len(values) else -1
        self.base = first_unnamed_key(max_id, trace.block_size, block_size)
        # Clipping at max_model_len only shortens a request, so the trace's lengths bound
        # every row's full blocks.
        if n:
            filled = (trace.input_tokens + trace.output_tokens - 1) // block_size
            self.stride = max(int(filled.max()), 1)
        else:
            self.stride = 1

    def synthetic(self, row: int, first: int, last: int) -> list[int]:
        """Synthetic names of blocks first..last-1 of `row`."""
        start = self.base + row * self.stride
        return list(range(start + first, start + last))

    def names(self, row: int, ids: np.ndarray, input_tokens: int, output_tokens: int) -> RequestNames:
        """The names of `row` with trace ids `ids` (int64) generating `output_tokens`: `kv`
        covers prompt + output - 1 tokens (the last sampled token never gets KV), or only
        the prompt's full blocks without generated-block caching."""
        bs = self.block_size
        trace = self.trace
        prompt = engine_block_hashes(ids, trace.block_size, input_tokens, bs)
        if not self.prefix_caching:
            return RequestNames(prompt, prompt, len(prompt))
        kv = prompt
        cont = int(self.continuation[row])
        if cont >= 0:
            full = engine_block_hashes(
                continued_ids(trace, row, cont), trace.block_size, input_tokens + output_tokens - 1, bs
            )
            if len(full) > input_tokens // bs:
                prompt, kv = full[: input_tokens // bs], full
        if self.cache_generated_blocks:
            filled = (input_tokens + output_tokens - 1) // bs
        else:
            filled = input_tokens // bs
        shared = len(kv)
        if shared < filled:
            kv = kv + self.synthetic(row, shared, filled)
        return RequestNames(prompt, kv, shared)
