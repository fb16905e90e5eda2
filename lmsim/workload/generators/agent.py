"""Single-turn template-driven generators: `agent` (Qwen trace B stand-in) and `toolagent`
(Kimi ToolAgent stand-in). Every request is a shared template prefix plus a unique suffix.

Sources (relative to `../shared`): `docs/traces.md` §3.4 (trace B, third-party table and
paper summary) and §3.3 (ToolAgent: published Table 2 of Mooncake-FAST25 and third-party
numbers).
"""

from __future__ import annotations

import math

import numpy as np

from lmsim.workload.generators.base import (
    Plan,
    build_trace,
    exp,
    horizon,
    lengths_from_targets,
    poisson_times,
    quantize,
    stratified_lognormal,
    zipf_weights,
)
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.trace import Trace


def _template_plan(
    rng: np.random.Generator, arrival: np.ndarray, template_tokens: np.ndarray,
    shares: np.ndarray, suffix: np.ndarray, out: np.ndarray, block_size: int,
) -> Plan:
    n = len(arrival)
    blocks = template_tokens // block_size
    base = np.concatenate(([0], np.cumsum(blocks)[:-1]))
    which = rng.choice(len(shares), size=n, p=shares)
    # Each request is a session of its own: a later request of the same template shares
    # its template blocks but never continues it, so it must not name its output blocks
    # (see lmsim.workload.trace.continuation_rows), even when a suffix shorter than a
    # block leaves the template as the request's only full blocks.
    return Plan(
        arrival=arrival, input_tokens=template_tokens[which] + suffix, output_tokens=out,
        chain=np.arange(n), keep=blocks[which], chain_prefix_base=base[which],
        chain_prefix_blocks=blocks[which], first_fresh_id=int(blocks.sum()),
        session=np.arange(n),
    )  # fmt: skip


@GENERATORS.register("agent")
class AgentGenerator:
    """API calls: single-turn requests dominated by shared system prompts and templates.

    Each request = one of `num_templates` templates (Zipf popularity; lengths lognormal) +
    a unique suffix. Targets, Qwen trace B (traces.md §3.4, third-party): 24.0 req/s; input
    915 / 574 / 6,294; output 92 / 39 / 1,006; ideal prefix hit 0.542 (paper 0.54); all
    turn 1 and 100 % of hits cross-session; 80 % of reuses within 10 s. Template and
    suffix sizes are not published and were fitted to those targets.
    """

    version = 3  # 2: C-library exp, microsecond time grid; 3: a step names its own session (output caching)

    def __init__(
        self,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        rate: float = 24.0,  # §3.4 trace B: 172,800 requests in 2 h
        num_templates: int = 300,  # fitted; a few hot ones carry most requests
        template_zipf: float = 1.2,  # fitted: median api reuse interval 2.3 s (§3.4)
        template_median: float = 480.0,  # fitted to the hit ratio 0.542
        template_sigma: float = 0.4,  # fitted
        suffix_median: float = 70.0,  # fitted to input p50 574
        suffix_sigma: float = 1.9,  # fitted to input p99 6,294
        output_mean: float = 92.0,  # §3.4 trace B
        output_p50: float = 39.0,
        output_p99: float = 1006.0,
        max_output_tokens: int = 8192,
        block_size: int = 16,  # Qwen traces use 16-token blocks
    ) -> None:
        self.p = dict(locals())
        del self.p["self"]

    def generate(self, rng: np.random.Generator) -> Trace:
        p = self.p
        h = horizon(p["num_requests"], p["duration_s"], p["rate"])
        arrival = poisson_times(rng, p["rate"], 0.0, h)
        n = len(arrival)
        k = p["num_templates"]
        tmpl = stratified_lognormal(k, p["template_median"], p["template_sigma"])
        suffix = np.maximum(
            np.rint(p["suffix_median"] * exp(p["suffix_sigma"] * rng.standard_normal(n))), 1
        ).astype(np.int64)
        out = lengths_from_targets(
            rng, p["output_mean"], p["output_p50"], p["output_p99"], n, hi=p["max_output_tokens"]
        )
        plan = _template_plan(
            rng, arrival, tmpl, zipf_weights(k, p["template_zipf"]), suffix, out, p["block_size"]
        )
        return build_trace(
            plan, block_size=p["block_size"], start_s=0.0, end_s=h,
            num_requests=p["num_requests"], source="generator:agent",
        )  # fmt: skip


@GENERATORS.register("toolagent")
class ToolAgentGenerator:
    """Kimi ToolAgent stand-in: a few very hot template prefixes, unique suffixes, short
    outputs, 512-token blocks like the real trace (traces.md §3.3).

    - Templates: 12, 8 and 5 blocks of 512 tokens (6,144 / 4,096 / 2,560), inside §3.3's
      "3-4 templates of 2.5-6K tokens"; the 12- and 5-block sizes are the `[46..57]` and
      `[74..78]` prefixes read in the arXiv trace. Shares 46 / 39 / 15 % (§3.3 third-party:
      10,938 / 9,203 / 3,449 requests by first block).
    - Targets (§3.3): 6.67 req/s (23,608 in 1 h); input mean 8,596 (paper Table 2),
      p50 6,346, p99 61,525 (third-party); output mean 182 (paper), p50 30 (third-party);
      ideal hit 0.553 (third-party; paper "cache ratio" 59 %).
    - Arrivals: Poisson, with timestamps floored to a `tick_s` grid (the Kimi traces'
      ~3 s quantization, §3.1/§3.3).
    - Suffix sizes per template are fitted; outputs are lognormal through p50 30 and mean
      182 (no published p99), capped at 2,000 like the conversation trace (§3.1).
    """

    version = 3  # 2: C-library exp, microsecond time grid; 3: a step names its own session (output caching)

    def __init__(
        self,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        rate: float = 6.67,  # §3.3
        template_blocks: tuple[int, ...] = (12, 8, 5),  # §3.3
        template_shares: tuple[float, ...] = (0.46, 0.39, 0.15),  # §3.3
        suffix_median: float = 800.0,  # fitted to input p50 6,346
        suffix_sigma_lo: float = 1.3,  # fitted to input mean 8,596
        suffix_sigma_hi: float = 1.82,  # fitted to input p99 61,525
        max_input_tokens: int = 131072,
        output_p50: float = 30.0,  # §3.3
        output_sigma: float = 2.2,  # fitted to output mean 182 after the cap
        max_output_tokens: int = 2000,  # §3.1: Kimi outputs are capped at 2,000
        tick_s: float = 3.0,  # §3.1/§3.3 timestamp grid
        block_size: int = 512,  # the real trace's block size
    ) -> None:
        self.p = dict(locals())
        del self.p["self"]

    def generate(self, rng: np.random.Generator) -> Trace:
        p = self.p
        h = horizon(p["num_requests"], p["duration_s"], p["rate"])
        arrival = quantize(poisson_times(rng, p["rate"], 0.0, h), p["tick_s"])
        n = len(arrival)
        tmpl = np.asarray(p["template_blocks"], dtype=np.int64) * p["block_size"]
        shares = np.asarray(p["template_shares"], dtype=np.float64)
        shares = shares / math.fsum(shares.tolist())
        z = rng.standard_normal(n)
        sig = np.where(z < 0, p["suffix_sigma_lo"], p["suffix_sigma_hi"])
        suffix = np.maximum(np.rint(p["suffix_median"] * exp(sig * z)), 1).astype(np.int64)
        suffix = np.minimum(suffix, p["max_input_tokens"] - int(tmpl.max()))
        out = np.clip(
            np.rint(p["output_p50"] * exp(p["output_sigma"] * rng.standard_normal(n))),
            1, p["max_output_tokens"],
        ).astype(np.int64)
        plan = _template_plan(rng, arrival, tmpl, shares, suffix, out, p["block_size"])
        return build_trace(
            plan, block_size=p["block_size"], start_s=0.0, end_s=h,
            num_requests=p["num_requests"], source="generator:toolagent",
        )  # fmt: skip
