"""`lmsim plan`: the cheapest fleet meeting an SLO over a design space (lmsim.plan)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lmsim.cli.options import add_plugin_option, command_help


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("plan", help=command_help("plan"))
    p.add_argument("experiment", help="plan YAML: an experiment with a plan: section")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the file, e.g. plan.budget_gpus=32 (repeatable)")
    p.add_argument("--workers", type=int, default=1, help="probes run at once (a local process pool)")
    p.add_argument("--dask", metavar="ADDR", help="run the probes on this Dask scheduler (host:port), or "
                   "`local` for a Dask LocalCluster of --workers processes")
    p.add_argument("--out", help="plan directory: probes (a rerun resumes from them), table, figure, "
                   "winner.yaml (default: runs/plan/<name>)")
    add_plugin_option(p)
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: Any) -> int:
    from lmsim.plan import load_plan, run_plan
    from lmsim.plan.output import PARETO_FIGURE, WINNER_YAML, format_table

    base, raw, plan = load_plan(args.experiment, args.overrides)
    out = Path(args.out) if args.out else Path("runs") / "plan" / base.name

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = run_plan(base=base, raw=raw, plan=plan, out=out, workers=args.workers, dask=args.dask, log=log)
    print(format_table(result))
    written = [out / PARETO_FIGURE] + ([out / WINNER_YAML] if result.winner else [])
    print(f"plan directory: {out} ({', '.join(p.name for p in written if p.exists())})")
    return 0 if result.winner is not None else 1
