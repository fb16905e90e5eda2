"""`lmsim sweep`: run every point of an experiment's `sweep:` block."""

from __future__ import annotations

import signal
import sys
from typing import Any

from lmsim.cli.options import add_overwrite_option, add_plugin_option, command_help
from lmsim.errors import counted
from lmsim.study.execute import run_sweep
from lmsim.study.expand import load_sweep


def cmd_sweep(args: Any) -> int:
    if args.list:
        _raw, points = load_sweep(args.experiment, args.overrides)
        for p in points:
            print(p.name)
        return 0
    executor = args.executor or ("dask" if args.scheduler else "local")
    outcome = run_sweep(
        args.experiment, args.overrides, out=args.out, jobs=args.jobs, executor=executor,
        scheduler=args.scheduler, progress=not args.no_progress, overwrite=args.overwrite,
    )  # fmt: skip
    complete = len(outcome.skipped) + len(outcome.executed)
    print(
        f"sweep: {complete}/{counted(len(outcome.points), 'run')} complete ({len(outcome.executed)} ran now, "
        f"{len(outcome.skipped)} skipped as complete, {len(outcome.failed)} failed); index {outcome.index}"
    )
    if outcome.failed:
        for name, error in sorted(outcome.failed.items()):
            print(f"failed: {name}: {error}", file=sys.stderr)
    if outcome.interrupted is not None:
        sig = signal.Signals(outcome.interrupted).name
        print(f"lmsim: sweep interrupted by {sig}; finished runs are kept, rerun the same command to resume",
              file=sys.stderr)  # fmt: skip
    return outcome.exit_code


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("sweep", help=command_help("sweep"))
    p.add_argument("experiment", help="experiment YAML with a sweep: block")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field before expansion (repeatable)")
    p.add_argument("--out", help="sweep directory (default: output.dir or runs/<name>, or runs/<name>-2, "
                   "-3, ... when that holds runs of another configuration): absent, empty, or a sweep "
                   "lmsim wrote (resumed); never a run directory or a folder of yours")
    add_overwrite_option(p, "sweep's finished runs that were made from another configuration "
                         "(rerun; its runs of points no longer swept are removed)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="runs in parallel (default 1)")
    p.add_argument("--executor", choices=("local", "dask"), default=None,
                   help="local process pool (default) or dask.distributed")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="Dask scheduler address (default: a LocalCluster with -j workers)")
    p.add_argument("--list", action="store_true", help="print the run names and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_plugin_option(p)
    p.set_defaults(func=cmd_sweep)

