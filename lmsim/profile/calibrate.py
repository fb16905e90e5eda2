"""Fitting the form's per-GPU constants to the fit split of the public measurements
(`lmsim profile calibrate`, a developer command).

Each kernel group is fitted on its own kernel rows of one GPU (`fit` split only, see
`measurements.py`): the least-squares solution of log(predicted / measured) over the group's
constants, by a deterministic Nelder-Mead search in log-parameter space (numpy only). The
groups and what they fit:

* `gemm` (kernel_gemm, kernel_layer_gemms): gemm_mfu, weight_stream_eff, gemm_launch_s and,
  for the smooth form, roofline_n;
* `prefill` (kernel_prefill_attention): attn_mfu, attn_half_kv, prefill_chunk_s;
* `decode` (kernel_decode_attention): kv_read_eff, attn_launch_per_layer_s, decode_head_s;
* `moe` (kernel_moe): moe_mfu, moe_half_rows, moe_launch_s.

A GPU without rows for a group borrows the group's constants from its nearest relative
(`BORROW`: H800 is H100 silicon, H200 is H100 compute), recorded in the output. Then the
engine-level constants (per-layer kernels, the small-batch engine KV term) are fitted on the
end-to-end rows of every GPU together, with each GPU's kernel constants fixed, because they
describe the serving engine, not the GPU.

Constants are physically meaningful by construction: an efficiency per kernel group per GPU,
a launch cost, a saturation length. No row gets its own parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lmsim.profile.analytic import Efficiency, Kernels
from lmsim.profile.hardware import load_gpu
from lmsim.profile.measurements import Checker, Measurement

GROUPS = {
    "gemm": ("kernel_gemm", "kernel_layer_gemms"),
    "prefill": ("kernel_prefill_attention",),
    "decode": ("kernel_decode_attention",),
    "moe": ("kernel_moe",),
}
# (name, initial value, lower, upper); fitted in log space inside the bounds.
PARAMS: dict[str, list[tuple[str, float, float, float]]] = {
    "gemm": [("gemm_mfu", 0.8, 0.2, 1.0), ("weight_stream_eff", 0.75, 0.2, 1.0),
             ("gemm_launch_s", 3e-6, 1e-7, 3e-5), ("roofline_n", 2.0, 1.0, 12.0)],
    "prefill": [("attn_mfu", 0.7, 0.1, 1.0), ("attn_half_kv", 500.0, 1.0, 20000.0),
                ("prefill_chunk_s", 5e-6, 1e-7, 5e-5)],
    "decode": [("kv_read_eff", 0.85, 0.3, 1.0), ("attn_launch_per_layer_s", 10e-6, 1e-7, 5e-5),
               ("decode_head_s", 10e-9, 1e-11, 1e-6)],
    "moe": [("moe_mfu", 0.6, 0.05, 1.0), ("moe_half_rows", 16.0, 0.5, 2000.0),
            ("moe_launch_s", 10e-6, 1e-7, 2e-4)],
}
BORROW = {"h800": ("h100",), "h200": ("h100",), "h20": ("h100",), "a100": (), "l40s": (), "h100": ("h200",)}


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, *, step: float = 0.3,
                iters: int = 600, tol: float = 1e-10) -> np.ndarray:
    """Minimise f from x0 (deterministic: fixed initial simplex, standard coefficients)."""
    n = len(x0)
    simplex = [np.array(x0, float)] + [np.array(x0, float) + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values, kind="stable")
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


@dataclass
class GroupFit:
    gpu: str
    group: str
    rows: int
    values: dict[str, float]
    rms_log: float
    borrowed_from: str | None = None


def _log_errors(eff: Efficiency, gpu: str, rows: Sequence[Measurement], checker: Checker) -> np.ndarray:
    kernels = Kernels(load_gpu(gpu), eff)
    checker._kernels[gpu] = kernels
    out = []
    for r in rows:
        p = checker.predict(r)
        out.append(math.log(p.predicted / r.measured) if p.predicted and p.predicted > 0 else 5.0)
    return np.array(out)


def fit_group(gpu: str, group: str, rows: Sequence[Measurement], base: Efficiency,
              *, smooth: bool = True, checker: Checker | None = None) -> GroupFit:
    """The group's constants minimising the RMS log ratio over `rows` (fit split)."""
    checker = checker or Checker()
    params = [p for p in PARAMS[group] if smooth or p[0] != "roofline_n"]
    lo = np.log([p[2] for p in params])
    hi = np.log([p[3] for p in params])

    def eff_at(x: np.ndarray) -> Efficiency:
        vals = np.exp(np.clip(x, lo, hi))
        return replace(base, **{p[0]: float(v) for p, v in zip(params, vals)})

    def cost(x: np.ndarray) -> float:
        err = _log_errors(eff_at(x), gpu, rows, checker)
        penalty = float(np.sum(np.maximum(lo - x, 0) ** 2 + np.maximum(x - hi, 0) ** 2))
        return float(np.mean(err ** 2)) + penalty

    x0 = np.log([getattr(base, p[0]) if getattr(base, p[0], None) else p[1] for p in params])
    x = x0
    for _ in range(3):  # restarts from the best point shake the simplex out of flat valleys
        x = nelder_mead(cost, x)
    best = eff_at(x)
    rms = float(np.sqrt(np.mean(_log_errors(best, gpu, rows, checker) ** 2)))
    return GroupFit(gpu, group, len(rows), {p[0]: float(getattr(best, p[0])) for p in params}, rms)


def calibrate(rows: Sequence[Measurement], gpus: Sequence[str], *, smooth: bool = True,
              base: Efficiency | None = None) -> dict[str, Any]:
    """Every GPU's fitted constants (fit rows only), with what each group was fitted on."""
    base = base or Efficiency()
    fit_rows = [r for r in rows if r.split == "fit"]
    fits: dict[str, dict[str, GroupFit]] = {g: {} for g in gpus}
    for gpu in gpus:
        for group, kinds in GROUPS.items():
            mine = [r for r in fit_rows if r.gpu == gpu and r.kind in kinds]
            if len(mine) >= 3:
                fits[gpu][group] = fit_group(gpu, group, mine, base, smooth=smooth)
    for gpu in gpus:
        for group in GROUPS:
            if group in fits[gpu]:
                continue
            donor = next((d for d in BORROW.get(gpu, ()) if group in fits.get(d, {})), None)
            if donor is not None:
                g = fits[donor][group]
                fits[gpu][group] = GroupFit(gpu, group, 0, dict(g.values), g.rms_log, borrowed_from=donor)
    return fits
