"""`lmsim plot`: the paper's figure kinds from any set of saved runs and sweeps."""

from __future__ import annotations

from typing import Any

from lmsim.cli.options import add_overwrite_option, command_help
from lmsim.viz.figures import FORMATS, KINDS, make_figures


def cmd_plot(args: Any) -> int:
    formats = tuple(x.strip() for f in args.format for x in f.split(",") if x.strip()) or FORMATS
    kinds = [x.strip() for k in args.kind for x in k.split(",") if x.strip()] if args.kind else None
    dirs = args.dir if len(args.dir) > 1 else args.dir[0]
    for path in make_figures(dirs, kinds, formats=formats, out=args.out, param=args.param,
                             overwrite=args.overwrite):
        print(path)
    return 0


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("plot", help=command_help("plot"))
    p.add_argument("dir", nargs="+", help="run directories and/or sweep directories (with sweep.parquet)")
    p.add_argument("--kind", action="append", default=[], metavar="K",
                   help=f"figure kind, repeatable or comma-separated: {', '.join(KINDS)} "
                        "(default: every kind the results support)")  # fmt: skip
    p.add_argument("--format", action="append", default=[], metavar="FMT",
                   help="png, svg, pdf (default: all three); repeatable or comma-separated")
    p.add_argument("--param", help="swept key for --kind param (default: the first numeric one)")
    p.add_argument("--out", help="figure directory (default: DIR/figures; required with several DIRs)")
    add_overwrite_option(p, "figure file lmsim did not draw")
    p.set_defaults(func=cmd_plot)
