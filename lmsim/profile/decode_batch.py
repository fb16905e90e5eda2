"""How a decode batch of mixed KV lengths is priced: the form (`step.decode_batch` in
profile.yaml) and the statistic the engine keeps for it (`LongestDecode`).

A profile's decode-attention table is keyed by (batch B, summed KV length C), and a row at
batch B was built (or measured) with B sequences of C/B tokens each. A step of equal lengths
is read off the table as it stands. A mixed batch needs a rule:

* `mean` (lmsim before issue 34, and Vidur: `_get_attention_decode_execution_time` looks the
  batch up at its mean KV length): the table at (B, C), as if every sequence had C/B tokens.
* `longest` (the default): the table at (C/M, C), M the longest sequence's KV length: the
  batch counted in units of its longest sequence. For equal lengths C/M = B, so both forms
  give the same bits.

Why the forms differ, and why it matters. The shipped tables' decode attention is, per layer
and at a fixed B, linear in C (`analytic.Kernels.decode_attention`: the KV read and the
query-tile compute are both proportional to C, combined by a degree-1 roofline), times the
small-batch engine term `1 + u/(B·h)` (u = `engine_kv_half_units`, h = KV heads per GPU). Put
per sequence of length L, a batch of B equal sequences costs `r·B·L + r·(u/h)·L`: each
sequence's KV read at the bulk rate, plus one sequence's length of shortfall, the part of the
read the engine cannot spread over the SMs. So the attention of a batch is not a sum of
per-sequence terms at a batch-independent rate (no such sum reproduces the equal-length
rows); what a mixed batch must decide is whose length the shortfall is. `mean` says C/B:
adding a 100-token decode beside a 120,000-token one halves the long one's shortfall, and on
h20/qwen2-7b the pair costs 16.35 ms against 17.02 ms for the long decode alone (-3.9%; the
linear part sums the lengths exactly, the whole drop is the engine term at B = 2 against
B = 1), which once made an idle instance look cheaper than a busy one. `longest` says M: the
long decode's shortfall is its own whatever short ones run beside it, and each sequence's KV
read is its own (`r·ΣL_i + r·(u/h)·M`, which is the table at (C/M, C) wherever the table is
that form, to within the bilinear interpolation across the batch axis).

Mechanism (vLLM v1 `vllm/v1/attention/backends/flash_attn.py`,
`FlashAttentionMetadataBuilder.build`): the decode kernel is scheduled with every sequence's
own length (`cache_seqlens=seq_lens`) and the batch's longest (`max_seqlen_k=max_seq_len`),
and under full CUDA graphs its KV splits are capped
(`_DEFAULT_MAX_NUM_SPLITS_FOR_CUDA_GRAPH = 16`): each (sequence, KV head) reads its own pages
in at most that many splits, so a short sequence adds CTAs of its own and cannot split the
long one's read further. Paged attention reads each sequence's own KV; nothing in the kernel
works at the mean length. Hence: a mixed batch never costs less than its most expensive
member alone, and adding a decode to a step never makes it cheaper (both tested on every
shipped profile, `tests/test_decode_batch.py`).

Evidence for the default. `lmsim profile check` cannot tell the forms apart: every public
row is batch 1 or B equal lengths (`decode_step` rows price `step_time((), B, B·L)`), where
the forms agree bit for bit; both score in scope 437/495 within 10% and 0 beyond 25%, check
split 143/173 within 10%, H20 long-context 20/20. No public measurement of a mixed-length
batch exists (profiles/README.md). The default is therefore chosen by the mechanism above and
the invariant it guarantees; `mean` stays selectable per profile (`step.decode_batch: mean`)
and is what a Vidur import declares, since that is Vidur's rule.

Cost on the hot path. The engine keeps M as a multiset of per-request offsets (a decode's KV
length at step s is `input_tokens - decode_base + s`, so its offset is fixed while it
decodes): O(log n) when a decode starts or stops, O(1) amortised to read; it is checked
against a recount in every step of a `simulation.check` run (`engine/invariants.py`). Within a
fast-forwarded run every length grows by one per step, so M grows by one and C by B, and the
lookup point (C/M, C) only moves forward: `TableCostModel._mixed_run` walks the table's cells
in order, each cell a cached bilinear polynomial, long stretches in numpy (same IEEE
operations, same bits as `step_time`). A priced step still costs about 1.5 times a mean-form
one (a division C/M and a second lerp): paired in one process (3 repetitions each, bench
--quick workloads, requests per CPU second, mean form = the old code path) chatbot/vllm
3,188 -> 2,958 (-7%), chatbot/lmetric 2,164 -> 2,153 (-1%), coder/lmetric 295 -> 308 (+4%;
each form simulates its own trajectory, so part of any difference is the work itself). Since
then a run that stays in its first cell (93% of chatbot/vllm's) is priced from its last step
alone, and a cell's steps in a loop on floats (`tables._cell_steps`; the step-by-step reference
is in tests/test_mixed_run_fast.py): replaying chatbot/vllm's 8,512 run calls in one process
(best of 7) costs 29-30 ms under this form against 40-41 ms before and 26-27 ms under the mean
form, out of about 1.1 s of simulation. End to end, paired in one process (8 rounds, best of
4 each), chatbot/vllm still runs about 3% faster under the mean form (-0.2% to +7.6% a round,
noise about 4%), which also simulates 1% fewer steps; the rest is the longest decode's
tracking and step_time's mixed lookups. The mean form keeps the old path exactly (the engine tracks nothing for it).

Results move wherever batches mix lengths, which is everywhere: every golden case moved
(tests/golden.json); against the mean form on the same code, e.g. kimi-vllm mean TTFT +5.0%
and mean TPOT -1.3%, kimi-lmetric -1.1% and +10.0%, chat-bailian +11.4% and +1.0%. Routers
that predict step times (lmetric, polyserve, the predictive policies) see only a batch's
size and total context and so still predict with the mean form.
"""

from __future__ import annotations

import heapq

DECODE_BATCH_FORMS = ("longest", "mean")
DEFAULT_DECODE_BATCH = "longest"


class LongestDecode:
    """The largest of a multiset of integers under insertions and deletions (a max-heap with
    lazy deletion). The engine stores each decode's KV-length offset; the longest decode's KV
    length at step s is `longest() + s`."""

    __slots__ = ("_count", "_heap")

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._heap: list[int] = []  # negated values, each present value at least once

    def add(self, value: int) -> None:
        count = self._count.get(value, 0)
        self._count[value] = count + 1
        if not count:
            heap = self._heap
            if len(heap) > 2 * len(self._count) + 64:
                # Entries of removed values sink below a long-lived maximum and are popped
                # only when they surface: rebuild before they outnumber the live ones.
                heap[:] = [-v for v in self._count if v != value]
                heapq.heapify(heap)
            heapq.heappush(heap, -value)

    def remove(self, value: int) -> None:
        count = self._count[value]
        if count == 1:
            del self._count[value]
        else:
            self._count[value] = count - 1

    def longest(self) -> int:
        """The largest value held (the multiset must not be empty)."""
        heap, count = self._heap, self._count
        while -heap[0] not in count:
            heapq.heappop(heap)
        return -heap[0]

    def __len__(self) -> int:
        return sum(self._count.values())
