"""`lmsim report`: one self-contained HTML page for any set of saved runs and sweeps."""

from __future__ import annotations

import sys
from typing import Any

from lmsim.cli.options import add_overwrite_option, command_help
from lmsim.viz.report import write_report


def cmd_report(args: Any) -> int:
    def warn(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    print(write_report(args.dir if len(args.dir) > 1 else args.dir[0], args.out, overwrite=args.overwrite, warn=warn))
    return 0


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("report", help=command_help("report"))
    p.add_argument("dir", nargs="+", help="a sweep, a run, a folder of them (searched at any depth, e.g. runs), "
                   "or several runs/sweeps")
    p.add_argument("--out", help="output file (default: DIR/report.html; required with several DIRs)")
    add_overwrite_option(p, "file lmsim did not write")
    p.set_defaults(func=cmd_report)
