"""The ShareGPT loader and the tokenizer-free token estimate (lmsim/workload/sharegpt.py,
lmsim/workload/text_tokens.py), on a hand-written fixture (tests/fixtures/traces/
sharegpt_small.json; not ShareGPT data).

Counting by hand: a message's pieces (Qwen2's pre-tokenizer) cost 1.08 tokens each and the
count is round(1.08 * pieces) for Latin text, so 4 pieces are 4 tokens, 5 are 5, 7 are 8
(7.56), 9 are 10 (9.72) and 16 are 17 (17.28). The fixture's messages:

| message | pieces | tokens |
|---|---|---|
| a0, b0 "What is the capital of France?" | What, ␣is, ␣the, ␣capital, ␣of, ␣France, ? | 8 |
| a1 "The capital of France is Paris." | 7 | 8 |
| a2 "And of Italy?" | And, ␣of, ␣Italy, ? | 4 |
| a3 "Rome, since 1871." | Rome , ␣since ␣ 1 8 7 1 . (digits one by one) | 10 |
| b1 "Paris, of course." | Paris , ␣of ␣course . | 5 |
| c0 "Write a haiku about the sea, please." | 9 | 10 |
| c1 the haiku (3 lines) | 13 words + 2 newlines + ... | 17 |
| d: one message only | (dropped: fewer than two messages) | |
| e0 "(continued) as I said before." (from gpt) | 7 | 8 |
| e1 "Thanks! Can you summarize it?" | 7 | 8 |
| e2 "Sure: the answer was yes." | 7 | 8 |
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import LINEAR, simulate
from lmsim.errors import ConfigError, TraceError
from lmsim.workload.convert import convert_trace
from lmsim.workload.formats import infer_format, load_trace
from lmsim.workload.text_tokens import PIECE, TokenStream, estimate_tokens
from lmsim.workload.trace import read_parquet

FIXTURE = Path(__file__).parent / "fixtures" / "traces" / "sharegpt_small.json"
IN_ORDER = {"shuffle": False, "block_size": 4}


def rows(trace) -> list[tuple[int, int, list[int]]]:
    return [(int(trace.input_tokens[i]), int(trace.output_tokens[i]), trace.hash_ids(i).tolist()) for i in range(len(trace))]


def test_piece_counts_of_the_table() -> None:
    assert PIECE.findall("What is the capital of France?") == ["What", " is", " the", " capital", " of", " France", "?"]
    assert PIECE.findall("Rome, since 1871.") == ["Rome", ",", " since", " ", "1", "8", "7", "1", "."]
    assert [estimate_tokens(t).count for t in ("And of Italy?", "Paris, of course.", "What is the capital of France?",
                                               "Rome, since 1871.", "")] == [4, 5, 8, 10, 0]  # fmt: skip
    assert estimate_tokens("中文字").count == 2  # 3 ideographs * 0.70 = 2.1
    assert estimate_tokens("한국어").count == 4  # 3 syllables * 1.44 = 4.32
    assert estimate_tokens("What is the capital of France?", scale=1.5).count == 11  # 7 * 1.62 = 11.34


def test_first_turns_as_vllm_samples_them() -> None:
    # one request per conversation: message 0 the prompt (whatever its role: e0 is gpt's),
    # message 1's length the output; d has one message and is dropped
    trace = load_trace(FIXTURE, params=IN_ORDER)
    assert infer_format(FIXTURE) == "sharegpt"
    # a and b open with the same message: both 4-token blocks shared, nothing else is
    assert rows(trace) == [(8, 8, [0, 1]), (8, 5, [0, 1]), (10, 17, [2, 3, 4]), (8, 8, [5, 6])]
    assert trace.arrival_s.tolist() == [0.0] * 4  # rate inf, vLLM's default
    assert trace.session_id.tolist() == [0, 1, 2, 3] and trace.after_id is None
    assert trace.meta["conversations"] == "4" and trace.meta["conversations_too_short"] == "1"


def test_all_turns_carry_the_history() -> None:
    # a's turn 1 prompt = a0 + a1 + a2 = 8 + 8 + 4 = 20 tokens (5 blocks) and begins with
    # turn 0's two blocks; e's leading gpt message is skipped, so e is (e1, e2). Ids are
    # numbered conversation by conversation (a's turn 1 takes 2-4), rows then sorted by time.
    trace = load_trace(FIXTURE, params={**IN_ORDER, "turns": "all", "think_time_s": 3.0})
    assert rows(trace) == [(8, 8, [0, 1]), (8, 5, [0, 1]), (10, 17, [5, 6, 7]), (8, 8, [8, 9]),
                           (20, 10, [0, 1, 2, 3, 4])]  # fmt: skip
    # sorted by arrival estimate: a's second turn (3 s after the first) comes last
    assert trace.arrival_s.tolist() == [0.0, 0.0, 0.0, 0.0, 3.0]
    assert trace.session_id.tolist() == [0, 1, 2, 3, 0]
    assert trace.after_id.tolist() == [-1, -1, -1, -1, 0] and trace.parent_id.tolist() == [-1, -1, -1, -1, 0]
    assert trace.delay_s.tolist() == [0.0, 0.0, 0.0, 0.0, 3.0]


def test_vllm_length_filter_and_output_len() -> None:
    # max prompt 9 drops c (10 tokens) in first-turn mode, and a's second turn (20)
    first = load_trace(FIXTURE, params={**IN_ORDER, "max_prompt_tokens": 9})
    assert [r[0] for r in rows(first)] == [8, 8, 8] and first.meta["requests_filtered"] == "1"
    # b's reply is 5 tokens: min_tokens 6 drops it, unless output_len replaces the reply
    assert len(load_trace(FIXTURE, params={**IN_ORDER, "min_tokens": 6})) == 3
    fixed = load_trace(FIXTURE, params={**IN_ORDER, "min_tokens": 6, "output_len": 2})
    assert fixed.output_tokens.tolist() == [2, 2, 2, 2]
    every = load_trace(FIXTURE, params={**IN_ORDER, "turns": "all", "max_total_tokens": 26})
    assert [r[:2] for r in rows(every)] == [(8, 8), (8, 5), (8, 8)]  # c: 10+17, a turn 1: 20+10
    assert every.meta["requests_filtered"] == "2"


def test_shuffle_and_arrivals_follow_the_seed() -> None:
    # vLLM shuffles the conversations with Python's random seeded by --seed
    order = ["a", "b", "c", "e"]
    random.Random(7).shuffle(order)
    prompts = {"a": 8, "b": 8, "c": 10, "e": 8}
    outputs = {"a": 8, "b": 5, "c": 17, "e": 8}
    trace = load_trace(FIXTURE, params={"seed": 7, "rate": 2.0, "burstiness": "inf"})
    assert trace.input_tokens.tolist() == [prompts[k] for k in order]
    assert trace.output_tokens.tolist() == [outputs[k] for k in order]
    assert trace.arrival_s.tolist() == [0.5, 1.0, 1.5, 2.0]  # constant gaps 1/rate


def test_block_names_share_exactly_the_common_prefix() -> None:
    france = TokenStream([("user", "What is the capital of France?")])
    spain = TokenStream([("user", "What is the capital of Spain?")])
    # tokens 0-3 are "What is the capital" in both; block 1 holds " of France?" / " of Spain?"
    f, s = france.block_names(8, 4), spain.block_names(8, 4)
    assert f[0] == s[0] and f[1] != s[1]
    # the role is content: the same text from another role shares nothing
    assert TokenStream([("assistant", "What is the capital of France?")]).block_names(8, 4)[0] != f[0]
    # a partial last block differs from the whole block that extends it
    longer = TokenStream([("user", "What is the capital of France?"), ("assistant", "Paris.")])
    assert longer.block_names(6, 4)[0] == f[0] and longer.block_names(6, 4)[1] != longer.block_names(8, 4)[1]
    assert longer.block_names(8, 4) == f  # a prompt ending at a message boundary is that message


def test_convert_writes_the_same_trace(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    name, count, skipped = convert_trace(FIXTURE, out, params={**IN_ORDER, "turns": "all"})
    assert (name, count, skipped) == ("sharegpt", 5, 0)
    assert rows(read_parquet(out)) == rows(load_trace(FIXTURE, params={**IN_ORDER, "turns": "all"}))


def test_prefix_caching_across_turns_on_one_instance(tmp_path: Path) -> None:
    # turn 0: 40 words (43 tokens: round(40 * 1.08)), reply 30 words (32 tokens); turn 1
    # adds 20 words (22). The engine caches the full 16-token blocks of turn 0's
    # prompt + output - 1 = 74 tokens, 4 blocks, which turn 1's prompt (97 tokens) finds.
    conv = {"conversations": [{"from": "human", "value": " ".join(["alpha"] * 40)},
                              {"from": "gpt", "value": " ".join(["beta"] * 30)},
                              {"from": "human", "value": " ".join(["gamma"] * 20)},
                              {"from": "gpt", "value": "ok fine then"}]}  # fmt: skip
    path = tmp_path / "one.json"
    path.write_text(json.dumps([conv]))
    trace = load_trace(path, params={"turns": "all", "min_tokens": 1})
    assert trace.input_tokens.tolist() == [43, 97] and trace.output_tokens.tolist() == [32, 3]
    results = simulate(trace, cluster={"num_instances": 1, "profile": dict(LINEAR), "num_gpu_blocks": 1000})
    assert results.requests["cached_tokens"].tolist() == [0, 64]


@pytest.mark.parametrize(("text", "params", "message"), [
    ('[{"conversations": "hi"}]', {}, "line 1: entry 0: conversations is missing or not a list"),
    ('[\n {"conversations": []},\n {"conversations": [{"from": "human"}]}\n]', {},
     "line 3: entry 1: conversations\\[0\\] needs string fields 'from' and 'value'"),
    ('[\n 3\n]', {}, "line 2: entry 0: must be a JSON object, got int"),
    ('[{"conversations": [{"from": "human", "value": "x"}', {}, "not valid JSON"),
    ('[{"conversations": [{"from": "human", "value": "a b c d e"}, {"from": "gpt", "value": "f g h i"}]}', {},
     "the JSON list is not closed"),
    ('[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]', {},
     "no ShareGPT request passes the filters"),
    ('[]', {"turns": "some"}, "turns must be 'first' or 'all'"),
    ('[]', {"rate": -1}, "rate must be > 0"),
    ('[]', {"turns": "all", "output_len": 5}, "output_len applies to turns: first only"),
    ('[]', {"tunrs": "all"}, "no parameter 'tunrs'; did you mean 'turns'"),
])  # fmt: skip
def test_bad_input_is_one_line(tmp_path: Path, text: str, params: dict, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises((TraceError, ConfigError), match=message):
        load_trace(path, format="sharegpt", params=params)


def test_skip_bad_rows_counts_them(tmp_path: Path) -> None:
    entries = json.loads(FIXTURE.read_text())
    path = tmp_path / "mixed.jsonl"  # JSON lines work as well as a list
    path.write_text("\n".join(json.dumps(e) for e in [*entries, {"conversations": 5}]) + "\n")
    trace = load_trace(path, format="sharegpt", skip_bad_rows=True, params=IN_ORDER)
    assert len(trace) == 4 and trace.meta["skipped_rows"] == "1"


def test_large_values_cross_read_chunks(tmp_path: Path) -> None:
    # one message of 3 MB spans several 1 MB reads of the streaming JSON reader
    big = " ".join(["word"] * 600_000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": big}, {"from": "gpt", "value": "ok then yes sure"}]}] * 2))
    trace = load_trace(path, params={"max_prompt_tokens": None, "max_total_tokens": None})
    assert trace.input_tokens.tolist() == [648_000, 648_000]  # 600,000 pieces * 1.08
    assert np.array_equal(trace.hash_ids(0), trace.hash_ids(1))


def test_cli_convert_takes_format_params(tmp_path: Path) -> None:
    from test_sweep import run_cli

    out = tmp_path / "t.parquet"
    proc = run_cli("trace", "convert", str(FIXTURE), "--format", "sharegpt", "--param", "turns=all",
                   "--param", "shuffle=false", "--out", str(out), "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "wrote 5 requests" in proc.stdout
    # every turn at t = 0 (rate inf, no think time): file order, a's two turns first
    assert read_parquet(out).input_tokens.tolist() == [8, 20, 8, 10, 8]
