"""Fitting a profile's tables to measured engine steps (`lmsim profile fit`).

Measurements are one CSV row per engine step with the columns
`prefill_tokens,cached_context,decode_count,decode_context,step_s`: at most one prefill chunk
(`prefill_tokens` new tokens over `cached_context` cached ones; 0 if the step had none),
`decode_count` decodes whose KV lengths (c_i + 1) sum to `decode_context`, and the measured
step time in seconds.

The fit keeps the base profile's shapes and learns a smooth multiplicative correction per
component: a scalar for the fixed cost, and a piecewise-linear curve in log(x) for the token
tables (x = tokens in the step), the sequence tables (x = sequences), prefill attention
(x = q + c, the chunk's KV length, which sets the attention regime) and decode attention
(x = summed decode context). The corrections come from one linear least-squares solve on
relative errors, pulled gently towards 1 so that components the measurements do not exercise
stay as they were. The corrected tables are then made monotone along every axis.
"""

from __future__ import annotations

import csv
import datetime
from dataclasses import replace
from pathlib import Path

import numpy as np

from lmsim.errors import ProfileError
from lmsim.profile.tables import ProfileData, TableCostModel, interp1, interp2

COLUMNS = ("prefill_tokens", "cached_context", "decode_count", "decode_context", "step_s")
COMPONENTS = ("fixed", "tokens", "seqs", "prefill_attention", "decode_attention")
KNOTS = 8
RIDGE = 1e-3  # pull towards "no correction"
SMOOTH = 1e-2  # penalty on second differences between neighbouring knots


def read_measurements(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    try:
        fh = path.open(newline="")
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read measurements ({exc.strerror})") from None
    with fh:
        reader = csv.DictReader(row for row in fh if row.strip() and not row.startswith("#"))
        header = reader.fieldnames or []
        for col in COLUMNS:
            if col not in header:
                raise ProfileError(f"{path}: missing column {col!r} (need: {', '.join(COLUMNS)})")
        values: dict[str, list[float]] = {c: [] for c in COLUMNS}
        for n, row in enumerate(reader, start=2):
            for col in COLUMNS:
                try:
                    v = float(row[col])
                except (TypeError, ValueError):
                    raise ProfileError(f"{path}: line {n} column {col!r}: not a number ({row[col]!r})") from None
                if not np.isfinite(v) or v < 0:
                    raise ProfileError(f"{path}: line {n} column {col!r}: must be a finite number >= 0")
                values[col].append(v)
    out = {c: np.array(v) for c, v in values.items()}
    if out["step_s"].size == 0:
        raise ProfileError(f"{path}: no measurement rows")
    if np.any(out["step_s"] <= 0):
        raise ProfileError(f"{path}: column 'step_s' must be > 0")
    if np.any((out["prefill_tokens"] == 0) & (out["decode_count"] == 0)):
        raise ProfileError(f"{path}: a row has neither prefill tokens nor decodes")
    return out


def component_values(model: TableCostModel, m: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each measured step split into the profile's components (seconds), vectorised."""
    d = model.data
    q, c = m["prefill_tokens"], m["cached_context"]
    b, ctx = m["decode_count"], m["decode_context"]
    has_chunk = q > 0
    seqs = b + has_chunk
    tokens = b + q
    da = np.where(b > 0, interp2(d.da_b, d.da_c, d.da, b, ctx), 0.0)
    pa = np.where(has_chunk, interp2(d.pa_q, d.pa_c, d.pa, q, c), 0.0)
    return {
        "fixed": np.full(q.shape, d.fixed_s),
        "tokens": interp1(d.tokens, d.dense_s + d.moe_s, tokens),
        "seqs": interp1(d.seqs, d.lm_head_s + d.cpu_s, seqs),
        "prefill_attention": pa,
        "decode_attention": da,
        "_offset": d.cpu_per_token_s * tokens,
    }


def _axes(m: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    q, b = m["prefill_tokens"], m["decode_count"]
    return {
        "tokens": b + q,
        "seqs": b + (q > 0),
        "prefill_attention": q + m["cached_context"],
        "decode_attention": m["decode_context"],
    }


def _hats(knots: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Hat-function basis in log(x); held constant beyond the outer knots."""
    lx = np.log(np.clip(x, knots[0], knots[-1]))
    lk = np.log(knots)
    basis = np.zeros((x.size, knots.size))
    if knots.size == 1:
        basis[:, 0] = 1.0
        return basis
    i = np.clip(np.searchsorted(lk, lx, side="right") - 1, 0, knots.size - 2)
    w = (lx - lk[i]) / (lk[i + 1] - lk[i])
    rows = np.arange(x.size)
    basis[rows, i] = 1.0 - w
    basis[rows, i + 1] += w
    return basis


def _knots(x: np.ndarray) -> np.ndarray:
    x = x[x > 0]
    if x.size == 0:
        return np.array([1.0])
    lo, hi = float(np.quantile(x, 0.01)), float(np.quantile(x, 0.99))
    if hi <= lo * 1.05:
        return np.array([max(lo, 1.0)])
    return np.unique(np.geomspace(max(lo, 1.0), hi, KNOTS))


def fit_corrections(model: TableCostModel, m: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Knots and fitted multipliers per component (`fixed` has a single knot)."""
    comps = component_values(model, m)
    axes = _axes(m)
    y = m["step_s"]
    blocks, layout = [], {}
    col = 0
    for name in COMPONENTS:
        base = comps[name]
        if not np.any(base > 0):
            continue
        if name == "fixed":
            knots, basis = np.array([1.0]), np.ones((y.size, 1))
        else:
            knots = _knots(axes[name][base > 0])
            basis = _hats(knots, np.maximum(axes[name], 1.0))
        blocks.append(basis * base[:, None])
        layout[name] = (knots, slice(col, col + knots.size))
        col += knots.size
    a = np.hstack(blocks) / y[:, None]
    rhs = (y - comps["_offset"]) / y
    # Regularisation rows: ridge towards 1, and smoothness between neighbouring knots.
    reg_a, reg_b = [np.sqrt(RIDGE) * np.eye(col)], [np.sqrt(RIDGE) * np.ones(col)]
    for knots, sl in layout.values():
        for k in range(knots.size - 2):
            row = np.zeros(col)
            row[sl.start + k: sl.start + k + 3] = (1.0, -2.0, 1.0)
            reg_a.append(np.sqrt(SMOOTH) * row[None, :])
            reg_b.append(np.zeros(1))
    theta, *_ = np.linalg.lstsq(np.vstack([a, *reg_a]), np.concatenate([rhs, *reg_b]), rcond=None)
    theta = np.clip(theta, 0.05, None)
    return {name: (knots, theta[sl]) for name, (knots, sl) in layout.items()}


def _correction(corr: dict, name: str, x: np.ndarray) -> np.ndarray:
    if name not in corr:
        return np.ones_like(np.asarray(x, float))
    knots, theta = corr[name]
    return _hats(knots, np.maximum(np.asarray(x, float).ravel(), 1.0)) @ theta


def _monotone(z: np.ndarray, axes: tuple[int, ...] = (0, 1)) -> np.ndarray:
    for axis in axes:
        if axis < z.ndim:
            z = np.maximum.accumulate(z, axis=axis)
    return z


def apply_corrections(data: ProfileData, corr: dict, name: str) -> ProfileData:
    tok = _correction(corr, "tokens", data.tokens)
    seq = _correction(corr, "seqs", data.seqs)
    qq, cc = np.meshgrid(data.pa_q, data.pa_c, indexing="ij")
    pa = data.pa * _correction(corr, "prefill_attention", qq + cc).reshape(qq.shape)
    _bb, tc = np.meshgrid(data.da_b, data.da_c, indexing="ij")
    da = data.da * _correction(corr, "decode_attention", tc).reshape(tc.shape)
    meta = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.meta.items()}
    meta["step"] = dict(meta["step"], fixed_s=float(data.fixed_s * _correction(corr, "fixed", np.ones(1))[0]))
    return replace(
        data, name=name, meta=meta,
        dense_s=_monotone(data.dense_s * tok), moe_s=_monotone(data.moe_s * tok),
        lm_head_s=_monotone(data.lm_head_s * seq), cpu_s=_monotone(data.cpu_s * seq),
        pa=_monotone(pa),
        # At a fixed summed context fewer, longer sequences cost more (the engine's small-batch
        # KV term), so the decode table is monotone along the context axis only.
        da=_monotone(da, axes=(1,)), source="<fit>",
    )


def predict(model: TableCostModel, m: dict[str, np.ndarray]) -> np.ndarray:
    comps = component_values(model, m)
    return sum(comps[c] for c in COMPONENTS) + comps["_offset"]


def error_stats(pred: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    rel = np.abs(pred / measured - 1.0)
    return {
        "rows": int(measured.size),
        "median_abs_rel_err": round(float(np.median(rel)), 5),
        "p90_abs_rel_err": round(float(np.quantile(rel, 0.9)), 5),
        "max_abs_rel_err": round(float(rel.max()), 5),
        "mean_rel_bias": round(float(np.mean(pred / measured - 1.0)), 5),
    }


def fit_profile(base: TableCostModel, measurements_path: str | Path, name: str) -> tuple[ProfileData, dict]:
    """The base profile refitted to the measurements, and a report of the fit error."""
    m = read_measurements(measurements_path)
    corr = fit_corrections(base, m)
    data = apply_corrections(base.data, corr, name)
    fitted = TableCostModel(data)
    report = {
        "base": error_stats(predict(base, m), m["step_s"]),
        "fitted": error_stats(predict(fitted, m), m["step_s"]),
        "corrections": {
            k: {"knots": [round(float(x), 3) for x in kn], "multipliers": [round(float(t), 4) for t in th]}
            for k, (kn, th) in corr.items()
        },
    }
    # Where the measurements end: beyond, the tables are the base's shapes under the edge
    # correction (held), so those steps count as outside the grid.
    per_seq = m["decode_context"][m["decode_count"] > 0] / m["decode_count"][m["decode_count"] > 0]
    kv = (m["prefill_tokens"] + m["cached_context"])[m["prefill_tokens"] > 0]
    limits = dict(data.meta.get("limits") or {})
    if per_seq.size:
        limits["decode_context_per_sequence"] = int(np.ceil(per_seq.max()))
    if kv.size:
        limits["prefill_kv"] = int(kv.max())
    if limits:
        data.meta["limits"] = limits
    prov = dict(data.meta.get("provenance", {}))
    data.meta["provenance"] = {
        "generated_by": f"lmsim profile fit {Path(measurements_path).name} --base {base.name}",
        "date": datetime.date.today().isoformat(),
        "base_profile": base.name,
        "base_provenance": {k: prov[k] for k in ("generated_by", "date") if k in prov},
        "measurements": str(measurements_path),
        "method": "per-component multiplicative corrections, piecewise linear in log(x), "
                  "least squares on relative error (lmsim.profile.fit)",
        "fit_error": {"base": report["base"], "fitted": report["fitted"]},
        "corrections": report["corrections"],
    }
    return data, report
