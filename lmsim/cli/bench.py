"""`lmsim bench`: fixed workloads, each in a fresh process, one row each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmsim.cli.options import add_overwrite_option, command_help
from lmsim.outputs import check_output_file, write_text
from lmsim.study.bench import HEADER, run_bench


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help=command_help("bench"))
    p.add_argument("--quick", action="store_true", help="smaller workloads (a few minutes in all)")
    p.add_argument("--profile", action="store_true", help="add a cProfile breakdown per workload")
    p.add_argument("--json", dest="json_path", help="write the table as JSON records")
    add_overwrite_option(p, "--json file lmsim did not write")
    p.add_argument("--only", help="run one workload or policy (e.g. chatbot/lmetric)")
    p.set_defaults(func=cmd_bench)


def is_bench_json(path: Path) -> bool:
    """A table `--json` wrote: a JSON list of rows, each naming its workload and policy."""
    rows = json.loads(path.read_text())
    return isinstance(rows, list) and bool(rows) and all(isinstance(r, dict) and {"workload", "policy"} <= r.keys() for r in rows)


def cmd_bench(args: Any) -> int:
    if args.json_path:  # refuse now, not after minutes of benchmarking
        check_output_file(args.json_path, overwrite=args.overwrite, ours=is_bench_json, option="--json")
    print("lmsim bench: 16 x Qwen3-30B-A3B/H20, load 0.5; one child process per workload")
    print(HEADER, flush=True)
    rows = run_bench(args.quick, args.profile, args.only)
    if args.json_path:
        write_text(args.json_path, json.dumps(rows, indent=2) + "\n")
    return 1 if any("error" in r for r in rows) else 0

