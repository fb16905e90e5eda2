"""`lmsim capacity`: the maximum sustainable arrival rate of an experiment's workload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmsim.cli.options import add_plugin_option, command_help
from lmsim.errors import ConfigError
from lmsim.shipped import check_source_checkout
from lmsim.study.bundle import bundle_experiments
from lmsim.study.capacity import BUNDLED_PATH, CapacitySearch, describe_reference, resolve_capacity


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("capacity", help=command_help("capacity"))
    p.add_argument("experiment", nargs="+", help="experiment YAML(s); several only with --bundle")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--probe-requests", type=int, default=CapacitySearch.probe_requests)
    p.add_argument("--no-cache", action="store_true", help="ignore and do not update the cache")
    p.add_argument("--bundle", action="store_true",
                   help="measure every load point of the experiments (sweeps expanded) and record "
                        "them in experiments/capacity.json (shipped with lmsim; only from a source "
                        "checkout)")
    p.add_argument("--refresh", action="store_true",
                   help="with --bundle: search every capacity again (after an engine change) and "
                        "drop entries the given experiments do not need")
    add_plugin_option(p)
    p.set_defaults(func=cmd_capacity)


def cmd_capacity(args: Any) -> int:
    from lmsim.config import load_experiment
    from lmsim.study.experiment import load_workload_trace, workload_identity

    if args.refresh and not args.bundle:
        raise ConfigError("capacity: --refresh needs --bundle")
    if args.bundle:
        check_source_checkout(BUNDLED_PATH, "capacity --bundle")
        count = bundle_experiments(args.experiment, refresh=args.refresh)
        print(f"{count} capacities recorded in {BUNDLED_PATH}")
        return 0
    if len(args.experiment) > 1:
        raise ConfigError("capacity: give one experiment, or several with --bundle")
    args.experiment = args.experiment[0]

    overrides = [*args.overrides, "workload.load=null", "workload.rate=null", "workload.time_scale=null",
                 "workload.rate_schedule=null"]
    config, _ = load_experiment(args.experiment, overrides)
    experiment_dir = Path(args.experiment).resolve().parent
    trace = load_workload_trace(config, experiment_dir)
    search = CapacitySearch(probe_requests=args.probe_requests)
    print(f"{args.experiment}: capacity on the first {min(len(trace), search.probe_requests)} requests "
          f"({config.cluster.describe() if config.cluster.pools else f'{config.cluster.num_instances} x {config.cluster.profile}'})")
    found = resolve_capacity(
        trace, config, search, workload=workload_identity(config, experiment_dir),
        use_cache=not args.no_cache, log=print,
    )  # fmt: skip
    rate = found.rate
    assert rate is not None
    under = f" under {describe_reference(config)}" if config.cluster.is_disaggregated else ""
    print(f"capacity: {rate:.4g} req/s{under} ({found.source}, {len(found.probes)} probes); "
          f"load 0.5 = {rate / 2:.4g} req/s")
    return 0
