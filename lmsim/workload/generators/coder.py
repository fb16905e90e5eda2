"""The `coder` generator: closed-loop agentic coding sessions (traces.md §5.2, preset A),
calibrated on the WEKA Claude Code sessions (§3.5) and TraceLab (§3.7).

A session is a chain of steps: a user turn followed by tool-driven steps, again and again.
Each step re-sends the previous input and output plus an append, so every complete block
of the previous step is reused; all sessions of a client variant share its tools+system
prefix. Steps are closed-loop: row i has `after_id` = the session's previous step and
`delay_s` = the think time, and `arrival_s` is only an open-loop estimate (previous
arrival + a rough service time + the delay) used to order rows.

Left out of §5.2: sub-agents (item 9) and the optional repo/group layer (item 2); the
Azure-code per-minute modulation (item 1) is not applied (arrivals are Poisson).
"""

from __future__ import annotations

import math

import numpy as np

from lmsim.workload.generators.base import (
    Z90,
    Plan,
    build_trace,
    exp,
    horizon,
    poisson_times,
    zipf_weights,
)
from lmsim.workload.generators.chat import _session_cumsum
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.trace import Trace

# WEKA tools+system prefix per session, p10 / p50 / p90 tokens (§3.5)
_SYS_QUANTILES = ((0.1, 11898.0), (0.5, 14948.0), (0.9, 15930.0))


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int) -> np.ndarray:
    return median * exp(sigma * rng.standard_normal(size))


def _sigma_from_p90(median: float, p90: float) -> float:
    return math.log(p90 / median) / Z90


@GENERATORS.register("coder")
class CoderGenerator:
    """Agentic coding sessions (traces.md §5.2). Parameters and their sources:

    - `rate` 5.97 req/s: the Qwen Coder trace's rate (§3.4); the WEKA data has no absolute
      time. Session arrivals are Poisson at rate / (mean steps per session).
    - `num_variants` 3 with Zipf `variant_zipf` 1.0 and a tools+system prefix per variant
      drawn from the WEKA p10/p50/p90 (§5.2 item 2, §3.5).
    - Initial context beyond the prefix: lognormal median 7,214, sigma 1.26 (WEKA p10 1,438 /
      p50 7,214); `resume_prob` 0.1 of sessions start at 100K+ (§5.2 item 3).
    - User turns U = 1 + lognormal(median 3, p90 25) (WEKA: median 4, p90 26); tool steps
      per user turn geometric with mean 5.8, truncated at 80 (§5.2 item 4, §3.5).
    - Tool append: lognormal median 646, sigma 1.3 (WEKA growth p10/p50/p90/p99), plus a 3 %
      chance of a 10-60K tool result (TraceLab); user-turn append lognormal median 200,
      sigma 1.0 (not published: "a smaller text delta", §5.2 item 5).
    - Output: lognormal median 216, sigma 1.1, cap 16K (WEKA, §5.2 item 6).
    - Think times: tool steps median 9 s / p90 74 s; user turns 127 s / 1,540 s (WEKA).
    - Context cap `max_context_tokens` 128K (lmsim's cluster model) and a 0.009 per-step
      compaction chance (WEKA shrink rate): the context restarts at prefix + a summary
      (lognormal median 10K) under fresh ids (§5.2 item 8).
    - Open-loop estimate of a step's service time: 0.5 s + 20 ms per output token + input /
      20K tokens per s (order of WEKA's api_time p50 6.1 s); only used to order rows.
    """

    version = 2  # 2: C-library exp, microsecond time grid (bit-identical across numpy)

    def __init__(
        self,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        rate: float = 5.97,
        num_variants: int = 3,
        variant_zipf: float = 1.0,
        initial_context_median: float = 7214.0,
        initial_context_sigma: float = 1.26,
        resume_prob: float = 0.1,
        resume_min_tokens: int = 100_000,
        user_turns_median: float = 3.0,
        user_turns_p90: float = 25.0,
        tool_steps_mean: float = 5.8,
        tool_steps_max: int = 80,
        tool_append_median: float = 646.0,
        tool_append_sigma: float = 1.3,
        large_result_prob: float = 0.03,
        large_result_min: int = 10_000,
        large_result_max: int = 60_000,
        user_append_median: float = 200.0,
        user_append_sigma: float = 1.0,
        output_median: float = 216.0,
        output_sigma: float = 1.1,
        max_output_tokens: int = 16384,
        tool_think_median_s: float = 9.0,
        tool_think_p90_s: float = 74.0,
        user_think_median_s: float = 127.0,
        user_think_p90_s: float = 1540.0,
        max_context_tokens: int = 131072,
        compaction_prob: float = 0.009,
        summary_median: float = 10_000.0,
        block_size: int = 16,
        warmup_s: float = 8 * 3600.0,  # WEKA session duration p90 6.7 h (§3.5): steady state
    ) -> None:
        self.p = dict(locals())
        del self.p["self"]

    def _structure(self, rng: np.random.Generator, ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Per session: user turns; per user turn: tool steps."""
        p = self.p
        sig = _sigma_from_p90(p["user_turns_median"], p["user_turns_p90"])
        users = 1 + np.floor(_lognormal(rng, p["user_turns_median"], sig, ns)).astype(np.int64)
        users = np.minimum(users, 200)
        tools = rng.geometric(1.0 / (1.0 + p["tool_steps_mean"]), int(users.sum())) - 1
        return users, np.minimum(tools, p["tool_steps_max"])

    def generate(self, rng: np.random.Generator) -> Trace:
        p = self.p
        h = horizon(p["num_requests"], p["duration_s"], p["rate"])
        pilot_rng, main_rng = rng.spawn(2)
        u, s = self._structure(pilot_rng, 20_000)
        session_rate = p["rate"] / ((u.sum() + s.sum()) / len(u))
        # Sessions are heavy-tailed in duration, so the steps landing in the window fall
        # short of the pilot's mean; one corrective pass (same random stream) fixes the rate.
        plan = self._plan(np.random.default_rng(main_rng.bit_generator.seed_seq), session_rate, h)
        in_window = int(((plan.arrival >= 0) & (plan.arrival < h)).sum())
        if in_window:
            session_rate *= p["rate"] * h / in_window
            plan = self._plan(np.random.default_rng(main_rng.bit_generator.seed_seq), session_rate, h)
        trace = build_trace(
            plan, block_size=p["block_size"], start_s=0.0,
            end_s=h if p["num_requests"] is None else None,
            num_requests=p["num_requests"], source="generator:coder",
        )  # fmt: skip
        trace.meta.update(plan.meta)
        return trace

    def _plan(self, rng: np.random.Generator, session_rate: float, h: float) -> Plan:
        p = self.p
        bs = p["block_size"]
        starts = poisson_times(rng, session_rate, -p["warmup_s"], h)
        ns = len(starts)
        users, tools = self._structure(rng, ns)
        # steps: for each user turn, 1 user step + its tool steps
        turn_len = 1 + tools
        turn_sess = np.repeat(np.arange(ns), users)
        n = int(turn_len.sum())
        sess = np.repeat(turn_sess, turn_len)
        is_user = np.zeros(n, dtype=bool)
        is_user[np.concatenate(([0], np.cumsum(turn_len)[:-1]))] = True
        per_session = np.bincount(turn_sess, weights=turn_len, minlength=ns).astype(np.int64)
        first = np.zeros(n, dtype=bool)
        first[np.concatenate(([0], np.cumsum(per_session)[:-1]))] = True

        # client variants and their shared prefixes
        k = p["num_variants"]
        qs, vs = zip(*_SYS_QUANTILES, strict=True)
        sys_len = np.rint(np.interp(rng.uniform(0.1, 0.9, k), qs, vs)).astype(np.int64)
        sys_blocks = sys_len // bs
        sys_base = np.concatenate(([0], np.cumsum(sys_blocks)[:-1]))
        variant = rng.choice(k, size=ns, p=zipf_weights(k, p["variant_zipf"]))
        cmax = p["max_context_tokens"]

        init = _lognormal(rng, p["initial_context_median"], p["initial_context_sigma"], ns)
        resumed = rng.random(ns) < p["resume_prob"]
        init = np.where(resumed, rng.uniform(p["resume_min_tokens"], max(p["resume_min_tokens"], 0.9 * cmax) + 1, ns), init)
        init = np.clip(np.rint(init), 1, cmax - sys_len[variant] - 1).astype(np.int64)

        delta = np.where(
            is_user,
            _lognormal(rng, p["user_append_median"], p["user_append_sigma"], n),
            _lognormal(rng, p["tool_append_median"], p["tool_append_sigma"], n),
        )
        large = (~is_user) & (rng.random(n) < p["large_result_prob"])
        delta = np.where(large, rng.uniform(p["large_result_min"], p["large_result_max"], n), delta)
        delta = np.maximum(np.rint(delta), 1).astype(np.int64)
        out = np.clip(np.rint(_lognormal(rng, p["output_median"], p["output_sigma"], n)), 1, p["max_output_tokens"]).astype(np.int64)
        summary = np.maximum(np.rint(_lognormal(rng, p["summary_median"], 0.5, n)), 1).astype(np.int64)
        summary = np.minimum(summary, cmax // 2)
        prefix = sys_len[variant][sess]

        inc = np.where(first, 0, np.concatenate(([0], out[:-1])) + delta)
        seg_start = first | (rng.random(n) < p["compaction_prob"])
        start_val = np.where(first, prefix + init[sess], prefix + summary)
        # a step over the context cap compacts instead; one pass per compaction depth
        while True:
            seg_idx = np.maximum.accumulate(np.where(seg_start, np.arange(n), 0))
            inp = start_val[seg_idx] + _session_cumsum(np.where(seg_start, 0, inc), seg_start)
            over = (inp > cmax) & ~seg_start
            if not over.any():
                break
            first_over = over & (_session_cumsum(over.astype(np.int64), seg_start) == 1)
            seg_start = seg_start | first_over

        prev_in = np.concatenate(([0], inp[:-1]))
        keep = np.where(seg_start, sys_blocks[variant][sess], prev_in // bs)
        chain = np.cumsum(seg_start) - 1

        think = np.where(
            is_user,
            _lognormal(rng, p["user_think_median_s"], _sigma_from_p90(p["user_think_median_s"], p["user_think_p90_s"]), n),
            _lognormal(rng, p["tool_think_median_s"], _sigma_from_p90(p["tool_think_median_s"], p["tool_think_p90_s"]), n),
        )
        think = np.where(first, 0.0, think)
        service = 0.5 + 0.02 * out + inp / 20_000.0
        prev_service = np.where(first, 0.0, np.concatenate(([0.0], service[:-1])))
        arrival = starts[sess] + _session_cumsum(prev_service + think, first)
        after = np.where(first, -1, np.arange(n) - 1)

        chain_variant = variant[sess][seg_start]
        return Plan(
            arrival=arrival, input_tokens=inp, output_tokens=out, chain=chain, keep=keep,
            chain_prefix_base=sys_base[chain_variant], chain_prefix_blocks=sys_blocks[chain_variant],
            session=sess, parent=after.copy(), after=after, delay=think,
            first_fresh_id=int(sys_blocks.sum()),
            meta={"tool_step_share": f"{float((~is_user).mean()):.4f}"},
        )  # fmt: skip
