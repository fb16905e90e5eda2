"""Profile files and the table-driven step-cost predictor.

A profile is a folder `profiles/<gpu>/<model>/` holding `profile.yaml` (hardware, model and
memory facts, scalar step costs, provenance, and the names of its tables) and four CSV tables:

* `tokens.csv`: `tokens,dense_s,moe_s`, GEMM and routed-expert time vs tokens in the step;
* `seqs.csv`: `seqs,lm_head_s,cpu_s`, logits and CPU/sampling time vs sequences in the step;
* `prefill_attention.csv`: a matrix, rows = chunk tokens q, columns = cached context c;
* `decode_attention.csv`: a matrix, rows = decodes in the step, columns = their summed KV
  length (sum of c_i + 1).

The first cell of a matrix file names its two axes (`chunk_tokens/cached_context`); the rest
of the first row is the column grid and the first column is the row grid. Grids must be
strictly increasing and every time finite and non-negative.

`TableCostModel` prices a step as
`fixed_s + tokens(T) + seqs(B) + cpu_per_token_s*T + decode_attention(B_d, C_d)
+ sum over chunks of prefill_attention(q, c)`, with T = total tokens and B = sequences
(a decode batch of mixed lengths is looked up at (C_d / M, C_d), M its longest KV length,
under the default `step.decode_batch: longest`; `lmsim.profile.decode_batch`); a
profile of an engine whose host work overlaps the GPU (`step.host_overlap: true`) takes
max(host, rest) with host = `cpu_s(B) + cpu_per_token_s*T` instead of the sum. It
reads only the tables, never the formula that generated them. Interpolation is piecewise
linear (bilinear in 2-D); below the first grid point the first value is held, beyond the last
the last segment is extended linearly. Run-time arithmetic is +, -, *, / only, so the scalar
path (`step_time`) and the vectorised one (`decode_run_times`) agree bit for bit.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import warnings
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmsim.errors import ProfileError
from lmsim.outputs import atomic_path, write_text
from lmsim.profile.decode_batch import DEFAULT_DECODE_BATCH
from lmsim.profile.schema import FORMAT, validate_meta

GIB = float(1 << 30)

TABLE_FILES = {
    "tokens": "tokens.csv",
    "seqs": "seqs.csv",
    "prefill_attention": "prefill_attention.csv",
    "decode_attention": "decode_attention.csv",
}
VECTOR_COLUMNS = {"tokens": ("tokens", "dense_s", "moe_s"), "seqs": ("seqs", "lm_head_s", "cpu_s")}
MATRIX_AXES = {
    "prefill_attention": ("chunk_tokens", "cached_context"),
    "decode_attention": ("batch", "total_context"),
}
@dataclass
class ProfileData:
    """Everything a profile holds, in memory; `TableCostModel` is built from it."""

    name: str
    meta: dict[str, Any]  # hardware, model, memory, step, provenance as in profile.yaml
    tokens: np.ndarray
    dense_s: np.ndarray
    moe_s: np.ndarray
    seqs: np.ndarray
    lm_head_s: np.ndarray
    cpu_s: np.ndarray
    pa_q: np.ndarray
    pa_c: np.ndarray
    pa: np.ndarray  # [len(pa_q), len(pa_c)]
    da_b: np.ndarray
    da_c: np.ndarray
    da: np.ndarray  # [len(da_b), len(da_c)]
    source: str = "<memory>"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fixed_s(self) -> float:
        return float(self.meta["step"]["fixed_s"])

    @property
    def cpu_per_token_s(self) -> float:
        return float(self.meta["step"]["cpu_per_token_s"])


# -- interpolation, shared by the scalar and the vectorised paths ---------------------------
def _lerp(xs: list[float], ys: list[float], x: float) -> float:
    if x < xs[0]:
        x = xs[0]
    i = bisect_right(xs, x) - 1
    if i > len(xs) - 2:
        i = len(xs) - 2
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    # ys[i]*(1-w) + ys[i+1]*w is exact at both grid points (w = 0 or exactly 1).
    return ys[i] * (1.0 - w) + ys[i + 1] * w


def _locate_vec(xs: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.maximum(x, xs[0])
    i = np.minimum(np.searchsorted(xs, x, side="right") - 1, len(xs) - 2)
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return i, w


def _locate(xs: list[float], x: float) -> tuple[int, float]:
    if x < xs[0]:
        x = xs[0]
    i = bisect_right(xs, x) - 1
    if i > len(xs) - 2:
        i = len(xs) - 2
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


def interp1(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Vectorised `_lerp`, for tools (plots, fits) that evaluate a table on many points."""
    i, w = _locate_vec(np.asarray(xs, float), np.asarray(x, float))
    return ys[i] * (1.0 - w) + ys[i + 1] * w


def interp2(xs: np.ndarray, ys: np.ndarray, z: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Vectorised bilinear interpolation of z[x, y] (same rule as the predictor)."""
    i, wx = _locate_vec(np.asarray(xs, float), np.asarray(x, float))
    j, wy = _locate_vec(np.asarray(ys, float), np.asarray(y, float))
    r0 = z[i, j] * (1.0 - wy) + z[i, j + 1] * wy
    r1 = z[i + 1, j] * (1.0 - wy) + z[i + 1, j + 1] * wy
    return r0 * (1.0 - wx) + r1 * wx


_SHORT_RUN = 6  # decode runs up to this many steps are priced step by step
_NUMPY_SPAN = 48  # a run's steps in one table cell priced with numpy from this many on
_MEMO_LIMIT = 1 << 16  # memoised 1-D lookups per table (a step has at most this many tokens)


def _cell_steps(base: float, cell: tuple[float, ...], context: int, longest: int, batch: int,
                num_steps: int) -> list[float]:
    """`num_steps` steps of a mixed decode run that all lie in one decode-table cell (a
    `TableCostModel._mixed_cell` polynomial), from KV lengths summing to `context` with the
    longest `longest`: `_mixed_decode_attention`'s arithmetic on each, plus `base`."""
    a0, b0, da, db, y0, dy = cell
    if num_steps < _NUMPY_SPAN:
        # A plain loop on floats: measured 1.5x faster than a comprehension over two integer
        # ranges (no zip, no int-to-float conversion in each product). Integer-valued floats
        # below 2^53 add exactly and an IEEE quotient of exact operands is the correctly rounded
        # one Python's int / int gives, so every value is the one `_mixed_decode_attention`
        # computes from the integers.
        out = []
        c, m, step = float(context), float(longest), float(batch)
        for _ in range(num_steps):
            out.append(base + ((a0 + b0 * c) + (da + db * c) * ((c / m - y0) / dy)))
            c += step
            m += 1.0
        return out
    # The same operations element-wise (IEEE float64, integers below 2^53 convert exactly, no
    # fused multiply-add): the same bits, at a fraction of the cost.
    c = np.arange(context, context + num_steps * batch, batch, dtype=np.int64)
    m = np.arange(longest, longest + num_steps, dtype=np.int64)
    return (base + ((a0 + b0 * c) + (da + db * c) * ((c / m - y0) / dy))).tolist()


class ProfileGridWarning(UserWarning):
    """A simulated step left the grid its profile was measured or tabulated on."""


class TableCostModel:
    """The step-cost predictor over a profile's tables (see the module docstring)."""

    def __init__(self, data: ProfileData) -> None:
        self.data = data
        self.name = data.name
        self._fixed = data.fixed_s
        self._cpt = data.cpu_per_token_s
        # Columns that share an axis are summed once here; the predictor never needs them apart.
        self._tok_x = data.tokens.astype(float)
        self._tok_y = (data.dense_s + data.moe_s).astype(float)
        self._seq_x = data.seqs.astype(float)
        self._seq_y = (data.lm_head_s + data.cpu_s).astype(float)
        self._tok_xl, self._tok_yl = self._tok_x.tolist(), self._tok_y.tolist()
        self._seq_xl, self._seq_yl = self._seq_x.tolist(), self._seq_y.tolist()
        # An engine that overlaps host work with the GPU (SGLang's overlap scheduler) pays the
        # larger of the two; vLLM v1 (the default) pays their sum on the fast path below.
        self._overlap = bool(data.meta["step"].get("host_overlap", False))
        # How a decode batch of mixed lengths is priced (lmsim.profile.decode_batch). The
        # engine passes the longest decode's KV length only to a model that says it prices it.
        self.decode_batch = str(data.meta["step"].get("decode_batch") or DEFAULT_DECODE_BATCH)
        self.prices_decode_longest = self.decode_batch == "longest"
        self._cpu_yl = data.cpu_s.astype(float).tolist()
        self._pa_q, self._pa_c = data.pa_q.astype(float).tolist(), data.pa_c.astype(float).tolist()
        self._pa = data.pa.astype(float).tolist()
        self._da_bx = data.da_b.astype(float)
        self._da_cx = data.da_c.astype(float)
        self._da_arr = data.da.astype(float)
        self._da_b, self._da_c = self._da_bx.tolist(), self._da_cx.tolist()
        self._da = self._da_arr.tolist()
        m = data.meta
        self._mem_gib = float(m["hardware"]["memory_gib"])
        self._weights = float(m["model"]["weight_bytes"])
        self._overhead_gib = float(m["memory"]["non_kv_overhead_gib"])
        self._kv_per_token = int(m["model"]["kv_bytes_per_token"])
        # The model's context window when the profile declares one (vLLM's default
        # max_model_len); None leaves prompt and output lengths unchecked.
        declared = m["model"].get("max_model_len")
        self.max_model_len = int(declared) if declared else None
        self._slot_tokens = int(m["memory"].get("kv_pool_slot_tokens") or 0)
        self._rows: dict[int, tuple[float, list[float], np.ndarray]] = {}
        self._mixed_cells: dict[tuple[int, int], tuple[float, float, float, float, float, float]] = {}
        # The decode table's row below batch b: bisect_right(batch grid, b) - 1, clamped. On an
        # all-integer grid (every shipped table) it depends only on floor(b), so a mixed
        # batch's fractional C/M finds its row by indexing instead of bisecting.
        last = len(self._da_b) - 2
        self._row_below = [max(0, min(bisect_right(self._da_b, n) - 1, last)) for n in range(int(self._da_b[-1]) + 1)] \
            if all(x == int(x) for x in self._da_b) and self._da_b[-1] <= 1 << 16 else None
        self._tok_memo: dict[int, float] = {}  # tokens -> _lerp over tokens.csv
        self._seq_memo: dict[int, float] = {}  # seqs -> _lerp over seqs.csv
        # The measured grid: (lowest, highest) of every axis a step is looked up on.
        self._bounds = {
            "tokens": (self._tok_xl[0], self._tok_xl[-1]),
            "seqs": (self._seq_xl[0], self._seq_xl[-1]),
            "decode batch": (self._da_b[0], self._da_b[-1]),
            "decode total context": (self._da_c[0], self._da_c[-1]),
            "prefill chunk tokens": (self._pa_q[0], self._pa_q[-1]),
            "prefill cached context": (self._pa_c[0], self._pa_c[-1]),
        }
        limits = m.get("limits") or {}
        # Where the data end inside the grid (a Vidur import's measured KV lengths): steps
        # beyond are priced by the tables' analytic extrapolation and counted as outside.
        self._ctx_limit = float(limits["decode_context_per_sequence"]) if limits.get(
            "decode_context_per_sequence") else math.inf
        self._kv_limit = float(limits["prefill_kv"]) if limits.get("prefill_kv") else math.inf
        self._warned_outside = False
        b = self._bounds
        self._flat_bounds = (
            *b["tokens"], *b["seqs"], *b["decode batch"], *b["decode total context"],
            *b["prefill chunk tokens"], *b["prefill cached context"],
        )

    def __repr__(self) -> str:
        return f"TableCostModel({self.name!r}, source={self.data.source!r})"

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies on a rank (sizes host/disk tier blocks and copies)."""
        return self._kv_per_token

    # -- components (scalar) ----------------------------------------------------------------
    def _decode_attention(self, batch: int, context: int) -> float:
        row = self._decode_row(batch)[1]
        j, wc = _locate(self._da_c, context)
        return row[j] * (1.0 - wc) + row[j + 1] * wc

    def _mixed_decode_attention(self, context: int, longest: int) -> float:
        """Decode attention of a batch whose KV lengths sum to `context` and whose longest is
        `longest`, under the `longest` form: the table at batch context/longest, bilinear
        (`_mixed_cell`'s form). Only for mixed batches (longest > context / batch); equal
        lengths take `step_time`'s row path."""
        bx, xs = self._da_b, self._da_c
        b = context / longest
        if b < bx[0]:
            b = bx[0]
        rows = self._row_below
        if rows is not None and b < len(rows):
            i = rows[int(b)]
        else:
            i = bisect_right(bx, b) - 1
            if i > len(bx) - 2:
                i = len(bx) - 2
        c = context if context >= xs[0] else xs[0]
        j = bisect_right(xs, c) - 1
        if j > len(xs) - 2:
            j = len(xs) - 2
        a0, b0, da, db, y0, dy = self._mixed_cells.get((i, j)) or self._mixed_cell(i, j)
        return (a0 + b0 * c) + (da + db * c) * ((b - y0) / dy)

    def _mixed_cell(self, i: int, j: int) -> tuple[float, float, float, float, float, float]:
        """Cell (i, j) of the decode table as a bilinear polynomial: along the context, the
        lower row is a0 + b0*c and the upper minus the lower da + db*c; across the batch, the
        weight is (b - y0)/dy. The same values as blending the four corners, in fewer
        operations, which matters in a run (`_mixed_run` prices every step with it)."""
        xs, bx, da = self._da_c, self._da_b, self._da
        x0, dx = xs[j], xs[j + 1] - xs[j]
        lo_slope = (da[i][j + 1] - da[i][j]) / dx
        hi_slope = (da[i + 1][j + 1] - da[i + 1][j]) / dx
        lo_at0 = da[i][j] - lo_slope * x0
        hi_at0 = da[i + 1][j] - hi_slope * x0
        cell = (lo_at0, lo_slope, hi_at0 - lo_at0, hi_slope - lo_slope, bx[i], bx[i + 1] - bx[i])
        self._mixed_cells[(i, j)] = cell
        return cell

    def _decode_attention_of(self, num_decodes: int, context: int, longest: int) -> float:
        if longest * num_decodes > context and self.prices_decode_longest:
            return self._mixed_decode_attention(context, longest)
        return self._decode_attention(num_decodes, context)

    def with_decode_batch(self, form: str) -> TableCostModel:
        """This profile with `step.decode_batch` set to `form` (`longest` or `mean`)."""
        from lmsim.profile.decode_batch import DECODE_BATCH_FORMS

        if form not in DECODE_BATCH_FORMS:
            raise ProfileError(f"{self.data.source}: decode_batch must be one of "
                               f"{', '.join(DECODE_BATCH_FORMS)}, got {form!r}")
        meta = dict(self.data.meta, step=dict(self.data.meta["step"], decode_batch=form))
        return TableCostModel(dataclasses.replace(self.data, meta=meta))

    def _prefill_attention(self, q: int, c: int) -> float:
        i, wq = _locate(self._pa_q, q)
        j, wc = _locate(self._pa_c, c)
        lo, hi = self._pa[i], self._pa[i + 1]
        r0 = lo[j] * (1.0 - wc) + lo[j + 1] * wc
        r1 = hi[j] * (1.0 - wc) + hi[j + 1] * wc
        return r0 * (1.0 - wq) + r1 * wq

    def _base(self, num_seqs: int, num_tokens: int) -> float:
        return (
            self._fixed
            + _lerp(self._tok_xl, self._tok_yl, num_tokens)
            + _lerp(self._seq_xl, self._seq_yl, num_seqs)
            + self._cpt * num_tokens
        )

    # -- StepCostModel ------------------------------------------------------------------------
    def step_time(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        num_decodes: int,
        decode_context_tokens: int,
        decode_longest: int = 0,
    ) -> float:
        """`decode_longest`: the longest decode's KV length (c_i + 1); 0 (unknown) prices
        the decodes as equal lengths."""
        # `_base`, `_decode_attention` and `_prefill_attention` inlined (the router prices
        # 16 steps per llmd decision): the same operations in the same order, so the same bits.
        # The 1-D lookups are memoised by their integer argument (batches repeat).
        if self._overlap:
            return self._overlapped_step(prefill_chunks, num_decodes, decode_context_tokens, decode_longest)
        seqs = num_decodes
        tokens = num_decodes
        for q, _ in prefill_chunks:
            seqs += 1
            tokens += q
        tok = self._tok_memo.get(tokens)
        if tok is None:
            tok = _lerp(self._tok_xl, self._tok_yl, tokens)
            if len(self._tok_memo) < _MEMO_LIMIT:
                self._tok_memo[tokens] = tok
        seq = self._seq_memo.get(seqs)
        if seq is None:
            seq = _lerp(self._seq_xl, self._seq_yl, seqs)
            if len(self._seq_memo) < _MEMO_LIMIT:
                self._seq_memo[seqs] = seq
        t = self._fixed + tok
        t = t + seq + self._cpt * tokens
        if decode_longest * num_decodes > decode_context_tokens and self.prices_decode_longest:
            t = t + self._mixed_decode_attention(decode_context_tokens, decode_longest)
        elif num_decodes:
            row = (self._rows.get(num_decodes) or self._decode_row(num_decodes))[1]
            xs = self._da_c
            x = decode_context_tokens if decode_context_tokens >= xs[0] else xs[0]
            j = bisect_right(xs, x) - 1
            if j > len(xs) - 2:
                j = len(xs) - 2
            wc = (x - xs[j]) / (xs[j + 1] - xs[j])
            t = t + (row[j] * (1.0 - wc) + row[j + 1] * wc)
        if prefill_chunks:
            pq, pc, pa = self._pa_q, self._pa_c, self._pa
            q_last, c_last = len(pq) - 2, len(pc) - 2
            for q, c in prefill_chunks:
                x = q if q >= pq[0] else pq[0]
                i = bisect_right(pq, x) - 1
                if i > q_last:
                    i = q_last
                wq = (x - pq[i]) / (pq[i + 1] - pq[i])
                x = c if c >= pc[0] else pc[0]
                j = bisect_right(pc, x) - 1
                if j > c_last:
                    j = c_last
                wc = (x - pc[j]) / (pc[j + 1] - pc[j])
                lo, hi = pa[i], pa[i + 1]
                r0 = lo[j] * (1.0 - wc) + lo[j + 1] * wc
                r1 = hi[j] * (1.0 - wc) + hi[j + 1] * wc
                t = t + (r0 * (1.0 - wq) + r1 * wq)
        return float(t)

    def _overlapped_step(
        self, prefill_chunks: Sequence[tuple[int, int]], num_decodes: int, decode_context_tokens: int,
        decode_longest: int = 0,
    ) -> float:
        """max(host, GPU) for a `host_overlap` profile: the components' sum split into the host
        part (`cpu_s(B) + cpu_per_token_s*T`) and the rest."""
        seqs = num_decodes + len(prefill_chunks)
        tokens = num_decodes + sum(q for q, _ in prefill_chunks)
        parts = self.components(prefill_chunks, num_decodes, decode_context_tokens, decode_longest)
        host = _lerp(self._seq_xl, self._cpu_yl, seqs) + self._cpt * tokens
        total = parts["fixed"] + parts["tokens"] + parts["seqs"] + parts["decode_attention"] + parts["prefill_attention"]
        gpu = total - host
        return float(host if host > gpu else gpu)

    def _decode_row(self, num_decodes: int) -> tuple[float, list[float], np.ndarray]:
        """The step's fixed part and the decode-attention row blended at batch `num_decodes`
        (as a list and an array), cached: a run's steps share their batch size. Each entry is
        computed with exactly the operations `_decode_attention` uses, so reading it gives
        the same bits."""
        cached = self._rows.get(num_decodes)
        if cached is None:
            base = self._base(num_decodes, num_decodes)
            i, wb = _locate(self._da_b, num_decodes)
            lo, hi = self._da[i], self._da[i + 1]
            row = [lo[j] * (1.0 - wb) + hi[j] * wb for j in range(len(lo))]
            cached = (base, row, np.array(row))
            if len(self._rows) < 4096:
                self._rows[num_decodes] = cached
        return cached

    def decode_run_times(
        self, num_decodes: int, first_context_tokens: int, num_steps: int, first_longest: int = 0
    ) -> np.ndarray:
        # Same operations in the same order as step_time((), B, C0 + k*B, M0 + k), element-wise.
        return np.array(self.decode_run_durations(num_decodes, first_context_tokens, num_steps, first_longest))

    def decode_run_durations(
        self, num_decodes: int, first_context_tokens: int, num_steps: int, first_longest: int = 0
    ) -> list[float]:
        """`decode_run_times` as a list of floats, the engine's form, without numpy (whose
        per-call cost dominated runs of a few dozen steps; the vectorised form is kept in the
        tests as the reference). The context grows by `num_decodes` per step, so the steps
        fall into the grid's segments in order: a short run is priced step by step, a long
        one prices each segment's steps in one comprehension over a `range` (measured 2.5x
        slower than step by step for 1-2 steps, faster from ~7, 1.3x at 33), or with numpy
        from `_NUMPY_SPAN` steps on (a lone decode's runs, hundreds of steps in one segment:
        coder/lmetric's 881 run calls 25.8 -> 9.1 ms). The arithmetic is `_decode_attention`'s,
        so the bits are step_time's.

        `first_longest` is the longest decode's KV length in the first step (0: unknown); every
        length grows by one a step, so a mixed batch stays mixed and is priced step by step."""
        if self._overlap:
            # Priced step by step so a fast-forwarded run keeps step_time's bits.
            return [self.step_time((), num_decodes, first_context_tokens + k * num_decodes,
                                   first_longest + k if first_longest else 0)
                    for k in range(num_steps)]
        if num_decodes == 0:
            return [float(self._base(0, 0))] * num_steps
        if first_longest * num_decodes > first_context_tokens and self.prices_decode_longest:
            return self._mixed_run(num_decodes, first_context_tokens, first_longest, num_steps)
        base, row, _ = self._decode_row(num_decodes)
        xs = self._da_c
        last = len(xs) - 2
        x = first_context_tokens
        if num_steps <= _SHORT_RUN:
            out = []
            for _ in range(num_steps):
                c = x if x >= xs[0] else xs[0]
                j = bisect_right(xs, c) - 1
                if j > last:
                    j = last
                wc = (c - xs[j]) / (xs[j + 1] - xs[j])
                out.append(base + (row[j] * (1.0 - wc) + row[j + 1] * wc))
                x += num_decodes
            return out
        end = x + num_decodes * num_steps
        out = []
        if x < xs[0]:
            # Below the grid the context is held at its first point (an integer x is below
            # a float bound b exactly when x < ceil(b)).
            below = len(range(x, min(end, math.ceil(xs[0])), num_decodes))
            wc = (xs[0] - xs[0]) / (xs[1] - xs[0])
            out = [base + (row[0] * (1.0 - wc) + row[1] * wc)] * below
            x += below * num_decodes
        while x < end:
            j = bisect_right(xs, x) - 1
            if j > last:
                j = last
            lo, r0, r1 = xs[j], row[j], row[j + 1]
            span = xs[j + 1] - lo
            steps = range(x, end if j == last else min(end, math.ceil(xs[j + 1])), num_decodes)
            if len(steps) < _NUMPY_SPAN:
                out += [base + (r0 * (1.0 - (wc := (c - lo) / span)) + r1 * wc) for c in steps]
            else:  # the same operations element-wise, as in `_cell_steps`
                wc = (np.arange(x, steps.stop, num_decodes, dtype=np.int64) - lo) / span
                out += (base + (r0 * (1.0 - wc) + r1 * wc)).tolist()
            x += len(steps) * num_decodes
        return out

    def _mixed_run(self, num_decodes: int, context: int, longest: int, num_steps: int) -> list[float]:
        """`_mixed_decode_attention` over a run, plus the batch's fixed part, with
        `_mixed_decode_attention`'s arithmetic (so step_time's bits). Both lookup points only
        grow: the context by B a step, the batch C/M too ((C + B)/(M + 1) > C/M exactly when
        B M > C, the batch being mixed, and rounding keeps the order). So the run falls into
        the table's cells in order, and each cell's steps are priced at once (`_cell_steps`);
        a cell ends where the context reaches the next column (integer arithmetic) or the
        batch the next row (estimated, then settled on the rounded quotient itself). The
        reference, each step priced on its own, is in tests/test_mixed_run_fast.py."""
        base = (self._rows.get(num_decodes) or self._decode_row(num_decodes))[0]
        bx, xs = self._da_b, self._da_c
        q = context / longest
        if q < bx[0] or context < xs[0]:  # held below the grid: step by step
            return [base + self._mixed_decode_attention(context + k * num_decodes, longest + k)
                    for k in range(num_steps)]
        b = num_decodes
        i_last, j_last = len(bx) - 2, len(xs) - 2
        rows = self._row_below
        if rows is not None and q < len(rows):
            i = rows[int(q)]
        else:
            i = bisect_right(bx, q) - 1
            if i > i_last:
                i = i_last
        j = bisect_right(xs, float(context)) - 1  # the same index; float comparisons are faster
        if j > j_last:
            j = j_last
        cells = self._mixed_cells
        # Most runs (93% on chatbot/vllm) never leave their first cell, and since both lookup
        # points only grow, the last step in the first cell says so: one division, then the
        # cell's steps at once, without the walk's bookkeeping.
        last_c = context + (num_steps - 1) * b
        if (j == j_last or last_c < xs[j + 1]) and (i == i_last or last_c / (longest + num_steps - 1) < bx[i + 1]):
            return _cell_steps(base, cells.get((i, j)) or self._mixed_cell(i, j), context, longest, b, num_steps)
        out = []
        k = 0
        while k < num_steps:
            c, m = context + k * b, longest + k
            while i < i_last and c / m >= bx[i + 1]:
                i += 1
            while j < j_last and c >= xs[j + 1]:
                j += 1
            stop = num_steps
            if j < j_last:
                stop = min(stop, k - (-(math.ceil(xs[j + 1]) - c) // b))
            if i < i_last and bx[i + 1] < b:
                row = bx[i + 1]
                guess = math.ceil((row * longest - context) / (b - row))
                kb = min(max(guess, k + 1), stop)
                while kb > k + 1 and (context + (kb - 1) * b) / (longest + kb - 1) >= row:
                    kb -= 1
                while kb < stop and (context + kb * b) / (longest + kb) < row:
                    kb += 1
                stop = kb
            out += _cell_steps(base, cells.get((i, j)) or self._mixed_cell(i, j), c, m, b, stop - k)
            k = stop
        return out

    def host_time(self, num_seqs: int, num_tokens: int) -> float:
        """The host part of `step_time` (`StepCostModel.host_time`): the `cpu_s` column of
        seqs.csv at `num_seqs` plus `cpu_per_token_s * num_tokens`, both already in
        `step_time`'s `seqs(B)` and per-token terms. A `host_overlap` profile's step is
        already max(host, GPU), so no host part is left to overlap: 0."""
        if self._overlap:
            return 0.0
        cpu = self.__dict__.get("_cpu_yl")
        if cpu is None:
            cpu = self.__dict__["_cpu_yl"] = self.data.cpu_s.astype(float).tolist()
        return _lerp(self._seq_xl, cpu, num_seqs) + self._cpt * num_tokens

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float) -> int | None:
        pool = gpu_memory_utilization * self._mem_gib * GIB - self._weights - self._overhead_gib * GIB
        if self._slot_tokens:
            # Vidur's planner: whole max-length request slots, each of slot // block blocks
            # (vidur/scheduler/replica_scheduler/base_replica_scheduler.py, __init__).
            tokens = max(0, int(pool // self._kv_per_token))
            return (self._slot_tokens // block_size) * (tokens // self._slot_tokens)
        return max(0, int(pool // (block_size * self._kv_per_token)))

    # -- the measured grid ------------------------------------------------------------------
    def outside_grid(
        self, prefill_chunks: Sequence[tuple[int, int]], num_decodes: int, decode_context_tokens: int
    ) -> str | None:
        """The first axis on which this step leaves the profile's grid (its time is then held
        flat below the grid or extrapolated linearly above it), or None."""
        seqs = num_decodes + len(prefill_chunks)
        tokens = num_decodes + sum(q for q, _ in prefill_chunks)
        values = [("tokens", tokens), ("seqs", seqs)]
        if num_decodes:
            values += [("decode batch", num_decodes), ("decode total context", decode_context_tokens)]
        for q, c in prefill_chunks:
            values += [("prefill chunk tokens", q), ("prefill cached context", c)]
        for axis, x in values:
            lo, hi = self._bounds[axis]
            if x < lo or x > hi:
                return f"{axis} {x:g} outside [{lo:g}, {hi:g}]"
        if num_decodes and decode_context_tokens > num_decodes * self._ctx_limit:
            return (f"decode context per sequence {decode_context_tokens / num_decodes:g} beyond the "
                    f"measured {self._ctx_limit:g}")
        for q, c in prefill_chunks:
            if q + c > self._kv_limit:
                return f"prefill KV length {q + c:g} beyond the measured {self._kv_limit:g}"
        return None

    def _decode_run_outside(self, batch: int, context0: int, num_steps: int) -> int:
        for axis in ("tokens", "seqs", "decode batch"):
            lo, hi = self._bounds[axis]
            if batch < lo or batch > hi:
                return num_steps
        lo, hi = self._bounds["decode total context"]
        hi = min(hi, batch * self._ctx_limit)
        # Step k attends to context0 + k * batch tokens.
        below = min(num_steps, max(0, -(-(int(lo) - context0) // batch)))
        inside_to = (hi - context0) // batch  # last k inside from above
        above = num_steps - max(0, min(num_steps, int(inside_to) + 1)) if inside_to >= 0 else num_steps
        return min(num_steps, below + above)

    def _inside_grid(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        num_decodes: int,
        decode_context_tokens: int,
        num_steps: int,
    ) -> bool:
        """The engine's per-commit check in its common case: every looked-up value inside the
        grid (then `steps_outside_grid` is 0). Plain comparisons against the bounds; any
        doubt falls back to the full count."""
        t_lo, t_hi, s_lo, s_hi, b_lo, b_hi, c_lo, c_hi, q_lo, q_hi, k_lo, k_hi = self._flat_bounds
        if not prefill_chunks:
            last = decode_context_tokens + num_decodes * (num_steps - 1)
            return (
                t_lo <= num_decodes <= t_hi and s_lo <= num_decodes <= s_hi
                and b_lo <= num_decodes <= b_hi
                and c_lo <= decode_context_tokens and last <= c_hi
                and last <= num_decodes * self._ctx_limit
            )
        tokens = num_decodes
        for q, c in prefill_chunks:
            if not (q_lo <= q <= q_hi and k_lo <= c <= k_hi and q + c <= self._kv_limit):
                return False
            tokens += q
        seqs = num_decodes + len(prefill_chunks)
        if not (t_lo <= tokens <= t_hi and s_lo <= seqs <= s_hi):
            return False
        return not num_decodes or (
            b_lo <= num_decodes <= b_hi and c_lo <= decode_context_tokens <= c_hi
            and decode_context_tokens <= num_decodes * self._ctx_limit
        )

    def steps_outside_grid(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        num_decodes: int,
        decode_context_tokens: int,
        num_steps: int = 1,
    ) -> int:
        """How many of `num_steps` steps (the first priced as `step_time(prefill_chunks,
        num_decodes, decode_context_tokens)`, later ones with each decode's context one token
        longer, as in `decode_run_times`) leave the grid. Warns once per profile."""
        if not prefill_chunks and not num_decodes:
            return 0
        if self._inside_grid(prefill_chunks, num_decodes, decode_context_tokens, num_steps):
            return 0
        first = self.outside_grid(prefill_chunks, num_decodes, decode_context_tokens)
        if num_steps <= 1 or prefill_chunks or not num_decodes:
            count = 1 if first else 0
        else:
            count = self._decode_run_outside(num_decodes, decode_context_tokens, num_steps)
            if count and first is None:
                last = decode_context_tokens + num_decodes * (num_steps - 1)
                first = self.outside_grid((), num_decodes, last)
        if count and not self._warned_outside:
            self._warned_outside = True
            warnings.warn(
                f"profile {self.name}: a step lies outside the profile's grid ({first}); its time is "
                "extrapolated. Such steps are counted in summary.json as outside_grid_steps.",
                ProfileGridWarning,
                stacklevel=2,
            )
        return count

    # -- conveniences for tools -----------------------------------------------------------
    def components(
        self, prefill_chunks: Sequence[tuple[int, int]], num_decodes: int, decode_context_tokens: int,
        decode_longest: int = 0,
    ) -> dict[str, float]:
        """The step split into the profile's components (used by `fit` and `show`)."""
        seqs = num_decodes + len(prefill_chunks)
        tokens = num_decodes + sum(q for q, _ in prefill_chunks)
        return {
            "fixed": self._fixed,
            "tokens": _lerp(self._tok_xl, self._tok_yl, tokens) + self._cpt * tokens,
            "seqs": _lerp(self._seq_xl, self._seq_yl, seqs),
            "decode_attention": self._decode_attention_of(num_decodes, decode_context_tokens, decode_longest)
            if num_decodes else 0.0,
            "prefill_attention": sum(self._prefill_attention(q, c) for q, c in prefill_chunks),
        }


# -- reading ------------------------------------------------------------------------------
def _known_profiles() -> list[str]:
    from lmsim.shipped import PROFILES_DIR

    return sorted(
        str(p.parent.relative_to(PROFILES_DIR)) for p in PROFILES_DIR.glob("*/*/profile.yaml")
    )


def _display(path: Path) -> str:
    from lmsim.shipped import PROFILES_DIR

    try:
        return str(path.resolve().relative_to(PROFILES_DIR.parent))
    except ValueError:
        return str(path)


def resolve_profile(name_or_path: str | Path) -> Path:
    """Path of a profile's `profile.yaml`: an existing file or folder, else a name under profiles/."""
    from lmsim.shipped import PROFILES_DIR

    p = Path(name_or_path)
    if p.is_dir():
        p = p / "profile.yaml"
    if p.is_file():
        return p.resolve()
    candidate = PROFILES_DIR / str(name_or_path) / "profile.yaml"
    if candidate.is_file():
        return candidate.resolve()
    raise ProfileError(
        f"{_display(candidate)}: unknown profile {str(name_or_path)!r} "
        f"(known: {', '.join(_known_profiles()) or 'none'})"
    )


def _check_grid(where: str, axis: str, grid: np.ndarray) -> None:
    if grid.size < 2:
        raise ProfileError(f"{where}: grid {axis!r} needs at least 2 points")
    bad = np.flatnonzero(np.diff(grid) <= 0)
    if bad.size:
        k = int(bad[0])
        raise ProfileError(
            f"{where}: grid {axis!r} is not strictly increasing ({grid[k]:g} then {grid[k + 1]:g})"
        )
    if grid[0] < 0:
        raise ProfileError(f"{where}: grid {axis!r} has a negative value {grid[0]:g}")


def _check_times(where: str, column: str, values: np.ndarray) -> None:
    if not np.all(np.isfinite(values)):
        raise ProfileError(f"{where}: {column!r} has a non-finite time")
    if np.any(values < 0):
        raise ProfileError(f"{where}: {column!r} has a negative time {float(values.min()):g}")


def _read_rows(path: Path) -> list[list[str]]:
    try:
        with path.open(newline="") as fh:
            return [row for row in csv.reader(fh) if row and not row[0].startswith("#")]
    except OSError as exc:
        raise ProfileError(f"{_display(path)}: cannot read table ({exc.strerror})") from None


def _floats(where: str, cells: list[str]) -> np.ndarray:
    try:
        return np.array([float(x) for x in cells])
    except ValueError as exc:
        raise ProfileError(f"{where}: {exc}") from None


def read_vector_table(path: Path, kind: str) -> dict[str, np.ndarray]:
    where = _display(path)
    rows = _read_rows(path)
    if not rows:
        raise ProfileError(f"{where}: empty table")
    header = [h.strip() for h in rows[0]]
    out: dict[str, np.ndarray] = {}
    for col in VECTOR_COLUMNS[kind]:
        if col not in header:
            raise ProfileError(f"{where}: missing column {col!r} (have: {', '.join(header)})")
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ProfileError(f"{where}: line {n} has {len(row)} cells, header has {len(header)}")
    body = [_floats(f"{where}: line {n}", row) for n, row in enumerate(rows[1:], start=2)]
    if not body:
        raise ProfileError(f"{where}: table has no rows")
    mat = np.vstack(body)
    for col in VECTOR_COLUMNS[kind]:
        out[col] = mat[:, header.index(col)]
    axis = VECTOR_COLUMNS[kind][0]
    _check_grid(where, axis, out[axis])
    for col in VECTOR_COLUMNS[kind][1:]:
        _check_times(where, col, out[col])
    return out


def read_matrix_table(path: Path, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    where = _display(path)
    rows = _read_rows(path)
    row_axis, col_axis = MATRIX_AXES[kind]
    if len(rows) < 3:
        raise ProfileError(f"{where}: matrix needs a header row and at least 2 rows")
    cols = _floats(f"{where}: header ({col_axis})", rows[0][1:])
    grid_rows, body = [], []
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(rows[0]):
            raise ProfileError(f"{where}: line {n} has {len(row)} cells, header has {len(rows[0])}")
        vals = _floats(f"{where}: line {n}", row)
        grid_rows.append(vals[0])
        body.append(vals[1:])
    rgrid = np.array(grid_rows)
    _check_grid(where, row_axis, rgrid)
    _check_grid(where, col_axis, cols)
    z = np.vstack(body)
    _check_times(where, kind, z)
    return rgrid, cols, z


def _read_meta(path: Path, where: str) -> Any:
    """profile.yaml parsed; invalid YAML is one ProfileError naming the file and line."""
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        at = f" at line {line + 1}" if line is not None else ""
        raise ProfileError(f"{where}: invalid YAML{at}") from None


def read_profile(name_or_path: str | Path) -> ProfileData:
    path = resolve_profile(name_or_path)
    where = _display(path)
    meta = _read_meta(path, where)
    problems = validate_meta(meta)
    if problems:
        raise ProfileError(f"{where}: {problems[0]}")
    base = path.parent
    files = {k: base / str(meta["tables"][k]) for k in TABLE_FILES}
    tok = read_vector_table(files["tokens"], "tokens")
    seq = read_vector_table(files["seqs"], "seqs")
    pa_q, pa_c, pa = read_matrix_table(files["prefill_attention"], "prefill_attention")
    da_b, da_c, da = read_matrix_table(files["decode_attention"], "decode_attention")
    name = str(meta.get("name") or f"{base.parent.name}/{base.name}")
    return ProfileData(
        name=name, meta=meta, tokens=tok["tokens"], dense_s=tok["dense_s"], moe_s=tok["moe_s"],
        seqs=seq["seqs"], lm_head_s=seq["lm_head_s"], cpu_s=seq["cpu_s"],
        pa_q=pa_q, pa_c=pa_c, pa=pa, da_b=da_b, da_c=da_c, da=da, source=where,
    )


def validate_profile(name_or_path: str | Path) -> list[str]:
    """Every problem with a profile, one line each naming the file (`lmsim profile validate`):
    the strict schema check of profile.yaml (`lmsim.profile.schema`), then each table."""
    path = resolve_profile(name_or_path)
    where = _display(path)
    try:
        meta = _read_meta(path, where)
    except ProfileError as exc:
        return [str(exc)]
    problems = [f"{where}: {p}" for p in validate_meta(meta, strict=True)]
    tables = meta.get("tables") if isinstance(meta, dict) else None
    if not isinstance(tables, dict):
        return problems
    for kind in TABLE_FILES:
        if not isinstance(tables.get(kind), str):
            continue
        file = path.parent / tables[kind]
        try:
            if kind in VECTOR_COLUMNS:
                read_vector_table(file, kind)
            else:
                read_matrix_table(file, kind)
        except ProfileError as exc:
            problems.append(str(exc))
    return problems


@functools.lru_cache(maxsize=32)
def _load_resolved(path: str, mtime_ns: int) -> TableCostModel:
    return TableCostModel(read_profile(path))


def load_table_profile(name_or_path: str | Path) -> TableCostModel:
    path = resolve_profile(name_or_path)
    return _load_resolved(str(path), path.stat().st_mtime_ns)


# -- writing ------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return repr(float(x)) if x != int(x) or abs(x) >= 1e15 else str(int(x))


def is_profile_dir(path: Path) -> bool:
    """A folder `write_profile` wrote: its profile.yaml declares this format."""
    try:
        meta = yaml.safe_load((path / "profile.yaml").read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def write_profile(data: ProfileData, out_dir: Path) -> Path:
    """Write profile.yaml and its four CSV tables into out_dir (created if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(data.meta)
    meta["format"] = FORMAT
    meta["name"] = data.name
    meta["tables"] = dict(TABLE_FILES)
    ordered = {k: meta[k] for k in ("format", "name", "hardware", "parallel", "model", "memory", "step", "limits",
                                     "tables", "provenance") if k in meta}
    ordered.update({k: v for k, v in meta.items() if k not in ordered})
    text = yaml.safe_dump(ordered, sort_keys=False, width=100, allow_unicode=True, default_flow_style=None)
    write_text(out_dir / "profile.yaml", text)

    def g(x: float) -> str:  # 9 significant digits keeps tables within 1e-8 of the source
        return f"{x:.9g}"

    with atomic_path(out_dir / TABLE_FILES["tokens"]) as tmp, tmp.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(VECTOR_COLUMNS["tokens"])
        for x, a, b in zip(data.tokens, data.dense_s, data.moe_s):
            w.writerow([_fmt(x), g(a), g(b)])
    with atomic_path(out_dir / TABLE_FILES["seqs"]) as tmp, tmp.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(VECTOR_COLUMNS["seqs"])
        for x, a, b in zip(data.seqs, data.lm_head_s, data.cpu_s):
            w.writerow([_fmt(x), g(a), g(b)])
    for kind, (rg, cg, z) in {
        "prefill_attention": (data.pa_q, data.pa_c, data.pa),
        "decode_attention": (data.da_b, data.da_c, data.da),
    }.items():
        with atomic_path(out_dir / TABLE_FILES[kind]) as tmp, tmp.open("w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(["/".join(MATRIX_AXES[kind]), *(_fmt(c) for c in cg)])
            for r, row in zip(rg, z):
                w.writerow([_fmt(r), *(g(v) for v in row)])
    return out_dir / "profile.yaml"
