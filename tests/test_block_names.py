"""Every full block a request fills has a name (issue 27 item 4): trace ids, the continuation,
or a synthetic name unique to the (row, block). Engine scenarios use the hand-checkable
linear profile (conftest: 10 ms + 1 ms per prefill token + 0.1 ms per decode sequence)."""

from __future__ import annotations

import numpy as np

from conftest import make_config, make_trace, simulate
from lmsim.engine.block_names import BlockNames, first_unnamed_key
from lmsim.engine.kv_cache import ANON
from lmsim.study.compose import build_simulation


def test_synthetic_names_start_above_every_trace_key():
    # Equal block sizes: keys are the ids themselves, the largest 41.
    assert first_unnamed_key(41, 16, 16) == 42
    # Mooncake: 512-token ids, 32 engine blocks each, keyed id * 32 + k % 32; id 41 keys up
    # to 41 * 32 + 31 = 1343, so synthetic names start at 42 * 32 = 1344.
    assert first_unnamed_key(41, 512, 16) == 1344
    # 8-token ids: an engine block is keyed by the id of its last half.
    assert first_unnamed_key(41, 8, 16) == 42
    assert first_unnamed_key(-1, 512, 16) == 0  # no ids at all
    # Python integers: ids near the int64 limit do not wrap around.
    assert first_unnamed_key(2**62, 512, 16) == (2**62 + 1) * 32


def test_names_cover_prompt_and_output_with_unique_synthetic_names():
    # 512-token trace blocks, 16-token engine blocks. Rows 0 and 1 send the same 600-token
    # prompt (ids 3, 4) and generate 40 tokens: 600 + 40 - 1 = 639 tokens get KV, 39 full
    # blocks. The trace names the prompt's 37 full blocks (600 // 16; id 3: 96..127, id 4:
    # 128..132); blocks 37 and 38 (the one where the prompt ends, completed by output, and
    # one of output) get synthetic names. base = (4 + 1) * 32 = 160, stride = the largest
    # full-block count of any row: row 2 (1000 + 24 - 1 = 1023 tokens) fills 63.
    trace = make_trace(
        [0, 1, 2], [600, 600, 1000], [40, 40, 24], [[3, 4], [3, 4], [3, 4]], block_size=512,
        session_id=[0, 1, 2],
    )
    names = BlockNames(trace, 16)
    assert (names.base, names.stride) == (160, 63)
    prompt, kv, shared = names.names(0, trace.hash_ids(0), 600, 40)
    assert prompt == [*range(96, 128), *range(128, 133)]
    assert kv == [*prompt, 160 + 37, 160 + 38] and shared == 37
    # The same prompt in another request: its own output blocks, never row 0's.
    prompt1, kv1, _ = names.names(1, trace.hash_ids(1), 600, 40)
    assert prompt1 == prompt and kv1[37:] == [160 + 63 + 37, 160 + 63 + 38]
    # A compact (int32) trace names every block the same.
    compact = trace.compact()
    assert compact.hash_values.dtype == np.int32
    widened = compact.hash_ids(1).astype(np.int64)
    assert BlockNames(compact, 16).names(1, widened, 600, 40) == (prompt1, kv1, 37)
    # Without generated-block caching only the prompt's 37 full blocks are named.
    assert BlockNames(trace, 16, cache_generated_blocks=False).names(0, trace.hash_ids(0), 600, 40) == (
        prompt, prompt, 37
    )


def test_unidentified_prompt_blocks_get_synthetic_names_but_routers_see_only_the_trace():
    # A 40-token prompt with no ids: 40 + 10 - 1 = 49 tokens, 3 full blocks, all synthetic
    # (base 0, stride 3); what a router sees (block_hashes) stays empty.
    trace = make_trace([0], [40], [10])
    assert BlockNames(trace, 16).names(0, trace.hash_ids(0), 40, 10) == ([], [0, 1, 2], 0)


def test_a_finished_requests_output_blocks_age_in_the_lru_queue():
    # 20 blocks. A (row 0): 32-token prompt (ids 1, 2), 40 outputs; 32 + 39 = 71 tokens get
    # KV: blocks 0-1 are its prompt, 2-3 its output (synthetic names 9 + 2 = 11 and 12: base
    # = max id 8 + 1, stride = A's 71 // 16 = 4), block 4 is partial. B (row 1) arrives at
    # 0.1 s while A decodes: 32-token prompt (ids 7, 8), 2 outputs, and finishes first (its
    # prefill step and one decode). Blocks are released tail first, cache entries to the
    # back of the queue: B's [8, 7], then A's [12, 11, 2, 1]. A's output blocks stay cached
    # behind B's younger entries; before they were content-free and went to the front,
    # reused before anything else (the queue was [8, 7, 2, 1] with 16 plain blocks).
    # (vLLM 0.33's free-queue order; under 0.11's release order each request's partial
    # tail block queues where it is freed, first of its release: [-1, 8, 7, -1, 12, 11, 2,
    # 1], and 12 never-used blocks.)
    trace = make_trace([0.0, 0.1], [32, 32], [40, 2], [[1, 2], [7, 8]], session_id=[0, 1])
    sim = build_simulation(make_config(cluster={"num_gpu_blocks": 20, "free_queue_order": "content_free_first"}), trace)
    result = sim.run()
    assert result.requests.finished_at.iloc[1] < result.requests.finished_at.iloc[0]
    cache = sim.instances[0].scheduler.cache
    assert cache.free_queue() == [8, 7, 12, 11, 2, 1]
    assert cache.num_plain_free == 14  # 20 - 6 entries: the two partial tails, never used
    sim = build_simulation(make_config(cluster={"num_gpu_blocks": 20, "free_queue_order": "release"}), trace)
    sim.run()
    cache = sim.instances[0].scheduler.cache
    assert cache.free_queue() == [ANON, 8, 7, ANON, 12, 11, 2, 1]
    assert cache.num_plain_free == 12


def test_a_preempted_request_resumes_with_its_own_unnamed_output_cached():
    # As test_engine_fidelity's resume scenario, without the follow-up rows that named the
    # output there. 11 blocks. A (ids 1-4, 30 outputs) and B (ids 11-14, 60 outputs)
    # prefill together (8 blocks) and take a 5th block each at KV 64. At KV 80 (17
    # outputs) both need a 6th: A gets the last free block and B, the newest, is preempted.
    # B's fifth block (tokens 64-79, all output) now carries a synthetic name and is a
    # cache entry, so B's resumed lookup (its 64-token prompt and 17 outputs: 81 tokens)
    # hits five blocks, 80 tokens. With an unnamed output block it hit the prompt, 64.
    trace = make_trace(
        [0.0, 0.0], [64, 64], [30, 60], [[1, 2, 3, 4], [11, 12, 13, 14]], session_id=[0, 1]
    )
    req = simulate(trace, cluster={"num_gpu_blocks": 11}).requests
    assert list(req.num_preemptions) == [0, 1]
    assert req.lookup_tokens.iloc[1] == 64 + 81
    assert req.lookup_hit_tokens.iloc[1] == 0 + 80


def test_without_generated_block_caching_output_blocks_are_never_cache_entries():
    # The scenario of test_a_finished_requests_output_blocks_age_in_the_lru_queue with
    # cluster.cache_generated_blocks off: only prompt blocks are entries, so the queue
    # holds B's [8, 7] then A's [2, 1], and A's two output blocks join the 14 plain ones.
    trace = make_trace([0.0, 0.1], [32, 32], [40, 2], [[1, 2], [7, 8]], session_id=[0, 1])
    config = make_config(
        cluster={"num_gpu_blocks": 20, "cache_generated_blocks": False, "free_queue_order": "content_free_first"}
    )
    sim = build_simulation(config, trace)
    sim.run()
    cache = sim.instances[0].scheduler.cache
    assert cache.free_queue() == [8, 7, 2, 1]
    assert cache.num_plain_free == 16


def test_without_generated_block_caching_a_follow_up_hits_only_the_prompt():
    # test_engine_fidelity's follow-up turn: request 1 re-sends request 0's 64-token prompt
    # and its answer (ids 5, 6 name request 0's output blocks). With generated blocks
    # cached it hits 96 tokens; without, only the 64 of the prompt, and the preempted
    # request of the resume scenario hits its prompt only (64, not 80).
    follow = make_trace(
        [0.0, 10.0], [64, 144], [48, 2], [[1, 2, 3, 4], list(range(1, 10))], parent_id=[-1, 0]
    )
    assert list(simulate(follow).requests.cached_tokens) == [0, 96]
    off = {"cache_generated_blocks": False}
    assert list(simulate(follow, cluster=off).requests.cached_tokens) == [0, 64]
    resume = make_trace(
        [0.0, 0.0], [64, 64], [30, 60], [[1, 2, 3, 4], [11, 12, 13, 14]], session_id=[0, 1]
    )
    req = simulate(resume, cluster={"num_gpu_blocks": 11, **off}).requests
    assert list(req.num_preemptions) == [0, 1]
    assert req.lookup_hit_tokens.iloc[1] == 64
