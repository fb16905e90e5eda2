"""`lmsim compare`: one table and overlaid CDFs for any set of saved runs and sweeps."""

from __future__ import annotations

from typing import Any

from lmsim.cli.options import command_help
from lmsim.viz.compare import compare


def cmd_compare(args: Any) -> int:
    text, written = compare(args.dir, baseline=args.baseline, out=args.out)
    print(text)
    for path in written:
        print(path)
    if not args.out:
        print("(--out DIR writes the table as CSV and the overlaid TTFT/TPOT/E2E CDFs)")
    return 0


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("compare", help=command_help("compare"))
    p.add_argument("dir", nargs="+", help="run directories and/or sweep directories (sweeps expand to their runs)")
    p.add_argument("--baseline", metavar="RUN", help="run directory (or label) whose values the ratios divide by")
    p.add_argument("--out", metavar="DIR", help="write the table (compare.csv and a text copy) and cdf.{png,svg,pdf} here")
    p.set_defaults(func=cmd_compare)
