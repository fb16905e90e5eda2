"""lmsim's `sla_planner` pieces against Dynamo's own planner code (ai-dynamo 1.6.1), on the
same inputs: the per-engine capacity search (core/perf_model/engine_query.py, with Dynamo's
forward-pass estimator replaced by the same linear step model lmsim prices with), the GPU
ceiling fit (core/budget.py) and the Kalman load predictor (core/load/predictors.py).

Usage: python benchmarks/against_dynamo_planner.py [--peer-python PATH]
(`--peer-python` default: `$LMSIM_PEER_DYNAMO_PYTHON` or ../venvs/peer-dynamo/bin/python
beside the checkout). Prints the largest relative difference per piece and the number of
mismatching cases; exits 1 on any mismatch, 0 otherwise (also when the peer is missing).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from peer_harness import DEFAULT_PEER, peer_available, run_in_peer

from lmsim.autoscalers.sla_planner import (
    EnginePerformance,
    KalmanPredictor,
    fit_pair_under_ceiling,
    fit_single_under_ceiling,
)
from lmsim.profile.base import LinearCostModel

STEP = {
    "base": 0.010,
    "per_prefill_token": 0.0001,
    "per_decode_seq": 0.0001,
    "per_context_token": 1e-6,
}
CAPACITY_CASES = [  # isl, osl, max_num_batched_tokens, max_num_seqs, max_kv_tokens
    (1000, 100, 8192, 1024, 100_000),
    (3000, 150, 2048, 256, 50_000),
    (20000, 500, 8192, 1024, 400_000),
    (500, 1000, 8192, 64, 1_000_000),
    (128, 2, 8192, 1024, 10_000_000),
    (7000, 300, 4096, 512, 2_000_000),
]
SERIES = [
    [0, 0, 10, 20, 30, 40, 50, 60, 55, 80, 20, 0, 0, 35],
    [100, 120, 90, 150, 160, 170, 40, 300],
]

# The planner package imports AISimulate's SDK at import time; the pieces compared here do
# not use it, so it is stubbed when absent.
DYNAMO_CHILD = r"""
import json, sys, types
try:
    import aisimulate_core.sdk  # noqa: F401
except ImportError:
    class _Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})
    for name in ("aisimulate_core", "aisimulate_core.sdk", "aisimulate_core._native"):
        sys.modules[name] = _Stub(name)
from dynamo.planner.config.planner_config import PlannerConfig
from dynamo.planner.core.budget import fit_directional_budget_pair, guard_single_scaling_budget
from dynamo.planner.core.load.predictors import KalmanPredictor
from dynamo.planner.core.perf_model.engine_query import (
    AISCoreEnginePerfModel, EngineCapacityRequest, EnginePerfLimits)

with open(json.loads(sys.argv[1])["inputs"]) as f:  # too long for one argument
    args = json.load(f)
step = args["step"]

class LinearForwardPass:
    def estimate_forward_pass_time_ms(self, ranks):
        s = ranks[0]["scheduled_requests"]
        prefill = s.get("sum_prefill_tokens", 0)
        decodes = s.get("num_decode_requests", 0)
        kv = s.get("sum_decode_kv_tokens", 0)
        return 1000 * (step["base"] + step["per_prefill_token"] * prefill
                       + step["per_decode_seq"] * decodes + step["per_context_token"] * (prefill + kv))

capacities = []
for worker in ("prefill", "decode", "aggregated"):
    for isl, osl, mbt, seqs, kv in args["capacity"]:
        model = AISCoreEnginePerfModel(model=LinearForwardPass(), worker_type=worker,
                                       limits=EnginePerfLimits(mbt, seqs, kv), attention_dp_size=1,
                                       max_observations=8)
        request = EngineCapacityRequest(isl=isl, osl=osl,
                                        ttft_sla_s=None if worker == "decode" else 0.5,
                                        itl_sla_s=None if worker == "prefill" else 0.05)
        result = model.find_engine_capacity_rps(request)
        capacities.append(None if result is None else [result.rps, result.eligible])
pairs = [list(fit_directional_budget_pair(*c[0], *c[1], *c[2], -1, c[3], *c[4])) for c in args["pairs"]]
singles = [guard_single_scaling_budget(c[0], c[1], c[2], -1, c[3], c[4])[0] for c in args["singles"]]
forecasts = []
for log1p in (False, True):
    config = PlannerConfig(load_predictor="kalman", optimization_target="sla", load_predictor_log1p=log1p)
    for series in args["series"]:
        predictor, out = KalmanPredictor(config), []
        for value in series:
            predictor.add_data_point(value)
            out.append(predictor.predict_next())
        forecasts.append(out)
print(json.dumps({"capacity": capacities, "pairs": pairs, "singles": singles, "kalman": forecasts}))
"""


def cases(seed: int = 7) -> dict:
    rng = random.Random(seed)
    pairs = [
        [
            [rng.randint(0, 12), rng.randint(0, 12)],
            [rng.randint(0, 12), rng.randint(0, 12)],
            [rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8])],
            rng.choice([-1, 4, 8, 16, 24, 40]),
            [rng.randint(0, 2), rng.randint(0, 2)],
        ]
        for _ in range(3000)
    ]
    singles = [
        [
            rng.randint(0, 12),
            rng.randint(0, 12),
            rng.choice([1, 2, 4]),
            rng.choice([-1, 4, 8, 16]),
            rng.randint(0, 2),
        ]
        for _ in range(2000)
    ]
    return {
        "step": STEP,
        "capacity": CAPACITY_CASES,
        "pairs": pairs,
        "singles": singles,
        "series": SERIES,
    }


def lmsim_side(args: dict) -> dict:
    model = LinearCostModel(
        step_base_s=STEP["base"],
        per_prefill_token_s=STEP["per_prefill_token"],
        per_decode_seq_s=STEP["per_decode_seq"],
        per_context_token_s=STEP["per_context_token"],
    )
    capacities = []
    for worker in ("prefill", "decode", "aggregated"):
        for isl, osl, mbt, seqs, kv in args["capacity"]:
            perf = EnginePerformance(
                model, max_num_batched_tokens=mbt, max_num_seqs=seqs, max_kv_tokens=kv
            )
            if worker == "prefill":
                result = perf.prefill_capacity(isl, 0.5)
            elif worker == "decode":
                result = perf.decode_capacity(isl, osl, 0.05)
            else:
                result = perf.aggregated_capacity(isl, osl, 0.5, 0.05)
            capacities.append(None if result is None else [result.rps, result.eligible])
    pairs = [
        list(fit_pair_under_ceiling(tuple(c[0]), tuple(c[1]), tuple(c[2]), c[3], tuple(c[4])))
        for c in args["pairs"]
    ]
    singles = [fit_single_under_ceiling(*c) for c in args["singles"]]
    forecasts = []
    for log1p in (False, True):
        for series in args["series"]:
            predictor, out = (
                KalmanPredictor(q_level=1.0, q_trend=0.1, r=10.0, min_points=5, log1p=log1p),
                [],
            )
            for value in series:
                predictor.add(value)
                out.append(predictor.predict())
            forecasts.append(out)
    return {"capacity": capacities, "pairs": pairs, "singles": singles, "kalman": forecasts}


def compare(ours: dict, theirs: dict) -> dict[str, tuple[int, float]]:
    """Per piece: (mismatching cases, largest relative difference)."""
    report = {}
    worst, bad = 0.0, 0
    for a, b in zip(ours["capacity"], theirs["capacity"], strict=True):
        if (a is None) != (b is None) or (a is not None and a[1] != b[1]):
            bad += 1
        elif a is not None:
            rel = abs(a[0] - b[0]) / b[0]
            worst = max(worst, rel)
            bad += rel > 1e-12
    report["capacity"] = (bad, worst)
    report["gpu ceiling (pairs)"] = (
        sum(a != b for a, b in zip(ours["pairs"], theirs["pairs"], strict=True)),
        0.0,
    )
    report["gpu ceiling (single)"] = (
        sum(a != b for a, b in zip(ours["singles"], theirs["singles"], strict=True)),
        0.0,
    )
    worst, bad = 0.0, 0
    for xs, ys in zip(ours["kalman"], theirs["kalman"], strict=True):
        for x, y in zip(xs, ys, strict=True):
            rel = abs(x - y) / max(abs(y), 1e-12)
            worst = max(worst, rel)
            bad += rel > 1e-9
    report["kalman"] = (bad, worst)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", default=DEFAULT_PEER)
    args = parser.parse_args(argv)
    inputs = cases()
    if not peer_available(args.peer_python):
        print(f"Dynamo not importable with {args.peer_python}: nothing to compare")
        return 0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "inputs.json"
        path.write_text(json.dumps(inputs))
        theirs = run_in_peer(args.peer_python, DYNAMO_CHILD, {"inputs": str(path)})
    if "error" in theirs:
        print(f"Dynamo's side failed: {theirs['error']}")
        return 0
    report = compare(lmsim_side(inputs), theirs)
    for piece, (bad, worst) in report.items():
        print(f"{piece:22s} mismatches {bad:5d}   largest relative difference {worst:.1e}")
    return 1 if any(bad for bad, _ in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
