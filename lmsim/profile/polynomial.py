"""The `polynomial` profile: the step-time model of Dynamo's mocker, for side-by-side runs.

Dynamo's offline replay (ai-dynamo 1.6.1, which embeds AISimulate 0.13) prices an engine pass
with two closed forms when `timing_model` is its default `polynomial`
(`ai-dynamo/aisimulate`, `crates/core/src/engine/common/perf_model.rs`,
`polynomial_prefill_time` and `polynomial_decode_time`):

* prefill(ms) = 4.209989e-7·T² + 1.518344e-2·T + 16.50142, T = the new (uncached) prompt
  tokens the pass computes over its whole batch; 0 when T = 0. The cached context is ignored.
* decode(ms) = max(1, −25.74·u² + 54.01·u + 5.74), u = min(1, K / capacity), K = the KV
  tokens of the sequences that sample a token in the pass (each one's prompt plus outputs so
  far) and capacity = the worker's `num_gpu_blocks × block_size`. The batch size does not
  enter.

In its vLLM mode a pass that computes prompt tokens and samples tokens costs prefill +
decode (`scheduler/vllm/core.rs`: `predict_prefill_duration` then `emit_ready_tokens`,
added), with two per-worker exceptions: a prefill worker's pass has no decode part (its one
token comes with the prefill), and a decode worker's prompt tokens (the part of the prompt a
transfer did not bring) are not priced as prefill. `worker_type` selects which of the three
an instance is; the mocker's checks by hand: 4,096 new tokens cost 85.756 ms, one 4,096-token
sequence on 17,500 × 16 KV tokens decodes in 6.525 ms (peer_research §A.3, probe_transfer.py).

lmsim's step-cost interface sees a step's prefill chunks (q, c), its decodes and their
context, not which chunk completes its prompt; every chunk is taken to sample a token (its
c + q tokens counted in K, the decode part charged). That is exact for decode workers (a
transfer leaves at most a block to compute), for prefill workers (no decode part) and for
prompts computed in one step; a prompt split over several steps is charged a decode part on
each of its earlier chunks too (the mocker charges none when nothing else decodes).

`kv_capacity_tokens` is normally left out: the engine binds each pool's copy to that pool's
KV size (`with_kv_capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from lmsim.errors import ProfileError

PREFILL_MS = (4.209989e-07, 1.518344e-02, 1.650142e01)  # T², T, 1
DECODE_MS = (-25.74, 54.01, 5.74)  # u², u, 1
DECODE_FLOOR_MS = 1.0
WORKER_TYPES = ("aggregated", "prefill", "decode")


@dataclass(frozen=True)
class PolynomialCostModel:
    worker_type: str = "aggregated"
    kv_capacity_tokens: int | None = None
    kv_bytes_per_token: float | None = None
    name: str = "polynomial"

    def __post_init__(self) -> None:
        if self.worker_type not in WORKER_TYPES:
            raise ProfileError(f"worker_type must be one of {', '.join(WORKER_TYPES)}, got {self.worker_type!r}")

    def with_kv_capacity(self, tokens: int) -> PolynomialCostModel:
        """This model on a worker of `tokens` KV tokens (unless the profile fixed its own)."""
        if self.kv_capacity_tokens is not None:
            return self
        return replace(self, kv_capacity_tokens=int(tokens))

    def _decode_ms(self, kv_tokens: int) -> float:
        cap = self.kv_capacity_tokens
        if cap is None:
            raise ProfileError("polynomial profile: kv_capacity_tokens is unknown (the engine binds it per pool)")
        u = min(1.0, kv_tokens / cap)
        a2, a1, a0 = DECODE_MS
        return max(DECODE_FLOOR_MS, a2 * u * u + a1 * u + a0)

    def step_time(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        num_decodes: int,
        decode_context_tokens: int,
    ) -> float:
        new_tokens = 0
        kv_tokens = decode_context_tokens
        for q, c in prefill_chunks:
            new_tokens += q
            kv_tokens += c + q
        ms = 0.0
        if new_tokens and self.worker_type != "decode":
            c2, c1, c0 = PREFILL_MS
            ms = c2 * new_tokens * new_tokens + c1 * new_tokens + c0
        sampling = num_decodes if self.worker_type == "prefill" else num_decodes + len(prefill_chunks)
        if sampling:
            ms = ms + self._decode_ms(kv_tokens if self.worker_type != "prefill" else decode_context_tokens)
        return ms / 1000.0

    def decode_run_durations(self, num_decodes: int, first_context_tokens: int, num_steps: int) -> list[float]:
        # step_time((), B, C0 + k*B) term by term: the same operations, so the same bits
        return [self.step_time((), num_decodes, first_context_tokens + k * num_decodes) for k in range(num_steps)]

    def decode_run_times(self, num_decodes: int, first_context_tokens: int, num_steps: int) -> np.ndarray:
        return np.array(self.decode_run_durations(num_decodes, first_context_tokens, num_steps))

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float) -> int | None:
        return None

    def host_time(self, num_seqs: int, num_tokens: int) -> float:
        """No host part: the mocker's polynomials price a whole synchronous step."""
        return 0.0


POLYNOMIAL_FIELDS = ("worker_type", "kv_capacity_tokens", "kv_bytes_per_token")


def check_polynomial_fields(spec: dict) -> None:
    for key in spec:
        if key != "kind" and key not in POLYNOMIAL_FIELDS:
            raise ValueError(f"unknown field {key!r} for a polynomial profile (fields: {', '.join(POLYNOMIAL_FIELDS)})")
    if spec.get("worker_type", "aggregated") not in WORKER_TYPES:
        raise ValueError(f"worker_type must be one of {', '.join(WORKER_TYPES)} (got {spec['worker_type']!r})")
    cap = spec.get("kv_capacity_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
        raise ValueError(f"kv_capacity_tokens must be a positive integer (got {cap!r})")
    kv = spec.get("kv_bytes_per_token")
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int | float) or not math.isfinite(kv) or kv < 0):
        raise ValueError(f"kv_bytes_per_token must be a number >= 0 (got {kv!r})")
