"""llm-d: the simulation-based TTFT policy the paper describes, and llm-d's default weighted
scorers (policies.md §5)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from lmsim.engine.request import Request
from lmsim.policies._common import check_bool, check_number, listed_ids, pick_min
from lmsim.policies.base import POLICIES, ClusterView, Policy, RouterContext


class QueueState(Protocol):
    num_running: int
    num_prefilling: int
    decode_context_tokens: int

    def queued_prefills(self) -> list[tuple[int, int]]: ...


def estimate_ttft(
    state: QueueState,
    uncached_tokens: int,
    cached_tokens: int,
    cost_model: Any,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    in_flight: tuple[float, list[int]] | None = None,
    give_up_above: float = math.inf,
) -> float:
    """Seconds from now until the first token of a request with `uncached_tokens` to compute
    (`cached_tokens` already in KV) appended to the instance's waiting queue, replaying
    vLLM v1's step planning with `cost_model`:

    each step has a budget of `max_num_batched_tokens`; running decodes take one token each,
    then prefills in schedule order (`queued_prefills()`: partial prefills of running requests,
    then the waiting queue FCFS) take `min(remaining, budget left)`; a waiting request is
    admitted only while fewer than `max_num_seqs` run. A prefill that completes decodes from
    the next step on. The first token comes at the end of the step that computes the last
    prompt token. A one-token chunk is priced as a decode, as the cost model defines it.

    Exact for an idle instance. Simplifications (a router cannot know better):
      * no request finishes during the horizon (output lengths are unknown), so the decode
        batch only grows; each decode's context grows by one token per step;
      * `in_flight` = (seconds left, prompt tokens per queue entry) of the engine step running
        at decision time: the request cannot join it, so the simulation starts when it ends,
        from the state it leaves. Without it (`None`) the first simulated step starts now
        from the pre-step state, which lets the request join a step already under way and
        makes most predictions low;
      * running decodes are scheduled before running partial prefills (in vLLM they are
        interleaved in admission order; partial prefills are usually the newest);
      * no preemption, no KV-capacity limit on admission.
    Returns `inf` if the prefill can never progress (decodes alone exhaust the budget).
    With `give_up_above`, the replay stops at the first step that ends later than it and
    returns that time: enough to decide "TTFT <= limit" without replaying a long queue.
    """
    budget_max = max_num_batched_tokens
    decodes = state.num_running - state.num_prefilling
    dctx = state.decode_context_tokens
    running = state.num_running
    # [remaining, computed, admitted]
    queue = [[r, c, k < state.num_prefilling] for k, (r, c) in enumerate(state.queued_prefills())]
    target = [uncached_tokens, cached_tokens, False]
    elapsed = 0.0
    if in_flight is not None:
        elapsed, done_q = in_flight
        dctx += decodes  # the step's decodes each add a token
        still = []
        for item, q in zip(queue, done_q):
            item[0] -= q
            item[1] += q
            if item[0] <= 0:  # the step finishes this prompt: it decodes from the next one
                decodes += 1
                dctx += item[1] + 1
            else:
                still.append(item)
        queue = still + queue[len(done_q):]
    step_time = cost_model.step_time
    if not queue:
        alone = _alone_in_first_step(
            decodes, dctx, running, elapsed, uncached_tokens, cached_tokens, step_time,
            budget_max, max_num_seqs,
        )
        if alone is not None:
            return alone
    queue.append(target)
    while True:
        budget = budget_max
        nd = decodes if decodes <= budget else budget
        budget -= nd
        # Decodes left out by the budget do not attend this step; scale their context share.
        run_ctx = dctx if nd == decodes else (dctx * nd) // max(1, decodes)
        chunks: list[tuple[int, int]] = []
        ones = 0
        ones_ctx = 0
        for item in queue:
            if budget == 0:
                break
            if not item[2]:
                if running >= max_num_seqs:
                    break  # FCFS: nobody behind the blocked head is admitted
                item[2] = True
                running += 1
            q = item[0] if item[0] <= budget else budget
            budget -= q
            if q == 1:
                ones += 1
                ones_ctx += item[1] + 1
            else:
                chunks.append((q, item[1]))
            item[0] -= q
            item[1] += q
        if not chunks and not ones:
            return math.inf
        elapsed += step_time(chunks, nd + ones, run_ctx + ones_ctx)
        if target[0] == 0 or elapsed > give_up_above:
            return elapsed
        dctx += nd
        still = []
        for item in queue:
            if item[0] == 0:
                decodes += 1
                dctx += item[1] + 1  # the prompt is in KV; the next step attends it plus one
            else:
                still.append(item)
        queue = still


def _alone_in_first_step(
    decodes: int,
    dctx: int,
    running: int,
    elapsed: float,
    uncached_tokens: int,
    cached_tokens: int,
    step_time: Any,
    budget_max: int,
    max_num_seqs: int,
) -> float | None:
    """The replay's first step when the request is the only prefill left and fits in it (most
    decisions at moderate load): the loop's arithmetic without building its lists. None when
    the loop is needed."""
    nd = decodes if decodes <= budget_max else budget_max
    budget = budget_max - nd
    if budget == 0 or running >= max_num_seqs:
        return math.inf  # the request cannot be admitted: no prefill ever progresses
    if uncached_tokens <= 0 or uncached_tokens > budget:
        return None
    run_ctx = dctx if nd == decodes else (dctx * nd) // max(1, decodes)
    if uncached_tokens == 1:
        return elapsed + step_time([], nd + 1, run_ctx + cached_tokens + 1)
    return elapsed + step_time([(uncached_tokens, cached_tokens)], nd, run_ctx)


# llm-d as deployed: the estimate error that makes P(|error| > 20%) = 10%, the seed's Figure 16
# for its tuned simulator (|N(0, 0.12)| > 0.2 has probability 2·(1 − Φ(1.667)) = 0.096). The
# study's figures name llmd with it "llm-d (deployed)" and the exact estimator "llm-d (oracle)".
DEPLOYED_NOISE_REL = 0.12


@POLICIES.register("llmd")
class LlmdPredicted(Policy):
    """The paper's "simulation-based" llm-d (policies.md §5, paper §4.6): estimate each
    instance's TTFT for this request with lmsim's step-cost model (`estimate_ttft`: queue drain
    plus chunked prefill of the uncached tokens alongside the running decodes) and route to
    the lowest.

    Params:
      estimator_profile=None: the engine's own profile (a "well-tuned simulator"); or any
        profile spec (`"h20/qwen2-7b"`, a linear dict) for the paper's "untuned simulator".
      noise_rel=0.0 (>= 0): multiply each estimate by max(0, 1 + noise_rel·N(0, 1)), drawn
        per instance and decision, to mimic a deployed predictor's error. 0.12 is llm-d as
        deployed: it makes P(|error| > 20%) = 10%, the seed's Figure 16 for the tuned
        simulator (errors from API-server reordering and unmodelled effects, which no
        rescaled cost model produces). The exact estimator is the default so that "tuned
        vs untuned" isolates the cost model; the reduced reproduction runs both.
      record_predictions=True: log the chosen instance's prediction as a `ttft_prediction`
        router event (request_id, instance_id, predicted_ttft_s) for Figure 16.
      in_flight_step=True: start the estimate when the engine step running now ends, from
        the state it leaves (a request cannot join a step under way); False ignores it, the
        earlier lmsim estimator. Measured on ChatBot (1,500 requests at 0.6 of capacity,
        exact cost model): with it 0.7% of requests are mispredicted by more than 20% and
        47% are predicted low; without it 41% and 97%.
    Tie-break: seeded random among equal estimates.
    Each instance is priced with its own profile and engine limits (`InstanceView.cost_model`,
    `max_num_batched_tokens`, `max_num_seqs`), so in a mixed fleet a faster pool's instances
    predict lower TTFTs; `estimator_profile` prices every instance with one profile.
    Deviation: the real llm-d predicted-latency path uses an online XGBoost regressor, not a
    simulator; this is the paper's framing. The load fields read follow the router's
    `load_view` (exact or scraped).
    """

    default_reasons = {
        "in_flight_step": "a request cannot join a step under way; ignoring it mispredicted 41% "
        "of ChatBot requests by > 20% (0.7% with it)",
        "noise_rel": "exact estimator by default; 0.12 reproduces the seed's Fig. 16 (10% of "
        "requests > 20% error), llm-d as deployed",
    }

    def __init__(
        self,
        *,
        estimator_profile: str | dict | None = None,
        noise_rel: float = 0.0,
        record_predictions: bool = True,
        in_flight_step: bool = True,
    ) -> None:
        self.in_flight_step = check_bool("in_flight_step", in_flight_step)
        if estimator_profile is not None and not isinstance(estimator_profile, str | dict):
            raise ValueError(
                "param 'estimator_profile' must be a profile name or a mapping, "
                f"got {estimator_profile!r}"
            )
        self.estimator_profile = estimator_profile
        self.noise_rel = check_number("noise_rel", noise_rel, lo=0)
        self.record_predictions = check_bool("record_predictions", record_predictions)
        self._last: tuple[int, Sequence[int], list[float]] | None = None  # (request, listed ids, estimates)

    def bind(self, ctx: RouterContext) -> None:
        super().bind(ctx)
        # None: each instance is priced with its own profile (a mixed fleet's pools differ)
        self.cost_model: Any = (
            None if self.estimator_profile is None else ctx.load_cost_model(self.estimator_profile)
        )

    def predict(self, request: Request, cluster: ClusterView) -> list[float]:
        ctx = self.ctx
        cached = cluster.cached_prefix_tokens(request)
        fixed = self.cost_model
        isl = request.input_tokens
        use_step = self.in_flight_step
        est = [
            estimate_ttft(
                v, isl - c, c, fixed or v.cost_model, v.max_num_batched_tokens, v.max_num_seqs,
                v.step_in_flight() if use_step else None,
            )
            for v, c in zip(cluster.instances, cached)
        ]
        if self.noise_rel > 0:
            z = ctx.rng.standard_normal(len(est))
            est = [e * max(0.0, 1.0 + self.noise_rel * float(zi)) for e, zi in zip(est, z)]
        return est

    def choose(self, request: Request, cluster: ClusterView) -> int:
        est = self.predict(request, cluster)
        if self.record_predictions:
            self._last = (request.request_id, listed_ids(cluster, self.ctx.num_instances), est)
        return pick_min(est, "random", self.ctx.rng)

    def on_routed(self, request: Request, instance_id: int) -> None:
        last = self._last
        if last is None or last[0] != request.request_id or instance_id not in last[1]:
            return
        self.ctx.record_event(
            "ttft_prediction",
            request_id=request.request_id,
            instance_id=instance_id,
            predicted_ttft_s=last[2][last[1].index(instance_id)],
        )


@POLICIES.register("llmd_scorer")
class LlmdScorer(Policy):
    """llm-d / GIE EPP's built-in default: weighted scorers, max total wins (policies.md §5).

    `total_i = w_prefix·prefix_i + w_queue·queue_i + w_kv·(1 − kv_usage_i)` with
      * prefix_i = matched blocks / prompt blocks, both capped at `max_prefix_blocks`;
      * queue_i = (maxQ − Q_i)/(maxQ − minQ), all 1.0 when every Q is equal.
    Params: w_prefix=3, w_queue=2, w_kv=2 (all >= 0), max_prefix_blocks=256 (>= 1).
    Tie-break: seeded random among the maxima (llm-d shuffles, then sorts).
    The prefix hit follows the router's `kv_view` (llm-d's default prefix producer is the
    approximate index; its precise scorer is the events view); Q and KV usage follow
    `load_view` (llm-d scrapes them).

    Lower KV tiers: llm-d's precise index keeps each block's medium from the engine's KV
    events (`llm-d-kv-cache` `pkg/kvevents/pool.go`, lower-cased), and its
    `LongestPrefixScorer` sums, over the consecutive prefix, the best medium weight a pod
    holds each block in (`pkg/kvcache/kvblock_scorer.go::fillMaxWeights`; defaults `gpu` 1.0,
    `cpu` 0.8 in `pkg/kvcache/backend.go`, and 1.0 for a medium the config does not list,
    which is disk by default). So prefix_i = (GPU blocks + cpu_weight · host blocks +
    disk_weight · disk blocks), counted over the first `max_prefix_blocks` blocks, / total.
    lmsim's view gives the host run after the GPU prefix and the disk run after that; llm-d
    takes the best medium block by block, which differs only where a block missing from the
    GPU is followed by one it still holds (rare: vLLM evicts a prefix tail first).
    Params (with tiers): cpu_weight=0.8, disk_weight=1.0 (>= 0).

    lmsim's earlier, compact form of the EPP, kept as it was (the study's runs use it).
    `llmd_epp` is the EPP as llm-d configures and computes it: GIE's approximate index over
    prompt-text blocks in a per-server LRU, the precise scorer's min-max, the
    active-request scorer, and the EndpointPickerConfig's own plugin list and weights.
    """

    def __init__(
        self,
        *,
        w_prefix: float = 3.0,
        w_queue: float = 2.0,
        w_kv: float = 2.0,
        max_prefix_blocks: int = 256,
        cpu_weight: float = 0.8,
        disk_weight: float = 1.0,
    ) -> None:
        self.w_prefix = check_number("w_prefix", w_prefix, lo=0)
        self.w_queue = check_number("w_queue", w_queue, lo=0)
        self.w_kv = check_number("w_kv", w_kv, lo=0)
        self.max_blocks = check_number("max_prefix_blocks", max_prefix_blocks, lo=1, integer=True)
        self.cpu_weight = check_number("cpu_weight", cpu_weight, lo=0)
        self.disk_weight = check_number("disk_weight", disk_weight, lo=0)

    def _matched_blocks(self, request: Request, cluster: ClusterView, total: int) -> list[float]:
        """Weighted matched blocks per instance over the first `total` prompt blocks."""
        bsz = cluster.block_size
        if not getattr(cluster, "has_kv_tiers", False):
            return [min(c // bsz, total) for c in cluster.cached_prefix_tokens(request)]
        out = []
        for g, h, d in cluster.cached_prefix_tokens_by_tier(request):
            gb = min(g // bsz, total)
            hb = min(h // bsz, total - gb)
            db = min(d // bsz, total - gb - hb)
            out.append(gb + self.cpu_weight * hb + self.disk_weight * db)
        return out

    def choose(self, request: Request, cluster: ClusterView) -> int:
        inst = cluster.instances
        bsz = cluster.block_size
        total = min(self.max_blocks, max(1, request.input_tokens // bsz))
        matched = self._matched_blocks(request, cluster, total)
        qs = [v.num_waiting for v in inst]
        qmax, qmin = max(qs), min(qs)
        span = qmax - qmin
        wp, wq, wk = self.w_prefix, self.w_queue, self.w_kv
        neg = []
        for v, m, q in zip(inst, matched, qs):
            prefix = m / total
            queue = (qmax - q) / span if span else 1.0
            neg.append(-(wp * prefix + wq * queue + wk * (1.0 - v.kv_usage)))
        return pick_min(neg, "random", self.ctx.rng)
