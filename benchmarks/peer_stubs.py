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
