"""`lmsim plot`: the paper's figure kinds from saved sweep results."""

from __future__ import annotations

from typing import Any

from lmsim.cli.options import add_overwrite_option
from lmsim.viz.figures import KINDS, make_figures


def cmd_plot(args: Any) -> int:
    formats = tuple(x.strip() for f in args.format for x in f.split(",") if x.strip()) or ("png",)
    kinds = [x.strip() for k in args.kind for x in k.split(",") if x.strip()] if args.kind else None
    for path in make_figures(args.dir, kinds, formats=formats, out=args.out, param=args.param,
                             overwrite=args.overwrite):
        print(path)
    return 0


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("plot", help="draw figures from a saved sweep or run directory")
    p.add_argument("dir", help="sweep directory (with sweep.parquet) or run directory")
    p.add_argument("--kind", action="append", default=[], metavar="K",
                   help=f"figure kind, repeatable or comma-separated: {', '.join(KINDS)} "
                        "(default: every kind the results support)")  # fmt: skip
    p.add_argument("--format", action="append", default=[], metavar="FMT",
                   help="png (default), svg or pdf; repeatable or comma-separated")
    p.add_argument("--param", help="swept key for --kind param (default: the first numeric one)")
    p.add_argument("--out", help="figure directory (default: DIR/figures)")
    add_overwrite_option(p, "figure file lmsim did not draw")
    p.set_defaults(func=cmd_plot)
