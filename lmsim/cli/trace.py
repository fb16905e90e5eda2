"""The `lmsim trace ...` command group: convert, stats, plot, generate and compare.

`register_cli(subparsers)` adds the `trace` sub-parser; every handler takes the parsed
arguments and returns an exit code. Expected failures raise `LmsimError` subclasses,
which the top-level CLI prints as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmsim.cli.options import add_overwrite_option, command_help
from lmsim.errors import ConfigError
from lmsim.outputs import check_output_file, is_signed_figure, save_figure
from lmsim.workload.formats import FORMATS, load_trace
from lmsim.workload.generators import GENERATORS, generate
from lmsim.workload.stats import format_stats, trace_stats
from lmsim.workload.trace import is_canonical_trace


def register_cli(subparsers: Any) -> None:
    trace = subparsers.add_parser("trace", help=command_help("trace"))
    sub = trace.add_subparsers(dest="trace_command", required=True)

    conv = sub.add_parser("convert", help="convert a trace file to canonical Parquet")
    conv.add_argument("input", metavar="IN")
    conv.add_argument("--format", choices=FORMATS.names(), default=None,
                      help="input format (default: from the file name or content)")
    conv.add_argument("--param", action="append", default=[], metavar="K=V",
                      help="format parameter (YAML value), repeatable; only sharegpt has any")
    conv.add_argument("--out", required=True, metavar="OUT.parquet")
    add_overwrite_option(conv, "--out file lmsim did not write")
    conv.add_argument("--skip-bad-rows", action="store_true",
                      help="skip and count malformed rows instead of stopping")
    conv.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    conv.set_defaults(func=cmd_convert)

    st = sub.add_parser("stats", help="print a trace's request, length, arrival and prefix-reuse statistics")
    st.add_argument("trace", metavar="TRACE", help="a trace file or a bundled trace's name (lmsim list traces)")
    st.add_argument("--format", choices=FORMATS.names(), default=None)
    st.add_argument("--skip-bad-rows", action="store_true")
    st.add_argument("--param", action="append", default=[], metavar="K=V",
                    help="format parameter (YAML value), repeatable; only sharegpt has any")
    st.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    st.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    st.set_defaults(func=cmd_stats)

    pl = sub.add_parser("plot", help="arrival rate over time and length CDFs")
    pl.add_argument("trace", metavar="TRACE")
    pl.add_argument("--format", choices=FORMATS.names(), default=None)
    pl.add_argument("--out", default=None, metavar="PNG",
                    help="default: the trace's name + .png in the working directory")
    add_overwrite_option(pl, "--out file lmsim did not draw")
    pl.set_defaults(func=cmd_plot)

    gen = sub.add_parser("generate", help="write a synthetic trace")
    gen.add_argument("name", choices=GENERATORS.names())
    gen.add_argument("--param", action="append", default=[], metavar="K=V",
                     help="generator parameter (YAML value), repeatable")
    gen.add_argument("--seed", type=int, required=True)
    gen.add_argument("--out", required=True, metavar="OUT.parquet")
    add_overwrite_option(gen, "--out file lmsim did not write")
    gen.set_defaults(func=cmd_generate)  # fmt: skip

    cmp_ = sub.add_parser("compare", help="session statistics of B against A, with a "
                          "tolerance from random halves of A")
    cmp_.add_argument("a", metavar="A", help="reference trace (e.g. the real sessions)")
    cmp_.add_argument("b", metavar="B")
    cmp_.add_argument("--splits", type=int, default=200,
                      help="random disjoint halves of A behind the tolerance (default 200)")
    cmp_.add_argument("--seed", type=int, default=0)
    cmp_.set_defaults(func=cmd_compare)


def trace_path(arg: str) -> str:
    """A trace argument: a path, or the name of a bundled trace (`kimi_conversation_sample`)
    when no such file exists, so the shipped traces work from any directory."""
    from lmsim.shipped import bundled_trace

    if Path(arg).exists():
        return arg
    bundled = bundled_trace(arg)
    return str(bundled) if bundled is not None else arg


def cmd_convert(args: argparse.Namespace) -> int:
    from lmsim.workload.convert import convert_trace
    from lmsim.workload.formats import infer_format

    if not str(args.out).endswith(".parquet"):
        raise ConfigError(f"{args.out}: --out must name a .parquet file (the canonical trace format)")
    check_output_file(args.out, overwrite=args.overwrite, ours=is_canonical_trace)
    args.input = trace_path(args.input)
    fmt = args.format or infer_format(Path(args.input))
    print(f"{args.input}: format {fmt}" + ("" if args.format else " (detected)"), flush=True)
    _fmt, count, skipped = convert_trace(
        args.input, args.out, format=fmt, skip_bad_rows=args.skip_bad_rows, progress=not args.no_progress,
        params=parse_params(args.param),
    )
    note = f" ({skipped} bad rows skipped)" if skipped else ""
    print(f"wrote {count} requests to {args.out}{note}")
    return 0


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def cmd_stats(args: argparse.Namespace) -> int:
    trace = load_trace(trace_path(args.trace), format=args.format, skip_bad_rows=args.skip_bad_rows,
                       progress=not args.no_progress, params=parse_params(args.param))
    stats = trace_stats(trace)
    if args.json:
        print(json.dumps({k: _jsonable(v) for k, v in stats.items()}, indent=1))
    else:
        print(f"{args.trace}")
        print(format_stats(stats))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Beside the trace would be inside the installed package for a bundled one.
    out = Path(args.out) if args.out else Path(Path(args.trace).stem + ".png")
    check_output_file(out, overwrite=args.overwrite, ours=is_signed_figure)
    trace = load_trace(trace_path(args.trace), format=args.format)
    fig, (ax_rate, ax_cdf) = plt.subplots(1, 2, figsize=(11, 4))
    edges, per_minute = arrivals_per_minute(trace.arrival_s)
    ax_rate.stairs(per_minute, edges / 60)
    ax_rate.set_xlabel("minute")
    ax_rate.set_ylabel("requests per minute")
    ax_rate.set_title("arrival rate")
    for name, col in (("input", trace.input_tokens), ("output", trace.output_tokens)):
        x = np.sort(col)
        ax_cdf.plot(x, np.arange(1, len(x) + 1) / len(x), label=name)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("tokens")
    ax_cdf.set_ylabel("CDF")
    ax_cdf.set_title("length CDFs")
    ax_cdf.legend()
    fig.suptitle(Path(args.trace).name)
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")
    return 0


def arrivals_per_minute(arrival_s: Any) -> tuple[Any, Any]:
    """(edges in s from the first arrival, requests per minute in each bin): whole minutes,
    then the last, partial one up to the last arrival, its count divided by its own length
    (30 requests in its 30 s are 60 per minute, not the 30 a whole-minute bin would show as
    a drop at the end of every trace). A trace of one instant is one bin of one minute."""
    t = np.asarray(arrival_s, dtype=float) - float(arrival_s[0])
    end = float(t[-1]) if len(t) and t[-1] > 0 else 60.0
    edges = np.append(np.arange(0.0, end, 60.0), end)
    counts, _ = np.histogram(t, bins=edges)
    return edges, counts * 60.0 / np.diff(edges)


def parse_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r}: expected KEY=VALUE")
        try:
            params[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"--param {item!r}: value is not valid YAML") from None
        if isinstance(params[key.strip()], list):
            params[key.strip()] = tuple(params[key.strip()])
    return params


def cmd_generate(args: argparse.Namespace) -> int:
    check_output_file(args.out, overwrite=args.overwrite, ours=is_canonical_trace)
    trace = generate(args.name, parse_params(args.param), seed=args.seed)
    trace.save(args.out)
    print(f"wrote {len(trace)} requests to {args.out}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from lmsim.workload.compare import compare, format_comparison, session_samples, split_tolerance

    if args.splits < 1:
        raise ConfigError(f"--splits must be >= 1, got {args.splits}")
    a = session_samples(load_trace(trace_path(args.a)))
    b = session_samples(load_trace(trace_path(args.b)))
    tolerance = split_tolerance(a, splits=args.splits, seed=args.seed)
    print(format_comparison(compare(a, b, tolerance), args.a, args.b))
    print(f"tolerance: the largest B/A deviation over {args.splits} random disjoint halves of A")
    return 0
