"""The step-cost interface the engine prices every step with, and the hand-checkable
`linear` profile.

A step is described by its composition, never by request objects:

* `prefill_chunks`: one `(q, c)` pair per sequence that computes more than one token in the
  step (a prefill chunk): `q` tokens computed now, `c` tokens already in its KV cache
  (prefix-cache hits plus earlier chunks);
* `num_decodes`: sequences computing exactly one token;
* `decode_context_tokens`: the sum over those decodes of `c_i + 1`, i.e. the KV length each
  decode attends to including the token computed in this step.

`decode_run_times(B, C0, K)[k]` must equal `step_time((), B, C0 + k*B)` bit for bit: the
engine fast-forwards runs of decode-only steps with the former and single steps with the
latter, and the two modes must give identical results.

A model that prices a decode batch by its longest sequence too (`lmsim.profile.decode_batch`)
says so with `prices_decode_longest = True`; the engine then also passes the longest decode's
KV length, `step_time(chunks, B, C, M)` and `decode_run_times(B, C0, K, M0)` (step k's longest
is M0 + k), with the same bit-for-bit rule. Other models are called with three arguments.

`host_time(num_seqs, num_tokens)` is the part of `step_time` spent on the host (scheduling,
input preparation, sampling, output processing) for a step of that many sequences and
tokens; it must not exceed `step_time` of any such step. Synchronous engines pay it in every
step; with asynchronous scheduling (vLLM 0.33's default) it overlaps the GPU part of the
step before, and only the rest, `step_time - host_time`, occupies the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class StepCostModel(Protocol):
    name: str

    def step_time(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        num_decodes: int,
        decode_context_tokens: int,
    ) -> float: ...

    def decode_run_times(
        self, num_decodes: int, first_context_tokens: int, num_steps: int
    ) -> np.ndarray: ...

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float) -> int | None:
        """KV pool size in blocks derived from memory facts, or None if the profile has none."""
        ...

    def host_time(self, num_seqs: int, num_tokens: int) -> float:
        """The host (CPU) part of `step_time` for a step of `num_seqs` sequences and
        `num_tokens` tokens (see the module docstring)."""
        ...


@dataclass(frozen=True)
class LinearCostModel:
    """t = step_base_s + per_prefill_token_s * sum(q) + per_decode_seq_s * B
    + per_context_token_s * (sum over chunks of (c + q) + decode_context_tokens).

    `host_step_s` (default 0, at most `step_base_s`) is the part of `step_base_s` spent on
    the host in every step: `host_time` returns it whatever the step, so under asynchronous
    scheduling a step occupies the GPU for t - host_step_s.

    Every number it produces can be computed by hand, which is what the engine tests need.
    It carries no memory facts, so the cluster must set `num_gpu_blocks` explicitly.
    """

    step_base_s: float
    per_prefill_token_s: float = 0.0
    per_decode_seq_s: float = 0.0
    per_context_token_s: float = 0.0
    kv_bytes_per_token: float | None = None  # prices a P/D KV transfer; no effect on steps
    host_step_s: float = 0.0
    name: str = "linear"

    def step_time(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        num_decodes: int,
        decode_context_tokens: int,
    ) -> float:
        prefill_tokens = 0
        context = decode_context_tokens
        for q, c in prefill_chunks:
            prefill_tokens += q
            context += c + q
        return float(
            np.float64(self.step_base_s)
            + self.per_prefill_token_s * np.float64(prefill_tokens)
            + self.per_decode_seq_s * np.float64(num_decodes)
            + self.per_context_token_s * np.float64(context)
        )

    def decode_run_times(
        self, num_decodes: int, first_context_tokens: int, num_steps: int
    ) -> np.ndarray:
        context = first_context_tokens + num_decodes * np.arange(num_steps, dtype=np.int64)
        return (
            np.float64(self.step_base_s)
            + self.per_prefill_token_s * np.float64(0)
            + self.per_decode_seq_s * np.float64(num_decodes)
            + self.per_context_token_s * context.astype(np.float64)
        )

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float) -> int | None:
        return None

    def host_time(self, num_seqs: int, num_tokens: int) -> float:
        return float(self.host_step_s)
