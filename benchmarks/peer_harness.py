"""What the side-by-side scripts against Dynamo's mocker share: where the peer interpreter and
the trace live, running a piece of code in the peer's interpreter, cutting a trace to its
first rows, and the table cells. The peer (ai-dynamo 1.6.1) runs from its own venv, never as
a dependency of lmsim: `--peer-python`, default `$LMSIM_PEER_DYNAMO_PYTHON` or
../venvs/peer-dynamo/bin/python beside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# ../shared and the peer venv sit beside the checkout, as in CI and the project's machines
BESIDE = Path(__file__).resolve().parents[1].parent
DEFAULT_TRACE = str(BESIDE / "shared/traces/mooncake/conversation_trace.first40min.jsonl")
DEFAULT_PEER = os.environ.get("LMSIM_PEER_DYNAMO_PYTHON", str(BESIDE / "venvs/peer-dynamo/bin/python"))


def peer_available(python: str) -> bool:
    """The interpreter exists and imports Dynamo's offline replay."""
    if not Path(python).exists():
        return False
    probe = subprocess.run([python, "-c", "import dynamo.replay"], capture_output=True, check=False)
    return probe.returncode == 0


def run_in_peer(python: str, code: str, args: dict, *, log_level: str = "error") -> dict:
    """Run `code` in the peer interpreter with `args` as its JSON argv[1] (see run_json)."""
    return run_json([python, "-c", code, json.dumps(args)], log_level=log_level)


def run_json(cmd: list[str], *, log_level: str = "error") -> dict:
    """Run a child whose last printed line is its JSON answer; {"error": its last line of
    output} when it fails. Dynamo's router logs every decision at INFO: logging is not
    simulation work (and would be timed), so it is turned down."""
    env = {**os.environ, "DYN_LOG": log_level, "RUST_LOG": log_level}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0]}
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def first_rows(trace: str | Path, limit: int | None, folder: str | Path) -> Path:
    """The trace itself, or a copy of its first `limit` rows (JSON lines) in `folder`."""
    trace = Path(trace).resolve()
    if limit is None:
        return trace
    cut = Path(folder) / f"first{limit}-{trace.name}"
    with open(trace) as src, open(cut, "w") as dst:
        for i, line in enumerate(src):
            if i >= limit:
                break
            dst.write(line)
    return cut


def trace_missing(trace: str, prog: str) -> bool:
    """Say so (one line on stderr) when the trace is not there."""
    if Path(trace).is_file():
        return False
    print(f"{prog}: --trace {trace}: no such file", file=sys.stderr)
    return True


def cell(value: float | int | None, width: int = 10, fmt: str = ".4g") -> str:
    """A right-aligned table cell; '-' for a value one side does not have."""
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:{width}d}" if isinstance(value, int) else f"{value:{width}{fmt}}"
