"""Fit the `coder` generator's calibration to real coding-agent sessions.

`fit_coder(trace, sessions)` reads a canonical session trace (the Claude Code loader's
output: `session_id`, `parent_id` chains, `after_id`/`delay_s`) and returns plain tables,
JSON-serializable, that `CoderGenerator` samples by inverse CDF. Each distribution is kept
as its empirical quantile function on a fixed probability grid: the real data are
heavy-tailed, lumpy (integer think times, a few sessions of hundreds of steps) and
correlated in ways no two-parameter family follows, and the tables keep all of that while
holding no request of the source (a few KB of order statistics).

Tables (token counts at the trace's block size; times in s):

- `main_requests`: steps of a session's main chain; `start_input`: its first input;
- `session_shapes`: per real session, (main-chain steps, first input, median growth): a
  generated session takes one whole, since length, start and growth level go together
  (long sessions grow by less per step);
- `growth_by_input`: input growth of a non-shrinking step over its session's median
  growth, one table per bin of the previous input (`input_bin_edges`): early steps read
  files (mean growth 3.1K tokens below 50K of context, 1.4K at 100-150K). The growth is
  the whole difference between two prompts, re-sent output included, so nothing is added
  on top of it; `growth_by_level_input[c][b]`: the same for sessions of level class c
  (below, between, above `growth_level_edges`, the terciles of the median growths), empty
  for a cell of fewer than `_MIN_CELL_STEPS` steps (the generator then uses the bin's
  pooled `growth_by_input`). These describe every step but a main chain's first
  `_FIRST_STEPS` ones;
- `growth_first_steps[k-1]`: growth in tokens of a main chain's k-th step, for sessions
  that start below the first bin edge and for the others: a session starts by reading files
  (first step median 1.6K tokens, p90 27K, against 640 / 3.5K over all steps), and drawing
  those steps from the later steps' tables kept generated sessions below 41K too long
  (input p10 0.82-0.87x the real one);
- `growth_rank_rho`: lag-1 correlation of the normal scores of consecutive steps' ranks
  in their growth tables (0.22): growth comes in bursts;
- compaction (a shrink to < 0.8 of the context; 232 of the 334 real shrinks): the agent
  compacts once the prompt it sent reaches a threshold T, to `compact_ratio` of it (median
  0.41); the same ratio serves when the served model's window forces a compaction. T is a
  property of a context *segment* (a chain from its start or from a compaction to the
  next compaction). Its distribution is the Kaplan-Meier estimate over real segments, with
  delayed entry (a segment is at risk only from the size it starts at) and censoring (a
  segment that ends without compacting says only T > its largest prompt):
  `compact_levels` (the context sizes of real compactions) and `compact_cdf` (P(T <= each
  level)); the mass above the last level (segments that grow past every observed
  compaction, 1M-window sessions) never compacts. Per-segment thresholds replace the
  former `compact_at` + `large_window_prob` (0.79 of the sessions reaching 166K never
  compacting), which ignored the segments that ended, censored, below the threshold and
  let too many large contexts grow on;
- block-id rewrites (`rewrite_*`): a growing real step does not always re-send every
  complete block of the previous prompt. 6.2% of them diverge before its end: 5.3% only
  inside the previous step's own append (`rewrite_tail_prob_by_input`; `rewrite_tail_tokens`:
  tokens from the previous prompt's last complete block back to the divergence, median one
  block), and 0.9% reach older context (`rewrite_deep_prob_by_input`; `rewrite_deep_kept`:
  tokens kept, median 233 blocks of 64, i.e. the tools+system prefix): 89% of the blocks
  the rewrites lose, 0.011 of the within-session miss ratio's 0.038;
- `shrink_prob_by_input`: chance of a smaller shrink (>= 0.8) per bin of the previous
  input (`input_bin_edges`), and `shrink_ratio` (after / before) of those steps;
- `output`, `think_s`;
- `subagent_session_prob`, `subagents_per_session` (spawning sessions), `subagent_group`
  (sub-agents started together: within `_GROUP_GAP_S` of the group's first),
  `subagent_requests`, `subagent_start_input`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lmsim.workload.compare import chain_roots
from lmsim.workload.trace import Trace

# 0.5 % steps, then ever finer toward the maximum: growth and inputs are heavy-tailed, and a
# straight segment from p99.5 to a 600K-token maximum would draw far too many huge values
# Powers of ten through the C library, not numpy's vectorised pow, whose last bits differ
# between numpy builds (see generators/base.py): the grid must be the same everywhere.
GRID = np.unique(np.concatenate([
    np.linspace(0.0, 0.99, 199), 1.0 - np.array([math.pow(10.0, e) for e in np.linspace(-2, -5, 31)]), [1.0],
]))
# Context sizes at which the agent's own compaction gets likelier: fixed edges, finer above
# 100K, where real sessions compact several times more often per step and where a quantile
# grid of the inputs would leave one open-ended bin for everything beyond 150K.
_INPUT_EDGES = (50_000, 100_000, 140_000, 170_000, 200_000, 300_000, 450_000)
_GROUP_GAP_S = 60.0
_MIN_CELL_STEPS = 200  # a growth table of fewer steps has no p99.5 to speak of
_COMPACTION_RATIO = 0.8  # a shrink to below this share of the context is a compaction
# A session's first steps have their own tables: its first one falls in the top decile of
# its growth table 30% of the time (10% later), its second 19%, its third 14%
_FIRST_STEPS = 2


def _table(x: np.ndarray) -> list[float]:
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 0:
        return []
    return [float(v) for v in np.quantile(x, GRID)]


def _chains(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(root row of each row's parent_id chain, session index of each row)."""
    root = chain_roots(trace.column("parent_id"))
    raw = trace.column("session_id")
    raw = np.where(raw >= 0, raw, -1 - np.arange(len(trace)))
    _, sess = np.unique(raw, return_inverse=True)
    return root, sess


def _groups(keys: np.ndarray, values: np.ndarray):
    order = np.argsort(keys, kind="stable")
    k, v = keys[order], values[order]
    cuts = np.flatnonzero(np.diff(k)) + 1
    for ks, vs in zip(np.split(k, cuts), np.split(v, cuts)):
        if len(ks):
            yield int(ks[0]), vs


def divergence_blocks(trace: Trace, rows: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """For each step `rows[i]`, the number of leading complete blocks of its parent's
    prompt it re-sends unchanged (the parent's complete blocks when it re-sends all)."""
    bs = trace.block_size
    out = np.empty(len(rows), dtype=np.int64)
    for j, (r, p) in enumerate(zip(rows.tolist(), parents.tolist())):
        a, b = trace.hash_ids(p), trace.hash_ids(r)
        m = min(len(a), len(b), int(trace.input_tokens[p]) // bs)
        differ = np.flatnonzero(a[:m] != b[:m])
        out[j] = differ[0] if len(differ) else m
    return out


def mid_ranks(sample: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The rank of each of `x` in `sample` as a probability, ties at their mean: in (0, 1)
    for values of the sample."""
    s = np.sort(sample)
    return (np.searchsorted(s, x, side="left") + np.searchsorted(s, x, side="right")) / (2.0 * len(s))


def normal_scores(u: np.ndarray) -> np.ndarray:
    # statistics' inverse normal CDF: numpy has none, and scipy is not a dependency
    from statistics import NormalDist

    inv = NormalDist().inv_cdf
    return np.array([inv(float(v)) for v in u])


def chain_depth(parent: np.ndarray) -> np.ndarray:
    """Each row's position in its parent_id chain (0 for a chain's first row); a parent
    precedes its children."""
    depth = np.zeros(len(parent), dtype=np.int64)
    for r, q in enumerate(parent.tolist()):
        if q >= 0:
            depth[r] = depth[q] + 1
    return depth


def threshold_survival(start: np.ndarray, end: np.ndarray, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan-Meier CDF of a threshold T from segments observed from size `start` to `end`,
    ending at T (`event`) or censored (T > end): (distinct event levels, P(T <= level))."""
    levels = np.unique(end[event])
    if not len(levels):
        return levels, levels
    at_risk = np.array([int(((start <= x) & (end >= x)).sum()) for x in levels])
    events = np.array([int((end[event] == x).sum()) for x in levels])
    survival = np.cumprod(1.0 - events / np.maximum(at_risk, 1))
    return levels.astype(np.float64), 1.0 - survival


def fit_coder(trace: Trace, sessions: np.ndarray | None = None) -> dict[str, Any]:
    """Calibration tables from the sessions selected by the boolean mask `sessions`
    (indexed like `np.unique(session_id)`), all by default."""
    root, sess = _chains(trace)
    n = len(trace)
    ns = int(sess.max()) + 1
    use = np.ones(ns, dtype=bool) if sessions is None else np.asarray(sessions, dtype=bool)
    rows = np.arange(n)
    first_row = np.full(ns, n, dtype=np.int64)
    np.minimum.at(first_row, sess, rows)
    is_main = root == root[first_row][sess]
    sel = use[sess]
    parent = trace.column("parent_id")
    after = trace.column("after_id")
    inp, out = trace.input_tokens, trace.output_tokens
    t = trace.arrival_s

    main_len_all = np.bincount(sess[is_main], minlength=ns)
    main_len = main_len_all[use]
    start_input = inp[first_row[use]]

    linked = np.flatnonzero((parent >= 0) & sel)
    prev_in = inp[parent[linked]].astype(np.float64)
    growth = inp[linked] - prev_in
    shrink = growth < 0
    # a session's growth level: long sessions grow by less per step than short ones, so
    # growth is drawn as (the session's median growth) x (a step's growth over its
    # session's median), and the level travels with the session's length and start
    step_sess = sess[linked]
    level = np.ones(ns)
    for s_, g_ in _groups(step_sess[~shrink], growth[~shrink]):
        level[s_] = max(float(np.median(g_)), 1.0)
    rel = growth / level[step_sess]
    in_edges = np.asarray(_INPUT_EDGES, dtype=np.float64)
    in_bin = np.searchsorted(in_edges, prev_in, side="right")
    sessions_table = [[int(main_len_all[s_]), int(inp[first_row[s_]]), round(float(level[s_]), 1)]
                      for s_ in np.flatnonzero(use)]
    ratio = inp[linked] / prev_in
    compaction = shrink & (ratio < _COMPACTION_RATIO)
    small = shrink & ~compaction
    shrink_prob = [float(small[in_bin == b].mean()) if (in_bin == b).any() else 0.0
                   for b in range(len(in_edges) + 1)]  # fmt: skip
    # context segments: a chain cut at its compactions (rows of a chain are in time order)
    cut = np.zeros(n, dtype=bool)
    cut[linked[compaction]] = True
    chain_rows = np.flatnonzero(sel)
    chain_rows = chain_rows[np.lexsort((chain_rows, root[chain_rows]))]
    new_seg = np.ones(len(chain_rows), dtype=bool)
    new_seg[1:] = (root[chain_rows[1:]] != root[chain_rows[:-1]]) | cut[chain_rows[1:]]
    seg = np.cumsum(new_seg) - 1
    nseg = int(seg[-1]) + 1 if len(seg) else 0
    seg_start = inp[chain_rows[new_seg]].astype(np.float64)
    seg_end = np.zeros(nseg)
    np.maximum.at(seg_end, seg, inp[chain_rows].astype(np.float64))
    seg_event = np.zeros(nseg, dtype=bool)
    # ended by the next one's compaction, at its largest prompt (the one sent just before)
    seg_event[seg[new_seg & cut[chain_rows]] - 1] = True
    compact_levels, compact_cdf = threshold_survival(seg_start, seg_end, seg_event)

    # growth relative to the session's level, per level class (terciles of the level) and
    # input bin: sessions that grow little per step have the heavier relative spikes (p99
    # 33x their median in the lowest third, 18x in the highest), so one pooled table would
    # give large spikes to fast-growing sessions (growth p99 1.17-1.32x the real one)
    level_edges = np.quantile(level[use], [1 / 3, 2 / 3]) if use.any() else np.zeros(2)
    level_class = np.searchsorted(level_edges, level[step_sess], side="right")
    growing = ~shrink
    # a session's first growing steps read files: their own tables (in tokens, by step and
    # by whether the session starts below the first bin edge, where most do), and the
    # relative tables below are fitted on the other steps only, which they describe.
    # Main chains only: the 47 sub-agent chains among the 385 starting low grow by far more
    # at their second step (p50 3.0K, p90 37K against 1.2K, 14K)
    depth = chain_depth(parent)[linked]
    low_start = inp[root[linked]] < in_edges[0]
    opening = is_main[linked] & (depth <= _FIRST_STEPS)
    first_steps = [[_table(growth[growing & opening & (depth == k) & (low_start == low)]) for low in (True, False)]
                   for k in range(1, _FIRST_STEPS + 1)]
    later = growing & ~opening

    def cell(b: int, c: int | None) -> list[float]:
        steps = later & (in_bin == b) & (level_class == c if c is not None else True)
        return _table(rel[steps]) if c is None or steps.sum() >= _MIN_CELL_STEPS else []

    # serial structure of growth, in rank space: each later step's rank within the table the
    # generator draws it from (its cell, or the pooled bin where the cell is empty)
    rank = np.full(len(linked), np.nan)
    for b in range(len(in_edges) + 1):
        pooled = later & (in_bin == b)
        for c in range(3):
            steps = pooled & (level_class == c)
            sample = steps if steps.sum() >= _MIN_CELL_STEPS else pooled
            if steps.any():
                rank[steps] = mid_ranks(rel[sample], rel[steps])
    # lag-1 correlation of the normal scores of consecutive growing steps of a chain: growth
    # comes in bursts (0.22 on all sessions, about the same below 41K, at 41-100K and above
    # 100K; the generator's independent draws had 0.00)
    at = np.full(n, -1, dtype=np.int64)
    at[linked] = np.arange(len(linked))
    prev_at = at[parent[linked]]
    pair = later & (prev_at >= 0)
    pair[pair] &= later[prev_at[pair]]
    z = np.zeros(len(linked))
    z[later] = normal_scores(rank[later])
    rho = float(np.corrcoef(z[prev_at[pair]], z[pair])[0, 1]) if pair.sum() > 2 else 0.0

    # block-id rewrites of growing steps
    grow_rows = linked[~shrink]
    grow_par = parent[grow_rows]
    kept = divergence_blocks(trace, grow_rows, grow_par)
    bs = trace.block_size
    parent_full = inp[grow_par] // bs
    grand = parent[grow_par]
    older = np.where(grand >= 0, inp[np.maximum(grand, 0)] // bs, 0)
    deep = kept < np.minimum(older, parent_full)
    tail = (kept < parent_full) & ~deep
    grow_bin = in_bin[~shrink]

    def by_bin(flag: np.ndarray) -> list[float]:
        return [float(flag[grow_bin == b].mean()) if (grow_bin == b).any() else 0.0
                for b in range(len(in_edges) + 1)]

    closed = np.flatnonzero((after >= 0) & sel)

    # sub-agents: chains other than the session's main one
    sub_roots = np.unique(root[~is_main & sel])
    sub_sess = sess[sub_roots]
    spawning = np.unique(sub_sess)
    per_session = np.bincount(sub_sess, minlength=ns)[spawning]
    groups: list[int] = []
    for s in spawning:
        starts = np.sort(t[sub_roots[sub_sess == s]])
        g0 = starts[0]
        size = 0
        for x in starts:
            if x - g0 > _GROUP_GAP_S:
                groups.append(size)
                g0, size = x, 0
            size += 1
        groups.append(size)
    sub_len = np.bincount(np.searchsorted(sub_roots, root[~is_main & sel]), minlength=len(sub_roots))

    return {
        "format": "lmsim-coder-calibration/1",
        "block_size": int(trace.block_size),
        "sessions": int(use.sum()),
        "requests": int(sel.sum()),
        "grid": [float(g) for g in GRID],
        "main_requests": _table(main_len),
        "start_input": _table(start_input),
        "growth_by_input": [cell(b, None) for b in range(len(in_edges) + 1)],
        "growth_level_edges": [float(x) for x in level_edges],
        "growth_by_level_input": [[cell(b, c) for b in range(len(in_edges) + 1)] for c in range(3)],
        "growth_rank_rho": rho,
        "growth_first_steps": first_steps,
        "session_shapes": sessions_table,
        "input_bin_edges": [float(e) for e in in_edges],
        "shrink_prob_by_input": shrink_prob,
        "shrink_ratio": _table(ratio[small]),
        "compact_levels": [float(x) for x in compact_levels],
        "compact_cdf": [float(x) for x in compact_cdf],
        "compact_ratio": _table(ratio[compaction]),
        "rewrite_deep_prob_by_input": by_bin(deep),
        "rewrite_deep_kept": _table(kept[deep] * bs),
        "rewrite_tail_prob_by_input": by_bin(tail),
        "rewrite_tail_tokens": _table((parent_full - kept)[tail] * bs),
        "output": _table(out[sel]),
        "think_s": _table(trace.column("delay_s")[closed]),
        "subagent_session_prob": float(len(spawning) / max(int(use.sum()), 1)),
        "subagents_per_session": _table(per_session),
        "subagent_group": _table(np.asarray(groups)),
        "subagent_requests": _table(sub_len),
        "subagent_start_input": _table(inp[sub_roots]),
    }


def save_calibration(cal: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(cal, indent=0, sort_keys=True) + "\n")


def load_calibration(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def main(argv: list[str] | None = None) -> int:
    """`python -m lmsim.workload.generators.coder_fit TRACE OUT.json`: refit the shipped
    calibration (TRACE: the WEKA file or its canonical conversion)."""
    import sys

    from lmsim.workload.formats import load_trace

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m lmsim.workload.generators.coder_fit TRACE OUT.json")
        return 2
    save_calibration(fit_coder(load_trace(args[0])), args[1])
    print(f"wrote {args[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
