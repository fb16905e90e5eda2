"""Trace statistics: every metric of `docs/traces.md` §2, computed with numpy only.

`trace_stats(trace)` returns a flat dict; keys (all plain floats/ints, NaN when undefined):

- `requests`, `span_s` (last - first arrival), `rate_mean_per_s` (requests / span),
  `rate_per_min_{mean,p50,peak,min,cv}` over full 60 s bins from the first arrival (the
  last partial bin is dropped; with no full bin they are NaN), `busiest_1s`;
- `input_{mean,p50,p90,p99,max}`, `input_share_gt_32k` (>= 32,768, which reproduces §3.1), `output_{mean,p50,p90,p99,max}`;
- `block_size`, `blocks_total`, `blocks_distinct`;
- `ideal_hit_ratio`: share of all hash-id entries already seen in an earlier request;
  `prefix_hit_ratio`: the same counting only each request's leading run of seen blocks;
  `prefix_hit_token_share`: hit blocks x block size, capped at the input, over all input
  tokens; `hit_beyond_first_block`: prefix hits minus position-0 hits, over all blocks;
  `prefix_hit_blocks_{p50,p90,p99}` per request; `requests_with_hit_share`;
- `continuation_share`: requests containing the second-to-last block of an earlier
  request with >= 3 blocks;
- `continuations_linked`, `continuations_inferred`, `continuations_refused`: rows whose
  continuation (the row whose prompt names their output blocks in the engine,
  `trace.find_continuations`) is linked by `after_id`/`parent_id`, guessed by prefix
  extension, or not guessed because the extension was ambiguous (a shared prefix);
- `prefix_d{1,2,8,16}_{distinct,top1_share,top10_share}` over requests with >= d blocks,
  shares relative to all requests;
- `reuse_gap_{p50,p80,p90,p99}_s` between consecutive accesses of one block,
  `reuse_within_{10,600}s_share`, `top10pct_block_reuse_share`.

Requests in the same timestamp count as ordered by row (file order), as in the replay.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lmsim.workload.trace import Trace, find_continuations

DEPTHS = (1, 2, 8, 16)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else math.nan


def _row_of_entries(trace: Trace) -> np.ndarray:
    counts = np.diff(trace.hash_offsets)
    return np.repeat(np.arange(len(trace), dtype=np.int64), counts)


def _first_row_of_value(values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each entry, the first row containing its value, plus the inverse index."""
    _uniq, first_idx, inverse = np.unique(values, return_index=True, return_inverse=True)
    return rows[first_idx][inverse], inverse


def trace_stats(trace: Trace) -> dict[str, Any]:
    n = len(trace)
    s: dict[str, Any] = {"requests": n}
    arr = trace.arrival_s
    t0 = float(arr[0]) if n else 0.0
    span = float(arr[-1] - arr[0]) if n else 0.0
    s["span_s"] = span
    s["rate_mean_per_s"] = n / span if span > 0 else math.nan
    full_bins = int(span // 60)
    if full_bins >= 1:
        counts = np.bincount(((arr - t0) // 60).astype(np.int64), minlength=full_bins + 1)
        counts = counts[:full_bins]
        s["rate_per_min_mean"] = float(counts.mean())
        s["rate_per_min_p50"] = float(np.median(counts))
        s["rate_per_min_peak"] = int(counts.max())
        s["rate_per_min_min"] = int(counts.min())
        s["rate_per_min_cv"] = float(counts.std() / counts.mean()) if counts.mean() else math.nan
    else:
        for k in ("mean", "p50", "peak", "min", "cv"):
            s[f"rate_per_min_{k}"] = math.nan
    s["busiest_1s"] = int(np.bincount(((arr - t0) // 1).astype(np.int64)).max()) if n else 0

    for name, col in (("input", trace.input_tokens), ("output", trace.output_tokens)):
        s[f"{name}_mean"] = float(col.mean()) if n else math.nan
        for q in (50, 90, 99):
            s[f"{name}_p{q}"] = _pct(col, q)
        s[f"{name}_max"] = int(col.max()) if n else 0
    s["input_share_gt_32k"] = float((trace.input_tokens >= 32768).mean()) if n else math.nan

    s.update(_block_stats(trace))
    found = find_continuations(trace)
    s["continuations_linked"] = found.linked
    s["continuations_inferred"] = found.inferred
    s["continuations_refused"] = found.refused
    return s


def _block_stats(trace: Trace) -> dict[str, Any]:
    n = len(trace)
    values = trace.hash_values
    offsets = trace.hash_offsets
    counts = np.diff(offsets)
    total = len(values)
    s: dict[str, Any] = {"block_size": trace.block_size, "blocks_total": total}
    nan_keys = [
        "ideal_hit_ratio", "prefix_hit_ratio", "prefix_hit_token_share",
        "hit_beyond_first_block", "prefix_hit_blocks_p50", "prefix_hit_blocks_p90",
        "prefix_hit_blocks_p99", "requests_with_hit_share", "continuation_share",
        "reuse_gap_p50_s", "reuse_gap_p80_s", "reuse_gap_p90_s", "reuse_gap_p99_s",
        "reuse_within_10s_share", "reuse_within_600s_share", "top10pct_block_reuse_share",
    ]  # fmt: skip
    if total == 0:
        s["blocks_distinct"] = 0
        s.update(dict.fromkeys(nan_keys, math.nan))
        for d in DEPTHS:
            s[f"prefix_d{d}_distinct"] = 0
            s[f"prefix_d{d}_top1_share"] = math.nan
            s[f"prefix_d{d}_top10_share"] = math.nan
        return s

    rows = _row_of_entries(trace)
    first_row, inverse = _first_row_of_value(values, rows)
    hit = first_row < rows
    s["blocks_distinct"] = int(inverse.max()) + 1
    s["ideal_hit_ratio"] = float(hit.mean())

    # leading run of hits: position of the first miss in each row (or the row length)
    pos = np.arange(total, dtype=np.int64) - offsets[rows]
    miss_pos = np.where(hit, np.iinfo(np.int64).max, pos)
    nonempty = counts > 0
    first_miss = np.full(n, 0, dtype=np.int64)
    first_miss[nonempty] = np.minimum.reduceat(miss_pos, offsets[:-1][nonempty])
    run = np.minimum(first_miss, counts)
    s["prefix_hit_ratio"] = float(run.sum() / total)
    hit_tokens = np.minimum(run * trace.block_size, trace.input_tokens)
    s["prefix_hit_token_share"] = float(hit_tokens.sum() / trace.input_tokens.sum())
    s["hit_beyond_first_block"] = float(np.maximum(run - 1, 0).sum() / total)
    for q in (50, 90, 99):
        s[f"prefix_hit_blocks_p{q}"] = _pct(run, q)
    s["requests_with_hit_share"] = float((run > 0).mean())

    # continuation: an entry equal to the second-to-last id of an earlier >= 3-block row
    long_rows = np.flatnonzero(counts >= 3)
    marks = values[offsets[long_rows + 1] - 2]
    if len(marks):
        order = np.lexsort((long_rows, marks))
        m_sorted, r_sorted = marks[order], long_rows[order]
        uniq_m, first = np.unique(m_sorted, return_index=True)
        earliest = r_sorted[first]
        p = np.clip(np.searchsorted(uniq_m, values), 0, len(uniq_m) - 1)
        cont_entry = (uniq_m[p] == values) & (earliest[p] < rows)
        s["continuation_share"] = float(np.bincount(rows[cont_entry], minlength=n).astype(bool).mean())
    else:
        s["continuation_share"] = 0.0

    for d in DEPTHS:
        have = np.flatnonzero(counts >= d)
        key = values[offsets[have] + d - 1]
        if len(key):
            _, c = np.unique(key, return_counts=True)
            c = np.sort(c)[::-1]
            s[f"prefix_d{d}_distinct"] = len(c)
            s[f"prefix_d{d}_top1_share"] = float(c[0] / n)
            s[f"prefix_d{d}_top10_share"] = float(c[:10].sum() / n)
        else:
            s[f"prefix_d{d}_distinct"] = 0
            s[f"prefix_d{d}_top1_share"] = 0.0
            s[f"prefix_d{d}_top10_share"] = 0.0

    # reuse gaps: consecutive accesses of one block (entries sorted by block, then row)
    order = np.argsort(inverse, kind="stable")
    inv_sorted = inverse[order]
    t_sorted = trace.arrival_s[rows[order]]
    same = inv_sorted[1:] == inv_sorted[:-1]
    gaps = (t_sorted[1:] - t_sorted[:-1])[same]
    for q in (50, 80, 90, 99):
        s[f"reuse_gap_p{q}_s"] = _pct(gaps, q)
    s["reuse_within_10s_share"] = float((gaps <= 10).mean()) if len(gaps) else math.nan
    s["reuse_within_600s_share"] = float((gaps <= 600).mean()) if len(gaps) else math.nan
    reaccess = np.bincount(inverse) - 1
    if reaccess.sum() > 0:
        k = max(1, math.ceil(0.1 * len(reaccess)))
        top = np.sort(reaccess)[::-1][:k]
        s["top10pct_block_reuse_share"] = float(top.sum() / reaccess.sum())
    else:
        s["top10pct_block_reuse_share"] = math.nan
    return s


_SECTIONS: list[tuple[str, list[tuple[str, str]]]] = [
    ("Volume", [("requests", "requests"), ("span_s", "span (s)"), ("rate_mean_per_s", "mean rate (req/s)"),
                ("rate_per_min_mean", "per minute: mean"), ("rate_per_min_p50", "per minute: p50"),
                ("rate_per_min_peak", "per minute: peak"), ("rate_per_min_min", "per minute: min"),
                ("rate_per_min_cv", "per minute: CV"), ("busiest_1s", "busiest 1 s")]),
    ("Lengths (tokens)", [(f"{c}_{k}", f"{c} {k}") for c in ("input", "output")
                          for k in ("mean", "p50", "p90", "p99", "max")]
     + [("input_share_gt_32k", "share of inputs > 32K")]),
    ("Prefix reuse", [("block_size", "block size"), ("blocks_total", "blocks total"),
                      ("blocks_distinct", "blocks distinct"), ("ideal_hit_ratio", "ideal hit ratio"),
                      ("prefix_hit_ratio", "prefix hit ratio"),
                      ("prefix_hit_token_share", "prefix hit, token-weighted"),
                      ("hit_beyond_first_block", "hit beyond first block"),
                      ("prefix_hit_blocks_p50", "prefix hit blocks p50"),
                      ("prefix_hit_blocks_p90", "prefix hit blocks p90"),
                      ("prefix_hit_blocks_p99", "prefix hit blocks p99"),
                      ("requests_with_hit_share", "requests with any hit"),
                      ("continuation_share", "continuation requests")]),
    ("Continuations (output blocks named by a later row)",
     [("continuations_linked", "linked (after_id, parent_id)"),
      ("continuations_inferred", "guessed by prefix extension"),
      ("continuations_refused", "refused as ambiguous")]),
    ("Prefix popularity", [(f"prefix_d{d}_{k}", f"depth {d}: {k.replace('_', ' ')}")
                           for d in DEPTHS for k in ("distinct", "top1_share", "top10_share")]),
    ("Reuse gaps", [(f"reuse_gap_p{q}_s", f"reuse gap p{q} (s)") for q in (50, 80, 90, 99)]
     + [("reuse_within_10s_share", "reuses within 10 s"),
        ("reuse_within_600s_share", "reuses within 600 s"),
        ("top10pct_block_reuse_share", "top-10 % block reuse share")]),
]  # fmt: skip


def _fmt(v: Any) -> str:
    if isinstance(v, int | np.integer):
        return f"{int(v):,}"
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    v = float(v)
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:,.2f}"
    return f"{v:.3f}"


def format_stats(stats: dict[str, Any]) -> str:
    """A readable two-column table, grouped as in traces.md §2."""
    lines: list[str] = []
    width = max(len(label) for _, items in _SECTIONS for _, label in items)
    for title, items in _SECTIONS:
        lines.append(title)
        for key, label in items:
            if key in stats:
                lines.append(f"  {label:<{width}}  {_fmt(stats[key]):>12}")
    return "\n".join(lines)
