"""The `coder` generator: closed-loop coding-agent sessions drawn from tables fitted on the
572 real Claude Code sessions of the WEKA trace (traces.md §3.5; `coder_fit.py`).

Two steps, kept apart on purpose:

1. **Sessions as the agent runs them, uncapped.** A session is a main chain of steps; each
   step re-sends the previous prompt and the previous output and appends a tool result or
   user text. A session takes a real session's (steps, first input, median growth); the
   growth of a step is that median times a relative growth drawn from the real table of
   the session's level class (terciles of the median growth) and context bin (the resent
   output is part of the growth, not added on top). The agent's own compaction: each
   context segment has a threshold T drawn from the real one, estimated with censoring
   (Kaplan-Meier over real segments: a session that ends without compacting says only
   that T is above its largest prompt); the step after a prompt >= T compacts to the real
   after/before ratio. A chain draws once whether it ever compacts by itself (20% of real
   chains grow past every observed compaction level: 1M-window agents); one that does
   redraws T above each new segment's start (see `_contexts`). Smaller shrinks (>= 0.8 of
   the context) follow the real per-step chance for the context size. Some sessions spawn
   sub-agents: groups of concurrent closed-loop chains started right after a parent step,
   each on its own (sub-agent) prefix; the parent's next step waits for the group's
   longest chain.
2. **The served model's window** (`max_context_tokens`, default 131,072: Qwen3-30B-A3B's
   documented maximum with YaRN, the model this study serves; None = uncapped). A step that
   would exceed it compacts instead, as coding agents do at the limit: the context becomes
   a summary, the real shrink ratio of contexts above 100K (median about 0.41: 148K to 61K)
   times the previous input; a resumed session larger than the window starts from such a
   summary of the window.

Block ids (the cache rule): a growing step's prompt starts with the complete blocks of the
previous step's prompt up to its divergence point, then continues with fresh ids, so the
ids a continuation sends at the previous output's positions are the ids that output's
blocks take. The divergence point is the previous prompt's end for most steps; as in the
real sessions (6.2% of growing steps, per context bin, `rewrite_*` tables) some steps
rewrite earlier blocks (thinking stripped, earlier context edited): a *tail* rewrite
changes the previous prompt's last blocks (median one 64-token block; never before where
the previous step's own fresh ids began), a *deep* rewrite keeps only the first tokens
drawn from the real table (median 233 blocks of 64: the tools+system prefix; kept at most
up to the shared prefix, as a new id chain). These rewrites are 0.011 of the real
within-session miss ratio's 0.038; without them the generator's was 0.64x the real one.
A compaction keeps only the tools+system prefix.
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
from bisect import bisect_right
from math import erf
from statistics import NormalDist
from typing import Any

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.generators.base import Plan, build_trace, horizon, zipf_weights
from lmsim.workload.generators.chat import _session_cumsum
from lmsim.workload.generators.coder_fit import GRID, load_calibration
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.trace import Trace

_SQRT2 = math.sqrt(2.0)

# Bumped whenever the same parameters and seed give a different trace (capacity cache keys).
# 3: tables fitted on the real sessions; 4: block-id rewrites, compaction thresholds
# estimated with censoring, growth tables per session level class; 5: a chain's first
# growing steps from their own tables, serially correlated growth ranks.
VERSION = 5

# WEKA tools+system prefix per session, p10 / p50 / p90 tokens (§3.5)
_SYS_QUANTILES = ((0.1, 11898.0), (0.5, 14948.0), (0.9, 15930.0))
SERVED_MODEL_WINDOW = 131_072


def shipped_calibration_path() -> Any:
    from lmsim.shipped import TRACES_DIR

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
        u_growth = self._growth_ranks(rng.random(n), first)
        level = np.asarray(u_level)[unit]
        # a step's growth: its session's level x a relative growth from the table of the
        # session's level class for the previous input's bin (pooled over classes where a
        # class has too few real steps)
        level_class = np.searchsorted(np.asarray(cal["growth_level_edges"]), level, side="right")
        growth_by_bin = np.zeros((len(cal["growth_by_input"]), n))
        for c, tables in enumerate(cal["growth_by_level_input"]):
            rows_c = level_class == c
            for b, (table, pooled) in enumerate(zip(tables, cal["growth_by_input"], strict=True)):
                growth_by_bin[b, rows_c] = level[rows_c] * np.interp(
                    u_growth[rows_c], GRID, np.asarray(table or pooled))
        # a session's first steps read files: their growth in tokens comes from the real
        # sessions' first steps, by whether the session starts below the first bin edge
        depth = np.where(spawn_at[unit] < 0, np.arange(n) - unit_first[unit], -1)
        low = np.asarray(u_start)[unit] < cal["input_bin_edges"][0]
        for k, tables in enumerate(cal.get("growth_first_steps", []), start=1):
            for table, rows in zip(tables, (low, ~low), strict=True):
                at = (depth == k) & rows
                if table and at.any():
                    growth_by_bin[:, at] = np.interp(u_growth[at], GRID, np.asarray(table))
        shrink_u = rng.random(n)
        shrink_ratio = _draw(rng, cal["shrink_ratio"], n)
        limit_ratio = _draw(rng, cal["compact_ratio"], n)
        think = _draw(rng, cal["think_s"], n)
        # whether a chain ever compacts by itself is the session's (its agent's window);
        # where, given that it does, is redrawn per segment
        window_u = rng.random(len(unit_len))[unit]
        threshold_u = rng.random(n)
        inp, shrunk = self._contexts(first, np.asarray(u_start)[unit], window_u, threshold_u,
                                     growth_by_bin, shrink_u, shrink_ratio, limit_ratio)
        prefix_row = prefix_blocks[unit_prefix][unit]
        prev_in = np.concatenate(([0], inp[:-1]))
        prev_full = prev_in // bs
        # rewrites of growing steps: deep ones restart after (part of) the shared prefix,
        # i.e. start a new id chain; tail ones re-send all but the previous prompt's last
        # blocks (never before where the previous step itself started its fresh ids)
        edges = np.asarray(cal["input_bin_edges"])
        b = np.searchsorted(edges, prev_in, side="right")
        rewrite_u = rng.random(n)
        deep_p = np.asarray(cal["rewrite_deep_prob_by_input"])[b]
        tail_p = deep_p + np.asarray(cal["rewrite_tail_prob_by_input"])[b]
        deep_kept = _draw(rng, cal["rewrite_deep_kept"], n) // bs
        tail_lost = -(-_draw(rng, cal["rewrite_tail_tokens"], n) // bs)
        growing = ~first & ~shrunk
        deep = growing & (rewrite_u < deep_p)
        tail = growing & ~deep & (rewrite_u < tail_p)
        seg_start = first | shrunk | deep
        chain = np.cumsum(seg_start) - 1
        keep = np.where(seg_start, np.minimum(prefix_row, inp // bs), prev_full)
        keep = np.where(deep, np.minimum(keep, deep_kept).astype(np.int64), keep)
        keep = np.where(tail, np.maximum(prev_full - tail_lost, 0).astype(np.int64), keep)
        # keep never falls within a chain: the ids before the previous step's own are
        # shared with the step before it and stay
        big = np.int64(1) << np.int64(40)
        keep = np.maximum.accumulate(chain * big + keep) - chain * big

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
                  "compactions": str(int(shrunk.sum())),
                  "rewrites": str(int(deep.sum() + tail.sum())),
                  "subagent_rows": str(int((~main_rows).sum()))},
        )  # fmt: skip

    def _growth_ranks(self, u: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Each step's rank in its growth table, from independent uniforms `u`: real growth
        comes in bursts, the normal scores of consecutive steps' ranks within a chain
        correlated at `growth_rank_rho` (0.22), so the scores follow a Gaussian AR(1). Every
        step's rank stays uniform, so the growth tables' marginals stay as fitted."""
        rho = float(self.cal.get("growth_rank_rho", 0.0))
        if not rho:
            return u
        nd = NormalDist()
        e = [nd.inv_cdf(min(max(x, 1e-12), 1.0 - 1e-12)) for x in u.tolist()]
        s = math.sqrt(1.0 - rho * rho)
        z = e[:]
        for i in range(1, len(e)):
            if not first[i]:
                z[i] = rho * z[i - 1] + s * e[i]
        # NormalDist().cdf(x) is 0.5 * (1 + erf((x - 0) / (1 * sqrt 2))): the same operations
        # without a method call per step.
        return np.array([0.5 * (1.0 + erf(x / _SQRT2)) for x in z])

    def _contexts(
        self, first: np.ndarray, start: np.ndarray, window_u: np.ndarray,
        threshold_u: np.ndarray, growth_by_bin: np.ndarray, shrink_u: np.ndarray, shrink_ratio: np.ndarray,
        limit_ratio: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Input of every step, and which steps shrink (a shrink or a compaction). Growth
        and shrink chances depend on the context reached, so this walks the steps in order
        (about a second per 10^5 steps). Python's round() on a numpy scalar costs 20x
        its cost on a float, hence the float() around every rounded product.

        Compaction thresholds T come from the real distribution (`compact_levels`,
        `compact_cdf`), always above the size a segment starts at (a chain's first step or
        a compaction). A chain's first segment draws T given T > its start; past the last
        real compaction level (mass 1 - `compact_cdf[-1]`) it never compacts by itself: a
        large-window agent, and that stays the chain's for all its steps. A chain that does
        compact redraws T for each new segment from the finite part above its start. A step
        that follows a prompt of size >= T compacts. (Measured alternatives: redrawing the
        never-compacting share per segment lets many-segment sessions escape to unbounded
        growth, input p99 1.42 at seed 1; one rank for all segments makes early compactors
        compact low again and again, input p10 0.80 and shrink share 1.40-1.44.)
        """
        cal = self.cal
        cmax = self.p["max_context_tokens"]
        limit = math.inf if cmax is None else cmax
        # The calibration's short tables as float lists: bisect_right on them is
        # np.searchsorted(side="right") without numpy's per-call cost, once per step.
        edges = np.asarray(cal["input_bin_edges"], dtype=np.float64).tolist()
        hazard = np.asarray(cal["shrink_prob_by_input"], dtype=np.float64).tolist()
        levels = np.asarray(cal["compact_levels"], dtype=np.float64).tolist()
        cdf = np.asarray(cal["compact_cdf"], dtype=np.float64).tolist()
        top = float(cdf[-1]) if len(cdf) else 0.0

        def threshold(i: int, size: int, first_segment: bool) -> float:
            below = bisect_right(levels, size)
            lo = float(cdf[below - 1]) if below else 0.0
            if lo >= top:
                return math.inf
            if first_segment:
                u = lo + window_u[i] * (1.0 - lo)
                if u >= top:
                    return math.inf
            else:
                u = lo + threshold_u[i] * (top - lo)
            return float(levels[min(bisect_right(cdf, u), len(levels) - 1)])

        n = len(first)
        inp = np.zeros(n, dtype=np.int64)
        shrunk = np.zeros(n, dtype=bool)
        prev = 0
        at = math.inf
        for i in range(n):
            if first[i]:
                x = int(start[i])
                # a resumed session larger than the window starts from a summary of it
                prev = round(float(limit_ratio[i]) * limit) if x > limit else x
                inp[i] = prev
                at = threshold(i, prev, True)
                continue
            if prev >= at:
                nxt = max(1, round(float(limit_ratio[i]) * prev))
                shrunk[i] = True
                at = threshold(i, nxt, False)
            else:
                b = bisect_right(edges, prev)
                if shrink_u[i] < hazard[b]:
                    nxt = max(1, round(float(shrink_ratio[i]) * prev))
                    shrunk[i] = True
                else:
                    nxt = prev + max(0, round(float(growth_by_bin[b, i])))
                    if nxt > limit:
                        nxt = max(1, round(float(limit_ratio[i]) * prev))
                        shrunk[i] = True
                        if at != math.inf:  # a large-window agent stays one
                            at = threshold(i, nxt, False)
            inp[i] = prev = nxt
        return inp, shrunk
