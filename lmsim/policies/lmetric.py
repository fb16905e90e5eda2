"""LMetric, the reproduced paper: route to the minimum of P-token × BS (policies.md §9), and
its KV$-hotspot detector (§9c, §9d)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmsim.engine.request import Request
from lmsim.policies._common import (
    InflightCounter,
    capped_blocks,
    check_bool,
    check_choice,
    check_number,
    listed_ids,
    pick_min,
)
from lmsim.policies.base import POLICIES, ClusterView, Policy


def lmetric_pick(
    p_tokens: Sequence[Any],
    batch_sizes: Sequence[Any],
    rng: np.random.Generator,
    tie_break: str = "random",
    start: int = 0,
) -> int:
    """argmin of `p_tokens[i] · batch_sizes[i]`. With ints (or Fractions) the products are
    exact, so rescaling every P by α > 0 or every BS by β > 0 scales every score by the same
    factor and changes neither the minimum nor the set of ties (hence not the seeded pick)."""
    return pick_min([p * b for p, b in zip(p_tokens, batch_sizes)], tie_break, rng, start)


def cached_and_tiers(
    request: Request, cluster: ClusterView
) -> tuple[list[int], list[tuple[int, int, int]] | None]:
    """GPU hits per instance, and (GPU, host, disk) per instance when the cluster has tiers."""
    if getattr(cluster, "has_kv_tiers", False):
        by_tier = cluster.cached_prefix_tokens_by_tier(request)
        return [g for g, _, _ in by_tier], by_tier
    return cluster.cached_prefix_tokens(request), None


def tier_credits(instances: Sequence[Any], by_tier: list[tuple[int, int, int]]) -> list[float]:
    """Per instance, the prefill tokens its lower-tier hit saves: T · (1 − f), with f the
    load time over the time computing the T tokens would take, 1 − f clamped to [0, 1]
    (see LMetric's docstring)."""
    out = []
    for v, (g, h, d) in zip(instances, by_tier):
        tier = h + d
        if not tier:
            out.append(0.0)
            continue
        q = min(tier, v.max_num_batched_tokens)
        per_token = v.cost_model.step_time([(q, g)], 0, 0) / q
        f = v.kv_load_time_s(h, d) / (tier * per_token)
        out.append(tier * min(1.0, max(0.0, 1.0 - f)))
    return out


@POLICIES.register("lmetric")
class LMetric(Policy):
    """LMetric (policies.md §9a): `score_i = P_token_i × BS_i`, routed to the minimum.

    Params (the paper leaves the exact definitions open; both ways of each were measured,
    experiments/paper/choices*.yaml, 3 seeds, numbers in the claims table of
    experiments/paper/README.md):
      p_token="instance_total": `pending_prefill_tokens_i + (input − cached_i)`, the new
        prefill tokens instance i would hold; "request": `input − cached_i` only. Request-only
        P-token ignores the prefill already queued, so it piles requests onto cached but busy
        instances: on ChatBot its mean TTFT is 43%, 80% and 100% above instance-total at
        loads 0.3, 0.6, 0.9 (0.18 vs 0.13 s at 0.3) for a 2-4 point higher hit ratio. The
        seed's "LMetric beats vLLM on TTFT" needs instance-total.
      bs_plus_one=True: BS_i = R_i + Q_i + 1 (as three of four third-party
        reimplementations do); False is R_i + Q_i. Without +1 every idle instance scores 0
        whatever its cache, so LMetric becomes join-idle whenever an instance is idle: on
        Coder at 0.5 (400 requests), where 7.3 of 16 instances are idle on average, hit
        ratio 0.22 instead of 0.51 and mean TTFT 17.4 s instead of 11.5 s (80 requests at
        0.6, 3 seeds: hit 0.13 vs 0.19, TTFT 19.2 vs 18.3 s). With +1 LMetric reproduces the
        seed's Figure 21 failure more clearly: during the hotspot burst its mean TPOT is
        +10% ± 7 vs vLLM (+6% ± 4 without +1), because the product keeps favouring the
        instances that hold the hot prefix; the detector brings both to a tie. On ChatBot,
        Agent and ToolAgent the two are within noise (few idle instances), and the
        real Kimi trace at 0.5 gives TTFT -35% / TPOT -28% vs vLLM with +1, -30% / -23%
        without.
      bs_source="engine": R_i + Q_i from the instance; "inflight": the router's own count of
        requests dispatched and not finished.
      tie_break="random": seeded uniform among equal scores; "rotate": first strict minimum
        scanning from a start index that advances by one per decision (vLLM-router style);
        "first": lowest instance id.
      load_indicator="batch_size": the load factor; "total_tokens" uses the instance's tokens
        in context instead (the seed's Figure 19 ablation).
      kv_indicator="p_token": the KV factor; "miss_ratio" uses 1 − cached_i / input_tokens
        instead (Figure 19).
    Scores are integer products by default, so the decision is exactly invariant to
    rescaling either factor (tested as a property).

    Lower KV tiers (lmsim.engine.kv_tiers; the paper has none). The P-token counts the
    prefill tokens instance i would compute; tokens found in its host memory or on disk
    (T_i = host_i + disk_i, continuing the GPU hit g_i) are not computed but loaded, which
    takes load_i seconds (`InstanceView.kv_load_time_s`: the host-to-GPU copy, after a disk
    read for disk tokens, on idle lanes). Priced in prefill tokens of the same duration,
    with t_pf,i the per-token time of computing them (the instance's own cost model: a chunk
    of min(T_i, max_num_batched_tokens) tokens at context g_i, step overhead included, per
    token), a tier token counts as f_i = load_i / (T_i · t_pf,i) of a prefill token, so
      P_i = pending_i + (isl − g_i) − T_i · (1 − f_i),
    with 1 − f_i clamped to [0, 1]: a load slower than recomputing is priced as a miss (the
    engine would still load it; the router then prefers it no more than an instance without
    the blocks). `request` P-token drops pending_i; `miss_ratio` is P_request / isl. Without
    tiers in the cluster the integer scores above are used unchanged.
    """

    def __init__(
        self,
        *,
        p_token: str = "instance_total",
        bs_plus_one: bool = True,
        bs_source: str = "engine",
        tie_break: str = "random",
        load_indicator: str = "batch_size",
        kv_indicator: str = "p_token",
    ) -> None:
        self.load_indicator = check_choice("load_indicator", load_indicator, ("batch_size", "total_tokens"))
        self.kv_indicator = check_choice("kv_indicator", kv_indicator, ("p_token", "miss_ratio"))
        self.p_token = check_choice("p_token", p_token, ("instance_total", "request"))
        self.bs_plus_one = check_bool("bs_plus_one", bs_plus_one)
        self.bs_source = check_choice("bs_source", bs_source, ("engine", "inflight"))
        self.tie_break = check_choice("tie_break", tie_break, ("random", "rotate", "first"))
        self.inflight = InflightCounter()
        self._start = 0

    default_reasons = {
        "bs_plus_one": "without +1 an idle instance scores 0 whatever its cache (join-idle): "
        "Coder hit 0.22 vs 0.51; +1 reproduces the Fig. 21 burst failure",
        "p_token": "request-only P-token ignores queued prefill: ChatBot mean TTFT +43% to "
        "+100% vs instance-total (3 seeds, loads 0.3-0.9)",
    }

    def factors(
        self, request: Request, cluster: ClusterView, cached: list[int],
        by_tier: list[tuple[int, int, int]] | None = None,
    ) -> tuple[list[int], list[int]]:
        inst = cluster.instances
        isl = request.input_tokens
        if by_tier is not None:
            saved = tier_credits(inst, by_tier)
            if self.kv_indicator == "miss_ratio":
                p = [1.0 - (c + t) / isl for c, t in zip(cached, saved)]
            elif self.p_token == "instance_total":
                p = [v.pending_prefill_tokens + isl - c - t for v, c, t in zip(inst, cached, saved)]
            else:
                p = [isl - c - t for c, t in zip(cached, saved)]
        elif self.kv_indicator == "miss_ratio":
            p = [1.0 - c / isl for c in cached]
        elif self.p_token == "instance_total":
            p = [v.pending_prefill_tokens + isl - c for v, c in zip(inst, cached)]
        else:
            p = [isl - c for c in cached]
        if self.load_indicator == "total_tokens":
            bs = [v.total_tokens for v in inst]
        elif self.bs_source == "engine":
            bs = [v.batch_size for v in inst]
        else:
            bs = self.inflight.of(listed_ids(cluster, self.ctx.num_instances))
        if self.bs_plus_one:
            bs = [b + 1 for b in bs]
        return p, bs

    def _pick(self, p: list[int], bs: list[int]) -> int:
        start = self._start
        if self.tie_break == "rotate":
            self._start = (start + 1) % len(p)
        return lmetric_pick(p, bs, self.ctx.rng, self.tie_break, start)

    def choose(self, request: Request, cluster: ClusterView) -> int:
        cached, by_tier = cached_and_tiers(request, cluster)
        p, bs = self.factors(request, cluster, cached, by_tier)
        return self._pick(p, bs)

    def on_routed(self, request: Request, instance_id: int) -> None:
        if self.bs_source == "inflight":
            self.inflight.routed(request, instance_id)

    def on_finished(self, request: Request) -> None:
        if self.bs_source == "inflight":
            self.inflight.finished(request)


@POLICIES.register("lmetric_hotspot")
class LMetricHotspot(LMetric):
    """LMetric plus the KV$-hotspot detector (policies.md §9c/§9d; reconstructed, unverified).

    Class of a request: `class_by="prefix"` (default) is its prefix at `prefix_depth_blocks`
    engine blocks (`block_hashes[d-1]`, or the last full block when shorter; prompts with no
    full block have no class); `class_by="class_id"` uses the trace's class id, falling back to
    the prefix when it is -1.

    Over a sliding `window_s` window the detector counts arrivals per class and the KV hit
    tokens they got; every `refresh_s` it re-selects the `top_k` classes with the most hit
    tokens, and only those are checked. For a request of a tracked class: x = class share of
    the window's arrivals (this one included), M = instances whose cache holds the class
    prefix (hit ≥ the prefix depth), M̄ the rest, both among the instances the router lists
    at that decision (the routable ones). Eq. 2 is violated when
    `x/(1 − x) > |M|/|M̄|` (compared as `count_c·|M̄| > |M|·(total − count_c)`, exact), and
    only if |M| ≥ 1, |M̄| ≥ 1, the window holds at least `min_window_requests` arrivals and
    the router has seen `warmup_s` of traffic (default: one full window; a cold start, where
    the first requests of every class are cached on one instance, is not a hotspot). While violated the
    class's requests are routed by the LMetric score over M̄ only.

    Every alarm onset is recorded as a `hotspot_alarm` router event (time, class_id, x,
    m = |M|, num_instances = |M| + |M̄|) and kept in `self.alarms`; its end as `hotspot_clear`. Every
    `log_interval_s` each tracked class is logged as a `hotspot_window` event (time,
    class_id, x, m, num_instances, count, total) so the two ratios can be plotted over time.

    Params: window_s=60 (> 0), class_by="prefix", prefix_depth_blocks=8 (>= 1; 128 tokens,
      about a system prompt), top_k=8 (>= 1), refresh_s=1.0 (> 0), min_window_requests=20
      (>= 1), log_interval_s=60 (> 0), warmup_s=None (= window_s; >= 0), plus every
      `lmetric` param.
    """

    def __init__(
        self,
        *,
        window_s: float = 60.0,
        class_by: str = "prefix",
        prefix_depth_blocks: int = 8,
        top_k: int = 8,
        refresh_s: float = 1.0,
        min_window_requests: int = 20,
        log_interval_s: float = 60.0,
        warmup_s: float | None = None,
        p_token: str = "instance_total",
        bs_plus_one: bool = True,
        bs_source: str = "engine",
        tie_break: str = "random",
        load_indicator: str = "batch_size",
        kv_indicator: str = "p_token",
    ) -> None:
        super().__init__(
            p_token=p_token, bs_plus_one=bs_plus_one, bs_source=bs_source, tie_break=tie_break,
            load_indicator=load_indicator, kv_indicator=kv_indicator,
        )
        self.log_interval_s = check_number("log_interval_s", log_interval_s, lo=0, lo_open=True)
        self._first_seen: float | None = None
        self._next_log = 0.0
        self._last_request: dict[int, Request] = {}
        self.window_s = check_number("window_s", window_s, lo=0, lo_open=True)
        self.warmup_s = self.window_s if warmup_s is None else check_number("warmup_s", warmup_s, lo=0)
        self.class_by = check_choice("class_by", class_by, ("prefix", "class_id"))
        self.depth = check_number("prefix_depth_blocks", prefix_depth_blocks, lo=1, integer=True)
        self.top_k = check_number("top_k", top_k, lo=1, integer=True)
        self.refresh_s = check_number("refresh_s", refresh_s, lo=0, lo_open=True)
        self.min_requests = check_number(
            "min_window_requests", min_window_requests, lo=1, integer=True
        )
        self._window: deque[tuple[float, int | None, int]] = deque()  # (t, class, hit tokens)
        self.counts: dict[int, int] = {}
        self.hits: dict[int, int] = {}
        self.tracked: set[int] = set()
        self._next_refresh = 0.0
        self.alarmed: set[int] = set()
        self.alarms: list[dict[str, Any]] = []
        self.filtered_decisions = 0

    def request_class(self, request: Request) -> int | None:
        if self.class_by == "class_id" and request.class_id >= 0:
            return request.class_id
        hashes = request.block_hashes
        if not hashes:
            return None
        return hashes[min(self.depth, len(hashes)) - 1]

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        window, counts, hits = self._window, self.counts, self.hits
        while window and window[0][0] <= horizon:
            _, c, h = window.popleft()
            if c is None:
                continue
            left = counts[c] - 1
            if left:
                counts[c] = left
                hits[c] -= h
            else:
                del counts[c]
                del hits[c]

    def _refresh(self, now: float) -> None:
        if now < self._next_refresh:
            return
        self._next_refresh = now + self.refresh_s
        ranked = sorted((h, c) for c, h in self.hits.items() if h > 0)
        self.tracked = {c for _, c in ranked[-self.top_k :]}
        for cls in sorted(self.alarmed - self.tracked):
            # A class that drops out of the top K is no longer watched: end its alarm.
            self.alarmed.discard(cls)
            self.ctx.record_event(
                "hotspot_clear", time=now, class_id=cls, x=None, m=None, num_instances=None
            )

    def choose(self, request: Request, cluster: ClusterView) -> int:
        now = cluster.now
        if self._first_seen is None:
            self._first_seen = now
        cached, by_tier = cached_and_tiers(request, cluster)
        p, bs = self.factors(request, cluster, cached, by_tier)
        cls = self.request_class(request)
        self._expire(now)
        self._refresh(now)
        if now >= self._next_log:
            self._log_windows(now, cluster)
        total = len(self._window) + 1
        allowed: list[int] | None = None
        if cls is not None and cls in self.tracked:
            bsz = cluster.block_size
            need = min(self.depth, len(request.block_hashes), capped_blocks(request, bsz)) * bsz
            n = len(cached)
            members = [i for i in range(n) if cached[i] >= need and need > 0]
            m = len(members)
            mbar = n - m
            count = self.counts.get(cls, 0) + 1
            violated = (
                total >= self.min_requests and now - self._first_seen >= self.warmup_s
                and m >= 1 and mbar >= 1
                and count * mbar > m * (total - count)
            )
            if violated:
                if cls not in self.alarmed:
                    self.alarmed.add(cls)
                    alarm = {"time": now, "class_id": cls, "x": count / total, "m": m,
                             "num_instances": n}
                    self.alarms.append(alarm)
                    self.ctx.record_event("hotspot_alarm", **alarm)
                in_m = set(members)
                allowed = [i for i in range(n) if i not in in_m]
                self.filtered_decisions += 1
            elif cls in self.alarmed:
                self.alarmed.discard(cls)
                self.ctx.record_event(
                    "hotspot_clear", time=now, class_id=cls, x=count / total, m=m,
                    num_instances=n,
                )
        if allowed is None:
            choice = self._pick(p, bs)
        else:
            sub = self._pick([p[i] for i in allowed], [bs[i] for i in allowed])
            choice = allowed[sub]
        self._window.append((now, cls, cached[choice]))
        if cls is not None:
            self.counts[cls] = self.counts.get(cls, 0) + 1
            self.hits[cls] = self.hits.get(cls, 0) + cached[choice]
            self._last_request[cls] = request
        return choice

    def _log_windows(self, now: float, cluster: ClusterView) -> None:
        """Record x and |M| of every tracked class (its M from its latest request's prefix)."""
        self._next_log = now + self.log_interval_s
        total = len(self._window)
        if not total:
            return
        bsz = cluster.block_size
        for cls in sorted(self.tracked):
            last = self._last_request.get(cls)
            if last is None:
                continue
            need = min(self.depth, len(last.block_hashes), capped_blocks(last, bsz)) * bsz
            cached = cluster.cached_prefix_tokens(last)
            m = sum(1 for c in cached if c >= need and need > 0)
            count = self.counts.get(cls, 0)
            self.ctx.record_event(
                "hotspot_window", time=now, class_id=cls, x=count / total, m=m,
                num_instances=len(cached), count=count, total=total,
            )
        # Forget requests of classes that left the window so memory stays bounded.
        for cls in [c for c in self._last_request if c not in self.counts]:
            del self._last_request[cls]
