"""`lmsim trace convert` streams Claude Code sessions to Parquet with the same result as
loading the file whole (the reference), refuses a non-.parquet --out, says which format it
read; and every document a help text or `lmsim policies` cites exists."""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lmsim.cli import build_parser, main
from lmsim.cli.listing import cite_only_shipped_documents, document_exists
from lmsim.workload import convert
from lmsim.workload.convert import convert_trace
from lmsim.workload.formats import load_trace

FIX = Path(__file__).parent / "fixtures" / "traces"
SMALL = FIX / "claude_code_small.jsonl"


def same_parquet(a: Path, b: Path) -> bool:
    ta, tb = pq.read_table(a), pq.read_table(b)
    return ta.equals(tb) and ta.schema.metadata == tb.schema.metadata


def bad_rows_file(tmp_path: Path) -> Path:
    """The fixture plus a session whose second request has 3 ids for 64 tokens (needs 1)
    and whose third follows it: skipping drops the second and unlinks the third."""
    bad = {"id": "bad", "block_size": 64, "hash_id_scope": "local", "requests": [
        {"t": 0, "type": "n", "in": 64, "out": 2, "hash_ids": [1]},
        {"t": 5, "type": "n", "in": 64, "out": 2, "hash_ids": [1, 2, 3], "think_time": 1.0},
        {"t": 9, "type": "n", "in": 128, "out": 0, "hash_ids": [1, 2], "think_time": 2.0},
    ]}  # fmt: skip
    path = tmp_path / "bad.jsonl"
    path.write_text(SMALL.read_text().rstrip("\n") + "\n" + json.dumps(bad) + "\n")
    return path


@pytest.mark.parametrize("variant", ["plain", "gzip", "single", "skip_bad_rows"])
def test_streaming_equals_the_whole_file_loader(tmp_path: Path, monkeypatch, variant: str) -> None:
    monkeypatch.setattr(convert, "ROW_GROUP_IDS", 3)  # several row groups even here
    source, skip = SMALL, False
    if variant == "gzip":
        source = tmp_path / "s.jsonl.gz"
        source.write_bytes(gzip.compress(SMALL.read_bytes()))
    elif variant == "single":
        source = tmp_path / "trace_0001.json"
        source.write_text(json.dumps(json.loads(SMALL.read_text().splitlines()[0]), indent=2))
    elif variant == "skip_bad_rows":
        source, skip = bad_rows_file(tmp_path), True
    reference = tmp_path / "reference.parquet"
    load_trace(source, format="claude_code", skip_bad_rows=skip).save(reference)
    fmt, rows, skipped = convert_trace(source, tmp_path / "streamed.parquet", skip_bad_rows=skip)
    assert fmt == "claude_code"
    assert same_parquet(reference, tmp_path / "streamed.parquet")
    assert pq.ParquetFile(tmp_path / "streamed.parquet").num_row_groups > 1
    if variant == "skip_bad_rows":
        assert (rows, skipped) == (8, 1)  # 6 + 2 kept; the clamped 0-output row is kept
        table = pq.read_table(tmp_path / "streamed.parquet").to_pydict()
        assert table["after_id"][-1] == -1 and table["output_tokens"][-1] == 1
    assert not list(tmp_path.glob(".*"))  # no temporary file left


def test_a_bad_row_stops_the_conversion_with_its_line(tmp_path: Path, capsys) -> None:
    path = bad_rows_file(tmp_path)
    out = tmp_path / "out.parquet"
    assert main(["trace", "convert", str(path), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"lmsim: error: {path}: line 3: requests[1]: hash_ids has 3 ids but in 64 with 64-token blocks needs 1"
    assert not out.exists() and not list(tmp_path.glob(".*"))


def test_convert_names_the_format_and_refuses_other_suffixes(tmp_path: Path, capsys) -> None:
    assert main(["trace", "convert", str(SMALL), "--out", str(tmp_path / "t.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"lmsim: error: {tmp_path / 't.csv'}: --out must name a .parquet file (the canonical trace format)"]
    assert not (tmp_path / "t.csv").exists()
    assert main(["trace", "convert", str(SMALL), "--out", str(tmp_path / "t.parquet")]) == 0
    out = capsys.readouterr().out
    assert f"{SMALL}: format claude_code (detected)" in out and "wrote 6 requests" in out


def _help_texts(parser: argparse.ArgumentParser) -> list[str]:
    texts = [parser.description or ""]
    for action in parser._actions:
        texts.append(action.help or "")
        if isinstance(action, argparse._SubParsersAction):
            texts.extend(choice.help or "" for choice in action._choices_actions)
            for sub in action.choices.values():
                texts.extend(_help_texts(sub))
    return texts


def test_help_texts_cite_only_documents_that_exist() -> None:
    cited = [d for text in _help_texts(build_parser()) for d in re.findall(r"[\w./-]+\.(?:md|txt)\b", text)]
    assert all(document_exists(d) for d in cited), cited


def test_policies_listing_drops_citations_of_missing_documents(capsys) -> None:
    assert cite_only_shipped_documents("LMetric (policies.md §9a): P x BS") == "LMetric: P x BS"
    assert cite_only_shipped_documents("see (traces/README.md) and (tie-break)") == "see (traces/README.md) and (tie-break)"
    assert main(["policies"]) == 0
    assert ".md" not in capsys.readouterr().out
