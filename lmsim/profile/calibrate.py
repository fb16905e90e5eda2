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
* `moe` (kernel_moe): moe_mfu, moe_half_rows, moe_launch_s, moe_stream_eff.

A GPU without rows for a group borrows the group's constants from its nearest relative
(`BORROW`: H800 is H100 silicon, H200 is H100 compute, the RTX 5090 a GDDR7 PCIe card like
the L40S), recorded in the output. Then the engine-level constants (per-layer kernels, the
small-batch engine KV term) are fitted on the end-to-end rows of every GPU together, with
each GPU's kernel constants fixed, because they describe the serving engine, not the GPU.
A GPU with no kernel rows of its own (every kernel group borrowed: the RTX 5090) stays out
of that shared fit, which would otherwise spend its rows on another card's kernel errors;
its end-to-end rows fit only its own BF16 GEMM efficiencies afterwards, with the engine
constants held (`late_engine_gpus`).

Constants are physically meaningful by construction: an efficiency per kernel group per GPU,
a launch cost, a saturation length. No row gets its own parameter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lmsim.profile.analytic import Efficiency, Kernels
from lmsim.profile.hardware import load_gpu
from lmsim.profile.measurements import Checker, Measurement

# group: (kinds, dtypes fitted); FP8 rows (DeepGEMM) get their own GEMM constants and do not
# calibrate the BF16 kernels lmsim serves with.
GROUPS = {
    "gemm": (("kernel_gemm", "kernel_layer_gemms"), ("bf16", "fp16")),
    "gemm_fp8": (("kernel_gemm", "kernel_layer_gemms"), ("fp8",)),
    "prefill": (("kernel_prefill_attention",), ("bf16", "fp16")),
    "decode": (("kernel_decode_attention",), ("bf16", "fp16")),
    "moe": (("kernel_moe",), ("bf16", "fp16")),
    "moe_fp8": (("kernel_moe",), ("fp8",)),
}
# (name, initial value, lower, upper); fitted in log space inside the bounds.
PARAMS: dict[str, list[tuple[str, float, float, float]]] = {
    "gemm": [("gemm_mfu", 0.8, 0.2, 1.0), ("weight_stream_eff", 0.75, 0.2, 1.0),
             ("gemm_launch_s", 3e-6, 1e-7, 3e-5), ("roofline_n", 2.0, 1.0, 12.0)],
    "gemm_fp8": [("gemm_mfu_fp8", 0.8, 0.2, 1.0), ("weight_stream_eff_fp8", 0.6, 0.2, 1.0),
                 ("gemm_launch_fp8_s", 3e-6, 1e-7, 3e-5)],
    "prefill": [("attn_mfu", 0.7, 0.1, 1.0), ("attn_half_kv", 500.0, 1.0, 20000.0),
                ("prefill_chunk_s", 5e-6, 1e-7, 5e-5)],
    "decode": [("kv_read_eff", 0.85, 0.3, 1.0), ("attn_launch_per_layer_s", 10e-6, 1e-7, 5e-5),
               ("decode_head_s", 10e-9, 1e-11, 1e-6)],
    "moe": [("moe_mfu", 0.6, 0.05, 1.0), ("moe_half_rows", 16.0, 1.0, 5000.0),
            ("moe_launch_s", 10e-6, 1e-7, 2e-4), ("moe_stream_eff", 0.75, 0.2, 1.0)],
    "moe_fp8": [("moe_mfu_fp8", 0.6, 0.05, 1.0)],
}
# Forms measured and not adopted, kept so the comparison can be rerun
# (benchmarks/fp8_gemm_heldout.py; profiles/README.md "Which form won").
ALTERNATIVES: dict[str, list[tuple[str, float, float, float]]] = {
    "gemm_fp8": [("roofline_n_fp8", 2.0, 1.0, 12.0)],
}
# The RTX 5090 has no public kernel micro-benchmark; the L40S is the shipped card nearest in
# kind (GDDR, PCIe, no NVLink, a consumer-class AD102 die; the 5090 is its GB202 successor).
BORROW = {"h800": ("h100",), "h200": ("h100",), "h100": ("h200",), "l40s": ("a100",), "rtx5090": ("l40s",)}
# BF16 kernel groups a GPU has no kernel rows for, fitted on the engine rows instead.
ENGINE_FITTED_GROUPS = {"gemm": [("gemm_mfu", 0.8, 0.2, 1.0), ("weight_stream_eff", 0.75, 0.2, 1.0)]}


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


ROBUST_SCALE = 0.1  # log-ratio errors beyond ~10% count linearly, not quadratically


def robust_loss(log_errors: np.ndarray) -> float:
    """Soft-L1 (pseudo-Huber) on log ratios: a row a published number cannot be reconciled
    with (a benchmark artefact, an engine quirk) pulls the constants no harder than a few
    ordinary rows."""
    d = ROBUST_SCALE
    return float(np.mean(d * d * (np.sqrt(1.0 + (log_errors / d) ** 2) - 1.0)))


@dataclass
class GroupFit:
    gpu: str
    group: str
    rows: int
    values: dict[str, float]
    rms_log: float
    borrowed_from: str | None = None


@functools.cache
def _gpu(key: str):
    return load_gpu(key)


def _log_errors(eff: Efficiency, gpu: str, rows: Sequence[Measurement], checker: Checker) -> np.ndarray:
    kernels = Kernels(_gpu(gpu), eff)
    checker._kernels[gpu] = kernels
    out = []
    for r in rows:
        p = checker.predict(r)
        out.append(math.log(p.predicted / r.measured) if p.predicted and p.predicted > 0 else 5.0)
    return np.array(out)


def fit_group(gpu: str, group: str, rows: Sequence[Measurement], base: Efficiency,
              *, smooth: bool = True, checker: Checker | None = None,
              only: tuple[str, ...] | None = None,
              extra: Sequence[tuple[str, float, float, float]] = ()) -> GroupFit:
    """The group's constants (or those named in `only`), plus `extra` ones (an alternative
    form's, `ALTERNATIVES`), minimising the robust log-ratio loss over `rows` (fit split),
    from `base`'s values."""
    checker = checker or Checker()
    params = [p for p in [*PARAMS[group], *extra]
              if (smooth or not p[0].startswith("roofline_n")) and (only is None or p[0] in only)]
    if group == "prefill":
        layouts = {checker.engine_of(r).prefill_kv_layout for r in rows}
        if layouts == {"paged", "dense"}:  # the dense gain is identified only by both kinds of rows
            params.append(("attn_dense_gain", 1.2, 0.5, 2.0))
    lo = np.log([p[2] for p in params])
    hi = np.log([p[3] for p in params])

    def eff_at(x: np.ndarray) -> Efficiency:
        vals = np.exp(np.clip(x, lo, hi))
        return replace(base, **{p[0]: float(v) for p, v in zip(params, vals)})

    def cost(x: np.ndarray) -> float:
        err = _log_errors(eff_at(x), gpu, rows, checker)
        penalty = float(np.sum(np.maximum(lo - x, 0) ** 2 + np.maximum(x - hi, 0) ** 2))
        return robust_loss(err) + penalty

    x0 = np.log([getattr(base, p[0]) if getattr(base, p[0], None) else p[1] for p in params])
    x = x0
    for _ in range(3):  # restarts from the best point shake the simplex out of flat valleys
        x = nelder_mead(cost, x)
    best = eff_at(x)
    rms = float(np.sqrt(np.mean(_log_errors(best, gpu, rows, checker) ** 2)))
    return GroupFit(gpu, group, len(rows), {p[0]: float(getattr(best, p[0])) for p in params}, rms)


KV_TABLE_BATCH = (1.0, 16.0, 256.0)
KV_TABLE_CONTEXT = (4096.0, 32768.0, 131072.0)
KV_TABLE_RIDGE = 0.01  # pull on log(multiplier) towards 1 where rows say little
KV_TABLE_MIN_ROWS = 6  # a KV-head count gets its own plane from this many fit rows


def fit_kv_table(gpu: str, rows: Sequence[Measurement], base: Efficiency,
                 checker: Checker | None = None) -> tuple[dict[str, Any], float]:
    """Decode-kernel efficiency multipliers on a (KV heads x batch x per-sequence context)
    grid: one (batch x context) plane, log-bilinear between knots and held beyond them, per
    KV-head count with at least KV_TABLE_MIN_ROWS rows (fitted on those rows alone, after the
    decode constants); between head counts the planes interpolate linearly, and a head count
    outside them gets no multiplier (`Kernels.kv_kernel_eff`). The head axis carries the
    layout: FlashInfer runs 32q/8kv on CUDA cores and 32q/4kv on tensor cores, and their
    efficiencies differ, so one layout's plane says nothing about another's."""
    checker = checker or Checker()
    n = len(KV_TABLE_BATCH) * len(KV_TABLE_CONTEXT)
    counts = sorted({r.get("kv_heads") for r in rows})
    heads = [h for h in counts if sum(r.get("kv_heads") == h for r in rows) >= KV_TABLE_MIN_ROWS] or [None]

    def table(planes: list[np.ndarray]) -> Efficiency:
        vals = tuple(tuple(tuple(float(v) for v in row) for row in
                           np.exp(np.clip(x, -1.0, 1.0)).reshape(len(KV_TABLE_BATCH), len(KV_TABLE_CONTEXT)))
                     for x in planes)
        return replace(base, kv_eff_heads=tuple(float(h or 1) for h in heads), kv_eff_batch=KV_TABLE_BATCH,
                       kv_eff_context=KV_TABLE_CONTEXT, kv_eff_values=vals)

    planes = [np.zeros(n) for _ in heads]
    for i, h in enumerate(heads):
        mine = [r for r in rows if h is None or r.get("kv_heads") == h]

        def cost(x: np.ndarray, i: int = i, mine: list = mine) -> float:
            trial = [*planes[:i], x, *planes[i + 1:]]
            return robust_loss(_log_errors(table(trial), gpu, mine, checker)) + KV_TABLE_RIDGE * float(np.mean(x ** 2))

        x = np.zeros(n)
        for _ in range(3):
            x = nelder_mead(cost, x, step=0.1, iters=800)
        planes[i] = x
    best = table(planes)
    rms = float(np.sqrt(np.mean(_log_errors(best, gpu, rows, checker) ** 2)))
    return {k: getattr(best, k) for k in ("kv_eff_heads", "kv_eff_batch", "kv_eff_context", "kv_eff_values")}, rms


def calibrate(rows: Sequence[Measurement], gpus: Sequence[str], *, smooth: bool = True,
              base: Efficiency | None = None, kv_table: bool = False) -> dict[str, Any]:
    """Every GPU's fitted constants (in-scope fit rows only), with what each group was fitted on."""
    base = base or Efficiency()
    fit_rows = [r for r in rows if r.split == "fit" and r.in_scope]
    fits: dict[str, dict[str, GroupFit]] = {g: {} for g in gpus}
    for gpu in gpus:
        for group, (kinds, dtypes) in GROUPS.items():
            mine = [r for r in fit_rows if r.gpu == gpu and r.kind in kinds and r.dtype in dtypes]
            if len(mine) >= 3:
                fits[gpu][group] = fit_group(gpu, group, mine, base, smooth=smooth)
                if group == "decode" and kv_table and len(mine) >= 9:
                    fitted = replace(base, **fits[gpu][group].values)
                    table, rms = fit_kv_table(gpu, mine, fitted)
                    fits[gpu][group].values.update(table)
                    fits[gpu][group].rms_log = rms
    for gpu in gpus:
        for group in GROUPS:
            if group in fits[gpu]:
                continue
            donor = next((d for d in BORROW.get(gpu, ()) if group in fits.get(d, {})), None)
            if donor is None:
                continue
            g = fits[donor][group]
            lent = dict(g.values)
            donor_gemm = fits[donor].get("gemm")
            donor_n = donor_gemm.values.get("roofline_n") if donor_gemm is not None else None
            if group == "moe" and donor_n is not None:  # the exponent the lent constants were fitted with
                lent.setdefault("moe_roofline_n", donor_n)  # a donor's own loan keeps its lender's
            kinds, dtypes = GROUPS[group]
            mine = [r for r in fit_rows if r.gpu == gpu and r.kind in kinds and r.dtype in dtypes]
            if mine:
                # Too few rows for the group's constants: borrow the donor's and fit only the
                # first len(rows) of them (the efficiency first) to this GPU's rows.
                start = replace(base, **lent)
                own = fit_group(gpu, group, mine, start, smooth=smooth,
                                only=tuple(p[0] for p in PARAMS[group][:len(mine)]))
                fits[gpu][group] = GroupFit(gpu, group, len(mine), {**lent, **own.values}, own.rms_log,
                                            borrowed_from=donor)
            else:
                fits[gpu][group] = GroupFit(gpu, group, 0, lent, g.rms_log, borrowed_from=donor)
    return fits


# -- engine-level constants -----------------------------------------------------------------
ENGINE_KINDS = ("e2e_b1", "tpot_b1", "ttft_b1", "decode_step", "prefill_throughput")
# (name, initial value, lower, upper): shared by every engine and GPU
ENGINE_PARAMS = [("layer_fixed_s", 12e-6, 1e-7, 1e-4), ("layer_fixed_moe_s", 30e-6, 1e-7, 5e-4),
                 ("engine_kv_half_units", 4.0, 0.1, 500.0)]
# per engine: its host time, and its CUDA-core decode kernel's efficiency where it has one
PER_ENGINE_PARAMS = [("cpu_base_s", 0.8e-3, 5e-5, 1e-2)]
CUDA_CORE_PARAMS = [("decode_cuda_core_eff", 0.13, 0.01, 1.0)]


def analytic_row(analytic, row: Measurement) -> float:
    """An engine row predicted from the analytic model directly (vectorised over the decode
    steps; the table predictor agrees within its interpolation error): for fitting only."""
    from lmsim.profile.analytic import decode_seconds, prefill_seconds
    from lmsim.profile.measurements import DEFAULT_BUDGET, SECONDS, prefill_steps

    budget = row.get("chunk_tokens", DEFAULT_BUDGET) or DEFAULT_BUDGET
    if row.kind == "e2e_b1":
        prompt = row.get("input_tokens")
        s = prefill_seconds(analytic, prompt, 0, budget) + decode_seconds(analytic, prompt, row.get("output_tokens"))
        return s / SECONDS[row.unit]
    if row.kind == "ttft_b1":
        cached = row.get("context_tokens", 0) or 0
        return prefill_seconds(analytic, row.get("input_tokens") - cached, cached, budget) / SECONDS[row.unit]
    if row.kind == "tpot_b1":
        out = row.get("output_tokens")
        tpot = decode_seconds(analytic, row.get("input_tokens"), out) / max(out - 1, 1)
        return 1.0 / tpot if row.unit == "tok/s" else tpot / SECONDS[row.unit]
    if row.kind == "decode_step":
        b, c = row.get("batch"), row.get("context_tokens")
        step = analytic.step_time((), b, b * c)
        return b / step if row.unit == "tok/s" else step / SECONDS[row.unit]
    b, prompt = row.get("batch"), row.get("input_tokens")
    steps = prefill_steps(b, prompt, row.get("chunk_tokens", b * prompt))
    return b * prompt / sum(analytic.step_time(chunks, 0, 0) for chunks in steps)


def engine_params(rows: Sequence[Measurement], gpus_without_gemm: Sequence[str]) -> list[tuple]:
    """The engine fit's parameters as (name, init, lo, hi, scope): scope None is shared,
    ("engine", key) one engine's, ("gpu", key) one GPU's (a BF16 GEMM group the GPU has no
    kernel rows for, fitted on its engine rows instead)."""
    from lmsim.profile.hardware import load_engines

    table = load_engines()
    engines = sorted({table.for_text(r.engine).key for r in rows})
    params: list[tuple] = [(*p, None) for p in ENGINE_PARAMS]
    for key in engines:
        params += [(*p, ("engine", key)) for p in PER_ENGINE_PARAMS]
        if table.engines[key].decode_attention == "flashinfer":
            params += [(*p, ("engine", key)) for p in CUDA_CORE_PARAMS]
    for gpu in gpus_without_gemm:
        params += [(*p, ("gpu", gpu)) for p in ENGINE_FITTED_GROUPS["gemm"]]
    return params


def fit_engine(rows: Sequence[Measurement], kernel_eff: dict[str, Efficiency],
               params: Sequence[tuple], fixed: dict | None = None) -> tuple[dict, float]:
    """The engine constants, fitted on the in-scope engine rows of the fit split with each
    GPU's kernel constants fixed; each row is priced with the engine its `engine` column
    names. `fixed` ({(name, scope): value}, a previous fit's result) holds constants that
    are not fitted here. Returns {(name, scope): value} of `params` and the RMS log ratio."""
    from lmsim.profile.analytic import AnalyticModel
    from lmsim.profile.hardware import load_engines, load_model, shard

    table = load_engines()
    fit_rows = [r for r in rows if r.split == "fit" and r.in_scope and r.kind in ENGINE_KINDS
                and r.gpu in kernel_eff]
    specs, usable = {}, []
    for r in fit_rows:
        try:
            specs[(r.model, r.tp)] = shard(load_model(r.model), r.tp)
            usable.append((r, table.for_text(r.engine)))
        except Exception:
            continue
    lo = np.log([p[2] for p in params])
    hi = np.log([p[3] for p in params])

    def values(x: np.ndarray) -> dict[tuple[str, Any], float]:
        return {(p[0], p[4]): float(v) for p, v in zip(params, np.exp(np.clip(x, lo, hi)))}

    def errors(x: np.ndarray) -> np.ndarray:
        vals = {**(fixed or {}), **values(x)}
        out = []
        for r, engine in usable:
            mine = {k: v for (k, scope), v in vals.items()
                    if scope is None or scope == ("engine", engine.key) or scope == ("gpu", r.gpu)}
            eff = replace(kernel_eff[r.gpu], **mine)
            model = AnalyticModel(_gpu(r.gpu), specs[(r.model, r.tp)], eff, engine)
            out.append(math.log(analytic_row(model, r) / r.measured))
        return np.array(out)

    def cost(x: np.ndarray) -> float:
        return robust_loss(errors(x))

    def start(p: tuple) -> float:
        scope = p[4]
        if scope is not None and scope[0] == "gpu":
            return getattr(kernel_eff[scope[1]], p[0]) or p[1]
        return p[1]

    x = np.log([start(p) for p in params])
    for _ in range(2):
        x = nelder_mead(cost, x, iters=400)
    return values(x), float(np.sqrt(np.mean(errors(x) ** 2)))


# -- the whole calibration ----------------------------------------------------------------
GPUS = ("h20", "h100", "h200", "h800", "a100", "l40s", "rtx5090")


def base_efficiency(smooth: bool) -> Efficiency:
    """The starting point: costmodel.md's H20 constants in the scalar form. A group a GPU has
    neither kernel rows nor a donor for keeps these (H20's MoE: costmodel.md 3.2(3), calibrated
    on H20 engine measurements, as mfu(r) = 0.8 r / (r + 12.4): 0.45 at 16 rows, 0.67 at 64)."""
    return Efficiency(
        gemm_mfu=0.8, moe_mfu=0.8, moe_half_rows=12.4, attn_mfu=0.7, attn_half_kv=500.0,
        roofline_n=2.0 if smooth else None, gemm_launch_s=3e-6, prefill_chunk_s=5e-6,
        engine_kv_half_units=4.0,
    )


def calibrate_all(rows: Sequence[Measurement], *, smooth: bool = True, kv_table: bool = False) -> dict[str, Any]:
    """Kernel groups per GPU, then the engine constants: each GPU's fitted `efficiency` mapping,
    each engine's fitted constants, and a record of what every value was fitted on. Rows
    marked out of scope are left out."""
    rows = [r for r in rows if r.in_scope]
    base = base_efficiency(smooth)
    fits = calibrate(rows, GPUS, smooth=smooth, base=base, kv_table=kv_table)
    effs: dict[str, Efficiency] = {}
    record: dict[str, dict[str, Any]] = {}
    for gpu in GPUS:
        values: dict[str, float] = {}
        rec: dict[str, Any] = {}
        for group, f in fits[gpu].items():
            values.update({k: (v if isinstance(v, tuple) else float(v)) for k, v in f.values.items()})
            rec[group] = {"fit_rows": f.rows, "rms_log_ratio": round(f.rms_log, 4)}
            if f.borrowed_from:
                rec[group] = {"borrowed_from": f.borrowed_from}
                if f.rows:
                    rec[group].update(own_fit_rows=f.rows, own_fitted=[p[0] for p in PARAMS[group][:f.rows]],
                                      rms_log_ratio=round(f.rms_log, 4))
        effs[gpu] = replace(base, **values)
        record[gpu] = rec
    engine_rows = [r for r in rows if r.kind in ENGINE_KINDS and r.split == "fit" and r.gpu in GPUS]
    engine_gpus = sorted({r.gpu for r in engine_rows})
    late = late_engine_gpus(fits, engine_gpus)
    shared_gpus = [g for g in engine_gpus if g not in late]
    no_gemm = [g for g in shared_gpus if "gemm" not in fits[g]]
    params = engine_params([r for r in engine_rows if r.gpu in shared_gpus], no_gemm)
    vals, rms = fit_engine(rows, {g: effs[g] for g in shared_gpus}, params)
    late_rms = {}
    for gpu in late:
        own = [(*p, ("gpu", gpu)) for p in ENGINE_FITTED_GROUPS["gemm"]]
        own_vals, late_rms[gpu] = fit_engine(rows, {gpu: effs[gpu]}, own, fixed=vals)
        vals.update(own_vals)
    engines: dict[str, dict[str, float]] = {}
    for (name, scope), v in vals.items():
        if scope is not None and scope[0] == "engine":
            engines.setdefault(scope[1], {})[name] = v
            continue
        for gpu in GPUS:
            if scope is None or scope == ("gpu", gpu):
                effs[gpu] = replace(effs[gpu], **{name: v})
                if scope is not None:
                    record[gpu].setdefault("engine_fitted", []).append(name)
    for gpu in GPUS:
        record[gpu]["engine"] = {"fitted_on": f"in-scope end-to-end rows of {', '.join(shared_gpus)}",
                                 "rms_log_ratio": round(rms, 4)}
        if gpu in late:
            own_rows = sum(r.gpu == gpu for r in engine_rows)
            record[gpu]["engine"].update(own_fit=f"{', '.join(record[gpu]['engine_fitted'])} on its {own_rows} "
                                                 "end-to-end fit rows, the engine constants held",
                                         own_rms_log_ratio=round(late_rms[gpu], 4))
    return {"efficiency": effs, "record": record, "engines": engines}


def late_engine_gpus(fits: dict[str, dict[str, GroupFit]], engine_gpus: Sequence[str]) -> list[str]:
    """The GPUs with end-to-end rows but no kernel rows of their own (every kernel group
    borrowed): fitted after the shared engine constants, on their own GEMM efficiencies only."""
    return [g for g in engine_gpus if fits[g] and all(f.borrowed_from and not f.rows for f in fits[g].values())]


MARKER = "# -- fitted by `lmsim profile calibrate`; do not edit by hand --"


def efficiency_mapping(eff: Efficiency) -> dict[str, Any]:
    """The fields that differ from the dataclass defaults, rounded to 4 significant digits."""
    default = Efficiency().as_mapping()
    out = {}
    def rounded(v: Any) -> Any:
        if isinstance(v, list):
            return [rounded(x) for x in v]
        return float(f"{v:.4g}") if isinstance(v, float) else v

    for k, v in eff.as_mapping().items():
        if v != default[k]:
            out[k] = v if k in ("kv_eff_heads", "kv_eff_batch", "kv_eff_context") else rounded(v)
    return out


def write_engine_constants(engines: dict[str, dict[str, float]]) -> Path:
    """Replace the fitted block at the end of engines.yaml (everything after MARKER)."""
    import yaml

    from lmsim.outputs import write_text
    from lmsim.profile.hardware import ENGINES_FILE

    text = ENGINES_FILE.read_text()
    head = text.split(MARKER)[0].rstrip("\n") + "\n"
    fitted = {key: {k: float(f"{v:.4g}") for k, v in sorted(vals.items())} for key, vals in sorted(engines.items())}
    block = yaml.safe_dump({"fitted": fitted}, sort_keys=False, width=100, default_flow_style=False)
    write_text(ENGINES_FILE, f"{head}{MARKER}\n{block}")
    return ENGINES_FILE


def write_gpu_efficiency(gpu: str, eff: Efficiency, record: dict[str, Any], note: str) -> Path:
    """Replace the fitted block at the end of the GPU's YAML (everything after MARKER)."""
    import yaml

    from lmsim.outputs import write_text
    from lmsim.profile.hardware import GPUS_DIR

    path = GPUS_DIR / f"{gpu}.yaml"
    text = path.read_text()
    head = text.split(MARKER)[0].rstrip("\n") + "\n"
    block = yaml.safe_dump({"efficiency": efficiency_mapping(eff),
                            "calibration": {"note": note, **record}},
                           sort_keys=False, width=100, default_flow_style=False)
    write_text(path, f"{head}{MARKER}\n{block}")
    return path
