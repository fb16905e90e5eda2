"""Loaders: exact canonical rows from hand-written fixtures, and one-line errors on bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from lmsim.errors import TraceError
from lmsim.workload.formats import FORMATS, infer_format, load_trace
from lmsim.workload.trace import read_parquet

FIX = Path(__file__).parent / "fixtures" / "traces"
SHARED = Path(__file__).resolve().parents[2] / "shared"
REPO = Path(__file__).resolve().parents[1]


def ids(trace):
    return [trace.hash_ids(i).tolist() for i in range(len(trace))]


def test_registry_names():
    assert FORMATS.names() == ["azure", "bailian", "canonical", "claude_code", "mooncake", "sharegpt", "vidur"]


def test_mooncake_rows():
    t = load_trace(FIX / "mooncake_small.jsonl", format="mooncake")
    assert t.block_size == 512
    assert t.arrival_s.tolist() == [0.0, 0.0, 3.0]
    assert t.input_tokens.tolist() == [1000, 512, 1600]
    assert t.output_tokens.tolist() == [10, 5, 7]
    assert ids(t) == [[0, 1], [0], [0, 1, 2, 3]]
    assert t.session_id is None and t.after_id is None
    assert t.meta["skipped_rows"] == "0"


def test_bailian_rows():
    t = load_trace(FIX / "bailian_small.jsonl", format="bailian")
    assert t.block_size == 16
    assert t.arrival_s.tolist() == [0.5, 1.25, 2.0, 2.0]
    assert t.input_tokens.tolist() == [40, 16, 70, 90]
    assert t.output_tokens.tolist() == [8, 4, 9, 3]
    assert ids(t) == [[1, 2, 3], [7], [1, 2, 4, 5, 6], [1, 2, 4, 5, 8, 9]]
    assert t.parent_id.tolist() == [-1, -1, 0, 2]
    assert t.session_id.tolist() == [0, 1, 0, 0]


def test_claude_code_rows_namespaced_and_closed_loop():
    t = load_trace(FIX / "claude_code_small.jsonl", format="claude_code")
    assert t.block_size == 64
    # session 1 starts one stagger (30 s) after session 0; the sub-agent at 10 s
    assert t.arrival_s.tolist() == [0.0, 10.0, 14.0, 20.0, 30.0, 35.0]
    assert t.input_tokens.tolist() == [130, 64, 128, 200, 70, 140]
    assert t.output_tokens.tolist() == [5, 3, 2, 6, 4, 4]
    # main chain keeps ids 1..3; the sub-agent is shifted by 4; session 2 by 7
    assert ids(t) == [[1, 2], [5], [5, 6], [1, 2, 3], [8], [8, 12]]
    assert t.after_id.tolist() == [-1, -1, 1, 0, -1, 4]
    assert t.parent_id.tolist() == t.after_id.tolist()
    assert t.delay_s.tolist() == [0.0, 0.0, 1.5, 12.0, 0.0, 2.0]
    assert t.session_id.tolist() == [0, 0, 0, 0, 1, 1]
    t.validate()


def test_claude_code_single_session_file_and_gzip(tmp_path):
    first = (FIX / "claude_code_small.jsonl").read_text().splitlines()[0]
    single = tmp_path / "trace_0001.json"
    single.write_text(json.dumps(json.loads(first), indent=2))
    t = load_trace(single, format="claude_code")
    assert len(t) == 4
    gz = tmp_path / "s.jsonl.gz"
    gz.write_bytes(gzip.compress((FIX / "claude_code_small.jsonl").read_bytes()))
    assert len(load_trace(gz)) == 6


def test_azure_rows():
    t = load_trace(FIX / "azure_small.csv")
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.052, 1.52004], atol=1e-7)
    assert t.input_tokens.tolist() == [4808, 3180, 110]
    assert t.output_tokens.tolist() == [10, 8, 27]
    assert ids(t) == [[], [], []]


def test_infer_format_and_canonical_roundtrip(tmp_path):
    assert infer_format(FIX / "mooncake_small.jsonl") == "mooncake"
    assert infer_format(FIX / "bailian_small.jsonl") == "bailian"
    assert infer_format(FIX / "claude_code_small.jsonl") == "claude_code"
    assert infer_format(FIX / "azure_small.csv") == "azure"
    t = load_trace(FIX / "bailian_small.jsonl")
    out = tmp_path / "t.parquet"
    t.save(out)
    back = load_trace(out)
    assert ids(back) == ids(t)
    assert back.parent_id.tolist() == t.parent_id.tolist()
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"a": 1}\n')
    with pytest.raises(TraceError, match="--format"):
        load_trace(odd)


BAD_CASES = [
    # (line text inserted as line 2, expected message fragment)
    ('{"timestamp": 1, "input_length": 10, ', "line 2: record is not valid JSON"),
    ('{"timestamp": 1, "output_length": 3, "hash_ids": [0]}', "line 2: input_length is missing"),
    ('{"timestamp": 1, "input_length": -5, "output_length": 3, "hash_ids": []}',
     "line 2: input_length must be >= 0, got -5"),
    ('{"timestamp": 1, "input_length": 600, "hash_ids": [0, 1]}', "line 2: output_length is missing"),
    ('{"timestamp": 1, "input_length": 600, "output_length": 3, "hash_ids": [0, 1, 2]}',
     "line 2: hash_ids has 3 ids but input_length 600 with 512-token blocks needs 1 to 2"),
]  # fmt: skip


@pytest.mark.parametrize("bad, message", BAD_CASES)
def test_bad_mooncake_rows(tmp_path, bad, message):
    good1 = '{"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [0]}'
    good3 = '{"timestamp": 2000, "input_length": 100, "output_length": 2, "hash_ids": [9]}'
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good1}\n{bad}\n{good3}\n")
    with pytest.raises(TraceError) as err:
        load_trace(path, format="mooncake")
    text = str(err.value)
    assert text == text.strip() and "\n" not in text
    assert text.startswith(f"{path}: {message}")
    skipped = load_trace(path, format="mooncake", skip_bad_rows=True)
    assert len(skipped) == 2
    assert skipped.meta["skipped_rows"] == "1"
    assert skipped.arrival_s.tolist() == [0.0, 2.0]


def test_timestamps_backwards(tmp_path):
    lines = [
        '{"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 5000, "input_length": 100, "output_length": 2, "hash_ids": [1]}',
        '{"timestamp": 4000, "input_length": 100, "output_length": 2, "hash_ids": [2]}',
        '{"timestamp": 6000, "input_length": 100, "output_length": 2, "hash_ids": [3]}',
    ]
    path = tmp_path / "back.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"line 3: timestamp goes backwards \(4 after 5\)"):
        load_trace(path, format="mooncake")
    t = load_trace(path, format="mooncake", skip_bad_rows=True)
    assert t.arrival_s.tolist() == [0.0, 5.0, 6.0]
    assert ids(t) == [[0], [1], [3]]


def test_bailian_bad_hash_count(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(
        '{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 40, '
        '"output_length": 1, "hash_ids": [1]}\n'
    )
    with pytest.raises(TraceError, match="line 1: hash_ids has 1 ids but input_length 40 with 16-token blocks needs 2 to 3"):
        load_trace(path, format="bailian")


def test_azure_bad_rows(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,48,10\n"
        "2023-11-16 18:17:04.0319600,,8\n"
        "2023-11-16 18:17:05.0000000,12,-1\n"
        "2023-11-16 18:17:06.0000000,12,1\n"
    )
    with pytest.raises(TraceError, match=r"a\.csv: line 3: ContextTokens is missing"):
        load_trace(path)
    t = load_trace(path, skip_bad_rows=True)
    assert t.meta["skipped_rows"] == "2"
    assert t.input_tokens.tolist() == [48, 12]


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.jsonl", format="mooncake")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty"):
        load_trace(empty, format="mooncake")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(TraceError, match="no valid rows"):
        load_trace(blank, format="mooncake")
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.parquet")


def test_bundled_sample_is_first_1000_kimi_rows():
    sample = read_parquet(REPO / "traces" / "kimi_conversation_sample.parquet")
    assert len(sample) == 1000 and sample.block_size == 512
    assert sample.arrival_s[0] == 0.0 and sample.hash_ids(0)[0] == 0
    src = SHARED / "traces" / "mooncake" / "conversation_trace.first40min.jsonl"
    if not src.exists():
        pytest.skip("../shared traces not available")
    full = load_trace(src, format="mooncake")
    np.testing.assert_array_equal(full.input_tokens[:1000], sample.input_tokens)
    np.testing.assert_array_equal(full.hash_values[: full.hash_offsets[1000]], sample.hash_values)
