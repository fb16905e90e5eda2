"""The golden check: fixed simulations whose every observable result is hashed and pinned.

Each case is a small run on the real H20 tables covering one corner of the engine (policies,
router views, admission rules, preemption and eviction, closed-loop follow-ups, fast-forward
off). A case's digest covers every per-request record, instance sample, router event and
summary value, so a change that moves any number anywhere fails `tests/test_golden.py` and
names the case and the table. Counts that measure only the simulator's own work
(`num_step_events`) and wall-clock figures are left out: a speed-up may change them.

When a change is meant to move results (an engine or cost-model fix), re-pin with
`python tests/golden.py --update` and say in the commit which cases moved and why; a change
that must not move them (a new cluster shape, a faster path) keeps `tests/golden.json` as it
is. `python tests/golden.py` prints the cases that differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
PINNED = HERE / "golden.json"
SAMPLE = "traces/kimi_conversation_sample.parquet"
# Fields that measure the simulator, not the simulated system.
UNPINNED_SUMMARY = {"wall_time_s", "router_us_per_decision", "requests_per_wall_s", "num_step_events"}

_CHAT = {"name": "chatbot", "params": {"duration_s": 40, "rate": 12, "max_output_tokens": 600}}
_TOOL = {"name": "toolagent", "params": {"num_requests": 300, "rate": 4}}
_EIGHT = {"num_instances": 8}
_CODER = {"name": "coder", "params": {"num_requests": 250}}


def _case(name: str, workload: dict[str, Any], policy: str = "vllm", params: dict | None = None,
          *, cluster: dict | None = None, view: dict | None = None, sim: dict | None = None,
          seed: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "seed": seed,
        "workload": workload,
        "cluster": {"num_instances": 4, "profile": "h20/qwen3-30b-a3b", **(cluster or {})},
        "router": {"policy": policy, "params": params or {}, "view": view or {}},
        "simulation": {"sample_interval_s": 0.5, **(sim or {})},
        "output": {"figures": False},
    }


def _kimi(limit: int = 400, rate: float = 2.0) -> dict[str, Any]:
    return {"trace": SAMPLE, "limit": limit, "rate": rate}


def _gen(spec: dict[str, Any], **scale: Any) -> dict[str, Any]:
    return {"generator": spec, **scale}


CASES: list[dict[str, Any]] = [
    _case("kimi-vllm", _kimi(), cluster=_EIGHT),
    _case("kimi-lmetric", _kimi(), "lmetric", cluster=_EIGHT),
    _case("kimi-dynamo", _kimi(), "dynamo", cluster=_EIGHT),
    _case("kimi-hotspot", _kimi(), "lmetric_hotspot", {"min_window_requests": 5, "top_k": 4},
          cluster=_EIGHT),
    _case("kimi-smallpool-preempt", _kimi(300, 8.0), "round_robin", cluster={"num_gpu_blocks": 900}),
    _case("kimi-fullseq", _kimi(300, 8.0), "least_tokens",
          cluster={"num_gpu_blocks": 1500, "admission": "full_sequence"}),
    _case("kimi-watermark", _kimi(300, 8.0), "vllm",
          cluster={"num_gpu_blocks": 1500, "admission": "whole_prompt_watermark"}),
    _case("kimi-no-ff", _kimi(300, 8.0), "lmetric", cluster={"num_gpu_blocks": 1200},
          sim={"fast_forward": False}),
    _case("chat-llmd-noise", _gen(_CHAT, rate=10), "llmd", {"noise_rel": 0.12}, seed=3),
    _case("chat-bailian", _gen(_CHAT, rate=10), "bailian"),
    _case("chat-preble", _gen(_CHAT, rate=10), "preble"),
    _case("chat-polyserve", _gen(_CHAT, rate=10), "polyserve"),
    _case("chat-sglang-approx", _gen(_CHAT, rate=10), "sglang",
          view={"kv_view": "approximate", "approx_ttl_s": None}),
    _case("chat-aibrix-scraped", _gen(_CHAT, rate=10), "aibrix",
          view={"load_view": "scraped", "scrape_interval_s": 0.2}),
    _case("tool-llmdscorer-events", _gen(_TOOL, rate=3), "llmd_scorer",
          view={"kv_view": "events", "kv_event_delay_s": 0.05}),
    _case("coder-random-closedloop", _gen(_CODER, rate=0.03), "random", cluster={"num_instances": 2}),
]


def _column_digest(h: Any, name: str, values: pd.Series) -> None:
    h.update(name.encode())
    arr = values.to_numpy()
    if values.dtype.kind == "f" or pd.api.types.is_float_dtype(values.dtype):
        h.update(np.asarray(arr, dtype=np.float64).tobytes())
    elif pd.api.types.is_integer_dtype(values.dtype) or pd.api.types.is_bool_dtype(values.dtype):
        h.update(json.dumps([None if pd.isna(v) else int(v) for v in arr]).encode())
    else:
        h.update(json.dumps([None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)
                             for v in arr]).encode())


def _frame_digest(frame: pd.DataFrame) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(list(map(str, frame.columns))).encode())
    for column in frame.columns:
        _column_digest(h, str(column), frame[column])
    return h.hexdigest()[:16]


def _summary_digest(summary: dict[str, Any]) -> str:
    kept = {k: v for k, v in summary.items() if k not in UNPINNED_SUMMARY}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def compute(names: list[str] | None = None) -> dict[str, dict[str, str]]:
    """The digests of the cases (all, or those named): requests, instances, router events,
    summary."""
    import lmsim
    from lmsim.config import validate

    out = {}
    for case in CASES:
        if names and case["name"] not in names:
            continue
        raw = json.loads(json.dumps(case))
        if "trace" in raw["workload"]:
            raw["workload"]["trace"] = str(HERE.parent / raw["workload"]["trace"])
        results = lmsim.run(validate(raw, where=f"golden case {case['name']}"))
        out[case["name"]] = {
            "requests": _frame_digest(results.requests),
            "instances": _frame_digest(results.instances),
            "router_events": _frame_digest(results.router_events),
            "summary": _summary_digest(results.summary),
        }
    return out


def pinned() -> dict[str, dict[str, str]]:
    return json.loads(PINNED.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="re-pin tests/golden.json")
    parser.add_argument("cases", nargs="*", help="only these cases")
    args = parser.parse_args(argv)
    got = compute(args.cases)
    if args.update:
        merged = {**(pinned() if PINNED.exists() and args.cases else {}), **got}
        PINNED.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
        print(f"pinned {len(got)} cases in {PINNED.name}")
        return 0
    want = pinned()
    moved = [name for name in got if got[name] != want.get(name)]
    for name in got:
        if name in moved:
            tables = [t for t in got[name] if got[name][t] != want.get(name, {}).get(t)]
            print(f"{name}: differs in {', '.join(tables)}")
        else:
            print(f"{name}: identical")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    sys.exit(main())
