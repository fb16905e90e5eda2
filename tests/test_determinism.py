"""A run is a pure function of its config and trace.

The same config and seed give byte-identical `requests.parquet`, `instances.parquet` and
`router_events.parquet` and the same `summary.json` apart from wall-clock fields: on a
rerun, in another process (another string-hash seed), and with fast-forward on or off.
A different seed changes only what is random: a seeded policy's choices, not `vllm`'s.

The workload is a chatbot trace generated once and saved, so the seed under test cannot
change the trace; the profile is the real H20/Qwen3-30B-A3B table (its interpolation is
the arithmetic that must agree bit for bit between single steps and fast-forwarded runs),
and a 200-block pool forces preemption and eviction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lmsim.config import ExperimentConfig, validate
from lmsim.study.compose import build_simulation
from lmsim.study.rundir import load_run, save_run
from lmsim.workload.generators import generate
from lmsim.workload.trace import read_parquet

TABLES = ("requests.parquet", "instances.parquet", "router_events.parquet")
WALL_CLOCK = ("wall_time_s", "router_us_per_decision", "requests_per_wall_s")
REPO_ROOT = Path(__file__).resolve().parents[1]

# llmd with noise draws from the policy's seeded stream and records one event per request;
# `random` is seeded choice; `vllm` (JSQ) and `lmetric_hotspot` are deterministic given the
# trace, the latter with router-local windows, counters and alarm sets.
POLICIES = {
    "vllm": {},
    "random": {},
    "llmd": {"noise_rel": 0.3, "record_predictions": True},
    "lmetric_hotspot": {"min_window_requests": 5, "top_k": 4},
}


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    trace = generate(
        "chatbot",
        {"duration_s": 8, "rate": 20, "max_output_tokens": 150, "max_input_tokens": 3000},
        seed=7,
    )
    path = tmp_path_factory.mktemp("determinism") / "trace.parquet"
    trace.save(path)
    return path


def raw_experiment(trace_path: Path, policy: str, *, seed: int = 0, fast_forward: bool = True) -> dict[str, Any]:
    return {
        "name": "determinism",
        "seed": seed,
        "workload": {"trace": str(trace_path)},
        "cluster": {"num_instances": 3, "profile": "h20/qwen3-30b-a3b", "num_gpu_blocks": 200},
        "router": {"policy": policy, "params": POLICIES[policy]},
        "simulation": {"fast_forward": fast_forward, "sample_interval_s": 0.5},
    }


def run_and_save(config: ExperimentConfig, trace_path: Path, out: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    results = build_simulation(config, read_parquet(trace_path)).run()
    save_run(results, out, figure=False)
    return read_run(out)


def read_run(out: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    files = {name: (out / name).read_bytes() for name in (*TABLES, "config.yaml")}
    summary = json.loads((out / "summary.json").read_text())
    for key in WALL_CLOCK:
        summary.pop(key)
    return files, summary


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_rerun_is_byte_identical(policy, trace_path, tmp_path):
    config = validate(raw_experiment(trace_path, policy), where="test")
    first = run_and_save(config, trace_path, tmp_path / "a")
    second = run_and_save(config, trace_path, tmp_path / "b")
    assert first[0] == second[0]
    assert first[1] == second[1]
    # the scenario is not trivial: the pool is small enough to preempt and evict
    assert first[1]["num_preemptions"] > 0
    assert first[1]["num_evictions"] > 0
    assert first[1]["num_finished"] == first[1]["num_requests"]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_fast_forward_on_and_off_are_byte_identical(policy, trace_path, tmp_path):
    on = run_and_save(validate(raw_experiment(trace_path, policy), where="t"), trace_path, tmp_path / "on")
    off = run_and_save(
        validate(raw_experiment(trace_path, policy, fast_forward=False), where="t"), trace_path, tmp_path / "off"
    )
    for name in TABLES:
        assert on[0][name] == off[0][name], name
    # Fast-forward exists to merge decode-only steps into fewer events; that count, and
    # nothing else, differs.
    events_on, events_off = on[1].pop("num_step_events"), off[1].pop("num_step_events")
    assert events_on < events_off == on[1]["num_steps"]
    assert on[1] == off[1]


def _tables(trace_path: Path, policy: str, seed: int, out: Path) -> dict[str, bytes]:
    return run_and_save(validate(raw_experiment(trace_path, policy, seed=seed), where="t"), trace_path, out)[0]


def test_the_seed_does_not_change_a_deterministic_policy(trace_path, tmp_path):
    a = _tables(trace_path, "vllm", 0, tmp_path / "a")
    b = _tables(trace_path, "vllm", 1, tmp_path / "b")
    for name in TABLES:
        assert a[name] == b[name], name


def test_the_seed_changes_a_random_policy_and_nothing_but_its_choices(trace_path, tmp_path):
    a = load_run(_save_dir(trace_path, "random", 0, tmp_path / "a")).requests
    b = load_run(_save_dir(trace_path, "random", 1, tmp_path / "b")).requests
    # same requests, same arrivals and lengths; different placements
    for column in ("request_id", "arrived_at", "input_tokens", "output_tokens"):
        assert a[column].equals(b[column]), column
    moved = int((a.instance_id != b.instance_id).sum())
    assert moved > len(a) // 3  # uniform over 3 instances: about 2/3 of requests move


def test_the_seed_changes_noisy_predictions(trace_path, tmp_path):
    a = load_run(_save_dir(trace_path, "llmd", 0, tmp_path / "a")).router_events
    b = load_run(_save_dir(trace_path, "llmd", 1, tmp_path / "b")).router_events
    assert len(a) == len(b) > 0
    assert list(a.request_id) == list(b.request_id)  # one prediction per request either way
    assert not a.predicted_ttft_s.equals(b.predicted_ttft_s)


def _save_dir(trace_path: Path, policy: str, seed: int, out: Path) -> Path:
    _tables(trace_path, policy, seed, out)
    return out


def test_separate_processes_with_different_hash_seeds_agree(trace_path, tmp_path):
    # Python randomizes str hashing per process; any set or dict iteration order that leaks
    # into the results would show up here, not in an in-process rerun.
    raw = raw_experiment(trace_path, "lmetric_hotspot")
    import yaml

    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    runs = []
    for hash_seed, out in (("1", "a"), ("2", "b")):
        env = dict(os.environ)
        env["PYTHONHASHSEED"] = hash_seed
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        proc = subprocess.run(
            [sys.executable, "-m", "lmsim", "run", "exp.yaml", "--out", out, "--no-figure"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(read_run(tmp_path / out))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
