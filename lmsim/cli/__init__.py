"""The `lmsim` command line. Subcommands parse arguments and call library functions; expected
failures print one line and exit 2 (`--debug` shows the traceback)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from lmsim._version import __version__
from lmsim.cli.options import PLUGIN_HELP, add_overwrite_option, add_plugin_option
from lmsim.errors import ConfigError, InvariantError, LmsimError


def _add_run_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run one experiment")
    p.add_argument("experiment", help="experiment YAML")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. router.policy=lmetric (repeatable)")
    p.add_argument("--out", help="run directory: absent, empty, or (with --overwrite) an lmsim run. "
                   "Default: output.dir or runs/<name>; if that holds a run of a different "
                   "configuration (or anything else), runs/<name>-2, -3, ... instead; a run of "
                   "the same configuration there is replaced")
    add_overwrite_option(p, "run directory (only a run lmsim wrote; never a sweep)")
    p.add_argument("--check", action="store_true", help="assert engine invariants every step")
    p.add_argument("--no-figure", action="store_true", help="skip the CDF figure")
    add_plugin_option(p)
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (shown on stderr when it is a terminal and the run takes over 3 s)")
    p.set_defaults(func=cmd_run)

    v = subparsers.add_parser("validate", help="check an experiment without running it")
    v.add_argument("experiment")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    add_plugin_option(v)
    v.set_defaults(func=cmd_validate)

    pol = subparsers.add_parser("policies", help="list routing policies and their parameters")
    pol.set_defaults(func=cmd_policies)


@contextlib.contextmanager
def _about(where: str) -> Iterator[None]:
    """Name the experiment file in config errors raised by code that does not know it
    (workload shaping, the simulation's constructor), so every message says where."""
    try:
        yield
    except ConfigError as exc:
        msg = str(exc)
        if msg.startswith(f"{where}:"):
            raise
        raise ConfigError(f"{where}: {msg}") from None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _load_config(args: argparse.Namespace):
    from lmsim.config import load_experiment

    config, _raw = load_experiment(args.experiment, args.overrides)
    if getattr(args, "check", False):
        config = config.model_copy(update={"simulation": config.simulation.model_copy(update={"check": True})})
    return config


def _prepare(args: argparse.Namespace, config=None, *, capacity: str = "search"):
    """Load and check everything a run needs, so bad input fails here with the experiment
    file named, before any simulated time passes (shared by `run` and `validate`; only
    `run` may search for a capacity, announcing it and each probe on stderr)."""
    from lmsim.policies import POLICIES
    from lmsim.profile import load_cost_model
    from lmsim.study.experiment import load_workload_trace

    where = str(args.experiment)
    if config is None:
        config = _load_config(args)
    POLICIES.get(config.router.policy, where=f"{where}: router.policy")
    POLICIES.create(config.router.policy, config.router.params, where=f"{where}: router.params")
    _check_router_view(config, where)
    cost_model = load_cost_model(config.cluster.profile)
    _check_kv_pool(config, cost_model, where)
    _check_workload_source(config, where)
    with _about(where):
        trace = load_workload_trace(
            config, Path(args.experiment).resolve().parent, capacity=capacity, log=_stderr
        )
    return config, trace


def _check_router_view(config, where: str) -> None:
    view = dict(config.router.view)
    if not view:
        return
    from lmsim.engine.views import ViewAdapter

    allowed = [
        name for name, p in inspect.signature(ViewAdapter.__init__).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    for key in view:
        if key not in allowed:
            raise ConfigError(f"{where}: router.view.{key}: unknown key (keys: {', '.join(allowed)})")
    try:
        ViewAdapter(**view)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: router.view: {exc}") from None


def _check_kv_pool(config, cost_model, where: str) -> None:
    cfg = config.cluster
    if cfg.num_gpu_blocks is not None:
        return
    blocks = cost_model.num_kv_blocks(cfg.block_size, cfg.gpu_memory_utilization)
    if blocks is None:
        raise ConfigError(
            f"{where}: cluster.num_gpu_blocks: required with a profile that has no memory facts"
        )
    if blocks <= 0:
        raise ConfigError(
            f"{where}: cluster.gpu_memory_utilization: {cfg.gpu_memory_utilization} leaves no "
            f"memory for the KV cache of profile {cost_model.name!r} (weights and overhead need more)"
        )


def _check_workload_source(config, where: str) -> None:
    w = config.workload
    if w.generator is not None:
        from lmsim.workload.generators import GENERATORS

        GENERATORS.create(
            w.generator.name, dict(w.generator.params), where=f"{where}: workload.generator"
        )
    elif w.format is not None:
        from lmsim.workload.formats import FORMATS

        FORMATS.get(w.format, where=f"{where}: workload.format")


def cmd_validate(args: argparse.Namespace) -> int:
    from lmsim.study.experiment import describe_load, load_resolution

    config, trace = _prepare(args, capacity="lookup")
    print(f"{args.experiment}: ok ({len(trace)} requests, policy {config.router.policy}, "
          f"{config.cluster.num_instances} instances)")
    load = describe_load(load_resolution(config, trace))
    if load:
        print(load)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from lmsim.engine.simulation import Simulation
    from lmsim.study.experiment import describe_load, load_resolution
    from lmsim.study.rundir import save_run

    started = time.perf_counter()
    config = _load_config(args)
    if config.sweep or config.zip:
        raise ConfigError(
            f"{args.experiment}: has a sweep: block; run its points with `lmsim sweep {args.experiment}`"
        )
    # Before the workload is built (which may search a capacity) and before the run.
    out = _run_directory(config, args.out, overwrite=args.overwrite)
    config, trace = _prepare(args, config)
    load = load_resolution(config, trace)
    from lmsim.progress import progress_bar

    with _about(str(args.experiment)):
        sim = Simulation(config, trace)
        with progress_bar(not args.no_progress, total=len(trace), unit="req", desc="arrived", delay=3) as bar:
            results = sim.run(progress=bar.update)
    results.summary.update(load)
    try:
        save_run(results, out, figure=config.output.figures and not args.no_figure)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write the run directory ({exc.strerror or exc})") from None
    s = results.summary
    print(format_summary(config.name, s))
    if load:
        print(describe_load(load))
    print(f"run directory: {out}  (total {time.perf_counter() - started:.1f}s)")
    return 0


# How far `lmsim run` looks for a free default directory (runs/<name>-N) before giving up.
MAX_DEFAULT_SUFFIX = 999


def _run_directory(config, out: str | None, *, overwrite: bool) -> Path:
    """Where `lmsim run` writes, checked before anything runs.

    `--out DIR` is used as given: absent, empty, or an lmsim run (replaced only with
    --overwrite). Without it the default (output.dir or runs/<name>) is used when it is free
    or holds a run of this same configuration (replaced: the same experiment and seed give the
    same results); otherwise the first free or same-configuration runs/<name>-2, -3, ... so a
    run never replaces an earlier run of a different configuration. `--overwrite` without
    `--out` replaces the run at the default directory whatever its configuration."""
    from lmsim.study.rundir import RUN_FILES, check_output_dir, directory_kind, saved_config_matches

    if out is not None:
        path = Path(out)
        check_output_dir(path, "run", overwrite=overwrite, allowed_files=RUN_FILES)
        return path
    base = Path(config.output.dir or Path("runs") / config.name)
    if overwrite:
        check_output_dir(base, "run", overwrite=True, allowed_files=RUN_FILES)
        return base
    cwd = Path.cwd().resolve()
    if base.resolve() == cwd or base.resolve() in cwd.parents:
        check_output_dir(base, "run")  # output.dir: . names the user's folder; refused
    wanted = config.to_dict()
    for n in range(1, MAX_DEFAULT_SUFFIX + 1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
            check_output_dir(path, "run")  # a parent that is a file, the working directory
            return path
        if directory_kind(path) == "run" and saved_config_matches(path, wanted):
            check_output_dir(path, "run", overwrite=True, allowed_files=RUN_FILES)
            return path
    raise ConfigError(f"{base}: {base.name}-2 ... -{MAX_DEFAULT_SUFFIX} are all taken; pass --out")


def format_summary(name: str, s: dict) -> str:
    def ms(key: str) -> str:
        v = s.get(key)
        return "-" if v is None else f"{1000 * v:9.1f}"

    reasons = ", ".join(
        f"{key.removeprefix('num_rejected_')} {s[key]}"
        for key in sorted(s) if key.startswith("num_rejected_") and s[key]
    )
    outcomes = [
        f"{s['num_unfinished']} unfinished",
        f"{s['num_rejected']} rejected" + (f" ({reasons})" if reasons else ""),
        f"{s.get('num_not_arrived', 0)} never arrived",
    ]
    if s.get("num_output_clipped"):
        outcomes.append(f"{s['num_output_clipped']} outputs clipped at max_model_len {s.get('max_model_len')}")
    lines = [
        f"{name}: policy {s.get('policy')}, {s['num_finished']}/{s['num_requests']} finished, "
        f"{', '.join(outcomes)}, "
        f"prefix hit {s['prefix_hit_ratio']:.3f}, sim {s['sim_time_s']:.1f}s, wall {s['wall_time_s']:.2f}s",
        f"{'metric':8} {'mean ms':>9} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}",
    ]
    for metric in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"):
        lines.append(
            f"{metric[:-2]:8} {ms(metric + '_mean')} {ms(metric + '_p50')} {ms(metric + '_p90')} {ms(metric + '_p99')}"
        )
    if s.get("request_throughput_per_s") is not None:
        lines.append(
            f"throughput {s['request_throughput_per_s']:.3f} req/s, {s['output_token_throughput_per_s']:.1f} output tok/s; "
            f"SLO (TTFT <= {s['slo_ttft_s']:g} s, TPOT <= {1000 * s['slo_tpot_s']:g} ms) met by "
            f"{100 * s['slo_attainment']:.1f}%, goodput {s['goodput_per_s']:.3f} req/s"
        )
    lines.append(f"router {s['router_us_per_decision']:.1f} us/decision, {s['num_preemptions']} preemptions")
    if s.get("kv_tiers_instances"):
        disk = s.get("prefix_hit_ratio_first_admission_disk")
        lines.append(
            f"KV tiers on {s['kv_tiers_instances']} instances: hit at first admission GPU "
            f"{s['prefix_hit_ratio_first_admission']:.3f}, host {s['prefix_hit_ratio_first_admission_host']:.3f}"
            + (f", disk {disk:.3f}" if s.get("kv_offload_bytes_disk") is not None else "")
            + f"; {s['kv_num_loads']} loads, {s['kv_h2d_bytes'] / 1e9:.1f} GB loaded, "
            f"{s['kv_offload_bytes_host'] / 1e9:.1f} GB offloaded"
        )
    return "\n".join(lines)


def cmd_policies(args: argparse.Namespace) -> int:
    import inspect

    from lmsim.policies import POLICIES

    for name in POLICIES.names():
        cls = POLICIES.get(name)
        doc = (inspect.getdoc(cls) or "").splitlines()
        params = POLICIES.parameters(name)
        shown = ", ".join(
            f"{key}={p.default!r}" if p.default is not inspect.Parameter.empty else key
            for key, p in params.items()
        )
        print(f"{name:16} {cite_only_shipped_documents(doc[0]) if doc else ''}")
        print(f"{'':16} params: {shown or '(none)'}")
        for key, why in getattr(cls, "default_reasons", {}).items():
            default = params[key].default if key in params else "?"
            print(f"{'':16} default {key}={default!r}: {why}")
    return 0


_DOCUMENT = re.compile(r"[\w./-]+\.(?:md|txt)\b")
_PARENTHETICAL = re.compile(r"\s*\(([^()]*)\)")


def document_exists(name: str) -> bool:
    """A cited document is in the repository (a source checkout) or ships in lmsim/data."""
    from lmsim.data import DATA_DIR

    return any((base / name).is_file() for base in (DATA_DIR, DATA_DIR.parent.parent))


def cite_only_shipped_documents(text: str) -> str:
    """Drop a parenthetical reference to a document the user does not have (the specs
    under ../shared/docs that docstrings cite for developers), so what the CLI prints
    only points at files that exist."""

    def keep(match: re.Match[str]) -> str:
        cited = _DOCUMENT.findall(match.group(1))
        return "" if cited and not all(document_exists(d) for d in cited) else match.group(0)

    return _PARENTHETICAL.sub(keep, text)


# Modules that add subcommands through `register_cli(subparsers)`.
COMMAND_MODULES = (
    "lmsim.cli.profile",
    "lmsim.cli.trace",
    "lmsim.cli.capacity",
    "lmsim.cli.sweep",
    "lmsim.cli.plot",
    "lmsim.cli.report",
    "lmsim.cli.compare",
    "lmsim.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmsim", description="LLM serving cluster simulator")
    parser.add_argument("--version", action="version", version=f"lmsim {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                        help=PLUGIN_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    for module in COMMAND_MODULES:
        if importlib.util.find_spec(module) is None:
            continue  # a command family not built yet
        register = getattr(importlib.import_module(module), "register_cli", None)
        if register is not None:
            register(sub)
    return parser


def _experiment_paths(given: str | list[str]) -> str | list[str]:
    """A bare name that is not a file names a bundled experiment (`quickstart`,
    `traces/coder`), so bundled runs work from any directory after `pip install .`."""
    from lmsim.data import bundled_experiment

    def one(arg: str) -> str:
        if Path(arg).exists():
            return arg
        bundled = bundled_experiment(arg)
        return str(bundled) if bundled is not None else arg

    return [one(a) for a in given] if isinstance(given, list) else one(given)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "experiment"):
        args.experiment = _experiment_paths(args.experiment)
    try:
        from lmsim.plugins import load_plugins

        load_plugins([*args.plugins, *getattr(args, "sub_plugins", [])])
        return int(args.func(args) or 0)
    except LmsimError as exc:
        if args.debug:
            raise
        print(f"lmsim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except InvariantError as exc:
        # A checked run (--check) caught the engine in an impossible state: a bug, not bad
        # input, so it gets its own exit code; --debug shows where it happened.
        if args.debug:
            raise
        print(f"lmsim: invariant violated: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("lmsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `lmsim run ... | head`): results are already saved;
        # silence the interpreter's own complaint when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
