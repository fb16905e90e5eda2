"""Multi-turn chat generators: `chatbot` (Qwen trace A stand-in) and `hotspot` (a thinking
workload with a shared-prefix burst, the seed paper's Figure 21 failure case).

Sources (paths relative to `../shared`): `docs/traces.md` §3.4 ("Qwen Bailian traces")
for trace A's published/third-party statistics, §3.4 "Thinking" row for the hotspot's
background, and the seed paper (`seed/000_11428ae48a3bab77.txt`, "Analysis: when
multiplication fails") for the burst.
"""

from __future__ import annotations

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.generators.base import (
    Plan,
    build_trace,
    horizon,
    lengths_from_targets,
    poisson_times,
    stratified_lognormal,
    zipf_weights,
)
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.trace import Trace


def _session_cumsum(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sum of x restarting at every row where `first` is True."""
    c = np.cumsum(x)
    start_idx = np.maximum.accumulate(np.where(first, np.arange(len(x)), 0))
    before = np.concatenate(([0], c))[start_idx]
    return c - before


@GENERATORS.register("chatbot")
class ChatbotGenerator:
    """Multi-turn chat sessions. A session picks one of `num_system_prompts` system prompts
    (Zipf popularity); turn 1 sends prompt + user message; turn t+1 re-sends turn t's input
    and output plus a new user message. Turn t+1's ids begin with turn t's full prompt
    blocks and go on with fresh ids from there: those name turn t's output blocks (and the
    block where its prompt ends), so the engine caches turn t's answer under the ids turn
    t+1 looks up (`lmsim.workload.trace.continuation_rows`, by `parent_id`).

    Defaults reproduce Qwen trace A (traces.md §3.4, third-party table): 5.98 req/s, input
    mean/p50/p99 2,331 / 1,046 / 14,359, output 430 / 375 / 1,641, 46.3 % follow-up turns,
    ideal prefix hit 0.579 (the paper: about 0.62). The user-message and system-prompt
    sizes are not published; they were fitted (by running `lmsim trace stats` on the
    output) so that the accumulated contexts hit the input and hit-ratio targets.
    """

    def __init__(
        self,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        rate: float = 5.98,  # §3.4 trace A: 43,058 requests in 2 h
        followup_prob: float = 0.463,  # §3.4 trace A: 46.3 % follow-up turns
        num_system_prompts: int = 40,  # fitted: cross-session share of hits 0.29 (§3.4)
        system_prompt_zipf: float = 1.1,  # fitted, "skewed popularity" (issue 4)
        system_prompt_median: float = 600.0,  # fitted
        system_prompt_sigma: float = 0.3,  # fitted
        user_first_median: float = 30.0,  # fitted to input p50 1,046
        user_first_sigma: float = 2.0,  # fitted to input p99 14,359
        user_next_median: float = 40.0,  # fitted to the hit ratio 0.579
        user_next_sigma: float = 1.6,  # fitted
        attachment_prob: float = 0.12,  # fitted; §3.4 trace A has 7.3 % image/file requests
        attachment_median: float = 6500.0,  # fitted to input mean 2,331
        attachment_sigma: float = 0.5,  # fitted
        output_mean: float = 430.0,  # §3.4 trace A
        output_p50: float = 375.0,  # §3.4 trace A
        output_p99: float = 1641.0,  # §3.4 trace A
        max_output_tokens: int = 8192,
        turn_gap_median_s: float = 90.0,  # §3.4: 80 % of trace-A reuses within 10 min
        turn_gap_sigma: float = 1.2,
        max_input_tokens: int = 131072,  # a session ends before exceeding the model context
        block_size: int = 16,  # Qwen traces use 16-token blocks (§3.4)
        warmup_s: float = 3600.0,  # sessions started before t=0 so follow-ups are in steady state
    ) -> None:
        if not 0 <= followup_prob < 1:
            raise ConfigError(f"followup_prob must be in [0, 1), got {followup_prob}")
        self.p = dict(locals())
        del self.p["self"]

    def plan(self, rng: np.random.Generator) -> tuple[Plan, float]:
        p = self.p
        h = horizon(p["num_requests"], p["duration_s"], p["rate"])
        bs = p["block_size"]
        starts = poisson_times(rng, p["rate"] * (1 - p["followup_prob"]), -p["warmup_s"], h)
        ns = len(starts)
        turns = rng.geometric(1 - p["followup_prob"], ns)
        n = int(turns.sum())
        sess = np.repeat(np.arange(ns), turns)
        first = np.zeros(n, dtype=bool)
        first[np.concatenate(([0], np.cumsum(turns)[:-1]))] = True

        k = p["num_system_prompts"]
        prompt_len = stratified_lognormal(k, p["system_prompt_median"], p["system_prompt_sigma"])
        prompt_blocks = prompt_len // bs
        prompt_base = np.concatenate(([0], np.cumsum(prompt_blocks)[:-1]))
        prompt_of = rng.choice(k, size=ns, p=zipf_weights(k, p["system_prompt_zipf"]))

        u_first = np.rint(p["user_first_median"] * np.exp(p["user_first_sigma"] * rng.standard_normal(n)))
        u_next = np.rint(p["user_next_median"] * np.exp(p["user_next_sigma"] * rng.standard_normal(n)))
        # a session that opens with a file or image carries it in every later turn
        attach = (rng.random(ns) < p["attachment_prob"]) * np.rint(
            p["attachment_median"] * np.exp(p["attachment_sigma"] * rng.standard_normal(ns))
        )
        u_first = u_first + attach[sess]
        user = np.maximum(np.where(first, u_first, u_next), 1).astype(np.int64)
        out = lengths_from_targets(
            rng, p["output_mean"], p["output_p50"], p["output_p99"], n, hi=p["max_output_tokens"]
        )
        # input_t = prompt + users_1..t + outputs_1..t-1
        prev_out = np.where(first, 0, np.concatenate(([0], out[:-1])))
        inp = prompt_len[prompt_of][sess] + _session_cumsum(user + prev_out, first)
        prev_in = np.concatenate(([0], inp[:-1]))
        keep = np.where(first, prompt_blocks[prompt_of][sess], prev_in // bs)

        gaps = p["turn_gap_median_s"] * np.exp(p["turn_gap_sigma"] * rng.standard_normal(n))
        arrival = starts[sess] + _session_cumsum(np.where(first, 0.0, gaps), first)
        parent = np.where(first, -1, np.arange(n) - 1)

        # a session stops at its first turn over the context limit
        over = inp > p["max_input_tokens"]
        dead = _session_cumsum(over.astype(np.int64), first) > 0
        ok = np.flatnonzero(~dead)
        remap = np.full(n, -1, dtype=np.int64)
        remap[ok] = np.arange(len(ok))
        plan = Plan(
            arrival=arrival[ok], input_tokens=inp[ok], output_tokens=out[ok],
            chain=sess[ok], keep=keep[ok],
            chain_prefix_base=prompt_base[prompt_of], chain_prefix_blocks=prompt_blocks[prompt_of],
            session=sess[ok], parent=np.where(parent[ok] >= 0, remap[np.maximum(parent[ok], 0)], -1),
            first_fresh_id=int(prompt_blocks.sum()),
        )  # fmt: skip
        return plan, h

    def generate(self, rng: np.random.Generator) -> Trace:
        plan, h = self.plan(rng)
        p = self.p
        return build_trace(
            plan, block_size=p["block_size"], start_s=0.0,
            end_s=h if p["num_requests"] is None else None,
            num_requests=p["num_requests"], source="generator:chatbot",
        )  # fmt: skip


@GENERATORS.register("hotspot")
class HotspotGenerator:
    """Background thinking traffic plus a burst of long requests that share one common
    prefix, starting at `burst_start_min` (the seed paper's Figure 21: "a thinking workload
    with bursts of long requests sharing a common prefix, visible around minute 11").

    Background defaults follow the Qwen "Thinking" trace (traces.md §3.4, third-party):
    1.50 req/s, input 4,763 / 3,680 / 24,962, output 3,651 / 1,665 / 34,529 (capped at
    32K here), 11.1 % follow-up turns, ideal hit 0.462. The burst's size is not published:
    the defaults (3 req/s for 4 min, a 12K-token shared prefix) make the burst class
    carry most of the load while it lasts, which is what the failure case needs.
    Burst rows have `class_id` 1; background rows -1.
    """

    def __init__(
        self,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        rate: float = 1.5,  # background, §3.4 thinking: 10,812 requests in 2 h
        followup_prob: float = 0.111,  # §3.4 thinking
        output_mean: float = 3651.0,  # §3.4 thinking
        output_p50: float = 1665.0,
        output_p99: float = 34529.0,
        max_output_tokens: int = 32768,
        user_first_median: float = 2600.0,  # fitted to input p50 3,680
        user_first_sigma: float = 1.05,  # fitted to input p99 24,962
        system_prompt_median: float = 800.0,  # fitted to the hit ratio 0.462
        num_system_prompts: int = 20,
        burst_start_min: float = 11.0,  # seed paper, Figure 21 (a)
        burst_duration_s: float = 240.0,
        burst_rate: float = 3.0,
        burst_prefix_tokens: int = 12000,
        burst_suffix_median: float = 1500.0,
        burst_output_median: float = 1665.0,  # a thinking request, like the background
        block_size: int = 16,
    ) -> None:
        self.p = dict(locals())
        del self.p["self"]

    def generate(self, rng: np.random.Generator) -> Trace:
        p = self.p
        h = horizon(p["num_requests"], p["duration_s"], p["rate"] + 1e-9)
        bg_rng, burst_rng = rng.spawn(2)
        bg = ChatbotGenerator(
            duration_s=h, rate=p["rate"], followup_prob=p["followup_prob"],
            num_system_prompts=p["num_system_prompts"], system_prompt_median=p["system_prompt_median"],
            user_first_median=p["user_first_median"], user_first_sigma=p["user_first_sigma"],
            user_next_median=p["user_first_median"] / 4, user_next_sigma=p["user_first_sigma"],
            output_mean=p["output_mean"], output_p50=p["output_p50"], output_p99=p["output_p99"],
            max_output_tokens=p["max_output_tokens"], block_size=p["block_size"],
        )  # fmt: skip
        plan, _ = bg.plan(bg_rng)
        bs = p["block_size"]
        t0 = p["burst_start_min"] * 60.0
        bt = poisson_times(burst_rng, p["burst_rate"], t0, t0 + p["burst_duration_s"])
        nb = len(bt)
        suffix = np.maximum(
            np.rint(p["burst_suffix_median"] * np.exp(0.6 * burst_rng.standard_normal(nb))), 1
        ).astype(np.int64)
        bout = np.clip(
            np.rint(p["burst_output_median"] * np.exp(0.8 * burst_rng.standard_normal(nb))),
            1, p["max_output_tokens"],
        ).astype(np.int64)
        prefix_blocks = p["burst_prefix_tokens"] // bs
        nchains = int(plan.chain.max()) + 1 if len(plan.chain) else 0
        prefix_base = plan.first_fresh_id
        m = len(plan.arrival)
        merged = Plan(
            arrival=np.concatenate((plan.arrival, bt)),
            input_tokens=np.concatenate((plan.input_tokens, p["burst_prefix_tokens"] + suffix)),
            output_tokens=np.concatenate((plan.output_tokens, bout)),
            chain=np.concatenate((plan.chain, nchains + np.arange(nb))),
            keep=np.concatenate((plan.keep, np.full(nb, prefix_blocks))),
            chain_prefix_base=np.concatenate((plan.chain_prefix_base, np.full(nb, prefix_base))),
            chain_prefix_blocks=np.concatenate((plan.chain_prefix_blocks, np.full(nb, prefix_blocks))),
            session=np.concatenate((plan.session, nchains + np.arange(nb))),
            parent=np.concatenate((plan.parent, np.full(nb, -1))),
            class_id=np.concatenate((np.full(m, -1), np.ones(nb, dtype=np.int64))),
            first_fresh_id=prefix_base + prefix_blocks,
        )  # fmt: skip
        return build_trace(
            merged, block_size=bs, start_s=0.0,
            end_s=h if p["num_requests"] is None else None,
            num_requests=p["num_requests"], source="generator:hotspot",
        )  # fmt: skip
