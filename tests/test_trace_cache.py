"""The per-process cache of generated traces (study.experiment.generated_trace): a hit
gives exactly the numbers a fresh generation gives, shares read-only columns, and keeps
each caller's metadata its own."""

from __future__ import annotations

import numpy as np
import pytest

from lmsim.study import experiment
from lmsim.study.experiment import generated_trace
from lmsim.workload.generators import generate
from lmsim.workload.trace import Trace

COLUMNS = ("arrival_s", "input_tokens", "output_tokens", "hash_offsets", "hash_values", "session_id")


@pytest.fixture(autouse=True)
def empty_cache():
    experiment._trace_cache.clear()
    yield
    experiment._trace_cache.clear()


def _same(a: Trace, b: Trace) -> None:
    for name in COLUMNS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.meta == b.meta


def test_hit_equals_fresh_generation_and_shares_columns():
    first = generated_trace("agent", {"num_requests": 300}, 3)
    second = generated_trace("agent", {"num_requests": 300}, 3)
    fresh = generate("agent", {"num_requests": 300}, seed=3)
    _same(first, fresh)
    _same(second, fresh)
    assert len(experiment._trace_cache) == 1
    assert np.shares_memory(first.hash_values, second.hash_values)
    assert second is not first


def test_key_is_name_params_and_seed():
    base = generated_trace("agent", {"num_requests": 300}, 3)
    other_seed = generated_trace("agent", {"num_requests": 300}, 4)
    other_params = generated_trace("agent", {"num_requests": 301}, 3)
    assert len(experiment._trace_cache) == 3
    assert not np.array_equal(base.arrival_s, other_seed.arrival_s)
    assert len(other_params) == 301


def test_shared_columns_are_read_only_and_meta_is_private():
    first = generated_trace("chatbot", {"num_requests": 200}, 0)
    with pytest.raises(ValueError):
        first.input_tokens[0] = 7
    first.meta["capacity_source"] = "changed by a caller"
    second = generated_trace("chatbot", {"num_requests": 200}, 0)
    assert "capacity_source" not in second.meta


def test_cache_is_bounded_in_bytes(monkeypatch):
    monkeypatch.setattr(experiment, "TRACE_CACHE_BYTES", 1)
    generated_trace("agent", {"num_requests": 300}, 3)
    assert len(experiment._trace_cache) == 0  # larger than half the budget: not kept


def test_unknown_generator_keeps_generate_error():
    with pytest.raises(Exception, match="nosuch"):
        generated_trace("nosuch", {}, 0)


def test_replay_of_a_hit_equals_replay_of_a_fresh_trace():
    from lmsim.config import validate
    from lmsim.study.compose import build_simulation
    from lmsim.study.experiment import load_workload_trace

    raw = {
        "name": "cache", "seed": 1,
        "workload": {"generator": {"name": "chatbot", "params": {"num_requests": 150}}, "rate": 40.0, "limit": 120},
        "cluster": {"num_instances": 2, "profile": "h20/qwen3-30b-a3b"},
        "router": {"policy": "lmetric"},
    }  # fmt: skip
    config = validate(raw, where="test")
    runs = [build_simulation(config, load_workload_trace(config)).run() for _ in range(2)]  # miss, then hit
    assert len(experiment._trace_cache) == 1
    assert runs[0].requests.equals(runs[1].requests)
    timing = ("wall_time_s", "requests_per_wall_s", "router_us_per_decision")
    assert {k: v for k, v in runs[0].summary.items() if k not in timing} == {
        k: v for k, v in runs[1].summary.items() if k not in timing
    }


def test_requests_table_decodes_categoricals_like_the_per_row_strings():
    """The run's Parquet status/reject_reason columns, decoded from the categorical codes,
    equal the reference: one Python string (or null) per row."""
    import pandas as pd
    import pyarrow as pa

    from lmsim.study.rundir import requests_table

    codes = np.array([2, 0, -1, 1, 2, -1, 0])
    frame = pd.DataFrame({
        "status": pd.Categorical.from_codes(np.maximum(codes, 0), categories=["a", "b", "c"]),
        "reject_reason": pd.Categorical.from_codes(codes, categories=["x", "y", "z"]),
    })  # fmt: skip
    table = requests_table(frame)
    for name in frame.columns:
        reference = pa.array([None if pd.isna(v) else str(v) for v in frame[name].astype(object)], type=pa.string())
        assert table.column(name).combine_chunks().equals(reference)
    assert table.column("reject_reason").to_pylist() == ["z", "x", None, "y", "z", None, "x"]


def test_compact_trace_keeps_every_id_in_half_the_bytes():
    from lmsim.workload.trace import continued_ids

    generated = generate("coder", {"num_requests": 60}, seed=2)
    assert generated.hash_values.dtype == np.int32  # generators write compact ids
    trace = generated.replace(hash_values=generated.hash_values.astype(np.int64))
    small = trace.compact()
    assert small.hash_values.dtype == np.int32
    assert small.hash_values.nbytes * 2 == trace.hash_values.nbytes
    np.testing.assert_array_equal(small.hash_values, trace.hash_values)
    assert small.to_arrow().equals(trace.to_arrow())  # written as int64 either way
    assert small.take(np.arange(10)).hash_values.dtype == np.int32
    assert continued_ids(small, 0, 1).dtype == np.int64
    wide = trace.replace(hash_values=trace.hash_values + 2**31)
    assert wide.compact() is wide  # ids beyond int32 stay int64


@pytest.mark.parametrize("generator", ["coder", "toolagent"])  # 16- and 512-token trace blocks
def test_replay_of_a_compact_trace_equals_the_int64_reference(generator):
    from lmsim.config import validate
    from lmsim.study.compose import build_simulation

    raw = {
        "name": "compact", "seed": 0,
        "workload": {"generator": {"name": generator, "params": {"num_requests": 80}}},
        "cluster": {"num_instances": 2, "profile": "h20/qwen3-30b-a3b", "num_gpu_blocks": 400},
        "router": {"policy": "lmetric"},
    }  # fmt: skip
    config = validate(raw, where="test")
    small_trace = generate(generator, {"num_requests": 80}, seed=0)
    trace = small_trace.replace(hash_values=small_trace.hash_values.astype(np.int64))
    assert small_trace.hash_values.dtype == np.int32
    wide, small = build_simulation(config, trace).run(), build_simulation(config, small_trace).run()
    assert wide.requests.equals(small.requests)
    assert wide.instances.equals(small.instances)


def test_sweep_parent_generates_each_shared_workload_once(monkeypatch):
    """Before the pool forks, the parent generates every workload two or more points
    share (the workers inherit the cache); a workload of one point is left to its worker."""
    import lmsim.workload.generators as generators
    from lmsim.study.execute import _warm_trace_cache

    calls = []
    real = generators.generate
    monkeypatch.setattr(generators, "generate", lambda name, params, seed: calls.append((name, seed)) or real(name, params, seed=seed))

    def task(name, generator, seed, lam):
        raw = {
            "name": "warm", "seed": seed,
            "workload": {"generator": {"name": generator, "params": {"num_requests": 50}}, "rate": 10.0},
            "cluster": {"num_instances": 2, "profile": "h20/qwen3-30b-a3b"},
            "router": {"policy": "bailian", "params": {"lambda": lam}},
        }  # fmt: skip
        return {"name": name, "raw": raw, "where": "test"}

    tasks = [task("a", "agent", 0, 0.1), task("b", "agent", 0, 0.2), task("c", "agent", 0, 0.3),
             task("d", "chatbot", 0, 0.1), task("e", "agent", 1, 0.1)]  # fmt: skip
    _warm_trace_cache(tasks)
    assert calls == [("agent", 0)]
    generated_trace("agent", {"num_requests": 50}, 0)  # what a forked worker then finds
    assert calls == [("agent", 0)]


def test_generated_ids_widen_when_they_outgrow_int32(monkeypatch):
    from lmsim.workload.generators import base

    monkeypatch.setattr(base, "_CHUNK_BLOCKS", 4)  # one request per chunk
    plan = base.Plan(
        arrival=np.zeros(3), input_tokens=np.full(3, 64), output_tokens=np.ones(3, dtype=np.int64),
        chain=np.arange(3), keep=np.zeros(3, dtype=np.int64), chain_prefix_base=np.zeros(3, dtype=np.int64),
        chain_prefix_blocks=np.zeros(3, dtype=np.int64), first_fresh_id=2**31 - 6,
    )  # fmt: skip
    _offsets, values = base.chained_ids(plan, 16)
    assert values.dtype == np.int64
    np.testing.assert_array_equal(values, 2**31 - 6 + np.arange(12))
    plan.first_fresh_id = 0
    assert base.chained_ids(plan, 16)[1].dtype == np.int32
