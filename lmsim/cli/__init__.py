"""The `lmsim` command line. Subcommands parse arguments and call library functions; expected
failures print one line and exit 2 (`--debug` shows the traceback)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from lmsim._version import __version__
from lmsim.cli.options import COMMANDS, PLUGIN_HELP, add_overwrite_option, add_plugin_option
from lmsim.errors import ConfigError, InvariantError, LmsimError, suggest


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
    """The experiment with its `--set` overrides, checked as far as it can be without its
    workload (`_check_config`; a sweep's points are checked one by one instead), so an
    error names the file or, when an override caused it, the `--set` argument."""
    from lmsim.config import load_experiment

    def check(config, where: str) -> None:
        if not (config.sweep or config.zip or config.seeds):
            _check_config(config, where)

    config, _raw = load_experiment(args.experiment, args.overrides, check)
    if getattr(args, "check", False):
        config = config.model_copy(update={"simulation": config.simulation.model_copy(update={"check": True})})
    return config


def _check_config(config, where: str) -> None:
    """Policy and its parameters, router view, profile and KV pool, workload source."""
    from lmsim.policies import POLICIES
    from lmsim.policies.disagg import check_policy_shape

    POLICIES.get(config.router.policy, where=f"{where}: router.policy")
    check_policy_shape(config.router.policy, config.cluster.is_disaggregated, where=f"{where}: router.policy")
    POLICIES.create(config.router.policy, config.router.params, where=f"{where}: router.params")
    _check_router_view(config, where)
    _check_kv_pools(config, where)
    _check_fleet(config, where)
    _check_workload_source(config, where)


def _prepare(args: argparse.Namespace, config, *, capacity: str = "search", where: str | None = None):
    """Load the workload of a checked config (`_load_config`, `_check_config`), so bad
    input fails here with the experiment file named, before any simulated time passes
    (shared by `run` and `validate`; only `run` may search for a capacity, announcing it
    and each probe on stderr)."""
    from lmsim.study.experiment import load_workload_trace

    where = where or str(args.experiment)
    with _about(where):
        trace = load_workload_trace(config, config.source_dir, capacity=capacity, log=_stderr)
    return config, trace


def _check_router_view(config, where: str) -> None:
    view = dict(config.router.view)
    if not view:
        return
    import inspect

    from lmsim.engine.views import ViewAdapter

    allowed = [
        name for name, p in inspect.signature(ViewAdapter.__init__).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    for key in view:
        if key not in allowed:
            raise ConfigError(f"{where}: router.view.{key}: unknown key{suggest(key, allowed, label='keys')}")
    try:
        ViewAdapter(**view)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: router.view: {exc}") from None


def _check_kv_pools(config, where: str) -> None:
    """Every pool's profile loads and leaves room for a KV cache (a field is named as the
    user wrote it: flat for a single-pool cluster, per pool otherwise)."""
    from lmsim.engine.disagg import check_disaggregated_pools
    from lmsim.profile import load_cost_model

    cfg = config.cluster
    models = {}
    for pool in cfg.pool_specs():
        engine = pool.engine
        prefix = "cluster." if cfg.pools is None else f"cluster.pools.{pool.name}."
        cost_model = models[pool.name] = load_cost_model(engine["profile"])
        if engine["num_gpu_blocks"] is not None:
            continue
        blocks = cost_model.num_kv_blocks(cfg.block_size, engine["gpu_memory_utilization"])
        if blocks is None:
            raise ConfigError(f"{where}: {prefix}num_gpu_blocks: required with a profile that has no memory facts")
        if blocks <= 0:
            raise ConfigError(
                f"{where}: {prefix}gpu_memory_utilization: {engine['gpu_memory_utilization']} leaves no "
                f"memory for the KV cache of profile {cost_model.name!r} (weights and overhead need more)"
            )
    if cfg.is_disaggregated:
        check_disaggregated_pools(cfg.pool_specs(), models, where)


def _check_fleet(config, where: str) -> None:
    """A changing fleet's pools, start-up times and crashes, and its autoscaler
    (lmsim.engine.fleet), as the run would check them."""
    from lmsim.engine.fleet import allocated_pools, fleet_configured, plan_pools
    from lmsim.profile import load_cost_model
    from lmsim.study.compose import make_autoscaler

    if not fleet_configured(config):
        return
    try:
        pools, initial = allocated_pools(config)
        models = {pool.name: load_cost_model(pool.engine["profile"]) for pool in pools}
        plan_pools(config, pools, initial, models)
        make_autoscaler(config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_workload_source(config, where: str) -> None:
    w = config.workload
    if w.generator is not None:
        from lmsim.workload.generators import GENERATORS

        GENERATORS.create(
            w.generator.name, dict(w.generator.params), where=f"{where}: workload.generator"
        )
    elif w.format_name is not None:
        from lmsim.workload.formats import FORMATS

        FORMATS.create(w.format_name, w.format_params, where=f"{where}: workload.format")


def cmd_validate(args: argparse.Namespace) -> int:
    from lmsim.study.experiment import describe_load, load_resolution

    config = _load_config(args)
    if config.sweep or config.zip or config.seeds:
        return _validate_sweep(args, config)
    config, trace = _prepare(args, config, capacity="lookup")
    print(f"{args.experiment}: ok ({len(trace)} requests, policy {config.router.policy}, "
          f"{config.cluster.describe()})")
    load = describe_load(load_resolution(config, trace), config)
    if load:
        print(load)
    if config.workload.rate_schedule is not None:
        from lmsim.workload.rate_schedule import describe_schedule

        print(describe_schedule(config.workload.rate_schedule, trace))
    return 0


def _validate_sweep(args: argparse.Namespace, config) -> int:
    """Every point of a sweep checked as `lmsim run` would check it (a policy parameter
    only one of the swept policies has, a generator parameter, a view, the KV pool, the
    workload with its capacity), each error naming the point."""
    from lmsim.config import validate
    from lmsim.study.expand import load_sweep
    from lmsim.study.experiment import describe_load, load_resolution

    _raw, points = load_sweep(args.experiment, args.overrides)
    requests, loads = set(), []
    for point in points:
        at = f"{args.experiment} [{point.name}]"
        point_config = validate(point.raw, where=at).from_folder(config.source_dir)
        _check_config(point_config, at)
        point_config, trace = _prepare(args, point_config, capacity="lookup", where=at)
        requests.add(len(trace))
        load = describe_load(load_resolution(point_config, trace), point_config)
        if load and load not in loads:
            loads.append(load)
    counts = "-".join(str(n) for n in sorted({min(requests), max(requests)}))
    print(f"{args.experiment}: ok ({len(points)} sweep points, {counts} requests each)")
    for load in loads:
        print(load)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from lmsim.study.experiment import describe_load, load_resolution, simulate
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

    with _about(str(args.experiment)), progress_bar(
        not args.no_progress, total=len(trace), unit="req", desc="arrived", delay=3
    ) as bar:
        results = simulate(config, trace, progress=bar.update)
    try:
        save_run(results, out, figure=config.output.figures and not args.no_figure)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write the run directory ({exc.strerror or exc})") from None
    s = results.summary
    print(format_summary(config.name, s))
    if "stage" in results.requests:
        from lmsim.engine.stages import format_stage_table, stage_summary

        print(format_stage_table(stage_summary(results.requests)))
    if load:
        print(describe_load(load, config))
    print(f"run directory: {out}  (total {time.perf_counter() - started:.1f}s)")
    return 0


def _run_directory(config, out: str | None, *, overwrite: bool) -> Path:
    """Where `lmsim run` writes, checked before anything runs.

    `--out DIR` is used as given: absent, empty, or an lmsim run (replaced only with
    --overwrite). Without it the default (output.dir or runs/<name>) is used when it is free
    or holds a run of this same configuration (replaced: the same experiment and seed give the
    same results); otherwise the first free or same-configuration runs/<name>-2, -3, ... so a
    run never replaces an earlier run of a different configuration. `--overwrite` without
    `--out` replaces the run at the default directory whatever its configuration."""
    from lmsim.study.rundir import (
        RUN_FILES,
        check_output_dir,
        default_directory,
        directory_kind,
        saved_config_matches,
    )

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
    path = default_directory(base, lambda p: directory_kind(p) == "run" and saved_config_matches(p, wanted))
    if path.exists() and any(path.iterdir()):
        check_output_dir(path, "run", overwrite=True, allowed_files=RUN_FILES)
    else:
        check_output_dir(path, "run")  # a parent that is a file, the working directory
    return path


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
    if "num_kv_transfers" in s:
        mean_s, mean_b = s.get("kv_transfer_s_mean"), s.get("kv_transfer_bytes_mean")
        lines.append(
            f"kv transfers {s['num_kv_transfers']}"
            + (f", mean {1000 * mean_s:.1f} ms of {mean_b / 1e6:.1f} MB" if mean_s is not None else "")
            + f"; prefilled on their decode instance {s['num_prefilled_on_decode']}"
        )
    busy = {k.removeprefix("busy_fraction_"): v for k, v in s.items() if k.startswith("busy_fraction_") and v is not None}
    if busy:
        lines.append("busy " + ", ".join(f"{pool} {100 * v:.0f}%" for pool, v in busy.items()))
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


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser. With `argv`, only the command modules one of whose commands `argv`
    names are loaded; the others' commands are listed by name and help alone (COMMANDS), so
    building the parser for `--version` or `--help` imports no command module."""
    parser = argparse.ArgumentParser(prog="lmsim", description="LLM serving cluster simulator")
    parser.add_argument("--version", action="version", version=f"lmsim {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                        help=PLUGIN_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    named = None if argv is None else set(argv)
    loaded: set[str] = set()
    for name, (module, summary) in COMMANDS.items():
        if named is not None and not any(c in named for c, (m, _) in COMMANDS.items() if m == module):
            sub.add_parser(name, help=summary, add_help=False)  # listed; its module loads when named
        elif module not in loaded:
            loaded.add(module)
            if importlib.util.find_spec(module) is not None:  # else a command family not built yet
                importlib.import_module(module).register_cli(sub)
    return parser


def _experiment_paths(given: str | list[str]) -> str | list[str]:
    """A bare name that is not a file names a bundled experiment (`quickstart`,
    `traces/coder`), so bundled runs work from any directory after `pip install .`."""
    from lmsim.shipped import bundled_experiment

    def one(arg: str) -> str:
        if Path(arg).exists():
            return arg
        bundled = bundled_experiment(arg)
        return str(bundled) if bundled is not None else arg

    return [one(a) for a in given] if isinstance(given, list) else one(given)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
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
