"""The `lmsim` command line. Subcommands parse arguments and call library functions; expected
failures print one line and exit 2 (`--debug` shows the traceback)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path

from .errors import LmsimError


def _add_run_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run one experiment")
    p.add_argument("experiment", help="experiment YAML")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. router.policy=lmetric (repeatable)")
    p.add_argument("--out", help="run directory (default: output.dir or runs/<name>)")
    p.add_argument("--check", action="store_true", help="assert engine invariants every step")
    p.add_argument("--no-figure", action="store_true", help="skip the CDF figure")
    p.set_defaults(func=cmd_run)

    v = subparsers.add_parser("validate", help="check an experiment without running it")
    v.add_argument("experiment")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    v.set_defaults(func=cmd_validate)

    pol = subparsers.add_parser("policies", help="list routing policies and their parameters")
    pol.set_defaults(func=cmd_policies)


def _prepare(args: argparse.Namespace):
    from .config import load_experiment
    from .policies import POLICIES
    from .profile import load_cost_model
    from .workload.build import load_workload_trace

    config, _raw = load_experiment(args.experiment, args.overrides)
    if getattr(args, "check", False):
        config = config.model_copy(update={"simulation": config.simulation.model_copy(update={"check": True})})
    POLICIES.get(config.router.policy, where=f"{args.experiment}: router.policy")
    load_cost_model(config.cluster.profile)
    trace = load_workload_trace(config, Path(args.experiment).resolve().parent)
    return config, trace


def cmd_validate(args: argparse.Namespace) -> int:
    from .policies import POLICIES

    config, trace = _prepare(args)
    POLICIES.create(config.router.policy, config.router.params, where=f"{args.experiment}: router.params")
    print(f"{args.experiment}: ok ({len(trace)} requests, policy {config.router.policy}, "
          f"{config.cluster.num_instances} instances)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .simulation import Simulation

    started = time.perf_counter()
    config, trace = _prepare(args)
    sim = Simulation(config, trace)
    results = sim.run()
    out = Path(args.out or config.output.dir or Path("runs") / config.name)
    results.save(out, figure=config.output.figures and not args.no_figure)
    s = results.summary
    print(format_summary(config.name, s))
    print(f"run directory: {out}  (total {time.perf_counter() - started:.1f}s)")
    return 0


def format_summary(name: str, s: dict) -> str:
    def ms(key: str) -> str:
        v = s.get(key)
        return "-" if v is None else f"{1000 * v:9.1f}"

    lines = [
        f"{name}: policy {s.get('policy')}, {s['num_finished']}/{s['num_requests']} finished, "
        f"{s['num_unfinished']} unfinished, {s['num_rejected']} rejected, "
        f"prefix hit {s['prefix_hit_ratio']:.3f}, sim {s['sim_time_s']:.1f}s, wall {s['wall_time_s']:.2f}s",
        f"{'metric':8} {'mean ms':>9} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}",
    ]
    for metric in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        lines.append(
            f"{metric[:-2]:8} {ms(metric + '_mean')} {ms(metric + '_p50')} {ms(metric + '_p90')} {ms(metric + '_p99')}"
        )
    lines.append(f"router {s['router_us_per_decision']:.1f} us/decision, {s['num_preemptions']} preemptions")
    return "\n".join(lines)


def cmd_policies(args: argparse.Namespace) -> int:
    import inspect

    from .policies import POLICIES

    for name in POLICIES.names():
        cls = POLICIES.get(name)
        doc = (inspect.getdoc(cls) or "").splitlines()
        params = POLICIES.parameters(name)
        shown = ", ".join(
            f"{p.name}={p.default!r}" if p.default is not inspect.Parameter.empty else p.name
            for p in params.values()
        )
        print(f"{name:16} {doc[0] if doc else ''}")
        print(f"{'':16} params: {shown or '(none)'}")
    return 0


# Modules that add subcommands through `register_cli(subparsers)`.
COMMAND_MODULES = (
    "lmsim.profile.commands",
    "lmsim.workload.commands",
    "lmsim.capacity",
    "lmsim.sweep",
    "lmsim.figures",
    "lmsim.report",
    "lmsim.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmsim", description="LLM serving cluster simulator")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    for module in COMMAND_MODULES:
        if importlib.util.find_spec(module) is None:
            continue  # a command family not built yet
        register = getattr(importlib.import_module(module), "register_cli", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LmsimError as exc:
        if args.debug:
            raise
        print(f"lmsim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("lmsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
