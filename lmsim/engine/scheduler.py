"""One vLLM-v1 engine's scheduler: continuous batching, chunked prefill with a token budget,
prefix-cache admission and recompute preemption. Plain Python, no SimPy.

The step loop follows vLLM's `Scheduler.schedule()` (costmodel.md §7):

1. Running requests, in admission order, each get `min(tokens left, budget left)` tokens
   (1 for a decode; a partial prefill its next chunk, capped by
   `long_prefill_token_threshold` when set). If a request's blocks cannot be allocated, the
   newest running request is preempted (freed, reset, put at the front of the waiting
   queue) until the allocation fits or the request preempted itself.
2. Only if nothing was preempted, waiting requests are admitted first come first served:
   prefix-cache lookup (capped so at least one token is computed), then allocation; the first
   failure stops admission.
3. A request samples a token at the end of the step that computes its last uncomputed
   token: the first output token at the end of its prefill, then one per decode step.

Speed without per-request work per decode step: decoding requests are not touched step by
step. Each records `decode_base`, and its output count is `steps_done - decode_base`. The
blocks decodes need are counted by phase (a decode needs a new block every `block_size`
steps), finishes come from a heap keyed by the step at which each request ends, and the
cost model gets the decodes' total context from two running sums. A run of decode-only steps
(no prefill running, nothing admissible) is planned in one go (`fast_forward`) and its
effects are applied lazily with `advance`; with fast-forward off the same code plans runs of
length one, so both modes take the same decisions.

When several requests are starved by the token budget, or an allocation fails, the exact
per-request loop (`_plan_exact`) runs instead of the aggregate one; both implement the
same rules.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import takewhile

from lmsim.engine.connector import KVConnector
from lmsim.engine.kv_cache import ANON, PrefixCache
from lmsim.engine.request import Request, RequestState
from lmsim.profile.base import StepCostModel
from lmsim.profile.decode_batch import LongestDecode


@dataclass(slots=True)
class StepPlan:
    """What one planned step (or run of identical decode-only steps) does."""

    start_step: int
    num_steps: int
    durations: list[float]
    chunks: list[tuple[Request, int]] = field(default_factory=list)  # prefill (request, q)
    num_decodes: int = 0
    num_tokens: int = 0  # tokens scheduled in the first step
    decode_context: int = 0  # sum of KV lengths the first step's decodes attend to
    decode_longest: int = 0  # the longest of them (0: not tracked, the cost model does not use it)
    admitted: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    starved: list[Request] = field(default_factory=list)  # decodes given no token
    # Decodes of the first step whose previous token is not from the step before (their
    # gap is longer than a step): for the inter-token-latency record.
    late: list[Request] = field(default_factory=list)
    long_prefill_cap: int = 0  # long_prefill_token_threshold in force (0: waived or unset)


@dataclass(slots=True)
class StepOutcome:
    """Requests whose state changed at the end of a step, in running order."""

    first_tokens: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)


class InstanceScheduler:
    def __init__(
        self,
        cache: PrefixCache,
        cost_model: StepCostModel,
        *,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 1024,
        long_prefill_token_threshold: int = 0,
        enable_prefix_caching: bool = True,
        fast_forward: bool = True,
        max_run_steps: int = 64,
        admission: str = "first_chunk",
        watermark_blocks: int = 0,
        waive_long_prefill_when_alone: bool = False,
    ) -> None:
        self.cache = cache
        self.cost_model = cost_model
        self._grid_check = getattr(cost_model, "steps_outside_grid", None)
        # A list-returning twin of decode_run_times spares a numpy round trip per run.
        self._run_durations = getattr(cost_model, "decode_run_durations", None)
        # Decodes' KV-length offsets (input_tokens - decode_base), kept only for a cost model
        # that prices a mixed batch by its longest sequence (lmsim.profile.decode_batch).
        self._longest = LongestDecode() if getattr(cost_model, "prices_decode_longest", False) else None
        self.num_outside_grid = 0  # committed steps priced outside the profile's grid
        self.block_size = cache.block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.enable_prefix_caching = enable_prefix_caching
        self.fast_forward = fast_forward
        if admission not in ADMISSION_RULES:
            raise ValueError(f"admission must be one of {', '.join(ADMISSION_RULES)}, got {admission!r}")
        self.admission = admission
        self.watermark_blocks = watermark_blocks if admission == "whole_prompt_watermark" else 0
        self.waive_long_prefill_when_alone = waive_long_prefill_when_alone
        self._cap = 0  # long_prefill_token_threshold in force for the step being planned
        # Most runs are cut short by an arrival after a dozen steps; pricing hundreds of steps
        # that are thrown away costs more than one extra event for the rare long run. So a
        # run is capped at `max_run_steps`, and the cap doubles after each run that reached
        # it uncut (an instance nobody sends work to: on the Kimi trace 3 runs in 4 ended at
        # a fixed cap of 64) and falls back after a cut. The cap changes only how many events
        # a run takes, never a decision or a time.
        self.max_run_steps = max_run_steps
        self._run_cap = max_run_steps
        self._run_capped = False  # the planned run stopped at the cap (not at a finish etc.)

        self.running: list[Request] = []  # admission order
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []  # running, prompt not fully computed; by admit_seq
        self.steps_done = 0  # completed steps
        self._alloc_through = 0  # steps whose block allocations have been applied
        self._run_start = 0  # first step of the planned step/run
        # The step whose scheduling is changing the cache now: its KV events are published
        # when it ends. Kept only while the cache has listeners.
        self.event_step = 0
        self._run_end = 0  # step index after the planned step/run
        self._admit_counter = 0
        # The last plan, until its schedule-time effects are applied (`_launch`), and the
        # index after the last launched step.
        self._unlaunched: StepPlan | None = None
        self._launched_through = 0
        # Requests that sample a token when the oldest planned step ends: prompts completed
        # in it, requests whose last token it computes, and (when steps are planned ahead)
        # requests preempted while it was computing their token.
        self._sampling: list[Request] = []
        # Decoding requests starved earlier whose next token ends a longer gap, and the
        # requests with tokens whose next token the last plan put off (starved or
        # preempted), which the instance collects after each plan.
        self._gapped: list[Request] = []
        self.interrupted: list[Request] = []

        # Aggregates over decoding requests.
        self.num_decoding = 0
        self._phase = [0] * self.block_size  # decodes needing a new block at step s: [s % bs]
        self._dec_sum_input = 0
        self._dec_sum_base = 0
        self._finish_heap: list[tuple[int, int, Request]] = []
        # Decoding requests with output blocks still to cache, by the step phase at which
        # their KV fills a block: [s % bs] fill a block at step s.
        self._fills: list[dict[Request, None]] = [{} for _ in range(self.block_size)]

        # Aggregates over waiting and prefilling requests.
        self._nondec_tokens = 0
        self.pending_prefill_tokens = 0
        self.num_preemptions = 0
        # Waiting requests dropped because they can never be admitted again (see
        # `_never_fits`); the instance collects them after each plan.
        self.rejected: list[Request] = []
        # The KV connector seam (lmsim.engine.connector); None: no external KV at all.
        self.connector: KVConnector | None = None
        self.loading: dict[Request, None] = {}  # blocks allocated, bytes on their way
        self.held: dict[Request, None] = {}  # finished, blocks kept for a reader
        self._load_counter = 0
        # Seconds a connector's synchronous loads add to the step that admits the request
        # (LMCache's non-layerwise load runs before that step's forward); should the loaded
        # request not fit after all, the next step that admits anything carries them.
        self.step_extra_s = 0.0

    # -- views ---------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        # vLLM counts requests waiting for remote KV among the waiting ones
        return len(self.waiting) + len(self.loading)

    @property
    def decode_context_tokens(self) -> int:
        return self._dec_sum_input - self._dec_sum_base + self.num_decoding * self.steps_done

    @property
    def total_tokens(self) -> int:
        return self._nondec_tokens + self.decode_context_tokens

    @property
    def is_idle(self) -> bool:
        return not self.running and not self.waiting

    def hit_blocks(self, request: Request) -> int:
        """Blocks of `request` the prefix cache would serve now (capped, no side effects).
        A resumed request looks up its output blocks too (vLLM hashes `all_token_ids`)."""
        if not self.enable_prefix_caching:
            return 0
        cap = (request.num_tokens_target - 1) // self.block_size
        # A waiting request is matched again at every routing decision that replays the
        # queue (llmd) and every plan; most find the cache as they left it.
        version = self.cache.version
        if request.hit_memo_version == version and request.hit_memo_cap == cap:
            return request.hit_memo_blocks
        hit = self.cache.match(request.kv_hashes, cap)
        request.hit_memo_version, request.hit_memo_cap, request.hit_memo_blocks = version, cap, hit
        return hit

    def queued_prefills(self) -> list[tuple[int, int]]:
        out = [(r.num_tokens_target - r.num_computed_tokens, r.num_computed_tokens) for r in self.prefilling]
        for r in self.waiting:
            hit = r.num_computed_tokens if r.kv_loaded else self.hit_blocks(r) * self.block_size
            out.append((r.num_tokens_target - hit, hit))
        for r in self.loading:
            done = self._loaded_tokens(r)
            out.append((r.num_tokens_target - done, done))
        return out

    @property
    def allocated_through(self) -> int:
        """The step index after the last step whose blocks are allocated."""
        return self._alloc_through

    def planned_ahead(self) -> int:
        """Planned steps that have not ended (as materialized)."""
        return self._run_end - self.steps_done

    def outputs_of(self, request: Request) -> int:
        """Output tokens sampled by the steps that have ended."""
        if request.decoding:
            # a starvation shifts the base when its step is planned, before it ends
            return self.steps_done - request.decode_base + request.starved_in_flight
        return request.num_output_done

    # -- arrivals ------------------------------------------------------------------------

    def enqueue(self, request: Request) -> None:
        request.state = _WAITING
        self.waiting.append(request)
        self._nondec_tokens += request.num_tokens_target
        self._set_pending(request, request.num_tokens_target - self.hit_blocks(request) * self.block_size)

    # -- planning ------------------------------------------------------------------------

    def plan(self, now: float) -> StepPlan | None:
        """Plan the next step (or decode-only run), the one after the last planned step;
        None when there is nothing to run (idle, or idle once requests that can never fit
        again were dropped into `rejected`, or nothing schedulable before the step in
        flight ends)."""
        if self._unlaunched is not None:
            self._launch(self._unlaunched)
        if self.is_idle:
            return None
        s = self._run_end
        assert self._alloc_through == s, "plan() before the planned steps were allocated"
        in_flight = s > self.steps_done
        planned_start = self._run_start
        self._cap = self._long_prefill_cap()
        budget = self.max_num_batched_tokens
        num_dec = self.num_decoding
        self._run_start = s
        self.event_step = s
        decodes_allocated = False
        decode_only = not self.prefilling and num_dec and num_dec <= budget
        if decode_only and self._phase[s % self.block_size] <= self.cache.num_free_blocks:
            # vLLM's schedule() allocates (and caches) the running requests' blocks before
            # it looks at the waiting queue, so admission sees their evictions and fills.
            self._allocate_decode_steps(s, s + 1)
            decodes_allocated = True
            if self._admission_blocked(budget - num_dec):
                run = self._plan_run(s)
                if self._gapped:
                    self._sort_gapped(run)
                return run
        plan = self._plan_aggregate(s, now, decodes_allocated)
        if plan is None:
            plan = self._plan_exact(s, now)
        if self._gapped:
            self._sort_gapped(plan)
        if not plan.num_tokens and (
            self.is_idle or in_flight or (not plan.preempted and (self.loading or self.held))
        ):
            # Nothing to compute: only a rejection happened, everything running waits for
            # the step in flight (vLLM runs no model for an empty schedule), or nothing fits
            # until a load lands or held blocks are freed (the connector's callback wakes
            # the instance).
            self._alloc_through = s
            self._run_start = planned_start
            return None
        plan.long_prefill_cap = self._cap
        self._alloc_through = s + 1
        self._run_end = s + 1
        self._unlaunched = plan
        return plan

    def _sort_gapped(self, plan: StepPlan) -> None:
        """The starved decodes that get a token in this plan's first step are late (their
        gap spans the steps they missed); those starved again stay gapped."""
        starved = plan.starved
        plan.late = [r for r in self._gapped if r.decoding and r not in starved]
        self._gapped = [r for r in self._gapped if r.decoding and r in starved]

    def _long_prefill_cap(self) -> int:
        """`long_prefill_token_threshold`, unless one request is alone in the engine and
        `waive_long_prefill_when_alone`: vLLM 0.33 `Scheduler.schedule` drops the cap when
        running + waiting <= 1, since there is nobody to starve (vLLM 0.11 always applied
        it)."""
        if not self.waive_long_prefill_when_alone or len(self.running) + len(self.waiting) > 1:
            return self.long_prefill_token_threshold
        return 0

    def _plan_run(self, s: int) -> StepPlan:
        """Decode-only steps from s (whose blocks are allocated) while the waiting queue's
        head stays blocked and no decode finishes."""
        num_dec = self.num_decoding
        k = 1
        if self.fast_forward:
            k_finish = self._peek_finish_step() - s + 1
            k = min(
                k_finish,
                1 + self._steps_until_blocks_run_out(s + 1, self.cache.num_free_blocks),
                self._run_cap,
            )
            self._run_capped = k == self._run_cap
            if k > 1 and self.waiting:
                if s > self.steps_done and any(r.retiring or r.state is _WAITING for r in self._sampling):
                    # Planned ahead: the step in flight frees blocks or seats (or grows a
                    # preempted request) when it ends, which the next plan must see.
                    k = 1
                    self._run_capped = False
                else:
                    k = self._steps_head_stays_blocked(s, k)
        context0 = self._dec_sum_input - self._dec_sum_base + num_dec * s  # decodes' KV at step s
        longest0 = self._longest.longest() + s if self._longest is not None else 0
        longest = (longest0,) if longest0 else ()  # other cost models take three arguments
        if self._run_durations is not None:
            durations = self._run_durations(num_dec, context0, k, *longest)
        else:
            durations = self.cost_model.decode_run_times(num_dec, context0, k, *longest).tolist()
        self._run_end = s + k
        plan = StepPlan(
            s, k, durations, num_decodes=num_dec, num_tokens=num_dec, decode_context=context0,
            decode_longest=longest0, long_prefill_cap=self._cap,
        )
        self._unlaunched = plan
        return plan

    def _steps_head_stays_blocked(self, s: int, k: int) -> int:
        """Shorten a run [s, s + k) to the steps after which the waiting queue's head is
        still provably blocked. Free blocks only shrink during a decode-only run, but the
        head's need can shrink too: when an allocation evicts a cached block of its hit
        (the deeper hit blocks stop counting against the free pool) or when a decode caches
        the block that extends its hit. The run ends before the first step that does
        either; stepping then re-checks the head on the real state."""
        head = self.waiting[0]
        budget_left = self.max_num_batched_tokens - self.num_decoding
        if self.connector is not None:
            # What a connector can load changes with state outside this instance (another
            # instance's prefill, a tier's copies): re-check the head at every step.
            return 1
        if not self.enable_prefix_caching or budget_left <= 0 or len(self.running) >= self.max_num_seqs:
            return k  # blocked whatever the cache holds
        bs = self.block_size
        hashes = head.kv_hashes
        hit = self.hit_blocks(head)
        cap = (head.num_tokens_target - 1) // bs
        extending = hashes[hit] if hit < min(cap, len(hashes)) else None
        hit_set = set(hashes[:hit])
        plain = self.cache.num_plain_free
        need = sum(self._phase[(s + i) % bs] for i in range(1, k))
        doomed = self.cache.free_entries(max(0, need - plain))
        safe_allocs = plain + next((i for i, h in enumerate(doomed) if h in hit_set), len(doomed))
        allocated = 0
        for i in range(1, k):
            st = s + i
            allocated += self._phase[st % bs]
            if allocated > safe_allocs:
                return i
            if extending is not None:
                for request in self._fills[st % bs]:
                    j = (request.input_tokens + st - request.decode_base) // bs - 1
                    if j < len(request.kv_hashes) and request.kv_hashes[j] == extending:
                        return i
        return k

    def _steps_until_blocks_run_out(self, s: int, free: int) -> int:
        """Longest k such that the decodes' block needs over steps s..s+k-1 fit in `free`."""
        bs = self.block_size
        cycles = free // self.num_decoding  # a full cycle of bs steps needs one block per decode
        k = cycles * bs
        left = free - cycles * self.num_decoding
        phase = self._phase
        for i in range(bs):
            c = phase[(s + i) % bs]
            if c > left:
                break
            left -= c
            k += 1
        return k

    def _blocks_for_steps(self, start: int, end: int) -> int:
        bs = self.block_size
        count = end - start
        total = (count // bs) * self.num_decoding
        phase = self._phase
        for st in range(start + (count // bs) * bs, end):
            total += phase[st % bs]
        return total

    def _allocate_decode_steps(self, start: int, end: int) -> None:
        """Allocate the decodes' new blocks of steps start..end-1 and cache the blocks their
        KV fills, step by step (vLLM `KVCacheManager.allocate_slots` caches every full block
        up to `num_computed_tokens + num_new_tokens`, so an output block becomes a cache
        entry at the step that computes its last token).

        When the span's blocks all come from content-free free blocks nothing is evicted, and
        registering a filled block never touches those, so one allocation for the span is
        the same as one per step. Otherwise the evictions are deferred and applied in one
        go: registering a block never changes the free queue, so the same entries are
        evicted in the same order, and a registration sees the same cache either way unless
        its hash is cached now (then an eviction may decide between a duplicate and a fresh
        entry, and the evictions due so far are applied first). Only with KV-event
        listeners, whose event order would change, does each step allocate on its own."""
        if end <= start:
            return
        cache = self.cache
        bs = self.block_size
        phase = self._phase
        fills = self._fills
        listened = cache.has_listeners
        if end - start == 1:
            if listened:
                self.event_step = start
            i = start % bs
            if phase[i]:
                cache.allocate_anonymous_run(phase[i])
            if fills[i]:
                for request in list(fills[i]):
                    self._cache_filled_block(request, start)
            self._alloc_through = end
            return
        total = self._blocks_for_steps(start, end)
        batched = total <= cache.num_plain_free  # nothing to evict: the span at once
        if batched and total:
            cache.allocate_anonymous_run(total)
        step_by_step = not batched and listened
        cached = cache.cached_hashes
        deferred = 0
        for st in range(start, end):
            if listened:
                self.event_step = st
            i = st % bs
            if phase[i] and not batched:
                if step_by_step:
                    cache.allocate_anonymous_run(phase[i])
                else:
                    deferred += phase[i]
            bucket = fills[i]
            if bucket:
                for request in list(bucket):
                    if deferred:
                        j = (request.input_tokens + st - request.decode_base) // bs - 1
                        hashes = request.kv_hashes
                        if j < len(hashes) and hashes[j] in cached:
                            cache.allocate_anonymous_run(deferred)
                            deferred = 0
                    self._cache_filled_block(request, st)
        if deferred:
            cache.allocate_anonymous_run(deferred)
        self._alloc_through = end

    def _cache_filled_block(self, request: Request, st: int) -> None:
        """A decoding request's KV fills block j at step st: make it a cache entry (only
        blocks others may hit; `_cache_private_blocks` caches the rest at release)."""
        j = (request.input_tokens + st - request.decode_base) // self.block_size - 1
        shared = request.num_shared_blocks
        if j >= shared or j < request.num_cached_blocks:
            return
        keys = request.block_keys
        if j == len(keys):
            keys.append(ANON)
        self.cache.register_one(request.kv_hashes, keys, j)
        request.num_cached_blocks = j + 1
        if j + 1 >= shared:
            self._fills[(request.decode_base - request.input_tokens) % self.block_size].pop(request, None)

    def _cache_private_blocks(self, request: Request, kv_tokens: int) -> None:
        """Before a decoding (or retiring) request releases its blocks, holding `kv_tokens`
        tokens of KV: make the filled blocks that only it can hit (synthetic names, past
        `num_shared_blocks`) cache entries, in one run.

        Registering them step by step as decodes fill them (as vLLM does) gives the same
        cache: while the request holds them they are in use, so no allocation evicts them,
        and no other request looks them up; only the KV events of those blocks come at the
        release instead. One C-level run instead of a Python call per block: on chatbot
        traffic two thirds of the filled output blocks have no follow-up turn naming them."""
        filled = min(kv_tokens // self.block_size, len(request.kv_hashes))
        first = request.num_cached_blocks
        if filled <= first:
            return
        keys = request.block_keys
        if len(keys) < filled:
            keys.extend([ANON] * (filled - len(keys)))
        self.cache.register_range(request.kv_hashes, keys, first, filled)
        request.num_cached_blocks = filled

    def _admission_blocked(self, budget_left: int) -> bool:
        """Would the head of the waiting queue fail to be admitted this step? (A head that
        can never fit is not blocked: admission drops it.)"""
        if not self.waiting:
            return True
        if budget_left <= 0 or len(self.running) >= self.max_num_seqs:
            return True
        head = self.waiting[0]
        if self.watermark_blocks and self._never_fits(head):
            return False
        need = self._admission_need(head, budget_left)
        if self.connector is not None and not head.kv_loaded:
            external = self.connector.external_blocks(self, head, need[0])
            if external:
                return self._load_need(head, need[0], external) > self.cache.num_free_blocks
        return need[3] > self.cache.num_free_blocks

    def _never_fits(self, request: Request) -> bool:
        """Under `whole_prompt_watermark`, a request whose whole sequence so far needs more
        blocks than the pool minus the watermark can never be admitted (vLLM v0
        `BlockSpaceManager.can_allocate` returns NEVER when total - required < watermark,
        hits or not). Only a request preempted after producing output gets here: a prompt
        that cannot fit is rejected at dispatch."""
        need = -(-request.num_tokens_target // self.block_size)
        return need + self.watermark_blocks > self.cache.num_total_blocks

    def _drop_waiting_head(self) -> None:
        """vLLM v0 `Scheduler._schedule_prefills`: a group that can never be allocated is
        marked FINISHED_IGNORED, popped, and scheduling moves on to the next one."""
        request = self.waiting.popleft()
        self._nondec_tokens -= request.num_tokens_target
        self._set_pending(request, 0)
        self.rejected.append(request)

    def _admission_need(self, request: Request, budget_left: int) -> tuple[int, int, int, int]:
        """(hit blocks, tokens to schedule, new blocks to allocate now, free blocks the
        admission check requires) for admitting `request` under `self.admission`:

        * `first_chunk`: the first chunk's blocks (vLLM v1 `allocate_slots` until 2026);
        * `full_sequence`: blocks for every token of the request (vLLM 0.33
          `scheduler_reserve_full_isl`, `allocate_slots(full_sequence_must_fit=True)`:
          `cdiv(num_tokens)` minus hit blocks plus the free hit blocks); only the first
          chunk is allocated;
        * `whole_prompt_watermark`: the whole prompt is allocated at admission and must
          leave `watermark_blocks` free (vLLM v0 `BlockSpaceManager.can_allocate`, Vidur's
          `_can_allocate_request` with `watermark_blocks_fraction`).

        Free hit blocks count in every rule: touching them takes them out of the free
        queue (vLLM `get_num_blocks_to_allocate` adds `num_evictable_blocks`)."""
        bs = self.block_size
        if request.kv_loaded:  # holds its loaded blocks: no lookup, only the rest to allocate
            q = self._chunk_size(request, budget_left)
            new_blocks = self._new_blocks_for_chunk(request, q)
            return len(request.block_keys), q, new_blocks, new_blocks
        hit_blocks = self.hit_blocks(request)
        hit = hit_blocks * bs
        target = request.num_tokens_target
        q = target - hit
        if 0 < self._cap < q:
            q = self._cap
        q = min(q, budget_left)
        touched_free = self.cache.num_free_among(request.kv_hashes, hit_blocks)
        full_blocks = -(-target // bs) - hit_blocks
        if self.admission == "whole_prompt_watermark":
            return hit_blocks, q, full_blocks, full_blocks + touched_free + self.watermark_blocks
        new_blocks = -(-(hit + q) // bs) - hit_blocks
        if self.admission == "full_sequence":
            return hit_blocks, q, new_blocks, full_blocks + touched_free
        return hit_blocks, q, new_blocks, new_blocks + touched_free

    def _chunk_size(self, request: Request, budget_left: int) -> int:
        q = request.num_tokens_target - request.num_computed_tokens
        if 0 < self._cap < q:
            q = self._cap
        return min(q, budget_left)

    def _new_blocks_for_chunk(self, request: Request, q: int) -> int:
        # 0 when the whole prompt was allocated at admission
        return max(0, -(-(request.num_computed_tokens + q) // self.block_size) - len(request.block_keys))

    def _plan_aggregate(self, s: int, now: float, decodes_allocated: bool = False) -> StepPlan | None:
        """The common case in O(prefilling + admitted): no starvation, no preemption, and
        partial prefills behind every decode in running order. None if it does not apply."""
        budget = self.max_num_batched_tokens
        prefilling = self.prefilling
        num_dec = self.num_decoding
        if prefilling:
            first = bisect_left(self.running, prefilling[0].admit_seq, key=_admit_seq)
            if len(self.running) - first != len(prefilling):
                return None
        demands = [self._chunk_size(r, budget) for r in prefilling]
        if num_dec + sum(demands) > budget:
            return None
        blocks = 0 if decodes_allocated else self._phase[s % self.block_size]
        chunk_blocks = [self._new_blocks_for_chunk(r, q) for r, q in zip(prefilling, demands)]
        if blocks + sum(chunk_blocks) > self.cache.num_free_blocks:
            return None
        if not decodes_allocated:
            self._allocate_decode_steps(s, s + 1)
        plan = StepPlan(
            s,
            1,
            [],
            num_decodes=num_dec,
            num_tokens=num_dec + sum(demands),
            decode_context=self._dec_sum_input - self._dec_sum_base + num_dec * s,
        )
        if num_dec and self._longest is not None:
            plan.decode_longest = self._longest.longest() + s
        for request, q, nb in zip(prefilling, demands, chunk_blocks):
            self._allocate_chunk(request, q, nb)
            plan.chunks.append((request, q))
        self._admit(plan, budget - plan.num_tokens, now)
        plan.durations = [self._step_time(plan)]
        return plan

    def _plan_exact(self, s: int, now: float) -> StepPlan:
        """vLLM's per-request loop, for steps with starvation or preemption."""
        budget_left = self.max_num_batched_tokens
        bs = self.block_size
        cache = self.cache
        running = self.running
        plan = StepPlan(s, 1, [])
        i = 0
        while i < len(running) and budget_left > 0:
            request = running[i]
            if request.retiring:  # its last token is computing in the step in flight
                i += 1
                continue
            if request.decoding:
                q = 1
                need = 1 if (request.input_tokens + s - request.decode_base - 1) % bs == 0 else 0
            else:
                q = self._chunk_size(request, budget_left)
                need = self._new_blocks_for_chunk(request, q)
            preempted_self = False
            while need > cache.num_free_blocks:
                victim = running[-1]
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is request:
                    preempted_self = True
                    break
            if preempted_self:
                break
            if request.decoding:
                cache.allocate_anonymous_run(need)
                if request in self._fills[s % bs]:
                    self._cache_filled_block(request, s)
                plan.num_decodes += 1
                kv = request.input_tokens + s - request.decode_base
                plan.decode_context += kv
                if kv > plan.decode_longest:
                    plan.decode_longest = kv
            else:
                self._allocate_chunk(request, q, need)
                plan.chunks.append((request, q))
            plan.num_tokens += q
            budget_left -= q
            i += 1
        for request in running[i:]:
            if request.decoding:
                self._starve(request)
                plan.starved.append(request)
                if request.gap_from < 0:
                    self.interrupted.append(request)
                    self._gapped.append(request)
        for request in plan.preempted:
            # it has sampled a token, or gets one from the step in flight
            if request.gap_from < 0 and (request.num_output_done or request in self._sampling):
                self.interrupted.append(request)
        if not plan.preempted:
            self._admit(plan, budget_left, now)
        plan.durations = [self._step_time(plan)]
        return plan

    def _step_time(self, plan: StepPlan) -> float:
        chunks = [(q, r.num_computed_tokens) for r, q in plan.chunks]
        if self._longest is not None:
            seconds = self.cost_model.step_time(chunks, plan.num_decodes, plan.decode_context, plan.decode_longest)
        else:
            seconds = self.cost_model.step_time(chunks, plan.num_decodes, plan.decode_context)
        if self.step_extra_s:
            seconds += self.step_extra_s
            self.step_extra_s = 0.0
        return seconds

    def _admit(self, plan: StepPlan, budget_left: int, now: float) -> None:
        cache = self.cache
        bs = self.block_size
        while self.waiting and budget_left > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self.watermark_blocks and self._never_fits(request):
                self._drop_waiting_head()
                continue
            if request.kv_loaded:
                _held, q, new_blocks, consumed = self._admission_need(request, budget_left)
                if consumed > cache.num_free_blocks:
                    break
                self.waiting.popleft()
                request.kv_loaded = False
                self._start_running(request, q, new_blocks, plan)
                budget_left -= q
                continue
            hit_blocks, q, new_blocks, consumed = self._admission_need(request, budget_left)
            external = 0
            if self.connector is not None:
                external = self.connector.external_blocks(self, request, hit_blocks)
                if external:
                    consumed = self._load_need(request, hit_blocks, external)
            if consumed > cache.num_free_blocks:
                break
            self.waiting.popleft()
            hashes = request.kv_hashes if self.enable_prefix_caching else ()
            request.block_keys = cache.touch(hashes, hit_blocks)
            request.num_cached_blocks = hit_blocks
            request.num_computed_tokens = hit_blocks * bs
            if request.first_scheduled_at is None:
                request.first_scheduled_at = now
                request.cached_tokens = hit_blocks * bs
            if self.enable_prefix_caching:
                request.lookup_tokens += request.num_tokens_target
                request.lookup_hit_tokens += hit_blocks * bs
            if self.connector is not None:
                self.connector.admitted(self, request, hit_blocks)
            if external:
                self._start_load(request, hit_blocks, external)
                continue  # no tokens scheduled: the budget is untouched
            self._start_running(request, q, new_blocks, plan)
            budget_left -= q

    def _start_running(self, request: Request, q: int, new_blocks: int, plan: StepPlan) -> None:
        """An admitted request joins the running batch with its first chunk of q tokens."""
        request.state = _RUNNING
        self._admit_counter += 1
        request.admit_seq = self._admit_counter
        self.running.append(request)
        self.prefilling.append(request)
        self._set_pending(request, request.num_tokens_target - request.num_computed_tokens)
        self._allocate_chunk(request, q, new_blocks)
        plan.chunks.append((request, q))
        plan.admitted.append(request)
        plan.num_tokens += q

    # -- external KV (lmsim.engine.connector) ---------------------------------------------

    def _load_need(self, request: Request, hit_blocks: int, external: int) -> int:
        """Free blocks an admission that loads `external` blocks consumes: their blocks (no
        tokens are scheduled now, vLLM `allocate_slots` with num_new_tokens 0) and those of
        the first chunk after the load (see `_chunk_after_load`), plus the free hit blocks it
        touches; `full_sequence` still demands room for the whole sequence."""
        touched_free = self.cache.num_free_among(request.kv_hashes, hit_blocks)
        need = external + self._chunk_after_load(request, hit_blocks + external)
        if self.admission == "first_chunk":
            return need + touched_free
        full_blocks = -(-request.num_tokens_target // self.block_size) - hit_blocks
        return max(need, full_blocks) + touched_free + self.watermark_blocks

    def _chunk_after_load(self, request: Request, blocks: int) -> int:
        """Blocks beyond the first `blocks` (hit and loaded) that the request's first chunk
        after the load needs, reserved when the load starts. vLLM allocates only the loaded
        blocks; then requests that wait, loaded, for one more block each can fill the pool
        while nothing runs, and the instance stalls for good. Dynamo's mocker reserves this
        completion headroom before a handoff (`destination_handoff_completion_headroom`)."""
        loaded = min(blocks * self.block_size, request.num_tokens_target - 1)
        q = request.num_tokens_target - loaded
        if 0 < self.long_prefill_token_threshold < q:
            q = self.long_prefill_token_threshold
        q = min(q, self.max_num_batched_tokens)
        return max(0, -(-(loaded + q) // self.block_size) - blocks)

    def _loaded_tokens(self, request: Request) -> int:
        """Tokens computed once a load lands: every hit and loaded block, one token fewer
        when they cover them all (a token must be computed to sample one)."""
        blocks = request.num_cached_blocks + request.kv_external_blocks
        return min(blocks * self.block_size, request.num_tokens_target - 1)

    def _start_load(self, request: Request, hit_blocks: int, external: int) -> None:
        assert self.connector is not None
        reserved = self._chunk_after_load(request, hit_blocks + external)
        request.block_keys.extend(self.cache.allocate(external + reserved))
        request.kv_external_blocks = external
        self._load_counter += 1
        request.kv_load_seq = self._load_counter
        self.loading[request] = None
        self._set_pending(request, request.num_tokens_target - self._loaded_tokens(request))
        self.connector.start_load(self, request, hit_blocks, external)

    def finish_load(self, request: Request) -> None:
        """The connector's bytes have landed: the loaded blocks become cache entries and the
        request waits at the front of the queue, behind requests loaded before it, holding
        them (vLLM `_update_waiting_for_remote_kv`, then the skipped waiting requests are
        prepended to the queue)."""
        del self.loading[request]
        computed = self._loaded_tokens(request)
        blocks = request.num_cached_blocks + request.kv_external_blocks
        if self.enable_prefix_caching:
            # a partial last block read from a prefill instance is cached once it is full
            last = min(blocks, len(request.kv_hashes), request.num_tokens_target // self.block_size)
            if last > request.num_cached_blocks:
                self.cache.register_range(request.kv_hashes, request.block_keys, request.num_cached_blocks, last)
                request.num_cached_blocks = last
        request.num_computed_tokens = computed
        request.kv_loaded = True
        ahead = 0
        for queued in self.waiting:
            if not queued.kv_loaded or queued.kv_load_seq > request.kv_load_seq:
                break
            ahead += 1
        self.waiting.insert(ahead, request)
        self._set_pending(request, request.num_tokens_target - request.num_computed_tokens)

    def release_held(self, request: Request) -> None:
        """Free a held request's blocks (its cache entries stay cached, as on any release)."""
        del self.held[request]
        self.cache.release(request.block_keys, request.kv_held_extra)
        request.block_keys = []
        request.num_cached_blocks = 0
        request.kv_held_extra = 0

    def _allocate_chunk(self, request: Request, q: int, new_blocks: int) -> None:
        """Allocate a prefill chunk's blocks and make the blocks it fills cache entries."""
        cache = self.cache
        keys = request.block_keys
        if new_blocks:
            keys.extend(cache.allocate(new_blocks))
        if not self.enable_prefix_caching:
            return
        hashes = request.kv_hashes
        first = request.num_cached_blocks
        last = min((request.num_computed_tokens + q) // self.block_size, len(hashes))
        if last > first:
            cache.register_range(hashes, keys, first, last)
            request.num_cached_blocks = last

    # -- committing ----------------------------------------------------------------------

    def advance(self, steps_started: int, steps_completed: int) -> None:
        """Apply the effects of the first steps of the planned run (lazy fast-forward):
        the block allocations of the first `steps_started` steps and the output tokens of the
        first `steps_completed`. The last step's completion is left to `commit`."""
        alloc_to = min(self._run_start + steps_started, self._run_end)
        if alloc_to > self._alloc_through:
            self._allocate_decode_steps(self._alloc_through, alloc_to)
        if steps_completed:
            done_to = min(self._run_start + steps_completed, self._run_end - 1)
            if done_to > self.steps_done:
                self.steps_done = done_to

    def truncate_run(self, num_steps: int) -> None:
        """Shorten the planned run to its first `num_steps` steps (an arrival wants to be
        admitted at the next step boundary)."""
        self._run_end = self._run_start + num_steps
        self._run_cap = self.max_run_steps
        self._run_capped = False

    def _launch(self, plan: StepPlan) -> None:
        """The schedule-time effects of a planned step or run (vLLM
        `Scheduler._update_after_schedule`), applied once all its steps are allocated and
        before the next step is planned: prefill chunks count as computed; a prompt
        computed in its last step samples a token when that step ends and decodes from the
        next step on, unless that token is its last; a request whose last token the last
        step computes (a decode reaching its length, or such a prompt) retires: it leaves
        the decode batch but stays running, holding its blocks, until the step ends."""
        self._unlaunched = None
        end = plan.start_step + plan.num_steps
        if end > self._alloc_through:
            self._allocate_decode_steps(self._alloc_through, end)
        if self._grid_check is not None:
            self.num_outside_grid += self._grid_check(
                [(q, r.num_computed_tokens) for r, q in plan.chunks],
                plan.num_decodes, plan.decode_context, plan.num_steps,
            )
        if self._run_capped:
            self._run_capped = False
            if self._run_cap < _MAX_RUN_CAP:
                self._run_cap *= 2
        self._launched_through = end
        last_step = end - 1
        sampling = self._sampling
        for request, q in plan.chunks:
            if request.state is not _RUNNING or request.decoding:
                continue
            request.num_computed_tokens += q
            self._set_pending(request, request.pending_prefill - q)
            if request.num_computed_tokens == request.num_tokens_target:
                # A prefill (or recompute) completes: it samples a token at the step's end.
                self.prefilling.remove(request)
                self._nondec_tokens -= request.num_tokens_target
                if request.num_output_done + 1 >= request.output_tokens:
                    request.retiring = True
                    request.held_tokens = 0  # its prompt blocks were cached as computed
                    request.held_blocks = len(request.block_keys)
                else:
                    self._start_decoding(request, last_step - request.num_output_done)
                sampling.append(request)
        heap = self._finish_heap
        while heap and heap[0][0] <= last_step:
            finish_step, seq, request = heapq.heappop(heap)
            if request.decoding and request.admit_seq == seq and request.finish_step == finish_step:
                tokens = request.input_tokens + last_step - request.decode_base  # its KV through its last step
                request.held_tokens = tokens
                request.held_blocks = -(-tokens // self.block_size)
                self._stop_decoding(request, last_step - request.decode_base)
                request.retiring = True
                sampling.append(request)

    def commit(self, plan: StepPlan, now: float) -> StepOutcome:
        """The planned step or run ends at time `now`: its tokens are sampled (vLLM
        `Scheduler.update_from_output`), and requests that sampled their last token finish
        and release their blocks."""
        if plan is self._unlaunched:  # nothing was planned after it
            self._launch(plan)
        end = plan.start_step + plan.num_steps
        self.steps_done = end
        for request in plan.starved:
            request.starved_in_flight -= 1
        outcome = StepOutcome()
        sampling, self._sampling = self._sampling, []
        sampling.sort(key=_admit_seq)
        for request in sampling:
            request.num_output_done += 1
            if request.first_token_at is None:
                request.first_token_at = now
                outcome.first_tokens.append(request)
            if request.retiring:
                self._finish(request, now, outcome)
            elif request.state is _WAITING:
                self._sampled_while_waiting(request, now, outcome)
        return outcome

    def _sampled_while_waiting(self, request: Request, now: float, outcome: StepOutcome) -> None:
        """A request preempted after its token was scheduled gets that token anyway (vLLM
        appends a preempted request's in-flight output); its recompute grows by it, or it is
        done. Done, it finishes from the waiting queue and the connector hears of it like of
        any finish (vLLM `update_from_output` -> `_free_request` -> `_connector_finished`,
        for `stopped_preempted_reqs` too), though it holds no blocks: the preemption freed
        them, so a P/D prefill leg has no KV left to hand over (NixlConnector
        `request_finished`: `delay_free_blocks = len(block_ids) > 0`)."""
        self._nondec_tokens += 1
        if request.num_output_done < request.output_tokens:
            self._set_pending(request, request.num_tokens_target - self.hit_blocks(request) * self.block_size)
            return
        self.waiting.remove(request)
        self._nondec_tokens -= request.num_tokens_target
        self._set_pending(request, 0)
        if self.connector is not None and self.connector.hold_on_finish(self, request):
            self.held[request] = None
        request.state = _FINISHED
        request.finished_at = now
        outcome.finished.append(request)

    def _finish(self, request: Request, now: float, outcome: StepOutcome) -> None:
        self.running.remove(request)
        if self.connector is not None and self.connector.hold_on_finish(self, request):
            request.kv_held_extra = self._blocks_held(request) - len(request.block_keys)
            self.held[request] = None
        else:
            self._release(request)
        request.retiring = False
        request.state = _FINISHED
        request.finished_at = now
        outcome.finished.append(request)

    # -- decode bookkeeping --------------------------------------------------------------

    def _start_decoding(self, request: Request, base: int) -> None:
        """From now on the request's output count is `steps_done - base`."""
        request.decoding = True
        request.decode_base = base
        self._phase[(base + 1 - request.input_tokens) % self.block_size] += 1
        if request.num_shared_blocks > request.num_cached_blocks and self.enable_prefix_caching:
            self._fills[(base - request.input_tokens) % self.block_size][request] = None
        self.num_decoding += 1
        self._dec_sum_input += request.input_tokens
        self._dec_sum_base += base
        if self._longest is not None:
            self._longest.add(request.input_tokens - base)
        request.finish_step = request.output_tokens + base - 1
        heapq.heappush(self._finish_heap, (request.finish_step, request.admit_seq, request))

    def _stop_decoding(self, request: Request, outputs: int) -> None:
        base = request.decode_base
        request.num_output_done = outputs
        self._phase[(base + 1 - request.input_tokens) % self.block_size] -= 1
        self._fills[(base - request.input_tokens) % self.block_size].pop(request, None)
        self.num_decoding -= 1
        self._dec_sum_input -= request.input_tokens
        self._dec_sum_base -= base
        if self._longest is not None:
            self._longest.remove(request.input_tokens - base)
        request.decoding = False

    def _starve(self, request: Request) -> None:
        """A decode got no token this step: its output count and block phase shift by one."""
        base = request.decode_base
        self._stop_decoding(request, self.outputs_of(request))
        self._start_decoding(request, base + 1)
        request.starved_in_flight += 1

    def _peek_finish_step(self) -> int:
        heap = self._finish_heap
        while heap:
            finish_step, seq, request = heap[0]
            if request.decoding and request.admit_seq == seq and request.finish_step == finish_step:
                return finish_step
            heapq.heappop(heap)
        raise RuntimeError("decoding requests but no finish entry")

    def _blocks_held(self, request: Request) -> int:
        if request.decoding:
            tokens = request.input_tokens + self._alloc_through - 1 - request.decode_base
            return -(-tokens // self.block_size)
        if request.retiring:
            return request.held_blocks
        return len(request.block_keys)

    def _release(self, request: Request) -> None:
        if self.enable_prefix_caching:
            if request.decoding:
                self._cache_private_blocks(request, request.input_tokens + self._alloc_through - 1 - request.decode_base)
            elif request.retiring and request.held_tokens:
                self._cache_private_blocks(request, request.held_tokens)
        held = self._blocks_held(request)
        self.cache.release(request.block_keys, held - len(request.block_keys))
        request.block_keys = []
        request.num_cached_blocks = 0

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: free everything, back to the front of the waiting queue.
        A request whose token the step in flight is computing (steps planned ahead) still
        gets it when that step ends (`_sampled_while_waiting`)."""
        self.running.remove(request)
        if request.decoding:
            sampled = self.outputs_of(request)
            if self._launched_through - request.decode_base > sampled and request not in self._sampling:
                self._sampling.append(request)
            self._release(request)
            self._stop_decoding(request, sampled)
            self._nondec_tokens += request.num_tokens_target
        elif request.retiring:
            self._release(request)
            request.retiring = False
            self._nondec_tokens += request.num_tokens_target
        else:
            self.prefilling.remove(request)
            self._release(request)
        self._set_pending(request, 0)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        request.state = _WAITING
        # Back to the front of the queue, but behind requests whose loaded blocks wait there
        # (lmsim.engine.connector): they hold blocks, and a head that needs those blocks
        # would otherwise wait for them forever once nothing runs.
        ahead = 0
        if self.connector is not None:
            ahead = sum(1 for _ in takewhile(_is_loaded, self.waiting))
        if ahead:
            self.waiting.insert(ahead, request)
        else:
            self.waiting.appendleft(request)
        self._set_pending(request, request.num_tokens_target - self.hit_blocks(request) * self.block_size)

    def _set_pending(self, request: Request, value: int) -> None:
        self.pending_prefill_tokens += value - request.pending_prefill
        request.pending_prefill = value


_MAX_RUN_CAP = 4096  # pricing a longer run that an arrival cuts short would cost more than it saves
ADMISSION_RULES = ("first_chunk", "full_sequence", "whole_prompt_watermark")
# Enum members as module globals: a class attribute lookup on an Enum costs ~8x a global.
_WAITING, _RUNNING, _FINISHED = RequestState.WAITING, RequestState.RUNNING, RequestState.FINISHED


def _admit_seq(request: Request) -> int:
    return request.admit_seq


def _is_loaded(request: Request) -> bool:
    return request.kv_loaded
