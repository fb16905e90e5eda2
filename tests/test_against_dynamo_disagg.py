"""benchmarks/against_dynamo_disagg.py runs lmsim's side without the peer interpreter
(the comparison itself needs Dynamo's mocker: the manual's "Fidelity against peers"), and
the peer scripts' shared harness (benchmarks/peer_harness.py) does what they rely on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "against_dynamo_disagg.py"
TRACE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/conversation_trace.first40min.jsonl"


@pytest.mark.skipif(not TRACE.exists(), reason="needs the shared Kimi conversation trace")
def test_the_lmsim_side_runs_without_the_peer(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python benchmarks/...` puts it first
    spec = importlib.util.spec_from_file_location("against_dynamo_disagg", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--limit", "40", "--peer-python", "/nonexistent/python"]) == 0
    out = capsys.readouterr().out
    assert "first 40 rows" in out and "lmsim only" in out


def _harness(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import peer_harness

    return peer_harness


def test_the_harness_cuts_a_trace_and_reads_a_childs_json(tmp_path, monkeypatch):
    import sys

    harness = _harness(monkeypatch)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"row": {i}}}\n' for i in range(5)))
    cut = harness.first_rows(trace, 2, tmp_path)
    assert cut.read_text() == '{"row": 0}\n{"row": 1}\n'
    assert harness.first_rows(trace, None, tmp_path) == trace.resolve()
    code = "import json, sys; a = json.loads(sys.argv[1]); print('noise'); print(json.dumps({'twice': 2 * a['x']}))"
    assert harness.run_in_peer(sys.executable, code, {"x": 21}) == {"twice": 42}
    assert harness.run_in_peer(sys.executable, "raise SystemExit('broken')", {}) == {"error": "broken"}
    assert not harness.peer_available(str(tmp_path / "no-python"))
    assert harness.cell(None, 4) == "   -" and harness.cell(7, 4) == "   7" and harness.cell(0.5, 6, ".2f") == "  0.50"
