"""benchmarks/against_dynamo_disagg.py runs lmsim's side without the peer interpreter
(the comparison itself needs Dynamo's mocker: README, "Disaggregated serving")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "against_dynamo_disagg.py"
TRACE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/conversation_trace.first40min.jsonl"


@pytest.mark.skipif(not TRACE.exists(), reason="needs the shared Kimi conversation trace")
def test_the_lmsim_side_runs_without_the_peer(capsys):
    spec = importlib.util.spec_from_file_location("against_dynamo_disagg", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--limit", "40", "--peer-python", "/nonexistent/python"]) == 0
    out = capsys.readouterr().out
    assert "first 40 rows" in out and "lmsim only" in out
