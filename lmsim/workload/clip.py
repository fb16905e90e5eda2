"""Clip requests to a model length the way Vidur does.

Vidur's trace-replay generator makes every request fit `max_tokens` by shortening its
prompt: `prompt -= max(0, prompt + output - max_tokens)`, the output is kept
(vidur/request_generator/trace_replay_request_generator.py, `__init__`). A shortened prompt
keeps its leading hash blocks, the ones that still cover it.
"""

from __future__ import annotations

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.trace import Trace


def clip_to_max_tokens(trace: Trace, max_tokens: int) -> Trace:
    """Prompt + output <= max_tokens for every row, by shortening prompts (Vidur's rule)."""
    excess = np.maximum(0, trace.input_tokens + trace.output_tokens - max_tokens)
    if not excess.any():
        return trace
    new_input = trace.input_tokens - excess
    if (new_input < 1).any():
        i = int(np.argmax(new_input < 1))
        raise ConfigError(
            f"workload.max_tokens: request {i} has {int(trace.output_tokens[i])} output tokens, "
            f"which leave no prompt within max_tokens {max_tokens}"
        )
    out = trace.take(np.arange(len(trace)))
    counts = np.diff(out.hash_offsets)
    keep = np.where(counts > 0, np.minimum(counts, -(-new_input // out.block_size)), 0)
    if (keep != counts).any():
        starts = out.hash_offsets[:-1]
        idx = np.concatenate([np.arange(s, s + k) for s, k in zip(starts.tolist(), keep.tolist())] or [np.zeros(0, np.int64)])
        out.hash_values = out.hash_values[idx.astype(np.int64)]
        out.hash_offsets = np.concatenate(([0], np.cumsum(keep))).astype(np.int64)
    out.input_tokens = new_input
    out.meta["clipped_to_max_tokens"] = f"{int((excess > 0).sum())} of {len(out)} at {max_tokens}"
    return out
