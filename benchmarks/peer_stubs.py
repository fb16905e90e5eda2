"""Import stand-ins that let Dynamo's planner and profiler load in the peer venv without
AISimulate's Python wheel.

`ai-dynamo` 1.6.1 requires `aisimulate==0.13.0`, whose PyPI entry is a wheel stub that
downloads the real wheel from NVIDIA's own package index at install time; that index is
out of reach here, so `aisimulate` and its native `aisimulate_core` cannot be installed.
The offline replay itself does not need them (its engine is inside `dynamo._core`), but
`dynamo.replay.config` imports `aisimulate.runner` and the planner's perf-model package
(`dynamo/planner/core/perf_model/ais_adapter.py`, `engine_query.py`) imports
`aisimulate_core.sdk` at module level.

`STUB_SOURCE` is run in the peer interpreter before any `dynamo` import. It registers
modules whose every real entry point raises ImportError: `RustForwardPassPerfModel.best_available`
(the planner's `PlannerEnginePerfModel._init_engine_model` catches ImportError and leaves
the perf model unavailable, which is what the planner does when AISimulate is missing) and
`canonical_performance_config` (only reached with an AIS timing model, which these scripts
never configure). `ForwardPassPerfModelConfig` is a plain record of the fields the planner
reads before it asks for the native model. Nothing here estimates anything: a run that
needs the AISimulate perf model (the SLA planner's throughput scaling, its SLA load
scaling, replay_optimize's AIC candidates) reports it as not ready, as it would without
the wheel.

`POLYNOMIAL_PERF_MODEL_SOURCE` (opt-in, `--dynamo-perf-model polynomial` of
fleet/dynamo_planner.py) replaces the one native piece of the SLA planner's performance
model: `dynamo.planner.core.perf_model.engine_query.AISForwardPassPerfModel` (AISimulate's
`RustForwardPassPerfModel`), the object `AISCoreEnginePerfModel` asks for the time of one
forward pass (`_estimate_forward_pass_seconds` -> `estimate_forward_pass_time_ms`, given the
pass's ForwardPassMetrics), tunes with observed passes (`tune_with_fpms`) and asks for
readiness (`diagnostics`). Everything above it runs as shipped: the planner's adapter
(ais_adapter.py `PlannerEnginePerfModel`), the capacity searches, queue-drain and chunking
(engine_query.py), predictors, budget and replica decisions. The stand-in prices a pass with
lmsim's `PolynomialCostModel.step_time` (the mocker's closed forms, lmsim/profile/polynomial.py)
for the role's worker type on the worker's KV capacity: scheduled prefill tokens (and their
cached KV) as one chunk when the pass has prefill requests, the decode requests and their KV
tokens; it is ready from the start and has nothing to correct (tuning only counts passes).
"""

STUB_SOURCE = r'''
import sys as _sys, types as _types
from dataclasses import dataclass as _dataclass

def _aisimulate_missing(*_a, **_k):
    raise ImportError("aisimulate_core (AISimulate's native perf model) is not installed in the peer venv")

if "aisimulate_core" not in _sys.modules:
    try:
        import aisimulate_core  # noqa: F401  (a real install wins)
    except ImportError:
        _ais = _types.ModuleType("aisimulate"); _runner = _types.ModuleType("aisimulate.runner")
        _runner.canonical_performance_config = _aisimulate_missing; _ais.runner = _runner
        _core = _types.ModuleType("aisimulate_core"); _sdk = _types.ModuleType("aisimulate_core.sdk")

        @_dataclass
        class ForwardPassPerfModelConfig:
            model: str = ""
            system: str = ""
            backend: str = "vllm"
            worker_type: str = ""
            estimation_mode: str = ""
            tp: int = 1
            pp: int = 1

            @classmethod
            def from_legacy_engine_config(cls, *_a, **_k):
                return _types.SimpleNamespace(estimator_config={})

        class RustForwardPassPerfModel:
            @classmethod
            def best_available(cls, *_a, **_k):
                _aisimulate_missing()

        _sdk.ForwardPassPerfModelConfig = ForwardPassPerfModelConfig
        _sdk.RustForwardPassPerfModel = RustForwardPassPerfModel
        _core.sdk = _sdk
        for _name, _mod in (("aisimulate", _ais), ("aisimulate.runner", _runner),
                            ("aisimulate_core", _core), ("aisimulate_core.sdk", _sdk)):
            _sys.modules[_name] = _mod
        AISIMULATE_STUBBED = True
'''


# Runs inside the peer interpreter after STUB_SOURCE: `use_polynomial_perf_model(checkout,
# kv_capacity_tokens)` gives the planner a forward-pass model (the module docstring says which piece).
POLYNOMIAL_PERF_MODEL_SOURCE = r"""
def use_polynomial_perf_model(checkout, kv_capacity_tokens):
    import sys
    if checkout not in sys.path:
        sys.path.insert(0, checkout)
    from lmsim.profile.polynomial import PolynomialCostModel
    import dynamo.planner.core.perf_model.engine_query as engine_query

    class PolynomialForwardPassModel:
        # the three methods AISCoreEnginePerfModel calls on AISimulate's RustForwardPassPerfModel
        def __init__(self, worker_type):
            self.cost = PolynomialCostModel(worker_type=worker_type, kv_capacity_tokens=kv_capacity_tokens)
            self.tuned = 0

        @classmethod
        def best_available(cls, ais_config):
            return cls(ais_config["worker_type"])

        def tune_with_fpms(self, iterations):
            self.tuned += len(iterations)  # a closed form: nothing to correct

        def diagnostics(self):
            return {"source": "polynomial (the mocker's step model, lmsim.profile.polynomial)",
                    "readiness": "ready", "retained_observations": self.tuned}

        def estimate_forward_pass_time_ms(self, fpms):
            return max(1000.0 * fpm_step_s(self.cost, f) for f in fpms)  # attention-DP ranks in lockstep

    engine_query.AISForwardPassPerfModel = PolynomialForwardPassModel
    return PolynomialForwardPassModel


def fpm_step_s(cost, fpm):
    s = fpm["scheduled_requests"]
    chunks = ((s["sum_prefill_tokens"], s["sum_prefill_kv_tokens"]),) if s["num_prefill_requests"] > 0 else ()
    return cost.step_time(chunks, s["num_decode_requests"], s["sum_decode_kv_tokens"])
"""
