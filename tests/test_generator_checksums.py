"""Generated traces are bit-identical on every machine and numpy version (see
lmsim/workload/generators/base.py): each generator's output is pinned by a checksum
computed once (numpy 2.4.6 and 1.26.4 gave the same digests on this project's machine).

If a checksum changes, the generator's output changed: bump its `version` (the capacity
cache keys generated workloads by name, version, parameters and seed), re-measure the
shipped capacities (experiments/remeasure_capacities.sh), then update the digest here."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from lmsim.workload.generators import GENERATORS, generate
from lmsim.workload.generators.base import exp, on_time_grid, zipf_weights

COLUMNS = ("arrival_s", "input_tokens", "output_tokens", "hash_offsets", "hash_values",
           "session_id", "parent_id", "class_id", "after_id", "delay_s", "stage", "text_id")  # fmt: skip


def trace_checksum(trace) -> str:
    digest = hashlib.sha256()
    for name in COLUMNS:
        column = getattr(trace, name)
        if column is None:
            continue
        digest.update(name.encode())
        dtype = "<f8" if column.dtype.kind == "f" else "<i8"
        digest.update(np.ascontiguousarray(column, dtype=dtype).tobytes())
    return digest.hexdigest()[:16]


PINNED = {
    # name: (params, seed, requests, checksum, version)
    "chatbot": ({"num_requests": 400}, 3, 400, "0e64fafa77d30ce9", 2),
    "hotspot": ({"num_requests": 400}, 3, 400, "d7b3d5af7f31fcb8", 2),
    "agent": ({"num_requests": 400}, 3, 400, "af516d9c43b1bd3b", 3),
    "toolagent": ({"num_requests": 400}, 3, 400, "3242a83820c42f2e", 3),
    "coder": ({"num_requests": 400}, 3, 400, "bb0bc2e55a5f520c", 5),
    "random": ({"num_requests": 400, "input_len": {"distribution": "lognormal", "median": 600, "sigma": 1.0},
                "output_len": {"distribution": "uniform", "min": 64, "max": 192}, "prefix_len": 100,
                "rate": 5.0, "burstiness": 0.5}, 3, 400, "08bcbc6350d5f715", 1),
    "shared_prefix": ({"num_groups": 4, "num_prompts_per_group": 3, "system_prompt_len": 200, "question_len": 40,
                       "output_len": 20, "stages": [{"rate": 5, "duration": 20}, {"rate": 10, "duration": 10}],
                       "load_type": "poisson"}, 3, 200, "692b993c0f182c14", 1),
    "generated_shared_prefix": ({"num_groups": 8, "prompts_per_group": 4, "system_prompt_len": 300, "question_len": 50,
                                 "rate": 4.0}, 3, 32, "503969f67b468f70", 1),
    "prefix_repetition": ({"num_requests": 400, "num_prefixes": 8, "prefix_len": 200, "suffix_len": 50, "rate": 5.0},
                          3, 400, "0170b66834dfee06", 1),
    "llm_router_sessions": ({"sessions": 6, "turns": 4}, 3, 24, "6fafa99ecb3fb537", 1),
}


def test_every_generator_is_pinned() -> None:
    assert set(PINNED) == set(GENERATORS.names())


@pytest.mark.parametrize("name", sorted(PINNED))
def test_generator_output_is_pinned(name: str) -> None:
    params, seed, requests, checksum, version = PINNED[name]
    trace = generate(name, params, seed=seed)
    assert len(trace) == requests
    assert GENERATORS.get(name).version == version
    assert trace_checksum(trace) == checksum


def test_times_are_on_the_microsecond_grid() -> None:
    trace = generate("coder", {"num_requests": 200}, seed=1)
    for times in (trace.arrival_s, trace.delay_s):
        assert np.array_equal(on_time_grid(times), times)
        assert np.array_equal(np.rint(times * 1e6) / 1e6, times)


def test_helpers_by_hand() -> None:
    # exp goes through the C library: e^0 = 1, e^1 = math.e, shape kept
    assert exp(np.array([[0.0, 1.0]])).tolist() == [[1.0, 2.718281828459045]]
    # to whole microseconds: 1.2345674 s down, 2.0000006 s up, 7 s stays
    assert on_time_grid(np.array([1.2345674, 2.0000006, 7.0])).tolist() == [1.234567, 2.000001, 7.0]
    # Zipf alpha 2 over 3 ranks: 1, 1/4, 1/9, normalized by 49/36
    assert np.allclose(zipf_weights(3, 2.0), [36 / 49, 9 / 49, 4 / 49], rtol=0, atol=1e-15)
