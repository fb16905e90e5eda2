"""Linear-combination policies: Bailian (policies.md §2) and the Dynamo KV router (§3)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from lmsim.engine.request import Request
from lmsim.policies._common import (
    check_bool,
    check_choice,
    check_number,
    id_bound,
    listed_ids,
    pick_min,
)
from lmsim.policies.base import POLICIES, ClusterView, Policy, argmin_random


@POLICIES.register("bailian")
class Bailian(Policy):
    """Bailian's production score (policies.md §2):
    `score_i = λ·(1 − hit_i) + (1 − λ)·norm(BS_i)`, routed to the minimum, where
    `hit_i = cached_i / input_tokens` and `BS_i = R_i + Q_i`.

    Params:
      lambda=0.7: λ in [0, 1]; the paper's tuned ChatBot value (0.55 for API). The
        constructor spells it `lambda_` (a Python keyword); YAML and the registry say `lambda`.
        λ=1 is pure KV affinity; λ=0 is JSQ on R+Q.
      normalize="minmax": `(BS_i − min)/(max − min)` (0 when all equal); "max" is
        `BS_i / max_j BS_j` (0 when all are 0). The spec leaves it open; both were measured
        (experiments/paper/choices_bailian.yaml: λ = 0…1 at load 0.5, 3 seeds, ChatBot 1,000
        and Agent 4,000 requests). Min-max reproduces the seed's Figure 11 optimum, BS/max
        does not: with min-max the best λ is 0.4-0.5 on Agent (seed: 0.55 on API; mean TTFT
        179 ms at 0.5, flat 180-185 ms from 0 to 0.4, 225 ms at 0.7) and ChatBot is flat from
        0.1 to 0.6 (197-207 ms; best per seed 0.2-0.6; seed: 0.7); with BS/max both traces
        peak sharply at λ = 0.1 (ChatBot 192 ms, 250 ms at 0.7; Agent 179 ms, 294 at 0.7),
        because dividing by max keeps the load term near 1 on every busy instance, so any
        λ above ~0.2 lets the hit term dominate. The best mean TTFT is the same either way
        (Agent 179 vs 179 ms, ChatBot 197 vs 192 ms), so the choice moves λ, not the optimum.
      tie_break="random": seeded random among exact ties (spec); "first" = lowest id, which
        makes λ=0 route exactly like `vllm`.
    """

    def __init__(
        self, *, lambda_: float = 0.7, normalize: str = "minmax", tie_break: str = "random"
    ) -> None:
        self.lam = check_number("lambda", lambda_, lo=0, hi=1)
        self.normalize = check_choice("normalize", normalize, ("max", "minmax"))
        self.tie_break = check_choice("tie_break", tie_break, ("random", "first"))

    default_reasons = {
        "normalize": "min-max puts the best λ where the seed's Fig. 11 does (Agent 0.4-0.5 vs "
        "0.55); BS/max peaks at λ = 0.1 on both traces (choices_bailian, 3 seeds)",
    }

    def choose(self, request: Request, cluster: ClusterView) -> int:
        lam = self.lam
        cached = cluster.cached_prefix_tokens(request)
        bs = [v.batch_size for v in cluster.instances]
        hi = max(bs)
        if self.normalize == "max":
            lo, span = 0, hi
        else:
            lo = min(bs)
            span = hi - lo
        inv_len = 1.0 / max(1, request.input_tokens)
        inv_span = 1.0 / span if span > 0 else 0.0  # all equal: every instance normalises to 0
        scores = [
            lam * (1.0 - c * inv_len) + (1.0 - lam) * ((b - lo) * inv_span)
            for c, b in zip(cached, bs)
        ]
        return pick_min(scores, self.tie_break, self.ctx.rng)


class _Live:
    """Dynamo's record of one routed request: where, its uncached tokens, its blocks."""

    __slots__ = ("hashes", "instance_id", "prefill_tokens")

    def __init__(self, instance_id: int, prefill_tokens: int, hashes: list[int]) -> None:
        self.instance_id = instance_id
        self.prefill_tokens = prefill_tokens
        self.hashes = hashes


@POLICIES.register("dynamo")
class Dynamo(Policy):
    """NVIDIA Dynamo's KV router cost (policies.md §3a, defaults §3b):
    `logit_w = overlap_score_weight · (active_prefill_tokens_w + isl − overlap_w·B)/B
    + active_blocks_w + new_blocks_w(req)`, minimised.

    Checked against Dynamo 1.6.1 (`ai-dynamo-runtime`, its Rust selector and `KvRouterConfig`
    defaults): logit = prefill_load_scale · max(0, raw_prefill_blocks − overlap_score_credit ·
    device_overlap_blocks) + potential_decode_blocks + decode_active_request_weight ·
    active_requests, with raw_prefill_blocks = (active_prefill_tokens + isl)/B,
    potential_decode_blocks = the distinct complete blocks of the worker's live prompts plus
    this prompt's (partial tails are prefill work only), and defaults prefill_load_scale = 1
    (`overlap_score_weight` is its deprecated alias), overlap_score_credit = 1,
    decode_active_request_weight = 0, temperature 0; ties go to a uniformly random minimum
    (reservoir sampling over the workers). With those defaults it is the formula above.
    Parity (first 40 min of the Kimi conversation trace, 16 workers x 17,500 blocks of 16,
    8,192 batched tokens; token-weighted prefix hit; `benchmarks/against_dynamo.py
    --outputs`): Dynamo's offline replay 0.150 (round robin 0.054); lmsim `dynamo` 0.155 /
    0.160 / 0.151 over seeds 0-2 (mean 0.155; round robin 0.054) on `h100/qwen2-7b`, whose
    step times are close to Dynamo's mocker (mean TTFT 0.27 vs 0.24 s, TPOT 7.8 vs 8.5 ms).
    The hit ratio depends on load: on the slower `h20/qwen3-30b-a3b` profile the same trace
    gives 0.131 (seed 0), because longer-lived requests hold more active blocks and push
    requests away from their cache.

    Router-local state (exact at dispatch, as in Dynamo's `ActiveSequences`):
      * active_prefill_tokens_w: uncached prompt tokens of requests routed to w, released at
        their first token;
      * active_blocks_w: distinct block hashes held by live requests on w (shared prefixes
        count once); a request's blocks are its full-block hashes plus one unique block for a
        partial tail and for full blocks the trace leaves unhashed; released at completion.

    The overlap (cached blocks) comes from the cluster view, so `kv_view: events` reproduces
    Dynamo's default KV-event mode and `kv_view: approximate` with `approx_ttl_s: 120` its
    `--no-kv-events` mode. The engine caps a hit at `input − 1` tokens; Dynamo's indexer does
    not, which only matters when a whole prompt is cached.

    Lower KV tiers (KVBM; lmsim.engine.kv_tiers). Dynamo's KV events carry a storage tier
    (`StorageTier::{Device, HostPinned, Disk}`, from vLLM's `medium`), its indexer walks the
    prompt on the device, then continues on host memory, then on disk (`query_lower_tiers`),
    and the selector credits the continuation at lower weights
    (`lib/kv-router/src/scheduling/selector/default.rs`, `DefaultScorer::score`):
    logit = prefill_load_scale · max(0, raw_prefill_blocks − (device + host_cache_hit_weight ·
    host + disk_cache_hit_weight · disk)) + decode blocks, defaults 0.75 and 0.25
    (`KvRouterConfig`). A routed request's active prefill tokens are its prompt minus that
    weighted overlap rounded up to whole blocks (the mocker reports 1,392 device + 0.75 x
    2,704 host tokens as 3,424, peer_research.md §A.3). Dynamo's offline replay (the mocker)
    credits host blocks but never disk ones: `disk_cache_hit_weight: 0` reproduces it. With
    no tiers in the cluster nothing of this runs.

    Params:
      overlap_score_weight=1.0 (>= 0)
      temperature=0.0: 0 = greedy with uniformly random ties; > 0 samples w with
        P ∝ exp(−(logit − min)/((max − min)·T)), uniform if all logits are equal.
      track_active_blocks=True, track_prefill_tokens=True: Dynamo's
        `router_track_active_blocks` / `router_track_prefill_tokens`; off drops the term.
      overlap_score_credit=1.0 (>= 0): the weight of the cached blocks in the prefill term,
        `max(0, isl − credit·cached)`; 0 makes the router overlap-blind.
      assume_kv_reuse=True: a request's blocks shared with live requests on the worker count
        once (Dynamo `router_assume_kv_reuse`); False counts every request's blocks as its own.
      (Dynamo's disaggregated decode router sets credit 0, assume_kv_reuse false and
      track_prefill_tokens false: `build_decode_router_override` in its frontend. They are
      per-request overrides of one router's state: `overridden` applies them to one
      decision and its booking.)
      host_cache_hit_weight=0.75, disk_cache_hit_weight=0.25 (>= 0): credit per host / disk
        block continuing the device prefix.
    Not modelled: `router_queue_threshold` (off), replica sync.
    """

    def __init__(
        self,
        *,
        overlap_score_weight: float = 1.0,
        temperature: float = 0.0,
        track_active_blocks: bool = True,
        track_prefill_tokens: bool = True,
        overlap_score_credit: float = 1.0,
        assume_kv_reuse: bool = True,
        host_cache_hit_weight: float = 0.75,
        disk_cache_hit_weight: float = 0.25,
    ) -> None:
        self.w = check_number("overlap_score_weight", overlap_score_weight, lo=0)
        self.credit = check_number("overlap_score_credit", overlap_score_credit, lo=0)
        self.reuse = check_bool("assume_kv_reuse", assume_kv_reuse)
        self.host_w = check_number("host_cache_hit_weight", host_cache_hit_weight, lo=0)
        self.disk_w = check_number("disk_cache_hit_weight", disk_cache_hit_weight, lo=0)
        self.temperature = check_number("temperature", temperature, lo=0)
        self.track_blocks = check_bool("track_active_blocks", track_active_blocks)
        self.track_prefill = check_bool("track_prefill_tokens", track_prefill_tokens)
        # per worker, by instance id
        self.active_prefill: list[int] = []
        self.active_blocks: list[dict[int, int]] = []  # hash -> live refcount
        self.active_unique: list[int] = []  # blocks no other request can share
        self._live: dict[int, _Live] = {}
        # (request_id, the listed ids, the prefill tokens a booking there would add, by position)
        self._last: tuple[int, Sequence[int], list[int]] | None = None

    @contextmanager
    def overridden(
        self, *, overlap_score_credit: float | None = None, assume_kv_reuse: bool | None = None,
        track_prefill_tokens: bool | None = None,
    ) -> Iterator[None]:
        """Score and book inside the block with these settings, as Dynamo applies a
        request's `RouterConfigOverride` to one decision against the router's shared state
        (None keeps the policy's own)."""
        saved = self.credit, self.reuse, self.track_prefill
        if overlap_score_credit is not None:
            self.credit = overlap_score_credit
        if assume_kv_reuse is not None:
            self.reuse = assume_kv_reuse
        if track_prefill_tokens is not None:
            self.track_prefill = track_prefill_tokens
        try:
            yield
        finally:
            self.credit, self.reuse, self.track_prefill = saved

    def _ensure(self, n: int) -> None:
        while len(self.active_prefill) < n:
            self.active_prefill.append(0)
            self.active_blocks.append({})
            self.active_unique.append(0)

    @staticmethod
    def _shared_leading(active: dict[int, int], hashes: list[int]) -> int:
        """Leading request blocks already held by live sequences on the worker. The held set
        is prefix-closed (every live request holds all its leading blocks and hashes are
        chained), so a binary search suffices."""
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in active:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def choose(self, request: Request, cluster: ClusterView) -> int:
        return self._select(self.logits(request, cluster))

    def logits(self, request: Request, cluster: ClusterView) -> list[float]:
        """Dynamo's cost for `request` of each listed worker, by position (lower is better)."""
        ids = listed_ids(cluster, self.ctx.num_instances)
        self._ensure(id_bound(ids))
        bsz = cluster.block_size
        isl = request.input_tokens
        lower: list[float] | None = None
        if getattr(cluster, "has_kv_tiers", False):
            by_tier = cluster.cached_prefix_tokens_by_tier(request)
            cached = [g for g, _, _ in by_tier]
            lower = [self.host_w * h + self.disk_w * d for _, h, d in by_tier]  # credited tokens
            # active prefill counts the prompt minus the weighted overlap, in whole blocks
            routed = [min(isl, math.ceil((g + c) / bsz) * bsz) for g, c in zip(cached, lower)]
        else:
            cached = routed = cluster.cached_prefix_tokens(request)
        self._last = (request.request_id, ids, routed)
        hashes = request.block_hashes
        total_blocks = isl // bsz  # complete blocks: a partial tail is prefill work only
        w = self.w
        credit = self.credit
        logits = []
        for k, i in enumerate(ids):
            c = cached[k]
            new_tokens = max(0, isl - c) if credit == 1.0 else max(0.0, isl - credit * c)
            prefill = new_tokens + (self.active_prefill[i] if self.track_prefill else 0)
            if lower is not None:
                prefill = max(0.0, prefill - lower[k])
            logit = w * prefill / bsz
            if self.track_blocks:
                active = self.active_blocks[i]
                shared = self._shared_leading(active, hashes) if active and self.reuse else 0
                logit += len(active) + self.active_unique[i] + (total_blocks - shared)
            logits.append(logit)
        return logits

    def _select(self, logits: list[float]) -> int:
        rng = self.ctx.rng
        if self.temperature == 0:
            return argmin_random(logits, rng)
        lo, hi = min(logits), max(logits)
        if hi == lo:
            return int(rng.integers(len(logits)))
        scale = (hi - lo) * self.temperature
        weights = [math.exp(-(x - lo) / scale) for x in logits]
        total = sum(weights)
        u = rng.random() * total
        acc = 0.0
        for i, wt in enumerate(weights):
            acc += wt
            if u < acc:
                return i
        return len(weights) - 1

    def on_routed(self, request: Request, instance_id: int) -> None:
        self._ensure(instance_id + 1)
        cached = 0
        last = self._last
        if last is not None and last[0] == request.request_id and instance_id in last[1]:
            cached = last[2][last[1].index(instance_id)]
        # a request routed without prefill tracking adds nothing to its worker's prefill load
        prefill = max(0, request.input_tokens - cached) if self.track_prefill else 0
        # without KV reuse every block of the request is its own (nothing to share)
        hashes = list(request.block_hashes) if self.reuse else []
        active = self.active_blocks[instance_id]
        for h in hashes:
            active[h] = active.get(h, 0) + 1
        bsz = self.ctx.block_size
        unique = request.input_tokens // bsz - len(hashes)
        self.active_unique[instance_id] += unique
        self.active_prefill[instance_id] += prefill
        self._live[request.request_id] = _Live(instance_id, prefill, hashes)

    def on_first_token(self, request: Request) -> None:
        rec = self._live.get(request.request_id)
        if rec is not None and rec.prefill_tokens:
            self.active_prefill[rec.instance_id] -= rec.prefill_tokens
            rec.prefill_tokens = 0

    def on_finished(self, request: Request) -> None:
        rec = self._live.pop(request.request_id, None)
        if rec is None:
            return
        i = rec.instance_id
        self.active_prefill[i] -= rec.prefill_tokens
        active = self.active_blocks[i]
        for h in rec.hashes:
            left = active[h] - 1
            if left:
                active[h] = left
            else:
                del active[h]
        self.active_unique[i] -= request.input_tokens // self.ctx.block_size - len(rec.hashes)
