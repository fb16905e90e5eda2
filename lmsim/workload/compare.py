"""Compare two session traces statistic by statistic, with a tolerance taken from real data.

`session_samples(trace)` reduces a canonical trace to per-session samples once; every
statistic below is then a function of a *set of sessions*, so the spread between two
disjoint random halves of one trace (`split_tolerance`) is computed exactly the way the
comparison of two traces (`compare`) is.

Statistics (quantiles p10 / p50 / p90 / p99 unless noted):

- `input`: input tokens of every request;
- `start_input`: input of each session's first request (resumed sessions start large);
- `growth`: input minus the previous step's input (the row named by `parent_id`), over
  steps that do not shrink; `compaction_share`: share of linked steps whose input shrinks,
  `compaction_ratio` (p10 / p50 / p90): their input after / before;
- `output`: output tokens of every request;
- `think_s`: `delay_s` of every closed-loop step (`after_id` >= 0);
- `requests_per_session`;
- `miss_ratio` (p10 / p50 / p90 over sessions, and `miss_ratio_all` token-weighted over all
  blocks): the share of a session's hash ids (at the trace's block size) not already sent
  earlier by the same session, i.e. 1 - the within-session ideal hit ratio;
- `subagent_session_share`, `subagent_row_share`: sessions that spawn sub-agents, rows that
  belong to a sub-agent. A sub-agent is a `parent_id` chain of a session other than the one
  holding the session's first row;
- `subagent_concurrency` (p50 / p90 over spawning sessions): the most of a session's chains
  open at once, a chain being open from its first to its last arrival.

A ratio is B / A; two zeros compare as 1. A statistic is *indistinguishable* when every one
of its ratios lies within [1 / f, f], f being its tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lmsim.workload.trace import Trace, chain_roots

QUANTILES = (10, 50, 90, 99)
SESSION_QUANTILES = (10, 50, 90)

# (statistic, quantiles or None for a scalar, label)
STATISTICS: tuple[tuple[str, tuple[int, ...] | None, str], ...] = (
    ("input", QUANTILES, "input tokens"),
    ("start_input", SESSION_QUANTILES, "session's first input"),
    ("growth", QUANTILES, "per-step context growth"),
    ("compaction_share", None, "steps that shrink"),
    ("compaction_ratio", SESSION_QUANTILES, "shrink: after / before"),
    ("output", QUANTILES, "output tokens"),
    ("think_s", QUANTILES, "think time (s)"),
    ("requests_per_session", QUANTILES, "requests per session"),
    ("miss_ratio", SESSION_QUANTILES, "within-session miss (1-hit), per session"),
    ("miss_ratio_all", None, "within-session miss (1-hit), all blocks"),
    ("subagent_session_share", None, "sessions with sub-agents"),
    ("subagent_row_share", None, "rows in sub-agents"),
    ("subagent_concurrency", (50, 90), "chains open at once (spawning sessions)"),
)

DEFAULT_SPLITS = 200
_ID_SPAN = np.int64(1) << np.int64(40)  # session * span + id stays in int64


@dataclass
class SessionSamples:
    """Per-session raw material of every statistic. Row-level values come with the index
    of their session so any subset of sessions can be evaluated without the trace."""

    num_sessions: int
    block_size: int
    values: dict[str, np.ndarray]  # statistic -> values
    owner: dict[str, np.ndarray]  # statistic -> session index of each value
    # per session: miss blocks, total blocks, rows, sub-agent rows, has sub-agent, linked
    # steps, shrinking steps
    per_session: dict[str, np.ndarray]


def _peak_overlap(starts: np.ndarray, ends: np.ndarray) -> int:
    """Most intervals [start, end] open at one instant (a start at an end counts as open)."""
    events = np.concatenate([np.stack([starts, np.zeros_like(starts)], 1),
                             np.stack([ends, np.ones_like(ends)], 1)])
    order = np.lexsort((events[:, 1], events[:, 0]))
    steps = np.where(events[order, 1] == 0, 1, -1)
    return int(np.cumsum(steps).max()) if len(steps) else 0


def session_samples(trace: Trace) -> SessionSamples:
    n = len(trace)
    raw_sess = trace.column("session_id")
    raw_sess = np.where(raw_sess >= 0, raw_sess, -1 - np.arange(n))  # no session: its own
    _, sess = np.unique(raw_sess, return_inverse=True)
    ns = int(sess.max()) + 1 if n else 0
    parent = trace.column("parent_id")
    after = trace.column("after_id")
    inp, out = trace.input_tokens, trace.output_tokens
    rows = np.arange(n)

    root = chain_roots(parent)
    first_row = np.full(ns, n, dtype=np.int64)
    np.minimum.at(first_row, sess, rows)
    main_root = root[first_row]
    in_sub = root != main_root[sess]

    linked = np.flatnonzero(parent >= 0)
    prev_in = inp[parent[linked]]
    shrink = inp[linked] < prev_in
    grow_rows = linked[~shrink]
    shrink_rows = linked[shrink]
    closed = np.flatnonzero(after >= 0)

    values = {
        "input": inp.astype(np.float64),
        "start_input": inp[first_row].astype(np.float64),
        "growth": (inp[grow_rows] - inp[parent[grow_rows]]).astype(np.float64),
        "compaction_ratio": inp[shrink_rows] / inp[parent[shrink_rows]],
        "output": out.astype(np.float64),
        "think_s": trace.column("delay_s")[closed],
    }
    owner = {
        "input": sess, "start_input": np.arange(ns), "growth": sess[grow_rows],
        "compaction_ratio": sess[shrink_rows], "output": sess, "think_s": sess[closed],
    }  # fmt: skip

    # within-session misses: an id is a miss the first time its session sends it, so a
    # session's misses are its distinct ids
    counts = np.diff(trace.hash_offsets)
    entry_sess = np.repeat(sess.astype(np.int64), counts)
    values_ = trace.hash_values
    if len(values_) and (values_.min() < 0 or values_.max() >= _ID_SPAN):
        _, values_ = np.unique(values_, return_inverse=True)
    # hash-based distinct (pandas) instead of a sort: traces hold 10^8 ids
    distinct = pd.unique(entry_sess * _ID_SPAN + values_)
    miss_blocks = np.bincount(distinct // _ID_SPAN, minlength=ns)
    total_blocks = np.bincount(entry_sess, minlength=ns)

    # sub-agents and their concurrency, per spawning session
    has_sub = np.bincount(sess[in_sub], minlength=ns) > 0
    conc_vals, conc_owner = [], []
    t = trace.arrival_s
    for s in np.flatnonzero(has_sub):
        mine = np.flatnonzero(sess == s)
        chains, inv = np.unique(root[mine], return_inverse=True)
        lo = np.full(len(chains), np.inf)
        hi = np.full(len(chains), -np.inf)
        np.minimum.at(lo, inv, t[mine])
        np.maximum.at(hi, inv, t[mine])
        conc_vals.append(_peak_overlap(lo, hi))
        conc_owner.append(s)
    values["subagent_concurrency"] = np.asarray(conc_vals, dtype=np.float64)
    owner["subagent_concurrency"] = np.asarray(conc_owner, dtype=np.int64)

    per_session = {
        "miss": miss_blocks, "blocks": total_blocks,
        "rows": np.bincount(sess, minlength=ns), "sub_rows": np.bincount(sess[in_sub], minlength=ns),
        "has_sub": has_sub.astype(np.int64),
        "linked": np.bincount(sess[linked], minlength=ns),
        "shrinks": np.bincount(sess[shrink_rows], minlength=ns),
    }  # fmt: skip
    return SessionSamples(ns, trace.block_size, values, owner, per_session)


def subset(samples: SessionSamples, mask: np.ndarray) -> SessionSamples:
    """The samples of the sessions in `mask` alone, renumbered (a held-out set of sessions
    to compare against, with `compare`)."""
    keep = np.flatnonzero(mask)
    renumber = np.full(samples.num_sessions, -1, dtype=np.int64)
    renumber[keep] = np.arange(len(keep))
    values = {k: v[mask[samples.owner[k]]] for k, v in samples.values.items()}
    owner = {k: renumber[v[mask[v]]] for k, v in samples.owner.items()}
    per_session = {k: v[mask] for k, v in samples.per_session.items()}
    return SessionSamples(len(keep), samples.block_size, values, owner, per_session)


def _share(num: float, den: float) -> float:
    return num / den if den else math.nan


def statistics(samples: SessionSamples, mask: np.ndarray | None = None) -> dict[str, float]:
    """Every statistic over the sessions in `mask` (all by default), as a flat dict
    `name` (scalars) or `name_pQ`."""
    if mask is None:
        mask = np.ones(samples.num_sessions, dtype=bool)
    out: dict[str, float] = {}
    ps = {k: v[mask] for k, v in samples.per_session.items()}
    miss_ratio = ps["miss"][ps["blocks"] > 0] / ps["blocks"][ps["blocks"] > 0]
    row_level = dict(samples.values)
    sel = {k: mask[samples.owner[k]] for k in row_level}
    row_level = {k: v[sel[k]] for k, v in row_level.items()}
    row_level["requests_per_session"] = ps["rows"].astype(np.float64)
    row_level["miss_ratio"] = miss_ratio
    scalars = {
        "compaction_share": _share(ps["shrinks"].sum(), ps["linked"].sum()),
        "miss_ratio_all": _share(ps["miss"].sum(), ps["blocks"].sum()),
        "subagent_session_share": _share(ps["has_sub"].sum(), len(ps["has_sub"])),
        "subagent_row_share": _share(ps["sub_rows"].sum(), ps["rows"].sum()),
    }
    for name, qs, _label in STATISTICS:
        if qs is None:
            out[name] = float(scalars[name])
            continue
        x = row_level[name]
        for q in qs:
            out[f"{name}_p{q}"] = float(np.percentile(x, q)) if len(x) else math.nan
    return out


def ratio(a: float, b: float) -> float:
    """b / a; equal zeros give 1, a zero against a non-zero gives inf, NaN stays NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == b:
        return 1.0
    if a == 0:
        return math.inf
    return b / a


def _deviation(r: float) -> float:
    """How far a ratio is from 1, as a factor >= 1 (inf for 0, inf or NaN)."""
    if math.isnan(r) or r <= 0 or math.isinf(r):
        return math.inf
    return max(r, 1.0 / r)


def split_tolerance(
    samples: SessionSamples, *, splits: int = DEFAULT_SPLITS, seed: int = 0, level: float = 100.0
) -> dict[str, float]:
    """Per key (`name` or `name_pQ`): the `level` percentile (100 = the maximum) over
    `splits` random disjoint halves H1, H2 of the sessions of the deviation factor of
    stat(H2) / stat(H1). A split where the statistic is undefined in a half (no sub-agent
    in it) counts as infinite; a key undefined in most splits stays infinite."""
    rng = np.random.default_rng(seed)
    ns = samples.num_sessions
    devs: dict[str, list[float]] = {}
    for _ in range(splits):
        perm = rng.permutation(ns)
        a = np.zeros(ns, dtype=bool)
        a[perm[: ns // 2]] = True
        b = np.zeros(ns, dtype=bool)
        b[perm[ns // 2 : 2 * (ns // 2)]] = True
        sa, sb = statistics(samples, a), statistics(samples, b)
        for k in sa:
            devs.setdefault(k, []).append(_deviation(ratio(sa[k], sb[k])))
    # nearest rank, not interpolation: deviations may be infinite
    pick = min(splits - 1, math.ceil(level / 100 * (splits - 1)))
    return {k: float(np.sort(np.asarray(v))[pick]) for k, v in devs.items()}


@dataclass
class Row:
    statistic: str
    key: str
    a: float
    b: float
    ratio: float
    tolerance: float

    @property
    def inside(self) -> bool:
        return _deviation(self.ratio) <= self.tolerance or self.ratio == 1.0


def compare(
    a: SessionSamples, b: SessionSamples, tolerance: dict[str, float]
) -> list[Row]:
    sa, sb = statistics(a), statistics(b)
    rows = []
    for name, qs, _label in STATISTICS:
        keys = [name] if qs is None else [f"{name}_p{q}" for q in qs]
        for k in keys:
            rows.append(Row(name, k, sa[k], sb[k], ratio(sa[k], sb[k]), tolerance.get(k, math.inf)))
    return rows


def verdicts(rows: list[Row]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for r in rows:
        out[r.statistic] = out.get(r.statistic, True) and r.inside
    return out


def _num(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "inf"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.4f}"


def format_comparison(rows: list[Row], name_a: str, name_b: str) -> str:
    labels = {name: label for name, _q, label in STATISTICS}
    ok = verdicts(rows)
    lines = [f"A = {name_a}", f"B = {name_b}",
             f"{'statistic':<48} {'A':>11} {'B':>11} {'B/A':>7} {'tol':>7}  verdict"]
    last = None
    for r in rows:
        label = labels[r.statistic] if r.statistic != last else ""
        q = r.key[len(r.statistic) + 1 :] if r.key != r.statistic else ""
        text = f"{label} {q}".strip() if label else f"  {q}"
        verdict = ("ok" if ok[r.statistic] else "DIFFERENT") if r.statistic != last else ""
        mark = "" if r.inside else " *"
        lines.append(f"{text:<48} {_num(r.a):>11} {_num(r.b):>11} {_num(r.ratio):>7} "
                     f"{_num(r.tolerance):>7}  {verdict}{mark}")
        last = r.statistic
    n_ok = sum(ok.values())
    lines.append(f"{n_ok} of {len(ok)} statistics indistinguishable "
                 "(* = ratio outside the tolerance)")
    return "\n".join(lines)
