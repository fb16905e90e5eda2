"""Two open choices of the FP8 GEMM kernel form, decided on held-out shapes.

InferSim's DeepGEMM tables (benchmarks/data, 34 shapes on H20 and 10 on H800, 11 M values each)
hold far more shapes than `measurements.csv` samples. For each GPU the shapes are split in two
alternating halves; the `gemm_fp8` group is fitted (calibrate.fit_group, the same robust loss
and search `lmsim profile calibrate` uses) on one half and checked on the other, then the halves
swap. The forms compared:

* the roofline's memory side: the weights alone, or the weights and the activation rows
  (M x K read, M x N written; `Efficiency.gemm_moves_activations`);
* the exponent: shared (the GPU's `roofline_n`, the BF16 GEMMs') or the FP8 group's own
  `roofline_n_fp8` (`calibrate.ALTERNATIVES`).

    python benchmarks/fp8_gemm_heldout.py

prints, per GPU and form, the held-out rows within 10%, beyond 25% and the rms log ratio.
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from lmsim.profile.analytic import efficiency_for
from lmsim.profile.calibrate import ALTERNATIVES, _log_errors, fit_group
from lmsim.profile.hardware import load_gpu
from lmsim.profile.measurements import Checker, Measurement

DATA = Path(__file__).with_name("data")


def rows_of(gpu: str) -> list[Measurement]:
    out = []
    with (DATA / f"infersim_deepgemm_{gpu}.csv").open() as fh:
        for r in csv.DictReader(fh):
            m, k, n = int(r["m"]), int(r["k"]), int(r["n"])
            out.append(Measurement(
                id=f"{gpu}-m{m}-n{n}-k{k}", source="InferSim", gpu=gpu, model="", engine="DeepGEMM",
                dtype="fp8", kind="kernel_gemm", measured=float(r["latency_us"]), unit="us", condition="",
                values={"gemm_m": m, "gemm_n": n, "gemm_k": k, "tp": 1}))
    return out


def held_out(gpu: str, own_exponent: bool, activations: bool = True) -> np.ndarray:
    rows = rows_of(gpu)
    shapes = sorted({(r.get("gemm_k"), r.get("gemm_n")) for r in rows})
    base = replace(efficiency_for(load_gpu(gpu)), roofline_n_fp8=None, gemm_moves_activations=activations)
    params = ("gemm_mfu_fp8", "weight_stream_eff_fp8", "gemm_launch_fp8_s") + (("roofline_n_fp8",) if own_exponent else ())
    logs = []
    for fold in (0, 1):
        train = {s for i, s in enumerate(shapes) if i % 2 == fold}
        fit_rows = [r for r in rows if (r.get("gemm_k"), r.get("gemm_n")) in train]
        check_rows = [r for r in rows if (r.get("gemm_k"), r.get("gemm_n")) not in train]
        checker = Checker()
        fitted = fit_group(gpu, "gemm_fp8", fit_rows, base, checker=checker, only=params,
                           extra=ALTERNATIVES["gemm_fp8"])
        logs += list(_log_errors(replace(base, **fitted.values), gpu, check_rows, checker))
    return np.array(logs)


def main() -> None:
    print(f"{'gpu':5s} {'memory side':12s} {'exponent':8s} {'rows':>5s} {'within 10%':>11s} {'beyond 25%':>11s} "
          f"{'rms log':>8s}")
    for gpu in ("h20", "h800"):
        for activations in (False, True):
            for own in (False, True):
                lr = held_out(gpu, own, activations)
                ratio = np.exp(lr)
                print(f"{gpu:5s} {'+activations' if activations else 'weights':12s} {'own' if own else 'shared':8s} "
                      f"{len(lr):5d} {np.mean(np.abs(ratio - 1) <= 0.1):11.2f} "
                      f"{int(np.sum(np.abs(ratio - 1) > 0.25)):11d} {math.sqrt(float(np.mean(lr ** 2))):8.3f}")


if __name__ == "__main__":
    main()
