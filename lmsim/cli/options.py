"""Options several subcommands share, spelled and documented once, and the table of
commands the top-level parser lists."""

from __future__ import annotations

import argparse

PLUGIN_HELP = ("import MODULE (a module name, searched in the working directory first, or a .py "
               "path) before running, so the policies it registers can be used; repeatable")


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    # Its own dest: a subparser's default would otherwise erase the global --plugin values.
    parser.add_argument("--plugin", dest="sub_plugins", action="append", default=[], metavar="MODULE",
                        help=PLUGIN_HELP)


def add_overwrite_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace an existing {what} (without it, lmsim refuses to replace "
                             "anything it did not write)")


# Every command but `run` and `validate` (lmsim.cli itself): the module that registers it
# (`register_cli(subparsers)`) and its one-line help. The top-level parser lists each from
# here; a module, and the libraries it imports (pandas, matplotlib, ...), is loaded only when
# one of its commands is on the command line, so `lmsim --version` and `lmsim --help` take a
# tenth of a second whatever a command module imports.
COMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("lmsim.cli.profile", "step-cost profiles: generate, show, plot, fit"),
    "trace": ("lmsim.cli.trace", "convert, inspect, plot and generate traces"),
    "capacity": ("lmsim.cli.capacity", "find the maximum sustainable arrival rate"),
    "plan": ("lmsim.cli.plan", "the cheapest fleet (GPUs, shape, router) meeting an SLO"),
    "sweep": ("lmsim.cli.sweep", "run every point of an experiment's sweep: block (resumable)"),
    "plot": ("lmsim.cli.plot", "draw figures from saved run and sweep directories"),
    "report": ("lmsim.cli.report", "write one self-contained report.html from saved results"),
    "compare": ("lmsim.cli.compare", "compare saved runs: one table, ratios to a baseline, CDFs"),
    "bench": ("lmsim.cli.bench", "measure simulator speed and memory on fixed workloads"),
    "list": ("lmsim.cli.listing", "list what ships: experiments, profiles, traces, policies, generators"),
    "policies": ("lmsim.cli.listing", "routing policies with their parameters; NAME: one in full"),
}


def command_help(name: str) -> str:
    return COMMANDS[name][1]
