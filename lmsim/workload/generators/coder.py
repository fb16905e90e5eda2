"""The `coder` generator: closed-loop coding-agent sessions drawn from tables fitted on the
572 real Claude Code sessions of the WEKA trace (traces.md §3.5; `coder_fit.py`).

Two steps, kept apart on purpose:

1. **Sessions as the agent runs them, uncapped.** A session is a main chain of steps; each
   step re-sends the previous prompt and the previous output and appends a tool result or
   user text. The growth of a step is drawn from the real growth given the previous
   output's size (the resent output is part of the growth, not added on top). A step may
   shrink (the agent's own compaction) with the real per-step probability for its context
   size, to the real after/before ratio. Some sessions spawn sub-agents: groups of
   concurrent closed-loop chains started right after a parent step, each on its own
   (sub-agent) prefix; the parent's next step waits for the group's longest chain.
2. **The served model's window** (`max_context_tokens`, default 131,072: Qwen3-30B-A3B's
   documented maximum with YaRN, the model this study serves; None = uncapped). A step that
   would exceed it compacts instead, as coding agents do at the limit: the context becomes
   a summary, the real shrink ratio of contexts above 100K (median about 0.41: 148K to 61K)
   times the previous input; a resumed session larger than the window starts from such a
   summary of the window.

Block ids (the cache rule): a step's prompt starts with every complete block of the
previous step's prompt, then continues with fresh ids at the positions of the previous
output and the append, so the ids a continuation sends at the previous output's positions
are the ids that output's blocks take. A compaction keeps only the tools+system prefix.
All sessions of a client variant share its tools+system prefix; all sub-agents of a
variant share the sub-agent prefix.

Rows: main steps have `parent_id` = `after_id` = the previous step and `delay_s` = the
think time. A sub-agent's first step has `after_id` = the spawning step, `delay_s` =
`spawn_delay_s` and `parent_id` -1 (it does not extend the parent's prompt). `arrival_s`
is an open-loop estimate (0.5 s + 20 ms per output token + input / 20K tokens per s per
step) used only to order rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.generators.base import Plan, build_trace, horizon, zipf_weights
from lmsim.workload.generators.chat import _session_cumsum
from lmsim.workload.generators.coder_fit import GRID, load_calibration
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.trace import Trace

# Bumped whenever the same parameters and seed give a different trace (capacity cache keys).
# main's generators carry it as the class attribute `version` (2 there: C-library exp and
# the microsecond time grid); this rewrite is 3.
VERSION = 3

# WEKA tools+system prefix per session, p10 / p50 / p90 tokens (§3.5)
_SYS_QUANTILES = ((0.1, 11898.0), (0.5, 14948.0), (0.9, 15930.0))
SERVED_MODEL_WINDOW = 131_072


def shipped_calibration_path() -> Any:
    from lmsim.data import TRACES_DIR

    return TRACES_DIR / "coder_calibration.json"


def _draw(rng: np.random.Generator, table: list[float], size: int) -> np.ndarray:
    """Inverse-CDF draws from an empirical quantile table on `GRID`."""
    if not table:
        return np.zeros(size)
    return np.interp(rng.random(size), GRID, np.asarray(table, dtype=np.float64))


@GENERATORS.register("coder")
class CoderGenerator:
    """Agentic coding sessions (see the module docstring). Parameters:

    - `num_requests` | `duration_s` | `num_sessions`: how much to generate (at most one;
      one hour by default). With `num_sessions` every session is complete (for calibration
      checks); otherwise sessions start from `warmup_s` before 0 and the window [0, end) is
      kept, a steady state.
    - `rate` 5.97 req/s: the Qwen Coder trace's rate (§3.4; WEKA has no absolute time);
      sessions arrive as Poisson at rate / (mean requests per session).
    - `calibration`: a `fit_coder` JSON (default: fitted on all 572 WEKA sessions,
      `lmsim/data/traces/coder_calibration.json`).
    - `max_context_tokens` 131,072 (None = uncapped): see the module docstring.
    - `num_variants` 3, `variant_zipf` 1.0: client variants, each with a tools+system prefix
      drawn from the WEKA p10/p50/p90 (§3.5); `subagent_prefix_tokens` 9,000 (8.3K tools +
      0.7K system in the real sub-agents, §5.1).
    - `spawn_delay_s` 0.5: a sub-agent's first step after the spawning response (0.5-0.9 s
      in the real data).
    """

    version = VERSION

    def __init__(
        self,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        num_sessions: int | None = None,
        rate: float = 5.97,
        calibration: str | None = None,
        max_context_tokens: int | None = SERVED_MODEL_WINDOW,
        num_variants: int = 3,
        variant_zipf: float = 1.0,
        subagent_prefix_tokens: int = 9000,
        spawn_delay_s: float = 0.5,
        block_size: int = 16,
        warmup_s: float = 8 * 3600.0,  # WEKA session duration p90 6.7 h (§3.5): steady state
    ) -> None:
        self.p = dict(locals())
        del self.p["self"]
        given = [x for x in (num_requests, duration_s, num_sessions) if x is not None]
        if len(given) > 1:
            raise ConfigError("give only one of num_requests, duration_s and num_sessions")
        if num_sessions is not None and num_sessions < 1:
            raise ConfigError(f"num_sessions must be >= 1, got {num_sessions}")
        if max_context_tokens is not None and max_context_tokens < 2 * block_size:
            raise ConfigError(f"max_context_tokens must be >= {2 * block_size}, got {max_context_tokens}")
        try:
            self.cal = load_calibration(calibration or shipped_calibration_path())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"calibration {calibration}: cannot read ({exc})") from None

    def generate(self, rng: np.random.Generator) -> Trace:
        p = self.p
        pilot_rng, main_rng = rng.spawn(2)
        mean_requests = float(np.mean(self._plan(pilot_rng, None, 2000, 1.0).input_tokens.size / 2000))
        session_rate = p["rate"] / mean_requests
        seed_seq = main_rng.bit_generator.seed_seq
        if p["num_sessions"] is not None:
            plan = self._plan(np.random.default_rng(seed_seq), None, p["num_sessions"], session_rate)
            end_s = None
        else:
            h = horizon(p["num_requests"], p["duration_s"], p["rate"])
            plan = self._plan(np.random.default_rng(seed_seq), h, None, session_rate)
            # Sessions are heavy-tailed in duration, so the steps landing in the window fall
            # short of the pilot's mean; one corrective pass (same stream) fixes the rate.
            in_window = int(((plan.arrival >= 0) & (plan.arrival < h)).sum())
            if in_window:
                session_rate *= p["rate"] * h / in_window
                plan = self._plan(np.random.default_rng(seed_seq), h, None, session_rate)
            end_s = h if p["num_requests"] is None else None
        trace = build_trace(
            plan, block_size=p["block_size"], start_s=0.0, end_s=end_s,
            num_requests=p["num_requests"], source="generator:coder",
        )  # fmt: skip
        trace.meta.update(plan.meta)
        return trace

    # -- one plan ------------------------------------------------------------------------

    def _plan(
        self, rng: np.random.Generator, h: float | None, num_sessions: int | None,
        session_rate: float,
    ) -> Plan:
        p, cal = self.p, self.cal
        bs = p["block_size"]
        if num_sessions is None:
            assert h is not None
            span = h + p["warmup_s"]
            starts = np.sort(rng.uniform(-p["warmup_s"], h, rng.poisson(session_rate * span)))
        else:
            starts = np.cumsum(rng.exponential(1.0 / session_rate, num_sessions)) - 1e-9
            starts[0] = 0.0
        ns = len(starts)

        # client variants and their shared prefixes (main, then sub-agent)
        k = p["num_variants"]
        qs, vs = zip(*_SYS_QUANTILES, strict=True)
        sys_len = np.rint(np.interp(rng.uniform(0.1, 0.9, k), qs, vs)).astype(np.int64)
        prefix_blocks = np.concatenate((sys_len // bs, np.full(k, p["subagent_prefix_tokens"] // bs)))
        prefix_base = np.concatenate(([0], np.cumsum(prefix_blocks)[:-1]))
        variant = rng.choice(k, size=ns, p=zipf_weights(k, p["variant_zipf"]))

        # units: each session's main chain, then its sub-agents (generation order)
        shapes = np.asarray(cal["session_shapes"], dtype=np.float64)
        pick = rng.integers(0, len(shapes), ns)
        main_len = shapes[pick, 0].astype(np.int64)
        main_start = shapes[pick, 1].astype(np.int64)
        main_level = shapes[pick, 2]
        sub_level = float(np.median(shapes[:, 2]))
        spawns = rng.random(ns) < cal["subagent_session_prob"]
        u_sess, u_len, u_start, u_prefix, u_spawn_at, u_level = [], [], [], [], [], []
        for s in range(ns):
            u_sess.append(s)
            u_len.append(main_len[s])
            u_start.append(main_start[s])
            u_prefix.append(variant[s])
            u_spawn_at.append(-1)
            u_level.append(main_level[s])
            if not spawns[s]:
                continue
            total = max(1, round(float(_draw(rng, cal["subagents_per_session"], 1)[0])))
            while total > 0:
                size = min(total, max(1, round(float(_draw(rng, cal["subagent_group"], 1)[0]))))
                total -= size
                at = int(rng.integers(0, main_len[s]))  # step of the main chain
                for _ in range(size):
                    u_sess.append(s)
                    u_len.append(max(1, round(float(_draw(rng, cal["subagent_requests"], 1)[0]))))
                    u_start.append(max(1, round(float(_draw(rng, cal["subagent_start_input"], 1)[0]))))
                    u_prefix.append(k + variant[s])
                    u_spawn_at.append(at)
                    u_level.append(sub_level)
        unit_sess = np.asarray(u_sess, dtype=np.int64)
        unit_len = np.asarray(u_len, dtype=np.int64)
        unit_first = np.concatenate(([0], np.cumsum(unit_len)[:-1]))
        unit_prefix = np.asarray(u_prefix, dtype=np.int64)
        spawn_at = np.asarray(u_spawn_at, dtype=np.int64)
        n = int(unit_len.sum())
        unit = np.repeat(np.arange(len(unit_len)), unit_len)
        first = np.zeros(n, dtype=bool)
        first[unit_first] = True

        out = np.maximum(np.rint(_draw(rng, cal["output"], n)), 1).astype(np.int64)
        u_growth = rng.random(n)
        level = np.asarray(u_level)[unit]
        growth_by_bin = np.stack([level * np.interp(u_growth, GRID, np.asarray(table))
                                  for table in cal["growth_by_input"]])
        shrink_u = rng.random(n)
        shrink_ratio = _draw(rng, cal["shrink_ratio"], n)
        limit_ratio = _draw(rng, cal["compact_ratio"], n)
        think = _draw(rng, cal["think_s"], n)
        units = len(unit_len)
        compact_at = np.where(rng.random(units) < cal["large_window_prob"], np.inf,
                              _draw(rng, cal["compact_at"], units))
        compact_at = np.where(np.asarray(u_start) > compact_at, np.inf, compact_at)
        inp, seg_start = self._contexts(first, np.asarray(u_start)[unit], compact_at[unit],
                                        growth_by_bin, shrink_u, shrink_ratio, limit_ratio)
        prefix_row = prefix_blocks[unit_prefix][unit]
        prev_in = np.concatenate(([0], inp[:-1]))
        keep = np.where(seg_start, np.minimum(prefix_row, inp // bs), prev_in // bs)
        chain = np.cumsum(seg_start) - 1

        # timing: open-loop estimates; a parent step after a spawn waits for its group
        service = 0.5 + 0.02 * out + inp / 20_000.0
        prev_service = np.where(first, 0.0, np.concatenate(([0.0], service[:-1])))
        delay = np.where(first, 0.0, think)
        offset = _session_cumsum(prev_service + delay, first)  # from the unit's first step
        is_sub = spawn_at >= 0
        sub_units = np.flatnonzero(is_sub)
        main_unit_of = np.full(ns, -1, dtype=np.int64)
        main_unit_of[unit_sess[~is_sub]] = np.flatnonzero(~is_sub)
        spawn_row = unit_first[main_unit_of[unit_sess[sub_units]]] + spawn_at[sub_units]
        last = unit_first[sub_units] + unit_len[sub_units] - 1
        duration = offset[last] + service[last] + p["spawn_delay_s"]
        wait = np.zeros(n)
        resume = spawn_row + 1
        ok = resume < unit_first[main_unit_of[unit_sess[sub_units]]] + main_len[unit_sess[sub_units]]
        np.maximum.at(wait, resume[ok], duration[ok])
        delay = delay + wait
        offset = _session_cumsum(prev_service + delay, first)
        arrival = np.empty(n)
        main_rows = ~is_sub[unit]
        arrival[main_rows] = starts[unit_sess[unit[main_rows]]] + offset[main_rows]
        sub_rows = np.flatnonzero(~main_rows)
        sub_row_unit = unit[sub_rows]
        spawn_row_of_unit = np.full(len(unit_len), -1, dtype=np.int64)
        spawn_row_of_unit[sub_units] = spawn_row
        base = spawn_row_of_unit[sub_row_unit]
        arrival[sub_rows] = arrival[base] + service[base] + p["spawn_delay_s"] + offset[sub_rows]

        parent = np.where(first, -1, np.arange(n) - 1)
        after = parent.copy()
        after[unit_first[sub_units]] = spawn_row
        delay[unit_first[sub_units]] = p["spawn_delay_s"]

        chain_prefix = unit_prefix[unit][seg_start]
        return Plan(
            arrival=arrival, input_tokens=inp, output_tokens=out, chain=chain, keep=keep,
            chain_prefix_base=prefix_base[chain_prefix],
            chain_prefix_blocks=prefix_blocks[chain_prefix],
            session=unit_sess[unit], parent=parent, after=after, delay=delay,
            first_fresh_id=int(prefix_blocks.sum()),
            meta={"generator_version": str(VERSION),
                  "max_context_tokens": str(p["max_context_tokens"]),
                  "compactions": str(int(seg_start.sum() - first.sum())),
                  "subagent_rows": str(int((~main_rows).sum()))},
        )  # fmt: skip

    def _contexts(
        self, first: np.ndarray, start: np.ndarray, compact_at: np.ndarray,
        growth_by_bin: np.ndarray, shrink_u: np.ndarray, shrink_ratio: np.ndarray,
        limit_ratio: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Input of every step, and where a context restarts (a chain's first step, a
        shrink, a compaction). Growth and shrink chances depend on the context reached, so
        this walks the steps in order (about a second per 10^5 steps)."""
        cal = self.cal
        cmax = self.p["max_context_tokens"]
        limit = math.inf if cmax is None else cmax
        edges = np.asarray(cal["input_bin_edges"])
        hazard = np.asarray(cal["shrink_prob_by_input"])
        n = len(first)
        inp = np.zeros(n, dtype=np.int64)
        seg_start = first.copy()
        prev = 0
        for i in range(n):
            if first[i]:
                x = int(start[i])
                # a resumed session larger than the window starts from a summary of it
                prev = round(limit_ratio[i] * limit) if x > limit else x
                inp[i] = prev
                continue
            b = int(np.searchsorted(edges, prev, side="right"))
            if shrink_u[i] < hazard[b]:
                nxt = max(1, round(shrink_ratio[i] * prev))
                seg_start[i] = True
            else:
                nxt = prev + max(0, round(growth_by_bin[b, i]))
                if nxt > compact_at[i] or nxt > limit:
                    nxt = max(1, round(limit_ratio[i] * prev))
                    seg_start[i] = True
            inp[i] = prev = nxt
        return inp, seg_start
