"""The benchmark clients' shared-prefix workloads: inference-perf `shared_prefix`, SGLang
`generated_shared_prefix`, vLLM `prefix_repetition`."""

from __future__ import annotations

import numpy as np
import pytest

from lmsim.errors import ConfigError
from lmsim.workload.generators import generate
from lmsim.workload.generators.prompt_text import exact_rows, random_token_text, rows_from_prompts

SMALL = {
    "num_groups": 3, "num_prompts_per_group": 2, "system_prompt_len": 64, "question_len": 16,
    "output_len": 4, "stages": [{"rate": 2, "duration": 5}, {"rate": 4, "duration": 2}], "load_type": "even",
}  # fmt: skip


def _common_text(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:n]


def _common_ids(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def test_shared_prefix_walks_the_same_permutation_every_stage():
    """6 prompts; stage 0 sends int(2 x 5) = 10 requests: prompts 0..5, 0..3; stage 1 sends
    int(4 x 2) = 8 and starts again at prompt 0: 0..5, 0, 1."""
    trace = generate("shared_prefix", SMALL, seed=0)
    assert trace.stage.tolist() == [0] * 10 + [1] * 8
    assert trace.text_id.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1]
    assert len(trace.prompt_texts) == 6
    assert (trace.output_tokens == 4).all()
    # even stages: 0.5 s apart from 0.5; stage 1 nominally from 5 + 1 = 6 s, 0.25 s apart
    assert trace.arrival_s[:2].tolist() == [0.5, 1.0]
    assert trace.arrival_s[10:12].tolist() == [6.25, 6.5]


def test_shared_prefix_groups_share_their_system_prompt():
    """A prompt is system + " " + question: two prompts of a group share the system text
    and at least its whole blocks (64 tokens nominal: about 4 blocks of 16); prompts of
    different groups share no block."""
    trace = generate("shared_prefix", SMALL, seed=0)
    texts = trace.prompt_texts
    first_row = {int(t): r for r, t in reversed(list(enumerate(trace.text_id.tolist())))}
    ids = {t: trace.hash_ids(r).astype(np.int64) for t, r in first_row.items()}
    pairs_same, pairs_other = 0, 0
    for a in range(6):
        for b in range(a + 1, 6):
            prefix = _common_text(texts[a], texts[b])
            shared = _common_ids(ids[a], ids[b])
            if len(prefix) > 100:  # same group: the system text and the joining space
                pairs_same += 1
                assert shared >= 3
            else:
                pairs_other += 1
                assert shared == 0
    assert (pairs_same, pairs_other) == (3, 12)  # 3 groups of 2


def test_retokenised_lengths_vary_by_a_few_percent():
    """SGLang's defaults: 2048 + 128 tokens nominal; re-tokenising the random-token text
    gives a mean within 1 % of 2176 and a spread of some tokens, not a fixed length."""
    trace = generate("generated_shared_prefix", {}, seed=3)
    assert len(trace) == 64 * 16
    assert abs(trace.input_tokens.mean() / 2176 - 1) < 0.01
    assert 5 < trace.input_tokens.std() < 0.05 * 2176
    assert (trace.arrival_s == 0).all()  # rate inf


def test_generated_shared_prefix_arrivals_start_at_zero():
    """get_request yields the first request at once, then sleeps exponential gaps."""
    trace = generate("generated_shared_prefix", {"num_groups": 2, "prompts_per_group": 3, "system_prompt_len": 32,
                                                  "question_len": 8, "output_len": 2, "rate": 5}, seed=1)
    assert trace.arrival_s[0] == 0.0 and len(trace) == 6
    assert all("\n\n" in t for t in trace.prompt_texts)


def test_prefix_repetition_lengths_are_exact_and_prefixes_shared():
    """25 requests over 4 prefixes: 25 // 4 = 6 per prefix, 24 requests of exactly
    256 + 256 tokens; prompts with the same prefix share its 256 / 16 = 16 blocks and then
    differ (a block that straddles nothing: 256 is a multiple of 16)."""
    trace = generate("prefix_repetition", {"num_requests": 25, "num_prefixes": 4}, seed=0)
    assert len(trace) == 24
    assert (trace.input_tokens == 512).all()
    groups: dict[str, list[int]] = {}
    for r in range(len(trace)):
        groups.setdefault(trace.prompt_text(r)[:200], []).append(r)
    assert sorted(len(g) for g in groups.values()) == [6, 6, 6, 6]
    a, b = next(iter(groups.values()))[:2]
    assert _common_ids(trace.hash_ids(a), trace.hash_ids(b)) == 16


def test_exact_rows_name_blocks_by_the_segments_they_end_in():
    """Prompts A(40) + b(10) and A(40) + c(10), blocks of 16: blocks 0 and 1 (tokens 0-31)
    lie in A and are shared; block 2 (32-47) ends after A's end, in b or c: not shared;
    the partial block 3 (48-49) neither."""
    lengths, blocks = exact_rows([[("A", 40), ("b", 10)], [("A", 40), ("c", 10)]], 16)
    assert lengths.tolist() == [50, 50]
    assert blocks[0].tolist() == [0, 1, 2, 3]
    assert blocks[1].tolist() == [0, 1, 4, 5]


def test_random_token_text_round_trip_is_near_nominal():
    """The vocabulary's mix gives the nominal length on average (measured: 0.991 at 128
    tokens, 0.996 at 2048)."""
    rng = np.random.default_rng(5)
    lengths, _ = rows_from_prompts([random_token_text(rng, 512) for _ in range(40)], 16)
    assert abs(lengths.mean() / 512 - 1) < 0.02


def test_token_scale_grows_every_prompt_and_keeps_the_shared_system_prompt():
    """The same texts re-tokenised at token_scale 2 (a tokenizer needing twice the tokens):
    each prompt's length is round(2 x the estimate's piece costs), i.e. twice the unscaled
    length give or take the one token of rounding, and the two prompts of a group still share
    the blocks of their system prompt, now twice as many (64 tokens: 4 blocks of 16 -> 8)."""
    one = generate("shared_prefix", SMALL, seed=3)
    two = generate("shared_prefix", {**SMALL, "token_scale": 2.0}, seed=3)
    assert one.prompt_texts == two.prompt_texts
    for k in range(len(one.prompt_texts)):
        rows = np.flatnonzero(one.text_id == k)[:1]
        assert abs(int(two.input_tokens[rows][0]) - 2 * int(one.input_tokens[rows][0])) <= 1
    texts = one.prompt_texts
    group = next((a, b) for a in range(6) for b in range(a + 1, 6)
                 if len(_common_text(texts[a], texts[b])) > 100)

    def shared_blocks(trace, a, b):
        ra, rb = (int(np.flatnonzero(trace.text_id == k)[0]) for k in (a, b))
        return _common_ids(trace.hash_ids(ra), trace.hash_ids(rb))

    assert shared_blocks(one, *group) in (3, 4)
    assert shared_blocks(two, *group) in (7, 8)


def test_generators_are_deterministic():
    a = generate("shared_prefix", SMALL, seed=4)
    b = generate("shared_prefix", SMALL, seed=4)
    assert a.prompt_texts == b.prompt_texts
    assert np.array_equal(a.hash_values, b.hash_values) and np.array_equal(a.arrival_s, b.arrival_s)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("shared_prefix", {"load_type": "bursty"}, "load_type must be one of poisson, constant, even"),
        ("shared_prefix", {"stages": [{"rate": 1}]}, r"stages\[0\] must be a mapping with exactly rate and duration"),
        ("shared_prefix", {"num_groups": 0}, "num_groups must be a whole number >= 1"),
        ("shared_prefix", {"interval_s": -1}, "interval_s must be a finite number >= 0"),
        ("shared_prefix", {"token_scale": 0}, "token_scale must be a finite number > 0"),
        ("generated_shared_prefix", {"rate": 0}, "rate must be > 0"),
        ("prefix_repetition", {"num_requests": 3, "num_prefixes": 4}, r"num_requests \(3\) must be >= num_prefixes \(4\)"),
    ],
)
def test_bad_parameters_are_one_line(name, params, message):
    with pytest.raises(ConfigError, match=message):
        generate(name, params, seed=0)


def test_llm_router_sessions_are_closed_loop_turns_with_history():
    """2 sessions x 3 turns, no code context or tool loops: each turn follows the previous
    one of its session (after_id, no think time), re-sends the history with the placeholder
    answer "ack t<k>" (not the real one), and every prompt starts with the shared system
    prompt, whose padding counts 4 characters a token: 32 's' = 8 words of "ssss"."""
    params = {"sessions": 2, "turns": 3, "system_chars": 64, "user_chars": 8,
              "code_session_share": 0.0, "tool_loop_prob": 0.0}  # fmt: skip
    trace = generate("llm_router_sessions", params, seed=1)
    assert len(trace) == 6
    assert (trace.output_tokens == 64).all() and (trace.delay_s == 0).all()
    for r in range(6):
        same = [x for x in range(r) if trace.session_id[x] == trace.session_id[r]]
        assert trace.after_id[r] == (same[-1] if same else -1)
        text = trace.prompt_text(r)
        assert text.startswith("<|system|>system: be helpful and concise. " + "s" * 32)
        turn = len(same)
        assert text.count("<|user|>turn ") == turn + 1
        assert text.count("<|assistant|>ack t") == turn
    # the history grows turn by turn, and the system prompt's blocks are shared
    first = [r for r in range(6) if trace.after_id[r] < 0]
    assert _common_ids(trace.hash_ids(first[0]), trace.hash_ids(first[1])) >= 1
    for r in range(6):
        if trace.after_id[r] >= 0:
            assert trace.input_tokens[r] > trace.input_tokens[trace.after_id[r]]
