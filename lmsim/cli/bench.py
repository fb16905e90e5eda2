"""`lmsim bench`: fixed workloads, each in a fresh process, one row each."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lmsim.study.bench import HEADER, run_bench


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="measure simulator speed and memory on fixed workloads")
    p.add_argument("--quick", action="store_true", help="smaller workloads (a few minutes in all)")
    p.add_argument("--profile", action="store_true", help="add a cProfile breakdown per workload")
    p.add_argument("--json", dest="json_path", help="write the table as JSON records")
    p.add_argument("--only", help="run one workload or policy (e.g. chatbot/lmetric)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: Any) -> int:
    print("lmsim bench: 16 x Qwen3-30B-A3B/H20, load 0.5; one child process per workload")
    print(HEADER, flush=True)
    rows = run_bench(args.quick, args.profile, args.only)
    if args.json_path:
        path = Path(args.json_path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(rows, indent=2) + "\n")
        os.replace(tmp, path)
    return 1 if any("error" in r for r in rows) else 0

